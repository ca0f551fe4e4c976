"""Pieces every training recipe shares: run folder, model + optimizer + scheduler with resume,
seeded batch order, and the optimizer step. Recipes keep their own loops.

The supervised recipes (sft, dpo, rm) start the same way::

    run, spec, tokenizer = begin_run(cfg)          # claims the output folder; writes nothing
    examples, stats = ...                          # read and tokenize the data (the recipe's own)
    steps_per_epoch, total_steps = step_plan(len(examples), cfg)   # refuses an absurd count: no folder made yet
    run_dir = run.open(); write_data_stats(run_dir, stats)
    setup, tracker = start_training(cfg, run_dir, spec, total_steps)
    ...                                            # the loop: batch_indices, optimizer_step, checkpoint_if_due
    return finish_run(run_dir, setup.model, tokenizer, cfg, tracker, "SFT")

Every optimizer step is guarded (:func:`optimizer_step`): a non-finite loss or gradient norm stops the run with
:class:`rlft.precision.NonFiniteError` before the update is applied, and weights holding NaN or infinity are never
saved (:func:`save_training_checkpoint`, :func:`save_final`), so the last checkpoint written stays the last good state
and no final model is written. Training float16 weights is refused (:func:`rlft.precision.check_training_dtype`).

Run folders (refusing to overwrite another run, config checks on resume, config.yaml written with the
first checkpoint) are :mod:`rlft.run_folder`'s; its names are re-exported here."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import torch

from rlft import distributed
from rlft.console import console
from rlft.checkpoint import (MetricsLog, checkpoint_folders, save_checkpoint, checkpoint_problem, count_metrics,
                             read_trainer_state, restore_trainer_state)
from rlft.fsio import atomic_write_json
from rlft.models import DeviceSpec, load_model, load_tokenizer, pick_device
from rlft.options import resolved_strategy
from rlft.precision import NonFiniteError, check_training_dtype, is_finite, non_finite_tensors
from rlft.recipes.memory import check_scale_options, compile_layers, cut_by_tokens, enable_gradient_checkpointing
from rlft.recipes.optim import OPTIMIZERS, make_scheduler, optimizer_kernels, set_rate_on_resume
from rlft.run_folder import RunFolder, RunFolderError, claim_run_dir, write_run_config  # noqa: F401 (re-exported)
from rlft.tracking import Tracker, attach_tracker
from rlft.validation import check_step_count

if TYPE_CHECKING:
    from rlft.lora import LoRASettings
    from rlft.options import OptimizerOptions

log = logging.getLogger("rlft")


def start_run_dir(output_dir: str, cfg) -> Path:
    """Claim and open the run folder at once (:func:`rlft.run_folder.claim_run_dir` then
    :meth:`~rlft.run_folder.RunFolder.open`); writes no ``config.yaml`` (see :mod:`rlft.run_folder`).
    Prefer claiming first and opening once the inputs are validated."""
    return claim_run_dir(cfg, output_dir).open()


def begin_run(cfg) -> tuple[RunFolder, DeviceSpec, Any]:
    """The start of a supervised recipe, in this order: check the scale options
    (:func:`rlft.recipes.memory.check_scale_options`), join the process group (under torchrun only,
    :func:`rlft.distributed.init`), claim ``cfg.output_dir`` (:func:`claim_run_dir`: refuses a folder holding
    another run; writes nothing), seed torch with ``cfg.seed``, pick the device (``cfg.device``, ``cfg.dtype``)
    and load ``cfg.model``'s tokenizer. Returns ``(run, spec, tokenizer)``: open ``run`` once the data is read
    and valid."""
    check_scale_options(cfg)
    distributed.init(cfg.device)  # under torchrun only
    run = claim_run_dir(cfg)
    torch.manual_seed(cfg.seed)
    return run, pick_device(cfg.device, cfg.dtype), load_tokenizer(cfg.model)


DATA_STATS = "data_stats.json"


def write_data_stats(run_dir: Path, stats: dict) -> None:
    """Write the data counts ``stats`` (JSON-able) to ``run_dir/data_stats.json``, atomically, on rank 0 only."""
    if distributed.is_main():
        atomic_write_json(Path(run_dir) / DATA_STATS, stats)


def step_plan(num_examples: int, cfg) -> tuple[int, int]:
    """``(steps_per_epoch, total_steps)``: ``ceil(num_examples / cfg.batch_size)`` optimizer steps an epoch;
    ``cfg.max_steps`` steps in all when set, else ``cfg.epochs`` epochs (fractions rounded up; at least 1 step).
    Call it before the run folder is opened. Raises OptionError: more than :data:`rlft.validation.MAX_STEPS` steps."""
    steps_per_epoch = math.ceil(num_examples / cfg.batch_size)
    if cfg.max_steps:
        return steps_per_epoch, cfg.max_steps
    check_step_count(cfg.epochs * steps_per_epoch, f"--epochs {cfg.epochs:g} ({steps_per_epoch:,} steps an epoch)")
    return steps_per_epoch, max(1, math.ceil(cfg.epochs * steps_per_epoch))


def batch_indices(step: int, num_examples: int, batch_size: int, seed: int) -> list[int]:
    """Example indices of optimizer step ``step``: a fresh seeded permutation each epoch.

    A pure function of its arguments, so a resumed run sees exactly the batches it would have seen.
    """
    per_epoch = math.ceil(num_examples / batch_size)
    epoch, pos = divmod(step, per_epoch)
    perm = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return perm[pos * batch_size : (pos + 1) * batch_size].tolist()


def length_grouped(indices: list[int], length: Callable[[int], int], micro_batch_size: int) -> list[int]:
    """A step's example indices ordered by ``length(i)`` (stable) when they span more than one
    micro-batch, so each micro-batch pads only to lengths like its own; else ``indices`` unchanged.

    Every recipe accumulates a step's gradient as a sum over its micro-batches, each weighted by the
    whole step's normalisers, so the grouping changes only the padding (compute and memory) and float
    rounding, never which examples the step trains on or how much each counts.
    """
    if len(indices) <= micro_batch_size:
        return list(indices)
    return sorted(indices, key=length)


def step_order(indices: list[int], length: Callable[[int], int], cfg) -> list[int]:
    """:func:`length_grouped` with ``cfg``'s micro-batch rule: by ``cfg.micro_batch_size``, or always sorted
    when ``cfg.max_tokens_per_micro_batch`` is set (micro-batches then hold any number of examples)."""
    return length_grouped(indices, length,
                          1 if getattr(cfg, "max_tokens_per_micro_batch", None) else cfg.micro_batch_size)


def micro_batch_label(cfg) -> str:
    """``"micro-batch 8"`` or ``"micro-batches of <= 16384 tokens"`` (logs)."""
    budget = getattr(cfg, "max_tokens_per_micro_batch", None)
    return f"micro-batch {cfg.micro_batch_size}" if budget is None else f"micro-batches of <= {budget} tokens"


def step_micro_batches(items: list, cfg, size: Callable[[list], int], pad: bool) -> list[tuple[list, bool]]:
    """This rank's micro-batches of a step's (ordered) ``items``: ``[(chunk, real), ...]``.

    Without ``cfg.max_tokens_per_micro_batch``: :func:`rlft.distributed.padded_micro_batches` of
    ``cfg.micro_batch_size`` items. With it: this rank's :func:`rlft.distributed.shard` of ``items`` cut by
    :func:`rlft.recipes.memory.cut_by_tokens` so that ``size(chunk)`` stays within the budget (an item over it
    alone); with ``pad`` (FSDP2: every pass is collective) a rank with fewer chunks than the busiest one gets
    filler passes ``(items[:1], False)`` (collective: call on every rank). The recipes weight every chunk by the
    whole step's normalisers, so how the items are cut changes float rounding only."""
    budget = getattr(cfg, "max_tokens_per_micro_batch", None)
    if budget is None:
        return distributed.padded_micro_batches(items, cfg.micro_batch_size, pad)
    chunks = [(chunk, True) for chunk in cut_by_tokens(distributed.shard(items), size, budget)]
    if pad and items:
        chunks += [(items[:1], False)] * (distributed.most(len(chunks)) - len(chunks))
    return chunks


