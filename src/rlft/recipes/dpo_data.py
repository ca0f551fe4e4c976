"""Reading and tokenizing the preference pairs of :mod:`rlft.recipes.dpo` (``--data``).

1. read the pairs (``--data``: a ``.jsonl``/``.json``/``.parquet`` file or a Hub dataset id,
   ``--data-split``), in one of two formats chosen once (``--data-format``, :func:`data_format`):

   * ``text``: plain-text ``prompt``/``chosen``/``rejected`` strings (``--prompt-field`` etc.), the
     prompt already rendered as the model will see it, e.g. ``rlft pairs countdown`` output whose
     prompts end in ``<think>`` (:func:`load_text_pairs`);
   * ``chat``: conversations read by :func:`rlft.data.preferences.load_preference_pairs` (H4
     UltraFeedback message lists, e.g. ``HuggingFaceH4/ultrafeedback_binarized`` split
     ``train_prefs``; flattened ``prompt``/``chosen``/``rejected`` strings, the prompt taken as one user
     turn; HH-RLHF transcripts), rendered with the model's chat template (``--chat-template`` sets or
     replaces it). Score ties are dropped by default (``--drop-ties``) and pairs with identical
     replies always; both counted.
   * ``auto`` (default) looks at the first row that parses: ``nums``/``target`` columns (Countdown
     pairs), a custom ``--prompt-field``/``--chosen-field``/``--rejected-field``, or a prompt string
     that is already rendered (contains ``<|im_start|>``, or ``Assistant:`` without being an HH
     ``Human:`` transcript) -> ``text``; anything else -> ``chat``.

2. tokenize each pair as two sequences sharing the prompt tokens, loss on the response only:

   * text (:func:`tokenize_text_pair`): ``prompt + response + EOS``, loss on the response and its EOS;
     too-long responses are cut at the end, pairs whose prompt alone does not fit are dropped;
   * chat (:func:`tokenize_chat_pair`, i.e. :func:`rlft.data.chat.tokenize_preference_pair`): the
     prompt rendered with the generation prompt, then the final assistant reply and its end-of-turn
     token (the only trained tokens). Truncation keeps the prompt's **end** (``--max-prompt-length``
     cuts it from the left) and each response's **start** (cut to ``--max-length``); a pair whose
     responses would keep fewer than ``min(8, their length)`` tokens is dropped.

   Counts (rows, invalid rows skipped, ties, drops, truncations) are returned by
   :func:`load_tokenized_pairs` and logged.

The readers take the run's :class:`rlft.recipes.dpo.DPOConfig` (``data``, ``data_split``, ``data_format``,
the ``*_field`` names, ``skip_invalid``, ``drop_ties``, ``limit``, ``chat_template``, ``max_length``,
``max_prompt_length``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rlft.data import preferences
from rlft.data.chat import ensure_chat_template
from rlft.data.chat import tokenize_preference_pair as tokenize_chat_sequences
from rlft.data.files import DataError, read_rows
from rlft.data.tokenize import TokenizedExample, tokenize_segments
from rlft.tasks.countdown.calc import trace_segments
from rlft.recipes.dpo_config import DPOConfig

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class TextPair:
    """One plain-text preference: ``chosen`` is preferred over ``rejected`` as a continuation of ``prompt``."""

    prompt: str
    chosen: str
    rejected: str


ChatPair = preferences.PreferencePair
"""A chat preference: prompt messages and the chosen/rejected final assistant replies."""


@dataclass(frozen=True)
class TokenizedPair:
    """A pair tokenized as two prompt+response sequences sharing the same prompt tokens."""

    chosen: TokenizedExample
    rejected: TokenizedExample


def _first_row(cfg: DPOConfig) -> dict | None:
    return next((row for _, row in read_rows(cfg.data, split=cfg.data_split) if isinstance(row, dict)), None)


def detect_pair_format(row: dict, prompt_field: str = "prompt") -> str:
    """``"text"`` or ``"chat"`` for a row (the ``--data-format auto`` rule; see the module docstring)."""
    if "nums" in row or "target" in row:
        return "text"
    prompt = row.get(prompt_field)
    if isinstance(prompt, str):
        is_hh = prompt.lstrip().startswith("Human:")
        if "<|im_start|>" in prompt or ("Assistant:" in prompt and not is_hh):
            return "text"
    return "chat"


def data_format(cfg: DPOConfig) -> str:
    """The format of ``cfg.data``: ``cfg.data_format``, or with ``auto`` detected once from the first row."""
    if cfg.data_format != "auto":
        return cfg.data_format
    if (cfg.prompt_field, cfg.chosen_field, cfg.rejected_field) != ("prompt", "chosen", "rejected"):
        return "text"  # custom column names exist for text pairs only
    row = _first_row(cfg)
    return "text" if row is None else detect_pair_format(row, cfg.prompt_field)


def read_text_pairs(cfg: DPOConfig) -> tuple[list[TextPair], dict]:
    """The plain-text pairs of ``cfg.data`` (all rows; no limit) and counts {rows, kept, skipped_invalid}.

    Raises:
        DataError: a row whose prompt/chosen/rejected field is missing, not a string, or empty, or
            whose responses are identical (unless ``skip_invalid``: then such rows are counted,
            skipped and reported in one warning).
    """
    fields = (cfg.prompt_field, cfg.chosen_field, cfg.rejected_field)
    pairs, counts = [], {"rows": 0, "kept": 0, "skipped_invalid": 0}
    for i, row in read_rows(cfg.data, split=cfg.data_split):
        counts["rows"] += 1
        try:
            if isinstance(row, DataError):
                raise row
            for field in fields:
                if field not in row:
                    raise DataError(cfg.data, i, field, "missing")
                value = row[field]
                if not isinstance(value, str):
                    hint = " (chat message lists: use --data-format chat)" if isinstance(value, list) else ""
                    raise DataError(cfg.data, i, field, f"expected a string, got {type(value).__name__}{hint}")
                if not value.strip():
                    raise DataError(cfg.data, i, field, "empty")
            prompt, chosen, rejected = (row[f] for f in fields)
            if chosen == rejected:
                raise DataError(cfg.data, i, cfg.rejected_field, "identical to the chosen response")
        except DataError:
            if not cfg.skip_invalid:
                raise
            counts["skipped_invalid"] += 1
            continue
        pairs.append(TextPair(prompt, chosen, rejected))
    if counts["skipped_invalid"]:
        log.warning("skipped %d invalid rows of %s (--skip-invalid)", counts["skipped_invalid"], cfg.data)
    counts["kept"] = len(pairs)
    return pairs, counts


def read_chat_pairs(cfg: DPOConfig) -> tuple[list[ChatPair], dict]:
    """Chat pairs of ``cfg.data`` via :func:`rlft.data.preferences.load_preference_pairs` (layout
    detected there; ties dropped with ``cfg.drop_ties``) and its counts, plus ``dropped_identical``:
    pairs whose two replies are equal (they carry no preference and no gradient)."""
    pairs, counts = preferences.load_preference_pairs(
        cfg.data, split=cfg.data_split, skip_invalid=cfg.skip_invalid, drop_ties=cfg.drop_ties
    )
    distinct = [p for p in pairs if p.chosen != p.rejected]
    counts = {**counts, "dropped_identical": len(pairs) - len(distinct), "kept": len(distinct)}
    return distinct, counts


def load_text_pairs(cfg: DPOConfig) -> list[TextPair]:
    """The plain-text pairs of ``cfg.data``, limited to ``cfg.limit`` (see :func:`read_text_pairs`).

    Raises:
        DataError: an invalid row (unless ``skip_invalid``).
        ValueError: no valid pairs at all.
    """
    return _limited(read_text_pairs(cfg)[0], cfg)


def _limited(pairs: list, cfg: DPOConfig) -> list:
    if cfg.limit is not None:
        pairs = pairs[: cfg.limit]
    if not pairs:
        raise ValueError(f"no preference pairs in {cfg.data}")
    return pairs


def tokenize_text_pair(tokenizer, pair: TextPair, max_length: int) -> TokenizedPair | None:
    """Plain-text tokenization: ``prompt + response + EOS`` for each response, loss on response + EOS, and none on
    the tool observations of a response with tool calls (``rlft pairs countdown --env countdown-calc``:
    :func:`rlft.tasks.countdown.calc.trace_segments`, tokenized piece by piece as the rollout was; a response without
    observations gives the ids and mask of one piece).

    Returns None when the prompt alone leaves no room for a response token.
    """
    chosen = tokenize_segments(tokenizer, pair.prompt, trace_segments(pair.chosen), max_length=max_length)
    rejected = tokenize_segments(tokenizer, pair.prompt, trace_segments(pair.rejected), max_length=max_length)
    if chosen is None or rejected is None:
        return None
    return TokenizedPair(chosen, rejected)


def tokenize_chat_pair(tokenizer, pair: ChatPair, max_length: int,
                       max_prompt_length: int | None = None) -> TokenizedPair | None:
    """Chat-template tokenization (:func:`rlft.data.chat.tokenize_preference_pair`): the prompt with the
    generation prompt, then the reply and its end-of-turn token, loss on the reply + end-of-turn only.

    Returns None when the pair cannot fit (see the module docstring for the truncation policy).
    """
    out = tokenize_chat_sequences(tokenizer, pair.prompt, pair.chosen, pair.rejected,
                                  max_length=max_length, max_prompt_length=max_prompt_length)
    return None if out is None else TokenizedPair(*out)


def tokenize_preference_pairs(
    pairs: list, tokenizer, max_length: int, *, data_format: str = "text", max_prompt_length: int | None = None
) -> list[TokenizedPair]:
    """Tokenize all pairs of one format (``"text"``: :class:`TextPair`, ``"chat"``: :class:`ChatPair`);
    log how many responses were truncated and how many pairs dropped."""
    if data_format == "chat":
        why = "prompt + response start do not fit"
        tokenized = [tokenize_chat_pair(tokenizer, p, max_length, max_prompt_length) for p in pairs]
    else:
        why = "prompt alone too long"
        tokenized = [tokenize_text_pair(tokenizer, p, max_length) for p in pairs]
    out = [t for t in tokenized if t is not None]
    chosen_cut = sum(p.chosen.truncated for p in out)
    rejected_cut = sum(p.rejected.truncated for p in out)
    log.info(
        "%d pairs; %d chosen and %d rejected responses truncated to %d tokens; %d dropped (%s)",
        len(out), chosen_cut, rejected_cut, max_length, len(pairs) - len(out), why,
    )
    if not out:
        raise ValueError(f"every pair is dropped at max_length={max_length}: {why}")
    return out


PAIR_READERS = {"text": read_text_pairs, "chat": read_chat_pairs}
"""One reader per data format: ``cfg -> (pairs, counts)``."""


def load_tokenized_pairs(cfg: DPOConfig, tokenizer) -> tuple[list[TokenizedPair], dict]:
    """Read and tokenize ``cfg.data`` in the format picked once by :func:`data_format`; returns the
    pairs and data counts (rows, skipped_invalid, ties, drops, truncations), also logged.

    Chat data gets ``cfg.chat_template`` or the tokenizer's own (else a ValueError naming
    --chat-template); a set ``cfg.chat_template`` replaces the tokenizer's in either format, so the
    saved model carries it.
    """
    fmt = data_format(cfg)
    if fmt == "text" and cfg.max_prompt_length is not None:
        raise ValueError("--max-prompt-length applies to chat data (--data-format chat); text prompts are kept whole")
    if fmt == "chat" or cfg.chat_template is not None:
        ensure_chat_template(tokenizer, cfg.chat_template)
    pairs, counts = PAIR_READERS[fmt](cfg)
    log.info("%s (%s format): %s", cfg.data, fmt, ", ".join(f"{k} {v}" for k, v in counts.items()))
    pairs = _limited(pairs, cfg)
    tokenized = tokenize_preference_pairs(pairs, tokenizer, cfg.max_length, data_format=fmt,
                                          max_prompt_length=cfg.max_prompt_length)
    stats = {
        "data_format": fmt, **counts, "used": len(pairs), "pairs": len(tokenized),
        "dropped_too_long": len(pairs) - len(tokenized),
        "chosen_truncated": sum(p.chosen.truncated for p in tokenized),
        "rejected_truncated": sum(p.rejected.truncated for p in tokenized),
        "max_length": cfg.max_length, "max_prompt_length": cfg.max_prompt_length,
    }
    return tokenized, stats
