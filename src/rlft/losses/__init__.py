"""Losses: pure functions of tensors returning ``(loss, metrics)``."""

from rlft.losses.sft import sft_loss

__all__ = ["sft_loss"]

from rlft.losses.dpo import PREFERENCE_LOSSES, dpo_loss, ipo_loss, rpo_loss

__all__ += ["PREFERENCE_LOSSES", "dpo_loss", "ipo_loss", "rpo_loss"]

from rlft.losses.pg import kl_loss, kl_penalty, policy_gradient_loss, rloo_advantages

__all__ += ["kl_loss", "kl_penalty", "policy_gradient_loss", "rloo_advantages"]

from rlft.losses.reward import bradley_terry_loss

__all__ += ["bradley_terry_loss"]
