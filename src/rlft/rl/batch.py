"""Batches of sampled sequences: teacher-forcing batch, log-prob passes, the loss's forward/backward.

Shape legend: N sampled sequences (B prompts x k samples, row ``b * k + j``), T tokens.

A model sharded by FSDP2 (:func:`rlft.distributed.sharded`) makes every forward and backward collective, so
every rank must run as many passes as the others, whatever its number of rows (zero included):
:func:`synced_passes` is that number, and :func:`batch_logprobs` and :func:`policy_loss_backward` given
``passes`` and a :func:`filler_batch` run filler passes after their real micro-batches (results discarded,
a zero loss), as :func:`rlft.distributed.padded_micro_batches` does for the other recipes.
"""

from __future__ import annotations

from typing import Callable, Iterator, Literal

import torch

from rlft import distributed
from rlft.data.tokenize import TokenizedExample, collate
from rlft.losses.pg import entropy_bonus, kl_loss, policy_gradient_loss
from rlft.ops import sequence_logprobs
from rlft.rollout.base import Sample
from rlft.rollout.hf import encode_prompts
from rlft.types import TokenBatch


def generation_seed(seed: int, step: int, rank: int = 0) -> int:
    """The sampling seed of a step: distinct per step, the same after a resume; under torchrun, distinct per
    rank too (each rank samples other prompts; rank 0's seed is the one-process seed)."""
    return seed * 1_000_003 + step + rank * (1 << 40)


def rollout_batch(tokenizer, prompts: list[str], samples: list[list[Sample]], *, add_special_tokens: bool = True) -> TokenBatch:
    """The right-padded teacher-forcing batch of all sampled sequences: row ``b * k + j`` is ``samples[b][j]``.

    Prompt ids come from :func:`rlft.rollout.hf.encode_prompts`, the function :class:`HFEngine` tokenizes
    with; pass the engine's ``add_special_tokens`` (the recipe does), so the ids are those the sampler
    conditioned on. ``loss_mask`` is 1 on every generated id, the EOS included (masks come from lengths,
    never from token values, so pad == EOS is harmless). No samples (a rank with no groups this step): a
    ``(0, 1)`` batch, which every pass below goes through with no forward.
    """
    if not samples:
        return TokenBatch(torch.zeros((0, 1), dtype=torch.long), torch.zeros((0, 1), dtype=torch.long), torch.zeros((0, 1)))
    prompt_ids = encode_prompts(tokenizer, prompts, add_special_tokens=add_special_tokens)
    examples = [
        TokenizedExample(
            input_ids=list(prompt_ids[b]) + list(sample.completion_ids),
            loss_mask=[0] * len(prompt_ids[b]) + [1] * len(sample.completion_ids),
            truncated=sample.finish_reason == "length",
        )
        for b, row in enumerate(samples)
        for sample in row
    ]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return collate(examples, pad_id)


def micro_batches(batch: TokenBatch, size: int) -> Iterator[tuple[slice, TokenBatch]]:
    """``(rows, micro_batch)`` pairs; each micro-batch is trimmed to its own longest sequence."""
    for start in range(0, batch.input_ids.shape[0], size):
        rows = slice(start, start + size)
        width = int(batch.attention_mask[rows].sum(dim=1).max())
        yield rows, TokenBatch(batch.input_ids[rows, :width], batch.attention_mask[rows, :width], batch.loss_mask[rows, :width])


