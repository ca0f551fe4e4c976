"""Batches of sampled sequences: teacher-forcing batch, log-prob passes, the loss's forward/backward.

Shape legend: N sampled sequences (B prompts x k samples, row ``b * k + j``), T tokens.

A model sharded by FSDP2 (:func:`rlft.distributed.sharded`) makes every forward and backward collective, so
every rank must run as many passes as the others, whatever its number of rows (zero included):
:func:`synced_passes` is that number, and :func:`batch_logprobs` and :func:`policy_loss_backward` given a
:class:`PassPlan` with ``passes`` and a :func:`filler_batch` run filler passes after their real micro-batches
(results discarded, a zero loss), as :func:`rlft.distributed.padded_micro_batches` does for the other recipes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

import torch

from rlft import distributed
from rlft.data.tokenize import TokenizedExample, collate
from rlft.losses.pg import PolicyObjective
from rlft.ops import sequence_logprobs
from rlft.rollout.base import Sample
from rlft.rollout.hf import encode_prompts
from rlft.types import TokenBatch


def generation_seed(seed: int, step: int, rank: int = 0) -> int:
    """The sampling seed of a step: distinct per step, the same after a resume; under torchrun, distinct per
    rank too (each rank samples other prompts; rank 0's seed is the one-process seed)."""
    return seed * 1_000_003 + step + rank * (1 << 40)


def replay_seed(seed: int, step: int) -> int:
    """The seed of a step's draw from the replay buffer (:meth:`rlft.rl.replay.ReplayBuffer.draw`): distinct per step
    and
    from every sampling seed, the same after a resume."""
    return generation_seed(seed, step) + (1 << 41)


def rollout_batch(tokenizer, prompts: list[str], samples: list[list[Sample]], *,
                  add_special_tokens: bool = True) -> TokenBatch:
    """The right-padded teacher-forcing batch of all sampled sequences: row ``b * k + j`` is ``samples[b][j]``.

    Prompt ids come from :func:`rlft.rollout.hf.encode_prompts`, the function :class:`HFEngine` tokenizes
    with; pass the engine's ``add_special_tokens`` (the recipe does), so the ids are those the sampler
    conditioned on. ``loss_mask`` is 1 on every generated id, the EOS included (masks come from lengths,
    never from token values, so pad == EOS is harmless), and 0 on a rollout's observations
    (``Sample.loss_mask``: tool output is context, with no log-prob, KL or entropy term of its own). No samples (a
    rank with no groups this step): a ``(0, 1)`` batch, which every pass below goes through with no forward.
    """
    if not samples:
        return TokenBatch(torch.zeros((0, 1), dtype=torch.long), torch.zeros((0, 1), dtype=torch.long),
                          torch.zeros((0, 1)))
    prompt_ids = encode_prompts(tokenizer, prompts, add_special_tokens=add_special_tokens)
    examples = [
        TokenizedExample(
            input_ids=list(prompt_ids[b]) + list(sample.completion_ids),
            loss_mask=[0] * len(prompt_ids[b]) + (
                [1] * len(sample.completion_ids) if sample.loss_mask is None else list(sample.loss_mask)),
            truncated=sample.finish_reason == "length",
        )
        for b, row in enumerate(samples)
        for sample in row
    ]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return collate(examples, pad_id)


def micro_batch_rows(lengths: torch.Tensor, size: int, max_tokens: int | None = None, *,
                     by_length: bool = True) -> list[torch.Tensor]:
    """The ``(n,)`` long tensors of row indices, one per micro-batch, that :func:`micro_batches` cuts rows of these
    ``lengths`` (``(N,)``, attention-mask sums) into, covering each row once.

    Without ``max_tokens``: ``size`` rows each (the last fewer). With it (``--max-tokens-per-micro-batch``): each
    micro-batch as many rows as fit ``max_tokens`` padded tokens (rows x its longest row), a longer row alone, so
    short completions go many to a pass and long ones few. With ``by_length`` (the default) the rows are taken in
    order of length (stable sort) whenever there is more than one micro-batch to cut, so each pads only to lengths
    like its own; ``by_length=False``: consecutive rows, as before 2026-11-28.
    """
    count = lengths.shape[0]
    sort = by_length and (count > size or max_tokens is not None)
    order = torch.argsort(lengths, stable=True) if sort else torch.arange(count, device=lengths.device)
    if max_tokens is None:
        return [order[start : start + size] for start in range(0, count, size)]
    cuts, start, longest = [], 0, 0
    for i, length in enumerate(lengths[order].tolist()):
        if i > start and (i + 1 - start) * max(longest, length) > max_tokens:
            cuts.append(order[start:i])
            start, longest = i, 0
        longest = max(longest, length)
    return cuts + ([order[start:]] if start < count else [])


def micro_batches(batch: TokenBatch, size: int, max_tokens: int | None = None, *,
                  by_length: bool = True) -> Iterator[tuple[torch.Tensor, TokenBatch]]:
    """``(rows, micro_batch)`` pairs covering the batch's N rows once: ``rows`` is a ``(n,)`` long tensor of row
    indices (:func:`micro_batch_rows`: ``n <= size``, or within ``max_tokens`` padded tokens), ``micro_batch``
    those rows trimmed to their own longest sequence.

    Taking rows in order of length (``by_length``) matters because a group's k samples sit in consecutive rows,
    and one answer cut at the token limit would otherwise widen its whole micro-batch (the SFT and DPO recipes
    group by length the same way, :func:`rlft.recipes.common.length_grouped`). The passes weight every
    micro-batch by the whole batch's normalisers (:class:`LossContext`), so the cut changes the padding (compute)
    and float rounding only.
    """
    lengths = batch.attention_mask.sum(dim=1)
    for rows in micro_batch_rows(lengths, size, max_tokens, by_length=by_length):
        width = int(lengths[rows].max())
        yield rows, TokenBatch(batch.input_ids[rows, :width], batch.attention_mask[rows, :width],
                               batch.loss_mask[rows, :width])


def synced_passes(model, count: int) -> int | None:
    """The number of passes every rank runs when ``model`` is sharded (FSDP2: the largest of the ranks' ``count``,
    each its own number of micro-batches; collective, so every rank must call it); None when it is not (each rank
    runs its own micro-batches only)."""
    if not distributed.sharded(model):
        return None
    return int(distributed.most(count))


def filler_batch(tokenizer, device: torch.device | str) -> TokenBatch:
    """A two-token sequence with one target (the pad id, else EOS, twice): the input of filler passes."""
    token = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TokenBatch(torch.full((1, 2), token, dtype=torch.long), torch.ones((1, 2), dtype=torch.long),
                      torch.tensor([[0.0, 1.0]])).to(device)


def _fillers(passes: int | None, filler: TokenBatch | None, count: int) -> int:
    """Filler passes to run after ``count`` real micro-batches so that there are ``passes`` in all.

    Raises:
        ValueError: ``passes`` below ``count``, or fillers needed and no ``filler``.
    """
    if passes is None:
        return 0
    n = passes - count
    if n < 0:
        raise ValueError(f"passes={passes} is fewer than the {count} micro-batches of this rank's rows")
    if n and filler is None:
        raise ValueError("filler passes need a filler batch (filler_batch)")
    return n


def _filler_passes(model, filler: TokenBatch, n: int, temperature: float, logits_chunk_size: int,
                   backward: bool) -> None:
    """``n`` forwards of ``filler`` whose log-probs are dropped; with ``backward`` each backpropagates a zero loss
    (a zero gradient, but the sharded model's collectives of a backward pass run)."""
    for _ in range(n):
        logprobs = sequence_logprobs(model, filler.input_ids, filler.attention_mask, filler.loss_mask, temperature,
                                     logits_chunk_size=logits_chunk_size)
        if backward:
            (logprobs.sum() * 0.0).backward()


@dataclass(frozen=True)
class PassPlan:
    """How the passes over a batch of samples run: micro-batches, temperature, LM-head chunking and, for a model
    sharded by FSDP2, the number of passes every rank runs (:func:`synced_passes`) and the filler they run on."""

    temperature: float
    """Log-probs are of ``softmax(logits / temperature)`` (the sampling temperature)."""
    micro_batch_size: int
    """Rows per forward (and backward), without ``max_tokens``."""
    logits_chunk_size: int = 0
    """:func:`rlft.ops.sequence_logprobs`'s chunking of the LM head (0: all at once)."""
    passes: int | None = None
    """A sharded model: run exactly this many passes, the batch's micro-batches and then passes of ``filler``;
    None: the micro-batches only."""
    filler: TokenBatch | None = None
    """The input of filler passes (:func:`filler_batch`)."""
    max_tokens: int | None = None
    """``--max-tokens-per-micro-batch``: micro-batches of at most this many padded tokens instead of
    ``micro_batch_size`` rows (:func:`micro_batch_rows`)."""

    def micro_batches(self, batch: TokenBatch) -> list[tuple[torch.Tensor, TokenBatch]]:
        """:func:`micro_batches` of ``batch`` by this plan's rule."""
        return list(micro_batches(batch, self.micro_batch_size, self.max_tokens))

    def synced(self, model, batch: TokenBatch) -> "PassPlan":
        """This plan for this rank's ``batch`` of ``model``: ``passes`` from :func:`synced_passes` of its number of
        micro-batches (collective when the model is sharded: every rank must call it; None otherwise)."""
        if not distributed.sharded(model):
            return replace(self, passes=None)
        count = len(micro_batch_rows(batch.attention_mask.sum(dim=1), self.micro_batch_size, self.max_tokens))
        return replace(self, passes=synced_passes(model, count))


@dataclass(frozen=True)
class LossContext:
    """What the loss needs besides the batch and its advantages: the log-probs it compares with and the whole
    step's normalisers. Tensors are ``(N, T)``, row-aligned with the batch."""

    old_logprobs: torch.Tensor | None = None
    """The sampling policy's log-probs (no grad); None: the current ones detached (ratio 1: REINFORCE, no
    extra forward)."""
    ref_logprobs: torch.Tensor | None = None
    """Reference log-probs; needed when the objective puts the KL in the loss."""
    sampler_logprobs: torch.Tensor | None = None
    """The sampler's own log-probs of the sampled tokens (:func:`sampler_logprobs`); needed by an
    importance-sampling correction (:attr:`rlft.losses.pg.PolicyObjective.is_mode`)."""
    num_sequences: int | None = None
    """Sequences of the whole step (None: the batch's rows). Pass the full step's values when the batch holds
    only some of its rows (see :func:`gradient_rows`) so the gradient is that of the full step."""
    num_tokens: float | None = None
    """Target tokens of the whole step (None: the batch's)."""


@torch.no_grad()
def batch_logprobs(model, batch: TokenBatch, plan: PassPlan) -> torch.Tensor:
    """``(N, T)`` log-probs of the batch's target tokens at ``plan.temperature`` (0 off the loss mask), no grad.

    ``plan.passes`` (a sharded model, :func:`synced_passes`): run exactly this many forwards, the batch's
    micro-batches and then forwards of ``plan.filler``; None: the micro-batches only.

    Raises:
        ValueError: see :func:`_fillers`.
    """
    parts = plan.micro_batches(batch)
    fillers = _fillers(plan.passes, plan.filler, len(parts))
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for rows, mb in parts:
        out[rows, :mb.input_ids.shape[1]] = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask,
                                                              plan.temperature,
                                                              logits_chunk_size=plan.logits_chunk_size)
    _filler_passes(model, plan.filler, fillers, plan.temperature, plan.logits_chunk_size, backward=False)
    return out


