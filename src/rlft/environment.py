"""Environments: a task rlft trains on and evaluates, written by a user in one file, with no edit to rlft.

An environment gives its prompts (rows of a split), a reward for a finished rollout, and optionally tools the model
may call (:mod:`rlft.rollout.tools`: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, answered with
``<tool_response>...</tool_response>``) and its number of turns. ``rlft rl``, ``rlft rloo`` and ``rlft eval env``
take ``--env path/to/file.py:ClassName``; the built-in ones are named (:data:`BUILTIN_ENVS`)::

    from rlft.environment import Environment

    class Reverse(Environment):
        def rows(self, split):                # "train", "validation" or "test"
            words = ["apple", "river", "stone"] if split == "train" else ["cloud"]
            return [{"prompt": f"Reverse the word {w}.\\nAnswer:", "answer": w[::-1]} for w in words]

        def reward(self, row, completion):    # one finished rollout -> a float
            return float(completion.strip() == row["answer"])

A row is a dict with a ``prompt`` (text the policy continues, or a list of chat messages rendered with the
tokenizer's chat template) and any other fields; ``reward`` and the tools (as ``context``) receive the whole row.
The conventions and why: docs/design.md, "Environments".
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable, ClassVar, Mapping

BUILTIN_ENVS = ("countdown", "countdown-calc", "chat")
"""``--env`` names rlft knows: Countdown with the rule reward (the default), Countdown with a calculator tool, and the
chat prompts of ``--prompts-data`` scored by a reward model or judge (the default with ``--prompts-data``)."""

SPLITS = ("train", "validation", "test")


class Environment:
    """Subclass and define :meth:`rows` and :meth:`reward`; set :attr:`tools` (and :attr:`max_turns`) for tool use.

    The class is instantiated with no arguments, once per command."""

    tools: ClassVar[Mapping[str, Callable[..., object]]] = {}
    """``name -> function``: the model calls ``function(**arguments)``; it returns text or a number (the
    observation). A function with a ``context`` parameter also receives the prompt's row. Empty: one turn, no tools."""
    max_turns: ClassVar[int | None] = None
    """Most model turns per rollout with tools; None: the command's ``--max-turns``."""

    def rows(self, split: str) -> list[dict]:
        """The prompts of ``split`` (``"train"``, ``"validation"`` or ``"test"``; [] when the task has none): dicts
        with a ``prompt`` (str, or a list of ``{"role", "content"}`` messages) and whatever the reward needs."""
        raise NotImplementedError(f"{type(self).__name__} must define rows(split)")

    def reward(self, row: dict, completion: str) -> float:
        """The reward of one finished rollout: ``completion`` is the model's text after the prompt (tool calls and
        observations included). A finite float."""
        raise NotImplementedError(f"{type(self).__name__} must define reward(row, completion)")


def is_user_env(spec: str | None) -> bool:
    """True when ``spec`` names a user's environment (``path.py:ClassName``), not a built-in one."""
    return spec is not None and spec not in BUILTIN_ENVS


def check_env_spec(spec: str) -> None:
    """Raises ValueError (one line) unless ``spec`` is a built-in name or ``path/to/file.py:ClassName`` whose file
    exists."""
    if spec in BUILTIN_ENVS:
        return
    path, _, name = spec.rpartition(":")
    if not path.endswith(".py") or not name.isidentifier():
        raise ValueError(f"--env {spec!r}: expected one of {', '.join(BUILTIN_ENVS)} or path/to/file.py:ClassName")
    if not Path(path).is_file():
        raise ValueError(f"--env {spec}: no file {path}")


def load_environment(spec: str) -> Environment:
    """The instance of the user's environment class ``spec`` (``path/to/file.py:ClassName``), imported from its file
    (the file's folder is put first on ``sys.path`` while it is imported, so it may import its neighbours).

    Raises:
        ValueError: a malformed spec, no such file, an import that fails (its error on one line), no such class, a
            class that is not an :class:`Environment` or does not define ``rows`` and ``reward``, or tools that are
            not a mapping of names to functions.
    """
    check_env_spec(spec)
    path, _, name = spec.rpartition(":")
    file = Path(path).resolve()
    module_name = f"rlft_user_env_{abs(hash(str(file)))}"
    loader = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(loader)
    sys.path.insert(0, str(file.parent))
    try:
        loader.loader.exec_module(module)
    except Exception as exc:
        raise ValueError(f"--env {spec}: importing {path} failed: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(str(file.parent))
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"--env {spec}: {path} defines no class {name}")
    if not issubclass(cls, Environment):
        raise ValueError(f"--env {spec}: {name} must subclass rlft.environment.Environment")
    for method in ("rows", "reward"):
        if getattr(cls, method) is getattr(Environment, method):
            raise ValueError(f"--env {spec}: {name} does not define {method}()")
    tools = cls.tools
    if not isinstance(tools, Mapping) or not all(isinstance(k, str) and callable(f) for k, f in tools.items()):
        raise ValueError(f"--env {spec}: {name}.tools must map tool names to functions")
    try:
        return cls()
    except Exception as exc:
        raise ValueError(f"--env {spec}: {name}() failed: {type(exc).__name__}: {exc}") from None


def env_rows(env: Environment, split: str) -> list[dict]:
    """``env.rows(split)``, checked: a list of dicts, each with a ``prompt`` that is a non-empty string or a
    non-empty list of ``{"role", "content"}`` messages.

    Raises:
        ValueError: naming the class, the split and the row.
    """
    name = type(env).__name__
    rows = env.rows(split)
    if not isinstance(rows, list):
        raise ValueError(f"{name}.rows({split!r}) returned {type(rows).__name__}, not a list of dicts")
    for i, row in enumerate(rows):
        prompt = row.get("prompt") if isinstance(row, dict) else None
        text_ok = isinstance(prompt, str) and prompt != ""
        chat_ok = isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt)
        if not (text_ok or chat_ok):
            raise ValueError(f"{name}.rows({split!r}), row {i}: needs a 'prompt' (non-empty text or a list of "
                             "{'role', 'content'} messages)")
    return rows


def env_reward(env: Environment, row: dict, completion: str, index: int = 0) -> float:
    """``env.reward(row, completion)`` as a float.

    Raises:
        ValueError: a reward that is not a finite number (naming the class and the row's index)."""
    import math

    value = env.reward(row, completion)
    if not isinstance(value, (int, float)) or not math.isfinite(value):  # a bool is 0 or 1
        raise ValueError(f"{type(env).__name__}.reward returned {value!r} for row {index}: expected a finite number")
    return float(value)
