"""Evaluation prompts and precomputed responses of ``rlft eval winrate`` (:mod:`rlft.eval.winrate`).

A prompt is a list of chat messages (a plain string is one user message); :func:`prompt_key` is its canonical
string, the key that matches a precomputed ``{"prompt", "response"}`` row to an evaluation prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlft.data.files import DataError, read_rows
from rlft.rewards.reward_model import Messages, as_messages


def prompt_key(messages: Messages) -> str:
    """A canonical string identifying a prompt (its messages as compact JSON)."""
    return json.dumps([{"role": m["role"], "content": m["content"]} for m in messages], ensure_ascii=False,
                      separators=(",", ":"))


def is_precomputed(name: str) -> bool:
    """True when ``name`` names a precomputed-responses file rather than a model."""
    return Path(name).suffix in (".jsonl", ".json") and not Path(name).is_dir()


def _row_prompt(row: dict, source: str, i: int) -> Messages:
    if "prompt" not in row:
        raise DataError(source, i, "prompt", "missing")
    try:
        messages = as_messages(row["prompt"])
    except ValueError as e:
        raise DataError(source, i, "prompt", str(e)) from None
    if not messages:
        raise DataError(source, i, "prompt", "empty")
    return messages


def load_prompts(source: str, split: str = "train", limit: int | None = None) -> list[Messages]:
    """Evaluation prompts as message lists, duplicates removed, the first ``limit`` kept.

    A source whose rows have ``chosen`` and ``rejected`` is read as preference pairs
    (:func:`rlft.data.preferences.load_preference_pairs`, ties kept: only the prompts matter);
    otherwise every row needs a ``prompt`` (text or message list).
    """
    first = next(iter(read_rows(source, split=split, limit=1)), None)
    if first is None:
        raise ValueError(f"no rows in {source}")
    if isinstance(first[1], dict) and "chosen" in first[1] and "rejected" in first[1]:
        from rlft.data.preferences import load_preference_pairs

        pairs, _ = load_preference_pairs(source, split=split, skip_invalid=True, drop_ties=False)
        prompts = [as_messages(p.prompt) for p in pairs]
    else:
        prompts = []
        for i, row in read_rows(source, split=split):
            if isinstance(row, DataError):
                raise row
            prompts.append(_row_prompt(row, source, i))
    unique: dict[str, Messages] = {}
    for m in prompts:
        unique.setdefault(prompt_key(m), m)
    out = list(unique.values())
    return out[:limit] if limit is not None else out


def load_responses(path: str) -> dict[str, tuple[Messages, str]]:
    """Precomputed responses ``{prompt_key: (messages, response)}`` from ``{"prompt", "response"}`` rows
    (file order kept; a repeated prompt keeps its first response)."""
    out: dict[str, tuple[Messages, str]] = {}
    for i, row in read_rows(path):
        if isinstance(row, DataError):
            raise row
        messages = _row_prompt(row, path, i)
        if not isinstance(row.get("response"), str):
            raise DataError(path, i, "response", "missing" if "response" not in row else "expected a string")
        out.setdefault(prompt_key(messages), (messages, row["response"]))
    if not out:
        raise ValueError(f"no responses in {path}")
    return out
