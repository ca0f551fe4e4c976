"""Supervised fine-tuning: next-token NLL on completion tokens, one linear loop.

Data sources (``--data``), one kind chosen once, before any row is read for training
(:func:`data_kind`), each read by one small function:

- ``countdown``: tasks from the local generator (``--preset``) with solver-written reasoning traces;
- a local ``.jsonl``/``.json``/``.parquet`` file or a Hub dataset id (``--data-split``), in one of three
  layouts, forced with ``--data-format`` or detected from the first row:

  * ``chat``: conversations, rendered with the model's chat template (``--chat-template`` to set or
    replace it) by :func:`rlft.data.chat.render_chat`; the loss is on every assistant turn and its
    end-of-turn token. Rows are read by :func:`rlft.data.preferences.load_chat_examples`:
    ``{"messages": [...]}`` (``HuggingFaceTB/smol-smoltalk`` ``train``, H4 ultrafeedback
    ``train_sft``), or, with ``--data-format chat``, preference rows (H4 ``train_prefs``, flattened
    ``prompt``/``chosen``/``rejected`` strings, HH-RLHF): prompt + chosen reply ("Pref-FT");
  * ``cog_behav``: ``query``/``completion`` text (``Asap7772/cog_behav_all_strategies``);
  * ``prompt_completion``: ``--prompt-field``/``--completion-field`` text pairs.

  Auto-detection (``--data-format auto``), from the first row that parses: a ``messages`` list ->
  ``chat``; a ``query`` column with a ``completion`` column or without the prompt column ->
  ``cog_behav``; anything else -> ``prompt_completion``. Preference rows are never auto-detected as
  Pref-FT: ask for it with ``--data-format chat``.

Malformed rows stop the run with a :class:`~rlft.data.files.DataError` (file, row, field), or with
``--skip-invalid`` are counted and reported. Truncation (``--max-length``) is counted and logged; the
counts also go to ``output_dir/data_stats.json``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from rlft import distributed
from rlft.checkpoint import read_metrics
from rlft.compute import RunTotals, parameter_count
from rlft.console import training_progress
from rlft.data.chat import ensure_chat_template, render_chat
from rlft.data.files import DataError, read_rows
from rlft.data.preferences import ChatExample, load_chat_examples
from rlft.data.packing import default_pack_length, pack_examples
from rlft.data.tokenize import TokenizedExample, collate, tokenize_segments
from rlft.losses.sft import sft_loss
from rlft.models import DEFAULT_MODEL
from rlft.lora import LoRAOptions
from rlft.options import DistributedOptions, MemoryOptions, PackingOptions, OptimizerOptions, RunOptions, SpeedOptions
from rlft.tasks.countdown.calc import trace_segments
from rlft.tasks.countdown.options import DEFAULT_NUM_TRAIN, CountdownOptions
from rlft.recipes.common import (batch_indices, begin_run, checkpoint_if_due, finish_run, micro_batch_label,
                                 optimizer_step, start_training, step_micro_batches, step_order, step_plan,
                                 write_data_stats)
from rlft.recipes.memory import packed_tokens, padded_tokens
from rlft.ops import sequence_logprobs
from rlft.types import CountdownTask, PromptCompletion
from rlft.validation import OptionError, check_step_count, validate_options

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class SFTConfig(RunOptions, OptimizerOptions, LoRAOptions, MemoryOptions, PackingOptions, SpeedOptions,
                DistributedOptions, CountdownOptions):
    """Supervised fine-tuning on prompt/completion pairs (loss on completion tokens + EOS only)."""

    model: str = DEFAULT_MODEL
    """Model to fine-tune: built-in name, local HF folder, or Hub id (e.g. Qwen/Qwen2.5-0.5B)."""
    data: str = "countdown"
    """'countdown' (generated tasks + solver traces), or a .jsonl/.json/.parquet file or Hub dataset id."""
    data_format: Literal["auto", "prompt_completion", "cog_behav", "chat"] = "auto"
    """Layout of --data files: prompt/completion text pairs, cog_behav query/completion, or chat
    conversations (a messages list; with 'chat' also preference rows: prompt + chosen reply, Pref-FT).
    auto: messages -> chat, query -> cog_behav, else prompt_completion."""
    data_split: str = "train"
    """Split to read when --data is a Hub dataset id (e.g. train for smol-smoltalk; train_sft or, for
    Pref-FT, train_prefs for HuggingFaceH4/ultrafeedback_binarized)."""
    chat_template: str | None = None
    """Chat template for chat data (and the saved model): a name (chatml, llama3) or a path to a .jinja
    file; None: the tokenizer's own (an error for chat data when it has none)."""
    prompt_field: str = "prompt"
    """Column holding the prompt text (prompt_completion layout)."""
    completion_field: str = "completion"
    """Column holding the completion text (prompt_completion layout)."""
    skip_invalid: bool = False
    """Skip malformed rows (counted and reported) instead of stopping with an error."""
    limit: int | None = None
    """Use at most this many training examples (after reading)."""
    num_train: int = DEFAULT_NUM_TRAIN
    """Number of generated Countdown training tasks (--data countdown)."""
    heldout_data: str | None = None
    """--data countdown: also drop generated training tasks equal to a held-out row (validation or test,
    rlft.tasks.countdown.splits) of this Countdown file or Hub dataset (e.g. ../shared/data/countdown/train.parquet),
    so `rlft eval countdown --data <it> --split test` scores tasks no trace showed. Dropped tasks are logged."""
    correct_only: bool = False
    """--data countdown: train only on the traces whose answer is correct (a 'bounded' search that did not give up):
    SFT on rejection-sampled data, a baseline for RL from a bounded-trace start. The kept count is logged."""
    trace_style: Literal["direct", "search", "bounded", "calc"] = "search"
    """Solver trace style: 'direct' (just the solution steps), 'search' (dead ends, backtracking, check), 'bounded'
    (ranked tries by a searcher who may give up with a wrong answer; ~48% of medium3 traces correct at --give-up 0.6)
    or 'calc' (bounded's, each try a calculator tool call; observations untrained; needs --prompt-template calc)."""
    max_dead_ends: int = 2
    """Most dead ends a 'search' trace shows before the solution."""
    give_up: float = 0.6
    """'bounded' traces: probability of giving up after each dead end (answering with the closest attempt)."""
    max_tries: int = 6
    """'bounded' traces: dead ends after which the searcher always gives up."""
    output_dir: str = "runs/sft"
    """Run directory: checkpoints/, model/, metrics.jsonl, config.yaml."""
    max_length: int = 512
    """Longest sequence in tokens; longer completions are truncated (and counted)."""
    batch_size: int = 16
    """Examples per optimizer step."""
    micro_batch_size: int = 8
    """Examples per forward/backward pass; gradients accumulate over batch_size/micro_batch_size passes
    (replaced by --max-tokens-per-micro-batch when that is set)."""
    epochs: float = 1.0
    """Passes over the data (fractions allowed); ignored when --max-steps is set."""
    max_steps: int | None = None
    """Total optimizer steps (overrides --epochs)."""
    max_tokens: int | None = None
    """A compute budget in trained tokens: the fewest optimizer steps whose batches (in the data order --seed fixes)
    hold at least this many tokens, prompt and completion (``flops/estimated`` = 6 N x tokens: pass an RL run's FLOPs
    / 6 N to match it). Replaces --epochs; not with --max-steps."""
    lr: float = 1e-4
    """Peak learning rate."""
    warmup_ratio: float = 0.05
    """Fraction of optimizer steps spent warming the learning rate up linearly from 0."""
    seed: int = 0
    """Seed for model init randomness and data order."""
    def __post_init__(self) -> None:
        validate_options(self)
        self._check_lora()
        self._check_distributed()
        self._check_micro_batches()
        self._check_countdown()
        if self.max_tokens is not None and self.max_steps is not None:
            raise OptionError("--max-tokens sets the number of steps: pass it or --max-steps, not both")
        setter = "--max-steps" if self.max_steps is not None else "--max-tokens" if self.max_tokens else None
        if setter and self.epochs != type(self).__dataclass_fields__["epochs"].default:
            raise OptionError(f"--epochs {self.epochs:g} is never read: {setter} sets the number of steps; pass one")


