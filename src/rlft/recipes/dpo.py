"""Direct preference optimisation (DPO, IPO, RPO) on chosen/rejected pairs, text or chat.

One linear loop, like :mod:`rlft.recipes.sft`:

1. read the pairs (``--data``, ``--data-split``) in the format chosen once by ``--data-format``
   (``text``: prompts already rendered, e.g. ``rlft pairs countdown`` output; ``chat``: conversations
   rendered with the chat template; ``auto``: detected from the first row);
2. tokenize each pair as two sequences sharing the prompt tokens, loss on the response only (and, for
   chat, its end-of-turn token), cutting or dropping pairs that do not fit ``--max-length``. Steps 1 and 2,
   their formats and truncation rules, are :mod:`rlft.recipes.dpo_data`'s; the counts (rows, invalid rows
   skipped, ties, drops, truncations) are logged and written to ``output_dir/data_stats.json``;
3. compute the reference model's log-probs of every response ONCE (``--ref-model``, default: the
   initial ``--model``), cache them in ``output_dir/ref_logps.pt`` under a fingerprint of the
   reference model and every token id and mask (a resumed run reads them back when it matches) and
   free the reference model: only the policy is in memory during training (docs/design.md pitfall 7);
4. train: each micro-batch puts its B chosen and B rejected sequences through ONE forward pass
   (a right-padded batch of 2B rows), the loss picked once by ``--loss-type`` is scaled so that
   micro-batches add up to exactly the full-batch mean; checkpoints and ``--resume`` as in SFT.

``--loss-type``: ``dpo`` (summed response log-probs, optional ``--label-smoothing``), ``ipo``
(per-token-mean log-probs, the usual length normalisation), ``rpo`` (DPO + ``--rpo-alpha`` x token-mean
NLL of the chosen responses).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from rlft import distributed
from rlft.console import training_progress
from rlft.data.packing import default_pack_length, pack_examples, sequence_sums
from rlft.data.tokenize import collate
from rlft.fsio import atomic_open
from rlft.losses.dpo import dpo_loss, ipo_loss, rpo_loss
from rlft.models import DeviceSpec, load_model
from rlft.ops import aggregate, masked_mean, masked_sum, sequence_logprobs
from rlft.recipes.common import (batch_indices, begin_run, checkpoint_if_due, finish_run, micro_batch_label,
                                 optimizer_step, start_training, step_micro_batches, step_order, step_plan,
                                 write_data_stats)
from rlft.recipes.memory import cut_by_tokens, packed_tokens, padded_tokens
from rlft.recipes.dpo_config import DPOConfig
from rlft.recipes.dpo_data import TokenizedPair, load_tokenized_pairs

log = logging.getLogger("rlft")

REF_CACHE = "ref_logps.pt"


# --------------------------------------------------------------------------- log-probs


@dataclass
class PairLogprobs:
    """Per-pair response log-probs of a batch of B pairs (all float32)."""

    chosen_sum: torch.Tensor  # (B,) summed log-probs of the chosen response tokens (+ EOS)
    rejected_sum: torch.Tensor  # (B,)
    chosen_mean: torch.Tensor  # (B,) per-token mean of the same
    rejected_mean: torch.Tensor  # (B,)
    chosen_token_logps: torch.Tensor  # (B, T) per-token log-probs of the chosen rows, 0 off-mask (packed: (R, L))
    chosen_mask: torch.Tensor  # (B, T) 1 on chosen response tokens (packed: (R, L), 1 on chosen tokens only)


def pair_logprobs(model, pairs: list[TokenizedPair], pad_token_id: int, device, *, packing: bool = False,
                  pack_length: int | None = None, logits_chunk_size: int = 0) -> PairLogprobs:
    """Log-probs of each pair's chosen and rejected response from ONE forward pass.

    The B chosen and B rejected sequences are collated into one right-padded ``(2B, T)`` batch (rows
    ``0..B-1`` chosen, ``B..2B-1`` rejected). Causal attention with right padding means neither the
    amount of padding nor the other rows change a pair's values (up to float rounding). With
    ``packing`` the 2B sequences are packed instead (:mod:`rlft.data.packing`, rows of at most
    ``pack_length`` tokens, default :func:`rlft.data.packing.default_pack_length`) and the per-sequence
    sums are taken out of the packed rows; the values are the same up to float rounding.
    ``logits_chunk_size``: see :func:`rlft.ops.sequence_logprobs`.
    """
    sequences = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    n = len(pairs)
    if packing:
        lengths = [len(e.input_ids) for e in sequences]
        packed = pack_examples(sequences, pad_token_id, pack_length or default_pack_length(model, lengths)).to(device)
        token_logps = sequence_logprobs(model, packed.input_ids, None, packed.loss_mask,
                                        position_ids=packed.position_ids, logits_chunk_size=logits_chunk_size)  # (R, L)
        sums = sequence_sums(token_logps, packed)  # (2B,)
        means = sums / sequence_sums(torch.ones_like(token_logps), packed).clamp(min=1)
        chosen_mask = packed.loss_mask * ((packed.sequence_index >= 0) & (packed.sequence_index < n))
        return PairLogprobs(chosen_sum=sums[:n], rejected_sum=sums[n:], chosen_mean=means[:n], rejected_mean=means[n:],
                            chosen_token_logps=token_logps, chosen_mask=chosen_mask)
    batch = collate(sequences, pad_token_id).to(device)
    chunking = {"logits_chunk_size": logits_chunk_size} if logits_chunk_size else {}  # default: the plain call
    token_logps = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                    **chunking)  # (2B, T)
    sums = masked_sum(token_logps, batch.loss_mask, dim=-1)  # (2B,)
    means = masked_mean(token_logps, batch.loss_mask, dim=-1)  # (2B,)
    return PairLogprobs(
        chosen_sum=sums[:n],
        rejected_sum=sums[n:],
        chosen_mean=means[:n],
        rejected_mean=means[n:],
        chosen_token_logps=token_logps[:n],
        chosen_mask=batch.loss_mask[:n],
    )


def pair_batch_tokens(pairs: list[TokenizedPair], packing: bool = False) -> int:
    """The size ``--max-tokens-per-micro-batch`` bounds, of a micro-batch of ``pairs``: padded, 2 rows per pair
    x the longest side of any pair; with ``packing``, every chosen and rejected token (:mod:`rlft.recipes.memory`)."""
    if packing:
        return packed_tokens([len(p.chosen.input_ids) + len(p.rejected.input_ids) for p in pairs])
    return padded_tokens([_longest_side(p) for p in pairs], rows_per_item=2)


def _longest_side(pair: TokenizedPair) -> int:
    return max(len(pair.chosen.input_ids), len(pair.rejected.input_ids))


def _forward_options(cfg: DPOConfig) -> dict:
    """:func:`pair_logprobs`'s keyword options from the config (policy and reference alike)."""
    return {"packing": cfg.packing, "pack_length": cfg.pack_length, "logits_chunk_size": cfg.logits_chunk_size}