@dataclass
class TrainingSetup:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    start_step: int
    """Optimizer steps already done (0 for a fresh run)."""
    metrics: MetricsLog
    checkpoint: Path | None
    """The checkpoint resumed from, if any."""
    run_dir: Path | None = None
    """The run folder (named in the error of a non-finite step)."""
    step: int = 0
    """Steps finished: ``start_step``, then each step's number as :func:`checkpoint_if_due` is called after it (the
    step :func:`optimizer_step` takes is ``step + 1``)."""
    trainer_state: dict | None = None
    """The resumed checkpoint's ``trainer_state.pt`` (its recipe's own keys too, written through
    :func:`checkpoint_if_due`'s ``extra_state``, e.g. RL's ``replay``); None for a fresh run."""


def prepare_training(
    model_name: str,
    run_dir: Path,
    spec: DeviceSpec,
    options: "OptimizerOptions",
    *,
    resume: bool,
    total_steps: int,
    load: Callable[[str, DeviceSpec], torch.nn.Module] | None = None,
    param_groups: Callable[[torch.nn.Module], list[dict]] | None = None,
    lora: "LoRASettings | None" = None,
    distributed_strategy: str = "ddp",
) -> TrainingSetup:
    """Load the model (from the latest checkpoint when resuming), the optimizer, scheduler, metrics log.

    ``options`` (:class:`rlft.options.OptimizerOptions`, usually the run's config): ``optimizer`` "adamw" or
    "sgd" (plain SGD, no momentum: the update is ``lr`` times the clipped gradient), ``lr``, ``weight_decay``,
    and the ``schedule`` over ``total_steps`` optimizer steps after ``int(warmup_ratio * total_steps)`` warmup
    steps. ``load(name_or_folder, spec)`` builds the model (None: a causal LM
    by :func:`rlft.models.load_model`; the reward-model recipe passes its own); ``param_groups(model)``
    gives optimizer parameter groups (e.g. a separate rate for a new head; None: every parameter at
    ``lr``). ``lora``: wrap the model in LoRA adapters (:mod:`rlft.lora`; only they train; a resumed
    run loads the base model, then the checkpoint's adapter). Resuming restores weights,
    optimizer, scheduler, RNG and the step count from the newest *usable* checkpoint: one that fails
    :func:`rlft.checkpoint.checkpoint_problem` or whose state or weights do not load is skipped with a
    warning naming what is wrong, and the previous one is tried. Metrics logged after the resumed step
    are dropped so the curve continues without a jump; earlier ones are kept.

    Under torchrun (:mod:`rlft.distributed`): every rank loads the same checkpoint; the model is prepared
    by :func:`rlft.distributed.wrap_model` with ``distributed_strategy`` (rank 0's weights broadcast)
    before the optimizer is built; only rank 0 writes ``metrics.jsonl`` (the others get a log that
    writes nothing). Not distributed: nothing changes.

    Raises:
        ValueError: an unknown ``optimizer``.
        OptionError: ``spec`` stores weights in float16 (:func:`rlft.precision.check_training_dtype`).
        RunFolderError: ``resume`` and no usable checkpoint while ``metrics.jsonl`` holds records
            (restarting would silently replace that run).
    """
    if options.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {options.optimizer!r}; choose 'adamw' or 'sgd'")
    check_training_dtype(spec.dtype)
    build = load or load_model

    def load_from(folder: Path | None) -> torch.nn.Module:
        """The model of checkpoint ``folder``, or (None) the initial ``model_name``; with LoRA, the base
        model with fresh adapters or the checkpoint's adapter."""
        if lora is None:
            return build(str(folder) if folder is not None else model_name, spec)
        from rlft.lora import apply_lora

        return apply_lora(build(model_name, spec), lora, adapter_from=folder)

    ckpt, model, state = _newest_usable_checkpoint(run_dir, load_from) if resume else (None, None, None)
    if model is None:
        model = load_from(None)
    model.train()
    model = distributed.wrap_model(model, distributed_strategy)
    if param_groups is not None:
        params = param_groups(model)
    else:
        params = [p for p in model.parameters() if p.requires_grad]
    optim = OPTIMIZERS[options.optimizer](params, lr=options.lr, weight_decay=options.weight_decay,
                                          **optimizer_kernels(options.optimizer, params, distributed.sharded(model)))
    scheduler = make_scheduler(options.schedule, optim, int(options.warmup_ratio * total_steps), total_steps)
    start_step = 0
    if ckpt is not None:
        restore_trainer_state(state, optim, scheduler, model)
        start_step = state["step"]
        log.info("resuming from %s at step %d", ckpt, start_step)
        set_rate_on_resume(optim, scheduler, start_step, total_steps)
    if distributed.is_main():
        metrics = MetricsLog(run_dir / "metrics.jsonl", resume_step=start_step if ckpt else None)
    else:
        metrics = NullMetricsLog()
    return TrainingSetup(model, optim, scheduler, start_step, metrics, ckpt, Path(run_dir), start_step, state)


