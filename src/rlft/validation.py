"""Option validation shared by every command's config dataclass, run from its ``__post_init__``.

One generic check, driven by the field's type (and its declared range), so a new config gets it by calling
:func:`validate_options` (or inheriting nothing at all: just call it):

- **types**: each value must match its annotation (``int``, ``float`` (an int is fine), ``str`` (or a
  path), ``bool``, ``None`` in an ``X | None``, ``Literal[...]`` choices, ``tuple[str, ...]``); floats
  must be finite. tyro already enforces this for flags; YAML values (``--config``) and programmatic
  configs get the same check here.
- **ranges**, declared on the field (``k: Annotated[int, Range(ge=1)]``, :class:`Range`), else by the field's exact
  name for the standard options (:data:`RULES`); never guessed from a name's suffix;
- **choices** of string options whose values live elsewhere (``--preset``, ``--prompt-template``,
  ``--device``, ``--dtype``): see :data:`CHOICES`;
- **step counts**: ``--max-steps`` at most :data:`MAX_STEPS`; the recipes check the counts they derive (from
  ``--epochs``, ``--max-tokens``, ``--ppo-epochs``) with :func:`check_step_count` before the run folder is made;
- **packages**: ``--report-to wandb|trackio|tensorboard`` needs its package installed (:func:`check_tracker`).

A violation raises :class:`OptionError` naming the option as a flag (``--max-steps``); the command line
prints it as ``rlft <command>: error: <message>`` and exits with code 2.
"""

from __future__ import annotations

import math
import os
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union

from rlft.composed import option_fields, option_hints


class UsageError(ValueError):
    """A mistake in how a command was called (an option, a run folder): the CLI exits with code 2."""

    exit_code = 2


class OptionError(UsageError):
    """An option value that is of the wrong type or out of range; the message names the option."""


def flag(name: str) -> str:
    """``max_steps`` -> ``--max-steps``."""
    return "--" + name.replace("_", "-")


# ----------------------------------------------------------------------------- ranges


