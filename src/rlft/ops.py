"""Tensor helpers shared by losses and recipes: log-probs, masked reductions, one aggregation rule.

Shape legend: B batch, T tokens, V vocab.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

AggregationMode = Literal["token_mean", "seq_mean", "seq_sum", "sum"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` over ``dim`` (all dims when None). Shapes must broadcast.

    Positions where ``mask == 0`` are ignored even when ``values`` is inf or nan there.
    """
    masked = torch.where(mask != 0, values * mask, 0.0)
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask == 1``; positions with an empty mask give 0, not NaN."""
    total = masked_sum(values, mask, dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: AggregationMode = "token_mean",
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> torch.Tensor:
    """The one place where per-token values of shape ``(B, T)`` are reduced to a scalar.

    - ``token_mean``: sum over all masked tokens / number of masked tokens. Pass ``num_tokens``
      (the masked-token count of the *whole* optimisation batch) when a batch is split into
      micro-batches, so that summing micro-batch losses gives exactly the full-batch loss.
    - ``seq_mean``: mean over tokens within each sequence, then sum over sequences divided by
      ``num_sequences`` (default: this micro-batch's B).
    - ``seq_sum``: sum over tokens within each sequence, then sum over sequences divided by
      ``num_sequences`` (default: this micro-batch's B). The sequence-level REINFORCE/RLOO
      estimator: the mean over sequences of sum_t values_t.
    - ``sum``: plain masked sum.
    """
    if mode == "token_mean":
        denom = loss_mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=values.dtype)
        return masked_sum(values, loss_mask) / denom.clamp(min=1)
    if mode == "seq_mean":
        per_seq = masked_mean(values, loss_mask, dim=-1)
        denom = per_seq.shape[0] if num_sequences is None else num_sequences
        return per_seq.sum() / max(denom, 1)
    if mode == "seq_sum":
        denom = loss_mask.shape[0] if num_sequences is None else num_sequences
        return masked_sum(values, loss_mask) / max(denom, 1)
    if mode == "sum":
        return masked_sum(values, loss_mask)
    raise ValueError(f"unknown aggregation mode {mode!r}; expected token_mean, seq_mean, seq_sum or sum")


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each label under ``softmax(logits / temperature)``.

    Args:
        logits: ``(..., V)`` float.
        labels: ``(...)`` long, same leading shape.
    Returns:
        ``(...)`` float32 log-probs.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return -F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view(labels.shape)


def lm_head_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: torch.nn.Module,
    *,
    temperature: float = 1.0,
    softcap: float | None = None,
    chunk_size: int = 0,
) -> torch.Tensor:
    """Log-probability of each target token from final hidden states, optionally chunked over tokens.

    ``logits = head(hidden)`` (then ``tanh(logits / softcap) * softcap`` when ``softcap``), and the
    result is :func:`logprobs_from_logits` of ``targets``. With ``chunk_size > 0`` the ``N`` tokens are
    processed ``chunk_size`` at a time and each chunk is recomputed in the backward pass
    (``torch.utils.checkpoint``, non-reentrant), so at most a ``(chunk_size, V)`` block of logits (and
    its gradient) exists at once instead of ``(N, V)``: with Qwen2.5's V = 151,936 and N = 2,048 that is
    160 MB per chunk of 256 instead of 1.2 GB per copy (logits, log-softmax, gradient). Values and
    gradients equal the unchunked ones up to float rounding; the price is one more LM-head matmul per
    chunk in the backward pass. (The chunked-cross-entropy idea of Liger-Kernel's fused linear CE and
    of Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models", without their kernels.)

    Args:
        hidden: ``(N, H)`` final hidden states at the positions that predict ``targets``.
        targets: ``(N,)`` long target token ids.
        head: the LM head (``model.get_output_embeddings()``), ``(N, H) -> (N, V)``.
        chunk_size: tokens per chunk; 0 (or >= N) computes all logits at once.
    Returns:
        ``(N,)`` float32 log-probs (differentiable w.r.t. ``hidden`` and the head's parameters).
    """
    if chunk_size < 0:
        raise ValueError(f"chunk_size must be >= 0 (0: no chunking), got {chunk_size}")

    def chunk_logprobs(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = head(h)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return logprobs_from_logits(logits, y, temperature)

    if chunk_size == 0 or hidden.shape[0] <= chunk_size:
        return chunk_logprobs(hidden, targets)
    from torch.utils.checkpoint import checkpoint

    parts = []
    for h, y in zip(hidden.split(chunk_size), targets.split(chunk_size)):
        if torch.is_grad_enabled():
            parts.append(checkpoint(chunk_logprobs, h, y, use_reentrant=False))
        else:
            parts.append(chunk_logprobs(h, y))
    return torch.cat(parts)


def packed_hidden_states(decoder: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states ``(R, L, H)`` of packed rows (:mod:`rlft.data.packing`): no attention mask, positions
    restarting at 0 per sequence, no KV cache (transformers detects packing only without one).

    transformers' flash-attention path recognises packed sequences only in a batch of ONE row (it takes
    ``cu_seqlens`` from the positions where ``position_ids == 0`` across the flattened row), so with a
    ``flash_attention_*`` implementation ``R > 1`` rows are run as one ``(1, R * L)`` row (each row's padding
    tail starts at position 0, so it is a sequence of its own) and reshaped back. SDPA and eager get
    transformers' block-diagonal causal mask and take several rows as they are.
    """
    rows, width = input_ids.shape
    implementation = str(getattr(getattr(decoder, "config", None), "_attn_implementation", "") or "")
    if rows > 1 and "flash" in implementation:
        input_ids, position_ids = input_ids.reshape(1, -1), position_ids.reshape(1, -1)
    hidden = decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
    return hidden.reshape(rows, width, hidden.shape[-1])


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    loss_mask: torch.Tensor,
    temperature: float = 1.0,
    *,
    position_ids: torch.Tensor | None = None,
    logits_chunk_size: int = 0,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of ``input_ids`` under ``model``, computed only where ``loss_mask`` is 1.

    Token ``t`` is scored from the logits at position ``t - 1``. The LM head runs only on positions
    whose next token is a target, which saves the ``(B, T, V)`` logits tensor for prompt tokens.

    Args:
        input_ids, attention_mask, loss_mask: ``(B, T)``; ``loss_mask[:, 0]`` must be 0.
        temperature: divide logits by this (use the sampling temperature for RL log-probs).
        position_ids: ``(B, T)`` for packed rows (:mod:`rlft.data.packing`: restarting at 0 at every
            sequence, ``attention_mask=None``); then the first token of every sequence
            (``position_ids == 0``) must have ``loss_mask`` 0. None: positions from the attention mask
            as usual (right padding).
        logits_chunk_size: compute the LM head this many target tokens at a time, recomputing in the
            backward pass (:func:`lm_head_logprobs`); 0: all at once (the default; same values).
        return_entropy: also return the entropy ``H_t = -sum_v p_v log p_v`` of the (tempered)
            next-token distribution at each target position, with gradient (needs the full logits: not
            with ``logits_chunk_size``).
    Returns:
        ``(B, T)`` float32: log p(input_ids[b, t] | prefix) where ``loss_mask[b, t] == 1``, else 0;
        with ``return_entropy``, ``(logprobs, entropy)``, both ``(B, T)`` (entropy 0 off the mask).
    Raises:
        ValueError: a target with no prefix in its sequence (see above), or ``position_ids`` together with
            an ``attention_mask`` (transformers would then not detect the packed sequences).
    """
    from rlft.distributed import root_call  # a plain call unless the model is sharded (FSDP2)

    return root_call(model, _sequence_logprobs, model, input_ids, attention_mask, loss_mask, temperature, position_ids,
                     logits_chunk_size, return_entropy)


def _sequence_logprobs(model, input_ids, attention_mask, loss_mask, temperature, position_ids, logits_chunk_size,
                       return_entropy):
    """:func:`sequence_logprobs` itself (positional arguments, so FSDP2 can run it as a forward), under the model's
    mixed-precision autocast when it has one (:func:`rlft.precision.compute_context`)."""
    from rlft.precision import compute_context

    if bool(loss_mask[:, 0].any()):
        raise ValueError("loss_mask[:, 0] must be 0: the first token has no prefix to predict it from")
    width = input_ids.shape[1]
    if position_ids is None:  # padded rows: a few more pad columns, so that batches come in few distinct shapes
        input_ids, attention_mask, loss_mask = pad_width(PAD_MULTIPLE, input_ids, attention_mask, loss_mask)
    with compute_context(model):
        out = _logprobs_and_entropy(model, input_ids, attention_mask, loss_mask, temperature, position_ids,
                                    logits_chunk_size, return_entropy)
    return tuple(t[:, :width] for t in out) if isinstance(out, tuple) else out[:, :width]


PAD_MULTIPLE = 16
"""Padded batches are widened to a multiple of this many tokens (:func:`pad_width`) before the forward pass."""


def pad_width(multiple: int, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *masks: torch.Tensor):
    """``(input_ids, attention_mask, *masks)`` right-padded with columns of 0 (token id 0, attention 0, mask 0) to a
    width that is a multiple of ``multiple``; unchanged when it already is.

    Right padding is invisible to the real tokens (causal attention, and the attention mask hides the new columns),
    so per-token results on the original columns do not change. It bounds the number of distinct batch shapes,
    which matters on CPU: the oneDNN kernels cached per shape otherwise make a run's memory grow with every new
    sequence length (measured: ~17 MB a step for SmolLM2-135M with lengths 60-250), and a compiled model
    recompiles less. ``(B, T)`` tensors in, ``(B, T')`` out, ``T' >= T``.
    """
    width = input_ids.shape[1]
    extra = -width % multiple
    if not extra:
        return (input_ids, attention_mask, *masks)
    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, extra))

    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    return (pad(input_ids), pad(attention_mask), *(pad(m) for m in masks))


CAUSAL_RIGHT_PADDING_DEVICES: tuple[str, ...] = ("cuda",)
"""Device types on which a right-padded batch runs plain causal attention, without its mask
(:func:`causal_attention_mask`). Not on CPU: there it would change the attention kernel, so every recorded CPU result
(all computed with the mask) would stop being bit-reproducible."""


def causal_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The ``attention_mask`` to give the decoder: None when every row is right padding (ones, then zeros) on a device
    type of :data:`CAUSAL_RIGHT_PADDING_DEVICES`, else the mask unchanged.

    Under causal attention a real token attends only to earlier positions, and right padding comes after every real
    token, so the mask changes nothing at the real positions: their hidden states (and log-probs, and gradients) are
    the masked ones up to kernel rounding, with positions 0..T-1 either way. Without the mask, transformers' SDPA
    path runs ``is_causal`` (the flash kernel on CUDA) instead of an explicit ``(B, 1, T, T)`` mask, with which
    cuDNN's attention took twice the time or more (``docs/results/gpu-bench-h200/``). The pad positions' outputs change;
    nothing reads them (``loss_mask`` is 0 there). Left padding keeps its mask (the positions would differ). ``(B, T)``
    in.
    """
    if attention_mask is None or attention_mask.device.type not in CAUSAL_RIGHT_PADDING_DEVICES:
        return attention_mask
    right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())  # rows never go 0 -> 1
    return None if right_padded else attention_mask


def _logprobs_and_entropy(model, input_ids, attention_mask, loss_mask, temperature, position_ids, logits_chunk_size,
                          return_entropy):
    if position_ids is None:
        mask = causal_attention_mask(attention_mask)
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
    else:
        if attention_mask is not None:
            raise ValueError(
                "packed rows (position_ids given) take attention_mask=None: attention follows position_ids")
        if bool(loss_mask[position_ids == 0].any()):
            raise ValueError("loss_mask must be 0 where position_ids == 0: a sequence's first token has no prefix")
        hidden = packed_hidden_states(model.get_decoder(), input_ids, position_ids)
    target_mask = loss_mask[:, 1:].bool()  # (B, T-1): positions t whose token t+1 is a target
    selected = hidden[:, :-1][target_mask]  # (N, H)
    targets = input_ids[:, 1:][target_mask]  # (N,)
    head, softcap = model.get_output_embeddings(), getattr(model.config, "final_logit_softcapping", None)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if not return_entropy:
        out[:, 1:][target_mask] = lm_head_logprobs(selected, targets, head, temperature=temperature, softcap=softcap,
                                                   chunk_size=logits_chunk_size)
        return out
    logits = head(selected)  # (N, V): the entropy needs the whole distribution
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    out[:, 1:][target_mask] = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    entropy[:, 1:][target_mask] = -(log_p.exp() * log_p).sum(-1)
    return out, entropy
