"""Policy-gradient losses of the RL loop: REINFORCE, PPO-clip with clip-higher, RAFT/RAFT++, KL, entropy.

Pure functions of tensors; none of them sees a model or a config. Shape legend: B prompts (or
sequences), k samples per prompt, T tokens.

References:
- Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
  Human Feedback in LLMs" (RLOO): the leave-one-out baseline and the sequence-level estimator
  ``1/k sum_i [R(y_i) - 1/(k-1) sum_{j!=i} R(y_j)] grad log pi(y_i | x)``.
- Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7 (clipped surrogate).
- Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html): the k1/k3
  estimators.
- Yu et al. 2025, "DAPO" (arXiv 2503.14476), eq. 10: asymmetric clipping ``clip(ratio, 1 - eps_low,
  1 + eps_high)`` ("clip-higher", eps_high 0.28) and token-level aggregation.
- Xiong et al. 2025 (arXiv 2504.11343): RAFT (likelihood of the selected samples) and RAFT++
  (the same with the importance ratio and clipping).

Advantage estimators live in :mod:`rlft.losses.advantages`.
"""

from __future__ import annotations

from typing import Literal

import torch

from rlft.losses.advantages import rloo_advantages  # noqa: F401  (re-exported: its historical home)
from rlft.ops import AggregationMode, aggregate, masked_mean

KLEstimator = Literal["k1", "k3"]


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
    clip_low: float | None = None,
    clip_high: float | None = None,
    mode: AggregationMode = "seq_sum",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE / PPO-clip policy loss on sampled tokens.

    Per token, ``ratio = exp(logprobs - old_logprobs)`` and, with the sequence's advantage ``A``:

    - unclipped (no clip range given): ``l_t = -A * ratio_t``. Its gradient is ``-A * ratio_t * grad logp_t``;
      at ratio 1 (``old_logprobs = logprobs.detach()``) that is REINFORCE, ``-A * grad logp_t``.
    - clipped (PPO, Schulman et al. 2017, eq. 7; asymmetric "clip-higher", DAPO eq. 10):
      ``l_t = -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)``
      = ``max(-A * ratio_t, -A * clip(...))``. Where the clipped branch is taken the gradient is 0
      (the ratio has already moved past the range in the direction the advantage favours).
      ``clip_eps`` sets both ends; ``clip_low``/``clip_high`` set one end each (and override it).

    Reduction (:func:`rlft.ops.aggregate`): ``seq_sum`` (default) is the RLOO paper's sequence-level
    estimator, ``mean over sequences of sum_t l_t`` (log pi(y|x) = sum_t logp_t); ``seq_mean`` is
    GRPO's (token mean within each sequence, then mean over sequences); ``token_mean`` averages over
    all target tokens (DAPO's token-level loss: long completions weigh more in total, less per token).

    Args:
        logprobs: ``(B, T)`` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: ``(B, T)`` log-probs under the policy that sampled them (no grad).
        advantages: ``(B,)`` one advantage per sequence, broadcast over its tokens.
        loss_mask: ``(B, T)`` 1 on completion tokens (EOS included), 0 elsewhere.
        clip_eps, clip_low, clip_high: PPO clipping range (all None: no clipping).
        mode: any :data:`rlft.ops.AggregationMode`.
        num_sequences, num_tokens: sequence / target-token count of the whole optimisation batch
            when this call sees one micro-batch of it (keeps gradient accumulation exact).
    Returns:
        ``(loss, metrics)``; metrics: ``loss/policy`` (this call's loss), ``pg/clipfrac`` (fraction of
        this call's target tokens where the clipped branch is active, i.e. has zero gradient),
        ``pg/ratio_mean`` (token mean of the ratio over this call's target tokens).
    Raises:
        ValueError: ``advantages`` not of shape ``(B,)``; a negative clip range.
    """
    if advantages.dim() != 1 or advantages.shape[0] != logprobs.shape[0]:
        raise ValueError(f"advantages must have shape (B,) = ({logprobs.shape[0]},), got {tuple(advantages.shape)}")
    low = clip_low if clip_low is not None else clip_eps
    high = clip_high if clip_high is not None else clip_eps
    if (low is not None and low < 0) or (high is not None and high < 0):
        raise ValueError(f"clip ranges must be >= 0, got low={low}, high={high}")
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.to(ratio.dtype).unsqueeze(-1)  # (B, 1)
    per_token = -adv * ratio
    if low is not None or high is not None:
        lo = 1.0 - low if low is not None else 0.0
        hi = 1.0 + high if high is not None else float("inf")
        clipped = -adv * torch.clamp(ratio, lo, hi)
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


def raft_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float | None = None,
    mode: AggregationMode = "token_mean",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """RAFT / RAFT++ (Xiong et al. 2025, arXiv 2504.11343, Sec. 2): likelihood of the selected samples.

    A sample is selected when its advantage is > 0 (with :func:`rlft.losses.advantages.raft_advantages`:
    the best-rewarded samples); selected samples get weight 1, the others 0, whatever the advantage's
    size. Then:

    - without a clip range (RAFT): ``l_t = -w * ratio_t``, whose gradient at ratio 1 is ``-w * grad logp_t``:
      the SFT (negative log-likelihood) gradient on the selected samples;
    - with ``clip_low``/``clip_high`` (RAFT++): the PPO-clipped surrogate with ``A = w``, i.e. the
      importance ratio and clipping of PPO on the same selection.

    The default reduction is ``token_mean`` (RAFT is SFT on the kept samples). Shapes, normalisers and
    metrics as :func:`policy_gradient_loss`.
    """
    weights = (advantages > 0).to(logprobs.dtype)
    return policy_gradient_loss(logprobs, old_logprobs, weights, loss_mask, clip_low=clip_low, clip_high=clip_high,
                                mode=mode, num_sequences=num_sequences, num_tokens=num_tokens)


def entropy_bonus(
    entropy: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: AggregationMode = "token_mean",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The entropy term of the loss, to be *subtracted* times a coefficient: ``aggregate(H_t)``.

    Args:
        entropy: ``(B, T)`` per-token entropy ``H_t = -sum_v p_v log p_v`` of the policy's next-token
            distribution at the sampling temperature (with grad; e.g. from
            :func:`rlft.ops.sequence_logprobs` with ``return_entropy=True``).
        loss_mask: ``(B, T)``; normalisers as :func:`policy_gradient_loss`.
    Returns:
        ``(value, {"loss/entropy": float})``. The loop adds ``-entropy_coef * value`` to the loss, so a
        positive coefficient rewards a spread-out sampler (a common guard against entropy collapse).
    """
    value = aggregate(entropy, loss_mask, mode, num_tokens=num_tokens, num_sequences=num_sequences)
    return value, {"loss/entropy": value.item()}


POLICY_LOSSES = {
    "reinforce": policy_gradient_loss,
    "ppo": policy_gradient_loss,
    "raft": raft_loss,
    "raft++": raft_loss,
}
"""Policy losses by name (``--loss``). ``reinforce`` and ``raft`` ignore the clip range (the loop passes
none); ``ppo`` and ``raft++`` clip the ratio to ``[1 - clip_low, 1 + clip_high]``. All share the
signature ``(logprobs, old_logprobs, advantages, loss_mask, *, clip_low, clip_high, mode,
num_sequences, num_tokens) -> (loss, metrics)``."""

CLIPPED_LOSSES = frozenset({"ppo", "raft++"})
"""The losses that use a clip range."""


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
