"""``rlft eval countdown``: score a model on held-out Countdown tasks (generated, or rows of a Countdown dataset).

Tasks come from a generator preset (``--data`` unset: the held-out split of ``make_splits``, the one training
with the same ``--preset``/``--split-seed`` never sees) or from a Countdown file / Hub dataset, whose rows are
split by :func:`rlft.tasks.countdown.splits.split_rows` into train, validation (screening) and test (the
spec's held-out score) parts; ``--split all`` takes every row in file order. Results are printed by count of
numbers too (3, 4 and mixed: the mix is the spec's metric), and written with ``--output`` as JSON
(:class:`rlft.eval.countdown.CountdownEvalResult`: per-task scores, tasks, truncation, tokens, answer values).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from rlft.eval.countdown import CountdownEvalResult, evaluate_countdown, print_result
from rlft.options import DeviceOptions, RolloutOptions
from rlft.rollout.base import SamplingParams
from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt
from rlft.types import CountdownTask
from rlft.validation import validate_options

DEFAULT_TEST_SIZE = 1024
"""Held-out tasks generated when ``data`` is None and ``limit`` is None."""


@dataclass(frozen=True)
class EvalCountdownConfig(DeviceOptions, RolloutOptions):
    """Evaluate a model on held-out Countdown tasks."""

    model: str = "smollm2-135m"
    """Built-in model name, local Hugging Face folder, or Hub id."""
    data: str | None = None
    """None: the generated held-out split of `preset` (the same make_splits(split_seed) that training
    uses); else a Countdown JSONL/Parquet file or Hub dataset with target + nums/numbers (e.g.
    ../shared/data/countdown/train.parquet or Jiayi-Pan/Countdown-Tasks-3to4)."""
    split: Literal["test", "validation", "train", "all"] = "test"
    """Which tasks: with --data, the parts of rlft.tasks.countdown.splits (test: the 500 held-out rows the spec's
    score is read on; validation: 500 other held-out rows, for screening; train: the rest), or 'all' rows in file
    order; generated tasks (no --data): 'test' (held out from training) or 'train'."""
    data_split: str = "train"
    """Split to read when `data` is a Hub id (Countdown-Tasks-3to4 has only 'train')."""
    preset: str = "easy3"
    """Generator preset for the held-out split when `data` is None."""
    split_seed: int = 1234
    """Seed of make_splits when `data` is None; keep it equal to training's."""
    limit: int | None = 100
    """Evaluate the first `limit` tasks (None: all)."""
    prompt_template: str = "base"
    """Prompt template name: "base" (TinyZero text), "chat" (the model's chat template) or "short"."""
    mode: Literal["greedy", "sampled"] = "greedy"
    """greedy: one temperature-0 completion per task; sampled: `k` samples at `temperature`/`top_p`."""
    k: int = 1
    """Samples per task in sampled mode (pass@1..pass@k are reported)."""
    temperature: float = 1.0
    """Sampling temperature in sampled mode."""
    top_p: float = 1.0
    """Nucleus sampling mass in sampled mode."""
    max_new_tokens: int | None = None
    """Most tokens per completion; None: 1024 on CUDA, 256 on CPU (the reference evaluates with >= 1024)."""
    batch_size: int = 32
    """Sequences generated together."""
    output: str | None = None
    """Write the metrics and examples to this JSON file."""
    seed: int = 0
    """Sampling seed."""

    def __post_init__(self) -> None:
        validate_options(self)


def load_eval_tasks(cfg: EvalCountdownConfig) -> list[CountdownTask]:
    """The tasks ``cfg`` names: rows of a file/Hub dataset, or generated tasks of a preset (the first ``limit``).

    With ``data``: ``split`` "all" reads the first ``limit`` rows; "test", "validation" and "train" are the parts
    of :func:`rlft.tasks.countdown.splits.load_split` (the held-out rows are the same whatever ``limit``).
    Generated: the first ``limit`` tasks of ``make_splits(PRESETS[preset], ..., seed=split_seed)``'s test split
    ("test"; its stream does not depend on ``n_train`` and is prefix-stable, so these are held out from a
    training run with the same preset and seed whenever that run's ``n_test >= limit``) or train split ("train").

    Raises:
        ValueError: an unknown preset; ``validation`` or ``all`` without ``data``.
    """
    if cfg.data is not None:
        if cfg.split == "all":
            from rlft.tasks.countdown.loaders import load_countdown

            return load_countdown(cfg.data, split=cfg.data_split, limit=cfg.limit)
        from rlft.tasks.countdown.splits import load_split

        part = load_split(cfg.data, data_split=cfg.data_split).part(cfg.split)
        return part[: cfg.limit] if cfg.limit is not None else part
    from rlft.tasks.countdown.generator import PRESETS, make_splits

    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown preset {cfg.preset!r}; choose from {sorted(PRESETS)}")
    if cfg.split not in ("test", "train"):
        raise ValueError(f"--split {cfg.split} needs --data (a Countdown file or Hub dataset); generated tasks have test and train")
    n = cfg.limit if cfg.limit is not None else DEFAULT_TEST_SIZE
    if cfg.split == "train":
        return make_splits(PRESETS[cfg.preset], n_train=n, n_test=DEFAULT_TEST_SIZE, seed=cfg.split_seed)[0]
    return make_splits(PRESETS[cfg.preset], n_train=0, n_test=n, seed=cfg.split_seed)[1]


def run_eval_countdown(cfg: EvalCountdownConfig) -> CountdownEvalResult:
    """Load the model, build tasks and prompts, evaluate, print a table, write ``cfg.output`` if set.

    Raises:
        rlft.models.ModelNotFoundError: the model cannot be loaded.
        ValueError: unknown preset or prompt template, or no tasks.
    """
    from rlft.models import load_tokenizer, pick_device
    from rlft.rollout.engines import make_engine

    spec = pick_device(cfg.device, cfg.dtype)
    tokenizer = load_tokenizer(cfg.model)
    tasks = load_eval_tasks(cfg)
    prompts = [render_prompt(cfg.prompt_template, task, tokenizer) for task in tasks]
    engine = make_engine(cfg.rollout_engine, cfg.model, tokenizer, spec, url=cfg.rollout_url, batch_size=cfg.batch_size,
                         show_progress=True, add_special_tokens=adds_special_tokens(cfg.prompt_template))
    max_new_tokens = cfg.max_new_tokens or (1024 if spec.device.type == "cuda" else 256)
    if cfg.mode == "greedy":
        params = SamplingParams(k=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=cfg.seed)
    else:
        params = SamplingParams(
            k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=max_new_tokens, seed=cfg.seed
        )
    result = evaluate_countdown(engine, tasks, prompts, params)
    print_result(result, title=f"Countdown eval: {cfg.model}")
    if cfg.output:
        path = Path(cfg.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**result.to_dict(), "config": asdict(cfg)}, indent=2))
    return result


