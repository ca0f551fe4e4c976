"""The option blocks of ``rlft rl`` / ``rlft rloo`` (:class:`rlft.rl.config.RLConfig` is their sum), one per part of
the loop, each with its own checks (``_check_*``, called from ``RLConfig.__post_init__``):

- :class:`SamplingOptions`: ``--k``, ``--prompts-per-step``, ``--temperature``, ``--top-p``, ``--max-new-tokens``,
  ``--rollout-engine``, ``--gen-batch-size`` (steps 1-2, :mod:`rlft.rl.sampling`);
- :class:`PolicyLossOptions`: ``--advantage``, ``--loss``, ``--loss-mode``, ``--ppo-epochs``, ``--clip-low``,
  ``--clip-high``, ``--entropy-coef``, ``--raft-threshold`` (:func:`rlft.losses.pg.make_objective`);
- :class:`KLOptions`: ``--ref-model``, ``--beta``, ``--kl-mode``, ``--kl-estimator``;
- :class:`ImportanceOptions`: ``--is-correction``, ``--is-cap`` (the sampler mismatch);
- :class:`ReplayOptions`: ``--replay-size``, ``--max-staleness`` (off-policy reuse of groups, :mod:`rlft.rl.replay`);
- :class:`GroupFilterOptions`: ``--filter-groups``, ``--max-prompt-batches`` (:mod:`rlft.rl.groups`);
- :class:`CurriculumOptions`: ``--curriculum``, ``--curriculum-buckets``, ``--curriculum-tau``,
  ``--curriculum-alpha`` (:mod:`rlft.rl.curriculum`);
- :class:`ShapingOptions`: ``--truncation-penalty``, ``--mask-truncated``, ``--overlong-buffer``,
  ``--overlong-penalty``, ``--repetition-limit``, ``--repetition-penalty`` (:mod:`rlft.rl.shaping`);
- :class:`InLoopEvalOptions`: ``--eval-every``, ``--eval-at-start``, ``--eval-limit``, ``--eval-max-new-tokens``,
  ``--eval-rows``;
- :class:`ChatPromptOptions`: ``--prompts-data`` and the chat track's prompt options;
- :class:`RewardOptions`: ``--reward``, ``--reward-model`` and the remote judge's options (:mod:`rlft.rl.rewards`).

Each numeric option declares its range on its field (``k: Annotated[int, POSITIVE_INT]``,
:class:`rlft.validation.Range`), checked with the types when the config is built. An option that does nothing in the
chosen setup is refused when it is set, i.e. differs from its default (as
``rlft eval countdown`` refuses ``--select-n`` without ``--select``): ``--clip-low``/``--clip-high`` with a loss that
does not clip, ``--is-cap`` without ``--is-correction``, ``--max-staleness`` without ``--replay-size``, the
``--curriculum-*`` values without ``--curriculum sec``, ``--overlong-penalty`` without ``--overlong-buffer``,
``--repetition-penalty`` without ``--repetition-limit``, ``--raft-threshold`` without ``--advantage raft``,
``--ref-model``, ``--kl-mode`` or ``--kl-estimator`` with ``--beta 0``, the chat track's prompt options without
``--prompts-data``, the remote judge's without ``--reward remote``, ``--eval-rows`` without ``--data``. So is a value
that cannot act: a ``--repetition-limit`` above ``--stop-repeats`` (the sampler stops a sample at its
``--stop-repeats``-th identical line, so none writes a line more often), a ``--replay-size`` above what the buffer
holds (``--max-staleness`` x ``--prompts-per-step`` groups). Each refusal names the option that makes the other dead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from rlft.losses.advantages import ADVANTAGES
from rlft.losses.pg import IS_MODES, KL_ESTIMATORS, KL_PLACEMENTS, LOSS_MODES, POLICY_LOSSES
from rlft.options import MAX_NEW_TOKENS
from rlft.rl.curriculum import BUCKETINGS
from rlft.tasks.countdown.options import CountdownTrainingOptions
from rlft.validation import AT_LEAST_2, NON_NEGATIVE, POSITIVE, POSITIVE_INT, Range, require

AdvantageName = Literal[tuple(ADVANTAGES)]  # type: ignore[valid-type]
"""Names of the advantage estimators: the keys of :data:`rlft.losses.advantages.ADVANTAGES`."""
PolicyLossName = Literal[tuple(POLICY_LOSSES)]  # type: ignore[valid-type]
"""Names of the policy losses: the keys of :data:`rlft.losses.pg.POLICY_LOSSES`."""
LossMode = Literal[LOSS_MODES]  # type: ignore[valid-type]
"""Aggregations of the per-token policy loss: :data:`rlft.losses.pg.LOSS_MODES`."""
ISMode = Literal[IS_MODES]  # type: ignore[valid-type]
"""Sampler-mismatch corrections: :data:`rlft.losses.pg.IS_MODES`."""
KLMode = Literal[KL_PLACEMENTS]  # type: ignore[valid-type]
"""Where the KL goes: :data:`rlft.losses.pg.KL_PLACEMENTS`."""
KLEstimatorName = Literal[KL_ESTIMATORS]  # type: ignore[valid-type]
"""Per-token KL estimators: :data:`rlft.losses.pg.KL_ESTIMATORS`."""
BucketingName = Literal[tuple(BUCKETINGS)]  # type: ignore[valid-type]
"""Ways to bucket prompts for the curriculum: the keys of :data:`rlft.rl.curriculum.BUCKETINGS`."""


def _default(cls: type, name: str):
    """The default of field ``name`` of the block ``cls`` (what "not set" means for an option that may do nothing)."""
    return cls.__dataclass_fields__[name].default


@dataclass(frozen=True)
class SamplingOptions:
    """How each step's samples are drawn: k per prompt, at what temperature, by which engine."""

    k: Annotated[int, POSITIVE_INT] = 4
    """Samples per prompt (>= 2: each sample's baseline is the mean reward of the other k-1)."""
    prompts_per_step: Annotated[int, POSITIVE_INT] = 8
    """Prompts per step; a step trains on prompts_per_step * k samples."""
    temperature: Annotated[float, NON_NEGATIVE] = 1.0
    """Sampling temperature (> 0); policy and reference log-probs are computed at this temperature too."""
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Nucleus sampling mass (1.0: off). Log-probs ignore the truncation, so keep 1.0 for exact on-policy maths."""
    max_new_tokens: Annotated[int, POSITIVE_INT] = MAX_NEW_TOKENS
    """Most tokens per sampled completion (EOS included)."""
    stop_repeats: Annotated[int | None, AT_LEAST_2] = 5
    """Loop-aware stopping: a sample that has written an identical non-empty line this many times stops there
    (rlft.rollout.loops; the hf engine stops it there, vllm cuts the whole sample there), counted as cut at the budget
    (no EOS: the truncation penalty and
    --mask-truncated treat it so) and logged as completion/looped_frac. 5 by default: on an RL model's 500 validation
    answers it changed no score (3 lost 15; docs/results/speed/loop_stop.md). None: off."""
    rollout_engine: Literal["hf", "vllm"] = "hf"
    """Sampler: 'hf' (transformers generate on the training model itself) or 'vllm' (colocated vLLM, pip install
    'rlft[vllm]', CUDA: the training model's weights, LoRA merged, are pushed into it before every rollout)."""
    gen_batch_size: Annotated[int, POSITIVE_INT] = 64
    """Sequences generated together by the sampler: 64 holds a default step's 8 prompts x k=8 at once (at 32 half of
    them queued; on a 2-core CPU the hf engine's refill decoder sampled 1.38x as many tokens/s at 64 rows as at 32,
    docs/results/speed/rollout_cpu.md). Extra (prompt, sample) jobs queue and take a finished row's place."""

    def _check_sampling(self) -> None:
        require(
            self.temperature > 0,
            f"--temperature must be > 0 (RL samples; log-probs at temperature 0 are undefined), got {self.temperature}")


@dataclass(frozen=True)
class PolicyLossOptions:
    """The advantage estimator and the policy loss around it (clip range, entropy bonus, RAFT's selection)."""

    advantage: AdvantageName = "grpo"
    """Advantage estimator (rlft.losses.advantages.ADVANTAGES): 'rloo' (leave-one-out baseline), 'grpo' ((r - group
    mean) / group std), 'lite_ppo' (group mean, batch std), 'dr_grpo' (r - group mean, no std), 'raft' (1 for each
    group's best samples, or those >= --raft-threshold, else 0), 'reinforce' (the raw reward)."""
    loss: PolicyLossName = "reinforce"
    """Policy loss (rlft.losses.pg.POLICY_LOSSES): 'reinforce' (-A * ratio; REINFORCE at ratio 1), 'ppo' (clipped to
    [1 - clip_low, 1 + clip_high]), 'raft' (likelihood of the samples with A > 0), 'raft++' (raft with the ratio
    clipped like ppo), 'topr' (Tapered Off-Policy REINFORCE: no ratio on samples with A >= 0, the sequence ratio to
    the behaviour policy truncated to [0, 1] on A < 0; for stale samples, --replay-size). RAFT = --advantage raft
    --loss raft; RAFT++ = --advantage raft --loss raft++."""
    loss_mode: LossMode = "seq_sum"
    """Aggregation: 'seq_sum' sums each sequence's token losses and averages over sequences (RLOO's
    sequence-level estimator; Dr. GRPO's no-length-normalisation); 'seq_mean' averages tokens within each
    sequence, then over sequences (GRPO); 'token_mean' averages over all completion tokens of the step (DAPO)."""
    ppo_epochs: Annotated[int, POSITIVE_INT] = 1
    """Optimizer steps per batch of samples: 1 = one on-policy update (the ratio is 1, clipping inactive);
    > 1 = further updates on the same samples against the pre-update log-probs (clipped with ppo / raft++)."""
    clip_low: Annotated[float, NON_NEGATIVE] = 0.2
    """Lower clipping range: the ratio is clipped at 1 - clip_low (ppo and raft++ only)."""
    clip_high: Annotated[float | None, NON_NEGATIVE] = None
    """Upper clipping range: 1 + clip_high (None: clip_low). DAPO's clip-higher uses 0.28 with clip_low 0.2."""
    entropy_coef: Annotated[float, NON_NEGATIVE] = 0.0
    """Entropy bonus: the loss gets -entropy_coef * aggregate(per-token entropy) (0: off). Computed from the full
    next-token distribution at the sampling temperature."""
    raft_threshold: float | None = None
    """--advantage raft: select samples with reward >= this (Countdown: 1.0, correct); None: each group's best
    samples (none when the group's rewards are all equal)."""
    positive_weight: float = 1.0
    """W-REINFORCE (Zhu et al. 2025, arXiv 2506.01347): the loss weight of every sample with a positive advantage is
    multiplied by this (the paper: 0.1), negative ones keep theirs (rlft.losses.wreinforce). 1: off; 0:
    negative samples only (the paper's NSR)."""

    def _check_policy_loss(self, k: int) -> None:
        """``k`` (``--k``) large enough for the estimator; a clip range only for a loss that clips, and inside (0, 1)
        below."""
        require(
            k >= 2 or self.advantage in ("reinforce", ) or
            (self.advantage == "raft" and self.raft_threshold is not None),
            f"--advantage {self.advantage} needs --k >= 2 samples per prompt (a group baseline or a best sample), "
            f"got {k}")
        require(0 < self.clip_low < 1,
                f"--clip-low must lie in (0, 1): the ratio is clipped below at 1 - clip_low, got {self.clip_low}")
        clipping = [
            name for name in ("clip_low", "clip_high") if getattr(self, name) != _default(PolicyLossOptions, name)
        ]
        require(POLICY_LOSSES[self.loss].clips or not clipping,
                f"--{clipping[0].replace('_', '-') if clipping else ''} is only read by a loss that clips "
                f"({', '.join(n for n, s in POLICY_LOSSES.items() if s.clips)}); --loss {self.loss} does not")
        require(self.raft_threshold is None or self.advantage == "raft",
                f"--raft-threshold is only read by --advantage raft; --advantage {self.advantage} selects no samples")


@dataclass(frozen=True)
class KLOptions:
    """The KL penalty to the reference policy: its coefficient, placement and estimator."""

    ref_model: str | None = None
    """Reference model of the KL penalty; None: the same as --model (loaded fresh, never from a checkpoint)."""
    beta: Annotated[float, NON_NEGATIVE] = 0.001
    """KL coefficient (0: no KL and no reference model in memory)."""
    kl_mode: KLMode = "reward"
    """Where the KL goes: 'reward' subtracts beta * sum_t kl_t from each sample's reward before the
    advantages (the RLOO paper); 'loss' adds beta * aggregate(kl_t) to the loss (OpenRLHF/verl)."""
    kl_estimator: KLEstimatorName = "k1"
    """Per-token KL estimator: k1 = logp - ref_logp (the paper's log-ratio), k3 = exp(ref-logp) - (ref-logp) - 1
    (>= 0, lower variance). Use k3 with --kl-mode loss: k1's expected gradient as a loss is zero."""

    def _check_kl(self) -> None:
        """``--beta 0`` loads no reference model and computes no KL: the options of the KL are then refused when set."""
        names = ("ref_model", "kl_mode", "kl_estimator")
        set_ = [name for name in names if getattr(self, name) != _default(KLOptions, name)]
        require(self.beta > 0 or not set_, f"--{set_[0].replace('_', '-') if set_ else ''} is only read with "
                "--beta > 0: --beta 0 loads no reference model and computes no KL")


@dataclass(frozen=True)
class ImportanceOptions:
    """The sampler-mismatch correction (:mod:`rlft.losses.importance`)."""

    is_correction: ISMode = "none"
    """Sampler-mismatch correction when the sampler differs from the trained policy (another engine, or bfloat16
    sampling weights for a float32 policy): 'token_truncate' / 'sequence_truncate' weight each token's loss by
    min(ratio, --is-cap) (truncated importance sampling), 'token_mask' / 'sequence_mask' drop tokens / sequences
    whose ratio exceeds it (TRL's vllm_importance_sampling_mode); ratio = exp(trainer - sampler log-prob), per
    token or its product over the sequence. Needs sampler log-probs (the HF engine's row-dropping decoder, vLLM).
    'none' (default): off; the mismatch is still logged (mismatch/abs_logp_mean, mismatch/abs_logp_p99)."""
    is_cap: Annotated[float, POSITIVE] = 3.0
    """The cap C of --is-correction."""

    def _check_importance(self) -> None:
        require(self.is_cap >= 1,
                f"--is-cap must be >= 1 (a ratio of 1, no mismatch, is never capped), got {self.is_cap}")
        require(
            self.is_correction != "none" or self.is_cap == _default(ImportanceOptions, "is_cap"),
            "--is-cap is only read with --is-correction (token_truncate, token_mask, sequence_truncate, sequence_mask)")


@dataclass(frozen=True)
class ReplayOptions:
    """Off-policy reuse of sampled groups across steps (:class:`rlft.rl.replay.ReplayBuffer`)."""

    replay_size: Annotated[int, NON_NEGATIVE] = 0
    """Replayed groups per step (0: off). Each step trains on its fresh groups plus up to this many groups drawn
    (seeded, uniformly, without replacement) from the kept groups of the last --max-staleness steps, which the replay
    buffer holds (at most --max-staleness x --prompts-per-step groups). A group keeps its samples, their behaviour
    log-probs and its raw rewards; its shaping, KL and advantages are recomputed, and --filter-groups and the
    zero-advantage rule apply as for fresh groups. Behaviour policy (the ratio's denominator, for fresh and replayed
    rows alike, from the first epoch on): the sampler's own log-probs when the engine reports them (the HF engine's
    row-dropping decoders), so the ratio is exact, the sampler's precision mismatch included (its size is logged as
    mismatch/abs_logp_*); else the trainer's log-probs before the update of the step that sampled them (one more
    no-grad pass; the ratio then leaves the precision part out). Reuse factor R: --replay-size (R-1)x--prompts-per-step
    --max-staleness R-1. Needs --loss topr or a loss that clips; one process only."""
    max_staleness: Annotated[int, POSITIVE_INT] = 1
    """Oldest a replayed group may be, in steps (>= 1): generated at step s, it can be drawn at steps s+1 to
    s+max_staleness and is dropped after. Only read with --replay-size."""

    def _check_replay(self, prompts_per_step: int, loss: str, is_correction: str) -> None:
        """Against ``--prompts-per-step``, ``--loss`` and ``--is-correction``."""
        require(self.replay_size >= 0, f"--replay-size must be >= 0 (0: off), got {self.replay_size}")
        require(self.max_staleness >= 1,
                f"--max-staleness must be >= 1 (a replayed group is at least one step old), got {self.max_staleness}")
        require(self.replay_size > 0 or self.max_staleness == _default(ReplayOptions, "max_staleness"),
                "--max-staleness is only read with --replay-size (the groups kept for replay)")
        staleness, per_step = self.max_staleness, prompts_per_step  # the buffer holds staleness x per_step groups
        require(self.replay_size <= staleness * per_step, f"--replay-size {self.replay_size} can never be drawn: the "
                f"buffer holds at most {staleness * per_step} groups (--max-staleness {staleness} x --prompts-per-step "
                f"{per_step})")
        spec = POLICY_LOSSES[loss]
        require(
            self.replay_size == 0 or spec.clips or spec.behaviour,
            f"--replay-size trains on stale samples, whose importance ratio is unbounded under --loss {loss}: use "
            f"--loss topr or a loss that clips ({', '.join(n for n, s in POLICY_LOSSES.items() if s.clips)})")
        require(
            is_correction == "none" or (self.replay_size == 0 and not spec.behaviour),
            f"--is-correction with {'--replay-size' if self.replay_size else '--loss ' + loss}: the ratio already "
            "divides by the sampler's log-probs (the behaviour policy)")


@dataclass(frozen=True)
class GroupFilterOptions:
    """Dynamic sampling: groups with no signal dropped and the step refilled (:mod:`rlft.rl.groups`)."""

    filter_groups: bool = False
    """Drop groups whose k rewards are all equal (no signal) and refill the step from further prompts
    (Reinforce-Rej / DAPO dynamic sampling), up to --max-prompt-batches batches of prompts per step."""
    max_prompt_batches: Annotated[int, POSITIVE_INT] = 4
    """With --filter-groups: at most this many batches of prompts_per_step prompts are sampled per step; the step
    trains on the varied groups found (at most prompts_per_step)."""


@dataclass(frozen=True)
class CurriculumOptions:
    """The prompt order: a seeded permutation, or the SEC bandit over difficulty buckets."""

    curriculum: Literal["none", "sec", "pass-rate"] = "none"
    """Prompt order: 'none' (a seeded permutation of the training prompts per epoch), 'pass-rate' (prompts the
    model half-solves: buckets drawn by prompts x 1 - p^k - (1-p)^k, p the pass rate the step's groups measured;
    logs the FLOPs saved, rlft.rl.pass_rate) or 'sec' (Self-Evolving
    Curriculum, Chen et al. 2025, arXiv 2505.14970: prompts bucketed by --curriculum-buckets, buckets drawn from
    softmax(Q / --curriculum-tau), each bucket's Q an exponential average (step --curriculum-alpha) of the mean
    |advantage| of its groups; within a bucket prompts come in a seeded order without replacement; logs
    curriculum/p_<bucket>, curriculum/q_<bucket>, curriculum/n_<bucket>). With --filter-groups every prompt batch
    of a step is drawn from the bandit, and a dropped group counts as |advantage| 0."""
    curriculum_buckets: BucketingName = "count_target"
    """--curriculum sec or pass-rate: the buckets. 'count_target': Countdown tasks by (number count, target band
    10-39 / 40-69 / 70-100); 'count_rank': by (number count, dead ends the solver's patient search writes before
    the solution: 0 / 1-2 / 3-6 / 7+); chat prompts cannot be bucketed."""
    curriculum_tau: float = 1.0
    """--curriculum sec: softmax temperature over the buckets' values (SEC's Countdown runs: 1.0; its math runs 0.4)."""
    curriculum_alpha: float = 0.5
    """--curriculum sec or pass-rate: step size of the bucket values' update, Q <- alpha * r + (1 - alpha) * Q (SEC:
    0.5; pass-rate: r the mean pass rate of the bucket's groups)."""

    def _check_curriculum(self, prompts_data: str | None) -> None:
        """``prompts_data``: ``--prompts-data`` (chat prompts have no difficulty)."""
        require(self.curriculum_tau > 0, f"--curriculum-tau must be > 0, got {self.curriculum_tau}")
        require(0 < self.curriculum_alpha <= 1, f"--curriculum-alpha must lie in (0, 1], got {self.curriculum_alpha}")
        read_by = {"curriculum_buckets": ("sec", "pass-rate"), "curriculum_tau": ("sec",),
                   "curriculum_alpha": ("sec", "pass-rate")}
        for name, curricula in read_by.items():
            require(self.curriculum in curricula or getattr(self, name) == _default(CurriculumOptions, name),
                    f"--{name.replace('_', '-')} is only read with --curriculum {' or '.join(curricula)}")
        require(self.curriculum == "none" or prompts_data is None,
                f"--curriculum {self.curriculum} buckets Countdown tasks by difficulty; chat prompts (--prompts-data) "
                "have none")


@dataclass(frozen=True)
class ShapingOptions:
    """Rewards and losses of samples cut at max_new_tokens or writing one line again and again
    (:mod:`rlft.rl.shaping`)."""

    truncation_penalty: float | None = None
    """Added to the raw reward of samples that hit max_new_tokens without EOS (e.g. -0.5), before the KL and the
    leave-one-out baseline; None: off. There is no separate EOS penalty. Discourages rambling (with a reward model:
    replies cut mid-sentence), but also punishes long correct reasoning cut by a small max_new_tokens."""
    mask_truncated: bool = False
    """Leave the samples that hit max_new_tokens without EOS out of the policy loss (TRL's
    mask_truncated_completions): their rewards still count in the reward metrics and in their group's advantage
    baseline (advantages are computed over the whole group first), then their loss mask is zeroed; the loss's
    normalisers count the other samples only (sequences and tokens), so the update is the one without them."""
    overlong_buffer: Annotated[int | None, NON_NEGATIVE] = None
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), L_cache tokens: a completion longer than
    max_new_tokens - L_cache gets ((max_new_tokens - L_cache) - length) / L_cache * --overlong-penalty added to its
    raw reward (down to -penalty at max_new_tokens), before the KL and the advantages; logged as
    reward/overlong_penalty_mean. None or 0: off."""
    overlong_penalty: float = 1.0
    """Scale of the overlong punishment (--overlong-buffer): the reward added at max_new_tokens tokens is -this."""
    repetition_limit: Annotated[int | None, AT_LEAST_2] = None
    """Repetition-aware reward, N: a completion that writes one identical line N or more times (lines stripped; blank
    lines never count; its last line counts too, rlft.rollout.loops) scores as no answer (its raw reward replaced by
    0, the Countdown score of no answer) or, with --repetition-penalty, gets that added to its raw reward; before the
    truncation and overlong penalties, the KL and the advantages. Logged as reward/repetition_frac (the share of
    trained samples that repeat) and reward/repetition_penalty_mean. N >= 2; None: off."""
    repetition_penalty: float | None = None
    """With --repetition-limit: added to the raw reward of a completion that repeats a line (<= 0, e.g. -0.5); None:
    such a completion scores as no answer (raw reward replaced by 0; a rule reward only)."""

    def _check_shaping(self, sampling: SamplingOptions, reward: RewardOptions) -> None:
        """Against the sampling (``--max-new-tokens``, ``--stop-repeats``) and the reward (a rule's score of no
        answer)."""
        require(not self.overlong_buffer or self.overlong_buffer <= sampling.max_new_tokens,
                f"--overlong-buffer ({self.overlong_buffer}) must be <= --max-new-tokens ({sampling.max_new_tokens})")
        require(self.overlong_penalty >= 0,
                f"--overlong-penalty must be >= 0 (it is subtracted), got {self.overlong_penalty}")
        require(bool(self.overlong_buffer) or self.overlong_penalty == _default(ShapingOptions, "overlong_penalty"),
                "--overlong-penalty is only read with --overlong-buffer (the last N of --max-new-tokens it ramps over)")
        require(self.repetition_limit is None or self.repetition_limit >= 2,
                f"--repetition-limit must be >= 2 (the times one line is written), got {self.repetition_limit}")
        require(self.repetition_penalty is None or self.repetition_limit is not None,
                "--repetition-penalty is only read with --repetition-limit (how many times a line must repeat)")
        limit, stop = self.repetition_limit, sampling.stop_repeats
        require(limit is None or stop is None or limit <= stop,
                f"--repetition-limit {limit} can never act: --stop-repeats {stop} stops a sample at its {stop}th "
                f"identical line; pass --repetition-limit <= {stop}, or --stop-repeats None (off) or larger")
        require(self.repetition_penalty is None or self.repetition_penalty <= 0,
                f"--repetition-penalty must be <= 0 (it is added to the reward), got {self.repetition_penalty}")
        require(self.repetition_limit is None or self.repetition_penalty is not None
                or (reward.reward_model is None and reward.reward != "remote"),
                "--repetition-limit without --repetition-penalty scores a repeating reply as no answer (0), a rule "
                "reward's score; a reward model or judge has no such score: set --repetition-penalty")


@dataclass(frozen=True)
class InLoopEvalOptions:
    """The greedy evaluation on held-out tasks during the run."""

    eval_every: Annotated[int, NON_NEGATIVE] = 0
    """Greedy evaluation on held-out Countdown tasks every N steps (and at step 0 and the end); 0: off."""
    eval_at_start: bool = True
    """Evaluate at step 0 too (off: skip it when the start model's score is already known, e.g. an ablation from one
    SFT model)."""
    eval_limit: Annotated[int, POSITIVE_INT] = 50
    """Held-out tasks per evaluation (at most heldout_size)."""
    eval_max_new_tokens: Annotated[int, POSITIVE_INT] = MAX_NEW_TOKENS
    """Most tokens per evaluation completion (the reference evaluates with >= 1024); chat track too."""
    eval_rows: Literal["validation", "test"] = "validation"
    """With --data: the held-out rows the in-loop evaluation scores (the first --eval-limit of them): 'validation'
    (screening recipes) or 'test' (the spec's held-out score)."""

    def _check_in_loop_eval(self, prompts_data: str | None, tasks: CountdownTrainingOptions) -> None:
        """Against ``--prompts-data`` and the Countdown tasks (``--data``, ``--heldout-size``)."""
        heldout = tasks.heldout_size
        require(
            not (self.eval_every and prompts_data is None and tasks.data is None and self.eval_limit > heldout),
            f"--eval-limit ({self.eval_limit}) must be <= --heldout-size ({heldout}) so evaluation tasks are never "
            "trained on")
        require(self.eval_rows == _default(InLoopEvalOptions, "eval_rows") or tasks.data is not None,
                f"--eval-rows {self.eval_rows} is only read with --data (a Countdown dataset's held-out rows)")


@dataclass(frozen=True)
class ChatPromptOptions:
    """The chat track's prompts: a preference or chat dataset instead of Countdown tasks."""

    prompts_data: str | None = None
    """Chat track: a preference or chat dataset (.jsonl/.json/.parquet file or Hub id, e.g.
    HuggingFaceH4/ultrafeedback_binarized or the flattened UltraFeedback file) whose prompts, the conversation
    before each row's final assistant turn (duplicates removed), are the RL prompts, rendered with the chat
    template. When set, the Countdown fields (data, data_split, preset, num_train, split_seed, heldout_size,
    prompt_template, eval_limit) are ignored and Countdown evaluation is off; needs --reward-model or
    --reward remote (or a toy rule reward such as uppercase_start)."""
    prompts_split: str = "train_prefs"
    """Split of --prompts-data when it is a Hub id (H4 UltraFeedback: train_prefs or train_gen)."""
    prompts_limit: Annotated[int | None, POSITIVE_INT] = None
    """Read at most the first N rows of --prompts-data (None: all); eval prompts held out from the tail come from
    these."""
    max_prompt_tokens: Annotated[int | None, POSITIVE_INT] = 512
    """Chat prompts longer than this many tokens (rendered) are dropped, counted in the log; None: keep all."""
    chat_template: str | None = None
    """Chat template of the policy: a name (chatml, llama3) or a .jinja path; None: the tokenizer's own (required on
    the chat track). Saved with the model. The reward model keeps the template of its own folder."""
    eval_split: str | None = None
    """Chat track: split of --prompts-data (Hub id) holding the eval prompts, e.g. test_prefs or test_gen. None: the
    last eval_prompts prompts read from --prompts-data (after the max_prompt_tokens filter) are held out from training.
    Either way training prompts
    equal to an eval prompt are dropped."""
    eval_prompts: Annotated[int, NON_NEGATIVE] = 50
    """Chat track: held-out prompts of each evaluation (mean reward of greedy responses, eval/reward; every
    eval_every steps, at step 0 and at the end; 0: off)."""

    def _check_chat_prompts(self) -> None:
        names = ("prompts_split", "prompts_limit", "max_prompt_tokens", "eval_split", "eval_prompts")
        set_ = [name for name in names if getattr(self, name) != _default(ChatPromptOptions, name)]
        require(self.prompts_data is not None or not set_,
                f"--{set_[0].replace('_', '-') if set_ else ''} is only read with --prompts-data (chat prompts)")


@dataclass(frozen=True)
class RewardOptions:
    """What scores a sample: a rule function, a local reward model or a remote judge
    (:func:`rlft.rl.rewards.make_reward`)."""

    reward: str = "countdown"
    """Reward function name: 'countdown' (TinyZero's exact score: 0 / 0.1 / 1), 'countdown_accuracy' (the same
    without the format credit: 0 / 1; evaluation keeps the score) or 'uppercase_start' (toy); or
    'remote' (chat track): an OpenAI-compatible reward API (--base-url, --judge-model, --api-key-env).
    Ignored when --reward-model is set."""
    reward_model: str | None = None
    """Chat track: a local reward-model folder (written by `rlft rm`): rewards are its scores of
    (prompt messages, completion). Loaded once, on --device/--dtype: one more model in memory."""
    base_url: str = "https://integrate.api.nvidia.com/v1"
    """API root of the remote judge (--reward remote)."""
    judge_model: str = "nvidia/llama-3.1-nemotron-70b-reward"
    """Model name of the remote judge (--reward remote)."""
    api_key_env: str = "NVIDIA_API_KEY"
    """Environment variable holding the remote judge's API key (never logged or written)."""
    judge_timeout: Annotated[float, POSITIVE] = 60.0
    """--reward remote: seconds allowed for each connect and each read of one judge request."""
    judge_max_retries: Annotated[int, NON_NEGATIVE] = 5
    """--reward remote: retries of a failed judge request (429/5xx, timeouts, non-finite or malformed rewards, with
    backoff); a sample takes at most (judge_max_retries + 1) x judge_timeout plus the backoff delays."""

    def _check_reward(self, prompts_data: str | None) -> None:
        """``prompts_data``: ``--prompts-data`` (what a reward model or judge scores)."""
        require(self.reward_model is None or self.reward == "countdown",
                f"--reward-model and --reward {self.reward!r} both name a reward: pass one of them")
        require(
            prompts_data is not None or (self.reward_model is None and self.reward != "remote"),
            "a reward model or remote judge scores chat prompts: set --prompts-data (e.g. "
            "HuggingFaceH4/ultrafeedback_binarized)")
        names = ("base_url", "judge_model", "api_key_env", "judge_timeout", "judge_max_retries")
        set_ = [name for name in names if getattr(self, name) != _default(RewardOptions, name)]
        require(self.reward == "remote" or not set_,
                f"--{set_[0].replace('_', '-') if set_ else ''} is only read with --reward remote (the remote judge)")
