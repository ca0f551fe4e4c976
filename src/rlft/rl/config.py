"""The RL loop's options: :class:`RLConfig` (``rlft rl``, and ``rlft rloo`` with :data:`RLOO_DEFAULTS`).

``RLConfig`` is a sum of option blocks, each checking its own fields: the Countdown tasks
(:class:`rlft.tasks.countdown.options.CountdownTrainingOptions`, shared with sft, pairs and eval countdown), the
parts of the loop (:mod:`rlft.rl.options`: sampling, policy loss, KL, importance correction, replay, group
filtering, curriculum, shaping, in-loop evaluation, chat prompts, reward) and the shared training blocks of
:mod:`rlft.options` (run folder, optimizer, memory, ``--compile`` and ``--max-tokens-per-micro-batch``, torchrun) and
LoRA.

The choices of ``--advantage``, ``--loss`` and ``--loss-mode`` are read from the registries
(:data:`rlft.losses.advantages.ADVANTAGES`, :data:`rlft.losses.pg.POLICY_LOSSES`,
:data:`rlft.losses.pg.LOSS_MODES`), so a new estimator or loss is one dict entry there: it becomes a choice of
the flag, of ``--config`` YAML and of programmatic configs, all validated alike (:mod:`rlft.validation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlft.lora import LoRAOptions
from rlft.models import DEFAULT_MODEL
from rlft.options import DistributedOptions, MemoryOptions, OptimizerOptions, RunOptions, SpeedOptions
from rlft.rl.options import (AdvantageName, BucketingName, ChatPromptOptions, CurriculumOptions, GroupFilterOptions,
                             ImportanceOptions, InLoopEvalOptions, ISMode, KLEstimatorName, KLMode, KLOptions, LossMode,
                             PolicyLossName, PolicyLossOptions, ReplayOptions, RewardOptions, SamplingOptions,
                             ShapingOptions)
from rlft.tasks.countdown.options import DEFAULT_NUM_TRAIN, CountdownTrainingOptions
from rlft.validation import check_step_count, require, validate_options

__all__ = ["RLConfig", "RLOO_DEFAULTS", "rloo_config",  # and the choice types of rlft.rl.options, re-exported
           "AdvantageName", "BucketingName", "ISMode", "KLEstimatorName", "KLMode", "LossMode", "PolicyLossName"]


@dataclass(frozen=True)
class RLConfig(RunOptions, OptimizerOptions, LoRAOptions, MemoryOptions, SpeedOptions, DistributedOptions,
               RewardOptions, ChatPromptOptions, InLoopEvalOptions, ShapingOptions, CurriculumOptions,
               GroupFilterOptions, ReplayOptions, ImportanceOptions, KLOptions, PolicyLossOptions, SamplingOptions,
               CountdownTrainingOptions):
    """RL fine-tuning (one loop; advantage estimator and policy loss chosen by name) on Countdown prompts with the
    rule reward, or on chat prompts with a reward model or remote judge."""

    model: str = DEFAULT_MODEL
    """Initial policy: built-in name, local HF folder (e.g. an SFT run's model/), or Hub id."""
    num_train: int = DEFAULT_NUM_TRAIN
    """Training tasks: generated from the TRAIN split of --preset, or the first N training rows of --data."""
    output_dir: str = "runs/rl"
    """Run directory: checkpoints/, model/, metrics.jsonl, config.yaml."""
    max_steps: int = 100
    """Training steps (each: generate, score, update)."""
    lr: float = 1e-5
    """Peak learning rate (AdamW). 1e-5 is the published RLOO Countdown setting for Qwen2.5-0.5B
    (k=8, KL 0.001, ~100 steps); larger rates quickly destabilise a pretrained policy."""
    schedule: Literal["cosine", "linear", "constant"] = "constant"
    """Learning-rate decay after warmup."""
    micro_batch_size: int = 8
    """Sequences per forward/backward pass; gradients accumulate exactly over the step's samples. On a GPU, 8 leaves
    the update launch-bound: raise it, or set --max-tokens-per-micro-batch (many short completions to a pass, few
    long ones)."""
    save_every: int = 25
    """Write a resumable checkpoint every this many steps (0: only the final model)."""
    seed: int = 0
    """Seed of the prompt order and of sampling (step s samples with a seed derived from seed and s)."""

    def __post_init__(self) -> None:
        validate_options(self)  # types, counts >= 1, rates > 0, coefficients >= 0, known presets/templates
        self._check_lora()
        self._check_distributed()
        self._check_countdown()
        self._check_policy_loss()
        self._check_sampling()
        self._check_reward()
        self._check_shaping()
        self._check_curriculum()
        self._check_importance()
        self._check_replay()
        self._check_kl()
        self._check_chat_prompts()
        steps = f"--max-steps {self.max_steps} x --ppo-epochs {self.ppo_epochs}"
        check_step_count(self.max_steps * self.ppo_epochs, steps)  # optimizer steps
        require(
            self.prompts_data is not None or self.data is not None or self.prompts_per_step <= self.num_train,
            f"--prompts-per-step ({self.prompts_per_step}) is more than the {self.num_train} training tasks (--num-train)"
        )
        self._check_in_loop_eval()


RLOO_DEFAULTS: dict[str, object] = {
    "advantage": "rloo", "loss": "reinforce", "loss_mode": "seq_sum", "output_dir": "runs/rloo"
}
"""``rlft rloo``: :class:`RLConfig` with these defaults (REINFORCE with a leave-one-out baseline on the
sequence-level estimator, Ahmadian et al. 2024); ``--config`` values and flags override them."""


def rloo_config(**options) -> RLConfig:
    """An :class:`RLConfig` with :data:`RLOO_DEFAULTS` under ``options`` (what ``rlft rloo`` parses)."""
    return RLConfig(**{**RLOO_DEFAULTS, **options})
