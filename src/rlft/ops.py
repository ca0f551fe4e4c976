"""Tensor helpers shared by losses and recipes: log-probs, masked reductions, one aggregation rule.

Shape legend: B batch, T tokens, V vocab.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

AggregationMode = Literal["token_mean", "seq_mean", "seq_sum", "sum"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` over ``dim`` (all dims when None). Shapes must broadcast.

    Positions where ``mask == 0`` are ignored even when ``values`` is inf or nan there.
    """
    masked = torch.where(mask != 0, values * mask, 0.0)
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask == 1``; positions with an empty mask give 0, not NaN."""
    total = masked_sum(values, mask, dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: AggregationMode = "token_mean",
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> torch.Tensor:
    """The one place where per-token values of shape ``(B, T)`` are reduced to a scalar.

    - ``token_mean``: sum over all masked tokens / number of masked tokens. Pass ``num_tokens``
      (the masked-token count of the *whole* optimisation batch) when a batch is split into
      micro-batches, so that summing micro-batch losses gives exactly the full-batch loss.
    - ``seq_mean``: mean over tokens within each sequence, then sum over sequences divided by
      ``num_sequences`` (default: this micro-batch's B).
    - ``seq_sum``: sum over tokens within each sequence, then sum over sequences divided by
      ``num_sequences`` (default: this micro-batch's B). The sequence-level REINFORCE/RLOO
      estimator: the mean over sequences of sum_t values_t.
    - ``sum``: plain masked sum.
    """
    if mode == "token_mean":
        denom = loss_mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=values.dtype)
        return masked_sum(values, loss_mask) / denom.clamp(min=1)
    if mode == "seq_mean":
        per_seq = masked_mean(values, loss_mask, dim=-1)
        denom = per_seq.shape[0] if num_sequences is None else num_sequences
        return per_seq.sum() / max(denom, 1)
    if mode == "seq_sum":
        denom = loss_mask.shape[0] if num_sequences is None else num_sequences
        return masked_sum(values, loss_mask) / max(denom, 1)
    if mode == "sum":
        return masked_sum(values, loss_mask)
    raise ValueError(f"unknown aggregation mode {mode!r}; expected token_mean, seq_mean, seq_sum or sum")


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each label under ``softmax(logits / temperature)``.

    Args:
        logits: ``(..., V)`` float.
        labels: ``(...)`` long, same leading shape.
    Returns:
        ``(...)`` float32 log-probs.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return -F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view(labels.shape)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    temperature: float = 1.0,
    *,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of ``input_ids`` under ``model``, computed only where ``loss_mask`` is 1.

    Token ``t`` is scored from the logits at position ``t - 1``. The LM head runs only on positions
    whose next token is a target, which saves the ``(B, T, V)`` logits tensor for prompt tokens.

    Args:
        input_ids, attention_mask, loss_mask: ``(B, T)``; ``loss_mask[:, 0]`` must be 0.
        temperature: divide logits by this (use the sampling temperature for RL log-probs).
        return_entropy: also return the entropy ``H_t = -sum_v p_v log p_v`` of the (tempered)
            next-token distribution at each target position, with gradient.
    Returns:
        ``(B, T)`` float32: log p(input_ids[b, t] | prefix) where ``loss_mask[b, t] == 1``, else 0;
        with ``return_entropy``, ``(logprobs, entropy)``, both ``(B, T)`` (entropy 0 off the mask).
    """
    if bool(loss_mask[:, 0].any()):
        raise ValueError("loss_mask[:, 0] must be 0: the first token has no prefix to predict it from")
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    target_mask = loss_mask[:, 1:].bool()  # (B, T-1): positions t whose token t+1 is a target
    selected = hidden[:, :-1][target_mask]  # (N, H)
    logits = model.get_output_embeddings()(selected)  # (N, V)
    scale = getattr(model.config, "final_logit_softcapping", None)
    if scale:
        logits = torch.tanh(logits / scale) * scale
    token_logprobs = logprobs_from_logits(logits, input_ids[:, 1:][target_mask], temperature)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    out[:, 1:][target_mask] = token_logprobs
    if not return_entropy:
        return out
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)  # (N, V)
    entropy = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    entropy[:, 1:][target_mask] = -(log_p.exp() * log_p).sum(-1)
    return out, entropy