def policy_loss_backward(model, batch: TokenBatch, advantages: torch.Tensor, objective: PolicyObjective, plan: PassPlan,
                         context: LossContext = LossContext()) -> tuple[dict[str, float], torch.Tensor]:
    """Forward and backward of the RL loss on a batch of samples; gradients accumulate in ``model``.

    The loss is :meth:`rlft.losses.pg.PolicyObjective.loss` over all N rows of ``batch``, reduced with the
    objective's ``loss_mode`` over the *whole* batch (``context.num_sequences``, ``context.num_tokens``; None:
    this batch's), so splitting into micro-batches gives exactly the full-batch gradient. Call
    ``optimizer.zero_grad()`` before and step after.

    Args:
        batch: ``(N, T)`` from :func:`rollout_batch`.
        advantages: ``(N,)`` one loss weight per row (:meth:`~rlft.losses.pg.PolicyObjective.weights` of the
            advantages).
        objective: the loss, its clip range, KL and entropy terms.
        plan: micro-batches, temperature; a sharded model: exactly ``plan.passes`` forwards and backwards, the
            batch's micro-batches (possibly none) and then passes of ``plan.filler`` with a zero loss.
        context: old and reference log-probs, the step's normalisers.
    Returns:
        ``(metrics, logprobs)``: ``loss/policy``, ``loss/kl`` and ``loss/entropy`` (sums over micro-batches =
        full-batch values), ``pg/clipfrac`` and ``pg/ratio_mean`` (token means over the batch), and the detached
        ``(N, T)`` log-probs this forward computed.
    Raises:
        ValueError: a KL in the loss without ``context.ref_logprobs``; see also :func:`_fillers`.
    """
    if objective.kl_coef > 0 and context.ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    parts = plan.micro_batches(batch)
    fillers = _fillers(plan.passes, plan.filler, len(parts))
    num_sequences = batch.input_ids.shape[0] if context.num_sequences is None else context.num_sequences
    num_tokens = float(batch.loss_mask.sum()) if context.num_tokens is None else float(context.num_tokens)
    own_tokens = float(batch.loss_mask.sum())
    metrics = {"loss/policy": 0.0, "loss/kl": 0.0, "loss/entropy": 0.0, "pg/clipfrac": 0.0, "pg/ratio_mean": 0.0}
    logprobs_out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for rows, mb in parts:
        width = mb.input_ids.shape[1]
        entropy = None
        if objective.entropy_coef > 0:
            logprobs, entropy = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask,
                                                  plan.temperature, return_entropy=True)
        else:
            logprobs = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, plan.temperature,
                                         logits_chunk_size=plan.logits_chunk_size)
        old = logprobs.detach() if context.old_logprobs is None else context.old_logprobs[rows, :width]
        ref = context.ref_logprobs[rows, :width] if context.ref_logprobs is not None else None
        sampled = context.sampler_logprobs[rows, :width] if context.sampler_logprobs is not None else None
        loss, mb_metrics = objective.loss(logprobs, old, advantages[rows], mb.loss_mask, entropy=entropy,
                                          ref_logprobs=ref, sampler_logprobs=sampled, num_sequences=num_sequences,
                                          num_tokens=num_tokens)
        loss.backward()
        share = float(mb.loss_mask.sum()) / max(own_tokens, 1.0)  # token-weighted means over micro-batches
        for key in ("loss/policy", "loss/kl", "loss/entropy"):
            metrics[key] += mb_metrics[key]
        for key in (k for k in mb_metrics if k.startswith("pg/")):  # clipfrac, ratio_mean (and the IS weights' stats)
            metrics[key] = metrics.get(key, 0.0) + mb_metrics[key] * share
        logprobs_out[rows, :width] = logprobs.detach()
    _filler_passes(model, plan.filler, fillers, plan.temperature, plan.logits_chunk_size, backward=True)
    return metrics, logprobs_out


