"""Reward shaping of the RL loop (step 2): what is added to the raw reward before the KL and the advantages.

- the truncation penalty (``--truncation-penalty``): a constant added to the samples that hit
  ``max_new_tokens`` without an EOS;
- DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", arXiv 2503.14476, Sec. 3.4, eq. 13;
  ``--overlong-buffer``, ``--overlong-penalty``): 0 up to ``L_max - L_cache`` tokens, then a linear ramp down to
  ``-penalty`` at ``L_max``, :func:`overlong_penalty`;
- the repetition-aware reward (``--repetition-limit N``, ``--repetition-penalty``): a completion that writes one
  identical line N or more times (:func:`repeated_samples`, the line rule of :mod:`rlft.rollout.loops`) scores as no
  answer (its raw reward replaced by 0) or gets the penalty added, :func:`repetition_term`. Issue 48's greedy Countdown
  answers loop on one miscomputed line (``"93-24=79, 79+2=81, no."`` 11 times) until ``max_new_tokens``.

The repetition rule acts on the raw reward first; the truncation and overlong penalties are added to the result.
Every function here is given the shaping block (:class:`rlft.rl.options.ShapingOptions`) and, where the overlong
ramp needs it, ``--max-new-tokens``: never the whole config.

Shape legend: B groups (prompts), k samples per prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlft.rollout.loops import loop_cut

if TYPE_CHECKING:
    from rlft.rl.options import ShapingOptions


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


def overlong_on(shaping: ShapingOptions) -> bool:
    """Whether the run adds :func:`overlong_penalty` (``--overlong-buffer`` set and > 0)."""
    return bool(shaping.overlong_buffer)


def repeats_a_line(text: str, limit: int) -> bool:
    """Whether the finished completion ``text`` writes one identical non-empty line (stripped) ``limit`` or more
    times: :func:`rlft.rollout.loops.loop_cut`'s rule, with the text after the last newline counted as a line (the
    completion is finished, so its last line is complete; a cut answer's last fragment counts only if it equals a
    whole line).

    Raises:
        ValueError: ``limit < 2``.
    """
    return loop_cut(text + "\n", limit) is not None


def repeated_samples(shaping: ShapingOptions, texts: list[str]) -> torch.Tensor:
    """``(n,)`` float32: 1.0 where the completion ``texts[i]`` repeats a line ``--repetition-limit`` times or more
    (:func:`repeats_a_line`); all 0 when the option is off."""
    if shaping.repetition_limit is None:
        return torch.zeros(len(texts))
    return torch.tensor([repeats_a_line(t, shaping.repetition_limit) for t in texts], dtype=torch.float32)


def repetition_term(shaping: ShapingOptions, raw: torch.Tensor, repeated: torch.Tensor) -> torch.Tensor:
    """What the repetition rule adds to the ``raw`` rewards (any shape, the loop's ``(B, k)``) of the samples flagged
    in ``repeated`` (1.0: repeats a line, :func:`repeated_samples`): ``--repetition-penalty`` when set, else
    ``-raw`` (the sample scores as no answer: 0); 0 elsewhere and when the option is off. float32, the shape of
    ``raw``."""
    if shaping.repetition_limit is None:
        return torch.zeros_like(raw, dtype=torch.float32)
    added = -raw.to(torch.float32) if shaping.repetition_penalty is None else torch.full_like(
        raw, shaping.repetition_penalty, dtype=torch.float32)
    return added * repeated


def shaped_rewards(shaping: ShapingOptions, max_new_tokens: int, raw: torch.Tensor, truncated: torch.Tensor,
                   lengths: torch.Tensor, repeated: torch.Tensor | None = None) -> torch.Tensor:
    """``(B, k)`` rewards the advantages are computed from (before the KL): ``raw``, with the samples flagged in
    ``repeated`` (1.0: repeat a line ``--repetition-limit`` times; None: none) scored as no answer (0) or given
    ``--repetition-penalty`` (:func:`repetition_term`), plus ``truncation_penalty`` on the ``truncated`` samples
    (1.0: hit max_new_tokens without EOS) when set, plus :func:`overlong_penalty` of the completion ``lengths``
    (tokens) when ``--overlong-buffer`` is set, ramping to ``max_new_tokens`` (``--max-new-tokens``). A new tensor."""
    if repeated is not None:
        raw = raw + repetition_term(shaping, raw, repeated)
    penalty = shaping.truncation_penalty
    rewards = raw + penalty * truncated if penalty is not None else raw.clone()
    if overlong_on(shaping):
        rewards = rewards + overlong_penalty(lengths, max_new_tokens, shaping.overlong_buffer, shaping.overlong_penalty)
    return rewards


def shaping_metrics(shaping: ShapingOptions, max_new_tokens: int, lengths: torch.Tensor,
                    raw: torch.Tensor | None = None, repeated: torch.Tensor | None = None) -> dict[str, float]:
    """Means over the trained samples (``(B, k)`` each, B > 0) of the shaping terms that are on:

    - ``reward/overlong_penalty_mean``: the mean :func:`overlong_penalty` of the completion ``lengths`` (tokens);
    - ``reward/repetition_frac``: the share of samples flagged in ``repeated`` (``--repetition-limit``), and
      ``reward/repetition_penalty_mean``: the mean :func:`repetition_term` of their ``raw`` rewards (<= 0 with a
      penalty; ``-raw`` of the repeating samples when they score as no answer). Only when ``raw`` and ``repeated``
      are given.
    """
    if not lengths.numel():
        return {}
    out: dict[str, float] = {}
    if overlong_on(shaping):
        out["reward/overlong_penalty_mean"] = overlong_penalty(lengths, max_new_tokens, shaping.overlong_buffer,
                                                               shaping.overlong_penalty).mean().item()
    if shaping.repetition_limit is not None and raw is not None and repeated is not None:
        out["reward/repetition_frac"] = repeated.to(torch.float32).mean().item()
        out["reward/repetition_penalty_mean"] = repetition_term(shaping, raw, repeated).mean().item()
    return out
