"""Data-parallel training under ``torchrun``: process group, rank helpers, replicas, gradient sum.

Launched by ``torchrun --nproc-per-node N rlft sft ...`` (torchrun sets ``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``); without those variables, or with ``WORLD_SIZE=1``,
nothing here does anything and a run is exactly the one-process run.

Sharding rule (the result does not depend on the world size): every rank computes the same global
batch of step ``s`` (:func:`rlft.recipes.common.batch_indices`, then
:func:`rlft.recipes.common.length_grouped`) and takes :func:`shard` of it (rank ``r`` gets positions
``r, r + N, r + 2N, ...``). Loss normalisers (token counts, pair counts) are computed from the
*global* batch, which every rank knows, so a rank's loss is its shard's sum divided by the global
count; :func:`sum_gradients` then SUMS the gradients over ranks (one ``all_reduce`` per bucket,
not an average), so clipping and the optimizer step see the one-process gradient (up to float
rounding of the sum's order).

Strategy ``ddp`` (the only one for now): every rank holds a full replica (:func:`wrap_model`
broadcasts rank 0's weights), runs its micro-batches with no communication, and the gradients are
summed once per optimizer step before clipping. That is ``DistributedDataParallel`` with
``no_sync()`` over the whole step and a manual SUM all-reduce; the model is left unwrapped because
the recipes call ``model.get_decoder()``, ``model.config`` and the LM head directly (packing, chunked
LM head), which a DDP wrapper would hide. Sharded training (FSDP2) is not implemented yet.

Rank 0 alone writes logs, ``metrics.jsonl``, checkpoints, ``config.yaml`` and the final model;
every rank reads the same checkpoint on ``--resume``.
"""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

log = logging.getLogger("rlft")

STRATEGIES = ("ddp",)
"""The ``--distributed`` strategies."""

_BUCKET_ELEMENTS = 1 << 25
"""Most gradient elements one ``all_reduce`` carries (32M: 128 MiB of float32)."""


def launched() -> bool:
    """True when started by torchrun (or similar) with ``WORLD_SIZE`` > 1."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def active() -> bool:
    """True when a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world() -> int:
    """Number of ranks (1 when not distributed)."""
    return dist.get_world_size() if active() else 1


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    return dist.get_rank() if active() else 0


