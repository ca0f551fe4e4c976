"""Turning (prompt, completion) text into token ids and a loss mask, and collating batches.

Prompt and completion are tokenized separately and concatenated: the prompt exactly as generation
will see it (the tokenizer's default special tokens, e.g. a BOS for Llama-3), the completion with no
special tokens, then one EOS. The loss mask is built from these lengths, never from token values, so
the final EOS is trained even when ``pad_token_id == eos_token_id`` (docs/design.md pitfall 1).
A completion with tool observations is tokenized piece by piece (:func:`tokenize_segments`), the observations
untrained.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.types import TokenBatch


@dataclass(frozen=True)
class TokenizedExample:
    input_ids: list[int]
    """Prompt ids + completion ids (+ EOS), length <= max_length."""
    loss_mask: list[int]
    """0 on prompt tokens, 1 on completion tokens and the EOS (0 on a completion's untrained segments, such as tool
    observations: :func:`tokenize_segments`); same length as input_ids."""
    truncated: bool
    """True when the completion (and so its EOS) was cut to fit max_length."""


def tokenize_prompt_completion(
    tokenizer, prompt: str, completion: str, *, max_length: int, add_eos: bool = True
) -> TokenizedExample | None:
    """Tokenize one pair; returns None when the prompt alone leaves no room for a completion token.

    Truncation keeps the whole prompt and cuts the end of the completion (the EOS goes first).
    """
    prompt_ids = tokenizer(prompt).input_ids
    completion_ids = tokenizer(completion, add_special_tokens=False).input_ids
    if add_eos:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token; set one or pass add_eos=False")
        completion_ids = completion_ids + [tokenizer.eos_token_id]
    room = max_length - len(prompt_ids)
    if room <= 0:
        return None
    truncated = len(completion_ids) > room
    completion_ids = completion_ids[:room]
    return TokenizedExample(
        input_ids=prompt_ids + completion_ids,
        loss_mask=[0] * len(prompt_ids) + [1] * len(completion_ids),
        truncated=truncated,
    )


def tokenize_segments(
    tokenizer, prompt: str, segments: list[tuple[str, bool]], *, max_length: int, add_eos: bool = True
) -> TokenizedExample | None:
    """Tokenize a prompt and a completion given as ``(text, trained)`` segments; None when the prompt alone leaves no
    room for a completion token.

    The prompt is tokenized as :func:`tokenize_prompt_completion` does (the tokenizer's default special tokens), then
    each segment on its own (``add_special_tokens=False``) and the ids concatenated, then one EOS: ``loss_mask`` is 0
    on the prompt, 1 on each trained segment's tokens and the EOS, 0 on each untrained segment's (a tool's
    observation, :func:`rlft.tasks.countdown.calc.trace_segments`). Segments are tokenized apart on purpose: a rollout
    engine tokenizes each observation alone and appends its ids to the model's, and the model's next tokens start
    fresh after them. Truncation keeps the whole prompt and cuts the end of the completion (the EOS goes first);
    ``truncated`` then. One trained segment holding the whole completion gives exactly
    :func:`tokenize_prompt_completion`'s example.

    Raises:
        ValueError: a segment that is not a ``(str, bool)`` pair (naming its index), or ``add_eos`` with a tokenizer
            that has no EOS.
    """
    prompt_ids = tokenizer(prompt).input_ids
    completion_ids: list[int] = []
    mask: list[int] = []
    for i, segment in enumerate(segments):
        if not (isinstance(segment, tuple) and len(segment) == 2 and isinstance(segment[0], str)
                and isinstance(segment[1], bool)):
            raise ValueError(f"segment {i}: expected a (text: str, trained: bool) pair, got {segment!r:.80}")
        text, trained = segment
        ids = tokenizer(text, add_special_tokens=False).input_ids if text else []
        completion_ids += ids
        mask += [int(trained)] * len(ids)
    if add_eos:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token; set one or pass add_eos=False")
        completion_ids.append(tokenizer.eos_token_id)
        mask.append(1)
    room = max_length - len(prompt_ids)
    if room <= 0:
        return None
    return TokenizedExample(
        input_ids=prompt_ids + completion_ids[:room],
        loss_mask=[0] * len(prompt_ids) + mask[:room],
        truncated=len(completion_ids) > room,
    )


def collate(examples: list[TokenizedExample], pad_token_id: int) -> TokenBatch:
    """Right-pad a list of examples into a :class:`TokenBatch` of shape ``(B, max_len)``."""
    if not examples:
        raise ValueError("cannot collate an empty list of examples")
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.float32)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[i, :n] = torch.tensor(e.input_ids)
        attention_mask[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
    return TokenBatch(input_ids, attention_mask, loss_mask)