def start_training(cfg, run_dir: Path, spec: DeviceSpec, total_steps: int,
                   **prepare) -> tuple[TrainingSetup, Tracker | None]:
    """:func:`prepare_training` of ``cfg.model`` with the run's options (``cfg.resume``, LoRA from
    ``cfg.lora_settings()``, the torchrun strategy from :func:`rlft.options.resolved_strategy`; ``prepare``:
    its ``load`` / ``param_groups``), then gradient checkpointing when ``cfg.gradient_checkpointing``, the decoder
    layers compiled when ``cfg.compile`` (:func:`rlft.recipes.memory.compile_layers`), and the
    experiment tracker of ``cfg.report_to`` fed by the metrics log (:func:`rlft.tracking.attach_tracker`; None
    for ``none`` and on ranks other than 0). Returns ``(setup, tracker)``; :func:`finish_run` closes the tracker."""
    setup = prepare_training(cfg.model, run_dir, spec, cfg, resume=cfg.resume, total_steps=total_steps,
                             lora=cfg.lora_settings(), distributed_strategy=resolved_strategy(cfg, distributed.world()),
                             **prepare)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(setup.model)
    if getattr(cfg, "compile", False):
        log.info("--compile: %d decoder layers compiled (torch.compile, dynamic shapes); the first steps compile",
                 compile_layers(setup.model))
    return setup, attach_tracker(setup.metrics, cfg.report_to, run_dir, cfg)


