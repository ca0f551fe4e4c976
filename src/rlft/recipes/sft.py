"""Supervised fine-tuning: next-token NLL on completion tokens, one linear loop.

Data sources (``--data``):
- ``countdown``: tasks from the local generator (``--preset``) with solver-written reasoning traces;
- a local ``.jsonl``/``.json``/``.parquet`` file or a Hub dataset id, in one of two layouts,
  detected from the columns or forced with ``--data-format``: ``prompt``/``completion`` text pairs, or
  cog_behav's ``query``/``completion``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from rlft.checkpoint import save_checkpoint, save_model_folder
from rlft.console import console, training_progress
from rlft.data.files import DataError, read_rows
from rlft.data.tokenize import TokenizedExample, collate, tokenize_prompt_completion
from rlft.losses.sft import sft_loss
from rlft.models import DEFAULT_MODEL, load_tokenizer, pick_device
from rlft.recipes.common import batch_indices, optimizer_step, prepare_training, start_run_dir
from rlft.ops import sequence_logprobs
from rlft.types import PromptCompletion

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning on prompt/completion pairs (loss on completion tokens + EOS only)."""

    model: str = DEFAULT_MODEL
    """Model to fine-tune: built-in name, local HF folder, or Hub id (e.g. Qwen/Qwen2.5-0.5B)."""
    data: str = "countdown"
    """'countdown' (generated tasks + solver traces), or a .jsonl/.json/.parquet file or Hub dataset id."""
    data_format: Literal["auto", "prompt_completion", "cog_behav"] = "auto"
    """Layout of --data files: prompt/completion pairs or cog_behav query/completion; auto detects."""
    data_split: str = "train"
    """Split to read when --data is a Hub dataset id."""
    prompt_field: str = "prompt"
    """Column holding the prompt text (prompt_completion layout)."""
    completion_field: str = "completion"
    """Column holding the completion text (prompt_completion layout)."""
    skip_invalid: bool = False
    """Skip malformed rows (counted and reported) instead of stopping with an error."""
    limit: int | None = None
    """Use at most this many training examples (after reading)."""
    preset: str = "easy3"
    """Countdown difficulty preset for --data countdown (easy3, cog_behav, standard, ...)."""
    num_train: int = 2000
    """Number of generated Countdown training tasks (--data countdown)."""
    split_seed: int = 1234
    """Seed of the generated train/test split; evaluation uses the same seed for its held-out tasks."""
    heldout_size: int = 200
    """Generated tasks reserved for evaluation: training never sees the first N held-out tasks of
    `rlft eval countdown --split-seed` (evaluate with --limit <= N)."""
    trace_style: Literal["direct", "search"] = "search"
    """Solver trace style: 'direct' (just the solution steps) or 'search' (dead ends, backtracking, check)."""
    max_dead_ends: int = 2
    """Most dead ends a 'search' trace shows before the solution."""
    prompt_template: str = "base"
    """Countdown prompt template: 'base' (TinyZero), 'chat' (the tokenizer's chat template)."""
    output_dir: str = "runs/sft"
    """Run directory: checkpoints/, model/, metrics.jsonl, config.yaml."""
    max_length: int = 512
    """Longest sequence in tokens; longer completions are truncated (and counted)."""
    batch_size: int = 16
    """Examples per optimizer step."""
    micro_batch_size: int = 8
    """Examples per forward/backward pass; gradients accumulate over batch_size/micro_batch_size passes."""
    epochs: float = 1.0
    """Passes over the data (fractions allowed); ignored when --max-steps is set."""
    max_steps: int | None = None
    """Total optimizer steps (overrides --epochs)."""
    lr: float = 1e-4
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_ratio: float = 0.05
    """Fraction of steps spent warming the learning rate up linearly from 0."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Learning-rate decay after warmup."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global L2 norm); 0 disables clipping."""
    seed: int = 0
    """Seed for model init randomness and data order."""
    save_every: int = 50
    """Write a resumable checkpoint every this many steps (0: only at the end)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
    resume: bool = False
    """Continue from the latest checkpoint in --output-dir (model, optimizer, scheduler, RNG, data position)."""
    device: str = "auto"
    """'auto' (CUDA if present, else CPU), 'cpu', 'cuda', 'cuda:1', ..."""
    dtype: str = "auto"
    """'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'."""


def _countdown_pairs(cfg: SFTConfig, tokenizer) -> list[PromptCompletion]:
    from rlft.tasks.countdown.generator import PRESETS, make_splits
    from rlft.tasks.countdown.prompts import render_prompt
    from rlft.tasks.countdown.traces import write_trace

    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown Countdown preset {cfg.preset!r}; choose from {sorted(PRESETS)}")
    train, _ = make_splits(PRESETS[cfg.preset], cfg.num_train, cfg.heldout_size, cfg.split_seed)
    return [
        PromptCompletion(
            render_prompt(cfg.prompt_template, task, tokenizer),
            write_trace(task, cfg.trace_style, max_dead_ends=cfg.max_dead_ends, seed=cfg.split_seed + i),
        )
        for i, task in enumerate(train)
    ]


def _detect_format(row: dict, cfg: SFTConfig) -> str:
    if cfg.data_format != "auto":
        return cfg.data_format
    # A row with `query` and no prompt column is cog_behav even if it lacks its completion (a
    # malformed first row must not switch the whole file to the other layout).
    if "query" in row and ("completion" in row or cfg.prompt_field not in row):
        return "cog_behav"
    return "prompt_completion"


def _file_pairs(cfg: SFTConfig) -> list[PromptCompletion]:
    pairs, skipped, fmt = [], 0, None
    for i, row in read_rows(cfg.data, split=cfg.data_split):
        try:
            if isinstance(row, DataError):
                raise row
            fmt = fmt or _detect_format(row, cfg)
            fields = ("query", "completion") if fmt == "cog_behav" else (cfg.prompt_field, cfg.completion_field)
            for field in fields:
                if field not in row:
                    raise DataError(cfg.data, i, field, "missing")
                if not isinstance(row[field], str):
                    raise DataError(cfg.data, i, field, f"expected a string, got {type(row[field]).__name__}")
            prompt, completion = row[fields[0]], row[fields[1]]
            if not completion.strip():
                raise DataError(cfg.data, i, fields[1], "empty completion")
        except DataError:
            if not cfg.skip_invalid:
                raise
            skipped += 1
            continue
        if fmt == "cog_behav" and not (prompt[-1:].isspace() or completion[:1].isspace()):
            prompt += "\n"  # cog_behav queries end at "step by step." and completions start at "<think>"
        pairs.append(PromptCompletion(prompt, completion))
    if skipped:
        log.warning("skipped %d invalid rows of %s (--skip-invalid)", skipped, cfg.data)
    return pairs


def load_sft_pairs(cfg: SFTConfig, tokenizer) -> list[PromptCompletion]:
    """The training pairs named by ``cfg.data`` (see the module docstring), limited to ``cfg.limit``."""
    pairs = _countdown_pairs(cfg, tokenizer) if cfg.data == "countdown" else _file_pairs(cfg)
    if cfg.limit is not None:
        pairs = pairs[: cfg.limit]
    if not pairs:
        raise ValueError(f"no training examples in {cfg.data}")
    return pairs


def tokenize_pairs(pairs: list[PromptCompletion], tokenizer, max_length: int) -> list[TokenizedExample]:
    """Tokenize all pairs; report how many were truncated and how many dropped (prompt too long)."""
    examples, dropped = [], 0
    for pair in pairs:
        example = tokenize_prompt_completion(tokenizer, pair.prompt, pair.completion, max_length=max_length)
        if example is None:
            dropped += 1
        else:
            examples.append(example)
    truncated = sum(e.truncated for e in examples)
    log.info("%d examples; %d truncated to %d tokens; %d dropped (prompt alone too long)", len(examples), truncated, max_length, dropped)
    if not examples:
        raise ValueError(f"every example's prompt is longer than max_length={max_length}")
    return examples


def train_sft(cfg: SFTConfig) -> Path:
    """Run SFT as configured; returns the folder of the final model (``output_dir/model``)."""
    if cfg.batch_size % cfg.micro_batch_size:
        raise ValueError(f"batch_size {cfg.batch_size} must be a multiple of micro_batch_size {cfg.micro_batch_size}")
    run_dir = start_run_dir(cfg.output_dir, cfg)
    torch.manual_seed(cfg.seed)
    spec = pick_device(cfg.device, cfg.dtype)
    tokenizer = load_tokenizer(cfg.model)
    examples = tokenize_pairs(load_sft_pairs(cfg, tokenizer), tokenizer, cfg.max_length)

    steps_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))
    setup = prepare_training(cfg.model, run_dir, spec, resume=cfg.resume, lr=cfg.lr, weight_decay=cfg.weight_decay,
                             schedule=cfg.schedule, warmup_steps=int(cfg.warmup_ratio * total_steps), total_steps=total_steps)
    model, start_step = setup.model, setup.start_step
    log.info("SFT: %d examples, %d steps of %d (micro-batch %d) on %s/%s", len(examples), total_steps, cfg.batch_size, cfg.micro_batch_size, spec.device, str(spec.dtype).removeprefix("torch."))

    with training_progress("sft") as progress:
        bar = progress.add_task("sft", total=total_steps, completed=start_step, info="")
        for step in range(start_step, total_steps):
            t0 = time.perf_counter()
            chosen = [examples[i] for i in batch_indices(step, len(examples), cfg.batch_size, cfg.seed)]
            num_tokens = sum(sum(e.loss_mask) for e in chosen)
            loss_total, seen = 0.0, 0
            for start in range(0, len(chosen), cfg.micro_batch_size):
                batch = collate(chosen[start : start + cfg.micro_batch_size], tokenizer.pad_token_id).to(spec.device)
                logprobs = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
                loss, _ = sft_loss(logprobs, batch.loss_mask, num_tokens=num_tokens)
                loss.backward()
                loss_total += loss.item()
                seen += int(batch.attention_mask.sum())
            step_info = optimizer_step(setup, cfg.max_grad_norm)
            elapsed = time.perf_counter() - t0
            record = {
                "step": step + 1,
                "epoch": (step + 1) / steps_per_epoch,
                "loss/sft": loss_total,
                **step_info,
                "tokens": seen,
                "tokens_per_s": seen / elapsed,
            }
            setup.metrics.log(record)
            progress.update(bar, advance=1, info=f"loss {loss_total:.3f}  {seen / elapsed:.0f} tok/s")
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < total_steps:
                save_checkpoint(run_dir, step + 1, model, tokenizer, setup.optimizer, setup.scheduler, keep=cfg.keep_checkpoints)
    final = run_dir / "model"
    save_model_folder(final, model, tokenizer)
    console.print(f"[green]SFT done[/]: model saved to {final}")
    return final
