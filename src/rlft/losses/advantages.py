"""Advantage estimators of the RL loop: pure functions of a ``(B, k)`` reward tensor.

Every estimator takes the rewards of ``B`` prompts x ``k`` samples (row ``b`` holds the ``k``
samples of prompt ``b``) and returns one advantage per sample, same shape. The loop picks one by
name from :data:`ADVANTAGES` (``--advantage``), once, before it starts.

References:
- RLOO: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
  from Human Feedback in LLMs", Sec. 3.2 (leave-one-out baseline).
- GRPO: Shao et al. 2024, "DeepSeekMath", Sec. 4.1.2 (outcome supervision: ``(r - mean) / std``
  within the group).
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
  Sec. 3.1 (no division by the group std; no per-sequence length normalisation in the loss).
- Lite-PPO / REINFORCE++-baseline: Liu et al. 2025, "Tricks or Traps? A Deep Dive into RL for LLM
  Reasoning" (group-mean baseline, batch-level std).
- RAFT / RAFT++: Xiong et al. 2025, "A Minimalist Approach to LLM Reasoning: from Rejection Sampling
  to Reinforce" (arXiv 2504.11343): train on the best-rewarded samples only.
"""

from __future__ import annotations

from typing import Callable, Literal

import torch

GRPOScale = Literal["group", "batch"] | None


def _check_rewards(rewards: torch.Tensor, *, min_k: int = 1, who: str = "this estimator") -> int:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (B, k) (prompts x samples), got shape {tuple(rewards.shape)}")
    k = rewards.shape[1]
    if k < min_k:
        raise ValueError(f"{who} needs k >= {min_k} samples per prompt, got k={k}")
    return k


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantages (RLOO, Ahmadian et al. 2024, Sec. 3.2).

    ``A_i = R_i - 1/(k-1) * sum_{j != i} R_j`` for the k samples of one prompt: each sample's
    baseline is the mean reward of the *other* samples of its prompt, so it is independent of the
    sample and the estimator stays unbiased. Computed as ``mean_{j != i} (R_i - R_j)`` (the same
    value), which is exactly 0 when a group's rewards are all equal. Equals
    ``k/(k-1) * (R_i - mean_j R_j)``.

    Args:
        rewards: ``(B, k)`` float, row b holding the k samples' rewards of prompt b.
    Returns:
        ``(B, k)`` advantages, same dtype. Each row sums to 0.
    Raises:
        ValueError: ``rewards`` is not 2-D, or k < 2 (a leave-one-out baseline needs another sample).
    """
    k = _check_rewards(rewards, min_k=2, who="RLOO (leave-one-out baseline)")
    pairwise = rewards.unsqueeze(2) - rewards.unsqueeze(1)  # (B, k, k): R_i - R_j, zero diagonal
    return pairwise.sum(dim=2) / (k - 1)


def grpo_advantages(rewards: torch.Tensor, scale: GRPOScale = "group", eps: float = 1e-6) -> torch.Tensor:
    """Group-mean baseline, optionally divided by a standard deviation (GRPO family).

    ``A_i = (R_i - mean_j R_j) / (std + eps)`` over the k samples of one prompt, where ``std`` is
    ``torch.std`` (unbiased, divisor k-1) of

    - ``scale="group"``: the prompt's own k rewards (GRPO, Shao et al. 2024, Sec. 4.1.2);
    - ``scale="batch"``: all B*k rewards of the batch (Lite-PPO, Liu et al. 2025 "Tricks or Traps";
      REINFORCE++-baseline);
    - ``scale=None``: no division, ``A_i = R_i - mean_j R_j`` (Dr. GRPO, Liu et al. 2025; the loss
      should then also drop per-sequence length normalisation, e.g. ``--aggregation seq_sum``).

    A group whose rewards are all equal gets exactly 0.0 with every scale, whatever the reward value (its
    centred rewards are set to 0: the float mean of k equal values may be off by a rounding, which the std
    division would blow up); every other group gets the formula's value.

    Args:
        rewards: ``(B, k)`` float.
        scale: "group", "batch" or None.
        eps: added to the std (keeps the division finite; all-equal groups are 0 anyway).
    Returns:
        ``(B, k)`` advantages, same dtype; each row sums to 0 (up to rounding).
    Raises:
        ValueError: not 2-D; k < 2 with a std scale (one sample has no std); unknown ``scale``.
    """
    if scale not in ("group", "batch", None):
        raise ValueError(f"unknown GRPO scale {scale!r}; expected 'group', 'batch' or None")
    _check_rewards(rewards, min_k=2 if scale == "group" else 1, who=f"GRPO with scale={scale!r}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    # An all-equal group's float mean can differ from its value by one rounding (8 x 0.1 sums to 0.8000001),
    # and dividing that residual by a near-zero std would turn it into a visible advantage: zero such rows.
    varied = rewards.max(dim=1, keepdim=True).values > rewards.min(dim=1, keepdim=True).values
    centred = torch.where(varied, centred, torch.zeros_like(centred))
    if scale is None:
        return centred
    if scale == "group":
        std = rewards.std(dim=1, keepdim=True)
    else:
        if rewards.numel() < 2:
            raise ValueError("GRPO with scale='batch' needs at least 2 rewards in the batch")
        std = rewards.std()
    return centred / (std + eps)


def raft_advantages(rewards: torch.Tensor, threshold: float | None = None) -> torch.Tensor:
    """RAFT's sample selection as 0/1 weights (Xiong et al. 2025, arXiv 2504.11343, Sec. 2).

    RAFT (rejection-sampling fine-tuning) trains on the best-rewarded samples only, by likelihood:
    with a 0/1 reward these are the correct samples. Here:

    - ``threshold`` given: ``A_i = 1`` where ``R_i >= threshold`` (Countdown: 1.0, correct), else 0;
    - ``threshold=None``: ``A_i = 1`` for the samples holding their group's maximum reward, *unless*
      the group's rewards are all equal (no sample is better than another: all 0).

    Used with ``--loss raft`` (:func:`rlft.losses.pg.raft_loss`) this is RAFT (the gradient is that of
    ``-log pi`` of the selected samples); with ``--loss raft++`` it is RAFT++ (importance ratio and
    clipping on the same selection).

    Args:
        rewards: ``(B, k)`` float.
    Returns:
        ``(B, k)`` of 0.0 / 1.0, same dtype.
    """
    _check_rewards(rewards, who="RAFT")
    if threshold is not None:
        return (rewards >= threshold).to(rewards.dtype)
    best = rewards.max(dim=1, keepdim=True).values
    varied = rewards.max(dim=1, keepdim=True).values > rewards.min(dim=1, keepdim=True).values
    return ((rewards == best) & varied).to(rewards.dtype)


def reinforce_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Plain REINFORCE (Williams 1992): the reward itself, no baseline. ``(B, k) -> (B, k)``."""
    _check_rewards(rewards, who="REINFORCE")
    return rewards.clone()