def _newest_usable_checkpoint(run_dir: Path, load_from: Callable[[Path], torch.nn.Module]):
    """``(folder, model, trainer_state)`` of the newest checkpoint that verifies and whose state and
    model (``load_from(folder)``) load, or ``(None, None, None)`` when there is none and no metrics;
    see :func:`prepare_training`."""
    problems = []
    for folder in checkpoint_folders(run_dir):
        problem = checkpoint_problem(folder)
        if problem is None:
            try:
                state = read_trainer_state(folder)
                model = load_from(folder)
            except Exception as e:  # a damaged file the manifest could not catch (or an older checkpoint)
                problem = f"does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            else:
                if problems:
                    log.warning("--resume: skipped damaged checkpoint(s) %s; resuming from %s instead",
                                "; ".join(problems), folder.name)
                return folder, model, state
        problems.append(f"{folder.name}: {problem}")
    records = count_metrics(Path(run_dir) / "metrics.jsonl")
    if records:
        why = f" ({'; '.join(problems)})" if problems else ""
        raise RunFolderError(
            f"--resume: no usable checkpoint in {Path(run_dir) / 'checkpoints'}{why}, but metrics.jsonl holds "
            f"{records} records of a run; refusing to restart it. Pass --overwrite to start over")
    log.info("--resume: no checkpoint in %s, starting from scratch", run_dir)
    return None, None, None


