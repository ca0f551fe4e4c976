"""Preference pairs and chat conversations from local files or Hugging Face Hub datasets.

Layouts, detected from the first row that matches one (``layout=`` overrides):

* ``"h4"`` — ``HuggingFaceH4/ultrafeedback_binarized`` (``train_prefs``/``test_prefs``, and the
  ``*_sft``/``*_gen`` splits): ``prompt`` (str), ``chosen``/``rejected`` message lists whose last
  message is the assistant reply and whose earlier messages (the prompt turns) are equal,
  ``score_chosen``, ``score_rejected``, ``prompt_id``, ``messages`` (in *_sft/*_gen).
* ``"text"`` — flattened pairs (``trl-lib`` style, the local ``train_clean.jsonl``): ``prompt``,
  ``chosen``, ``rejected`` strings; scores from ``metadata.score_*`` or top-level ``score_*``.
  The prompt becomes one user message.
* ``"hh"`` — Anthropic HH-RLHF: ``chosen``/``rejected`` full transcripts
  ``"\\n\\nHuman: ...\\n\\nAssistant: ..."``; the shared turns are the prompt, the final Assistant
  turns the replies.
* ``"hh_prompt"`` — HH-RLHF with the final reply split off: ``prompt`` is a ``Human:``/``Assistant:``
  transcript (an empty trailing ``Assistant:`` tag is dropped), ``chosen``/``rejected`` the replies.
* ``"chat"`` — ``{"messages": [{"role", "content"}, ...]}`` (``HuggingFaceTB/smol-smoltalk``, H4 *_sft).

HH transcripts: message text is stripped, and consecutive turns of the same speaker are joined with a
blank line into one turn (a handful of HH rows split one reply over two ``Assistant:`` blocks).

Validation: a missing field, wrong type, message without role/content, role other than
system/user/assistant, empty or whitespace-only reply, a prompt that is empty or does not end with a
user turn, chosen/rejected conversations that differ before their final reply, a reply conversation
not ending with an assistant turn, and (for chat examples) no assistant turn, an empty assistant
turn, or an assistant turn first, each raise :class:`~rlft.data.files.DataError` naming the file, the
0-based row and the field.
With ``skip_invalid=True`` they are counted (``skipped_invalid``) and a warning is logged on the
``"rlft"`` logger; never dropped silently. Score ties (``score_chosen == score_rejected``) are kept
and counted (``ties``); ``drop_ties=True`` drops them (``dropped_ties``).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlft.data.chat import ROLES, Message
from rlft.data.files import DataError, file_columns, read_rows

log = logging.getLogger("rlft")

PREFERENCE_LAYOUTS = ("h4", "text", "hh", "hh_prompt")
CHAT_LAYOUTS = ("chat", *PREFERENCE_LAYOUTS)
COLUMNS = ["prompt", "chosen", "rejected", "score_chosen", "score_rejected", "metadata", "messages"]
"""The only columns read from Parquet files."""


@dataclass(frozen=True)
class PreferencePair:
    prompt: list[Message]
    """The conversation up to (not including) the final assistant turn; ends with a user turn."""
    chosen: str
    """The preferred final assistant reply."""
    rejected: str
    """The dispreferred final assistant reply."""
    score_chosen: float | None = None
    score_rejected: float | None = None


@dataclass(frozen=True)
class ChatExample:
    messages: list[Message]
    """A conversation with at least one (non-empty) assistant turn."""


class _RowError(ValueError):
    def __init__(self, field: str, problem: str):
        super().__init__(f"field {field!r}: {problem}")
        self.field, self.problem = field, problem


# ---------------------------------------------------------------------------------------------
# Field parsing


def _field(row: dict, key: str) -> Any:
    if key not in row or row[key] is None:
        raise _RowError(key, "missing")
    return row[key]


def _text(value: Any, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _RowError(field, f"expected a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise _RowError(field, f"empty or whitespace-only: {value!r}")
    return value


def _messages(value: Any, field: str) -> list[Message]:
    if not isinstance(value, list):
        raise _RowError(field, f"expected a list of messages, got {type(value).__name__}")
    out = []
    for j, m in enumerate(value):
        where = f"{field}[{j}]"
        if not isinstance(m, dict):
            raise _RowError(where, f"expected a {{role, content}} object, got {type(m).__name__}")
        for key in ("role", "content"):
            if key not in m or m[key] is None:
                raise _RowError(f"{where}.{key}", "missing")
        if m["role"] not in ROLES:
            raise _RowError(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {m['role']!r}")
        out.append({"role": m["role"], "content": _text(m["content"], f"{where}.content", allow_empty=True)})
    return out


def _score(row: dict, key: str) -> float | None:
    value = row.get(key)
    if value is None and isinstance(row.get("metadata"), dict):
        value, key = row["metadata"].get(key), f"metadata.{key}"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _RowError(key, f"expected a finite number, got {value!r}")
    return float(value)


def _check_prompt(prompt: list[Message], field: str) -> list[Message]:
    if not prompt:
        raise _RowError(field, "empty prompt (no turns before the final reply)")
    if prompt[-1]["role"] != "user":
        raise _RowError(field, f"the prompt must end with a user turn, not a {prompt[-1]['role']!r} turn")
    if not any(m["content"].strip() for m in prompt):
        raise _RowError(field, "the prompt has no text")
    return prompt


_HH_TURN = re.compile(r"\n\n(Human|Assistant):")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def parse_hh_transcript(text: str) -> list[Message]:
    """``"\\n\\nHuman: a\\n\\nAssistant: b"`` -> ``[user a, assistant b]`` (the leading blank line is optional).

    Text is stripped; consecutive turns of the same speaker are joined with a blank line. Raises
    ValueError when the text does not start with a ``Human:``/``Assistant:`` tag.
    """
    body = text if text.startswith("\n\n") else "\n\n" + text
    parts = _HH_TURN.split(body)
    if parts[0].strip() or len(parts) < 3:
        raise ValueError("not a HH transcript: expected text starting with 'Human:' or 'Assistant:'")
    messages: list[Message] = []
    for speaker, content in zip(parts[1::2], parts[2::2]):
        role, content = _HH_ROLES[speaker], content.strip()
        if messages and messages[-1]["role"] == role:
            joined = "\n\n".join(c for c in (messages[-1]["content"], content) if c)
            messages[-1] = {"role": role, "content": joined}
        else:
            messages.append({"role": role, "content": content})
    return messages


def _hh(value: Any, field: str) -> list[Message]:
    try:
        return parse_hh_transcript(_text(value, field))
    except ValueError as e:
        if isinstance(e, _RowError):
            raise
        raise _RowError(field, f"{e}; got {value[:60]!r}") from None


def _looks_hh(value: Any) -> bool:
    return isinstance(value, str) and value.lstrip("\n").startswith(("Human:", "Assistant:"))


# ---------------------------------------------------------------------------------------------
# Layouts


def _detect(row: dict, allowed: tuple[str, ...]) -> str | None:
    if "chat" in allowed and isinstance(row.get("messages"), list):
        return "chat"
    chosen = row.get("chosen")
    if isinstance(chosen, list):
        return "h4"
    if isinstance(chosen, str):
        if "prompt" in row:
            return "hh_prompt" if _looks_hh(row["prompt"]) else "text"
        if _looks_hh(chosen):
            return "hh"
    return None


def _layout_error(row: dict, allowed: tuple[str, ...], source=None) -> _RowError:
    columns = file_columns(source) if source is not None else None
    found = f"columns {columns}" if columns is not None else f"keys {sorted(row)}"
    return _RowError(
        "<row>",
        f"unknown layout with {found}; expected {', '.join(allowed)} "
        "(H4 chosen/rejected message lists, prompt/chosen/rejected strings, HH-RLHF transcripts"
        + (", or a messages list)" if "chat" in allowed else ")"),
    )


def _reply_side(row: dict, layout: str, side: str) -> tuple[list[Message], str]:
    """The prompt messages and the final reply of one side ("chosen" or "rejected")."""
    if layout == "h4":
        conversation = _messages(_field(row, side), side)
        if not conversation or conversation[-1]["role"] != "assistant":
            raise _RowError(side, "the conversation does not end with an assistant turn")
        reply = _text(conversation[-1]["content"], f"{side}[{len(conversation) - 1}].content")
        prompt = conversation[:-1] or [{"role": "user", "content": _text(_field(row, "prompt"), "prompt")}]
        return _check_prompt(prompt, side if len(conversation) > 1 else "prompt"), reply
    if layout == "text":
        prompt = [{"role": "user", "content": _text(_field(row, "prompt"), "prompt")}]
        return prompt, _text(_field(row, side), side)
    if layout == "hh_prompt":
        prompt = _hh(_field(row, "prompt"), "prompt")
        if prompt[-1]["role"] == "assistant" and not prompt[-1]["content"]:
            prompt = prompt[:-1]  # the empty "Assistant:" slot the reply goes into
        return _check_prompt(prompt, "prompt"), _text(_field(row, side), side).strip()
    # hh: full transcripts
    conversation = _hh(_field(row, side), side)
    if conversation[-1]["role"] != "assistant":
        raise _RowError(side, "the transcript does not end with an Assistant turn")
    if not conversation[-1]["content"]:
        raise _RowError(side, "the final Assistant turn is empty")
    reply = conversation[-1]["content"]
    return _check_prompt(conversation[:-1], side), reply


def _pair(row: dict, layout: str) -> PreferencePair:
    prompt, chosen = _reply_side(row, layout, "chosen")
    rejected_prompt, rejected = _reply_side(row, layout, "rejected")
    if rejected_prompt != prompt:
        raise _RowError("rejected", "the conversation before the final reply differs from chosen's")
    return PreferencePair(prompt, chosen, rejected, _score(row, "score_chosen"), _score(row, "score_rejected"))


def _chat(row: dict, layout: str) -> ChatExample:
    if layout != "chat":  # a preference row: the chosen conversation ("Pref-FT")
        prompt, chosen = _reply_side(row, layout, "chosen")
        return ChatExample([*prompt, {"role": "assistant", "content": chosen}])
    messages = _messages(_field(row, "messages"), "messages")
    turns = [j for j, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise _RowError("messages", "no assistant turn to train on")
    if turns[0] == 0:
        raise _RowError("messages[0].role", "the conversation starts with an assistant turn (no prompt before it)")
    for j in turns:
        _text(messages[j]["content"], f"messages[{j}].content")
    return ChatExample(messages)


def _check_layout(layout: str, allowed: tuple[str, ...]) -> None:
    if layout != "auto" and layout not in allowed:
        raise ValueError(f"unknown layout {layout!r}; expected 'auto' or one of {', '.join(allowed)}")


def _load(source, split, limit, skip_invalid, layout, allowed, parse, counts):
    """Parse rows with ``parse(row, layout)``; yields (row index, record). Counts rows and invalid rows."""
    _check_layout(layout, allowed)
    chosen_layout = None if layout == "auto" else layout
    bad: list[str] = []
    for i, row in read_rows(source, split=split, limit=limit, columns=COLUMNS):
        counts["rows"] += 1
        try:
            if isinstance(row, DataError):
                raise row
            if chosen_layout is None:
                chosen_layout = _detect(row, allowed)
                if chosen_layout is None:
                    raise _layout_error(row, allowed, source)
                log.info("%s: %s layout (from row %d)", source, chosen_layout, i)
            yield i, parse(row, chosen_layout)
        except (_RowError, DataError) as e:
            error = e if isinstance(e, DataError) else DataError(str(source), i, e.field, e.problem)
            if not skip_invalid:
                raise error from None
            counts["skipped_invalid"] += 1
            bad.append(f"row {error.row}: field {error.field!r}: {error.problem}")
            log.debug("skipped invalid row: %s", error)
    if bad:
        shown = "; ".join(bad[:3]) + ("; ..." if len(bad) > 3 else "")
        log.warning("skipped %d invalid rows of %d in %s: %s", len(bad), counts["rows"], source, shown)


def load_preference_pairs(
    source: str | Path,
    *,
    split: str = "train_prefs",
    limit: int | None = None,
    skip_invalid: bool = False,
    drop_ties: bool = False,
    layout: str = "auto",
) -> tuple[list[PreferencePair], dict]:
    """Preference pairs from a local ``.jsonl[.gz]``/``.json``/``.parquet`` file or a Hub dataset id.

    ``split`` goes to the Hub loader (H4: ``train_prefs``, ``test_prefs``, ...); ``limit`` reads the
    first rows only. ``layout``: ``"auto"`` or one of :data:`PREFERENCE_LAYOUTS`.

    Returns the pairs and counts ``{"rows", "kept", "skipped_invalid", "ties", "dropped_ties"}``:
    ``ties`` counts valid pairs with equal scores, ``dropped_ties`` those dropped (``drop_ties``).

    Raises:
        DataError: an invalid row (file, row, field), unless ``skip_invalid``.
        HubUnavailableError: a Hub id that cannot be loaded (offline).
    """
    counts = {"rows": 0, "kept": 0, "skipped_invalid": 0, "ties": 0, "dropped_ties": 0}
    pairs = []
    for _, pair in _load(source, split, limit, skip_invalid, layout, PREFERENCE_LAYOUTS, _pair, counts):
        if pair.score_chosen is not None and pair.score_chosen == pair.score_rejected:
            counts["ties"] += 1
            if drop_ties:
                counts["dropped_ties"] += 1
                continue
        pairs.append(pair)
    counts["kept"] = len(pairs)
    if counts["ties"]:
        action = "dropped" if drop_ties else "kept (drop_ties=True drops them)"
        log.info("%s: %d score ties among %d valid pairs, %s", source, counts["ties"],
                 counts["rows"] - counts["skipped_invalid"], action)
    return pairs, counts


def load_chat_examples(
    source: str | Path,
    *,
    split: str = "train",
    limit: int | None = None,
    skip_invalid: bool = False,
    layout: str = "auto",
) -> tuple[list[ChatExample], dict]:
    """Conversations for SFT from a local file or a Hub dataset id (``split``, e.g. H4 ``train_sft``).

    ``layout``: ``"auto"`` or one of :data:`CHAT_LAYOUTS`. Rows with a ``messages`` list are the
    ``"chat"`` layout; preference rows (any other layout) give their chosen conversation (prompt +
    chosen reply; the rejected side is not read). Returns the examples and counts
    ``{"rows", "kept", "skipped_invalid"}``.

    Raises:
        DataError: an invalid row (file, row, field), unless ``skip_invalid``.
        HubUnavailableError: a Hub id that cannot be loaded (offline).
    """
    counts = {"rows": 0, "kept": 0, "skipped_invalid": 0}
    examples = [ex for _, ex in _load(source, split, limit, skip_invalid, layout, CHAT_LAYOUTS, _chat, counts)]
    counts["kept"] = len(examples)
    return examples, counts