def micro_batch_count(rows: int, size: int) -> int:
    """How many micro-batches of at most ``size`` rows :func:`micro_batches` makes of ``rows`` rows."""
    return -(-rows // size)


def synced_passes(model, rows: int, size: int) -> int | None:
    """The number of passes every rank runs over its ``rows`` rows in micro-batches of ``size`` when ``model`` is
    sharded (FSDP2: the largest :func:`micro_batch_count` over the ranks; collective, so every rank must call it);
    None when it is not (each rank runs its own micro-batches only)."""
    if not distributed.sharded(model):
        return None
    return int(distributed.most(micro_batch_count(rows, size)))


def filler_batch(tokenizer, device: torch.device | str) -> TokenBatch:
    """A two-token sequence with one target (the pad id, else EOS, twice): the input of filler passes."""
    token = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TokenBatch(torch.full((1, 2), token, dtype=torch.long), torch.ones((1, 2), dtype=torch.long),
                      torch.tensor([[0.0, 1.0]])).to(device)


def _fillers(passes: int | None, filler: TokenBatch | None, rows: int, size: int) -> int:
    """Filler passes to run after the real micro-batches of ``rows`` rows so that there are ``passes`` in all.

    Raises:
        ValueError: ``passes`` below the real micro-batch count, or fillers needed and no ``filler``.
    """
    if passes is None:
        return 0
    n = passes - micro_batch_count(rows, size)
    if n < 0:
        raise ValueError(f"passes={passes} is fewer than the {micro_batch_count(rows, size)} micro-batches of {rows} rows")
    if n and filler is None:
        raise ValueError("filler passes need a filler batch (filler_batch)")
    return n


def _filler_passes(model, filler: TokenBatch, n: int, temperature: float, logits_chunk_size: int, backward: bool) -> None:
    """``n`` forwards of ``filler`` whose log-probs are dropped; with ``backward`` each backpropagates a zero loss
    (a zero gradient, but the sharded model's collectives of a backward pass run)."""
    for _ in range(n):
        logprobs = sequence_logprobs(model, filler.input_ids, filler.attention_mask, filler.loss_mask, temperature,
                                     logits_chunk_size=logits_chunk_size)
        if backward:
            (logprobs.sum() * 0.0).backward()


@torch.no_grad()
def batch_logprobs(model, batch: TokenBatch, temperature: float, micro_batch_size: int, *, logits_chunk_size: int = 0,
                   passes: int | None = None, filler: TokenBatch | None = None) -> torch.Tensor:
    """``(N, T)`` log-probs of the batch's target tokens at ``temperature`` (0 off the loss mask), no grad.

    ``passes`` (a sharded model, :func:`synced_passes`): run exactly this many forwards, the batch's micro-batches
    and then forwards of ``filler`` (:func:`filler_batch`); None: the micro-batches only.

    Raises:
        ValueError: see :func:`_fillers`.
    """
    fillers = _fillers(passes, filler, batch.input_ids.shape[0], micro_batch_size)
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for rows, mb in micro_batches(batch, micro_batch_size):
        out[rows, : mb.input_ids.shape[1]] = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature,
                                                               logits_chunk_size=logits_chunk_size)
    _filler_passes(model, filler, fillers, temperature, logits_chunk_size, backward=False)
    return out


