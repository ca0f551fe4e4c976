"""RLOO (Ahmadian et al. 2024): the RLOO preset of the one RL loop (:mod:`rlft.recipes.rl`).

``rlft rloo`` is ``rlft rl --advantage rloo --loss reinforce --loss-mode seq_sum``: REINFORCE with a
leave-one-out baseline, ``A_i = R_i - mean_{j != i} R_j`` within each prompt's k samples, on the
sequence-level estimator; every other option (KL placement, PPO epochs, group filtering, LoRA, the
chat track with a reward model) is the RL loop's, documented there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlft.losses.advantages import rloo_advantages  # noqa: F401  (re-exported)
from rlft.recipes.rl import RLConfig, advantage_function, sample_step, train_rl  # noqa: F401
from rlft.rewards.registry import RewardFunction
from rlft.rl.batch import (  # noqa: F401  (re-exported: the names the RLOO recipe defined)
    batch_logprobs,
    generation_seed,
    gradient_rows,
    micro_batches,
    policy_loss_backward,
    rollout_batch,
    take_rows,
)
from rlft.rl.prompts import (  # noqa: F401
    RLPrompt,
    evaluate_chat,
    evaluate_heldout,
    load_chat_prompts,
    load_prompts,
    load_rl_tasks,
    load_rloo_tasks,
    read_chat_prompts,
)
from rlft.rl.rewards import Reward, make_reward  # noqa: F401


@dataclass(frozen=True)
class RLOOConfig(RLConfig):
    """RLOO (REINFORCE with a leave-one-out baseline) on Countdown prompts, or on chat prompts with a learned reward."""

    output_dir: str = "runs/rloo"
    """Run directory: checkpoints/, model/, metrics.jsonl, config.yaml."""
    advantage: Literal["rloo", "grpo", "lite_ppo", "dr_grpo", "raft", "reinforce"] = "rloo"
    """Advantage estimator (RLOO: 'rloo', the leave-one-out baseline; see `rlft rl --help` for the others)."""
    loss: Literal["reinforce", "ppo", "raft", "raft++"] = "reinforce"
    """Policy loss: 'reinforce' (RLOO), or 'ppo' (clipped ratio; useful with --ppo-epochs > 1)."""


def train_rloo(cfg: RLConfig, *, reward_fn: RewardFunction | None = None) -> Path:
    """Run RLOO (or any :class:`RLConfig`) with the RL loop; returns ``output_dir/model``."""
    return train_rl(cfg, reward_fn=reward_fn)
