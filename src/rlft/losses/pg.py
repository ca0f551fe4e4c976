"""Policy-gradient pieces for RLOO (and PPO-style clipping): advantages, KL estimators, losses.

Pure functions of tensors; none of them sees a model or a config. Shape legend: B prompts (or
sequences), k samples per prompt, T tokens.

References:
- Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
  Human Feedback in LLMs" (RLOO): the leave-one-out baseline and the sequence-level estimator
  ``1/k sum_i [R(y_i) - 1/(k-1) sum_{j!=i} R(y_j)] grad log pi(y_i | x)``.
- Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7 (clipped surrogate).
- Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html): the k1/k3
  estimators.
"""

from __future__ import annotations

from typing import Literal

import torch

from rlft.ops import AggregationMode, aggregate, masked_mean

KLEstimator = Literal["k1", "k3"]


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantages (RLOO, Ahmadian et al. 2024, Sec. 3.2).

    ``A_i = R_i - 1/(k-1) * sum_{j != i} R_j`` for the k samples of one prompt: each sample's
    baseline is the mean reward of the *other* samples of its prompt, so it is independent of the
    sample and the estimator stays unbiased. Computed as ``mean_{j != i} (R_i - R_j)`` (the same
    value), which is exactly 0 when a group's rewards are all equal.

    Args:
        rewards: ``(B, k)`` float, row b holding the k samples' rewards of prompt b.
    Returns:
        ``(B, k)`` advantages, same dtype. Each row sums to 0.
    Raises:
        ValueError: ``rewards`` is not 2-D, or k < 2 (a leave-one-out baseline needs another sample).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (B, k) (prompts x samples), got shape {tuple(rewards.shape)}")
    k = rewards.shape[1]
    if k < 2:
        raise ValueError(f"RLOO needs k >= 2 samples per prompt for the leave-one-out baseline, got k={k}")
    pairwise = rewards.unsqueeze(2) - rewards.unsqueeze(1)  # (B, k, k): R_i - R_j, zero diagonal
    return pairwise.sum(dim=2) / (k - 1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020).

    With ``log_r = ref_logprobs - logprobs`` (log pi_ref/pi of the sampled token):

    - ``k1 = -log_r = logprobs - ref_logprobs``: unbiased, high variance, can be negative per token.
      Its sum over a sequence is the log-ratio of the whole sequence, the quantity the RLOO paper
      subtracts from the reward.
    - ``k3 = exp(log_r) - log_r - 1``: unbiased, lower variance, always >= 0 (0 iff equal). Used as a
      per-token loss by GRPO/verl ("low_var_kl").

    No clamping is applied: a huge ``log_r`` gives a huge (possibly inf) k3.

    Args:
        logprobs, ref_logprobs: ``(B, T)`` log-probs of the sampled tokens under the policy and the
            reference, at the same temperature.
    Returns:
        ``(B, T)`` per-token values (not masked: reduce with :func:`rlft.ops.aggregate`).
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        log_r = ref_logprobs - logprobs
        return torch.exp(log_r) - log_r - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; expected 'k1' or 'k3'")


def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_eps: float | None = None,
    mode: AggregationMode = "seq_sum",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE / PPO-clip policy loss on sampled tokens.

    Per token, ``ratio = exp(logprobs - old_logprobs)`` and, with the sequence's advantage ``A``:

    - unclipped (``clip_eps=None``): ``l_t = -A * ratio_t``. Its gradient is ``-A * ratio_t * grad logp_t``;
      at ratio 1 (``old_logprobs = logprobs.detach()``) that is REINFORCE, ``-A * grad logp_t``.
    - clipped (PPO, Schulman et al. 2017, eq. 7): ``l_t = -min(ratio_t * A, clip(ratio_t, 1-eps, 1+eps) * A)``
      = ``max(-A * ratio_t, -A * clip(...))``. Where the clipped branch is taken the gradient is 0
      (the ratio has already moved ``eps`` in the direction the advantage favours).

    Reduction (:func:`rlft.ops.aggregate`): ``seq_sum`` (default) is the RLOO paper's sequence-level
    estimator, ``mean over sequences of sum_t l_t`` (log pi(y|x) = sum_t logp_t); ``token_mean``
    averages over all target tokens instead (long completions weigh more in total, less per token).

    Args:
        logprobs: ``(B, T)`` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: ``(B, T)`` log-probs under the policy that sampled them (no grad).
        advantages: ``(B,)`` one advantage per sequence, broadcast over its tokens.
        loss_mask: ``(B, T)`` 1 on completion tokens (EOS included), 0 elsewhere.
        clip_eps: PPO clipping range; None disables clipping.
        mode: ``seq_sum`` or ``token_mean`` (any :data:`rlft.ops.AggregationMode` works).
        num_sequences, num_tokens: sequence / target-token count of the whole optimisation batch
            when this call sees one micro-batch of it (keeps gradient accumulation exact).
    Returns:
        ``(loss, metrics)``; metrics: ``loss/policy`` (this call's loss), ``pg/clipfrac`` (fraction of
        this call's target tokens where the clipped branch is active, i.e. has zero gradient),
        ``pg/ratio_mean`` (token mean of the ratio over this call's target tokens).
    """
    if advantages.dim() != 1 or advantages.shape[0] != logprobs.shape[0]:
        raise ValueError(f"advantages must have shape (B,) = ({logprobs.shape[0]},), got {tuple(advantages.shape)}")
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.to(ratio.dtype).unsqueeze(-1)  # (B, 1)
    per_token = -adv * ratio
    if clip_eps is not None:
        clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
        clip_active = (clipped > per_token).float()
        per_token = torch.maximum(per_token, clipped)
        clipfrac = masked_mean(clip_active, loss_mask).item()
    else:
        clipfrac = 0.0
    loss = aggregate(per_token, loss_mask, mode, num_tokens=num_tokens, num_sequences=num_sequences)
    metrics = {
        "loss/policy": loss.item(),
        "pg/clipfrac": clipfrac,
        "pg/ratio_mean": masked_mean(ratio.detach(), loss_mask).item(),
    }
    return loss, metrics


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    estimator: KLEstimator = "k3",
    mode: AggregationMode = "seq_sum",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL to the reference as a loss term (OpenRLHF/verl placement), before multiplying by beta.

    ``aggregate(kl_penalty(logprobs, ref_logprobs, estimator), loss_mask, mode)``; with ``seq_sum`` this
    is the mean over sequences of the summed per-token estimate, on the same scale as the
    sequence-level KL the RLOO paper puts in the reward. Gradients flow through ``logprobs`` only.
    Note: as a *loss*, k1's expected gradient is zero (E_pi[grad log pi] = 0); k3's is not, which is
    why k3 is the usual choice here.

    Returns:
        ``(loss, {"loss/kl": float})``.
    """
    loss = aggregate(kl_penalty(logprobs, ref_logprobs, estimator), loss_mask, mode, num_tokens=num_tokens, num_sequences=num_sequences)
    return loss, {"loss/kl": loss.item()}
