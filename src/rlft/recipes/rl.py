"""One RL loop for every policy-gradient recipe: rollout -> reward -> advantages -> loss -> update.

The advantage estimator (``--advantage``, :data:`rlft.losses.advantages.ADVANTAGES`) and the policy loss
(``--loss``, :data:`rlft.losses.pg.POLICY_LOSSES`) are chosen by name, once, before the loop, as in verl
and OpenRLHF; the prompt source and the reward are small objects the loop is given
(:mod:`rlft.rl.prompts`, :mod:`rlft.rl.rewards`). Named combinations:

=====================  ==========================================================================
RLOO                   ``--advantage rloo --loss reinforce --loss-mode seq_sum`` (``rlft rloo``)
GRPO                   ``--advantage grpo --loss ppo --loss-mode seq_mean``
Dr. GRPO               ``--advantage dr_grpo --loss ppo --loss-mode seq_sum``
Lite-PPO               ``--advantage lite_ppo --loss ppo --loss-mode token_mean``
DAPO-style             ``--advantage grpo --loss ppo --clip-high 0.28 --loss-mode token_mean --filter-groups``
Reinforce-Rej          ``--advantage reinforce`` or ``rloo`` with ``--filter-groups``
RAFT / RAFT++          ``--advantage raft --loss raft`` / ``--loss raft++``
=====================  ==========================================================================

Each step:

1. take ``prompts_per_step`` training prompts (a seeded order, so a resumed run sees the same prompts)
   and sample ``k`` completions for each at ``temperature`` (seeded from seed + step). With
   ``--filter-groups`` the groups whose k rewards are all equal are dropped and further batches of
   prompts are sampled, up to ``max_prompt_batches`` per step, until ``prompts_per_step`` varied groups
   are found (``groups/tried``, ``groups/kept``);
2. score them with the reward: ``(B, k)`` raw rewards; with ``truncation_penalty`` set, samples that
   hit ``max_new_tokens`` without an EOS get it added (before the KL and the advantages);
3. teacher-force the sampled sequences (prompt ids exactly as the sampler tokenized them) to get
   log-probs at the sampling temperature under the reference (when ``beta > 0``; with LoRA the
   reference is the same model with its adapters disabled) and, when needed, the pre-update policy;
4. KL: ``kl_mode=reward`` subtracts ``beta * sum_t kl_t`` from each reward before the advantages (the
   RLOO paper); ``kl_mode=loss`` adds ``beta * aggregate(kl_t)`` to the loss (OpenRLHF/verl);
5. advantages ``(B, k)`` by the chosen estimator;
6. update: ``ppo_epochs`` optimizer steps on these samples with the chosen loss (the first is
   on-policy: ratio 1). Samples whose advantage is exactly 0 add nothing to the loss or its gradient,
   so unless the KL or an entropy bonus is in the loss they are skipped; the loss keeps the full
   step's normalisers, so the update is the same as with them, only cheaper.

Log-probs are always computed at the sampling temperature (``logits / T``). With ``top_p < 1`` the
sampler truncates the distribution; the loss uses the untruncated tempered distribution, as TRL and
OpenRLHF do.

Metrics (one ``metrics.jsonl`` line per step; ``step`` counts steps, not optimizer steps):

- ``reward/mean``, ``reward/std``: raw scores of all samples generated this step (every tried group);
  rule rewards also ``reward/accuracy`` (score == 1.0) and ``reward/format_rate`` (>= 0.1);
  ``reward/shaped_mean``: mean of the rewards the advantages are computed from (trained groups).
- ``groups/tried``, ``groups/kept``: prompt groups sampled and trained on; ``samples/step`` (generated
  this step) and ``samples/total`` (generated so far: the x axis of sample-efficiency plots).
- ``kl/mean`` (beta > 0), ``entropy`` (Monte-Carlo estimate from the sampled tokens),
  ``update/rows_frac``, ``completion/mean_tokens``, ``completion/truncated_frac``, ``adv/mean``, ``adv/std``.
- ``loss/policy``, ``loss/kl`` (kl_mode=loss), ``loss/entropy`` (entropy_coef > 0), ``pg/clipfrac``,
  ``pg/ratio_mean``, ``grad_norm``, ``lr``; ``time/generate_s``, ``time/update_s``, ``time/step_s``,
  ``tokens_per_s/generate``, ``tokens_per_s/update``, ``time/eval_s``.
- ``eval/score``, ``eval/accuracy``, ``eval/format_rate`` (Countdown, greedy, first eval_limit held-out
  tasks) or ``eval/reward``, ``eval/truncated_frac`` (chat), every eval_every steps, at step 0 and at the end.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Literal

import torch

from rlft import distributed
from rlft.checkpoint import read_metrics
from rlft.console import training_progress
from rlft.lora import LoRAOptions, adapters_disabled, merged_copy
from rlft.options import DistributedOptions, MemoryOptions, OptimizerOptions, RunOptions, resolved_strategy
from rlft.losses.advantages import ADVANTAGES, raft_advantages
from rlft.losses.pg import CLIPPED_LOSSES, POLICY_LOSSES, kl_penalty
from rlft.models import DEFAULT_MODEL, load_model, load_tokenizer, pick_device
from rlft.ops import masked_sum
from rlft.recipes.common import (batch_indices, checkpoint_if_due, claim_run_dir, finish_run, optimizer_step,
                                 prepare_training)
from rlft.recipes.memory import enable_gradient_checkpointing
from rlft.rewards.registry import RewardFunction
from rlft.rl.batch import (batch_logprobs, filler_batch, generation_seed, gradient_rows, policy_loss_backward, rollout_batch, synced_passes,
                           take_rows)
from rlft.rl.groups import varied_groups
from rlft.rl.prompts import RLPrompt, make_prompt_source
from rlft.rl.rewards import Reward, make_reward
from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.hf import HFEngine
from rlft.tracking import attach_tracker
from rlft.tasks.countdown.prompts import adds_special_tokens
from rlft.validation import UsageError, require, validate_options

log = logging.getLogger("rlft")

AdvantageName = Literal["rloo", "grpo", "lite_ppo", "dr_grpo", "raft", "reinforce"]
"""Names of the advantage estimators (:data:`rlft.losses.advantages.ADVANTAGES`)."""
PolicyLossName = Literal["reinforce", "ppo", "raft", "raft++"]
"""Names of the policy losses (:data:`rlft.losses.pg.POLICY_LOSSES`)."""
LossMode = Literal["seq_sum", "seq_mean", "token_mean"]
"""Aggregations of the per-token policy loss."""


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
    """None: generated Countdown tasks (--preset); else a Countdown .jsonl/.json/.parquet file or Hub dataset."""
    data_split: str = "train"
    """Split to read when --data is a Hub dataset id."""
    preset: str = "easy3"
    """Countdown generator preset of the training tasks (data None) and of the held-out eval tasks."""
    num_train: int = 2000
    """Training tasks: generated from the TRAIN split of --preset, or the first N rows of --data."""
    split_seed: int = 1234
    """Seed of the generated train/test split; evaluation uses the same seed for its held-out tasks."""
    heldout_size: int = 200
    """Generated tasks held out from training (the first N of `rlft eval countdown --split-seed`); with --data,
    file tasks equal to one of them are dropped."""
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
    kl_mode: Literal["reward", "loss"] = "reward"
    """Where the KL goes: 'reward' subtracts beta * sum_t kl_t from each sample's reward before the
    advantages (the RLOO paper); 'loss' adds beta * aggregate(kl_t) to the loss (OpenRLHF/verl)."""
    kl_estimator: Literal["k1", "k3"] = "k1"
    """Per-token KL estimator: k1 = logp - ref_logp (the paper's log-ratio), k3 = exp(ref-logp) - (ref-logp) - 1
    (>= 0, lower variance). Use k3 with --kl-mode loss: k1's expected gradient as a loss is zero."""
    advantage: AdvantageName = "grpo"
    """Advantage estimator (rlft.losses.advantages): 'rloo' (leave-one-out baseline), 'grpo' ((r - group mean) /
    group std), 'lite_ppo' (group mean, batch std), 'dr_grpo' (r - group mean, no std), 'raft' (1 for each group's
    best samples, or those >= --raft-threshold, else 0), 'reinforce' (the raw reward)."""
    loss: PolicyLossName = "reinforce"
    """Policy loss (rlft.losses.pg): 'reinforce' (-A * ratio; REINFORCE at ratio 1), 'ppo' (clipped to
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
    raft_threshold: float | None = None
    """--advantage raft: select samples with reward >= this (Countdown: 1.0, correct); None: each group's best
    samples (none when the group's rewards are all equal)."""
    filter_groups: bool = False
    """Drop groups whose k rewards are all equal (no signal) and refill the step from further prompts
    (Reinforce-Rej / DAPO dynamic sampling), up to --max-prompt-batches batches of prompts per step."""
    max_prompt_batches: int = 4
    """With --filter-groups: at most this many batches of prompts_per_step prompts are sampled per step; the step
    trains on the varied groups found (at most prompts_per_step)."""
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
        require(not (self.eval_every and self.prompts_data is None and self.eval_limit > self.heldout_size),
                f"--eval-limit ({self.eval_limit}) must be <= --heldout-size ({self.heldout_size}) so evaluation tasks are never trained on")


def advantage_function(cfg: RLConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """The run's advantage estimator, picked once: ``(B, k)`` rewards -> ``(B, k)`` advantages."""
    if cfg.advantage == "raft" and cfg.raft_threshold is not None:
        threshold = cfg.raft_threshold
        return lambda rewards: raft_advantages(rewards, threshold)
    return ADVANTAGES[cfg.advantage]


@dataclass
class StepSamples:
    """The groups a step trains on, and what sampling them cost.

    ``B`` counts the step's kept groups on every rank together; under torchrun a rank holds the prompts and
    samples of its own groups only (``local``), but every rank knows the rewards of all ``B``."""

    prompts: list[RLPrompt]
    """This rank's kept prompts (all ``B`` in one process), in the order of ``local``."""
    samples: list[list[Sample]]
    """Their lists of ``k`` samples."""
    local: list[int]
    """Positions in ``0..B-1`` of this rank's groups (``range(B)`` in one process)."""
    raw: torch.Tensor
    """``(B, k)`` raw rewards of the kept groups."""
    truncated: torch.Tensor
    """``(B, k)`` 1.0 where a sample hit max_new_tokens without EOS."""
    all_raw: torch.Tensor
    """``(G, k)`` raw rewards of every group sampled this step (G >= B)."""
    generate_s: float
    completion_tokens: int = 0
    """Tokens this rank generated this step."""


def sample_step(cfg: RLConfig, step: int, prompts: list[RLPrompt], engine, sampling: SamplingParams, reward: Reward) -> StepSamples:
    """Sample and score this step's groups (step 1-2 of the loop).

    Without filtering: the prompts of ``batch_indices(step, ...)``, sampled with ``generation_seed(seed,
    step)``. With ``cfg.filter_groups``: batches ``j = 0, 1, ...`` of the "virtual steps"
    ``step * max_prompt_batches + j`` (a pure function of the step, so a resumed run samples the same
    groups), keeping varied groups until ``prompts_per_step`` are found or ``max_prompt_batches`` batches
    were tried.

    Under torchrun every rank takes the same batch of prompts and samples its :func:`rlft.distributed.shard`
    of it (whole groups; seeded per rank), scores them, and the ``(groups, k)`` rewards are gathered on every
    rank (:func:`rlft.distributed.gather_rows`), so the filtering decision, and the kept groups, are those of
    one process given the same samples. Every rank calls ``engine.generate`` for every batch, with an empty
    list when its shard is empty (with FSDP2 the HF engine's generation is collective).
    """
    k = cfg.k
    kept = 0
    kept_prompts: list[RLPrompt] = []
    kept_samples: list[list[Sample]] = []
    local: list[int] = []
    kept_raw, kept_trunc, all_raw = [], [], []
    generate_s = 0.0
    completion_tokens = 0
    batches = cfg.max_prompt_batches if cfg.filter_groups else 1
    for j in range(batches):
        virtual = step * cfg.max_prompt_batches + j if cfg.filter_groups else step
        chosen = batch_indices(virtual, len(prompts), cfg.prompts_per_step, cfg.seed)
        mine = distributed.shard(list(range(len(chosen))))  # this rank's groups of the batch (all in one process)
        batch_prompts = [prompts[chosen[b]] for b in mine]
        t0 = time.perf_counter()
        seed = generation_seed(cfg.seed, virtual, distributed.rank())
        # every rank calls generate, with no prompts too: a sharded model's generation is collective (HFEngine)
        samples = engine.generate([p.text for p in batch_prompts], replace(sampling, seed=seed))
        generate_s += time.perf_counter() - t0
        flat = [s for row in samples for s in row]
        completion_tokens += sum(len(s.completion_ids) for s in flat)
        scores = reward.fn([p for p in batch_prompts for _ in range(k)], [s.text for s in flat]) if flat else []
        if len(scores) != len(flat):
            raise ValueError(f"the reward returned {len(scores)} scores for {len(flat)} completions")
        raw = torch.tensor(scores, dtype=torch.float32).view(len(batch_prompts), k)
        truncated = torch.tensor([s.finish_reason == "length" for s in flat], dtype=torch.float32).view(len(batch_prompts), k)
        raw, truncated = (distributed.gather_rows(t, mine, len(chosen)) for t in (raw, truncated))  # (len(chosen), k)
        all_raw.append(raw)
        keep = varied_groups(shaped_rewards(cfg, raw, truncated)) if cfg.filter_groups else torch.ones(len(chosen), dtype=torch.bool)
        for b in keep.nonzero().squeeze(1).tolist():
            if kept < cfg.prompts_per_step:
                if b in mine:
                    local.append(kept)
                    kept_prompts.append(batch_prompts[mine.index(b)])
                    kept_samples.append(samples[mine.index(b)])
                kept_raw.append(raw[b])
                kept_trunc.append(truncated[b])
                kept += 1
        if kept >= cfg.prompts_per_step:
            break
    empty = torch.zeros(0, k)
    return StepSamples(kept_prompts, kept_samples, local, torch.stack(kept_raw) if kept_raw else empty,
                       torch.stack(kept_trunc) if kept_trunc else empty, torch.cat(all_raw), generate_s, completion_tokens)


def reduce_loss_metrics(metrics: dict[str, float], tokens: float) -> dict[str, float]:
    """Combine :func:`rlft.rl.batch.policy_loss_backward`'s metrics over ranks (unchanged in one process): the
    losses (already divided by the whole step's normalisers) are summed, ``pg/clipfrac`` and ``pg/ratio_mean``
    are weighted by each rank's ``tokens`` (target tokens of its updated rows), as one process weights its
    micro-batches. No tokens anywhere: clipfrac 0, ratio 1."""
    if not distributed.active():
        return metrics
    weighted = {key: value * tokens if key.startswith("pg/") else value for key, value in metrics.items()}
    sums = distributed.all_reduce_sums({**weighted, "__tokens": tokens})
    total = sums.pop("__tokens")
    out = {key: (value / total if total else (1.0 if key == "pg/ratio_mean" else 0.0)) if key.startswith("pg/") else value
           for key, value in sums.items()}
    return out


def shaped_rewards(cfg: RLConfig, raw: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Raw rewards plus the truncation penalty on samples that hit max_new_tokens (``(B, k)``, a new tensor)."""
    return raw + cfg.truncation_penalty * truncated if cfg.truncation_penalty is not None else raw.clone()


# --------------------------------------------------------------------------- the loop


def train_rl(cfg: RLConfig, *, reward_fn: RewardFunction | None = None) -> Path:
    """Run the RL loop as configured; returns the folder of the final model (``output_dir/model``).

    ``reward_fn`` overrides the configured reward (a rule function ``(prompts, completions,
    ground_truths)``, for programmatic use and tests; see :func:`rlft.rl.rewards.make_reward`).

    Under torchrun each rank samples, scores and trains on its share of every step's groups (:func:`sample_step`);
    the advantages come from every rank's rewards, the loss is divided by the whole step's sample and token
    counts, gradients are summed over ranks and metrics are sums over ranks, so given the same samples the
    update is the one-process update (up to float rounding). The samples themselves differ from a one-process
    run's (each rank draws from its own seeded stream, and generation batches other prompts together). Every
    rank evaluates its shard of the held-out prompts (:func:`rlft.rl.prompts.evaluate_sharded`); rank 0 alone
    writes files.

    With ``--distributed fsdp2`` (the default under torchrun without LoRA, :func:`rlft.options.resolved_strategy`)
    the policy is sharded, and so is a separate reference model (beta > 0): every forward and backward is
    collective, so every rank runs as many as the busiest one. Generation: :class:`rlft.rollout.hf.HFEngine`
    with ``synced_gpus`` and filler chunks; log-prob passes and the update: filler micro-batches
    (:func:`rlft.rl.batch.synced_passes`); checkpoints and the final model: full state dicts gathered on rank 0.

    Raises:
        UsageError: ``--rollout-engine vllm`` under torchrun (vLLM's weights would have to be gathered from the
            ranks; not supported).
    """
    distributed.init(cfg.device)  # under torchrun only
    if distributed.active() and cfg.rollout_engine != "hf":
        raise UsageError("the RL loop under torchrun samples with --rollout-engine hf only (vLLM would need the policy's "
                         "weights pushed from every rank)")
    run = claim_run_dir(cfg)  # refuses a folder holding another run; writes nothing yet
    if cfg.beta > 0 and cfg.kl_mode == "loss" and cfg.kl_estimator == "k1":
        log.warning("--kl-mode loss with the k1 estimator: its expected gradient is zero; consider --kl-estimator k3")
    chat = cfg.prompts_data is not None
    tokenizer = load_tokenizer(cfg.model)
    if cfg.chat_template is not None or chat:
        from rlft.data.chat import ensure_chat_template

        ensure_chat_template(tokenizer, cfg.chat_template)  # None: the tokenizer's own, required on the chat track
    reward = make_reward(cfg, reward_fn)  # once: the loop calls reward.fn
    advantage_fn = advantage_function(cfg)
    loss_fn = POLICY_LOSSES[cfg.loss]
    clipped = cfg.loss in CLIPPED_LOSSES
    clip_low, clip_high = (cfg.clip_low, cfg.clip_high if cfg.clip_high is not None else cfg.clip_low) if clipped else (None, None)
    torch.manual_seed(cfg.seed)
    spec = pick_device(cfg.device, cfg.dtype)
    source = make_prompt_source(cfg, tokenizer, reward)
    run_dir = run.open()
    prompts = source.train
    evaluate_on = bool(cfg.eval_every and source.eval)

    total_steps = cfg.max_steps
    optimizer_steps = total_steps * cfg.ppo_epochs
    lora = cfg.lora_settings()
    strategy = resolved_strategy(cfg, distributed.world())
    setup = prepare_training(cfg.model, run_dir, spec, cfg, resume=cfg.resume, total_steps=optimizer_steps, lora=lora, distributed_strategy=strategy)
    model, start_step = setup.model, setup.start_step
    # The reference is the initial policy, never a checkpoint of this run: with LoRA the same model with its
    # adapters off (no second copy), else a fresh load, sharded like the policy under FSDP2.
    ref_model = None
    if cfg.beta > 0 and (lora is None or cfg.ref_model is not None):
        ref_model = load_model(cfg.ref_model or cfg.model, spec).eval().requires_grad_(False)
        if distributed.sharded(model):
            ref_model = distributed.wrap_model(ref_model, strategy)
    use_ref = cfg.beta > 0
    filler = filler_batch(tokenizer, spec.device)  # the input of a sharded model's filler passes

    chunk = cfg.logits_chunk_size
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    tracker = attach_tracker(setup.metrics, cfg.report_to, run_dir, cfg)

    def reference_logprobs(batch, passes):
        if ref_model is not None:
            return batch_logprobs(ref_model, batch, cfg.temperature, cfg.micro_batch_size, logits_chunk_size=chunk,
                                  passes=passes, filler=filler)
        with adapters_disabled(model):  # LoRA: never sharded
            return batch_logprobs(model, batch, cfg.temperature, cfg.micro_batch_size, logits_chunk_size=chunk)

    # Chat-template text carries its own BOS: the tokenizer must not add another (generation and training alike).
    templated = chat or not adds_special_tokens(cfg.prompt_template)
    if cfg.rollout_engine == "vllm":
        from rlft.rollout.vllm import VLLMEngine

        engine = VLLMEngine(cfg.model, dtype=str(spec.dtype).removeprefix("torch."), tokenizer=tokenizer, add_special_tokens=not templated)
    else:
        engine = HFEngine(model, tokenizer, batch_size=cfg.gen_batch_size, add_special_tokens=not templated)

    def sync_sampler() -> None:
        """vLLM samples from its own copy of the weights: push the current policy's (LoRA merged) into it."""
        if cfg.rollout_engine == "vllm":
            engine.sync_weights(merged_copy(model))

    sampling = SamplingParams(k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens)
    kl_in_reward = use_ref and cfg.kl_mode == "reward"
    kl_coef = cfg.beta if use_ref and cfg.kl_mode == "loss" else 0.0
    history = read_metrics(run_dir / "metrics.jsonl") if start_step else []
    samples_total = next((int(r["samples/total"]) for r in reversed(history) if "samples/total" in r), 0)
    log.info("RL (%s advantages, %s loss, %s): %d training %s, %d steps of %d prompts x %d samples on %s/%s (KL %s, beta %g; "
             "%s reward%s%s)", cfg.advantage, cfg.loss, cfg.loss_mode, len(prompts), "chat prompts" if chat else "tasks",
             total_steps, cfg.prompts_per_step, cfg.k, spec.device, str(spec.dtype).removeprefix("torch."), cfg.kl_mode,
             cfg.beta, reward.kind, "; group filtering" if cfg.filter_groups else "", f"; LoRA r={lora.r}" if lora else "")

    sync_sampler()
    if evaluate_on and start_step == 0 and cfg.eval_at_start:  # every rank: its shard of the held-out prompts
        setup.metrics.log({"step": 0, "samples/total": 0, **source.evaluate(engine)})

    with training_progress("rl") as progress:
        bar = progress.add_task("rl", total=total_steps, completed=start_step, info="")
        for step in range(start_step, total_steps):
            t0 = time.perf_counter()
            # 1-2. This step's groups (filtered and refilled with --filter-groups) and their raw rewards: B groups
            # on all ranks together, this rank's at positions got.local (all of them in one process).
            got = sample_step(cfg, step, prompts, engine, sampling, reward)
            B, k, local = got.raw.shape[0], cfg.k, got.local
            generated = got.all_raw.numel()
            samples_total += generated
            rewards = shaped_rewards(cfg, got.raw, got.truncated)  # (B, k)
            record: dict[str, float] = {"step": step + 1}
            t1 = time.perf_counter()
            old_logprobs = ref_logprobs = None
            # 3. Log-probs before the update: reference, and the sampling policy when needed. A rank with no groups
            # has an empty batch (FSDP2: it still runs the busiest rank's number of passes, on a filler).
            batch = rollout_batch(tokenizer, [p.text for p in got.prompts], got.samples,
                                  add_special_tokens=engine.add_special_tokens).to(spec.device)
            mask = batch.loss_mask
            passes = synced_passes(model, len(local) * k, cfg.micro_batch_size)  # None unless sharded
            if use_ref:
                ref_logprobs = reference_logprobs(batch, passes)
            if cfg.ppo_epochs > 1 or kl_in_reward:
                old_logprobs = batch_logprobs(model, batch, cfg.temperature, cfg.micro_batch_size, logits_chunk_size=chunk,
                                              passes=passes, filler=filler)
            # 4. KL in the reward (the RLOO paper): R_i - beta * sum_t kl_t, before the advantages (every group's).
            if kl_in_reward and B:
                kl_seq = masked_sum(kl_penalty(old_logprobs, ref_logprobs, cfg.kl_estimator), mask, dim=-1)
                rewards = rewards - distributed.gather_rows(cfg.beta * kl_seq.view(len(local), k).cpu(), local, B)
            # 5. Advantages, per group (or over the whole batch, lite_ppo) from every rank's rewards.
            advantages = advantage_fn(rewards) if B else torch.zeros(0, k)  # (B, k)
            flat_adv = advantages[local].flatten().to(spec.device)
            if cfg.loss in ("raft", "raft++"):
                flat_adv = (flat_adv > 0).to(flat_adv.dtype)  # the selection: rows with weight 0 are skipped
            # 6. Update on the rows that carry gradient; the loss keeps the full step's normalisers.
            rows = gradient_rows(flat_adv, kl_coef, cfg.entropy_coef)
            sub = take_rows(batch, rows)
            num_tokens = distributed.all_reduce_sum(float(mask.sum()))  # completion tokens of the whole step
            rows_total = int(distributed.all_reduce_sum(len(rows)))
            update_passes = synced_passes(model, len(rows), cfg.micro_batch_size)  # None unless sharded; 0: no rows anywhere
            epoch_metrics = []
            update_logprobs = None
            for epoch in range(cfg.ppo_epochs):
                loss_metrics = {"loss/policy": 0.0, "loss/kl": 0.0, "loss/entropy": 0.0, "pg/clipfrac": 0.0, "pg/ratio_mean": 1.0}
                if len(rows) or update_passes:
                    loss_metrics, logprobs = policy_loss_backward(
                        model, sub, flat_adv[rows],
                        temperature=cfg.temperature, micro_batch_size=cfg.micro_batch_size, loss_mode=cfg.loss_mode,
                        old_logprobs=old_logprobs[rows] if cfg.ppo_epochs > 1 else None, loss_fn=loss_fn,
                        clip_low=clip_low, clip_high=clip_high, entropy_coef=cfg.entropy_coef,
                        ref_logprobs=ref_logprobs[rows] if ref_logprobs is not None else None, kl_coef=kl_coef,
                        kl_estimator=cfg.kl_estimator, num_sequences=B * k, num_tokens=num_tokens,
                        logits_chunk_size=chunk, passes=update_passes, filler=filler,
                    )  # fmt: skip
                    if epoch == 0:
                        update_logprobs = logprobs  # the sampling policy's log-probs of the updated rows
                elif rows_total == 0:  # nothing to learn from: a zero gradient (AdamW still applies its momentum, as it would)
                    for p in model.parameters():
                        if p.requires_grad:
                            p.grad = torch.zeros_like(p)
                loss_metrics = reduce_loss_metrics(loss_metrics, float(sub.loss_mask.sum()) if len(rows) else 0.0)
                epoch_metrics.append({**loss_metrics, **optimizer_step(setup, cfg.max_grad_norm)})
            sync_sampler()  # the next rollout (and evaluation) samples from the updated policy
            update_s = time.perf_counter() - t1

            # 7. Metrics (sums over ranks of this rank's counts; the rewards are every rank's already).
            if old_logprobs is not None:  # all rows when a no-grad pass computed them, else the updated rows
                seen_logprobs, seen_mask, seen_ref = old_logprobs, mask, ref_logprobs
            elif update_logprobs is not None:
                seen_logprobs, seen_mask = update_logprobs, sub.loss_mask
                seen_ref = ref_logprobs[rows] if ref_logprobs is not None else None
            else:
                seen_logprobs = seen_mask = seen_ref = None
            counts = {"rows": len(rows), "update_tokens": float(batch.attention_mask.sum()),
                      "generated_tokens": got.completion_tokens, "seen_tokens": 0.0, "logprob_sum": 0.0, "kl_sum": 0.0, "kl_rows": 0.0}
            if seen_mask is not None:
                counts.update(seen_tokens=float(seen_mask.sum()), logprob_sum=float(masked_sum(seen_logprobs, seen_mask)))
                if seen_ref is not None:
                    counts.update(kl_sum=float(masked_sum(kl_penalty(seen_logprobs, seen_ref, cfg.kl_estimator), seen_mask, dim=-1).sum()),
                                  kl_rows=float(seen_mask.shape[0]))
            counts = distributed.all_reduce_sums(counts)
            all_raw = got.all_raw
            record.update({
                "reward/mean": all_raw.mean().item(),
                "reward/std": all_raw.std(unbiased=False).item(),
                **({"reward/accuracy": (all_raw == 1.0).float().mean().item(), "reward/format_rate": (all_raw >= 0.1).float().mean().item()}
                   if reward.kind == "rule" else {}),
                "groups/tried": all_raw.shape[0],
                "groups/kept": B,
                "samples/step": generated,
                "samples/total": samples_total,
                "update/rows_frac": counts["rows"] / max(B * k, 1),
            })  # fmt: skip
            if B:
                record.update({
                    "reward/shaped_mean": rewards.mean().item(),
                    "adv/mean": advantages.mean().item(),
                    "adv/std": advantages.std(unbiased=False).item(),
                    "completion/mean_tokens": num_tokens / (B * k),
                    "completion/truncated_frac": got.truncated.mean().item(),
                    "tokens_per_s/update": counts["update_tokens"] / max(update_s, 1e-9),
                })  # fmt: skip
                if counts["seen_tokens"] > 0:
                    record["entropy"] = -counts["logprob_sum"] / counts["seen_tokens"]
                    if counts["kl_rows"] > 0:
                        record["kl/mean"] = counts["kl_sum"] / counts["kl_rows"]
                record["tokens_per_s/generate"] = counts["generated_tokens"] / max(got.generate_s, 1e-9)
            for key in ("loss/policy", "loss/kl", "loss/entropy", "pg/clipfrac", "pg/ratio_mean", "grad_norm"):
                if (key != "loss/kl" or kl_coef > 0) and (key != "loss/entropy" or cfg.entropy_coef > 0):
                    record[key] = sum(m[key] for m in epoch_metrics) / len(epoch_metrics)
            record.update({"lr": epoch_metrics[0]["lr"], "time/generate_s": got.generate_s, "time/update_s": update_s})
            if evaluate_on and ((step + 1) % cfg.eval_every == 0 or step + 1 == total_steps):
                t2 = time.perf_counter()
                record.update(source.evaluate(engine))  # every rank: its shard of the held-out prompts
                record["time/eval_s"] = time.perf_counter() - t2
            record["time/step_s"] = time.perf_counter() - t0  # the whole step: sampling, reward, update, evaluation
            setup.metrics.log(record)
            info = f"reward {record['reward/mean']:.3f}" + (f"  kl {record['kl/mean']:.4f}" if "kl/mean" in record else "")
            if cfg.filter_groups:
                info += f"  groups {B}/{record['groups/tried']}"
            progress.update(bar, advance=1, info=info)
            checkpoint_if_due(setup, run_dir, step + 1, total_steps, tokenizer, cfg)
    return finish_run(run_dir, model, tokenizer, cfg, tracker, "RL")