def local_rank() -> int:
    """``LOCAL_RANK`` (0 when not set): the GPU index this process uses on its node."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """True on rank 0 (and in a one-process run): the rank that writes files and logs."""
    return rank() == 0


def init(device: str = "auto") -> bool:
    """Initialise the default process group when launched with ``WORLD_SIZE`` > 1 and not yet done.

    ``device``: the recipe's ``--device`` ("auto", "cpu", "cuda", ...). Backend: nccl for CUDA ("cuda..."
    or "auto" with CUDA available), after ``torch.cuda.set_device(LOCAL_RANK)``; gloo otherwise. Ranks
    other than 0 log warnings only. Returns True when distributed. Idempotent; a no-op (False) without
    torchrun's variables.
    """
    if active():
        return True
    if not launched():
        return False
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local_rank())
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=60))
    if dist.get_rank() != 0:
        logging.getLogger("rlft").setLevel(logging.WARNING)
    log.info("distributed: %d ranks (%s)", dist.get_world_size(), dist.get_backend())
    return True


def shutdown() -> None:
    """Destroy the process group if one is initialised (after a barrier)."""
    if dist.is_available() and dist.is_initialized():
        barrier()
        dist.destroy_process_group()


def device_for_rank(device: torch.device) -> torch.device:
    """``cuda:LOCAL_RANK`` for a CUDA ``device`` when distributed; ``device`` otherwise."""
    if active() and device.type == "cuda":
        return torch.device("cuda", local_rank())
    return device


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if active():
        dist.barrier()


def all_reduce_sum(value: float | int | torch.Tensor) -> float | torch.Tensor:
    """Sum over ranks. A float/int comes back as a float; a tensor is summed in place and returned.
    Not distributed: ``value`` unchanged (a number as a float)."""
    if isinstance(value, torch.Tensor):
        if active():
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value
    if not active():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def all_reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """Sum a ``{name: number}`` mapping over ranks, key by key (a key missing on a rank counts as 0, e.g.
    a rank whose shard of a short batch is empty; keys in rank 0's order, then any others).
    Unchanged when not distributed. Gathers the small mappings with ``all_gather_object``."""
    if not active():
        return values
    gathered: list[dict[str, float]] = [{} for _ in range(world())]
    dist.all_gather_object(gathered, {k: float(v) for k, v in values.items()})
    out: dict[str, float] = {}
    for part in gathered:
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def shard(items: list, of_rank: int | None = None, world_size: int | None = None) -> list:
    """This rank's part of a global batch: positions ``rank, rank + world, ...`` (strided, so each rank
    gets short and long sequences alike from a length-grouped batch). A rank may get an empty list
    when the batch has fewer items than ranks. Not distributed: ``items`` itself."""
    r = rank() if of_rank is None else of_rank
    n = world() if world_size is None else world_size
    return items if n == 1 else items[r::n]


def gather_shards(parts: dict[str, torch.Tensor], total: int) -> dict[str, torch.Tensor]:
    """The inverse of :func:`shard` for per-item values: each rank holds ``parts[key]``, a ``(len(shard), ...)``
    tensor of its items ``rank, rank + world, ...`` of ``total``; returns the full ``(total, ...)`` tensors,
    on the CPU, in item order, on every rank (``all_gather_object``: meant for small per-item values such
    as log-probs). Not distributed: ``parts`` unchanged."""
    if not active():
        return parts
    gathered: list[dict[str, torch.Tensor]] = [{} for _ in range(world())]
    dist.all_gather_object(gathered, {k: v.detach().cpu() for k, v in parts.items()})
    out = {}
    for key in parts:
        first = gathered[0][key]
        full = torch.empty((total, *first.shape[1:]), dtype=first.dtype)
        for r, part in enumerate(gathered):
            full[r::world()] = part[key]
        out[key] = full
    return out


def wrap_model(model: torch.nn.Module, strategy: str = "ddp") -> torch.nn.Module:
    """Prepare ``model`` for data-parallel training; returns it (not wrapped, see the module docstring).

    ``ddp``: rank 0's parameters and buffers are broadcast to every rank, so replicas start equal even if
    they were loaded or initialised differently. Not distributed: ``model`` untouched.

    Raises:
        ValueError: an unknown ``strategy``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown --distributed {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if not active():
        return model
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0)
    return model


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Replace each parameter's ``.grad`` with its SUM over ranks (not the mean: see the module docstring).

    Gradients are flattened into buckets (per dtype and device, at most :data:`_BUCKET_ELEMENTS` each),
    one ``all_reduce`` per bucket. A parameter without a gradient on this rank counts as zeros; one that
    has no gradient on any rank keeps ``.grad = None`` (as in a one-process run, where the optimizer skips
    it). Not distributed: nothing happens.
    """
    if not active() or not params:
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8, device=_comm_device())
    dist.all_reduce(has, op=dist.ReduceOp.SUM)
    live = [p for p, h in zip(params, has.tolist()) if h]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    buckets: dict[tuple, list[list[torch.nn.Parameter]]] = {}
    filled: dict[tuple, int] = {}  # elements in the last bucket of each kind
    for p in live:
        kind = (p.grad.dtype, p.grad.device)
        groups = buckets.setdefault(kind, [[]])
        if groups[-1] and filled[kind] + p.numel() > _BUCKET_ELEMENTS:
            groups.append([])
            filled[kind] = 0
        groups[-1].append(p)
        filled[kind] = filled.get(kind, 0) + p.numel()
    for groups in buckets.values():
        for group in groups:
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in group:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n
