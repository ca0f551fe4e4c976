"""The optimizer and its learning-rate schedule, as :func:`rlft.recipes.common.prepare_training` builds them
(``--optimizer``, ``--lr``, ``--weight-decay``, ``--schedule``, ``--warmup-ratio``), and the schedule's rate on
resume."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("rlft")


OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
"""The optimizers ``prepare_training`` builds, by name (SGD: plain, no momentum)."""


FUSED_ADAMW_DEVICES: tuple[str, ...] = ("cuda",)
"""Device types whose AdamW runs torch's fused kernel (one launch for every parameter, instead of the ``foreach``
kernels' several per group); not on CPU, where it would change every recorded run's rounding."""


def optimizer_kernels(name: str, params: list, sharded: bool) -> dict[str, bool]:
    """Extra keyword arguments of optimizer ``name`` for ``params`` (tensors or parameter-group dicts):
    ``{"fused": True}`` for AdamW when every parameter lies on a device type of :data:`FUSED_ADAMW_DEVICES` and
    the model is not sharded (FSDP2's DTensors keep the default), as transformers' Trainer does with its default
    ``adamw_torch_fused``; else ``{}`` (torch's default kernels). The update is AdamW's either way."""
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    on_device = bool(tensors) and all(p.device.type in FUSED_ADAMW_DEVICES for p in tensors)
    return {"fused": True} if name == "adamw" and on_device and not sharded else {}


def make_scheduler(name: str, optimizer, warmup_steps: int, total_steps: int):
    """``cosine`` / ``linear`` decay or ``constant`` after linear warmup (transformers' schedulers)."""
    from transformers import get_scheduler

    hf_name = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[name]
    return get_scheduler(hf_name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


def set_rate_on_resume(optimizer, scheduler, start_step: int, total_steps: int) -> None:
    """After a resume: each parameter group's learning rate set to this run's schedule at the resumed step (the
    scheduler's ``base_lrs`` times its ``lr_lambdas`` at ``last_epoch``). The checkpoint holds the rate of the schedule
    it was saved under; with the same ``--max-steps`` the two are the same number, but a longer one redraws a cosine
    or linear decay (and the warm-up) over ``total_steps``, and without this the first resumed step would apply the
    old schedule's rate (0 at the end of a cosine run). A change of rate is logged as a warning."""
    rates = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    before = optimizer.param_groups[0]["lr"]
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"] = rate
    if rates[0] != before:
        log.warning("--resume: the learning-rate schedule is redrawn over %d steps; step %d applies %.4g, not the "
                    "checkpoint's %.4g", total_steps, start_step + 1, rates[0], before)
