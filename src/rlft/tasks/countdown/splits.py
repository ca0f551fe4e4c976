"""Held-out rows of a Countdown dataset: a fixed, seeded block of test and validation rows no stage trains on.

For Countdown-Tasks-3to4 (the spec's dataset; ``../shared/data/countdown/train.parquet`` holds its first 10,240
rows) :func:`split_rows` takes, from the first ``pool`` rows (default 10,240, so a local copy of those rows and
the Hub dataset give the same split):

- **test**: ``n_test`` rows (default 500), half with 3 numbers and half with 4 (in general an equal share of each
  count of numbers present in the pool, the remainder to the smallest counts);
- **validation**: the next ``n_validation`` rows (default 500), split the same way;

walking each count's rows in a seeded random order (``random.Random(f"countdown-rows-{seed}")``, seed 1234 by
default) and skipping a row whose task equals an earlier held-out row's (:func:`task_key`: the sorted numbers
and the target), so the held-out rows are distinct tasks. Each part lists its rows in that seeded order with the
counts of numbers interleaved (3, 4, 3, 4, ...), so any prefix of it (an evaluation of the first N) is balanced.

**train** is every other row of the whole dataset (beyond the pool too), in file order, minus any row whose task
equals a held-out task: no SFT trace, RL prompt or preference pair may use a held-out (nums, target) task
(:func:`heldout_keys`, :func:`drop_heldout`). Screen recipes on validation, confirm on test.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from itertools import zip_longest
from dataclasses import dataclass
from typing import Literal

from rlft.tasks.countdown.generator import task_key
from rlft.types import CountdownTask

SPLIT_SEED = 1234
"""Seed of the held-out rows' order."""
SPLIT_POOL = 10_240
"""Rows the held-out block is drawn from: rows 0..10239 of Countdown-Tasks-3to4 (the local train.parquet)."""
TEST_ROWS = 500
VALIDATION_ROWS = 500
SplitName = Literal["train", "validation", "test"]


@dataclass(frozen=True)
class RowSplit:
    """The three parts of a Countdown dataset (see the module docstring)."""

    train: list[CountdownTask]
    validation: list[CountdownTask]
    test: list[CountdownTask]

    def part(self, name: SplitName) -> list[CountdownTask]:
        """``"train"``, ``"validation"`` or ``"test"``.

        Raises:
            ValueError: another name.
        """
        if name not in ("train", "validation", "test"):
            raise ValueError(f"unknown split {name!r}; choose train, validation or test")
        return getattr(self, name)

    def heldout_keys(self) -> set[tuple[tuple[int, ...], int]]:
        """The :func:`task_key` of every validation and test row."""
        return {task_key(t) for t in (*self.validation, *self.test)}


def _shares(n: int, sizes: list[int]) -> dict[int, int]:
    """``n`` rows shared equally over the counts of numbers in ``sizes`` (ascending), the remainder to the first."""
    base, extra = divmod(n, len(sizes))
    return {size: base + (i < extra) for i, size in enumerate(sizes)}


def split_rows(tasks: list[CountdownTask], *, n_test: int = TEST_ROWS, n_validation: int = VALIDATION_ROWS,
               seed: int = SPLIT_SEED, pool: int = SPLIT_POOL, source: str = "the dataset") -> RowSplit:
    """Split a Countdown dataset's rows (file order) into train, validation and test (see the module docstring).

    Args:
        tasks: the dataset's rows in file order (all of them, or at least the first ``pool``).
        n_test, n_validation: held-out rows of each part (>= 0).
        seed: the seed of the held-out rows' order.
        pool: held-out rows are drawn from the first ``pool`` rows only.
        source: the dataset's name, for error messages.
    Returns:
        :class:`RowSplit`; ``train`` keeps file order, the held-out parts the seeded order.
    Raises:
        ValueError: negative sizes, or too few distinct tasks of some count of numbers in the pool for the held-out
            rows (the message names ``source`` and the count).
    """
    if n_test < 0 or n_validation < 0:
        raise ValueError(f"held-out sizes must be >= 0, got test {n_test}, validation {n_validation}")
    head = tasks[:pool]
    sizes = sorted({len(t.nums) for t in head})
    if not sizes:
        if n_test or n_validation:
            raise ValueError(f"{source} has no rows to hold out")
        return RowSplit(list(tasks), [], [])
    rng = random.Random(f"countdown-rows-{seed}")
    orders = {}
    for size in sizes:
        rows = [i for i, t in enumerate(head) if len(t.nums) == size]
        rng.shuffle(rows)
        orders[size] = iter(rows)
    taken: set[tuple[tuple[int, ...], int]] = set()

    def draw(n: int) -> list[CountdownTask]:
        by_count = []
        for size, share in _shares(n, sizes).items():
            got, picked = 0, []
            for i in orders[size]:
                if got == share:
                    break
                key = task_key(head[i])
                if key in taken:
                    continue
                taken.add(key)
                picked.append(head[i])
                got += 1
            if got < share:
                raise ValueError(f"{source}: its first {pool} rows hold too few distinct {size}-number tasks for "
                                 f"{n_test} test + {n_validation} validation held-out rows (a small file: pass "
                                 "--no-data-heldout to use every row, or --split all to evaluate them)")
            by_count.append(picked)
        # interleaved (3, 4, 3, 4, ...): every prefix of a part holds each count of numbers in equal share
        return [t for group in zip_longest(*by_count) for t in group if t is not None]

    test = draw(n_test)
    validation = draw(n_validation)
    return RowSplit(drop_heldout(tasks, taken), validation, test)


def drop_heldout(tasks: Iterable[CountdownTask], keys: set[tuple[tuple[int, ...], int]]) -> list[CountdownTask]:
    """``tasks`` without those whose :func:`task_key` is in ``keys``, order kept."""
    return [t for t in tasks if task_key(t) not in keys]


def load_split(source: str, *, data_split: str = "train", seed: int = SPLIT_SEED, n_test: int = TEST_ROWS,
               n_validation: int = VALIDATION_ROWS, limit: int | None = None) -> RowSplit:
    """:func:`split_rows` of a Countdown file or Hub dataset (:func:`rlft.tasks.countdown.loaders.load_countdown`).

    ``limit``: read at most this many rows (at least the pool: the held-out block is always drawn from the same
    first :data:`SPLIT_POOL` rows); None: every row.

    Raises:
        rlft.data.files.DataError: a malformed row; ValueError: see :func:`split_rows`.
    """
    from rlft.tasks.countdown.loaders import load_countdown

    rows = None if limit is None else max(limit, SPLIT_POOL)
    return split_rows(load_countdown(source, split=data_split, limit=rows), n_test=n_test, n_validation=n_validation,
                      seed=seed, source=str(source))


def by_size(tasks: list[CountdownTask]) -> dict[int, list[int]]:
    """Indices of ``tasks`` by their count of numbers, ascending: ``{3: [0, 2, ...], 4: [1, ...]}``."""
    out: dict[int, list[int]] = {}
    for i, t in enumerate(tasks):
        out.setdefault(len(t.nums), []).append(i)
    return dict(sorted(out.items()))
