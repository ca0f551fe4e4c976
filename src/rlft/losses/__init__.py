"""Losses: pure functions of tensors returning ``(loss, metrics)``."""

from rlft.losses.sft import sft_loss

__all__ = ["sft_loss"]
