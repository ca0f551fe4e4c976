"""Losses: pure functions of tensors returning ``(loss, metrics)``."""

from rlft.losses.sft import sft_loss
from rlft.losses.dpo import PREFERENCE_LOSSES, dpo_loss, ipo_loss, rpo_loss
from rlft.losses.advantages import ADVANTAGES, grpo_advantages, raft_advantages, reinforce_advantages, rloo_advantages
from rlft.losses.pg import (POLICY_LOSSES, PolicyObjective, entropy_bonus, kl_loss, kl_penalty, make_objective,
                            policy_gradient_loss, raft_loss, raft_selection)
from rlft.losses.reward import bradley_terry_loss

__all__ = [
    "sft_loss",
    "PREFERENCE_LOSSES", "dpo_loss", "ipo_loss", "rpo_loss",
    "ADVANTAGES", "grpo_advantages", "raft_advantages", "reinforce_advantages", "rloo_advantages",
    "POLICY_LOSSES", "PolicyObjective", "entropy_bonus", "kl_loss", "kl_penalty", "make_objective",
    "policy_gradient_loss", "raft_loss", "raft_selection",
    "bradley_terry_loss",
]