def _fingerprint(ref_name: str, pairs: list[TokenizedPair], dtype: torch.dtype) -> str:
    """Identifies the reference computation: reference model name, dtype and every token id and mask."""
    h = hashlib.sha256(f"{ref_name}|{dtype}|{len(pairs)}".encode())
    for p in pairs:
        for e in (p.chosen, p.rejected):
            h.update(str((e.input_ids, e.loss_mask)).encode())
    return h.hexdigest()


@torch.no_grad()
def compute_reference_logprobs(model, pairs: list[TokenizedPair], pad_token_id: int, device, batch_size: int, *,
                               max_tokens: int | None = None, **forward) -> dict[str, torch.Tensor]:
    """Reference log-probs of every pair: ``{"chosen_sum", "rejected_sum", "chosen_mean",
    "rejected_mean"}``, each ``(N,)`` float32 on the CPU, in the order of ``pairs``. Forward passes of
    ``batch_size`` consecutive pairs, or with ``max_tokens`` (``--max-tokens-per-micro-batch``) of the pairs
    sorted by length and cut by :func:`pair_batch_tokens`. ``forward``: :func:`pair_logprobs`'s keyword
    options (packing, pack_length, logits_chunk_size)."""
    n = len(pairs)
    if max_tokens is None:
        chunks = [list(range(start, min(start + batch_size, n))) for start in range(0, n, batch_size)]
    else:
        order = sorted(range(n), key=lambda i: _longest_side(pairs[i]))
        chunks = cut_by_tokens(order,
                               lambda idx: pair_batch_tokens([pairs[i] for i in idx], forward.get("packing", False)),
                               max_tokens)
    was_training = model.training
    model.eval()
    out = {
        k: torch.zeros(n, dtype=torch.float32)
        for k in ("chosen_sum", "rejected_sum", "chosen_mean", "rejected_mean")
    }
    try:
        with training_progress("reference") as progress:
            bar = progress.add_task("reference log-probs", total=n, info="")
            for idx in chunks:
                lp = pair_logprobs(model, [pairs[i] for i in idx], pad_token_id, device, **forward)
                for key, values in out.items():
                    values[idx] = getattr(lp, key).float().cpu()
                progress.update(bar, advance=len(idx))
    finally:
        model.train(was_training)
    return out


