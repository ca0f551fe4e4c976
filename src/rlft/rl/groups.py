"""Group filtering (Reinforce-Rej, Xiong et al. 2025; DAPO's dynamic sampling, Yu et al. 2025, Sec. 3.2).

A prompt's group of k samples whose rewards are all equal (all correct, all wrong) has zero
advantage under every group-baseline estimator: it costs a forward/backward and adds nothing but
normaliser weight. Filtering drops such groups and refills the batch from further prompts, so each
update carries ``prompts_per_step`` groups with signal (up to a cap on the prompts tried).
"""

from __future__ import annotations

import torch


def varied_groups(rewards: torch.Tensor) -> torch.Tensor:
    """``(B,)`` bool: True for the groups whose k rewards are not all equal.

    Args:
        rewards: ``(B, k)`` rewards (what the advantages are computed from).
    Raises:
        ValueError: ``rewards`` is not 2-D.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (B, k), got {tuple(rewards.shape)}")
    return rewards.max(dim=1).values > rewards.min(dim=1).values