def countdown_train_tasks(cfg: SFTConfig) -> list[CountdownTask]:
    """The tasks ``--data countdown`` writes traces for, in order (trace i is seeded ``split_seed + i``): the generated
    training tasks, less those equal to a held-out row of ``--heldout-data`` (logged)."""
    train, _ = cfg.generated_tasks(cfg.num_train)
    if cfg.heldout_data is None:
        return train
    from rlft.tasks.countdown.splits import drop_heldout, load_split

    kept = drop_heldout(train, load_split(cfg.heldout_data).heldout_keys())
    log.info("dropped %d of %d generated tasks equal to a held-out row of %s",
             len(train) - len(kept), len(train), cfg.heldout_data)
    return kept


def _countdown_pairs(cfg: SFTConfig, tokenizer) -> list[PromptCompletion]:
    from rlft.tasks.countdown.prompts import render_prompt
    from rlft.tasks.countdown.traces import write_trace

    train = countdown_train_tasks(cfg)
    pairs = [PromptCompletion(render_prompt(cfg.prompt_template, task, tokenizer),
                              write_trace(task, cfg.trace_style, max_dead_ends=cfg.max_dead_ends,
                                          seed=cfg.split_seed + i, give_up=cfg.give_up, max_tries=cfg.max_tries))
             for i, task in enumerate(train)]
    if cfg.correct_only:
        from rlft.rewards.countdown import score_completions

        scores = score_completions([p.prompt for p in pairs], [p.completion for p in pairs],
                                   [t.ground_truth() for t in train])
        kept = [p for p, score in zip(pairs, scores) if score == 1.0]
        log.info("correct-only: kept %d of %d traces (the others give up with a wrong answer)", len(kept), len(pairs))
        pairs = kept
    return pairs