def reference_logprobs(
    cfg: DPOConfig, pairs: list[TokenizedPair], pad_token_id: int, spec: DeviceSpec, run_dir: Path
) -> dict[str, torch.Tensor]:
    """Reference log-probs of all pairs, from ``run_dir/ref_logps.pt`` when resuming and it matches,
    else computed with the reference model, which is loaded here and freed before returning.

    Under torchrun every rank reads the cache (the same file, so the same decision), or computes its
    :func:`rlft.distributed.shard` of the pairs, and the shards are gathered on every rank
    (:func:`rlft.distributed.gather_shards`); rank 0 writes the cache. The values equal the
    one-process ones up to float rounding (other micro-batch groupings, so other padding)."""
    ref_name = cfg.ref_model or cfg.model
    path = run_dir / REF_CACHE
    fingerprint = _fingerprint(ref_name, pairs, spec.dtype)
    if cfg.resume and path.is_file():
        cached = torch.load(path, weights_only=True)
        if cached.get("fingerprint") == fingerprint:
            log.info("reference log-probs read from %s", path)
            return {k: v for k, v in cached.items() if k != "fingerprint"}
        log.warning("%s was computed for other pairs or another reference model: recomputing", path)
    log.info("computing reference log-probs of %d pairs with %s", len(pairs), ref_name)
    model = load_model(ref_name, spec)
    mine = distributed.shard(pairs)  # all of them in one process
    if mine:
        ref = compute_reference_logprobs(model, mine, pad_token_id, spec.device, cfg.micro_batch_size,
                                         max_tokens=cfg.max_tokens_per_micro_batch, **_forward_options(cfg))
    else:  # more ranks than pairs
        ref = {k: torch.zeros(0) for k in ("chosen_sum", "rejected_sum", "chosen_mean", "rejected_mean")}
    del model  # the only reference: training never holds the reference model
    gc.collect()
    if spec.device.type == "cuda":
        torch.cuda.empty_cache()
    ref = distributed.gather_shards(ref, len(pairs))
    if distributed.is_main():
        with atomic_open(path, "wb") as f:
            torch.save({**ref, "fingerprint": fingerprint}, f)
    return ref


# --------------------------------------------------------------------------- loss choice


PreferenceLossFn = Callable[[PairLogprobs, dict[str, torch.Tensor], torch.Tensor], tuple[torch.Tensor, dict[str,
                                                                                                            float]]]


def build_preference_loss(cfg: DPOConfig) -> PreferenceLossFn:
    """Pick the loss once: returns ``fn(policy, ref, chosen_nll) -> (loss, metrics)``.

    ``policy`` is the micro-batch's :class:`PairLogprobs`, ``ref`` the matching slices of the
    reference log-probs, ``chosen_nll`` the token-mean NLL of the chosen responses (used by rpo only).
    dpo and rpo see summed log-probs, ipo per-token means.
    """
    beta, eps, alpha = cfg.beta, cfg.label_smoothing, cfg.rpo_alpha

    def dpo(p: PairLogprobs, r, nll):
        return dpo_loss(p.chosen_sum, p.rejected_sum, r["chosen_sum"], r["rejected_sum"], beta=beta,
                        label_smoothing=eps)

    def ipo(p: PairLogprobs, r, nll):
        return ipo_loss(p.chosen_mean, p.rejected_mean, r["chosen_mean"], r["rejected_mean"], beta=beta)

    def rpo(p: PairLogprobs, r, nll):
        return rpo_loss(p.chosen_sum, p.rejected_sum, r["chosen_sum"], r["rejected_sum"],
                        chosen_nll=nll, beta=beta, alpha=alpha, label_smoothing=eps)

    losses = {"dpo": dpo, "ipo": ipo, "rpo": rpo}
    if cfg.loss_type not in losses:
        raise ValueError(f"unknown loss_type {cfg.loss_type!r}; choose from {sorted(losses)}")
    return losses[cfg.loss_type]


# --------------------------------------------------------------------------- training


