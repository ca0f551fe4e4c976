"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al. 2024), one linear loop.

Two tracks share the loop; only the prompts and the reward differ (both chosen once, before it):

- **Countdown** (default): generated or file Countdown tasks rendered with ``prompt_template``,
  scored by a rule function (``--reward``, see :mod:`rlft.rewards.registry`).
- **Chat** (``--prompts-data``, e.g. UltraFeedback): the prompts of a preference/chat dataset (the
  conversation before each row's final assistant turn), rendered with the policy's chat template
  (:func:`rlft.data.chat.render_generation_prompt`; ``--chat-template``), scored by a local reward
  model (``--reward-model``, a folder written by ``rlft rm``; :class:`~rlft.rewards.reward_model.RewardModelScorer`)
  or a remote judge (``--reward remote``; :class:`~rlft.rewards.remote.RemoteRewardJudge`). The
  Countdown fields are then ignored. Memory: the reward model is one more model in memory (with the
  reference, three: policy + reference + reward model) and it scores every step's B*k samples
  (``micro_batch_size`` pairs per forward): fine for 135M-0.5B models, plan for it above that.

Each step:

1. take ``prompts_per_step`` training prompts (a seeded order, so a resumed run sees the
   same prompts) and sample ``k`` completions for each at ``temperature`` (seeded from seed + step);
2. score them with the reward chosen before the loop (:func:`make_reward`): ``(B, k)`` raw rewards;
   with ``truncation_penalty`` set, samples that hit ``max_new_tokens`` without an EOS get it added
   to their raw reward (before the KL and the leave-one-out baseline; there is no other EOS/length
   penalty);
3. teacher-force the sampled sequences (prompt ids exactly as the sampler tokenized them, by the
   same :func:`rlft.rollout.hf.encode_prompts` call with the engine's ``add_special_tokens`` (False
   for chat-template prompts, which carry their own BOS), + the generated ids, EOS included in the
   loss mask) to get log-probs at the sampling temperature under
   the reference model (when ``beta > 0``) and, when needed, the pre-update policy;
