"""Step 7 of the RL loop: one ``metrics.jsonl`` record per step (the names are listed in :mod:`rlft.recipes.rl`).

:func:`step_record` builds it from the step's records (:class:`rlft.rl.records.StepSamples`,
:class:`rlft.rl.logprobs.StepLogprobs`, :class:`rlft.rl.records.StepUpdate`) and holds the rank reductions: under
torchrun a rank sees its own rows only, so :func:`step_counts` gives the rank's counts and sums, which are summed over
ranks (:func:`rlft.distributed.all_reduce_sums`) before :func:`sample_metrics` and :func:`update_metrics` turn them into
means; :func:`reduce_loss_metrics` combines the loss metrics the same way, and :func:`mismatch_metrics` its sums. The
rewards and advantages are every rank's already (:class:`rlft.compute.RunTotals` keeps the cumulative counts: samples,
tokens, estimated FLOPs); :func:`replay_log_ratios` feeds the ``replay/*`` metrics
(:meth:`rlft.rl.replay.ReplayBuffer.metrics`). Shape legend: B kept groups (with ``--replay-size``: fresh and
replayed), k samples per prompt, G >= B groups tried, N = B * k rows (this rank's: ``len(local) * k``), T tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlft import distributed
from rlft.losses.pg import PolicyObjective, sequence_kl
from rlft.ops import masked_sum
from rlft.rl.records import StepSamples, StepUpdate
from rlft.rl.shaping import shaping_metrics
from rlft.types import TokenBatch

if TYPE_CHECKING:
    from rlft.compute import RunTotals
    from rlft.rl.logprobs import StepLogprobs

LOSS_KEYS = ("loss/policy", "loss/kl", "loss/entropy", "pg/clipfrac", "pg/ratio_mean", "grad_norm")
"""The update's metrics, averaged over the step's ``ppo_epochs`` optimizer steps."""

NO_UPDATE = {"loss/policy": 0.0, "loss/kl": 0.0, "loss/entropy": 0.0, "pg/clipfrac": 0.0, "pg/ratio_mean": 1.0}
"""The loss metrics of a rank with no rows to update (nothing clipped, ratio 1)."""


def reduce_loss_metrics(metrics: dict[str, float], tokens: float) -> dict[str, float]:
    """Combine :func:`rlft.rl.batch.policy_loss_backward`'s metrics over ranks (unchanged in one process): the
    losses (already divided by the whole step's normalisers) are summed, ``pg/clipfrac`` and ``pg/ratio_mean``
    are weighted by each rank's ``tokens`` (target tokens of its updated rows), as one process weights its
    micro-batches. No tokens anywhere: clipfrac 0, ratio 1. Collective under torchrun."""
    if not distributed.active():
        return metrics
    weighted = {key: value * tokens if key.startswith("pg/") else value for key, value in metrics.items()}
    sums = distributed.all_reduce_sums({**weighted, "__tokens": tokens})
    total = sums.pop("__tokens")
    return {
        key: (value / total if total else (1.0 if key == "pg/ratio_mean" else 0.0)) if key.startswith("pg/") else value
        for key, value in sums.items()
    }


def step_counts(batch: TokenBatch, rows: torch.Tensor, old_logprobs: torch.Tensor | None,
                ref_logprobs: torch.Tensor | None, update_logprobs: torch.Tensor | None, kl_estimator: str,
                generated_tokens: int, *, epochs: int = 1, no_grad_passes: int = 0) -> dict[str, float]:
    """This rank's counts and sums behind the token metrics (sum them over ranks before use).

    The log-probs ``entropy`` and ``kl/mean`` are computed from are those the step already has: every row's
    pre-update log-probs when a no-grad pass computed them (``old_logprobs``, ``(N, T)``), else the first
    epoch's log-probs of the updated rows (``update_logprobs``, ``(M, T)`` for the ``M`` indices ``rows``),
    else none (no rows updated, no pass: no entropy or KL this step); on the target tokens of ``batch``'s
    ``loss_mask`` (rows without any, left out of the loss, do not count).

    Args:
        epochs: forward+backward passes each updated row went through (``ppo_epochs``).
        no_grad_passes: forward passes without gradient over every row of ``batch`` (the reference's and the
            pre-update policy's log-probs: 0, 1 or 2).
    Returns:
        ``rows`` (updated rows), ``update_tokens`` (non-pad tokens of the batch), ``generated_tokens``,
        ``trained_tokens`` (completion tokens of the updated rows x ``epochs``: through a backward),
        ``trained_seq_tokens`` (their prompt + completion tokens x ``epochs``), ``scored_tokens`` (non-pad tokens
        of the batch x ``no_grad_passes``), ``seen_tokens``, ``logprob_sum`` (sum of the seen target log-probs),
        ``kl_sum`` (sum over the seen rows of ``sum_t kl_t``, with a reference) and ``kl_rows`` (seen rows with a
        target token). Padding and FSDP2's filler passes count nowhere.
    """
    counts = {
        "rows": len(rows), "update_tokens": float(batch.attention_mask.sum()), "generated_tokens": generated_tokens,
        "trained_tokens": float(batch.loss_mask[rows].sum()) * epochs,
        "trained_seq_tokens": float(batch.attention_mask[rows].sum()) * epochs,
        "scored_tokens": float(batch.attention_mask.sum()) * no_grad_passes, "seen_tokens": 0.0, "logprob_sum": 0.0,
        "kl_sum": 0.0, "kl_rows": 0.0
    }
    if old_logprobs is not None:
        seen, mask, ref = old_logprobs, batch.loss_mask, ref_logprobs
    elif update_logprobs is not None:
        seen, mask = update_logprobs, batch.loss_mask[rows]
        ref = ref_logprobs[rows] if ref_logprobs is not None else None
    else:
        return counts
    counts.update(seen_tokens=float(mask.sum()), logprob_sum=float(masked_sum(seen, mask)))
    if ref is not None:
        counts.update(kl_sum=float(sequence_kl(seen, ref, mask, kl_estimator).sum()), kl_rows=float((mask.sum(dim=-1)
                                                                                                     > 0).sum()))
    return counts


def sample_metrics(got: StepSamples, counts: dict[str, float], reward_kind: str) -> dict[str, float]:
    """``reward/mean``, ``reward/std`` (raw scores of every sample generated this step, every tried group),
    ``reward/accuracy`` (score == 1.0) and ``reward/format_rate`` (>= 0.1; under ``countdown_accuracy``, which pays
    no format credit, the same as the accuracy) for a rule reward, ``groups/tried``, ``groups/kept`` (the fresh
    groups kept: replayed ones are not counted), ``samples/step`` and ``update/rows_frac``
    (updated rows over every trained sample, replayed included; ``counts`` summed over ranks)."""
    all_raw = got.all_raw  # (G, k)
    B, k = got.raw.shape  # fresh and replayed
    return {
        "reward/mean": all_raw.mean().item(),
        "reward/std": all_raw.std(unbiased=False).item(),
        **({
            "reward/accuracy": (all_raw == 1.0).float().mean().item(),
            "reward/format_rate": (all_raw >= 0.1).float().mean().item()
        } if reward_kind == "rule" else {}),
        "groups/tried": all_raw.shape[0],
        "groups/kept": len(got.kept),
        "samples/step": all_raw.numel(),
        "update/rows_frac": counts["rows"] / max(B * k, 1),
    }  # fmt: skip


def update_metrics(got: StepSamples, rewards: torch.Tensor, advantages: torch.Tensor, counts: dict[str, float],
                   num_tokens: float, update_s: float, masked: bool = False) -> dict[str, float]:
    """The metrics of a step that kept groups (B > 0): ``reward/shaped_mean`` (of ``rewards``, ``(B, k)``, what the
    advantages were computed from), ``adv/mean``, ``adv/std`` (of ``advantages``, ``(B, k)``),
    ``completion/mean_tokens`` (``num_tokens``, the step's completion tokens, per sample),
    ``completion/truncated_frac``, ``completion/looped_frac`` (this rank's samples stopped by ``--stop-repeats``,
    counted in ``truncated_frac`` too), ``update/masked_frac`` (the share of the samples left out of the loss: the
    truncated ones when ``masked``, ``--mask-truncated``; else 0), ``tokens_per_s/update`` (over ``update_s``
    seconds), ``entropy`` (minus the mean seen log-prob: a Monte-Carlo estimate), ``kl/mean`` (mean over seen rows
    of ``sum_t kl_t``) and ``tokens_per_s/generate``; with tool calls, per sample of this rank: ``tools/calls``,
    ``tools/errors`` and ``tools/observation_tokens``."""
    B, k = got.raw.shape
    truncated_frac = got.truncated.mean().item()
    record = {
        "reward/shaped_mean": rewards.mean().item(),
        "adv/mean": advantages.mean().item(),
        "adv/std": advantages.std(unbiased=False).item(),
        "completion/mean_tokens": num_tokens / (B * k),
        "completion/truncated_frac": truncated_frac,
        "completion/looped_frac": sum(s.looped for row in got.samples for s in row) /
        max(sum(map(len, got.samples)), 1),
        "update/masked_frac": truncated_frac if masked else 0.0,
        "tokens_per_s/update": counts["update_tokens"] / max(update_s, 1e-9),
    }
    flat = [s for row in got.samples for s in row]
    if flat and any(s.loss_mask is not None for s in flat):  # rollouts with tool calls (this rank's samples)
        record |= {"tools/calls": sum(s.tool_calls for s in flat) / len(flat),
                   "tools/errors": sum(s.tool_errors for s in flat) / len(flat),
                   "tools/observation_tokens": sum(len(s.completion_ids) - s.model_tokens for s in flat) / len(flat)}
    if counts["seen_tokens"] > 0:
        record["entropy"] = -counts["logprob_sum"] / counts["seen_tokens"]
        if counts["kl_rows"] > 0:
            record["kl/mean"] = counts["kl_sum"] / counts["kl_rows"]
    record["tokens_per_s/generate"] = counts["generated_tokens"] / max(got.generate_s, 1e-9)
    return record


def loss_metrics(epoch_metrics: list[dict[str, float]], objective: PolicyObjective) -> dict[str, float]:
    """:data:`LOSS_KEYS` averaged over the optimizer steps of the step (``loss/kl`` only with the KL in the loss,
    ``loss/entropy`` only with an entropy bonus), and the first optimizer step's ``lr``."""
    record = {}
    for key in LOSS_KEYS:
        if (key != "loss/kl" or objective.kl_coef > 0) and (key != "loss/entropy" or objective.entropy_coef > 0):
            record[key] = sum(m[key] for m in epoch_metrics) / len(epoch_metrics)
    # with an importance-sampling correction, or TOPR's truncation (token-weighted over micro-batches), when rows
    # updated
    for key in ("pg/is_weight_mean", "pg/is_zero_frac", "pg/topr_truncated_frac", "pg/topr_weight_mean"):
        if all(key in m for m in epoch_metrics):
            record[key] = sum(m[key] for m in epoch_metrics) / len(epoch_metrics)
    record["lr"] = epoch_metrics[0]["lr"]
    return record


def mismatch_metrics(batch: TokenBatch, rows: torch.Tensor, old_logprobs: torch.Tensor | None,
                     update_logprobs: torch.Tensor | None, sampled: torch.Tensor,
                     fresh_rows: int | None = None) -> dict[str, float]:
    """The sampler/trainer log-prob mismatch of the step: ``mismatch/abs_logp_mean`` (token mean of
    ``|trainer - sampler|`` log-prob, nats; summed over ranks) and ``mismatch/abs_logp_p99`` (its 99th percentile over
    this rank's tokens), on the tokens the trainer computed before the update (every row's ``old_logprobs`` when a
    no-grad pass made them, else the first epoch's ``update_logprobs`` of the updated ``rows``); empty when
    neither exists. ``sampled``: ``(N, T)``, :func:`rlft.rl.batch.sampler_logprobs`. ``fresh_rows``: only the first
    this many rows count (the samples generated this step; replayed rows after them differ by their staleness, not
    by the sampler's precision); None: all."""
    from rlft.rl.batch import mismatch_sums

    if fresh_rows is not None:
        fresh = rows < fresh_rows
        batch, sampled, rows = take_first(batch, fresh_rows), sampled[:fresh_rows], rows[fresh]
        old_logprobs = old_logprobs[:fresh_rows] if old_logprobs is not None else None
        update_logprobs = update_logprobs[fresh] if update_logprobs is not None else None
    if old_logprobs is not None:
        total, count, values = mismatch_sums(old_logprobs, sampled, batch.loss_mask)
    elif update_logprobs is not None:
        total, count, values = mismatch_sums(update_logprobs, sampled[rows], batch.loss_mask[rows])
    else:
        total, count, values = 0.0, 0.0, []
    sums = distributed.all_reduce_sums({"total": total, "count": count})
    if not sums["count"]:
        return {}
    out = {"mismatch/abs_logp_mean": sums["total"] / sums["count"]}
    if values:
        out["mismatch/abs_logp_p99"] = float(torch.quantile(torch.tensor(values), 0.99))
    return out


def step_record(got: StepSamples, logprobs: StepLogprobs, advantages: torch.Tensor, update: StepUpdate,
                objective: PolicyObjective, totals: RunTotals, cfg, *, reward_kind: str,
                update_s: float) -> dict[str, float]:
    """The step's metrics, before the replay, curriculum, evaluation and step-time ones: :func:`sample_metrics`, the
    run's totals (:meth:`rlft.compute.RunTotals.add`: tokens, FLOPs), with kept groups :func:`update_metrics` and
    :func:`rlft.rl.shaping.shaping_metrics`, :func:`loss_metrics`, ``time/generate_s`` and ``time/update_s``, and when
    every rank has the sampler's log-probs :func:`mismatch_metrics` of the fresh rows; with ``--hint solver`` the
    step's ``hint/*`` metrics (:mod:`rlft.rl.hints`).

    Args:
        advantages: ``(B, k)``, every rank's.
        cfg: the run's :class:`rlft.rl.config.RLConfig` (``ppo_epochs``, ``mask_truncated``, the shaping options).
        reward_kind: :attr:`rlft.rl.records.Reward.kind` (a rule reward also logs accuracy and format rate).
        update_s: seconds from the end of sampling to the end of the update.
    Collective under torchrun: every rank must call it.
    """
    counts = distributed.all_reduce_sums(step_counts(
        logprobs.train, update.rows, logprobs.old, logprobs.ref, update.logprobs, objective.kl_estimator,
        got.generated_tokens, epochs=cfg.ppo_epochs, no_grad_passes=logprobs.no_grad_passes))
    record = {**sample_metrics(got, counts, reward_kind), **totals.add(got.samples_tried, counts), **got.hints}
    if got.groups:
        record.update(update_metrics(got, logprobs.rewards, advantages, counts, logprobs.step_tokens, update_s,
                                     cfg.mask_truncated))
        record.update(shaping_metrics(cfg.shaping, cfg.max_new_tokens, got.lengths, got.raw, got.repeated))
    record.update({**loss_metrics(update.epoch_metrics, objective), "time/generate_s": got.generate_s,
                   "time/update_s": update_s})
    if logprobs.sampled_everywhere:
        fresh_rows = got.fresh * got.raw.shape[1] if cfg.replay_size else None
        record.update(mismatch_metrics(logprobs.train, update.rows, logprobs.old, update.logprobs, logprobs.sampled,
                                       fresh_rows=fresh_rows))
    return record


def progress_line(record: dict[str, float], groups: bool = False) -> str:
    """The progress bar's text for a step's ``record``: the mean reward, the KL when logged, and with ``groups``
    (``--filter-groups``) the kept groups of those tried."""
    info = f"reward {record['reward/mean']:.3f}" + (f"  kl {record['kl/mean']:.4f}" if "kl/mean" in record else "")
    return info + (f"  groups {record['groups/kept']}/{record['groups/tried']}" if groups else "")


def take_first(batch: TokenBatch, n: int) -> TokenBatch:
    """The first ``n`` rows of ``batch``."""
    return TokenBatch(batch.input_ids[:n], batch.attention_mask[:n], batch.loss_mask[:n])


def replay_log_ratios(batch: TokenBatch, rows: torch.Tensor, old_logprobs: torch.Tensor | None,
                      update_logprobs: torch.Tensor | None, behaviour: torch.Tensor, fresh_rows: int) -> torch.Tensor:
    """``(n,)`` the replayed samples' sequence log-ratios ``log pi(y|x) - log mu(y|x) = sum_t (logp_t - mu_t)`` (nats)
    under the policy before the update, for ``replay/abs_log_ratio_mean`` and ``_p99``: the rows from ``fresh_rows`` on
    that have a target token in ``batch``'s ``loss_mask`` (``(N, T)``), with every row's ``old_logprobs`` when a
    no-grad pass made them, else the first epoch's ``update_logprobs`` (``(M, T)``) of the updated ``rows`` (``(M,)``:
    no extra pass; a replayed row with a zero weight is then not counted). ``behaviour``: ``(N, T)``, the log-probs
    the loss divides by. Empty when none."""
    if old_logprobs is not None:
        index = torch.arange(batch.loss_mask.shape[0], device=batch.loss_mask.device)[fresh_rows:]
        current = old_logprobs[fresh_rows:]
    elif update_logprobs is not None:
        replayed = rows >= fresh_rows
        index, current = rows[replayed], update_logprobs[replayed]
    else:
        return torch.zeros(0)
    mask = batch.loss_mask[index]
    ratios = masked_sum(current - behaviour[index], mask, dim=-1)
    return ratios[mask.sum(dim=-1) > 0].detach().cpu()