def _detect_format(row: dict, cfg: SFTConfig) -> str:
    """The layout of a file from its first row (see the module docstring)."""
    if isinstance(row.get("messages"), list):
        return "chat"
    # A row with `query` and no prompt column is cog_behav even if it lacks its completion (a
    # malformed first row must not switch the whole file to the other layout).
    if "query" in row and ("completion" in row or cfg.prompt_field not in row):
        return "cog_behav"
    return "prompt_completion"


def data_kind(cfg: SFTConfig) -> str:
    """``"countdown"``, ``"prompt_completion"``, ``"cog_behav"`` or ``"chat"``: decided once, from the
    config, or (``--data-format auto``) from the first row of ``--data`` that parses."""
    if cfg.data == "countdown":
        return "countdown"
    if cfg.data_format != "auto":
        return cfg.data_format
    first = next((row for _, row in read_rows(cfg.data, split=cfg.data_split) if isinstance(row, dict)), None)
    return "prompt_completion" if first is None else _detect_format(first, cfg)


def _string_field(cfg: SFTConfig, i: int, row: dict, field: str) -> str:
    if field not in row:
        hint = (" (a preference row? --data-format chat trains on prompt + chosen reply: Pref-FT)"
                if "chosen" in row else "")
        raise DataError(cfg.data, i, field, f"missing{hint}")
    if not isinstance(row[field], str):
        raise DataError(cfg.data, i, field, f"expected a string, got {type(row[field]).__name__}")
    return row[field]


def _text_rows(cfg: SFTConfig, prompt_field: str, completion_field: str) -> tuple[list[tuple[str, str]], dict]:
    """Valid (prompt, completion) strings of ``cfg.data`` and counts {rows, kept, skipped_invalid}."""
    rows, counts = [], {"rows": 0, "kept": 0, "skipped_invalid": 0}
    for i, row in read_rows(cfg.data, split=cfg.data_split):
        counts["rows"] += 1
        try:
            if isinstance(row, DataError):
                raise row
            prompt, completion = (_string_field(cfg, i, row, f) for f in (prompt_field, completion_field))
            if not completion.strip():
                raise DataError(cfg.data, i, completion_field, "empty completion")
        except DataError:
            if not cfg.skip_invalid:
                raise
            counts["skipped_invalid"] += 1
            continue
        rows.append((prompt, completion))
    if counts["skipped_invalid"]:
        log.warning("skipped %d invalid rows of %s (--skip-invalid)", counts["skipped_invalid"], cfg.data)
    counts["kept"] = len(rows)
    return rows, counts


def _prompt_completion_pairs(cfg: SFTConfig, tokenizer) -> tuple[list[PromptCompletion], dict]:
    rows, counts = _text_rows(cfg, cfg.prompt_field, cfg.completion_field)
    return [PromptCompletion(p, c) for p, c in rows], counts