4. KL: with ``kl_mode=reward`` (the paper's placement) each sample's reward becomes
   ``R_i - beta * sum_t kl_t`` *before* the advantages; with ``kl_mode=loss`` (OpenRLHF/verl)
   ``beta * aggregate(kl_t)`` is added to the loss instead;
5. advantages ``A_i = R_i - mean_{j != i} R_j`` within each prompt's group;
6. update: ``ppo_epochs == 1`` is plain REINFORCE (ratio identically 1, one forward/backward per
   micro-batch, one optimizer step); ``ppo_epochs > 1`` takes that many optimizer steps on the same
   samples with PPO clipping against the pre-update log-probs. Samples whose advantage is exactly 0
   (with beta = 0: every group whose k rewards are all equal) add exactly nothing to the loss or its
   gradient, so unless the KL is in the loss they are skipped (:func:`gradient_rows`); the loss keeps
   the full step's normalisers, so the update is the same as with them, only cheaper.

Log-probs are always computed at the sampling temperature (``logits / T``), so they are the
log-probs of the distribution the tokens were drawn from (with ``top_p < 1`` the sampler also
truncates the distribution; the loss uses the untruncated tempered distribution, as TRL and OpenRLHF
do). Cost per step: generation, one no-grad reference forward (beta > 0), one no-grad policy forward
(only for kl_mode=reward with beta > 0, or ppo_epochs > 1), and ppo_epochs forward/backward passes
over the samples with a non-zero advantage (all samples with kl_mode=loss and beta > 0). With beta = 0
there is no reference model and no no-grad pass at all.

Metrics (one ``metrics.jsonl`` line per step; ``step`` counts steps, not optimizer steps):

- ``reward/mean``, ``reward/std``: the reward's raw scores of the step's B*k samples (before the
  truncation penalty and the KL); rule rewards only (meaningless for a reward model's scores):
  ``reward/accuracy``: fraction with raw score == 1.0 (Countdown: correct); ``reward/format_rate``:
  fraction >= 0.1 (Countdown: an answer tag on the last line); ``reward/shaped_mean``: mean of the reward the advantages are computed from (after the truncation
  penalty and, with kl_mode=reward, minus beta * KL).
- ``kl/mean`` (beta > 0 only): mean over samples of sum_t kl_t (the chosen estimator) between the
  pre-update policy and the reference, on the sampled tokens (all samples: a no-grad pass or the KL-in-loss
  update computes them all).
- ``entropy``: -mean log-prob of the sampled completion tokens under the pre-update policy at the
  sampling temperature: a Monte-Carlo estimate of the per-token entropy of the sampling
  distribution (exact in expectation when top_p = 1). Over all samples when a no-grad policy pass ran
  (kl_mode=reward with beta > 0, or ppo_epochs > 1), else over the updated samples only (absent when none was).
- ``update/rows_frac``: fraction of the step's samples the update ran on (non-zero advantage).
- ``completion/mean_tokens`` (EOS included), ``completion/truncated_frac`` (hit max_new_tokens).
- ``adv/mean`` (always ~0: LOO advantages sum to 0 per group), ``adv/std``.
- ``loss/policy``, ``loss/kl`` (kl_mode=loss only, before beta), ``pg/clipfrac`` (fraction of tokens
  where PPO clipping is active; 0 when ppo_epochs == 1), ``pg/ratio_mean``, ``grad_norm`` (before
  clipping): means over the step's ppo_epochs optimizer steps; ``lr``: the rate of the first.
- ``time/generate_s`` (sampling), ``time/update_s`` (log-prob passes, loss, backward, optimizer),
  ``tokens_per_s/generate`` (completion tokens / generate time), ``tokens_per_s/update`` (prompt +
  completion tokens of the batch / update time), ``time/eval_s``.
- ``eval/score``, ``eval/accuracy``, ``eval/format_rate``: greedy Countdown evaluation on the first
  eval_limit held-out tasks (every eval_every steps, at step 0 and at the last step).
- Chat track instead: ``eval/reward`` (mean raw reward, e.g. the reward model's score, of greedy
  responses to eval_prompts held-out prompts; no truncation penalty) and ``eval/truncated_frac``,
  on the same schedule.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Literal

import torch

from rlft.checkpoint import save_checkpoint, save_model_folder
from rlft.console import console, training_progress
from rlft.data.tokenize import TokenizedExample, collate
from rlft.losses.pg import kl_loss, kl_penalty, policy_gradient_loss, rloo_advantages
from rlft.models import DEFAULT_MODEL, load_model, load_tokenizer, pick_device
from rlft.ops import masked_mean, masked_sum, sequence_logprobs
from rlft.recipes.common import batch_indices, claim_run_dir, optimizer_step, prepare_training, write_run_config
from rlft.rewards.registry import RewardFunction, get_reward_function
from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.hf import HFEngine, encode_prompts
from rlft.tasks.countdown.prompts import adds_special_tokens
from rlft.types import CountdownTask, TokenBatch
from rlft.validation import validate_options

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class RLOOConfig:
    """RLOO (REINFORCE with a leave-one-out baseline) on Countdown prompts, or on chat prompts with a learned reward."""

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
    output_dir: str = "runs/rloo"
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
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """'adamw', or 'sgd' (plain SGD: each update is lr x the clipped gradient). AdamW moves every weight by ~lr per
    step whatever its gradient (its first steps are sign descent), which for a handful of steps on a sparse,
    noisy policy gradient spreads the update over all weights; SGD's update follows the gradient's direction
    and size. With SGD, lr is the length of a step whose gradient norm reaches max_grad_norm = 1 (try ~1e-2)."""
    weight_decay: float = 0.0
    """Weight decay."""
    warmup_ratio: float = 0.0
    """Fraction of optimizer steps spent warming the learning rate up linearly from 0."""
    schedule: Literal["cosine", "linear", "constant"] = "constant"
    """Learning-rate decay after warmup."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global L2 norm); 0 disables clipping."""
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
    loss_mode: Literal["seq_sum", "token_mean"] = "seq_sum"
    """Reduction: 'seq_sum' sums each sequence's token losses and averages over sequences (the paper's
    sequence-level estimator); 'token_mean' averages over all completion tokens of the step."""
    ppo_epochs: int = 1
    """Optimizer steps per batch of samples: 1 = plain REINFORCE with the LOO baseline; > 1 = PPO-style
    clipped updates against the pre-update log-probs."""
    clip_eps: float = 0.2
    """PPO clipping range of the probability ratio (used only when ppo_epochs > 1)."""
    micro_batch_size: int = 8
    """Sequences per forward/backward pass; gradients accumulate exactly over the step's samples."""
    gen_batch_size: int = 32
    """Sequences generated together by the sampler."""
    truncation_penalty: float | None = None
    """Added to the raw reward of samples that hit max_new_tokens without EOS (e.g. -0.5), before the KL and the
    leave-one-out baseline; None: off. There is no separate EOS penalty. Discourages rambling (with a reward model:
    replies cut mid-sentence), but also punishes long correct reasoning cut by a small max_new_tokens."""
    eval_every: int = 0
    """Greedy evaluation on held-out Countdown tasks every N steps (and at step 0 and the end); 0: off."""
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
    eval_split: str | None = None
    """Chat track: split of --prompts-data (Hub id) holding the eval prompts, e.g. test_prefs or test_gen. None: the
    last eval_prompts prompts read from --prompts-data (after the max_prompt_tokens filter) are held out from training. Either way training prompts
    equal to an eval prompt are dropped."""
    eval_prompts: int = 50
    """Chat track: held-out prompts of each evaluation (mean reward of greedy responses, eval/reward; every
    eval_every steps, at step 0 and at the end; 0: off)."""
    save_every: int = 25
    """Write a resumable checkpoint every this many steps (0: only the final model)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
    resume: bool = False
    """Continue from the latest checkpoint in --output-dir (model, optimizer, scheduler, RNG, step)."""
    overwrite: bool = False
    """Replace a run already in --output-dir: it is moved aside to <output-dir>.replaced-<time> (logged) once the
    inputs are validated. Without it (or --resume) a folder holding a run is refused."""
    resume_override: tuple[str, ...] = ()
    """With --resume: options allowed to differ from the run's saved config.yaml (e.g. lr batch_size); any other
    difference is refused. A longer --max-steps needs no override."""
    seed: int = 0
    """Seed of the prompt order and of sampling (step s samples with a seed derived from seed and s)."""
    device: str = "auto"
    """'auto' (CUDA if present, else CPU), 'cpu', 'cuda', 'cuda:1', ..."""
    dtype: str = "auto"
    """'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'."""

    def __post_init__(self) -> None:
        validate_options(self)
        if self.k < 2:
            raise ValueError(f"RLOO needs k >= 2 samples per prompt (the leave-one-out baseline of a sample is the mean of the others), got k={self.k}")
        for name in ("prompts_per_step", "max_steps", "ppo_epochs", "micro_batch_size", "gen_batch_size", "max_new_tokens", "eval_limit", "eval_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_prompts < 0:
            raise ValueError(f"eval_prompts must be >= 0, got {self.eval_prompts}")
        for name in ("prompts_limit", "max_prompt_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")
        if self.reward_model is not None and self.reward != "countdown":
            raise ValueError(f"--reward-model and --reward {self.reward!r} both name a reward: pass one of them")
        if self.prompts_data is None and (self.reward_model is not None or self.reward == "remote"):
            raise ValueError("a reward model or remote judge scores chat prompts: set --prompts-data (e.g. HuggingFaceH4/ultrafeedback_binarized)")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (RLOO samples; log-probs at temperature 0 are undefined), got {self.temperature}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.clip_eps <= 0:
            raise ValueError(f"clip_eps must be > 0, got {self.clip_eps}")
        if self.eval_every < 0 or self.save_every < 0:
            raise ValueError("eval_every and save_every must be >= 0")
        if self.eval_every and self.prompts_data is None and self.eval_limit > self.heldout_size:
            raise ValueError(f"eval_limit ({self.eval_limit}) must be <= heldout_size ({self.heldout_size}) so evaluation tasks are never trained on")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class RLPrompt:
    """One RL prompt: the text the policy continues, and what its reward needs."""

    text: str
    """The prompt string given to the sampler (a rendered Countdown prompt or chat generation prompt)."""
    messages: list[dict] | None = None
    """Chat track: the conversation before the reply (what a reward model scores the reply against)."""
    ground_truth: dict | None = None
    """What a rule reward gets as its ground truth: ``CountdownTask.ground_truth()``; on the chat track
    ``{"messages": messages}``."""


def load_rloo_tasks(cfg: RLOOConfig) -> tuple[list[CountdownTask], list[CountdownTask]]:
    """``(train, heldout)`` Countdown tasks; ``heldout`` is the first ``heldout_size`` generated test tasks.

    Training tasks come from the TRAIN split of ``make_splits(PRESETS[preset], num_train, heldout_size,
    split_seed)`` (disjoint from the held-out tasks), or from ``cfg.data`` minus any task equal to a
    held-out one.
    """
    from rlft.tasks.countdown.generator import PRESETS, make_splits, task_key

    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown Countdown preset {cfg.preset!r}; choose from {sorted(PRESETS)}")
    if cfg.data is None:
        train, heldout = make_splits(PRESETS[cfg.preset], cfg.num_train, cfg.heldout_size, cfg.split_seed)
    else:
        from rlft.tasks.countdown.loaders import load_countdown

        _, heldout = make_splits(PRESETS[cfg.preset], 0, cfg.heldout_size, cfg.split_seed)
        held = {task_key(t) for t in heldout}
        loaded = load_countdown(cfg.data, split=cfg.data_split, limit=cfg.num_train)
        train = [t for t in loaded if task_key(t) not in held]
        if len(train) < len(loaded):
            log.info("dropped %d tasks of %s that equal held-out tasks", len(loaded) - len(train), cfg.data)
    if not train:
        raise ValueError("no Countdown training tasks")
    return train, heldout


def read_chat_prompts(source: str, split: str, limit: int | None = None) -> list[list[dict]]:
    """Prompt conversations of a preference or chat dataset, file order, duplicates removed.

    Rows are read with :func:`rlft.data.preferences.load_chat_examples` (H4 ``messages``/``chosen``
    lists, flattened ``prompt``/``chosen`` strings, HH-RLHF, smol-smoltalk ``messages``); each row's
    prompt is its conversation before the final assistant turn. Invalid rows are skipped, counted and
    logged by the loader (e.g. the empty ``chosen`` of a flattened UltraFeedback row).
    """
    from rlft.data.preferences import load_chat_examples

    examples, counts = load_chat_examples(source, split=split, limit=limit, skip_invalid=True)
    unique: dict[str, list[dict]] = {}
    for ex in examples:
        last = max(i for i, m in enumerate(ex.messages) if m["role"] == "assistant")
        prompt = ex.messages[:last]
        unique.setdefault(json.dumps(prompt, sort_keys=True, ensure_ascii=False), prompt)
    log.info("%s (%s): %d prompts from %d rows (%d invalid skipped, %d duplicates)", source, split, len(unique),
             counts["rows"], counts["skipped_invalid"], counts["kept"] - len(unique))
    return list(unique.values())


def load_chat_prompts(cfg: RLOOConfig, tokenizer) -> tuple[list[RLPrompt], list[RLPrompt]]:
    """``(train, eval)`` chat prompts of ``cfg.prompts_data``, rendered with ``tokenizer``'s chat template.

    Prompts longer than ``max_prompt_tokens`` are dropped first (counted in the log). Eval prompts (only
    when ``eval_every`` and ``eval_prompts`` are set): the first ``eval_prompts`` of ``eval_split``, or
    else the last ``eval_prompts`` of the training prompts, which are then not trained on. Training
    prompts equal to an eval prompt are dropped in both cases.
    """
    from rlft.data.chat import render_generation_prompt

    def rendered(conversations: list[list[dict]], what: str) -> list[RLPrompt]:
        prompts = [RLPrompt(render_generation_prompt(tokenizer, m), m, {"messages": m}) for m in conversations]
        if cfg.max_prompt_tokens is not None:
            lengths = [len(ids) for ids in encode_prompts(tokenizer, [p.text for p in prompts], add_special_tokens=False)]
            kept = [p for p, n in zip(prompts, lengths) if n <= cfg.max_prompt_tokens]
            if len(kept) < len(prompts):
                log.info("%s prompts: dropped %d of %d longer than max_prompt_tokens=%d", what, len(prompts) - len(kept), len(prompts), cfg.max_prompt_tokens)
            prompts = kept
        return prompts

    train = rendered(read_chat_prompts(cfg.prompts_data, cfg.prompts_split, cfg.prompts_limit), "training")
    heldout: list[RLPrompt] = []
    if cfg.eval_every and cfg.eval_prompts:
        if cfg.eval_split is not None:
            heldout = rendered(read_chat_prompts(cfg.prompts_data, cfg.eval_split), "eval")[: cfg.eval_prompts]
            if not heldout:
                raise ValueError(f"no eval prompts in {cfg.prompts_data} (split {cfg.eval_split})")
        else:
            if len(train) <= cfg.eval_prompts:
                raise ValueError(f"{cfg.prompts_data} has {len(train)} usable prompts: too few to hold out eval_prompts={cfg.eval_prompts} and train on the rest")
            train, heldout = train[: -cfg.eval_prompts], train[-cfg.eval_prompts :]
    held = {p.text for p in heldout}
    if dropped := sum(p.text in held for p in train):
        log.info("dropped %d training prompts equal to eval prompts", dropped)
        train = [p for p in train if p.text not in held]
    if not train:
        raise ValueError(f"no training prompts in {cfg.prompts_data}")
    return train, heldout


def load_prompts(cfg: RLOOConfig, tokenizer) -> tuple[list[RLPrompt], list[RLPrompt], list[CountdownTask] | None]:
    """``(train, eval, eval_tasks)``: chat prompts (``eval_tasks`` None), or Countdown prompts rendered with
    ``prompt_template`` (``eval_tasks``: the first ``eval_limit`` held-out tasks)."""
    if cfg.prompts_data is not None:
        return *load_chat_prompts(cfg, tokenizer), None
    from rlft.tasks.countdown.prompts import render_prompt

    tasks, heldout = load_rloo_tasks(cfg)
    train = [RLPrompt(render_prompt(cfg.prompt_template, t, tokenizer), None, t.ground_truth()) for t in tasks]
    eval_tasks = heldout[: cfg.eval_limit]
    return train, [RLPrompt(render_prompt(cfg.prompt_template, t, tokenizer), None, t.ground_truth()) for t in eval_tasks], eval_tasks


def generation_seed(seed: int, step: int) -> int:
    """The sampling seed of a step: distinct per step, the same after a resume."""
    return seed * 1_000_003 + step


def rollout_batch(tokenizer, prompts: list[str], samples: list[list[Sample]], *, add_special_tokens: bool = True) -> TokenBatch:
    """The right-padded teacher-forcing batch of all sampled sequences: row ``b * k + j`` is ``samples[b][j]``.

    Prompt ids come from :func:`rlft.rollout.hf.encode_prompts`, the function :class:`HFEngine` tokenizes
    with; pass the engine's ``add_special_tokens`` (the recipe does), so the ids are those the sampler
    conditioned on. ``loss_mask`` is 1 on every generated id, the EOS included (masks come from lengths,
    never from token values, so pad == EOS is harmless).
    """
    prompt_ids = encode_prompts(tokenizer, prompts, add_special_tokens=add_special_tokens)
    examples = [
        TokenizedExample(
            input_ids=list(prompt_ids[b]) + list(sample.completion_ids),
            loss_mask=[0] * len(prompt_ids[b]) + [1] * len(sample.completion_ids),
            truncated=sample.finish_reason == "length",
        )
        for b, row in enumerate(samples)
        for sample in row
    ]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return collate(examples, pad_id)


def _micro_batches(batch: TokenBatch, size: int) -> Iterator[tuple[slice, TokenBatch]]:
    """``(rows, micro_batch)`` pairs; each micro-batch is trimmed to its own longest sequence."""
    for start in range(0, batch.input_ids.shape[0], size):
        rows = slice(start, start + size)
        width = int(batch.attention_mask[rows].sum(dim=1).max())
        yield rows, TokenBatch(batch.input_ids[rows, :width], batch.attention_mask[rows, :width], batch.loss_mask[rows, :width])


@torch.no_grad()
def batch_logprobs(model, batch: TokenBatch, temperature: float, micro_batch_size: int) -> torch.Tensor:
    """``(N, T)`` log-probs of the batch's target tokens at ``temperature`` (0 off the loss mask), no grad."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for rows, mb in _micro_batches(batch, micro_batch_size):
        out[rows, : mb.input_ids.shape[1]] = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature)
    return out


# --------------------------------------------------------------------------- the loss on a batch of samples


def policy_loss_backward(
    model,
    batch: TokenBatch,
    advantages: torch.Tensor,
    *,
    temperature: float,
    micro_batch_size: int,
    loss_mode: Literal["seq_sum", "token_mean"] = "seq_sum",
    old_logprobs: torch.Tensor | None = None,
    clip_eps: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: Literal["k1", "k3"] = "k3",
    num_sequences: int | None = None,
    num_tokens: float | None = None,
) -> tuple[dict[str, float], torch.Tensor]:
    """Forward and backward of the RLOO loss on a batch of samples; gradients accumulate in ``model``.

    The loss is ``policy_gradient_loss(...) + kl_coef * kl_loss(...)`` over all N rows of ``batch``,
    reduced with ``loss_mode`` over the *whole* batch (num_sequences = N, num_tokens = all target
    tokens), so splitting into micro-batches gives exactly the full-batch gradient. Call
    ``optimizer.zero_grad()`` before and step after.

    Args:
        batch: ``(N, T)`` from :func:`rollout_batch`.
        advantages: ``(N,)`` one advantage per row.
        old_logprobs: ``(N, T)`` log-probs of the sampling policy (no grad); None: the current ones
            detached (ratio 1: REINFORCE, no extra forward).
        clip_eps: PPO clipping (None: off).
        ref_logprobs: ``(N, T)`` reference log-probs; needed when ``kl_coef > 0`` (the KL-in-the-loss term).
        num_sequences, num_tokens: the loss's normalisers (None: the batch's own row count and target
            token count). Pass the full step's values when ``batch`` holds only some of its rows (see
            :func:`gradient_rows`) so the gradient is that of the full step.
    Returns:
        ``(metrics, logprobs)``: ``loss/policy`` and ``loss/kl`` (sums over micro-batches = full-batch
        values), ``pg/clipfrac`` and ``pg/ratio_mean`` (token means over the batch), and the detached
        ``(N, T)`` log-probs this forward computed.
    """
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    num_sequences = batch.input_ids.shape[0] if num_sequences is None else num_sequences
    num_tokens = float(batch.loss_mask.sum()) if num_tokens is None else float(num_tokens)
    own_tokens = float(batch.loss_mask.sum())
    metrics = {"loss/policy": 0.0, "loss/kl": 0.0, "pg/clipfrac": 0.0, "pg/ratio_mean": 0.0}
    logprobs_out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for rows, mb in _micro_batches(batch, micro_batch_size):
        width = mb.input_ids.shape[1]
        logprobs = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature)
        old = logprobs.detach() if old_logprobs is None else old_logprobs[rows, :width]
        loss, pg_metrics = policy_gradient_loss(
            logprobs, old, advantages[rows], mb.loss_mask,
            clip_eps=clip_eps, mode=loss_mode, num_sequences=num_sequences, num_tokens=num_tokens,
        )  # fmt: skip
        if kl_coef > 0:
            kl, kl_metrics = kl_loss(
                logprobs, ref_logprobs[rows, :width], mb.loss_mask,
                estimator=kl_estimator, mode=loss_mode, num_sequences=num_sequences, num_tokens=num_tokens,
            )  # fmt: skip
            loss = loss + kl_coef * kl
            metrics["loss/kl"] += kl_metrics["loss/kl"]
        loss.backward()
        share = float(mb.loss_mask.sum()) / max(own_tokens, 1.0)  # token-weighted means over micro-batches
        metrics["loss/policy"] += pg_metrics["loss/policy"]
        metrics["pg/clipfrac"] += pg_metrics["pg/clipfrac"] * share
        metrics["pg/ratio_mean"] += pg_metrics["pg/ratio_mean"] * share
        logprobs_out[rows, :width] = logprobs.detach()
    return metrics, logprobs_out


