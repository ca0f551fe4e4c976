"""Reward shaping of the RL loop (step 2): what is added to the raw reward before the KL and the advantages.

- the truncation penalty (``--truncation-penalty``): a constant added to the samples that hit
  ``max_new_tokens`` without an EOS;
- DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", arXiv 2503.14476, Sec. 3.4, eq. 13;
  ``--overlong-buffer``, ``--overlong-penalty``): 0 up to ``L_max - L_cache`` tokens, then a linear ramp down to
  ``-penalty`` at ``L_max``, :func:`overlong_penalty`.

Shape legend: B groups (prompts), k samples per prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlft.rl.config import RLConfig


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Sec. 3.4, eq. 13), scaled by ``penalty``.

    With ``L_max = max_length``, ``L_cache = buffer`` and ``|y|`` a completion's length in tokens::

        R_length(y) = 0                                          if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache * penalty   if L_max - L_cache < |y| <= L_max
                    = -penalty                                   if |y| > L_max

    so the penalty grows linearly from 0 to ``-penalty`` over the last ``L_cache`` tokens of the budget (the RL
    loop's hard cap ``max_new_tokens`` makes the last case impossible; the formula keeps it). The paper's
    penalty is 1 (rewards in [-1, 1]).

    Args:
        lengths: completion lengths in tokens (EOS included), any shape (the loop's: ``(B, k)``).
        max_length: ``L_max`` (the loop: ``max_new_tokens``).
        buffer: ``L_cache``, in ``1..max_length``.
        penalty: the scale (>= 0).
    Returns:
        float32 penalties (<= 0), the shape of ``lengths``.
    Raises:
        ValueError: ``buffer`` outside ``1..max_length``, or a negative ``penalty``.
    """
    if not 1 <= buffer <= max_length:
        raise ValueError(f"the overlong buffer must lie in 1..{max_length} (max_length) tokens, got {buffer}")
    if penalty < 0:
        raise ValueError(f"the overlong penalty must be >= 0, got {penalty}")
    lengths = lengths.to(torch.float32)
    start = max_length - buffer  # L_max - L_cache: the last length without a penalty
    ramp = (start - lengths) / buffer * penalty
    out = torch.where(lengths <= start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_length, torch.full_like(lengths, -penalty), out)


def overlong_on(cfg: RLConfig) -> bool:
    """Whether the run adds :func:`overlong_penalty` (``--overlong-buffer`` set and > 0)."""
    return bool(cfg.overlong_buffer)


def shaped_rewards(cfg: RLConfig, raw: torch.Tensor, truncated: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(B, k)`` rewards the advantages are computed from (before the KL): ``raw``, plus ``truncation_penalty`` on
    the ``truncated`` samples (1.0: hit max_new_tokens without EOS) when set, plus :func:`overlong_penalty` of the
    completion ``lengths`` (tokens) when ``--overlong-buffer`` is set. A new tensor."""
    rewards = raw + cfg.truncation_penalty * truncated if cfg.truncation_penalty is not None else raw.clone()
    if overlong_on(cfg):
        rewards = rewards + overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
    return rewards


def shaping_metrics(cfg: RLConfig, lengths: torch.Tensor) -> dict[str, float]:
    """``reward/overlong_penalty_mean``: the mean :func:`overlong_penalty` of the trained samples (``lengths``:
    ``(B, k)`` tokens, B > 0), when the punishment is on; else nothing."""
    if not overlong_on(cfg) or not lengths.numel():
        return {}
    return {"reward/overlong_penalty_mean": overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty).mean().item()}
