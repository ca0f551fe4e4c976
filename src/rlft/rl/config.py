"""The RL loop's options: :class:`RLConfig` (``rlft rl``, and ``rlft rloo`` with :data:`RLOO_DEFAULTS`).

``RLConfig`` holds its option blocks as fields (``cfg.sampling``, ``cfg.kl``, ``cfg.shaping``, ...; each part of the
loop is given its own block), each block checking its own fields: the Countdown tasks
(:class:`rlft.tasks.countdown.options.CountdownTrainingOptions`, shared with sft, pairs and eval countdown), the
parts of the loop (:mod:`rlft.rl.options`: sampling, policy loss, KL, importance correction, replay, group
filtering, curriculum, shaping, in-loop evaluation, chat prompts, reward) and the shared training blocks of
:mod:`rlft.options` (run folder, optimizer, memory, ``--compile`` and ``--max-tokens-per-micro-batch``, torchrun) and
LoRA. Flags, ``--config`` keys and the saved ``config.yaml`` keep the flat option names (``--k``, ``beta:``), and so
do programmatic configs: ``RLConfig(k=4, beta=0.1)`` puts each keyword in its block and ``cfg.k`` reads
``cfg.sampling.k`` (:mod:`rlft.composed`).

The choices of ``--advantage``, ``--loss`` and ``--loss-mode`` are read from the registries
(:data:`rlft.losses.advantages.ADVANTAGES`, :data:`rlft.losses.pg.POLICY_LOSSES`,
:data:`rlft.losses.pg.LOSS_MODES`), so a new estimator or loss is one dict entry there: it becomes a choice of
the flag, of ``--config`` YAML and of programmatic configs, all validated alike (:mod:`rlft.validation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from tyro.conf import arg

from rlft.composed import composed
from rlft.lora import LoRAOptions
from rlft.models import DEFAULT_MODEL
from rlft.options import DistributedOptions, EnvOptions, MemoryOptions, OptimizerOptions, RunOptions, SpeedOptions
from rlft.rl.hints import HintOptions
from rlft.rl.options import (AdvantageName, BucketingName, ChatPromptOptions, CurriculumOptions, GroupFilterOptions,
                             ImportanceOptions, InLoopEvalOptions, ISMode, KLEstimatorName, KLMode, KLOptions, LossMode,
                             PolicyLossName, PolicyLossOptions, ReplayOptions, RewardOptions, SamplingOptions,
                             ShapingOptions)
from rlft.tasks.countdown.options import DEFAULT_NUM_TRAIN, CountdownTrainingOptions
from rlft.validation import NON_NEGATIVE, POSITIVE, POSITIVE_INT, check_step_count, require, validate_options

__all__ = ["RLConfig", "RLOO_DEFAULTS", "rloo_config", "RLOptimizerOptions", "RLRunOptions",
           # and the choice types of rlft.rl.options, re-exported
           "AdvantageName", "BucketingName", "ISMode", "KLEstimatorName", "KLMode", "LossMode", "PolicyLossName"]


@dataclass(frozen=True)
class RLOptimizerOptions(OptimizerOptions):
    """The optimizer (AdamW by default) at RL's learning rate, without decay by default."""

    lr: Annotated[float, POSITIVE] = 1e-5
    """Peak learning rate (AdamW). 1e-5 is the published RLOO Countdown setting for Qwen2.5-0.5B
    (k=8, KL 0.001, ~100 steps); larger rates quickly destabilise a pretrained policy."""
    schedule: Literal["cosine", "linear", "constant"] = "constant"
    """Learning-rate decay after warmup."""


@dataclass(frozen=True)
class RLRunOptions(RunOptions):
    """The run: its policy, training tasks, folder, length, micro-batches and seed (and checkpoints, resuming,
    device)."""

    save_every: Annotated[int, NON_NEGATIVE] = 25
    """Write a resumable checkpoint every this many steps and after the last one, which --resume with a longer
    --max-steps continues (0: only the final model)."""
    model: str = DEFAULT_MODEL
    """Initial policy: built-in name, local HF folder (e.g. an SFT run's model/), or Hub id."""
    num_train: Annotated[int, POSITIVE_INT] = DEFAULT_NUM_TRAIN
    """Training tasks: generated from the TRAIN split of --preset, or the first N training rows of --data."""
    output_dir: str = "runs/rl"
    """Run directory: checkpoints/, model/, metrics.jsonl, config.yaml."""
    max_steps: Annotated[int, POSITIVE_INT] = 100
    """Training steps (each: generate, score, update)."""
    micro_batch_size: Annotated[int, POSITIVE_INT] = 8
    """Sequences per forward/backward pass; gradients accumulate exactly over the step's samples. On a GPU, 8 leaves
    the update launch-bound: raise it, or set --max-tokens-per-micro-batch (many short completions to a pass, few
    long ones)."""
    seed: int = 0
    """Seed of the prompt order and of sampling (step s samples with a seed derived from seed and s)."""
    time_limit: Annotated[float | None, POSITIVE] = None
    """Minutes of the training loop (from its first step; the start-up not counted) after which the run stops at the
    end of the step that passes them: a checkpoint is written and the model saved, so --resume (with the same or
    another limit) continues it. None: no limit. The learning-rate and hint schedules still count --max-steps."""
    max_flops: Annotated[float | None, POSITIVE] = None
    """Stop at the end of the step whose cumulative estimated FLOPs (``flops/estimated``, rlft.compute.RunTotals;
    the resumed part counted) reach this, as --time-limit stops (checkpoint, model): a run given another's compute.
    None: --max-steps alone."""


