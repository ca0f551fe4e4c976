"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1).

For a problem with n samples of which c are correct, pass@k = 1 - C(n-c, k) / C(n, k): the chance that
k samples drawn without replacement from the n include at least one correct one. The ratio is computed
as the product prod_{i=n-c+1}^{n} (1 - k/i), which never forms large binomials.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct.

    Raises:
        ValueError: k < 1, k > n, or c outside [0, n].
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number correct must lie in [0, n={n}], got c={c}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    fail = 1.0  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def mean_pass_at_k(num_samples: int | Sequence[int], num_correct: Sequence[int], k: int) -> float:
    """pass@k averaged over problems; ``num_samples`` is one n for all or one per problem.

    Raises:
        ValueError: no problems, mismatched lengths, or any invalid (n, c, k) (see :func:`pass_at_k`).
    """
    ns = [num_samples] * len(num_correct) if isinstance(num_samples, int) else list(num_samples)
    if len(ns) != len(num_correct):
        raise ValueError(f"{len(ns)} sample counts for {len(num_correct)} problems")
    if not ns:
        raise ValueError("pass@k of zero problems is undefined")
    return sum(pass_at_k(n, c, k) for n, c in zip(ns, num_correct)) / len(ns)
