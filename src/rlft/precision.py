"""Numerical precision: the dtype weights are stored in, and the dtype matrix products compute in.

``--dtype`` (every command that loads a model, :func:`rlft.models.pick_device`) resolves to a
:class:`~rlft.models.DeviceSpec` with two dtypes:

- ``dtype``: what the weights (and so the optimizer state) are stored in;
- ``compute_dtype``: None, or the dtype ``torch.autocast`` computes forwards in.

``--dtype auto`` gives bfloat16 weights on CUDA (as before), and on a CPU with native bfloat16
arithmetic (the ``avx512_bf16`` or ``amx_bf16`` flag, :func:`cpu_bf16_native`) float32 master weights
and optimizer state with bfloat16 *compute* (mixed precision: ``torch.autocast("cpu", torch.bfloat16)``).
Everywhere else it is float32. ``--dtype float32`` forces float32 weights and compute.

Where the autocast applies: every training and log-prob forward goes through
:func:`rlft.ops.sequence_logprobs` or the reward model's scoring functions, which enter
:func:`compute_context` for the model they are given; a model carries its compute dtype as the attribute
``rlft_compute_dtype`` (:func:`mark`, set by :func:`rlft.models.load_model`). Models loaded only to
generate (evaluation, pair sampling) are loaded in the compute dtype directly
(:meth:`~rlft.models.DeviceSpec.for_inference`), and the RL loop samples from a bfloat16 copy of the
policy refreshed after every update (:class:`rlft.rollout.hf.HFEngine` ``sampler_dtype``), so decoding
never casts weights step by step.

Training refuses float16 *weights* (:func:`check_training_dtype`): ``--dtype float16`` stores the weights and the
optimizer state in float16 with no float32 master copy and no loss scaling, so small updates round to nothing and
gradients overflow (on a tiny model the loss is NaN from step 2). bfloat16 has float32's range and is trained as before;
float16 stays available where nothing is trained (evaluation, sampling, scoring).

Every training step is guarded (:func:`rlft.recipes.common.optimizer_step`): a non-finite loss or gradient norm, or
non-finite weights about to be saved, raise :class:`NonFiniteError` (one line: the step and the quantity) before the
optimizer applies the update, so no non-finite weight is ever written and the last checkpoint stays the run's last good
state.

Measured on this project's 2-core CPU (``bench/precision.py``): see docs/scale.md's speed section.
"""

from __future__ import annotations

import contextlib
import math
import os
from functools import lru_cache
from typing import Iterable

import torch

from rlft.provenance import cpu_bf16
from rlft.validation import OptionError

ATTRIBUTE = "rlft_compute_dtype"
"""The model attribute holding its autocast dtype (None or absent: no autocast)."""


@lru_cache(maxsize=1)
def _cpu_bf16_flags() -> frozenset[str]:
    """The CPU's bf16 flags (:func:`rlft.provenance.cpu_bf16`), read once."""
    return frozenset(cpu_bf16())


def cpu_bf16_native() -> bool:
    """True when this CPU computes bfloat16 natively: the ``avx512_bf16`` or ``amx_bf16`` flag of
    ``/proc/cpuinfo`` (Linux; False elsewhere). ``RLFT_CPU_BF16=1`` / ``0`` overrides the detection (tests,
    or a CPU whose flags are hidden by a hypervisor)."""
    forced = os.environ.get("RLFT_CPU_BF16")
    if forced is not None:
        return forced.strip() not in ("", "0", "false", "no")
    return bool({"avx512_bf16", "amx_bf16"} & _cpu_bf16_flags())


def mark(model: torch.nn.Module, compute_dtype: torch.dtype | None) -> torch.nn.Module:
    """Record ``compute_dtype`` (None: no autocast) on ``model`` for :func:`compute_context`; returns it."""
    setattr(_unwrapped(model), ATTRIBUTE, compute_dtype)
    return model


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DistributedDataParallel wrapper (peft models forward attribute reads themselves)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def compute_dtype_of(model: torch.nn.Module) -> torch.dtype | None:
    """The autocast dtype recorded on ``model`` by :func:`mark`, or None."""
    try:
        return getattr(_unwrapped(model), ATTRIBUTE, None)
    except AttributeError:  # a wrapper whose __getattr__ raises for unknown names
        return None


def compute_context(model: torch.nn.Module):
    """``torch.autocast(device, dtype)`` for the dtype recorded on ``model``, else a no-op context.

    Inside it, matrix products (linear layers, attention) run in that dtype while the weights, their
    gradients and everything autocast keeps in float32 (softmax, norms, losses) stay float32. The log-prob
    code converts logits to float32 before its log-softmax either way.
    """
    dtype = compute_dtype_of(model)
    if dtype is None:
        return contextlib.nullcontext()
    device = next(_unwrapped(model).parameters()).device
    return torch.autocast(device_type=device.type, dtype=dtype)


def dtype_name(dtype: torch.dtype | None) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``; None -> ``"none"``."""
    return "none" if dtype is None else str(dtype).removeprefix("torch.")


class NonFiniteError(RuntimeError):
    """A training step met a non-finite loss, gradient norm or weight: the run stops before the update is applied (the
    command exits with code 1). The message is one line naming the step, the quantity and what stays on disk."""

    exit_code = 1


def is_finite(value: float) -> bool:
    """``math.isfinite`` of a Python number (a 0-dim tensor is read with ``float``)."""
    return math.isfinite(float(value))


def non_finite_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the tensors in ``named`` (e.g. ``model.named_parameters()``) holding a NaN or an infinity; a
    sharded tensor (FSDP2's DTensor) is checked on this rank's shard."""
    bad = []
    for name, tensor in named:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if local.is_floating_point() and not bool(torch.isfinite(local.detach()).all()):
            bad.append(name)
    return bad


FLOAT16_TRAINING = (
    "--dtype float16 would train float16 weights and optimizer state, with no float32 master copy and no "
    "loss scaling: small updates round away and gradients overflow (NaN within a few steps). Train with "
    "--dtype auto (bfloat16 on CUDA), bfloat16 or float32; float16 is for evaluation and sampling only")


def check_training_dtype(dtype: "str | torch.dtype | None") -> None:
    """Refuse to train weights stored in float16 (``--dtype float16``; see the module docstring).

    Raises:
        OptionError: ``dtype`` is ``"float16"`` (or ``torch.float16``); the message names ``--dtype`` and what to use.
    """
    if dtype in ("float16", torch.float16):
        raise OptionError(FLOAT16_TRAINING)
