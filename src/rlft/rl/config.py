"""The RL loop's options: :class:`RLConfig` (``rlft rl``, and ``rlft rloo`` with :data:`RLOO_DEFAULTS`).

The choices of ``--advantage``, ``--loss`` and ``--loss-mode`` are read from the registries
(:data:`rlft.losses.advantages.ADVANTAGES`, :data:`rlft.losses.pg.POLICY_LOSSES`,
:data:`rlft.losses.pg.LOSS_MODES`), so a new estimator or loss is one dict entry there: it becomes a choice of
the flag, of ``--config`` YAML and of programmatic configs, all validated alike (:mod:`rlft.validation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlft.lora import LoRAOptions
from rlft.losses.advantages import ADVANTAGES
from rlft.losses.pg import IS_MODES, KL_ESTIMATORS, KL_PLACEMENTS, LOSS_MODES, POLICY_LOSSES
from rlft.models import DEFAULT_MODEL
from rlft.rl.curriculum import BUCKETINGS
from rlft.options import DistributedOptions, MemoryOptions, OptimizerOptions, RunOptions
from rlft.validation import require, validate_options

AdvantageName = Literal[tuple(ADVANTAGES)]  # type: ignore[valid-type]
"""Names of the advantage estimators: the keys of :data:`rlft.losses.advantages.ADVANTAGES`."""
PolicyLossName = Literal[tuple(POLICY_LOSSES)]  # type: ignore[valid-type]
"""Names of the policy losses: the keys of :data:`rlft.losses.pg.POLICY_LOSSES`."""
LossMode = Literal[LOSS_MODES]  # type: ignore[valid-type]
ISMode = Literal[IS_MODES]  # type: ignore[valid-type]
"""Aggregations of the per-token policy loss: :data:`rlft.losses.pg.LOSS_MODES`."""
KLMode = Literal[KL_PLACEMENTS]  # type: ignore[valid-type]
"""Where the KL goes: :data:`rlft.losses.pg.KL_PLACEMENTS`."""
KLEstimatorName = Literal[KL_ESTIMATORS]  # type: ignore[valid-type]
"""Per-token KL estimators: :data:`rlft.losses.pg.KL_ESTIMATORS`."""
BucketingName = Literal[tuple(BUCKETINGS)]  # type: ignore[valid-type]
"""Ways to bucket prompts for the curriculum: the keys of :data:`rlft.rl.curriculum.BUCKETINGS`."""


@dataclass(frozen=True)
class RLConfig(RunOptions, OptimizerOptions, LoRAOptions, MemoryOptions, DistributedOptions):
    """RL fine-tuning (one loop; advantage estimator and policy loss chosen by name) on Countdown prompts with the
    rule reward, or on chat prompts with a reward model or remote judge."""

    model: str = DEFAULT_MODEL
    """Initial policy: built-in name, local HF folder (e.g. an SFT run's model/), or Hub id."""
    ref_model: str | None = None
    """Reference model of the KL penalty; None: the same as --model (loaded fresh, never from a checkpoint)."""
    reward: str = "countdown"
    """Reward function name: 'countdown' (TinyZero's exact score: 0 / 0.1 / 1) or 'uppercase_start' (toy); or
    'remote' (chat track): an OpenAI-compatible reward API (--base-url, --judge-model, --api-key-env).
    Ignored when --reward-model is set."""
    data: str | None = None
    """None: generated Countdown tasks (--preset); else a Countdown .jsonl/.json/.parquet file or Hub dataset (e.g.
    ../shared/data/countdown/train.parquet, Jiayi-Pan/Countdown-Tasks-3to4) whose training rows are the prompts: its
    held-out block (500 validation + 500 test rows, rlft.tasks.countdown.splits) never trains."""
    data_split: str = "train"
    """Split to read when --data is a Hub dataset id."""
    preset: str = "easy3"
    """Countdown generator preset of the training tasks (data None) and of the held-out eval tasks."""
    num_train: int = 2000
    """Training tasks: generated from the TRAIN split of --preset, or the first N training rows of --data."""
    split_seed: int = 1234
    """Seed of the generated train/test split; evaluation uses the same seed for its held-out tasks."""
    heldout_size: int = 200
    """Generated tasks held out from training (the first N of `rlft eval countdown --split-seed`); not used with
    --data (its held-out rows are fixed)."""
    data_heldout: bool = True
    """With --data: hold its validation and test rows out of training (rlft.tasks.countdown.splits). Off
    (--no-data-heldout): every row trains, none is evaluated in the loop (a small file with no held-out block)."""
    eval_rows: Literal["validation", "test"] = "validation"
    """With --data: the held-out rows the in-loop evaluation scores (the first --eval-limit of them): 'validation'
    (screening recipes) or 'test' (the spec's held-out score)."""
    prompt_template: str = "base"
    """Countdown prompt template: 'base' (TinyZero), 'chat' (the tokenizer's chat template), 'short'."""
    output_dir: str = "runs/rl"
    """Run directory: checkpoints/, model/, metrics.jsonl, config.yaml."""
    k: int = 4
    """Samples per prompt (>= 2: each sample's baseline is the mean reward of the other k-1)."""
    prompts_per_step: int = 8
    """Prompts per step; a step trains on prompts_per_step * k samples."""
    max_steps: int = 100
    """Training steps (each: generate, score, update)."""
    lr: float = 1e-5
    """Peak learning rate (AdamW). 1e-5 is the published RLOO Countdown setting for Qwen2.5-0.5B
    (k=8, KL 0.001, ~100 steps); larger rates quickly destabilise a pretrained policy."""
    schedule: Literal["cosine", "linear", "constant"] = "constant"
    """Learning-rate decay after warmup."""
    temperature: float = 1.0
    """Sampling temperature (> 0); policy and reference log-probs are computed at this temperature too."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0: off). Log-probs ignore the truncation, so keep 1.0 for exact on-policy maths."""
    max_new_tokens: int = 256
    """Most tokens per sampled completion (EOS included)."""
    beta: float = 0.001
    """KL coefficient (0: no KL and no reference model in memory)."""
    kl_mode: KLMode = "reward"
    """Where the KL goes: 'reward' subtracts beta * sum_t kl_t from each sample's reward before the
    advantages (the RLOO paper); 'loss' adds beta * aggregate(kl_t) to the loss (OpenRLHF/verl)."""
    kl_estimator: KLEstimatorName = "k1"
    """Per-token KL estimator: k1 = logp - ref_logp (the paper's log-ratio), k3 = exp(ref-logp) - (ref-logp) - 1
    (>= 0, lower variance). Use k3 with --kl-mode loss: k1's expected gradient as a loss is zero."""
    advantage: AdvantageName = "grpo"
    """Advantage estimator (rlft.losses.advantages.ADVANTAGES): 'rloo' (leave-one-out baseline), 'grpo' ((r - group
    mean) / group std), 'lite_ppo' (group mean, batch std), 'dr_grpo' (r - group mean, no std), 'raft' (1 for each
    group's best samples, or those >= --raft-threshold, else 0), 'reinforce' (the raw reward)."""
    loss: PolicyLossName = "reinforce"
    """Policy loss (rlft.losses.pg.POLICY_LOSSES): 'reinforce' (-A * ratio; REINFORCE at ratio 1), 'ppo' (clipped to
    [1 - clip_low, 1 + clip_high]), 'raft' (likelihood of the samples with A > 0), 'raft++' (raft with the ratio
    clipped like ppo). RAFT = --advantage raft --loss raft; RAFT++ = --advantage raft --loss raft++."""
    loss_mode: LossMode = "seq_sum"
    """Aggregation: 'seq_sum' sums each sequence's token losses and averages over sequences (RLOO's
    sequence-level estimator; Dr. GRPO's no-length-normalisation); 'seq_mean' averages tokens within each
    sequence, then over sequences (GRPO); 'token_mean' averages over all completion tokens of the step (DAPO)."""
    ppo_epochs: int = 1
    """Optimizer steps per batch of samples: 1 = one on-policy update (the ratio is 1, clipping inactive);
    > 1 = further updates on the same samples against the pre-update log-probs (clipped with ppo / raft++)."""
    clip_low: float = 0.2
    """Lower clipping range: the ratio is clipped at 1 - clip_low (ppo and raft++ only)."""
    clip_high: float | None = None
    """Upper clipping range: 1 + clip_high (None: clip_low). DAPO's clip-higher uses 0.28 with clip_low 0.2."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss gets -entropy_coef * aggregate(per-token entropy) (0: off). Computed from the full
    next-token distribution at the sampling temperature."""
    is_correction: ISMode = "none"
    """Sampler-mismatch correction when the sampler differs from the trained policy (another engine, or bfloat16
    sampling weights for a float32 policy): 'token_truncate' / 'sequence_truncate' weight each token's loss by
    min(ratio, --is-cap) (truncated importance sampling), 'token_mask' / 'sequence_mask' drop tokens / sequences
    whose ratio exceeds it (TRL's vllm_importance_sampling_mode); ratio = exp(trainer - sampler log-prob), per
    token or its product over the sequence. Needs sampler log-probs (the HF engine's row-dropping decoder, vLLM).
    'none' (default): off; the mismatch is still logged (mismatch/abs_logp_mean, mismatch/abs_logp_p99)."""
    is_cap: float = 3.0
    """The cap C of --is-correction."""
    raft_threshold: float | None = None
    """--advantage raft: select samples with reward >= this (Countdown: 1.0, correct); None: each group's best
    samples (none when the group's rewards are all equal)."""
    filter_groups: bool = False
    """Drop groups whose k rewards are all equal (no signal) and refill the step from further prompts
    (Reinforce-Rej / DAPO dynamic sampling), up to --max-prompt-batches batches of prompts per step."""
    max_prompt_batches: int = 4
    """With --filter-groups: at most this many batches of prompts_per_step prompts are sampled per step; the step
    trains on the varied groups found (at most prompts_per_step)."""
    curriculum: Literal["none", "sec"] = "none"
    """Prompt order: 'none' (a seeded permutation of the training prompts per epoch) or 'sec' (Self-Evolving
    Curriculum, Chen et al. 2025, arXiv 2505.14970: prompts bucketed by --curriculum-buckets, buckets drawn from
    softmax(Q / --curriculum-tau), each bucket's Q an exponential average (step --curriculum-alpha) of the mean
    |advantage| of its groups; within a bucket prompts come in a seeded order without replacement; logs
    curriculum/p_<bucket>, curriculum/q_<bucket>, curriculum/n_<bucket>). With --filter-groups every prompt batch
    of a step is drawn from the bandit, and a dropped group counts as |advantage| 0."""
    curriculum_buckets: BucketingName = "count_target"
    """--curriculum sec: the buckets. 'count_target': Countdown tasks by (number count, target band 10-39 /
    40-69 / 70-100); chat prompts cannot be bucketed."""
    curriculum_tau: float = 1.0
    """--curriculum sec: softmax temperature over the buckets' values (SEC's Countdown runs: 1.0; its math runs 0.4)."""
    curriculum_alpha: float = 0.5
    """--curriculum sec: step size of the bucket values' update, Q <- alpha * r + (1 - alpha) * Q (SEC: 0.5)."""
    micro_batch_size: int = 8
    """Sequences per forward/backward pass; gradients accumulate exactly over the step's samples."""
    rollout_engine: Literal["hf", "vllm"] = "hf"
    """Sampler: 'hf' (transformers generate on the training model itself) or 'vllm' (colocated vLLM, pip install
    'rlft[vllm]', CUDA: the training model's weights, LoRA merged, are pushed into it before every rollout)."""
    gen_batch_size: int = 32
    """Sequences generated together by the sampler."""
    truncation_penalty: float | None = None
    """Added to the raw reward of samples that hit max_new_tokens without EOS (e.g. -0.5), before the KL and the
    leave-one-out baseline; None: off. There is no separate EOS penalty. Discourages rambling (with a reward model:
    replies cut mid-sentence), but also punishes long correct reasoning cut by a small max_new_tokens."""
    mask_truncated: bool = False
    """Leave the samples that hit max_new_tokens without EOS out of the policy loss (TRL's
    mask_truncated_completions): their rewards still count in the reward metrics and in their group's advantage
    baseline (advantages are computed over the whole group first), then their loss mask is zeroed; the loss's
    normalisers count the other samples only (sequences and tokens), so the update is the one without them."""
    overlong_buffer: int | None = None
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), L_cache tokens: a completion longer than
    max_new_tokens - L_cache gets ((max_new_tokens - L_cache) - length) / L_cache * --overlong-penalty added to its
    raw reward (down to -penalty at max_new_tokens), before the KL and the advantages; logged as
    reward/overlong_penalty_mean. None or 0: off."""
    overlong_penalty: float = 1.0
    """Scale of the overlong punishment (--overlong-buffer): the reward added at max_new_tokens tokens is -this."""
    eval_every: int = 0
    """Greedy evaluation on held-out Countdown tasks every N steps (and at step 0 and the end); 0: off."""
    eval_at_start: bool = True
    """Evaluate at step 0 too (off: skip it when the start model's score is already known, e.g. an ablation from one SFT model)."""
    eval_limit: int = 50
    """Held-out tasks per evaluation (at most heldout_size)."""
    eval_max_new_tokens: int = 256
    """Most tokens per evaluation completion (the reference evaluates with >= 1024); chat track too."""
    prompts_data: str | None = None
    """Chat track: a preference or chat dataset (.jsonl/.json/.parquet file or Hub id, e.g.
    HuggingFaceH4/ultrafeedback_binarized or the flattened UltraFeedback file) whose prompts, the conversation
    before each row's final assistant turn (duplicates removed), are the RL prompts, rendered with the chat
    template. When set, the Countdown fields (data, data_split, preset, num_train, split_seed, heldout_size,
    prompt_template, eval_limit) are ignored and Countdown evaluation is off; needs --reward-model or
    --reward remote (or a toy rule reward such as uppercase_start)."""
    prompts_split: str = "train_prefs"
    """Split of --prompts-data when it is a Hub id (H4 UltraFeedback: train_prefs or train_gen)."""
    prompts_limit: int | None = None
    """Read at most the first N rows of --prompts-data (None: all); eval prompts held out from the tail come from these."""
    max_prompt_tokens: int | None = 512
    """Chat prompts longer than this many tokens (rendered) are dropped, counted in the log; None: keep all."""
    chat_template: str | None = None
    """Chat template of the policy: a name (chatml, llama3) or a .jinja path; None: the tokenizer's own (required on
    the chat track). Saved with the model. The reward model keeps the template of its own folder."""
    reward_model: str | None = None
    """Chat track: a local reward-model folder (written by `rlft rm`): rewards are its scores of
    (prompt messages, completion). Loaded once, on --device/--dtype: one more model in memory."""
    base_url: str = "https://integrate.api.nvidia.com/v1"
    """API root of the remote judge (--reward remote)."""
    judge_model: str = "nvidia/llama-3.1-nemotron-70b-reward"
    """Model name of the remote judge (--reward remote)."""
    api_key_env: str = "NVIDIA_API_KEY"
    """Environment variable holding the remote judge's API key (never logged or written)."""
    judge_timeout: float = 60.0
    """--reward remote: seconds allowed for each connect and each read of one judge request."""
    judge_max_retries: int = 5
    """--reward remote: retries of a failed judge request (429/5xx, timeouts, non-finite or malformed rewards, with
    backoff); a sample takes at most (judge_max_retries + 1) x judge_timeout plus the backoff delays."""
    eval_split: str | None = None
    """Chat track: split of --prompts-data (Hub id) holding the eval prompts, e.g. test_prefs or test_gen. None: the
    last eval_prompts prompts read from --prompts-data (after the max_prompt_tokens filter) are held out from training. Either way training prompts
    equal to an eval prompt are dropped."""
    eval_prompts: int = 50
    """Chat track: held-out prompts of each evaluation (mean reward of greedy responses, eval/reward; every
    eval_every steps, at step 0 and at the end; 0: off)."""
    save_every: int = 25
    """Write a resumable checkpoint every this many steps (0: only the final model)."""
    seed: int = 0
    """Seed of the prompt order and of sampling (step s samples with a seed derived from seed and s)."""

    def __post_init__(self) -> None:
        validate_options(self)  # types, counts >= 1, rates > 0, coefficients >= 0, known presets/templates
        self._check_lora()
        self._check_distributed()
        require(self.k >= 2 or self.advantage in ("reinforce",) or (self.advantage == "raft" and self.raft_threshold is not None),
                f"--advantage {self.advantage} needs --k >= 2 samples per prompt (a group baseline or a best sample), got {self.k}")
        require(self.temperature > 0, f"--temperature must be > 0 (RL samples; log-probs at temperature 0 are undefined), got {self.temperature}")
        require(self.reward_model is None or self.reward == "countdown",
                f"--reward-model and --reward {self.reward!r} both name a reward: pass one of them")
        require(self.prompts_data is not None or (self.reward_model is None and self.reward != "remote"),
                "a reward model or remote judge scores chat prompts: set --prompts-data (e.g. HuggingFaceH4/ultrafeedback_binarized)")
        require(not self.overlong_buffer or self.overlong_buffer <= self.max_new_tokens,
                f"--overlong-buffer ({self.overlong_buffer}) must be <= --max-new-tokens ({self.max_new_tokens})")
        require(self.curriculum_tau > 0, f"--curriculum-tau must be > 0, got {self.curriculum_tau}")
        require(0 < self.curriculum_alpha <= 1, f"--curriculum-alpha must lie in (0, 1], got {self.curriculum_alpha}")
        require(self.curriculum == "none" or self.prompts_data is None,
                "--curriculum sec buckets Countdown tasks by difficulty; chat prompts (--prompts-data) have none")
        require(self.overlong_penalty >= 0, f"--overlong-penalty must be >= 0 (it is subtracted), got {self.overlong_penalty}")
        require(self.prompts_data is not None or self.data is not None or self.prompts_per_step <= self.num_train,
                f"--prompts-per-step ({self.prompts_per_step}) is more than the {self.num_train} training tasks (--num-train)")
        require(not (self.eval_every and self.prompts_data is None and self.data is None and self.eval_limit > self.heldout_size),
                f"--eval-limit ({self.eval_limit}) must be <= --heldout-size ({self.heldout_size}) so evaluation tasks are never trained on")


RLOO_DEFAULTS: dict[str, object] = {"advantage": "rloo", "loss": "reinforce", "loss_mode": "seq_sum", "output_dir": "runs/rloo"}
"""``rlft rloo``: :class:`RLConfig` with these defaults (REINFORCE with a leave-one-out baseline on the
sequence-level estimator, Ahmadian et al. 2024); ``--config`` values and flags override them."""


def rloo_config(**options) -> RLConfig:
    """An :class:`RLConfig` with :data:`RLOO_DEFAULTS` under ``options`` (what ``rlft rloo`` parses)."""
    return RLConfig(**{**RLOO_DEFAULTS, **options})
