"""TOPR, Tapered Off-Policy REINFORCE (Le Roux, Bellemare et al. 2025, "Tapered Off-Policy REINFORCE: Stable and
efficient reinforcement learning for LLMs", arXiv 2503.14286): a policy loss made for stale samples.

A pure function of tensors with the signature shared by :data:`rlft.losses.pg.POLICY_LOSSES` (its entry ``"topr"``,
``--loss topr``). Shape legend: B sequences, T tokens.
"""

from __future__ import annotations

import torch

from rlft.ops import AggregationMode, aggregate, masked_mean


def topr_sequence_weights(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                          loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TOPR's per-sequence weights ``w`` (no grad) and the sequence log-ratios they come from.

    ``log_ratio = sum_t (logprobs_t - old_logprobs_t)`` over the target tokens (``log pi(y|x) - log mu(y|x)``,
    nats); ``w = 1`` where ``A >= 0`` and ``w = clamp(exp(log_ratio), 0, 1)`` where ``A < 0``. Positions off the
    mask are never read (a padded ``-inf`` gives no NaN).

    Args:
        logprobs, old_logprobs: ``(B, T)``; loss_mask: ``(B, T)``; advantages: ``(B,)``.
    Returns:
        ``(weights, log_ratio)``: ``(B,)`` float32 each, detached.
    """
    diff = torch.where(loss_mask > 0,
                       logprobs.detach().float() - old_logprobs.detach().float(), torch.zeros((),
                                                                                              device=logprobs.device))
    log_ratio = diff.sum(dim=-1)
    # exp overflows to inf for a large positive log-ratio: clamped to 1, as it should be
    tapered = torch.exp(log_ratio).clamp(min=0.0, max=1.0)
    weights = torch.where(advantages < 0, tapered, torch.ones_like(tapered))
    return weights, log_ratio


def topr_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float | None = None,
    mode: AggregationMode = "seq_mean",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TOPR (Le Roux et al. 2025, arXiv 2503.14286, Sec. 3: the TOPR gradient): REINFORCE on positive samples,
    truncated importance sampling on negative ones.

    With ``mu`` the behaviour policy (the sampler that generated the sequence, possibly several updates ago) and
    ``pi`` the current policy, the paper's gradient is (its tapered importance sampling with the ratio left out on
    positive samples and truncated to [0, 1] on negative ones)::

        grad J = sum_{tau: R >= 0} mu(tau) R(tau) grad log pi(tau)
               + sum_{tau: R < 0}  mu(tau) [pi(tau) / mu(tau)]_0^1 R(tau) grad log pi(tau)

    so, per sequence, ``l = -sg(w) * A * log pi(y|x)`` with ``w = 1`` for ``A >= 0`` (no ratio: the SFT-like term)
    and ``w = sg(clip(pi(y|x) / mu(y|x), 0, 1))`` for ``A < 0``. The advantage plays the paper's reward (its
    baseline ``c`` is the advantage estimator's). Positives keep a fixed step however far the policy moved; a
    negative sample's weight fades as the policy already makes it less likely than the sampler did (ratio < 1),
    which bounds the objective (negative REINFORCE off-policy drives log pi(y) to -inf), and is never above 1.

    **The ratio is per sequence**, ``pi(y|x) / mu(y|x) = exp(sum_t (logprobs_t - old_logprobs_t))``, as the paper
    defines it, on trajectories ``tau``: the truncation caps the product of token ratios at 1, so the variance
    that makes untruncated sequence-level importance sampling unusable cannot appear (it can only shrink to 0), and
    one weight per sequence keeps the estimator the paper analyses. A per-token ratio would weight each token of a
    negative sample by its own ratio, another estimator.

    Per token this is written ``l_t = -sg(w) * A * exp(logp_t - sg(logp_t))``: the gradient of
    ``-sg(w) * A * logp_t`` and the value ``-w * A`` that ``reinforce`` (``-A * ratio``) has at ratio 1. On-policy
    (``old_logprobs == logprobs``) every weight is 1 and the loss, value and gradient, is REINFORCE's.

    ``old_logprobs`` are the behaviour policy's: the sampler's own per-token log-probs of the sequence at the
    sampling temperature (for a sample replayed from :class:`rlft.rl.replay.ReplayBuffer`, those stored with it),
    so the ratio is current / behaviour however stale the sample is.

    Reduction (:func:`rlft.ops.aggregate`) as :func:`rlft.losses.pg.policy_gradient_loss`; the default,
    ``seq_mean``, divides each sequence's loss by its length as the paper's experiments do (Sec. 4.1).

    Args:
        logprobs: ``(B, T)`` log-probs of the sampled tokens under the current policy (with grad), nats.
        old_logprobs: ``(B, T)`` the behaviour policy's (no grad).
        advantages: ``(B,)`` one advantage per sequence; its sign picks the branch.
        loss_mask: ``(B, T)`` 1 on completion tokens, 0 elsewhere.
        clip_low, clip_high: must be None (TOPR's limits are fixed; ``POLICY_LOSSES["topr"].clips`` is False).
        mode, num_sequences, num_tokens: as :func:`rlft.losses.pg.policy_gradient_loss` (the whole step's
            normalisers when this call sees one micro-batch).
        token_weights: ``(B, T)`` constant per-token factors (the sampler-mismatch weights); None: 1.
    Returns:
        ``(loss, metrics)``; metrics: ``loss/policy``; ``pg/clipfrac``: share of this call's target tokens in
        truncated sequences (A < 0, ratio < 1: gradient scaled down, never zeroed); ``pg/ratio_mean``: token mean
        of the per-token ratio (as the other losses report it); ``pg/topr_truncated_frac``: share of this call's
        negative samples (A < 0) whose sequence ratio is < 1 (0 when none); ``pg/topr_weight_mean``: mean
        truncated ratio ``w`` of the negative samples (1 when none).
    Raises:
        ValueError: ``advantages`` not of shape ``(B,)``; a clip range given.
    """
    if advantages.dim() != 1 or advantages.shape[0] != logprobs.shape[0]:
        raise ValueError(f"advantages must have shape (B,) = ({logprobs.shape[0]},), got {tuple(advantages.shape)}")
    if clip_low is not None or clip_high is not None:
        raise ValueError("topr takes no clip range (its truncation is fixed at [0, 1]), "
                         f"got clip_low={clip_low}, clip_high={clip_high}")
    weights, log_ratio = topr_sequence_weights(logprobs, old_logprobs, advantages, loss_mask)
    scale = (weights * advantages.detach().float()).to(logprobs.dtype).unsqueeze(-1)  # (B, 1), no grad
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    # value -w * A, gradient -w * A * grad logp_t; 0 in the exponent off the mask (a padded -inf gives no NaN)
    per_token = -scale * torch.exp(torch.where(loss_mask > 0, logprobs - logprobs.detach(), zero))
    if token_weights is not None:
        per_token = per_token * token_weights.detach()
    loss = aggregate(per_token, loss_mask, mode, num_tokens=num_tokens, num_sequences=num_sequences)
    negative = advantages < 0
    truncated = negative & (log_ratio < 0)
    token_ratio = torch.exp(torch.where(loss_mask > 0, (logprobs - old_logprobs).detach(), zero))
    n_negative = int(negative.sum())
    metrics = {
        "loss/policy": loss.item(),
        "pg/clipfrac": masked_mean(truncated.to(loss_mask.dtype).unsqueeze(-1).expand_as(loss_mask), loss_mask).item(),
        "pg/ratio_mean": masked_mean(token_ratio, loss_mask).item(),
        "pg/topr_truncated_frac": int(truncated.sum()) / n_negative if n_negative else 0.0,
        "pg/topr_weight_mean": weights[negative].mean().item() if n_negative else 1.0,
    }
    return loss, metrics
