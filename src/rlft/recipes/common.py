"""Pieces every training recipe shares: run folder, model + optimizer + scheduler with resume,
seeded batch order, and the optimizer step. Recipes keep their own loops."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import yaml

from rlft.checkpoint import MetricsLog, latest_checkpoint, load_trainer_state
from rlft.models import DeviceSpec, load_model

if TYPE_CHECKING:
    from rlft.lora import LoRASettings

log = logging.getLogger("rlft")


def start_run_dir(output_dir: str, cfg) -> Path:
    """Create the run folder and record the config there as ``config.yaml``."""
    run_dir = Path(output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
    return run_dir


def make_scheduler(name: str, optimizer, warmup_steps: int, total_steps: int):
    """``cosine`` / ``linear`` decay or ``constant`` after linear warmup (transformers' schedulers)."""
    from transformers import get_scheduler

    hf_name = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[name]
    return get_scheduler(hf_name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


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


OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
"""The optimizers ``prepare_training`` builds, by name (SGD: plain, no momentum)."""


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


def prepare_training(
    model_name: str,
    run_dir: Path,
    spec: DeviceSpec,
    *,
    resume: bool,
    lr: float,
    weight_decay: float,
    schedule: str,
    warmup_steps: int,
    total_steps: int,
    optimizer: str = "adamw",
    load: Callable[[str, DeviceSpec], torch.nn.Module] | None = None,
    param_groups: Callable[[torch.nn.Module], list[dict]] | None = None,
    lora: "LoRASettings | None" = None,
) -> TrainingSetup:
    """Load the model (from the latest checkpoint when resuming), the optimizer, scheduler, metrics log.

    ``optimizer``: "adamw" (default) or "sgd" (plain SGD, no momentum: the update is ``lr`` times the
    clipped gradient, so its size follows the gradient's; see ``RLOOConfig.optimizer``). Raises
    ``ValueError`` for another name. ``load(name_or_folder, spec)`` builds the model (None: a causal LM
    by :func:`rlft.models.load_model`; the reward-model recipe passes its own); ``param_groups(model)``
    gives optimizer parameter groups (e.g. a separate rate for a new head; None: every parameter at
    ``lr``). ``lora``: wrap the model in LoRA adapters (:mod:`rlft.lora`; only they train; a resumed
    run loads the base model, then the checkpoint's adapter). Resuming restores weights,
    optimizer, scheduler, RNG and the step count; metrics logged after that checkpoint are dropped so the
    curve continues without a jump.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose 'adamw' or 'sgd'")
    ckpt = latest_checkpoint(run_dir) if resume else None
    model = (load or load_model)(str(ckpt) if ckpt and lora is None else model_name, spec)
    if lora is not None:
        from rlft.lora import apply_lora

        model = apply_lora(model, lora, adapter_from=ckpt)
    model.train()
    if param_groups is not None:
        params = param_groups(model)
    else:
        params = [p for p in model.parameters() if p.requires_grad]
    optim = OPTIMIZERS[optimizer](params, lr=lr, weight_decay=weight_decay)
    scheduler = make_scheduler(schedule, optim, warmup_steps, total_steps)
    start_step = 0
    if ckpt is not None:
        start_step = load_trainer_state(ckpt, optim, scheduler)["step"]
        log.info("resuming from %s at step %d", ckpt, start_step)
    elif resume:
        log.info("--resume: no checkpoint in %s, starting from scratch", run_dir)
    metrics = MetricsLog(run_dir / "metrics.jsonl", resume_step=start_step if ckpt else None)
    return TrainingSetup(model, optim, scheduler, start_step, metrics, ckpt)


def optimizer_step(setup: TrainingSetup, max_grad_norm: float) -> dict[str, float]:
    """Clip gradients, step optimizer and scheduler, zero gradients; returns lr used and grad norm."""
    params = [p for p in setup.model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
    lr = setup.scheduler.get_last_lr()[0]  # the rate this step applies
    setup.optimizer.step()
    setup.scheduler.step()
    setup.optimizer.zero_grad(set_to_none=True)
    return {"lr": lr, "grad_norm": float(grad_norm)}
