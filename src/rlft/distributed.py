"""Data-parallel training under ``torchrun``: process group, rank helpers, DDP replicas or FSDP2 shards, gradient sum.

Launched by ``torchrun --nproc-per-node N rlft sft ...`` (torchrun sets ``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``); without those variables, or with ``WORLD_SIZE=1``,
nothing here does anything and a run is exactly the one-process run.

Sharding rule (the result does not depend on the world size): every rank computes the same global
batch of step ``s`` (:func:`rlft.recipes.common.batch_indices`, then
:func:`rlft.recipes.common.length_grouped`) and takes :func:`shard` of it (rank ``r`` gets positions
``r, r + N, r + 2N, ...``). Loss normalisers (token counts, pair counts) are computed from the
*global* batch, which every rank knows, so a rank's loss is its shard's sum divided by the global
count, and the gradients are SUMMED over ranks (not averaged), so clipping and the optimizer step see
the one-process gradient (up to float rounding of the sum's order).

Strategies (``--distributed``, :func:`wrap_model`; the default ``auto`` is ``fsdp2`` with more than one rank, or
``ddp`` when the run trains LoRA adapters: :func:`rlft.options.resolved_strategy`):

- ``ddp``: every rank holds a full replica (rank 0's weights broadcast), runs its micro-batches with no
  communication, and :func:`sum_gradients` sums the gradients once per optimizer step before clipping
  (one ``all_reduce`` per bucket). That is ``DistributedDataParallel`` with ``no_sync()`` over the whole
  step and a SUM all-reduce; the model is left unwrapped because the recipes call
  ``model.get_decoder()``, ``model.config`` and the LM head directly (packing, chunked LM head).
- ``fsdp2``: :func:`fully_shard_model` shards the model with torch's FSDP2 (``fully_shard`` per decoder
  layer, then the root, on a 1-D device mesh); each group's gradient is reduce-scattered as a SUM in the
  backward pass (gradient divide factor 1). The recipes' direct calls to the decoder and the head go
  through :func:`root_call`, a forward method of the root, so the root's parameters are gathered. Every
  forward and backward is collective, so every rank runs as many micro-batches as rank 0
  (:func:`padded_micro_batches`: zero-weight fillers). Checkpoints and the final model are written from
  full state dicts gathered on rank 0 (:func:`full_state_dicts`; the optimizer's keyed by parameter name,
  which :func:`load_optimizer_state` loads into a sharded or an unsharded model). No LoRA (an explicit
  ``fsdp2`` is refused by :class:`rlft.options.DistributedOptions`; ``auto`` picks ``ddp``).

The RL loop splits a step's prompt groups across ranks (whole groups) and gathers the rewards on every rank
(:func:`gather_rows`), see :func:`rlft.rl.sampling.sample_step`. Under ``fsdp2`` its generation is collective
too: :class:`rlft.rollout.hf.HFEngine` generates with ``synced_gpus`` and as many ``generate`` calls on every
rank (filler chunks, :func:`most`), its log-prob passes and update run as many micro-batches on every rank
(:func:`rlft.rl.batch.synced_passes`), a separate reference model is sharded too, and every rank evaluates its
shard of the held-out prompts. The vLLM engine is refused under torchrun.

Rank 0 alone writes logs, ``metrics.jsonl``, checkpoints, ``config.yaml`` and the final model;
every rank reads the same checkpoint on ``--resume``. The sampling commands (``eval countdown``, ``eval winrate``,
``pairs countdown``) refuse torchrun (:func:`require_one_process`).
"""

from __future__ import annotations

import datetime
import logging
import os
import types

import torch
import torch.distributed as dist

log = logging.getLogger("rlft")

STRATEGIES = ("ddp", "fsdp2")
"""The strategies :func:`wrap_model` applies (``--distributed auto`` resolves to one of them first)."""

_BUCKET_ELEMENTS = 1 << 25
"""Most gradient elements one ``all_reduce`` carries (32M: 128 MiB of float32)."""


