"""Step 7 of the RL loop: one ``metrics.jsonl`` record per step (the names are listed in :mod:`rlft.recipes.rl`).

Under torchrun a rank sees its own rows only: :func:`step_counts` gives the rank's counts and sums, which the
loop sums over ranks (:func:`rlft.distributed.all_reduce_sums`) before :func:`sample_metrics` and
:func:`update_metrics` turn them into means; :func:`reduce_loss_metrics` combines the loss metrics the same
way. The rewards and advantages are every rank's already. Shape legend: B kept groups, k samples per prompt,
G >= B groups tried, N = B * k rows (this rank's: ``len(local) * k``), T tokens.
"""

from __future__ import annotations

import torch

from rlft import distributed
from rlft.losses.pg import PolicyObjective, sequence_kl
from rlft.ops import masked_sum
from rlft.rl.sampling import StepSamples
from rlft.types import TokenBatch

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
    return {key: (value / total if total else (1.0 if key == "pg/ratio_mean" else 0.0)) if key.startswith("pg/") else value
            for key, value in sums.items()}


def step_counts(batch: TokenBatch, rows: torch.Tensor, old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None,
                update_logprobs: torch.Tensor | None, kl_estimator: str, generated_tokens: int) -> dict[str, float]:
    """This rank's counts and sums behind the token metrics (sum them over ranks before use).

    The log-probs ``entropy`` and ``kl/mean`` are computed from are those the step already has: every row's
    pre-update log-probs when a no-grad pass computed them (``old_logprobs``, ``(N, T)``), else the first
    epoch's log-probs of the updated rows (``update_logprobs``, ``(M, T)`` for the ``M`` indices ``rows``),
    else none (no rows updated, no pass: no entropy or KL this step); on the target tokens of ``batch``'s
    ``loss_mask`` (rows without any, left out of the loss, do not count).

    Returns:
        ``rows`` (updated rows), ``update_tokens`` (non-pad tokens of the batch), ``generated_tokens``,
        ``seen_tokens``, ``logprob_sum`` (sum of the seen target log-probs), ``kl_sum`` (sum over the seen rows
        of ``sum_t kl_t``, with a reference) and ``kl_rows`` (seen rows with a target token).
    """
    counts = {"rows": len(rows), "update_tokens": float(batch.attention_mask.sum()), "generated_tokens": generated_tokens,
              "seen_tokens": 0.0, "logprob_sum": 0.0, "kl_sum": 0.0, "kl_rows": 0.0}
    if old_logprobs is not None:
        seen, mask, ref = old_logprobs, batch.loss_mask, ref_logprobs
    elif update_logprobs is not None:
        seen, mask = update_logprobs, batch.loss_mask[rows]
        ref = ref_logprobs[rows] if ref_logprobs is not None else None
    else:
        return counts
    counts.update(seen_tokens=float(mask.sum()), logprob_sum=float(masked_sum(seen, mask)))
    if ref is not None:
        counts.update(kl_sum=float(sequence_kl(seen, ref, mask, kl_estimator).sum()), kl_rows=float((mask.sum(dim=-1) > 0).sum()))
    return counts


def sample_metrics(got: StepSamples, counts: dict[str, float], samples_total: int, reward_kind: str) -> dict[str, float]:
    """``reward/mean``, ``reward/std`` (raw scores of every sample generated this step, every tried group),
    ``reward/accuracy`` (score == 1.0) and ``reward/format_rate`` (>= 0.1) for a rule reward, ``groups/tried``,
    ``groups/kept``, ``samples/step``, ``samples/total`` and ``update/rows_frac`` (``counts`` summed over ranks)."""
    all_raw = got.all_raw  # (G, k)
    B, k = got.raw.shape
    return {
        "reward/mean": all_raw.mean().item(),
        "reward/std": all_raw.std(unbiased=False).item(),
        **({"reward/accuracy": (all_raw == 1.0).float().mean().item(), "reward/format_rate": (all_raw >= 0.1).float().mean().item()}
           if reward_kind == "rule" else {}),
        "groups/tried": all_raw.shape[0],
        "groups/kept": B,
        "samples/step": all_raw.numel(),
        "samples/total": samples_total,
        "update/rows_frac": counts["rows"] / max(B * k, 1),
    }  # fmt: skip


def update_metrics(got: StepSamples, rewards: torch.Tensor, advantages: torch.Tensor, counts: dict[str, float], num_tokens: float,
                   update_s: float) -> dict[str, float]:
    """The metrics of a step that kept groups (B > 0): ``reward/shaped_mean`` (of ``rewards``, ``(B, k)``, what the
    advantages were computed from), ``adv/mean``, ``adv/std`` (of ``advantages``, ``(B, k)``),
    ``completion/mean_tokens`` (``num_tokens``, the step's completion tokens, per sample),
    ``completion/truncated_frac``, ``tokens_per_s/update`` (over ``update_s`` seconds), ``entropy`` (minus the mean
    seen log-prob: a Monte-Carlo estimate), ``kl/mean`` (mean over seen rows of ``sum_t kl_t``) and
    ``tokens_per_s/generate``."""
    B, k = got.raw.shape
    record = {
        "reward/shaped_mean": rewards.mean().item(),
        "adv/mean": advantages.mean().item(),
        "adv/std": advantages.std(unbiased=False).item(),
        "completion/mean_tokens": num_tokens / (B * k),
        "completion/truncated_frac": got.truncated.mean().item(),
        "tokens_per_s/update": counts["update_tokens"] / max(update_s, 1e-9),
    }
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
    for key in ("pg/is_weight_mean", "pg/is_zero_frac"):  # with an importance-sampling correction, when rows updated
        if all(key in m for m in epoch_metrics):
            record[key] = sum(m[key] for m in epoch_metrics) / len(epoch_metrics)
    record["lr"] = epoch_metrics[0]["lr"]
    return record


def mismatch_metrics(batch: TokenBatch, rows: torch.Tensor, old_logprobs: torch.Tensor | None,
                     update_logprobs: torch.Tensor | None, sampled: torch.Tensor) -> dict[str, float]:
    """The sampler/trainer log-prob mismatch of the step: ``mismatch/abs_logp_mean`` (token mean of
    ``|trainer - sampler|`` log-prob, nats; summed over ranks) and ``mismatch/abs_logp_p99`` (its 99th percentile over
    this rank's tokens), on the tokens the trainer computed before the update (every row's ``old_logprobs`` when a
    no-grad pass made them, else the first epoch's ``update_logprobs`` of the updated ``rows``); empty when
    neither exists. ``sampled``: ``(N, T)``, :func:`rlft.rl.batch.sampler_logprobs`."""
    from rlft.rl.batch import mismatch_sums

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
