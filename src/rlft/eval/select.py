"""Best-of-N selection: choose one of a task's N sampled answers (test-time scaling without a second model pass).

Every selector is a pure function of per-sample lists for ONE task (sample order = generation order) that
returns the index of the chosen sample; a task's selected score is that sample's rule score. Ties go to the
first sample in generation order, so a selector never looks at the rule score it is judged by (except
``oracle``, the labelled upper bound).

- ``majority`` (self-consistency, Wang et al. 2023): samples are grouped by the *value* of their answer
  expression (correct expressions differ in form but all equal the target); values within ``tol`` (the
  scorer's 1e-5) are one group. The largest group wins (a tie: the group whose first sample comes first); the
  first sample of that group is chosen. Samples whose answer does not parse (value None) do not vote; when none
  parses, sample 0 is chosen.
- ``self-certainty`` (Kang et al. 2025, "Scalable Best-of-N Selection for Large Language Models via
  Self-Certainty", eq. 3): the sample whose mean per-token ``KL(U || p)`` is highest.
- ``self-certainty-vote`` (the same paper, Sec. 3.3, eq. 11): Borda voting. Samples are ranked by
  self-certainty (rank r = 1 the most certain); each parsed answer casts ``(N - r + 1) ** power`` votes
  (power 0.5 by default, the paper's) for its value group; the group with the most votes wins (a tie: the group
  whose first sample comes first), and its first sample is chosen. Unparsed answers do not vote; when none
  parses, the most certain sample is chosen.
- ``reward-model``: the sample a scorer (a Bradley-Terry reward model trained by ``rlft rm``, through
  :class:`rlft.rewards.reward_model.RewardModelScorer`, or any ``score(prompts, responses)``) rates highest.
- ``oracle``: the sample with the best rule score: the mean selected score is pass@N. An upper bound, not a
  selector a user can run.

:func:`selected_scores` applies a selector to the first ``n`` samples of every task of an evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

VALUE_TOL = 1e-5
"""Two answer values closer than this are one answer (the Countdown scorer's tolerance)."""
BORDA_POWER = 0.5
"""The Borda vote exponent of ``self-certainty-vote`` (Kang et al. 2025 use 0.5)."""


def _argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first on ties."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def value_groups(values: Sequence[float | None], tol: float = VALUE_TOL) -> list[list[int]]:
    """Sample indices grouped by answer value, groups in order of their first sample; None values are left out.
    A value joins the first group whose first value is within ``tol``."""
    groups: list[list[int]] = []
    for i, v in enumerate(values):
        if v is None:
            continue
        for g in groups:
            if abs(values[g[0]] - v) < tol:
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


def weighted_vote(values: Sequence[float | None], weights: Sequence[float], tol: float = VALUE_TOL) -> int | None:
    """The first sample of the value group with the largest total weight (ties: the earlier group); None when no
    value parses."""
    groups = value_groups(values, tol)
    if not groups:
        return None
    totals = [sum(weights[i] for i in g) for g in groups]
    return groups[_argmax(totals)][0]


def majority(values: Sequence[float | None], tol: float = VALUE_TOL) -> int:
    """Self-consistency: the first sample of the most common answer value (see the module docstring)."""
    chosen = weighted_vote(values, [1.0] * len(values), tol)
    return 0 if chosen is None else chosen


def most_certain(certainty: Sequence[float]) -> int:
    """The sample with the highest self-certainty (first on ties).

    Raises:
        ValueError: no samples, or a missing (None) self-certainty.
    """
    if not certainty or any(c is None for c in certainty):
        raise ValueError("self-certainty selection needs every sample's self-certainty (the row-dropping HF decoder "
                         "reports it; other engines do not)")
    return _argmax(certainty)


def borda_weights(certainty: Sequence[float], power: float = BORDA_POWER) -> list[float]:
    """Per sample, ``(N - r + 1) ** power`` where r is its rank by self-certainty (1 = most certain; equal values
    ranked in sample order)."""
    order = sorted(range(len(certainty)), key=lambda i: (-certainty[i], i))
    n = len(certainty)
    weights = [0.0] * n
    for rank, i in enumerate(order, start=1):
        weights[i] = float(n - rank + 1) ** power
    return weights


def certainty_vote(values: Sequence[float | None], certainty: Sequence[float], power: float = BORDA_POWER,
                   tol: float = VALUE_TOL) -> int:
    """Borda-weighted self-consistency (see the module docstring); the most certain sample when none parses."""
    most = most_certain(certainty)
    chosen = weighted_vote(values, borda_weights(certainty, power), tol)
    return most if chosen is None else chosen


def best_scored(scores: Sequence[float]) -> int:
    """The sample a scorer rates highest (reward-model best-of-N; the oracle with rule scores); first on ties."""
    if not scores:
        raise ValueError("no samples to select from")
    return _argmax(scores)


SELECTORS = ("majority", "self-certainty", "self-certainty-vote", "reward-model", "oracle")
"""Selector names (``rlft eval countdown --select``)."""


def choose(name: str, *, scores: Sequence[float], values: Sequence[float | None], certainty: Sequence[float | None],
           rm_scores: Sequence[float] | None = None) -> int:
    """The index selector ``name`` picks among one task's samples, given their rule ``scores`` (oracle only),
    answer ``values``, self-``certainty`` and reward-model ``rm_scores``.

    Raises:
        ValueError: an unknown name; ``reward-model`` without ``rm_scores``; see :func:`most_certain`.
    """
    if name == "majority":
        return majority(values)
    if name == "self-certainty":
        return most_certain(certainty)
    if name == "self-certainty-vote":
        return certainty_vote(values, certainty)
    if name == "reward-model":
        if rm_scores is None:
            raise ValueError("reward-model selection needs reward-model scores of the samples (--select-reward-model)")
        return best_scored(rm_scores)
    if name == "oracle":
        return best_scored(scores)
    raise ValueError(f"unknown selector {name!r}; choose from {', '.join(SELECTORS)}")


def selected_scores(name: str, task_scores: list[list[float]], task_values: list[list[float | None]],
                    task_certainty: list[list[float | None]], n: int,
                    task_rm_scores: list[list[float]] | None = None) -> list[float]:
    """Per task, the rule score of the sample ``name`` selects among the task's first ``n`` samples.

    All arguments are ``(num_tasks, k)`` lists as in :class:`rlft.eval.countdown.CountdownEvalResult`; ``n <= k``.

    Raises:
        ValueError: ``n`` < 1 or above a task's sample count; see :func:`choose`.
    """
    out = []
    for t, scores in enumerate(task_scores):
        if not 1 <= n <= len(scores):
            raise ValueError(f"n={n} samples asked, task {t} has {len(scores)}")
        rm = task_rm_scores[t][:n] if task_rm_scores is not None else None
        i = choose(name, scores=scores[:n], values=task_values[t][:n], certainty=task_certainty[t][:n], rm_scores=rm)
        out.append(scores[i])
    return out

