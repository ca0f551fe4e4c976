"""Turning (prompt, completion) text into token ids and a loss mask, and collating batches.

Prompt and completion are tokenized separately and concatenated: the prompt exactly as generation
will see it (the tokenizer's default special tokens, e.g. a BOS for Llama-3), the completion with no
special tokens, then one EOS. The loss mask is built from these lengths, never from token values, so
the final EOS is trained even when ``pad_token_id == eos_token_id`` (docs/design.md pitfall 1).
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
    """0 on prompt tokens, 1 on completion tokens and the EOS; same length as input_ids."""
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
