"""Memory and speed options the training recipes share: ``--gradient-checkpointing`` (the chunked LM head is
``--logits-chunk-size``, see :func:`rlft.ops.lm_head_logprobs`), ``--compile`` (:func:`compile_layers`;
:func:`eager_layers` for generation) and ``--max-tokens-per-micro-batch`` (:func:`cut_by_tokens`, with the cost
functions :func:`padded_tokens` and :func:`packed_tokens`)."""

from __future__ import annotations

import contextlib
import os
import types
from typing import Callable, Sequence, TypeVar

import torch

T = TypeVar("T")

COMPILE_BACKEND_ENV = "RLFT_COMPILE_BACKEND"
"""Environment variable naming the torch.compile backend of :func:`compile_layers` when none is passed (default
``inductor``); the tests set ``aot_eager``, which traces the same graphs without inductor's minutes of C++
compilation on a CPU."""


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each transformer block's activations in the backward pass instead of storing them
    (transformers' ``activation_checkpointing_enable``, called ``gradient_checkpointing_enable`` before 5.x,
    with non-reentrant ``torch.utils.checkpoint``, which
    needs no input that requires grad, so frozen embeddings or lower blocks are fine).

    Values and gradients are unchanged (up to float rounding); a step costs about one more forward.
    Raises ValueError for a model that does not support it.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def compile_layers(model: torch.nn.Module, backend: str | None = None) -> int:
    """``--compile``: run every decoder layer's ``forward`` through ``torch.compile`` (``dynamic=True``), in place.

    What is compiled, and why the layers rather than the whole decoder: rlft's loss path calls
    ``model.get_decoder()`` and the LM head separately (:func:`rlft.ops.sequence_logprobs`, the reward model's
    pooling), so the decoder is what carries the compute. Its layers are all instances of one class, so ONE
    compiled function (``type(layer).forward``, bound to each layer) serves all of them: one graph, compiled
    once, with the layer's weights as inputs (dynamic shapes: batch rows and lengths vary from micro-batch to
    micro-batch; a one-row batch, e.g. one packed row, specialises once more). Module hooks stay outside the
    compiled code (only ``forward`` is replaced), which keeps FSDP2's per-layer gathering and transformers'
    gradient checkpointing working. The decoder's own glue (embedding, causal-mask construction, which branches
    on data) and the LM head stay eager. Parameters, their names and the saved weights are untouched; a deep
    copy of the model gets forwards bound to its own layers.

    The forward must not build a KV cache (``use_cache=False``, as the loss path passes): a cache object's
    state is guarded on per layer and would recompile every layer.

    Args:
        model: a Hugging Face decoder (causal LM, sequence classifier, LoRA-wrapped or FSDP2-sharded).
        backend: the torch.compile backend; None: ``$RLFT_COMPILE_BACKEND`` or ``inductor``.
    Returns:
        the number of layers compiled.
    Raises:
        ValueError: the model has no decoder layers (:func:`rlft.distributed.decoder_layers`).
    """
    from rlft.distributed import decoder_layers

    backend = backend or os.environ.get(COMPILE_BACKEND_ENV) or "inductor"
    compiled: dict[type, Callable] = {}
    layers = decoder_layers(model)
    for layer in layers:
        cls = type(layer)
        if cls not in compiled:
            compiled[cls] = _checkpoint_tolerant(torch.compile(cls.forward, backend=backend, dynamic=True))
        layer.forward = types.MethodType(compiled[cls], layer)
    return len(layers)


_CHECKPOINT_SIDE_EFFECTS = "skip_fwd_side_effects_in_bwd_under_checkpoint"


def _checkpoint_tolerant(compiled: Callable) -> Callable:
    """``compiled``, traced with dynamo's ``skip_fwd_side_effects_in_bwd_under_checkpoint`` on (where this torch has
    it). Since transformers 5 a layer's ``forward`` is itself the gradient-checkpointing wrapper, so with
    ``--gradient-checkpointing`` dynamo traces ``torch.utils.checkpoint`` as a higher-order op; the output-capturing
    hooks inside it set a module-level variable (transformers' ``CompileableContextVar``), a side effect dynamo
    refuses by default, and the whole layer fell back to eager without a word (0 graphs). That variable only matters
    when hidden states are collected (``output_hidden_states``), which rlft's loss path never asks for, so its
    replay in the backward's recomputation can be skipped."""
    if not hasattr(torch._dynamo.config, _CHECKPOINT_SIDE_EFFECTS):
        return compiled
    return torch._dynamo.config.patch(**{_CHECKPOINT_SIDE_EFFECTS: True})(compiled)


@contextlib.contextmanager
def eager_layers(model: torch.nn.Module):
    """Inside the block, the decoder layers that :func:`compile_layers` compiled run their eager ``forward`` again;
    the compiled ones are put back on exit (the same compiled function: nothing recompiles). For generation on a
    ``--compile``'d policy (the RL loop samples from it): decoding passes a KV cache, whose per-layer state the
    compiled forward guards on, so every layer would recompile until dynamo's recompile limit. A deep copy made
    inside the block (the HF engine's sampling copy) stays eager. Layers not compiled are left as they are.

    Raises:
        ValueError: the model has no decoder layers (:func:`rlft.distributed.decoder_layers`).
    """
    from rlft.distributed import decoder_layers

    saved = {layer: vars(layer).pop("forward") for layer in decoder_layers(model) if "forward" in vars(layer)}
    try:
        yield
    finally:
        for layer, forward in saved.items():
            layer.forward = forward


def padded_tokens(lengths: Sequence[int], rows_per_item: int = 1) -> int:
    """Size of a right-padded micro-batch of items of these ``lengths``: rows x longest row
    (``rows_per_item=2`` for chosen/rejected pairs, each pair's length being its longer side)."""
    return rows_per_item * len(lengths) * max(lengths, default=0)


def packed_tokens(lengths: Sequence[int]) -> int:
    """Size of a packed micro-batch: its real tokens (a pair's length being chosen + rejected)."""
    return sum(lengths)


def cut_by_tokens(items: Sequence[T], size: Callable[[list[T]], int], max_tokens: int) -> list[list[T]]:
    """``--max-tokens-per-micro-batch``: cut ``items``, in order, into consecutive micro-batches with
    ``size(micro_batch) <= max_tokens``, each as long as fits (greedy); an item that alone exceeds
    ``max_tokens`` gets a micro-batch of its own. With a size that never shrinks when a micro-batch grows
    (:func:`padded_tokens`, :func:`packed_tokens`) this is the fewest consecutive micro-batches; sort the items
    by length first (the recipes' :func:`rlft.recipes.common.length_grouped`) so each pads to lengths like
    its own. Every item lands in exactly one micro-batch, in order.

    Raises:
        ValueError: ``max_tokens < 1``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens}")
    out: list[list[T]] = []
    for item in items:
        if out and size(out[-1] + [item]) <= max_tokens:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def check_scale_options(cfg) -> None:
    """Reject bad ``--pack-length`` / ``--logits-chunk-size`` values before any work (fields a config lacks are
    skipped).

    Raises:
        ValueError: ``pack_length < 1`` (None means one row per micro-batch) or ``logits_chunk_size < 0``.
    """
    pack_length = getattr(cfg, "pack_length", None)
    if pack_length is not None and pack_length < 1:
        raise ValueError(f"pack_length must be >= 1 (or None: one packed row per micro-batch), got {pack_length}")
    if getattr(cfg, "logits_chunk_size", 0) < 0:
        raise ValueError(f"logits_chunk_size must be >= 0 (0: no chunking), got {cfg.logits_chunk_size}")