class NullMetricsLog:
    """What ranks other than 0 log metrics to: nothing is written (same ``log`` / ``sink`` as
    :class:`rlft.checkpoint.MetricsLog`)."""

    path = None
    sink = None

    def log(self, record: dict) -> None:
        pass


def optimizer_step(setup: TrainingSetup, max_grad_norm: float, *, loss: float | None = None) -> dict[str, float]:
    """Sum gradients over ranks (torchrun with DDP: :func:`rlft.distributed.sum_gradients`; FSDP2 has
    already reduce-scattered them, summed, in the backward pass), clip them, step optimizer and
    scheduler, zero gradients; returns lr used and grad norm (of the summed gradient).

    ``loss``: the step's loss (the same number on every rank), checked when given.

    Raises:
        NonFiniteError: ``loss`` or the gradient norm is NaN or infinite ("step N: gradient norm is nan; ..."), raised
            before the optimizer applies anything (every rank alike: the norm is that of the summed gradient), so the
            weights stay those of the last finite step and nothing non-finite is written.
    """
    if loss is not None and not is_finite(loss):
        _stop(setup, f"loss is {float(loss)}")
    params = [p for p in setup.model.parameters() if p.requires_grad]
    if not distributed.sharded(setup.model):
        distributed.sum_gradients(params)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2: the norm of the whole gradient
        grad_norm = grad_norm.full_tensor()
    if not is_finite(grad_norm):
        setup.optimizer.zero_grad(set_to_none=True)
        _stop(setup, f"gradient norm is {float(grad_norm)}")
    lr = setup.optimizer.param_groups[0]["lr"]  # the rate this step applies (set by the scheduler, or on resume)
    setup.optimizer.step()
    setup.scheduler.step()
    setup.optimizer.zero_grad(set_to_none=True)
    return {"lr": lr, "grad_norm": float(grad_norm)}


def _stop(setup: TrainingSetup, what: str, step: int | None = None) -> NoReturn:
    """Raise :class:`NonFiniteError` for step ``step`` (default: the one under way), naming what stays on disk."""
    raise NonFiniteError(f"step {setup.step + 1 if step is None else step}: {what}; {last_good(setup.run_dir)}")


def last_good(run_dir: Path | None) -> str:
    """What a stopped run leaves: its newest checkpoint (resumable) or none; never a final model."""
    newest = checkpoint_folders(run_dir)[0] if run_dir is not None and checkpoint_folders(run_dir) else None
    kept = (f"the last good checkpoint {newest} stays (--resume continues from it)" if newest
            else "there is no checkpoint")
    return f"{kept}; no final model was written"


def check_finite_weights(model: torch.nn.Module, setup: TrainingSetup | None, step: int | None,
                         run_dir: Path | None = None) -> None:
    """Raise :class:`NonFiniteError` when the parameters hold NaN or infinity. A sharded model (FSDP2) is checked shard
    by shard and the count summed over ranks (collective: every rank raises together); DDP replicas are equal, so each
    rank checks its own (rank 0 alone may call it). Called before every save, so such weights never replace a good
    checkpoint or become the final model."""
    bad = non_finite_tensors(model.named_parameters())
    if (distributed.all_reduce_sum(float(len(bad))) if distributed.sharded(model) else len(bad)):
        what = ("the weights hold NaN or infinite values "
                f"({', '.join(bad[:3]) or 'on another rank'}{', ...' if len(bad) > 3 else ''})")
        if setup is not None:
            _stop(setup, what, step)
        raise NonFiniteError(f"{what}; {last_good(run_dir)}")