def _cog_behav_pairs(cfg: SFTConfig, tokenizer) -> tuple[list[PromptCompletion], dict]:
    rows, counts = _text_rows(cfg, "query", "completion")
    # cog_behav queries end at "step by step." and completions start at "<think>": join with a newline.
    joined = [(q if q[-1:].isspace() or c[:1].isspace() else q + "\n", c) for q, c in rows]
    return [PromptCompletion(q, c) for q, c in joined], counts


def _chat_examples(cfg: SFTConfig, tokenizer) -> tuple[list[ChatExample], dict]:
    examples, counts = load_chat_examples(cfg.data, split=cfg.data_split, skip_invalid=cfg.skip_invalid)
    log.info("%s: %d conversations from %d rows (%d invalid rows skipped)", cfg.data, counts["kept"], counts["rows"],
             counts["skipped_invalid"])
    return examples, counts


def _countdown_source(cfg: SFTConfig, tokenizer) -> tuple[list[PromptCompletion], dict]:
    pairs = _countdown_pairs(cfg, tokenizer)
    return pairs, {"rows": len(pairs), "kept": len(pairs), "skipped_invalid": 0}


SOURCES = {"countdown": _countdown_source, "prompt_completion": _prompt_completion_pairs,
           "cog_behav": _cog_behav_pairs, "chat": _chat_examples}
"""One reader per data kind: ``(cfg, tokenizer) -> (records, counts {rows, kept, skipped_invalid})``."""


def read_sft_data(cfg: SFTConfig, tokenizer,
                  kind: str | None = None) -> tuple[list[PromptCompletion] | list[ChatExample], dict]:
    """The training records of ``cfg.data`` (:class:`PromptCompletion` pairs, or :class:`ChatExample`
    conversations for ``kind == "chat"``), limited to ``cfg.limit``, and the reader's counts.

    ``kind``: from :func:`data_kind` when None.
    """
    records, counts = SOURCES[kind or data_kind(cfg)](cfg, tokenizer)
    if cfg.limit is not None:
        records = records[: cfg.limit]
    if not records:
        raise ValueError(f"no training examples in {cfg.data}")
    return records, counts


def load_sft_pairs(cfg: SFTConfig, tokenizer) -> list[PromptCompletion] | list[ChatExample]:
    """The training records named by ``cfg.data`` (see the module docstring), limited to ``cfg.limit``."""
    return read_sft_data(cfg, tokenizer)[0]


def _report(examples: list[TokenizedExample], dropped: int, max_length: int, why: str) -> list[TokenizedExample]:
    truncated = sum(e.truncated for e in examples)
    log.info("%d examples; %d truncated to %d tokens; %d dropped (%s)", len(examples), truncated, max_length, dropped,
             why)
    if not examples:
        raise ValueError(f"every example is dropped at max_length={max_length}: {why}")
    return examples


def tokenize_pairs(pairs: list[PromptCompletion], tokenizer, max_length: int) -> list[TokenizedExample]:
    """Tokenize prompt/completion pairs, tool observations untrained (:func:`rlft.data.tokenize.tokenize_segments`);
    report how many were truncated and how many dropped (prompt too long)."""
    examples = [tokenize_segments(tokenizer, p.prompt, trace_segments(p.completion), max_length=max_length)
                for p in pairs]
    kept = [e for e in examples if e is not None]
    return _report(kept, len(examples) - len(kept), max_length, "prompt alone too long")


def tokenize_chats(chats: list[ChatExample], tokenizer, max_length: int) -> list[TokenizedExample]:
    """Render conversations with the chat template, loss on every assistant turn (content + end-of-turn
    token, :func:`rlft.data.chat.render_chat`); report truncated and dropped ones."""
    examples = [render_chat(tokenizer, c.messages, train_on="all_assistant", max_length=max_length) for c in chats]
    kept = [e for e in examples if e is not None]
    return _report(kept, len(examples) - len(kept), max_length, "no assistant token within max_length")


TOKENIZERS = {"countdown": tokenize_pairs, "prompt_completion": tokenize_pairs, "cog_behav": tokenize_pairs,
              "chat": tokenize_chats}
"""The tokenization of each data kind: ``(records, tokenizer, max_length) -> examples``."""


