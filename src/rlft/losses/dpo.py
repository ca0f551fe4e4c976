"""Preference losses on per-example sequence log-probs: DPO (with label smoothing), IPO, RPO.

Every loss takes four tensors of shape ``(B,)``: the policy's and the frozen reference model's
log-probabilities of the chosen and the rejected response of each pair, and returns
``(loss, metrics)``: the batch-mean scalar and a dict of detached floats. None of them sees a model;
the recipe computes the log-probs (see :mod:`rlft.recipes.dpo`).

Notation: ``h = (pi_c - ref_c) - (pi_r - ref_r)``, the difference of the policy-to-reference
log-ratios of the chosen and the rejected response; ``beta * (pi - ref)`` is the *implicit reward*
of a response (Rafailov et al. 2023, eq. 5).

Metrics shared by all three (means over the batch):

- ``rewards/chosen``, ``rewards/rejected``: ``beta * (pi_c - ref_c)`` and ``beta * (pi_r - ref_r)``;
- ``rewards/margin``: their difference, ``beta * h``;
- ``rewards/accuracy``: fraction of pairs whose chosen implicit reward is strictly larger (``h > 0``);
- ``logps/chosen``, ``logps/rejected``: the policy's log-probs as given (sums or per-token means).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _check(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float) -> None:
    shape = policy_chosen_logps.shape
    if len(shape) != 1:
        raise ValueError(f"log-probs must have shape (B,), got {tuple(shape)}")
    for name, t in (
        ("policy_rejected_logps", policy_rejected_logps),
        ("ref_chosen_logps", ref_chosen_logps),
        ("ref_rejected_logps", ref_rejected_logps),
    ):
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")


def _reward_metrics(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
    """The implicit-reward metrics listed in the module docstring, as floats."""
    with torch.no_grad():
        chosen = beta * (policy_chosen_logps - ref_chosen_logps).float()
        rejected = beta * (policy_rejected_logps - ref_rejected_logps).float()
        return {
            "rewards/chosen": chosen.mean().item(),
            "rewards/rejected": rejected.mean().item(),
            "rewards/accuracy": (chosen > rejected).float().mean().item(),
            "rewards/margin": (chosen - rejected).mean().item(),
            "logps/chosen": policy_chosen_logps.float().mean().item(),
            "logps/rejected": policy_rejected_logps.float().mean().item(),
        }


def _logratio_difference(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps):
    """``h = (pi_c - ref_c) - (pi_r - ref_r)`` in float32, shape ``(B,)``."""
    return (policy_chosen_logps.float() - ref_chosen_logps.float()) - (
        policy_rejected_logps.float() - ref_rejected_logps.float()
    )


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Preference Optimization (Rafailov et al. 2023, eq. 7), optionally label-smoothed.

    ``loss = mean_b[ -(1 - eps) * log sigmoid(beta * h_b) - eps * log sigmoid(-beta * h_b) ]``

    With ``eps = label_smoothing > 0`` this is conservative DPO (Mitchell 2023, "A note on DPO with
    noisy preferences"): each label is assumed flipped with probability ``eps``. At ``h = 0`` (policy
    equal to the reference) the loss is ``log 2`` for every ``eps``.

    Args:
        policy_chosen_logps, policy_rejected_logps: ``(B,)`` summed log-probs of the chosen/rejected
            response tokens under the policy (carry gradients).
        ref_chosen_logps, ref_rejected_logps: ``(B,)`` the same under the frozen reference model.
        beta: inverse temperature of the implicit reward (> 0); larger stays closer to the reference.
        label_smoothing: ``eps`` in ``[0, 0.5]``.
    Returns:
        ``(loss, metrics)``: metrics hold ``loss/dpo`` and the implicit-reward metrics.
    """
    _check(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5], got {label_smoothing}")
    h = _logratio_difference(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    loss = losses.mean()
    metrics = {"loss/dpo": loss.item()}
    metrics.update(
        _reward_metrics(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta))
    return loss, metrics


def ipo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Identity Preference Optimization (Azar et al. 2023, eq. 17): ``mean_b (h_b - 1 / (2 beta))^2``.

    IPO regresses the log-ratio difference onto a fixed target ``1 / (2 beta)`` instead of pushing it
    to infinity, so it does not overfit deterministic preferences. It is usually applied to
    *length-normalised* log-probs (per-token means), as the DPO recipe does (``loss_type="ipo"``
    passes per-token-mean log-probs of each response); the function itself takes whatever it is given.

    Returns:
        ``(loss, metrics)``: metrics hold ``loss/ipo`` and the implicit-reward metrics.
    """
    _check(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    h = _logratio_difference(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    loss = ((h - 1.0 / (2.0 * beta)) ** 2).mean()
    metrics = {"loss/ipo": loss.item()}
    metrics.update(
        _reward_metrics(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta))
    return loss, metrics


def rpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    chosen_nll: torch.Tensor,
    beta: float = 0.1,
    alpha: float = 1.0,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO + NLL on the chosen responses (Pang et al. 2024, "Iterative Reasoning Preference
    Optimization"): ``dpo_loss(...) + alpha * chosen_nll``.

    Args:
        chosen_nll: scalar, the token-mean negative log-likelihood of the chosen responses under the
            policy (the recipe computes it from the same forward pass, with :func:`rlft.ops.aggregate`).
        alpha: weight of the NLL term (Pang et al. use 1).
        Other arguments as in :func:`dpo_loss`.
    Returns:
        ``(loss, metrics)``: metrics hold ``loss/rpo`` (the total), ``loss/dpo``, ``loss/nll`` and the
        implicit-reward metrics.
    """
    if chosen_nll.dim() != 0:
        raise ValueError(f"chosen_nll must be a scalar, got shape {tuple(chosen_nll.shape)}")
    dpo, metrics = dpo_loss(
        policy_chosen_logps,
        policy_rejected_logps,
        ref_chosen_logps,
        ref_rejected_logps,
        beta=beta,
        label_smoothing=label_smoothing,
    )
    loss = dpo + alpha * chosen_nll.float()
    return loss, {"loss/rpo": loss.item(), **metrics, "loss/nll": chosen_nll.item()}


PREFERENCE_LOSSES = {"dpo": dpo_loss, "ipo": ipo_loss, "rpo": rpo_loss}
"""Preference losses by name. ``rpo`` additionally needs ``chosen_nll=``; the DPO recipe picks one
once, before its loop (see :func:`rlft.recipes.dpo.build_preference_loss`)."""