def save_training_checkpoint(setup: TrainingSetup, run_dir: Path, step: int, tokenizer, *, keep: int, config,
                             extra_state: dict | None = None) -> None:
    """:func:`rlft.checkpoint.save_checkpoint` of ``setup`` at ``step``, written by rank 0. Call it on every
    rank: a sharded model's full weights and optimizer state are gathered first (collective,
    :func:`rlft.distributed.full_state_dicts`); then every rank waits for the write (barrier). ``extra_state``: the
    recipe's own keys of ``trainer_state.pt`` (read back as :attr:`TrainingSetup.trainer_state`).

    Raises:
        NonFiniteError: the weights hold NaN or infinity (nothing written: the older checkpoints stay)."""
    check_finite_weights(setup.model, setup, step)
    model_state, optimizer_state = distributed.full_state_dicts(setup.model, setup.optimizer)
    if distributed.is_main():
        save_checkpoint(run_dir, step, setup.model, tokenizer, setup.optimizer, setup.scheduler, extra_state, keep=keep,
                        config=config, model_state=model_state, optimizer_state=optimizer_state)
    distributed.barrier()


def checkpoint_if_due(setup: TrainingSetup, run_dir: Path, step: int, total_steps: int, tokenizer, cfg,
                      extra_state: Callable[[], dict] | None = None) -> None:
    """After optimizer step ``step`` (1-based) of ``total_steps``: :func:`save_training_checkpoint` every
    ``cfg.save_every`` steps and after the last step (0: never), keeping ``cfg.keep_checkpoints``. The last step's
    checkpoint (as Hugging Face's Trainer saves at the end) lets ``--resume`` with a longer ``--max-steps`` go on
    from where the run ended instead of redoing the steps after the last multiple of ``save_every``. Call it on every
    rank. Records ``step`` as ``setup.step`` (the steps finished, named by :func:`optimizer_step`'s errors).
    ``extra_state()``: the recipe's own keys of ``trainer_state.pt``, called only when a checkpoint is written."""
    setup.step = step
    if cfg.save_every and (step % cfg.save_every == 0 or step == total_steps):
        save_training_checkpoint(setup, run_dir, step, tokenizer, keep=cfg.keep_checkpoints, config=cfg,
                                 extra_state=extra_state() if extra_state is not None else None)


def finish_run(run_dir: Path, model: torch.nn.Module, tokenizer, cfg, tracker, name: str) -> Path:
    """End of a recipe, on every rank: close the tracker, write the final model (:func:`save_final`) and, on rank 0,
    the run's ``config.yaml`` and a "<name> done" line; then a barrier. Returns ``run_dir/model``."""
    if tracker is not None:
        tracker.close()
    final = save_final(run_dir, model, tokenizer)
    if distributed.is_main():
        write_run_config(run_dir, cfg)
        console.print(f"[green]{name} done[/]: model saved to {final}")
    distributed.barrier()
    return final


def save_final(run_dir: Path, model: torch.nn.Module, tokenizer) -> Path:
    """:func:`rlft.lora.save_final_model` by rank 0; returns ``run_dir/model``. Call it on every rank: a sharded
    model's full weights are gathered first (collective). No barrier after it (the recipes write more files).

    Raises:
        NonFiniteError: the weights hold NaN or infinity: no final model is written (the last checkpoint stays)."""
    check_finite_weights(model, None, None, run_dir)
    model_state, _ = distributed.full_state_dicts(model)
    if distributed.is_main():
        from rlft.lora import save_final_model

        return save_final_model(run_dir, model, tokenizer, state_dict=model_state)
    return Path(run_dir) / "model"