def gradient_rows(advantages: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Indices of the rows that carry gradient: ``(M,)`` long, ``M <= N`` for ``advantages`` of shape ``(N,)``.

    A sample whose advantage is exactly 0 contributes exactly 0 to the policy-gradient loss and its
    gradient (REINFORCE and PPO-clipped alike: every term is multiplied by the advantage), so with no
    KL term in the loss (``kl_coef == 0``) only rows with a non-zero advantage need a forward and
    backward. With ``beta = 0`` that skips every group whose k rewards are all equal (common when
    the policy is confident: all correct or all wrong). With the KL in the loss every row is kept.
    The update stays exact as long as the loss is normalised by the full step's counts
    (``policy_loss_backward(..., num_sequences=, num_tokens=)``).
    """
    if kl_coef > 0:
        return torch.arange(advantages.numel(), device=advantages.device)
    return (advantages != 0).nonzero().squeeze(1)


def take_rows(batch: TokenBatch, rows: torch.Tensor) -> TokenBatch:
    """The sub-batch of ``batch`` at ``rows`` (same width; micro-batches trim it)."""
    return TokenBatch(batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows])


# --------------------------------------------------------------------------- reward


RolloutReward = Callable[[list[RLPrompt], list[str]], list[float]]
"""``reward(prompts, completions) -> one raw reward per (prompt, completion)``."""


@dataclass(frozen=True)
class Reward:
    fn: RolloutReward
    kind: Literal["rule", "reward_model", "remote"]
    """'rule': a function of :data:`~rlft.rewards.registry.REWARD_FUNCTIONS` or an override (accuracy and
    format-rate metrics make sense); else a learned judge's scores."""


def make_reward(cfg: RLOOConfig, reward_fn: RewardFunction | None = None) -> Reward:
    """The reward of the run, picked once: ``reward_fn`` (an override) if given, else the reward model
    (``cfg.reward_model``: a :class:`~rlft.rewards.reward_model.RewardModelScorer`, loaded here), else the
    remote judge (``cfg.reward == "remote"``), else the rule function ``cfg.reward``.

    Rule functions get ``(prompt texts, completions, ground truths)``; judges ``(prompt messages,
    completions)``.
    """
    if reward_fn is None and cfg.reward_model is not None:
        from rlft.rewards.reward_model import RewardModelScorer

        scorer = RewardModelScorer(cfg.reward_model, batch_size=cfg.micro_batch_size, device=cfg.device, dtype=cfg.dtype)
        log.info("reward: reward model %s", cfg.reward_model)
        return Reward(lambda prompts, completions: scorer.score([p.messages for p in prompts], completions), "reward_model")
    if reward_fn is None and cfg.reward == "remote":
        from rlft.rewards.remote import RemoteRewardJudge

        judge = RemoteRewardJudge(cfg.base_url, cfg.judge_model, api_key_env=cfg.api_key_env)
        log.info("reward: remote judge %s at %s", cfg.judge_model, cfg.base_url)
        return Reward(lambda prompts, completions: judge.score([p.messages for p in prompts], completions), "remote")
    if reward_fn is None:
        reward_fn = get_reward_function(cfg.reward, also=("remote",))
        if cfg.prompts_data is not None and cfg.reward == "countdown":
            raise ValueError("chat prompts (--prompts-data) have no Countdown answer: pass --reward-model, --reward remote or a toy rule reward")
    fn = reward_fn
    return Reward(lambda prompts, completions: fn([p.text for p in prompts], completions, [p.ground_truth for p in prompts]), "rule")


# --------------------------------------------------------------------------- evaluation


def evaluate_chat(engine, prompts: list[RLPrompt], reward: Reward, max_new_tokens: int) -> dict[str, float]:
    """Greedy responses to held-out chat prompts: ``eval/reward`` (mean raw reward, no truncation
    penalty) and ``eval/truncated_frac``."""
    samples = [row[0] for row in engine.generate([p.text for p in prompts], SamplingParams(k=1, temperature=0.0, max_new_tokens=max_new_tokens))]
    scores = reward.fn(prompts, [s.text for s in samples])
    return {"eval/reward": sum(scores) / len(scores), "eval/truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples)}


def evaluate_heldout(engine, tasks: list[CountdownTask], prompts: list[str], max_new_tokens: int) -> dict[str, float]:
    """Greedy Countdown evaluation: ``eval/score`` (mean 0/0.1/1 score), ``eval/accuracy``, ``eval/format_rate``."""
    from rlft.eval.countdown import evaluate_countdown

    result = evaluate_countdown(engine, tasks, prompts, SamplingParams(k=1, temperature=0.0, max_new_tokens=max_new_tokens))
    return {"eval/score": result.mean_score, "eval/accuracy": result.accuracy, "eval/format_rate": result.format_rate}


# --------------------------------------------------------------------------- the loop


def train_rloo(cfg: RLOOConfig, *, reward_fn: RewardFunction | None = None) -> Path:
    """Run RLOO as configured; returns the folder of the final model (``output_dir/model``).

    ``reward_fn`` overrides the configured reward (a rule function ``(prompts, completions,
    ground_truths)``, for programmatic use and tests; see :func:`make_reward`).
    """
    run = claim_run_dir(cfg)  # refuses a folder holding another run; writes nothing yet
    if cfg.beta > 0 and cfg.kl_mode == "loss" and cfg.kl_estimator == "k1":
        log.warning("--kl-mode loss with the k1 estimator: its expected gradient is zero; consider --kl-estimator k3")
    chat = cfg.prompts_data is not None
    tokenizer = load_tokenizer(cfg.model)
    if cfg.chat_template is not None or chat:
        from rlft.data.chat import ensure_chat_template

        ensure_chat_template(tokenizer, cfg.chat_template)  # None: the tokenizer's own, required on the chat track
    reward = make_reward(cfg, reward_fn)  # once: the loop calls reward.fn
    torch.manual_seed(cfg.seed)
    spec = pick_device(cfg.device, cfg.dtype)
    prompts, eval_prompts, eval_tasks = load_prompts(cfg, tokenizer)
    run_dir = run.open()
    evaluate_on = bool(cfg.eval_every and eval_prompts)

    def evaluate() -> dict[str, float]:
        if chat:
            return evaluate_chat(engine, eval_prompts, reward, cfg.eval_max_new_tokens)
        return evaluate_heldout(engine, eval_tasks, [p.text for p in eval_prompts], cfg.eval_max_new_tokens)

    total_steps = cfg.max_steps
    optimizer_steps = total_steps * cfg.ppo_epochs
    setup = prepare_training(cfg.model, run_dir, spec, resume=cfg.resume, lr=cfg.lr, weight_decay=cfg.weight_decay,
                             schedule=cfg.schedule, warmup_steps=int(cfg.warmup_ratio * optimizer_steps), total_steps=optimizer_steps,
                             optimizer=cfg.optimizer)
    model, start_step = setup.model, setup.start_step
    ref_model = None
    if cfg.beta > 0:  # the reference is the initial policy, never a checkpoint of this run
        ref_model = load_model(cfg.ref_model or cfg.model, spec).eval().requires_grad_(False)
    # Chat-template text carries its own BOS: the tokenizer must not add another (generation and training alike).
    templated = chat or not adds_special_tokens(cfg.prompt_template)
    engine = HFEngine(model, tokenizer, batch_size=cfg.gen_batch_size, add_special_tokens=not templated)
    sampling = SamplingParams(k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens)
    clip_eps = cfg.clip_eps if cfg.ppo_epochs > 1 else None
    kl_in_reward = ref_model is not None and cfg.kl_mode == "reward"
    kl_coef = cfg.beta if ref_model is not None and cfg.kl_mode == "loss" else 0.0
    log.info("RLOO: %d training %s, %d steps of %d prompts x %d samples on %s/%s (KL %s, beta %g; %s reward)", len(prompts),
             "chat prompts" if chat else "tasks", total_steps, cfg.prompts_per_step, cfg.k, spec.device,
             str(spec.dtype).removeprefix("torch."), cfg.kl_mode, cfg.beta, reward.kind)

    if evaluate_on and start_step == 0:
        setup.metrics.log({"step": 0, **evaluate()})

    with training_progress("rloo") as progress:
        bar = progress.add_task("rloo", total=total_steps, completed=start_step, info="")
        for step in range(start_step, total_steps):
            # 1. This step's prompts, k samples each.
            chosen = batch_indices(step, len(prompts), cfg.prompts_per_step, cfg.seed)
            step_prompts = [prompts[i] for i in chosen]
            step_texts = [p.text for p in step_prompts]
            t0 = time.perf_counter()
            samples = engine.generate(step_texts, replace(sampling, seed=generation_seed(cfg.seed, step)))
            generate_s = time.perf_counter() - t0
            flat = [s for row in samples for s in row]  # row b * k + j

            # 2. Raw rewards (B, k); the truncation penalty goes on samples that hit max_new_tokens without EOS.
            B, k = len(step_prompts), cfg.k
            scores = reward.fn([p for p in step_prompts for _ in range(k)], [s.text for s in flat])
            if len(scores) != B * k:
                raise ValueError(f"the reward returned {len(scores)} scores for {B * k} completions")
            raw = torch.tensor(scores, dtype=torch.float32).view(B, k)
            truncated = torch.tensor([s.finish_reason == "length" for s in flat], dtype=torch.float32).view(B, k)
            rewards = raw + cfg.truncation_penalty * truncated if cfg.truncation_penalty is not None else raw.clone()

            # 3. Log-probs before the update: reference, and the sampling policy when needed.
            t1 = time.perf_counter()
            batch = rollout_batch(tokenizer, step_texts, samples, add_special_tokens=engine.add_special_tokens).to(spec.device)
            mask = batch.loss_mask
            ref_logprobs = batch_logprobs(ref_model, batch, cfg.temperature, cfg.micro_batch_size) if ref_model is not None else None
            old_logprobs = None
            if cfg.ppo_epochs > 1 or kl_in_reward:
                old_logprobs = batch_logprobs(model, batch, cfg.temperature, cfg.micro_batch_size)

            # 4. KL in the reward (the paper): R_i - beta * sum_t kl_t, before the advantages.
            if kl_in_reward:
                kl_seq = masked_sum(kl_penalty(old_logprobs, ref_logprobs, cfg.kl_estimator), mask, dim=-1)  # (B*k,)
                rewards = rewards - cfg.beta * kl_seq.view(B, k).cpu()

            # 5. Leave-one-out advantages within each prompt's group.
            advantages = rloo_advantages(rewards)  # (B, k)

            # 6. Update: ppo_epochs optimizer steps on these samples (1: REINFORCE). Only rows with a
            #    non-zero advantage carry gradient (unless the KL is in the loss): the others are skipped,
            #    and the loss keeps the full step's normalisers, so the gradient is exactly the full one.
            flat_adv = advantages.flatten().to(spec.device)
            rows = gradient_rows(flat_adv, kl_coef)
            sub = take_rows(batch, rows)
            epoch_metrics = []
            for epoch in range(cfg.ppo_epochs):
                if len(rows):
                    loss_metrics, logprobs = policy_loss_backward(
                        model, sub, flat_adv[rows],
                        temperature=cfg.temperature, micro_batch_size=cfg.micro_batch_size, loss_mode=cfg.loss_mode,
                        old_logprobs=old_logprobs[rows] if cfg.ppo_epochs > 1 else None, clip_eps=clip_eps,
                        ref_logprobs=ref_logprobs[rows] if ref_logprobs is not None else None, kl_coef=kl_coef,
                        kl_estimator=cfg.kl_estimator, num_sequences=len(flat), num_tokens=float(mask.sum()),
                    )  # fmt: skip
                else:  # nothing to learn from: a zero gradient (AdamW still applies its momentum, as it would)
                    loss_metrics = {"loss/policy": 0.0, "loss/kl": 0.0, "pg/clipfrac": 0.0, "pg/ratio_mean": 1.0}
                    logprobs = torch.zeros(sub.input_ids.shape, device=spec.device)
                    for p in model.parameters():
                        if p.requires_grad:
                            p.grad = torch.zeros_like(p)
                if epoch == 0:
                    update_logprobs = logprobs  # the sampling policy's log-probs of the updated rows
                epoch_metrics.append({**loss_metrics, **optimizer_step(setup, cfg.max_grad_norm)})
            update_s = time.perf_counter() - t1
            # Log-probs of the sampling policy (and the reference's, on the same rows): all rows when a no-grad
            # pass computed them, else the updated rows (all rows whenever the KL is in the loss).
            if old_logprobs is not None:
                seen_logprobs, seen_mask, seen_ref = old_logprobs, mask, ref_logprobs
            else:
                seen_logprobs, seen_mask = update_logprobs, sub.loss_mask
                seen_ref = ref_logprobs[rows] if ref_logprobs is not None else None

            # 7. Metrics.
            completion_tokens = float(mask.sum())
            record = {
                "step": step + 1,
                "reward/mean": raw.mean().item(),
                "reward/std": raw.std(unbiased=False).item(),
                **({"reward/accuracy": (raw == 1.0).float().mean().item(), "reward/format_rate": (raw >= 0.1).float().mean().item()}
                   if reward.kind == "rule" else {}),
                "reward/shaped_mean": rewards.mean().item(),
                "adv/mean": advantages.mean().item(),
                "adv/std": advantages.std(unbiased=False).item(),
                **({"entropy": -masked_mean(seen_logprobs, seen_mask).item()} if seen_mask.sum() > 0 else {}),
                "update/rows_frac": len(rows) / len(flat),
                "completion/mean_tokens": completion_tokens / len(flat),
                "completion/truncated_frac": truncated.mean().item(),
            }
            if ref_model is not None:
                kl_seq = masked_sum(kl_penalty(seen_logprobs, seen_ref, cfg.kl_estimator), seen_mask, dim=-1)
                record["kl/mean"] = kl_seq.mean().item() if len(kl_seq) else 0.0
            for key in ("loss/policy", "loss/kl", "pg/clipfrac", "pg/ratio_mean", "grad_norm"):
                if key != "loss/kl" or kl_coef > 0:
                    record[key] = sum(m[key] for m in epoch_metrics) / len(epoch_metrics)
            record.update({
                "lr": epoch_metrics[0]["lr"],
                "time/generate_s": generate_s,
                "time/update_s": update_s,
                "tokens_per_s/generate": completion_tokens / generate_s,
                "tokens_per_s/update": float(batch.attention_mask.sum()) / update_s,
            })  # fmt: skip
            if evaluate_on and ((step + 1) % cfg.eval_every == 0 or step + 1 == total_steps):
                t2 = time.perf_counter()
                record.update(evaluate())
                record["time/eval_s"] = time.perf_counter() - t2
            record["time/step_s"] = time.perf_counter() - t0  # the whole step: sampling, reward, update, evaluation
            setup.metrics.log(record)
            info = f"reward {record['reward/mean']:.3f}" + (f"  kl {record['kl/mean']:.4f}" if "kl/mean" in record else "")
            progress.update(bar, advance=1, info=info)
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < total_steps:
                save_checkpoint(run_dir, step + 1, model, tokenizer, setup.optimizer, setup.scheduler, keep=cfg.keep_checkpoints, config=cfg)
    final = run_dir / "model"
    save_model_folder(final, model, tokenizer)
    write_run_config(run_dir, cfg)
    console.print(f"[green]RLOO done[/]: model saved to {final}")
    return final