def policy_loss_backward(
    model,
    batch: TokenBatch,
    advantages: torch.Tensor,
    *,
    temperature: float,
    micro_batch_size: int,
    loss_mode: Literal["seq_sum", "seq_mean", "token_mean"] = "seq_sum",
    old_logprobs: torch.Tensor | None = None,
    loss_fn: Callable[..., tuple[torch.Tensor, dict[str, float]]] = policy_gradient_loss,
    clip_low: float | None = None,
    clip_high: float | None = None,
    entropy_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: Literal["k1", "k3"] = "k3",
    num_sequences: int | None = None,
    num_tokens: float | None = None,
    logits_chunk_size: int = 0,
    passes: int | None = None,
    filler: TokenBatch | None = None,
) -> tuple[dict[str, float], torch.Tensor]:
    """Forward and backward of the RL loss on a batch of samples; gradients accumulate in ``model``.

    The loss is ``loss_fn(...) + kl_coef * kl_loss(...) - entropy_coef * entropy_bonus(...)`` over all
    N rows of ``batch``, reduced with ``loss_mode`` over the *whole* batch (num_sequences = N,
    num_tokens = all target tokens), so splitting into micro-batches gives exactly the full-batch
    gradient. Call ``optimizer.zero_grad()`` before and step after.

    Args:
        batch: ``(N, T)`` from :func:`rollout_batch`.
        advantages: ``(N,)`` one advantage per row.
        old_logprobs: ``(N, T)`` log-probs of the sampling policy (no grad); None: the current ones
            detached (ratio 1: REINFORCE, no extra forward).
        loss_fn: a policy loss of :data:`rlft.losses.pg.POLICY_LOSSES` (default: REINFORCE/PPO).
        clip_low, clip_high: PPO clipping range (both None: off; a loss without clipping ignores them).
        entropy_coef: weight of the entropy bonus (0: off, and no entropy is computed).
        ref_logprobs: ``(N, T)`` reference log-probs; needed when ``kl_coef > 0`` (the KL-in-the-loss term).
        num_sequences, num_tokens: the loss's normalisers (None: the batch's own row count and target
            token count). Pass the full step's values when ``batch`` holds only some of its rows (see
            :func:`gradient_rows`) so the gradient is that of the full step.
        passes, filler: a sharded model (:func:`synced_passes`): run exactly ``passes`` forwards and backwards,
            the batch's micro-batches (possibly none) and then passes of ``filler`` with a zero loss.
    Returns:
        ``(metrics, logprobs)``: ``loss/policy`` and ``loss/kl`` (sums over micro-batches = full-batch
        values), ``pg/clipfrac`` and ``pg/ratio_mean`` (token means over the batch), and the detached
        ``(N, T)`` log-probs this forward computed.
    Raises:
        ValueError: ``kl_coef > 0`` without ``ref_logprobs``; see also :func:`_fillers`.
    """
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    fillers = _fillers(passes, filler, batch.input_ids.shape[0], micro_batch_size)
    num_sequences = batch.input_ids.shape[0] if num_sequences is None else num_sequences
    num_tokens = float(batch.loss_mask.sum()) if num_tokens is None else float(num_tokens)
    own_tokens = float(batch.loss_mask.sum())
    metrics = {"loss/policy": 0.0, "loss/kl": 0.0, "loss/entropy": 0.0, "pg/clipfrac": 0.0, "pg/ratio_mean": 0.0}
    logprobs_out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for rows, mb in micro_batches(batch, micro_batch_size):
        width = mb.input_ids.shape[1]
        if entropy_coef > 0:
            logprobs, entropy = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature, return_entropy=True)
        else:
            logprobs = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature,
                                         logits_chunk_size=logits_chunk_size)
        old = logprobs.detach() if old_logprobs is None else old_logprobs[rows, :width]
        loss, pg_metrics = loss_fn(
            logprobs, old, advantages[rows], mb.loss_mask,
            clip_low=clip_low, clip_high=clip_high, mode=loss_mode, num_sequences=num_sequences, num_tokens=num_tokens,
        )  # fmt: skip
        if entropy_coef > 0:
            bonus, entropy_metrics = entropy_bonus(entropy, mb.loss_mask, mode=loss_mode, num_sequences=num_sequences, num_tokens=num_tokens)
            loss = loss - entropy_coef * bonus
            metrics["loss/entropy"] += entropy_metrics["loss/entropy"]
        if kl_coef > 0:
            kl, kl_metrics = kl_loss(
                logprobs, ref_logprobs[rows, :width], mb.loss_mask,
                estimator=kl_estimator, mode=loss_mode, num_sequences=num_sequences, num_tokens=num_tokens,
            )  # fmt: skip
            loss = loss + kl_coef * kl
            metrics["loss/kl"] += kl_metrics["loss/kl"]
        loss.backward()
        share = float(mb.loss_mask.sum()) / max(own_tokens, 1.0)  # token-weighted means over micro-batches
        metrics["loss/policy"] += pg_metrics["loss/policy"]
        metrics["pg/clipfrac"] += pg_metrics["pg/clipfrac"] * share
        metrics["pg/ratio_mean"] += pg_metrics["pg/ratio_mean"] * share
        logprobs_out[rows, :width] = logprobs.detach()
    _filler_passes(model, filler, fillers, temperature, logits_chunk_size, backward=True)
    return metrics, logprobs_out


def gradient_rows(advantages: torch.Tensor, kl_coef: float, entropy_coef: float = 0.0) -> torch.Tensor:
    """Indices of the rows that carry gradient: ``(M,)`` long, ``M <= N`` for ``advantages`` of shape ``(N,)``.

    A sample whose advantage is exactly 0 contributes exactly 0 to the policy-gradient loss and its
    gradient (REINFORCE and PPO-clipped alike: every term is multiplied by the advantage), so with no
    KL term in the loss (``kl_coef == 0``) only rows with a non-zero advantage need a forward and
    backward. With ``beta = 0`` that skips every group whose k rewards are all equal (common when
    the policy is confident: all correct or all wrong). With the KL or an entropy bonus in the loss
    every row carries gradient and is kept.
    The update stays exact as long as the loss is normalised by the full step's counts
    (``policy_loss_backward(..., num_sequences=, num_tokens=)``).
    """
    if kl_coef > 0 or entropy_coef > 0:
        return torch.arange(advantages.numel(), device=advantages.device)
    return (advantages != 0).nonzero().squeeze(1)


def take_rows(batch: TokenBatch, rows: torch.Tensor) -> TokenBatch:
    """The sub-batch of ``batch`` at ``rows`` (same width; micro-batches trim it)."""
    return TokenBatch(batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows])
