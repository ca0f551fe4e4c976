"""Countdown solver and generator: hand-checked cases, a brute-force cross-check, reproducibility."""

from __future__ import annotations

import itertools
import random
import re
import time

import pytest

from rlft.tasks.countdown.generator import PRESETS, CountdownSpec, generate_tasks, make_splits, task_key
from rlft.tasks.countdown.solver import OPS, apply, is_solvable, reachable, solve, solve_steps


def _brute_values(nums: list[int]) -> set[int]:
    """Every value of every expression over all of ``nums`` (naive recursion over ordered splits)."""
    if len(nums) == 1:
        return {nums[0]}
    out = set()
    for k in range(1, len(nums)):
        for left in itertools.combinations(range(len(nums)), k):
            a_vals = _brute_values([nums[i] for i in left])
            b_vals = _brute_values([nums[i] for i in range(len(nums)) if i not in left])
            for a, b, op in itertools.product(a_vals, b_vals, OPS):
                if (v := apply(a, op, b)) is not None:
                    out.add(v)
    return out


def _uses_numbers_and_equals(expr: str, nums, target) -> bool:
    """Each number once, only + - * / ( ) and spaces, value == target under true division."""
    assert re.fullmatch(r"[\d+\-*/() ]+", expr), expr
    digits = sorted(int(x) for x in re.findall(r"\d+", expr))
    return digits == sorted(nums) and abs(eval(expr) - target) < 1e-9  # noqa: S307 - our own text


def test_hand_checked_cases():
    assert solve([44, 19, 35], 98) == ["44 + 19 + 35"]
    assert solve_steps([44, 19, 35], 98) == [(44, "+", 19, 63), (63, "+", 35, 98)]
    assert solve([1, 1, 1], 100) == [] and solve_steps([1, 1, 1], 100) is None
    assert not is_solvable([1, 1, 1], 100)
    # (44 - 19) * 35 = 875 needs parentheses; 5 - (3 - 1) keeps them on the right of '-'.
    assert solve([44, 19, 35], 875) == ["(44 - 19) * 35"]
    assert is_solvable([5, 3, 1], 3)
    # Exact division only: 7 / 2 is not allowed, so [7, 2] cannot make 3 (or 3.5).
    assert not is_solvable([7, 2], 3) and solve([8, 2], 4) == ["8 / 2"]
    # No negative intermediates: 1 - 5 is not allowed even when it would cancel out.
    assert reachable([1, 5]) == {6, 4, 5}
    assert solve([7], 7) == ["7"] and solve_steps([7], 7) == []


def test_several_solutions_are_distinct_and_correct():
    sols = solve([44, 19, 35], 98, max_solutions=4)
    assert len(sols) == 4 == len(set(sols))
    assert all(_uses_numbers_and_equals(s, [44, 19, 35], 98) for s in sols)


def test_matches_brute_force_on_small_numbers():
    rng = random.Random(0)
    for _ in range(300):
        nums = [rng.randint(0, 12) for _ in range(rng.choice((2, 3, 4)))]
        values = _brute_values(nums)
        assert reachable(nums) == values
        for target in range(0, 40):
            assert is_solvable(nums, target) == (target in values), (nums, target)
            if target in values:
                (expr,) = solve(nums, target)
                assert _uses_numbers_and_equals(expr, nums, target)
                steps = solve_steps(nums, target)
                assert all(apply(a, op, b) == v for a, op, b, v in steps) and steps[-1][3] == target


def test_presets_exist_and_are_sane():
    assert {"standard", "cog_behav", "easy3", "tiny"} <= set(PRESETS)
    assert PRESETS["standard"] == CountdownSpec((3, 4), (1, 99), (10, 100))
    assert PRESETS["cog_behav"] == CountdownSpec((3, 4), (1, 24), (10, 25))
    with pytest.raises(ValueError):
        CountdownSpec(target_range=(10, 5))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_generated_tasks_are_solvable_and_in_range(name):
    spec = PRESETS[name]
    tasks = generate_tasks(spec, 200, seed=1)
    assert len(tasks) == 200
    assert {len(t.nums) for t in tasks} == set(spec.num_count)
    for t in tasks:
        assert all(spec.num_range[0] <= n <= spec.num_range[1] for n in t.nums)
        assert spec.target_range[0] <= t.target <= spec.target_range[1]
        assert _uses_numbers_and_equals(t.solution, t.nums, t.target)


def test_generator_is_reproducible_by_seed():
    spec = PRESETS["standard"]
    assert generate_tasks(spec, 50, seed=3) == generate_tasks(spec, 50, seed=3)
    assert generate_tasks(spec, 50, seed=3) != generate_tasks(spec, 50, seed=4)
    assert generate_tasks(spec, 20, seed=3) == generate_tasks(spec, 50, seed=3)[:20]


def test_splits_are_disjoint_and_test_set_is_stable():
    spec = PRESETS["easy3"]  # a small task space, so collisions would happen without the check
    train, test = make_splits(spec, 1000, 100, seed=0)
    assert len(train) == 1000 and len(test) == 100
    assert not {task_key(t) for t in train} & {task_key(t) for t in test}
    assert make_splits(spec, 10, 100, seed=0)[1] == test  # n_train does not move the test set
    assert make_splits(spec, 1000, 100, seed=1)[1] != test


def test_generator_is_fast():
    start = time.perf_counter()
    generate_tasks(CountdownSpec(num_count=(4,)), 2000, seed=0)
    assert time.perf_counter() - start < 5.0  # ~0.6 s here: 10,000 tasks in a few seconds
