"""Sampler-mismatch importance weights: correcting a policy-gradient loss for a sampler that is not exactly the
trained policy (another engine such as vLLM, or the same model in another precision, e.g. bfloat16 sampling weights
for a float32 policy under autocast).

Pure functions of tensors; the RL objective (:class:`rlft.losses.pg.PolicyObjective`, ``--is-correction``) applies
them to each token's policy loss.
"""

from __future__ import annotations

import torch

IS_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""Sampler-mismatch importance-sampling corrections (:func:`importance_weights`; ``--is-correction``)."""


def importance_weights(logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor, mode: str,
                       cap: float) -> torch.Tensor:
    """Per-token weights correcting for a sampler that is not exactly the trained policy (another engine, or
    another precision: e.g. bfloat16 weights sampling for a float32 policy under autocast).

    With ``r_t = exp(logprobs_t - sampler_logprobs_t)`` (the trainer's pre-update log-prob of the sampled token
    over the sampler's), the weight is, per token (``token_*``) or with one ratio per sequence, the product of its
    tokens' ratios ``R = exp(sum_t log r_t)`` (``sequence_*``):

    - ``*_truncate``: ``min(r, cap)``, truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL
      Framework Secretly Brings You Off-Policy RL Training");
    - ``*_mask``: ``r``, or 0 where ``r > cap`` (the token, or the whole sequence, leaves the loss);

    the four modes of TRL's ``vllm_importance_sampling_mode``. The weights multiply each token's policy loss
    (:func:`policy_gradient_loss` ``token_weights``), after any PPO clipping.

    Args:
        logprobs: ``(B, T)`` the trainer's log-probs of the sampled tokens before the update (no grad).
        sampler_logprobs: ``(B, T)`` the sampler's, at the same temperature (0 off the mask).
        loss_mask: ``(B, T)``.
        mode: one of :data:`IS_MODES` except "none"; cap: ``C > 0``.
    Returns:
        ``(B, T)`` float weights, 0 off the mask, no grad.
    Raises:
        ValueError: an unknown mode, or ``cap <= 0``.
    """
    if mode not in IS_MODES[1:]:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; expected one of {', '.join(IS_MODES[1:])}")
    if cap <= 0:
        raise ValueError(f"the importance-sampling cap must be > 0, got {cap}")
    log_ratio = ((logprobs - sampler_logprobs) * loss_mask).detach().float()
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(logprobs)
    ratio = torch.exp(log_ratio)
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, max=cap)
    else:
        ratio = torch.where(ratio > cap, torch.zeros_like(ratio), ratio)
    return ratio * loss_mask
