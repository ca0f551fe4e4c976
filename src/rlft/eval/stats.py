"""The confidence intervals' constants and tests the evaluations report (standard library only, so any evaluation can
use them): the 95% quantile, the two-sided p-value that matches a normal-approximation interval, Holm's step-down
adjustment of a batch of comparisons (Holm 1979), and the one text form of a paired difference with its interval."""

from __future__ import annotations

import math
from statistics import NormalDist

Z_95 = 1.959963984540054
"""Two-sided 95% standard-normal quantile."""

ALPHA = 0.05
"""The error rate of the 95% intervals: a batch's family-wise rate under :func:`holm`."""


def z_for_level(alpha: float) -> float:
    """The two-sided standard-normal quantile of an interval at error rate ``alpha``: ``Phi^-1(1 - alpha / 2)``
    (``z_for_level(0.05)`` is :data:`Z_95`; ``z_for_level(0.025)`` is 2.2414).

    Raises:
        ValueError: ``alpha`` outside (0, 1).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"an interval's error rate must lie in (0, 1), got {alpha}")
    return NormalDist().inv_cdf(1.0 - alpha / 2.0)


def normal_p_value(diff: float, half_width: float, z: float = Z_95) -> float:
    """The two-sided p-value of "the mean difference is 0" that agrees with the interval ``diff +- half_width`` drawn at
    quantile ``z`` (the normal approximation of :func:`rlft.eval.countdown.paired_difference`): the standard error is
    ``half_width / z`` and ``p = 2 (1 - Phi(|diff| / se))``, so the interval at error rate alpha excludes 0 exactly when
    ``p < alpha``. A zero-width interval (every task's difference equal, or one task) gives 0 when ``diff != 0``,
    else 1.
    """
    if half_width <= 0.0:
        return 0.0 if diff != 0.0 else 1.0
    return min(1.0, 2.0 * (1.0 - NormalDist().cdf(abs(diff) * z / half_width)))


def holm(p_values: list[float], alpha: float = ALPHA) -> list[dict]:
    """Holm's step-down adjustment of m comparisons made as one batch (S. Holm, "A simple sequentially rejective
    multiple test procedure", Scandinavian Journal of Statistics 6(2), 65-70, 1979): the chance that any of the m
    intervals misses its true difference is at most ``alpha``.

    Sort the p-values ascending, p(1) <= ... <= p(m) (ties keep input order). Rank i is tested at
    ``alpha / (m - i + 1)``; the procedure stops at the first rank r whose p(r) is not below its level, and every rank
    from r on is not rejected. Per comparison, in input order, returns:

    - ``rank``: i (1 = smallest p);
    - ``level``: the error rate of its adjusted interval: ``alpha / (m - min(i, r) + 1)``, i.e. the level Holm tests
      rank i at, held at the stopping rank's level from r on (so the levels never decrease with rank, and a rank past
      the stop, whose p is at least p(r), gets an interval that holds 0);
    - ``p_adjusted``: ``min(1, max_{j <= i} (m - j + 1) p(j))`` (monotone in rank);
    - ``rejected``: ``p_adjusted < alpha``, which is the same as "the adjusted interval excludes 0" when the interval
      and the p-value come from the same normal approximation (:func:`normal_p_value`).

    With m = 1 the level is ``alpha`` and ``p_adjusted`` is p: the raw interval.

    Raises:
        ValueError: no p-values, or one outside [0, 1], or ``alpha`` outside (0, 1).
    """
    if not p_values:
        raise ValueError("Holm's adjustment needs at least one p-value")
    if any(not (0.0 <= p <= 1.0) or math.isnan(p) for p in p_values):
        raise ValueError(f"p-values must lie in [0, 1], got {p_values}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    m = len(p_values)
    order = sorted(range(m), key=lambda j: p_values[j])
    out: list[dict] = [{} for _ in range(m)]
    stop = m + 1  # first rank not rejected
    running = 0.0
    for i, j in enumerate(order, start=1):
        p = p_values[j]
        if stop > m and p >= alpha / (m - i + 1):
            stop = i
        running = max(running, min(1.0, (m - i + 1) * p))
        out[j] = {
            "rank": i, "level": alpha / (m - min(i, stop) + 1), "p_adjusted": running, "rejected": running < alpha
        }
    return out


def format_difference(d: dict, places: int = 3) -> str:
    """A paired difference as reports write it, ``"+0.025 [+0.002, +0.049]"``: ``d["diff"]`` then its interval
    ``[d["ci_low"], d["ci_high"]]``, each signed, to ``places`` decimals (the dict of
    :func:`rlft.eval.countdown.paired_difference`, or any with those three keys).

    Raises:
        KeyError: a key missing from ``d``.
    """
    return f"{d['diff']:+.{places}f} [{d['ci_low']:+.{places}f}, {d['ci_high']:+.{places}f}]"
