"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al. 2024), one linear loop.

Each step:

1. take ``prompts_per_step`` Countdown training prompts (a seeded order, so a resumed run sees the
   same prompts) and sample ``k`` completions for each at ``temperature`` (seeded from seed + step);
2. score them with the reward function (``--reward``, see :mod:`rlft.rewards.registry`): ``(B, k)``;
   optionally add ``truncation_penalty`` to samples that hit ``max_new_tokens``;
3. teacher-force the sampled sequences (prompt ids exactly as the sampler tokenized them + the
   generated ids, EOS included in the loss mask) to get log-probs at the sampling temperature under
   the reference model (when ``beta > 0``) and, when needed, the pre-update policy;
4. KL: with ``kl_mode=reward`` (the paper's placement) each sample's reward becomes
   ``R_i - beta * sum_t kl_t`` *before* the advantages; with ``kl_mode=loss`` (OpenRLHF/verl)
   ``beta * aggregate(kl_t)`` is added to the loss instead;
5. advantages ``A_i = R_i - mean_{j != i} R_j`` within each prompt's group;
6. update: ``ppo_epochs == 1`` is plain REINFORCE (ratio identically 1, one forward/backward per
   micro-batch, one optimizer step); ``ppo_epochs > 1`` takes that many optimizer steps on the same
   samples with PPO clipping against the pre-update log-probs.

Log-probs are always computed at the sampling temperature (``logits / T``), so they are the
log-probs of the distribution the tokens were drawn from (with ``top_p < 1`` the sampler also
truncates the distribution; the loss uses the untruncated tempered distribution, as TRL and OpenRLHF
do). Cost per step: generation, one no-grad reference forward (beta > 0), one no-grad policy forward
(only for kl_mode=reward with beta > 0, or ppo_epochs > 1), and ppo_epochs forward/backward passes.

Metrics (one ``metrics.jsonl`` line per step; ``step`` counts steps, not optimizer steps):

- ``reward/mean``, ``reward/std``: the reward function's raw scores of the step's B*k samples (before the
  truncation penalty and the KL); ``reward/accuracy``: fraction with raw score == 1.0 (Countdown:
  correct); ``reward/format_rate``: fraction >= 0.1 (Countdown: an answer tag on the last line);
  ``reward/shaped_mean``: mean of the reward the advantages are computed from (after the truncation
  penalty and, with kl_mode=reward, minus beta * KL).
- ``kl/mean`` (beta > 0 only): mean over samples of sum_t kl_t (the chosen estimator) between the
  pre-update policy and the reference, on the sampled tokens.
- ``entropy``: -mean log-prob of the sampled completion tokens under the pre-update policy at the
  sampling temperature: a Monte-Carlo estimate of the per-token entropy of the sampling
  distribution (exact in expectation when top_p = 1).
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
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Literal

import torch

from rlft.checkpoint import save_checkpoint, save_model_folder
from rlft.console import console, training_progress
from rlft.data.tokenize import TokenizedExample, collate
from rlft.losses.pg import kl_loss, kl_penalty, policy_gradient_loss, rloo_advantages
from rlft.models import DEFAULT_MODEL, load_model, load_tokenizer, pick_device
from rlft.ops import masked_mean, masked_sum, sequence_logprobs
from rlft.recipes.common import batch_indices, optimizer_step, prepare_training, start_run_dir
from rlft.rewards.registry import REWARD_FUNCTIONS, RewardFunction
from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.hf import HFEngine
from rlft.types import CountdownTask, TokenBatch

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class RLOOConfig:
    """RLOO (REINFORCE with a leave-one-out baseline) on Countdown prompts."""

    model: str = DEFAULT_MODEL
    """Initial policy: built-in name, local HF folder (e.g. an SFT run's model/), or Hub id."""
    ref_model: str | None = None
    """Reference model of the KL penalty; None: the same as --model (loaded fresh, never from a checkpoint)."""
    reward: str = "countdown"
    """Reward function name: 'countdown' (TinyZero's exact score: 0 / 0.1 / 1) or 'uppercase_start' (toy)."""
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
    weight_decay: float = 0.0
    """AdamW weight decay."""
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
    """Added to the reward of samples that hit max_new_tokens without EOS (e.g. -0.5); None: off. Discourages
    rambling, but also punishes long correct reasoning cut by a small max_new_tokens."""
    eval_every: int = 0
    """Greedy evaluation on held-out Countdown tasks every N steps (and at step 0 and the end); 0: off."""
    eval_limit: int = 50
    """Held-out tasks per evaluation (at most heldout_size)."""
    eval_max_new_tokens: int = 256
    """Most tokens per evaluation completion (the reference evaluates with >= 1024)."""
    save_every: int = 25
    """Write a resumable checkpoint every this many steps (0: only the final model)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
    resume: bool = False
    """Continue from the latest checkpoint in --output-dir (model, optimizer, scheduler, RNG, step)."""
    seed: int = 0
    """Seed of the prompt order and of sampling (step s samples with a seed derived from seed and s)."""
    device: str = "auto"
    """'auto' (CUDA if present, else CPU), 'cpu', 'cuda', 'cuda:1', ..."""
    dtype: str = "auto"
    """'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'."""

    def __post_init__(self) -> None:
        if self.k < 2:
            raise ValueError(f"RLOO needs k >= 2 samples per prompt (the leave-one-out baseline of a sample is the mean of the others), got k={self.k}")
        for name in ("prompts_per_step", "max_steps", "ppo_epochs", "micro_batch_size", "gen_batch_size", "max_new_tokens", "eval_limit", "eval_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (RLOO samples; log-probs at temperature 0 are undefined), got {self.temperature}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.clip_eps <= 0:
            raise ValueError(f"clip_eps must be > 0, got {self.clip_eps}")
        if self.eval_every < 0 or self.save_every < 0:
            raise ValueError("eval_every and save_every must be >= 0")
        if self.eval_every and self.eval_limit > self.heldout_size:
            raise ValueError(f"eval_limit ({self.eval_limit}) must be <= heldout_size ({self.heldout_size}) so evaluation tasks are never trained on")


# --------------------------------------------------------------------------- data


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


def generation_seed(seed: int, step: int) -> int:
    """The sampling seed of a step: distinct per step, the same after a resume."""
    return seed * 1_000_003 + step


def rollout_batch(tokenizer, prompts: list[str], samples: list[list[Sample]]) -> TokenBatch:
    """The right-padded teacher-forcing batch of all sampled sequences: row ``b * k + j`` is ``samples[b][j]``.

    Prompt ids come from ``tokenizer(prompts)`` with its defaults, exactly as :class:`HFEngine` tokenizes
    them, so the ids are those the sampler conditioned on. ``loss_mask`` is 1 on every generated id,
    the EOS included (masks come from lengths, never from token values, so pad == EOS is harmless).
    """
    prompt_ids = tokenizer(list(prompts))["input_ids"]
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
    Returns:
        ``(metrics, logprobs)``: ``loss/policy`` and ``loss/kl`` (sums over micro-batches = full-batch
        values), ``pg/clipfrac`` and ``pg/ratio_mean`` (token means over the batch), and the detached
        ``(N, T)`` log-probs this forward computed.
    """
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    num_sequences = batch.input_ids.shape[0]
    num_tokens = float(batch.loss_mask.sum())
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
        share = float(mb.loss_mask.sum()) / max(num_tokens, 1.0)  # token-weighted means over micro-batches
        metrics["loss/policy"] += pg_metrics["loss/policy"]
        metrics["pg/clipfrac"] += pg_metrics["pg/clipfrac"] * share
        metrics["pg/ratio_mean"] += pg_metrics["pg/ratio_mean"] * share
        logprobs_out[rows, :width] = logprobs.detach()
    return metrics, logprobs_out


# --------------------------------------------------------------------------- evaluation


def evaluate_heldout(engine, tasks: list[CountdownTask], prompts: list[str], max_new_tokens: int) -> dict[str, float]:
    """Greedy Countdown evaluation: ``eval/score`` (mean 0/0.1/1 score), ``eval/accuracy``, ``eval/format_rate``."""
    from rlft.eval.countdown import evaluate_countdown

    result = evaluate_countdown(engine, tasks, prompts, SamplingParams(k=1, temperature=0.0, max_new_tokens=max_new_tokens))
    return {"eval/score": result.mean_score, "eval/accuracy": result.accuracy, "eval/format_rate": result.format_rate}


# --------------------------------------------------------------------------- the loop


def train_rloo(cfg: RLOOConfig, *, reward_fn: RewardFunction | None = None) -> Path:
    """Run RLOO as configured; returns the folder of the final model (``output_dir/model``).

    ``reward_fn`` overrides ``REWARD_FUNCTIONS[cfg.reward]`` (for programmatic use and tests).
    """
    if reward_fn is None:
        if cfg.reward not in REWARD_FUNCTIONS:
            raise ValueError(f"unknown reward {cfg.reward!r}; choose from {sorted(REWARD_FUNCTIONS)}")
        reward_fn = REWARD_FUNCTIONS[cfg.reward]
    if cfg.beta > 0 and cfg.kl_mode == "loss" and cfg.kl_estimator == "k1":
        log.warning("--kl-mode loss with the k1 estimator: its expected gradient is zero; consider --kl-estimator k3")
    run_dir = start_run_dir(cfg.output_dir, cfg)
    torch.manual_seed(cfg.seed)
    spec = pick_device(cfg.device, cfg.dtype)
    tokenizer = load_tokenizer(cfg.model)
    from rlft.tasks.countdown.prompts import render_prompt

    tasks, heldout = load_rloo_tasks(cfg)
    prompts = [render_prompt(cfg.prompt_template, task, tokenizer) for task in tasks]
    eval_tasks = heldout[: cfg.eval_limit]
    eval_prompts = [render_prompt(cfg.prompt_template, task, tokenizer) for task in eval_tasks]

    total_steps = cfg.max_steps
    optimizer_steps = total_steps * cfg.ppo_epochs
    setup = prepare_training(cfg.model, run_dir, spec, resume=cfg.resume, lr=cfg.lr, weight_decay=cfg.weight_decay,
                             schedule=cfg.schedule, warmup_steps=int(cfg.warmup_ratio * optimizer_steps), total_steps=optimizer_steps)
    model, start_step = setup.model, setup.start_step
    ref_model = None
    if cfg.beta > 0:  # the reference is the initial policy, never a checkpoint of this run
        ref_model = load_model(cfg.ref_model or cfg.model, spec).eval().requires_grad_(False)
    engine = HFEngine(model, tokenizer, batch_size=cfg.gen_batch_size)
    sampling = SamplingParams(k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens)
    clip_eps = cfg.clip_eps if cfg.ppo_epochs > 1 else None
    kl_in_reward = ref_model is not None and cfg.kl_mode == "reward"
    kl_coef = cfg.beta if ref_model is not None and cfg.kl_mode == "loss" else 0.0
    log.info("RLOO: %d training tasks, %d steps of %d prompts x %d samples on %s/%s (KL %s, beta %g)", len(tasks), total_steps,
             cfg.prompts_per_step, cfg.k, spec.device, str(spec.dtype).removeprefix("torch."), cfg.kl_mode, cfg.beta)

    if cfg.eval_every and start_step == 0:
        setup.metrics.log({"step": 0, **evaluate_heldout(engine, eval_tasks, eval_prompts, cfg.eval_max_new_tokens)})

    with training_progress("rloo") as progress:
        bar = progress.add_task("rloo", total=total_steps, completed=start_step, info="")
        for step in range(start_step, total_steps):
            # 1. This step's prompts, k samples each.
            chosen = batch_indices(step, len(tasks), cfg.prompts_per_step, cfg.seed)
            step_prompts = [prompts[i] for i in chosen]
            step_truths = [tasks[i].ground_truth() for i in chosen]
            t0 = time.perf_counter()
            samples = engine.generate(step_prompts, replace(sampling, seed=generation_seed(cfg.seed, step)))
            generate_s = time.perf_counter() - t0
            flat = [s for row in samples for s in row]  # row b * k + j

            # 2. Rewards (B, k).
            B, k = len(step_prompts), cfg.k
            scores = reward_fn([p for p in step_prompts for _ in range(k)], [s.text for s in flat], [g for g in step_truths for _ in range(k)])
            if len(scores) != B * k:
                raise ValueError(f"the reward function returned {len(scores)} scores for {B * k} completions")
            raw = torch.tensor(scores, dtype=torch.float32).view(B, k)
            truncated = torch.tensor([s.finish_reason == "length" for s in flat], dtype=torch.float32).view(B, k)
            rewards = raw + cfg.truncation_penalty * truncated if cfg.truncation_penalty is not None else raw.clone()

            # 3. Log-probs before the update: reference, and the sampling policy when needed.
            t1 = time.perf_counter()
            batch = rollout_batch(tokenizer, step_prompts, samples).to(spec.device)
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

            # 6. Update: ppo_epochs optimizer steps on these samples (1: REINFORCE).
            epoch_metrics = []
            for epoch in range(cfg.ppo_epochs):
                loss_metrics, logprobs = policy_loss_backward(
                    model, batch, advantages.flatten().to(spec.device),
                    temperature=cfg.temperature, micro_batch_size=cfg.micro_batch_size, loss_mode=cfg.loss_mode,
                    old_logprobs=old_logprobs if cfg.ppo_epochs > 1 else None, clip_eps=clip_eps,
                    ref_logprobs=ref_logprobs, kl_coef=kl_coef, kl_estimator=cfg.kl_estimator,
                )  # fmt: skip
                if epoch == 0:
                    pre_update_logprobs = logprobs  # the sampling policy's log-probs
                epoch_metrics.append({**loss_metrics, **optimizer_step(setup, cfg.max_grad_norm)})
            update_s = time.perf_counter() - t1

            # 7. Metrics.
            completion_tokens = float(mask.sum())
            record = {
                "step": step + 1,
                "reward/mean": raw.mean().item(),
                "reward/std": raw.std(unbiased=False).item(),
                "reward/accuracy": (raw == 1.0).float().mean().item(),
                "reward/format_rate": (raw >= 0.1).float().mean().item(),
                "reward/shaped_mean": rewards.mean().item(),
                "adv/mean": advantages.mean().item(),
                "adv/std": advantages.std(unbiased=False).item(),
                "entropy": -masked_mean(pre_update_logprobs, mask).item(),
                "completion/mean_tokens": completion_tokens / len(flat),
                "completion/truncated_frac": truncated.mean().item(),
            }
            if ref_model is not None:
                kl_seq = masked_sum(kl_penalty(pre_update_logprobs, ref_logprobs, cfg.kl_estimator), mask, dim=-1)
                record["kl/mean"] = kl_seq.mean().item()
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
            if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == total_steps):
                t2 = time.perf_counter()
                record.update(evaluate_heldout(engine, eval_tasks, eval_prompts, cfg.eval_max_new_tokens))
                record["time/eval_s"] = time.perf_counter() - t2
            setup.metrics.log(record)
            info = f"reward {record['reward/mean']:.3f}" + (f"  kl {record['kl/mean']:.4f}" if "kl/mean" in record else "")
            progress.update(bar, advance=1, info=info)
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < total_steps:
                save_checkpoint(run_dir, step + 1, model, tokenizer, setup.optimizer, setup.scheduler, keep=cfg.keep_checkpoints)
    final = run_dir / "model"
    save_model_folder(final, model, tokenizer)
    console.print(f"[green]RLOO done[/]: model saved to {final}")
    return final