FLAT = arg(name="")
"""tyro's marker of a block field: its options are flags without a prefix (``--k``, not ``--sampling.k``), listed
with the others in one ``--help`` box."""


def _block(cls: type):
    """A block field holding the block's defaults."""
    return field(default_factory=cls)


@composed
@dataclass(frozen=True)
class RLConfig:
    """RL fine-tuning (one loop; advantage estimator and policy loss chosen by name) on Countdown prompts with the
    rule reward, or on chat prompts with a reward model or remote judge."""

    tasks: Annotated[CountdownTrainingOptions, FLAT] = _block(CountdownTrainingOptions)
    """The Countdown tasks."""
    sampling: Annotated[SamplingOptions, FLAT] = _block(SamplingOptions)
    """Steps 1-2: the samples (rlft.rl.sampling)."""
    policy: Annotated[PolicyLossOptions, FLAT] = _block(PolicyLossOptions)
    """The advantage estimator and the policy loss (rlft.losses)."""
    kl: Annotated[KLOptions, FLAT] = _block(KLOptions)
    """The KL penalty to the reference policy."""
    importance: Annotated[ImportanceOptions, FLAT] = _block(ImportanceOptions)
    """The sampler-mismatch correction."""
    replay: Annotated[ReplayOptions, FLAT] = _block(ReplayOptions)
    """Off-policy reuse of groups (rlft.rl.replay)."""
    groups: Annotated[GroupFilterOptions, FLAT] = _block(GroupFilterOptions)
    """Group filtering (rlft.rl.groups)."""
    order: Annotated[CurriculumOptions, FLAT] = _block(CurriculumOptions)
    """The prompt order (rlft.rl.curriculum)."""
    shaping: Annotated[ShapingOptions, FLAT] = _block(ShapingOptions)
    """Reward shaping and loss masking of cut or repeating samples (rlft.rl.shaping)."""
    evaluation: Annotated[InLoopEvalOptions, FLAT] = _block(InLoopEvalOptions)
    """The in-loop evaluation (rlft.rl.evaluation)."""
    chat: Annotated[ChatPromptOptions, FLAT] = _block(ChatPromptOptions)
    """The chat track's prompts."""
    scoring: Annotated[RewardOptions, FLAT] = _block(RewardOptions)
    """The reward (rlft.rl.rewards)."""
    parallel: Annotated[DistributedOptions, FLAT] = _block(DistributedOptions)
    """The strategy under torchrun."""
    speed: Annotated[SpeedOptions, FLAT] = _block(SpeedOptions)
    """--compile, token-budget micro-batches."""
    memory: Annotated[MemoryOptions, FLAT] = _block(MemoryOptions)
    """Memory and the tracker."""
    lora: Annotated[LoRAOptions, FLAT] = _block(LoRAOptions)
    """LoRA adapters."""
    optim: Annotated[RLOptimizerOptions, FLAT] = _block(RLOptimizerOptions)
    """The optimizer."""
    run: Annotated[RLRunOptions, FLAT] = _block(RLRunOptions)
    """The run folder, its length, the device."""
    environment: Annotated[EnvOptions, FLAT] = _block(EnvOptions)
    """The environment (--env) and the bounds of rollouts with tool calls."""
    hints: Annotated[HintOptions, FLAT] = _block(HintOptions)
    """Solver-guided rollouts (rlft.rl.hints)."""

    def __post_init__(self) -> None:
        validate_options(self)  # types, ranges declared on the fields, known presets/templates
        self.lora._check_lora()
        DistributedOptions._check_distributed(self)  # reads --lora-r too
        self.tasks._check_countdown()
        self.policy._check_policy_loss(self.sampling.k)
        self.sampling._check_sampling()
        self.scoring._check_reward(self.chat.prompts_data)
        self.shaping._check_shaping(self.sampling, self.scoring)
        self.order._check_curriculum(self.chat.prompts_data)
        self.importance._check_importance()
        self.replay._check_replay(self.sampling.prompts_per_step, self.policy.loss, self.importance.is_correction)
        self.kl._check_kl()
        self.chat._check_chat_prompts()
        self.environment._check_env(self.chat.prompts_data, self.sampling.rollout_engine)
        self.hints._check_hint(self.environment.env, self.chat.prompts_data, self.replay.replay_size)
        run, epochs = self.run, self.policy.ppo_epochs
        check_step_count(run.max_steps * epochs, f"--max-steps {run.max_steps} x --ppo-epochs {epochs}")  # optimizer
        per_step, num_train = self.sampling.prompts_per_step, self.run.num_train
        require(self.chat.prompts_data is not None or self.tasks.data is not None or per_step <= num_train,
                f"--prompts-per-step ({per_step}) is more than the {num_train} training tasks (--num-train)")
        self.evaluation._check_in_loop_eval(self.chat.prompts_data, self.tasks)


RLOO_DEFAULTS: dict[str, object] = {
    "advantage": "rloo", "loss": "reinforce", "loss_mode": "seq_sum", "output_dir": "runs/rloo"
}
"""``rlft rloo``: :class:`RLConfig` with these defaults (REINFORCE with a leave-one-out baseline on the
sequence-level estimator, Ahmadian et al. 2024); ``--config`` values and flags override them."""


def rloo_config(**options) -> RLConfig:
    """An :class:`RLConfig` with :data:`RLOO_DEFAULTS` under ``options`` (what ``rlft rloo`` parses)."""
    return RLConfig(**{**RLOO_DEFAULTS, **options})