def load_sft_examples(cfg: SFTConfig, tokenizer) -> tuple[list[TokenizedExample], dict]:
    """Read and tokenize the training data; returns the examples and data counts (also logged).

    Chat data needs a chat template: ``cfg.chat_template`` or the tokenizer's own (else a ValueError
    naming --chat-template). A set ``cfg.chat_template`` replaces the tokenizer's for every kind, so the
    saved model carries it.
    """
    kind = data_kind(cfg)
    if kind == "chat" or cfg.chat_template is not None:
        ensure_chat_template(tokenizer, cfg.chat_template)
    records, counts = read_sft_data(cfg, tokenizer, kind)
    examples = TOKENIZERS[kind](records, tokenizer, cfg.max_length)
    stats = {"data_kind": kind, **counts, "used": len(records), "examples": len(examples),
             "truncated": sum(e.truncated for e in examples), "dropped_too_long": len(records) - len(examples),
             "max_length": cfg.max_length}
    return examples, stats


def micro_batch_logprobs(model, examples: list[TokenizedExample], pad_token_id: int, device, cfg: SFTConfig
                         ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(logprobs, loss_mask, real_tokens)`` of one micro-batch: per-token log-probs and loss mask, both
    ``(B, T)`` right-padded, or ``(R, L)`` packed rows with ``cfg.packing``, and the non-padding token count."""
    if cfg.packing:
        lengths = [len(e.input_ids) for e in examples]
        pack_length = cfg.pack_length or default_pack_length(model, lengths)
        packed = pack_examples(examples, pad_token_id, pack_length).to(device)
        logprobs = sequence_logprobs(model, packed.input_ids, None, packed.loss_mask, position_ids=packed.position_ids,
                                     logits_chunk_size=cfg.logits_chunk_size)
        return logprobs, packed.loss_mask, packed.num_tokens
    batch = collate(examples, pad_token_id).to(device)
    chunking = {"logits_chunk_size": cfg.logits_chunk_size} if cfg.logits_chunk_size else {}  # default: the plain call
    logprobs = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, **chunking)
    return logprobs, batch.loss_mask, int(batch.attention_mask.sum())


def micro_batch_tokens(cfg: SFTConfig):
    """The size ``--max-tokens-per-micro-batch`` bounds, of a list of examples: padded tokens (rows x longest),
    or with ``cfg.packing`` real tokens (:mod:`rlft.recipes.memory`)."""
    measure = packed_tokens if cfg.packing else padded_tokens
    return lambda examples: measure([len(e.input_ids) for e in examples])


def sft_backward(model, examples: list[TokenizedExample], cfg: SFTConfig, pad_token_id: int,
                 device) -> tuple[float, int]:
    """The forward and backward passes of one optimizer step: ``examples`` are the whole step's (every rank's),
    ordered by :func:`rlft.recipes.common.step_order`; this rank runs its micro-batches
    (:func:`rlft.recipes.common.step_micro_batches`: ``--micro-batch-size`` or ``--max-tokens-per-micro-batch``),
    each NLL divided by the whole step's target-token count, so the accumulated gradient is the step's token-mean
    NLL's however it is cut (FSDP2's filler passes add zero). Returns ``(loss, real tokens)`` of this rank's
    passes (sum both over ranks)."""
    num_tokens = sum(sum(e.loss_mask) for e in examples)  # of the global batch, on every rank
    loss_total, seen = 0.0, 0
    for part, real in step_micro_batches(examples, cfg, micro_batch_tokens(cfg), distributed.sharded(model)):
        logprobs, loss_mask, n = micro_batch_logprobs(model, part, pad_token_id, device, cfg)
        loss, _ = sft_loss(logprobs, loss_mask, num_tokens=num_tokens)
        if not real:
            (loss * 0.0).backward()
            continue
        loss.backward()
        loss_total += loss.item()
        seen += n
    return loss_total, seen


def steps_for_tokens(lengths: list[int], batch_size: int, seed: int, budget: int, capped: bool = False) -> int:
    """The fewest optimizer steps whose batches (:func:`rlft.recipes.common.batch_indices` of ``seed``) hold at least
    ``budget`` tokens in all, ``lengths[i]`` being example i's (prompt + completion): ``--max-tokens``' step count.

    Every epoch is a permutation of all the examples, so it holds ``sum(lengths)`` tokens: the whole epochs before the
    budget is met come by division, and only the last one is walked, batch by batch (at most ``ceil(len(lengths) /
    batch_size)``). ``capped``: refuse a count over :data:`rlft.validation.MAX_STEPS` (OptionError naming
    ``--max-tokens``), before walking. Raises ValueError: ``lengths`` hold no token."""
    if budget <= 0:
        return 0
    per_epoch, epoch_tokens = math.ceil(len(lengths) / batch_size), sum(lengths)
    if epoch_tokens <= 0:
        raise ValueError("steps_for_tokens: the examples hold no token")
    epochs = (budget - 1) // epoch_tokens  # whole epochs that stay below the budget
    source = f"--max-tokens {budget} ({budget / epoch_tokens:.3g} epochs of {epoch_tokens:,} tokens)"
    if capped:
        check_step_count(epochs * per_epoch + 1, source)  # a lower bound: refused before the walk
    order = batch_indices(epochs, len(lengths), len(lengths), seed)  # the last epoch's order: one batch of them all
    left, pos, tokens = budget - epochs * epoch_tokens, 0, 0
    while tokens < left:  # ends within the epoch: it holds epoch_tokens >= left
        tokens += sum(lengths[i] for i in order[pos * batch_size : (pos + 1) * batch_size])
        pos += 1
    if capped:
        check_step_count(epochs * per_epoch + pos, source)
    return epochs * per_epoch + pos


def train_sft(cfg: SFTConfig) -> Path:
    """Run SFT as configured; returns the folder of the final model (``output_dir/model``).

    Under torchrun each rank trains on its :func:`rlft.distributed.shard` of every step's batch, with the
    loss divided by the whole batch's target-token count and gradients summed over ranks, so the run
    equals the one-process run (up to float rounding); rank 0 writes every file."""
    run, spec, tokenizer = begin_run(cfg)  # refuses a folder holding another run; writes nothing yet
    examples, stats = load_sft_examples(cfg, tokenizer)
    steps_per_epoch, total_steps = step_plan(len(examples), cfg)  # refuses an absurd count before the folder is made
    if cfg.max_tokens is not None:
        lengths = [len(e.input_ids) for e in examples]
        total_steps = steps_for_tokens(lengths, cfg.batch_size, cfg.seed, cfg.max_tokens, capped=True)
    run_dir = run.open()
    write_data_stats(run_dir, stats)
    setup, tracker = start_training(cfg, run_dir, spec, total_steps)
    model, start_step = setup.model, setup.start_step
    history = read_metrics(run_dir / "metrics.jsonl") if start_step else []
    totals = RunTotals.restored(parameter_count(model), history)  # tokens and FLOPs so far (rlft.compute)
    log.info("SFT: %d examples, %d steps of %d (%s) on %s (%s)", len(examples), total_steps, cfg.batch_size,
             micro_batch_label(cfg), spec.device, spec.label)

    with training_progress("sft") as progress:
        bar = progress.add_task("sft", total=total_steps, completed=start_step, info="")
        for step in range(start_step, total_steps):
            t0 = time.perf_counter()
            indices = batch_indices(step, len(examples), cfg.batch_size, cfg.seed)
            chosen = [examples[i] for i in step_order(indices, lambda i: len(examples[i].input_ids), cfg)]
            loss_total, seen = sft_backward(model, chosen, cfg, tokenizer.pad_token_id, spec.device)
            summed, seen = distributed.all_reduce_counted({"loss": loss_total}, seen)
            loss_total = summed["loss"]
            trained = float(sum(sum(e.loss_mask) for e in chosen))
            compute = totals.add(0, {"generated_tokens": 0.0, "trained_tokens": trained,
                                     "trained_seq_tokens": float(seen), "scored_tokens": 0.0})
            step_info = optimizer_step(setup, cfg.max_grad_norm, loss=loss_total)  # stops on a non-finite loss/gradient
            elapsed = time.perf_counter() - t0
            record = {"step": step + 1, "epoch": (step + 1) / steps_per_epoch, "loss/sft": loss_total, **step_info,
                      "tokens": seen, "tokens_per_s": seen / elapsed,
                      **{key: compute[key] for key in ("tokens/trained", "tokens/trained_total", "flops/estimated")}}
            setup.metrics.log(record)
            progress.update(bar, advance=1, info=f"loss {loss_total:.3f}  {seen / elapsed:.0f} tok/s")
            checkpoint_if_due(setup, run_dir, step + 1, total_steps, tokenizer, cfg)
    return finish_run(run_dir, model, tokenizer, cfg, tracker, "SFT")