AdvantageFn = Callable[[torch.Tensor], torch.Tensor]

ADVANTAGES: dict[str, AdvantageFn] = {
    "rloo": rloo_advantages,
    "grpo": lambda r: grpo_advantages(r, "group"),
    "lite_ppo": lambda r: grpo_advantages(r, "batch"),
    "dr_grpo": lambda r: grpo_advantages(r, None),
    "raft": lambda r: raft_advantages(r, None),
    "reinforce": reinforce_advantages,
}
"""Advantage estimators by name (``--advantage``): ``(B, k)`` rewards -> ``(B, k)`` advantages.
``raft`` selects each group's best samples (see :func:`raft_advantages`; a threshold is set by the loop)."""


def advantage_function(policy) -> AdvantageFn:
    """The run's estimator, picked once from its policy-loss block (:class:`rlft.rl.options.PolicyLossOptions`; read,
    never changed; never the whole config): ``ADVANTAGES[policy.advantage]``, or RAFT's threshold selection when
    ``policy.raft_threshold`` is set.

    Raises:
        ValueError: an unknown ``policy.advantage``.
    """
    if policy.advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {policy.advantage!r}; expected one of {', '.join(ADVANTAGES)}")
    if policy.advantage == "raft" and policy.raft_threshold is not None:
        threshold = policy.raft_threshold
        return lambda rewards: raft_advantages(rewards, threshold)
    return ADVANTAGES[policy.advantage]