def launched() -> bool:
    """True when started by torchrun (or similar) with ``WORLD_SIZE`` > 1."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def require_one_process(command: str) -> None:
    """Refuse to run ``command`` (e.g. ``"rlft pairs countdown"``) under torchrun: it samples in one process, and
    every rank would sample the same tasks and write the same files.

    Raises:
        UsageError: launched with ``WORLD_SIZE`` > 1 (the CLI exits with code 2).
    """
    if launched():
        from rlft.validation import UsageError

        raise UsageError(f"torchrun started {os.environ.get('WORLD_SIZE')} processes, but `{command}` samples in one "
                         "process (every rank would sample and write the same): run it without torchrun")


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


def most(value: int) -> int:
    """The largest ``value`` over ranks (e.g. how many collective passes the busiest rank runs); ``value`` itself
    when not distributed."""
    if not active():
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


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


def all_reduce_counted(sums: dict[str, float], count: int) -> tuple[dict[str, float], int]:
    """:func:`all_reduce_sums` of a step's summed metrics and its token count in one gather: returns ``(sums over
    ranks, count over ranks)``; the inputs themselves when not distributed. ``count`` is an ``int`` (tokens seen)."""
    summed = all_reduce_sums({**sums, "__count": count})
    return {k: v for k, v in summed.items() if k != "__count"}, int(summed["__count"])


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


def gather_rows(rows: torch.Tensor, positions: list[int], total: int) -> torch.Tensor:
    """The ``(total, ...)`` tensor, on the CPU and on every rank, whose rows at ``positions`` are this rank's
    ``rows`` (``(len(positions), ...)``), for any split of ``range(total)`` over the ranks (e.g. the RL groups
    a rank sampled; ``all_gather_object``: meant for small per-item values such as rewards). Not
    distributed: ``rows`` on the CPU (``positions`` must then be ``range(total)``).

    Raises:
        ValueError: the ranks' positions do not cover ``range(total)`` exactly once.
    """
    if not active():
        return rows.detach().cpu()
    gathered: list = [None] * world()
    dist.all_gather_object(gathered, (list(positions), rows.detach().cpu()))
    first = next(part for _, part in gathered)
    out = torch.empty((total, *first.shape[1:]), dtype=first.dtype)
    if sorted(p for pos, _ in gathered for p in pos) != list(range(total)):
        raise ValueError(f"gather_rows: the ranks' positions do not cover 0..{total - 1} once each")
    for pos, part in gathered:
        if pos:
            out[torch.tensor(pos)] = part
    return out


def wrap_model(model: torch.nn.Module, strategy: str = "ddp") -> torch.nn.Module:
    """Prepare ``model`` for data-parallel training and return it (see the module docstring).

    Both strategies first broadcast rank 0's parameters and buffers to every rank, so replicas start equal
    even if they were loaded or initialised differently. ``ddp``: the model is returned as it is (a full
    replica). ``fsdp2``: :func:`fully_shard_model` shards it in place. Not distributed: ``model`` untouched.

    Raises:
        ValueError: an unknown ``strategy``; ``fsdp2`` on a model without decoder layers to shard.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown --distributed {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if not active():
        return model
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0)
    return fully_shard_model(model) if strategy == "fsdp2" else model


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer blocks of a Hugging Face decoder (``model.layers`` of Llama, Qwen2, Mistral, ...;
    ``transformer.h`` of GPT-2): the first ``ModuleList`` whose name ends in ``layers`` or ``.h``.

    Raises:
        ValueError: no such list (FSDP2 would then hold the whole model in one group: no memory saved).
    """
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) and (name.endswith("layers") or name.endswith(".h")):
            return module
    raise ValueError(f"--distributed fsdp2: found no decoder layers to shard in {type(model).__name__}")


def fully_shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` over every rank with FSDP2 (``torch.distributed.fsdp.fully_shard``), in place.

    One FSDP group per decoder layer (:func:`decoder_layers`), then the root (embeddings, final norm, LM
    or score head), as torchtune does, on a 1-D device mesh of the whole world. Parameters become
    ``DTensor`` shards (dim 0); a group is all-gathered for its forward and backward and its gradient is
    reduce-scattered right after its backward. The reduction is set to a SUM (gradient divide factor 1,
    SUM collectives, so gloo works too), not FSDP's default mean, so the recipes' global-batch
    normalisers give the one-process gradient. :func:`root_call` is registered as a forward method of
    the root, so the recipes' direct calls to the decoder and the head run with the root's parameters
    gathered.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(_comm_device().type, (world(),))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    model.rlft_root_call = types.MethodType(_call, model)
    register_fsdp_forward_method(model, "rlft_root_call")
    log.info("FSDP2: %d decoder layers sharded over %d ranks", len(decoder_layers(model)), world())
    return model


def reshard(model: torch.nn.Module) -> None:
    """Put every FSDP2 group of ``model`` back in its sharded state (``FSDPModule.reshard`` on each), so that
    ``model.parameters()`` are all ``DTensor`` shards again, the ones the optimizer holds. Needed before touching
    the parameters or their gradients directly after a forward pass that had no backward (a ``no_grad`` log-prob or
    generation pass): FSDP2 keeps the root group (embeddings, tied LM head, final norm) gathered after its forward,
    as plain tensors, expecting the backward to follow. Not sharded: nothing happens. Not collective."""
    if not sharded(model):
        return
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _call(self, fn, *args, **kwargs):
    return fn(*args, **kwargs)


def sharded(model: torch.nn.Module) -> bool:
    """True when ``model`` is sharded by FSDP2 (:func:`fully_shard_model`)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def root_call(model: torch.nn.Module, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, run as a forward of ``model`` when it is sharded: FSDP2 gathers the root
    group's parameters (embeddings, final norm, head) around it and reduce-scatters their gradients in
    the backward pass. The recipes need this because they call ``model.get_decoder()`` and the head
    directly (packing, chunked LM head, reward pooling) instead of ``model(...)``. Not sharded: a plain call."""
    call = getattr(model, "rlft_root_call", None)
    return call(fn, *args, **kwargs) if call is not None and sharded(model) else fn(*args, **kwargs)


def padded_micro_batches(items: list, size: int, pad: bool) -> list[tuple[list, bool]]:
    """This rank's micro-batches of a step's global list ``items``: ``[(chunk, real), ...]``.

    ``chunk``: up to ``size`` consecutive items of this rank's :func:`shard` of ``items``. With ``pad``
    (FSDP2, where every forward and backward is collective, so every rank must run as many as the
    others) a rank with fewer chunks than the busiest rank gets filler passes ``(items[:1], False)``,
    whose loss the caller multiplies by 0 (a zero gradient) and whose metrics it skips. Without ``pad``:
    the real chunks only. ``items`` empty: no micro-batches.
    """
    mine = shard(items)
    chunks = [(mine[i : i + size], True) for i in range(0, len(mine), size)]
    if pad and items:
        most = -(-(-(-len(items) // world())) // size)  # ceil(ceil(len / world) / size): rank 0's count
        chunks += [(items[:1], False)] * (most - len(chunks))
    return chunks


def full_state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
                     ) -> tuple[dict | None, dict | None]:
    """``(model_state, optimizer_state)``: full, unsharded state dicts of a sharded model, gathered on rank 0
    in CPU memory (``torch.distributed.checkpoint.state_dict`` with ``full_state_dict`` and ``cpu_offload``);
    the optimizer's is keyed by parameter name. Collective: every rank must call it; ranks other than 0 get
    ``({}, {})``. Not sharded: ``(None, None)`` (save the model and optimizer as they are)."""
    if not sharded(model):
        return None, None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    for name in _tied_duplicates(model):  # as save_pretrained writes a tied LM head: once, under the embedding's name
        model_state.pop(name, None)
    optim_state = get_optimizer_state_dict(model, optimizer, options=options) if optimizer is not None else None
    return model_state, optim_state


def _tied_duplicates(model: torch.nn.Module) -> list[str]:
    """Names of parameters that are another name of an earlier parameter (a tied LM head)."""
    first: dict[int, str] = {}
    out = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            out.append(name)
        first.setdefault(id(param), name)
    return out


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, by_name: bool) -> None:
    """Load a saved optimizer state into ``optimizer``: ``by_name`` (a state from :func:`full_state_dicts`,
    keyed by parameter name) through ``set_optimizer_state_dict`` with ``full_state_dict``, which shards it
    for a sharded model and also loads into an unsharded one; else (``optimizer.state_dict()`` of an unsharded
    run, keyed by position) ``load_state_dict``, or, for a sharded model, the same state re-keyed by the
    names of the optimizer's parameters in order first."""
    if not by_name and not sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not by_name:
        names = {id(p): n for n, p in model.named_parameters()}
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        state = {"state": {order[i]: v for i, v in state["state"].items()},
                 "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


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
