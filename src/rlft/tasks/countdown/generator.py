"""Seeded Countdown task generator with difficulty presets and disjoint train/test splits.

Sampling: pick how many numbers uniformly from ``spec.num_count``; then draw the numbers
(uniformly, with replacement) and the target (uniformly) until the solver says the task is
solvable. This is uniform over the solvable (numbers, target) pairs of that size. Everything is
driven by ``random.Random(seed)``, so a seed always gives the same tasks.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from rlft.tasks.countdown.solver import solve
from rlft.types import CountdownTask


@dataclass(frozen=True)
class CountdownSpec:
    """Difficulty knobs of generated tasks (all ranges inclusive)."""

    num_count: tuple[int, ...] = (3, 4)
    """Allowed counts of numbers per task, chosen uniformly."""
    num_range: tuple[int, int] = (1, 99)
    """Smallest and largest given number."""
    target_range: tuple[int, int] = (10, 100)
    """Smallest and largest target."""
    distinct_heldout: bool = False
    """make_splits draws a test split of distinct tasks (no two equal up to number order), so an
    N-task held-out score averages N different tasks. Off for the older presets, whose documented
    held-out sets keep their duplicates."""

    def __post_init__(self) -> None:
        if not self.num_count or min(self.num_count) < 1:
            raise ValueError(f"num_count must be non-empty counts >= 1, got {self.num_count}")
        for name in ("num_range", "target_range"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name} must satisfy 0 <= low <= high, got {(lo, hi)}")


PRESETS: dict[str, CountdownSpec] = {
    # The Countdown-Tasks-3to4 distribution (TinyZero): 3-4 numbers in 1-99, targets 10-100.
    "standard": CountdownSpec((3, 4), (1, 99), (10, 100)),
    # The tasks of the cog_behav SFT set (Asap7772/cog_behav_all_strategies).
    "cog_behav": CountdownSpec((3, 4), (1, 24), (10, 25)),
    # Three one-digit numbers: short prompts and traces, learnable by a 135M model on a CPU.
    "easy3": CountdownSpec((3,), (1, 9), (10, 30)),
    # Three numbers in 1-25, targets 10-75: 18,644 distinct solvable tasks (easy3 has 769), so a fixed
    # SFT set, the RL prompts and a 500-task held-out set stay far from exhausting the space.
    "medium3": CountdownSpec((3,), (1, 25), (10, 75), distinct_heldout=True),
    # Two or three small numbers: smoke tests of the whole pipeline.
    "tiny": CountdownSpec((2, 3), (1, 9), (1, 20)),
}


def _sample(spec: CountdownSpec, rng: random.Random, max_tries: int) -> Iterator[CountdownTask]:
    """Endless stream of solvable tasks drawn from ``spec``."""
    lo, hi = spec.num_range
    while True:
        count = rng.choice(spec.num_count)
        for _ in range(max_tries):
            nums = tuple(rng.randint(lo, hi) for _ in range(count))
            target = rng.randint(*spec.target_range)
            solution = solve(nums, target)
            if solution:
                yield CountdownTask(nums=nums, target=target, solution=solution[0])
                break
        else:
            raise ValueError(f"no solvable task with {count} numbers in {max_tries} draws from {spec}")


def generate_tasks(
    spec: CountdownSpec, n: int, seed: int | str, *, max_tries: int = 100_000
) -> list[CountdownTask]:
    """``n`` solvable tasks drawn from ``spec``; the same seed gives the same tasks.

    Each task's ``solution`` is filled by the solver. Duplicates are possible (as in the Hub
    dataset). Raises ValueError if ``max_tries`` draws in a row find no solvable task.
    """
    stream = _sample(spec, random.Random(seed), max_tries)
    return [next(stream) for _ in range(n)]


def task_key(task: CountdownTask) -> tuple[tuple[int, ...], int]:
    """Identity of a task up to the order of its numbers: ``(sorted nums, target)``."""
    return tuple(sorted(task.nums)), task.target


def make_splits(
    spec: CountdownSpec, n_train: int, n_test: int, seed: int, *, max_tries: int = 100_000
) -> tuple[list[CountdownTask], list[CountdownTask]]:
    """Disjoint ``(train, test)`` task lists: no ``task_key`` appears in both.

    The test set comes from its own seed stream and is drawn first, so changing ``n_train``
    never changes it, and it is prefix-stable (the first m tasks of a larger ``n_test`` are the
    same); train tasks whose key is in the test set are redrawn. With ``spec.distinct_heldout`` the
    test stream skips tasks equal to an earlier test task, so the ``n_test`` tasks are distinct.
    """
    if spec.distinct_heldout:
        test, seen, skipped = [], set(), 0
        stream = _sample(spec, random.Random(f"countdown-test-{seed}"), max_tries)
        while len(test) < n_test:
            task = next(stream)
            if task_key(task) in seen:
                skipped += 1
                if skipped > max_tries:
                    raise ValueError(f"spec {spec} has fewer than {n_test} distinct tasks")
                continue
            seen.add(task_key(task))
            test.append(task)
    else:
        test = generate_tasks(spec, n_test, seed=f"countdown-test-{seed}", max_tries=max_tries)
    held_out = {task_key(t) for t in test}
    stream = _sample(spec, random.Random(f"countdown-train-{seed}"), max_tries)
    train: list[CountdownTask] = []
    skipped = 0
    while len(train) < n_train:
        task = next(stream)
        if task_key(task) not in held_out:
            train.append(task)
        else:
            skipped += 1
            if skipped > max_tries:
                raise ValueError(f"spec {spec} has too few distinct tasks for disjoint splits")
    return train, test
