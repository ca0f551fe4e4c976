"""Bradley-Terry loss of a scalar reward model on chosen/rejected pairs.

The reward model gives each (prompt, response) one scalar ``r``. Under the Bradley-Terry model
(Bradley & Terry 1952) the probability that the chosen response beats the rejected one is
``sigmoid(r_c - r_r)``; the reward model maximises its log-likelihood (Ouyang et al. 2022, eq. 1):

    loss_bt = mean_b[ -log sigmoid(r_c,b - r_r,b - m_b) ]

``m_b`` is an optional *margin* (Touvron et al. 2023, Llama 2, §3.2.2): a pair whose preference is
strong (e.g. a large gap between the annotators' scores) must be separated by at least that much
before its loss becomes small. With ``m = 0`` it is the plain Bradley-Terry loss.

Rewards are defined only up to a constant (the loss sees differences only), so their level drifts.
*Reward centering* (Eisenstein et al. 2023, "Helping or Herding?") adds
``center_coef * mean_b[(r_c,b + r_r,b)^2]``, which pulls the mean reward of each pair towards 0.

Like every loss in :mod:`rlft.losses` this is a pure function of tensors returning ``(loss, metrics)``;
the recipe (:mod:`rlft.recipes.reward_model`) computes the rewards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    *,
    margin: torch.Tensor | float | None = None,
    center_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry reward-model loss with optional margin and reward centering.

    ``loss = mean_b[-log sigmoid(r_c - r_r - m)] + center_coef * mean_b[(r_c + r_r)^2]``, computed
    with ``logsigmoid`` (stable for large reward gaps).

    Args:
        chosen_rewards: ``(B,)`` scalar rewards of the preferred responses (carry gradients).
        rejected_rewards: ``(B,)`` rewards of the dispreferred responses.
        margin: ``(B,)`` tensor or a float broadcast to every pair; None means 0.
        center_coef: weight of the centering term (>= 0); 0 turns it off.
    Returns:
        ``(loss, metrics)`` with metrics (detached floats, means over the batch):
        ``loss/bt`` (the Bradley-Terry term alone), ``loss/center`` (the centering penalty before
        its coefficient; only when ``center_coef > 0``), ``rm/accuracy`` (fraction with
        ``r_c > r_r``, margin ignored), ``rm/margin`` (mean ``r_c - r_r``), ``rm/chosen``,
        ``rm/rejected`` (mean rewards).
    """
    if chosen_rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (B,), got {tuple(chosen_rewards.shape)}")
    if rejected_rewards.shape != chosen_rewards.shape:
        raise ValueError(
            f"rejected_rewards has shape {tuple(rejected_rewards.shape)}, expected {tuple(chosen_rewards.shape)}")
    if center_coef < 0:
        raise ValueError(f"center_coef must be >= 0, got {center_coef}")
    chosen, rejected = chosen_rewards.float(), rejected_rewards.float()
    diff = chosen - rejected  # (B,)
    if margin is not None:
        m = torch.as_tensor(margin, dtype=diff.dtype, device=diff.device)
        if m.dim() > 0 and m.shape != diff.shape:
            raise ValueError(f"margin has shape {tuple(m.shape)}, expected a float or shape {tuple(diff.shape)}")
        diff = diff - m
    bt = -F.logsigmoid(diff).mean()
    loss = bt
    metrics: dict[str, float] = {"loss/bt": bt.item()}
    if center_coef > 0:
        center = ((chosen + rejected) ** 2).mean()
        loss = bt + center_coef * center
        metrics["loss/center"] = center.item()
    with torch.no_grad():
        metrics.update(
            {
                "rm/accuracy": (chosen > rejected).float().mean().item(),
                "rm/margin": (chosen - rejected).mean().item(),
                "rm/chosen": chosen.mean().item(),
                "rm/rejected": rejected.mean().item(),
            }
        )
    return loss, metrics
