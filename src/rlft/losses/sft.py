"""Supervised fine-tuning loss: next-token negative log-likelihood on completion tokens."""

from __future__ import annotations

import torch

from rlft.ops import AggregationMode, aggregate


def sft_loss(
    logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: AggregationMode = "token_mean",
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the target tokens.

    Args:
        logprobs: ``(B, T)`` log p(token_t | tokens_<t); values where ``loss_mask == 0`` are ignored.
        loss_mask: ``(B, T)`` 1 on completion tokens (and their EOS), 0 on prompt and padding.
        mode: reduction, see :func:`rlft.ops.aggregate`; ``token_mean`` averages over all target
            tokens of the optimisation batch.
        num_tokens: target-token count of the whole optimisation batch when this call sees one
            micro-batch of it (keeps gradient accumulation exact).
    Returns:
        ``(loss, metrics)``: the scalar loss and ``{"loss/sft": float, "tokens": float}``.
    """
    loss = -aggregate(logprobs, loss_mask, mode, num_tokens=num_tokens)
    return loss, {"loss/sft": loss.item(), "tokens": float(loss_mask.sum().item())}