@dataclass(frozen=True)
class Range:
    """A numeric option's range, declared on its field: ``k: Annotated[int, Range(ge=1)] = 4`` (read by
    :func:`validate_options`; tyro ignores it). Bounds left None are open; ``None`` values (where the type allows
    them) always pass: they mean unset."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def __call__(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    @property
    def requirement(self) -> str:
        """What the range requires, as the error says it: ``must be >= 1``, ``must lie in (0, 1]``."""
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else None
        high = f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else None
        if low is not None and high is not None:
            return f"must lie in {low}, {high}"
        if low is not None:
            return f"must be >= {self.ge:g}" if self.ge is not None else f"must be > {self.gt:g}"
        return f"must be <= {self.le:g}" if self.le is not None else f"must be < {self.lt:g}"


POSITIVE_INT = Range(ge=1)
NON_NEGATIVE = Range(ge=0)
POSITIVE = Range(gt=0)
PROBABILITY = Range(ge=0, le=1)
AT_LEAST_2 = Range(ge=2)
"""The ranges options declare most often (``Annotated[int, POSITIVE_INT]``: a count)."""

MAX_STEPS = 10_000_000
"""The most optimizer steps a training run may have, however they are set: ``--max-steps``, or derived from
``--epochs``, ``--max-tokens`` (sft) or ``--ppo-epochs`` (rl). Ten million steps is four months at one step a
second: a count beyond it is a mistake (a budget with too many zeros), refused with one line before the run folder is
made (:func:`check_step_count`), not left to count or train for ever."""


def check_step_count(steps: float, source: str) -> None:
    """Refuse a run of more than :data:`MAX_STEPS` optimizer steps; ``source`` says what sets them (``"--epochs 1e+09
    (2 steps an epoch)"``). ``steps`` may be a float (``inf`` included) or a lower bound of the count.

    Raises:
        OptionError: ``steps > MAX_STEPS`` (the message names ``source`` and the limit).
    """
    if not steps <= MAX_STEPS:
        shown = f"{steps:,}" if isinstance(steps, int) else f"{steps:.3g}"
        raise OptionError(f"{source} makes {shown} optimizer steps, more than the {MAX_STEPS:,} a run may have "
                          "(rlft.validation.MAX_STEPS)")


RULES: dict[str, Range] = {
    # counts: at least one
    **{
        name: POSITIVE_INT
        for name in (
            "batch_size",
            "steps",
            "max_steps",
            "limit",
            "k",
            "num_train",
            "num_rows",
            "best_of_n",
            "num_prompts",
            "num_samples",
            "samples",
            "prompts",
            "max_length",
            "max_new_tokens",
            "max_prompt_length",
            "max_prompt_tokens",
            "max_concurrency",
            "ppo_epochs",
            "prompts_per_step",
            "keep_checkpoints",
            "train_layers",
            "train_pairs",
            "max_prompt_batches",
            "max_tries",
            "max_tokens_per_micro_batch",
            "max_tokens",
            "seeds",
            "micro_batch_size",
            "eval_batch_size",
            "eval_limit",
        )
    },
    # counts where 0 means "off" / "none"
    **{
        name: NON_NEGATIVE
        for name in (
            "save_every",
            "eval_every",
            "max_retries",
            "start",
            "top_k",
            "max_dead_ends",
            "report_examples",
            "eval_prompts",
            "heldout_size",
            "passk",
            "passk_limit",
            "standard_limit",
            "real_limit",
            "rl_steps",
            "pairs_prompts",
            "filtered_steps",  # the demo: 0 skips the stage
            "overlong_buffer",  # rl: 0 (or None) is off
        )
    },
    "validation_start": NON_NEGATIVE,
    # rates and coefficients
    "lr": POSITIVE,
    "head_lr": POSITIVE,
    "reference_temperature": NON_NEGATIVE,
    "epochs": POSITIVE,
    "timeout": POSITIVE,
    "judge_timeout": POSITIVE,
    "judge_max_retries": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,
    "beta": NON_NEGATIVE,
    "center_coef": NON_NEGATIVE,
    "margin_scale": NON_NEGATIVE,
    "rpo_alpha": NON_NEGATIVE,
    "entropy_coef": NON_NEGATIVE,
    "logits_chunk_size": NON_NEGATIVE,
    "pack_length": POSITIVE_INT,
    "clip_low": NON_NEGATIVE,
    "clip_high": NON_NEGATIVE,
    "is_cap": POSITIVE,
    "lora_r": NON_NEGATIVE,
    "lora_alpha": POSITIVE,
    "lora_dropout": Range(ge=0, lt=1),
    "temperature": NON_NEGATIVE,
    "repetition_limit": AT_LEAST_2,  # rl: a line written N times
    "stop_repeats": AT_LEAST_2,  # a line written N times stops a sample
    "replay_size": NON_NEGATIVE,  # rl: groups replayed per step (0: off)
    "max_staleness": POSITIVE_INT,  # rl: steps a replayed group may be old
    # probabilities
    "warmup_ratio": PROBABILITY,
    "give_up": PROBABILITY,
    "top_p": Range(gt=0, le=1),
    "eval_fraction": Range(ge=0, lt=1),
    "label_smoothing": Range(ge=0, le=0.5),
}
"""Ranges of the options that do not declare one on their field (:class:`Range` in its ``Annotated`` type), by exact
field name: the standard option names several commands share. A name is never guessed from a suffix: an option
``dpo_lr`` declares its own range. ``None`` (where the type allows it) always passes: it means unset."""


_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
CHOICES: dict[str, tuple[Callable[[str], bool], Callable[[], str]]] = {
    "dtype": (lambda v: v in
              ("auto", "float32", "bfloat16", "float16"), lambda: "one of 'auto', 'float32', 'bfloat16', 'float16'"),
    "device": (lambda v: bool(_DEVICE.match(v)), lambda: "'auto', 'cpu', 'mps', 'cuda' or 'cuda:N'"),
}
"""Enumerations typed ``str``, by field name: ``(is valid, what is)``. Names whose choices live in a higher layer
(Countdown presets, prompt templates, trace styles) are checked by the option blocks that own them
(:func:`rlft.tasks.countdown.options.check_countdown_names`), so this module imports nothing from rlft."""


def rule_for(name: str, annotation: Any = None) -> Range | None:
    """The range of an option: the :class:`Range` declared in its ``Annotated`` type ``annotation`` (a type hint
    read with ``include_extras=True``), else the one :data:`RULES` gives its exact name, else None."""
    declared = [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Range)]
    return declared[0] if declared else RULES.get(name)


# ----------------------------------------------------------------------------- types


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation))
    if origin in (tuple, list):
        return f"a list of {_describe(typing.get_args(annotation)[0]).removeprefix('a ').removeprefix('an ')}s"
    if annotation is type(None):
        return "None"
    return {int: "an integer", float: "a number", str: "a string",
            bool: "true or false"}.get(annotation, str(annotation))


def type_matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits ``annotation`` (the subset of types config fields use; others pass)."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return any(type_matches(value, a) for a in typing.get_args(annotation))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return isinstance(value,
                          (tuple, list)) and all(type_matches(v, args[0]) for v in value) if args else isinstance(
                              value, (tuple, list))
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, (str, os.PathLike))
    return True


def validate_options(cfg: Any) -> None:
    """Check every field of the dataclass instance ``cfg`` against its type and range rule.

    Raises:
        OptionError: the first field (in declaration order) that is of the wrong type, not finite, or
            out of range, e.g. ``--max-steps must be >= 1 (or unset), got 0``.
    """
    hints, declared = option_hints(cfg), option_hints(cfg, include_extras=True)
    for f in option_fields(cfg):  # a composed config's blocks in its place (rlft.composed)
        value, annotation = getattr(cfg, f.name), hints.get(f.name, Any)
        if not type_matches(value, annotation):
            raise OptionError(f"{flag(f.name)}: expected {_describe(annotation)}, got {value!r}")
        if isinstance(value, str) and f.name in CHOICES:
            valid, expected = CHOICES[f.name]
            if not valid(value):
                raise OptionError(f"{flag(f.name)}: expected {expected()}, got {value!r}")
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise OptionError(f"{flag(f.name)} must be a finite number, got {value!r}")
        rule = rule_for(f.name, declared.get(f.name))
        if rule is not None and not rule(value):
            unset = " (or unset)" if type_matches(None, annotation) else ""
            raise OptionError(f"{flag(f.name)} {rule.requirement}{unset}, got {value!r}")
        if f.name == "max_steps":
            check_step_count(value, f"{flag(f.name)} {value}")
    if getattr(cfg, "resume", False) is True and getattr(cfg, "overwrite", False) is True:
        raise OptionError("--resume and --overwrite contradict each other: pass one of them")
    check_tracker(getattr(cfg, "report_to", "none"))


TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
"""``--report-to`` value -> the package it needs (:mod:`rlft.tracking`)."""


def check_tracker(report_to: str) -> None:
    """Refuse ``--report-to X`` when X's package is not installed (``importlib.util.find_spec``; nothing imported),
    so that a run fails at parse time, not after loading its data and model.

    Raises:
        OptionError: the package is missing (the message says what to install).
    """
    package = TRACKER_PACKAGES.get(report_to)
    if package is None:
        return
    import importlib.util
    import sys

    if sys.modules.get(package) is not None:  # imported already (or a stand-in put there)
        return
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a broken or blocked package
        spec = None
    if spec is None:
        raise OptionError(f"--report-to {report_to} needs the {package} package, which is not installed: "
                          f"pip install 'rlft[{report_to}]' (or --report-to none)")


def require(condition: bool, message: str) -> None:
    """Raise :class:`OptionError` with ``message`` unless ``condition`` (for checks across options)."""
    if not condition:
        raise OptionError(message)
