"""Memory options the training recipes share (``--gradient-checkpointing``; the chunked LM head is
``--logits-chunk-size``, see :func:`rlft.ops.lm_head_logprobs`)."""

from __future__ import annotations

import torch


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each transformer block's activations in the backward pass instead of storing them
    (transformers' ``activation_checkpointing_enable``, called ``gradient_checkpointing_enable`` before 5.x,
    with non-reentrant ``torch.utils.checkpoint``, which
    needs no input that requires grad, so frozen embeddings or lower blocks are fine).

    Values and gradients are unchanged (up to float rounding); a step costs about one more forward.
    Raises ValueError for a model that does not support it.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def check_scale_options(cfg) -> None:
    """Reject bad ``--pack-length`` / ``--logits-chunk-size`` values before any work (fields a config lacks are skipped).

    Raises:
        ValueError: ``pack_length < 1`` (None means one row per micro-batch) or ``logits_chunk_size < 0``.
    """
    pack_length = getattr(cfg, "pack_length", None)
    if pack_length is not None and pack_length < 1:
        raise ValueError(f"pack_length must be >= 1 (or None: one packed row per micro-batch), got {pack_length}")
    if getattr(cfg, "logits_chunk_size", 0) < 0:
        raise ValueError(f"logits_chunk_size must be >= 0 (0: no chunking), got {cfg.logits_chunk_size}")