def gradient_rows(advantages: torch.Tensor, objective: PolicyObjective,
                  loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the rows that carry gradient: ``(M,)`` long, ``M <= N`` for ``advantages`` of shape ``(N,)``
    (the loss weights, after the objective's selection).

    A sample whose advantage is exactly 0 contributes exactly 0 to the policy-gradient loss and its
    gradient (REINFORCE and PPO-clipped alike: every term is multiplied by the advantage), so with no
    KL or entropy term in the loss only rows with a non-zero advantage need a forward and backward.
    With ``beta = 0`` that skips every group whose k rewards are all equal (common when the policy is
    confident: all correct or all wrong). With the KL or an entropy bonus in the loss
    (:attr:`~rlft.losses.pg.PolicyObjective.every_row_has_gradient`) every row is kept. Given the ``(N, T)``
    ``loss_mask``, rows without a target token (left out of the loss: :func:`without_rows`) are skipped too.
    The update stays exact as long as the loss is normalised by the full step's counts
    (:class:`LossContext`'s ``num_sequences`` and ``num_tokens``).
    """
    keep = torch.ones_like(advantages, dtype=torch.bool) if objective.every_row_has_gradient else advantages != 0
    if loss_mask is not None:
        keep = keep & (loss_mask.sum(dim=-1) > 0)
    return keep.nonzero().squeeze(1)


def masked_rows(batch: TokenBatch, dropped: torch.Tensor) -> TokenBatch:
    """``batch`` with the rows where ``dropped`` (``(N,)`` bool) is True left out of the loss: their ``loss_mask`` is
    zeroed, so they add nothing to the loss, its gradient or its token count, and :func:`gradient_rows` skips them
    (``--mask-truncated``, :func:`rlft.rl.logprobs.step_logprobs`). The rows stay (same shapes, row-aligned with the
    step's log-probs); pass the normalisers of the remaining rows (:class:`LossContext`). A new ``loss_mask``."""
    keep = (~dropped.bool()).to(batch.loss_mask.device)
    loss_mask = batch.loss_mask * keep.unsqueeze(1).to(batch.loss_mask.dtype)
    return TokenBatch(batch.input_ids, batch.attention_mask, loss_mask)


def without_rows(batch: TokenBatch, advantages: torch.Tensor, dropped: torch.Tensor) -> tuple[TokenBatch, torch.Tensor]:
    """:func:`masked_rows` of ``batch``, and its ``(N,)`` ``advantages`` with the dropped rows' set to 0."""
    keep = (~dropped.bool()).to(advantages.device)
    return masked_rows(batch, dropped), advantages * keep.to(advantages.dtype)


def sampler_logprobs(batch: TokenBatch, samples: list[list[Sample]]) -> torch.Tensor | None:
    """``(N, T)`` the sampler's log-probs of the sampled tokens, placed on ``batch``'s completion positions (its
    ``loss_mask``, row ``b * k + j`` = ``samples[b][j]``, as :func:`rollout_batch` builds it), 0 elsewhere; None
    when a sample has no log-probs (an engine that does not report them)."""
    flat = [s for row in samples for s in row]
    if any(s.logprobs is None or len(s.logprobs) != len(s.completion_ids) for s in flat):
        # (a rank with no samples gets an empty tensor: whether the sampler reports log-probs is the engine's)
        return None
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    for i, s in enumerate(flat):
        positions = batch.loss_mask[i].nonzero().squeeze(1)
        own = s.logprobs if s.loss_mask is None else [lp for lp, m in zip(s.logprobs, s.loss_mask) if m]
        out[i, positions[: len(own)].cpu()] = torch.tensor(own, dtype=torch.float32)
    return out.to(batch.loss_mask.device)


def with_logprobs(samples: list[list[Sample]], batch: TokenBatch, logprobs: torch.Tensor) -> list[list[Sample]]:
    """``samples`` where each sample without log-probs gets those of its row of ``logprobs`` (``(N, T)``, row
    ``b * k + j`` = ``samples[b][j]``, on ``batch``'s completion positions: the inverse of :func:`sampler_logprobs`);
    samples with log-probs are kept as they are. The RL loop's stand-in for an engine that reports none: the
    trainer's log-probs before the update, stored with the samples it replays (:mod:`rlft.rl.replay`)."""
    out, i = [], 0
    for row in samples:
        filled = []
        for s in row:
            if s.logprobs is None:
                positions = batch.loss_mask[i].nonzero().squeeze(1)[: s.model_tokens]
                own = iter(logprobs[i, positions].tolist())
                mask = s.loss_mask if s.loss_mask is not None else [1] * len(s.completion_ids)
                s = replace(s, logprobs=[next(own) if m else 0.0 for m in mask])
            filled.append(s)
            i += 1
        out.append(filled)
    return out


def mismatch_sums(trainer_logprobs: torch.Tensor, sampled_logprobs: torch.Tensor,
                  loss_mask: torch.Tensor) -> tuple[float, float, list[float]]:
    """``(sum |delta|, token count, |delta| values)`` of ``|trainer - sampler|`` log-probs over ``loss_mask``:
    the sampler/trainer mismatch (``mismatch/abs_logp_mean`` and ``_p99`` in the RL loop). ``(N, T)`` inputs."""
    delta = (trainer_logprobs - sampled_logprobs).abs()[loss_mask.bool()]
    return float(delta.sum()), float(delta.numel()), delta.tolist()


def take_rows(batch: TokenBatch, rows: torch.Tensor) -> TokenBatch:
    """The sub-batch of ``batch`` at ``rows`` (same width; micro-batches trim it)."""
    return TokenBatch(batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows])
