"""pass@k: hand-derived values, brute force over all k-subsets, edge cases."""

from __future__ import annotations

import itertools
from math import comb

import pytest

from rlft.eval.passk import mean_pass_at_k, pass_at_k


def test_hand_computed():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-12)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9, abs=1e-12)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 4) == 1.0  # only 3 wrong samples: every 4-subset holds a correct one
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - comb(7, 5) / comb(10, 5), abs=1e-12)  # 1 - 21/252


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (the first c correct) that contain a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_equals_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12)


def test_edges():
    for n in (1, 4, 200):
        for k in (1, n):
            assert pass_at_k(n, 0, k) == 0.0
            assert pass_at_k(n, n, k) == 1.0
    assert 0.0 < pass_at_k(1000, 1, 1) < pass_at_k(1000, 1, 500) < 1.0  # large n: stable, no overflow
    for n, c, k in ((3, 1, 4), (3, 1, 0), (3, 4, 1), (3, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_over_problems():
    assert mean_pass_at_k(5, [2, 0, 5], 2) == pytest.approx((0.7 + 0.0 + 1.0) / 3, abs=1e-12)
    assert mean_pass_at_k([5, 4], [2, 1], 1) == pytest.approx((0.4 + 0.25) / 2, abs=1e-12)
    with pytest.raises(ValueError):
        mean_pass_at_k(2, [1, 1], 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([2], [1, 1], 1)
    with pytest.raises(ValueError):
        mean_pass_at_k(2, [], 1)