def preference_backward(model, pairs: list[TokenizedPair], indices: list[int], ref: dict[str, torch.Tensor],
                        loss_fn: PreferenceLossFn, cfg: DPOConfig, pad_token_id: int,
                        device) -> tuple[dict[str, float], int]:
    """The forward and backward passes of one optimizer step over ``pairs[i] for i in indices`` (the whole step's,
    every rank's, ordered by :func:`rlft.recipes.common.step_order`; ``ref``: every pair's reference log-probs):
    this rank's micro-batches (:func:`rlft.recipes.common.step_micro_batches`), each loss weighted by its share of
    the step's pairs and the RPO NLL divided by the step's chosen-token count, so the accumulated gradient is the
    step's mean loss however it is cut (FSDP2's filler passes weigh 0). Returns the weighted metric sums
    (``loss`` and ``loss_fn``'s) and the real tokens of this rank's passes (sum both over ranks)."""
    num_chosen_tokens = sum(sum(pairs[i].chosen.loss_mask) for i in indices)  # of the global batch
    size = lambda idx: pair_batch_tokens([pairs[i] for i in idx], cfg.packing)  # noqa: E731
    sums: dict[str, float] = {}
    seen = 0
    for idx, real in step_micro_batches(indices, cfg, size, distributed.sharded(model)):
        weight = len(idx) / len(indices) if real else 0.0  # micro-batch means, weighted, add up to the batch mean
        policy = pair_logprobs(model, [pairs[i] for i in idx], pad_token_id, device, **_forward_options(cfg))
        ref_mb = {k: v[idx].to(device) for k, v in ref.items()}
        # Token-mean over the whole batch's chosen tokens, divided by the weight that scales the loss.
        chosen_nll = -aggregate(policy.chosen_token_logps, policy.chosen_mask, num_tokens=num_chosen_tokens) / (weight
                                                                                                                or 1.0)
        loss, metrics = loss_fn(policy, ref_mb, chosen_nll)
        (loss * weight).backward()
        if not real:
            continue
        for key, value in {"loss": loss.item(), **metrics}.items():
            sums[key] = sums.get(key, 0.0) + weight * value
        seen += sum(len(pairs[i].chosen.input_ids) + len(pairs[i].rejected.input_ids) for i in idx)
    return sums, seen


def train_dpo(cfg: DPOConfig) -> Path:
    """Run preference optimisation as configured; returns the folder of the final model (``output_dir/model``).

    Under torchrun each rank trains on its :func:`rlft.distributed.shard` of every step's pairs; each
    micro-batch's loss is weighted by its share of the *whole* step's pairs (and the RPO NLL divided by
    the whole step's chosen-token count), gradients are summed over ranks, so the run equals the
    one-process run (up to float rounding); rank 0 writes every file."""
    loss_fn = build_preference_loss(cfg)
    run, spec, tokenizer = begin_run(cfg)  # refuses a folder holding another run; writes nothing yet
    pairs, stats = load_tokenized_pairs(cfg, tokenizer)
    steps_per_epoch, total_steps = step_plan(len(pairs), cfg)  # refuses an absurd count before the folder is made
    run_dir = run.open()
    write_data_stats(run_dir, stats)
    ref = reference_logprobs(cfg, pairs, tokenizer.pad_token_id, spec, run_dir)

    setup, tracker = start_training(cfg, run_dir, spec, total_steps)
    model, start_step = setup.model, setup.start_step
    log.info("%s: %d pairs, %d steps of %d pairs (%s) on %s (%s), beta %g", cfg.loss_type.upper(), len(pairs),
             total_steps, cfg.batch_size, micro_batch_label(cfg), spec.device, spec.label, cfg.beta)

    with training_progress(cfg.loss_type) as progress:
        bar = progress.add_task(cfg.loss_type, total=total_steps, completed=start_step, info="")
        for step in range(start_step, total_steps):
            t0 = time.perf_counter()
            indices = step_order(batch_indices(step, len(pairs), cfg.batch_size, cfg.seed),
                                 lambda i: _longest_side(pairs[i]), cfg)
            sums, seen = preference_backward(model, pairs, indices, ref, loss_fn, cfg, tokenizer.pad_token_id,
                                             spec.device)
            sums, seen = distributed.all_reduce_counted(sums, seen)
            step_info = optimizer_step(setup, cfg.max_grad_norm,
                                       loss=sums.get("loss"))  # stops on a non-finite loss or gradient
            elapsed = time.perf_counter() - t0
            record = {"step": step + 1, "epoch": (step + 1) / steps_per_epoch, **sums, **step_info,
                      "tokens": seen, "tokens_per_s": seen / elapsed}
            setup.metrics.log(record)
            progress.update(
                bar, advance=1,
                info=f"loss {sums['loss']:.4f}  acc {sums['rewards/accuracy']:.2f}  margin {sums['rewards/margin']:.3f}"
            )
            checkpoint_if_due(setup, run_dir, step + 1, total_steps, tokenizer, cfg)
    return finish_run(run_dir, model, tokenizer, cfg, tracker, cfg.loss_type.upper())
