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
(:func:`heldout_keys`, :func:`drop_heldout`). This block is named **original** (:data:`ORIGINAL`); its 500 test
rows were looked at by many recipes and are now a development set: claims are read on the fresh rows below.

**Fresh rows** (:data:`FRESH`). ``../shared/data/countdown/pool.parquet`` holds 86,748 further Countdown-Tasks-3to4
rows. :func:`load_split` recognises that file by its content (:func:`rows_sha256` of its rows equals
:data:`FRESH_POOL_SHA256`, whatever the file's name or format) and splits it by the same rule with another block:
**test** 1,000 rows and **validation** 1,000 rows (500 of each count of numbers), drawn from all its rows with seed
:data:`FRESH_SEED`; **train** (the pool for SFT traces and RL prompts) is every other row. Pool rows whose task equals a
``train.parquet`` task (:data:`rlft.tasks.countdown.fresh_rows.POOL_ROWS_IN_TRAIN`: 333 rows of 324 tasks) are neither
held out nor trained on: the fresh held-out tasks are new to anything trained on ``train.parquet``, and the pool's
training rows never hold an original held-out task. So the same options select it: ``--data <pool.parquet>`` with
``--split test|validation`` (eval countdown) or as training rows (rl, pairs countdown); the test-look ledger records
the block's name (``heldout``: ``original`` or ``fresh``). Any other file gets the original block.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from itertools import zip_longest
from dataclasses import dataclass, replace
from typing import Literal

from rlft.tasks.countdown.generator import task_key
from rlft.types import CountdownTask

SPLIT_SEED = 1234
"""Seed of the held-out rows' order."""
SPLIT_POOL = 10_240
"""Rows the held-out block is drawn from: rows 0..10239 of Countdown-Tasks-3to4 (the local train.parquet)."""
TEST_ROWS = 500
VALIDATION_ROWS = 500
FRESH_SEED = 7373
"""Seed of the fresh held-out rows' order (:data:`FRESH`)."""
FRESH_ROWS = 1000
"""Test rows, and validation rows, of the fresh block."""
FRESH_POOL_ROWS = 86_748
"""Rows of ``../shared/data/countdown/pool.parquet``."""
FRESH_POOL_SHA256 = "94750fbc9e9e3eab3ccee59e8fba64048828bd7a824684a73912060be3ca8e20"
""":func:`rows_sha256` of ``../shared/data/countdown/pool.parquet``'s rows: a file of these rows gets :data:`FRESH`."""
SplitName = Literal["train", "validation", "test"]


@dataclass(frozen=True)
class HeldoutBlock:
    """The definition of a held-out block (see the module docstring): its ``name``, ``n_test`` and ``n_validation``
    rows, the ``seed`` of their order, and ``pool``: they are drawn from the first ``pool`` rows (None: every row)."""

    name: str
    n_test: int
    n_validation: int
    seed: int
    pool: int | None


ORIGINAL = HeldoutBlock("original", TEST_ROWS, VALIDATION_ROWS, SPLIT_SEED, SPLIT_POOL)
"""The held-out block of any Countdown file but the pool: 500 test (now a development set) + 500 validation rows."""
FRESH = HeldoutBlock("fresh", FRESH_ROWS, FRESH_ROWS, FRESH_SEED, None)
"""The held-out block of ``pool.parquet``: 1,000 fresh test + 1,000 fresh validation rows."""


@dataclass(frozen=True)
class RowSplit:
    """The three parts of a Countdown dataset (see the module docstring); ``heldout``: the held-out block's name."""

    train: list[CountdownTask]
    validation: list[CountdownTask]
    test: list[CountdownTask]
    heldout: str = ORIGINAL.name

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
               seed: int = SPLIT_SEED, pool: int | None = SPLIT_POOL, source: str = "the dataset",
               unused: frozenset[tuple[tuple[int, ...], int]] = frozenset(), name: str = ORIGINAL.name) -> RowSplit:
    """Split a Countdown dataset's rows (file order) into train, validation and test (see the module docstring).

    Args:
        tasks: the dataset's rows in file order (all of them, or at least the first ``pool``).
        n_test, n_validation: held-out rows of each part (>= 0).
        seed: the seed of the held-out rows' order.
        pool: held-out rows are drawn from the first ``pool`` rows only (None: from every row).
        source: the dataset's name, for error messages.
        unused: :func:`task_key` of tasks neither held out nor trained on (rows equal to one are skipped by the draw
            and left out of ``train``).
        name: the held-out block's name (:attr:`RowSplit.heldout`).
    Returns:
        :class:`RowSplit`; ``train`` keeps file order, the held-out parts the seeded order.
    Raises:
        ValueError: negative sizes, or too few distinct tasks of some count of numbers in the pool for the held-out
            rows (the message names ``source`` and the count).
    """
    if n_test < 0 or n_validation < 0:
        raise ValueError(f"held-out sizes must be >= 0, got test {n_test}, validation {n_validation}")
    head = tasks if pool is None else tasks[:pool]
    sizes = sorted({len(t.nums) for t in head})
    if not sizes:
        if n_test or n_validation:
            raise ValueError(f"{source} has no rows to hold out")
        return RowSplit(drop_heldout(tasks, unused), [], [], name)
    rng = random.Random(f"countdown-rows-{seed}")
    orders = {}
    for size in sizes:
        rows = [i for i, t in enumerate(head) if len(t.nums) == size]
        rng.shuffle(rows)
        orders[size] = iter(rows)
    taken: set[tuple[tuple[int, ...], int]] = set(unused)

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
                where = "rows" if pool is None else f"first {pool} rows"
                raise ValueError(f"{source}: its {where} hold too few distinct {size}-number tasks for "
                                 f"{n_test} test + {n_validation} validation held-out rows (a small file: pass "
                                 "--no-data-heldout to use every row, or --split all to evaluate them)")
            by_count.append(picked)
        # interleaved (3, 4, 3, 4, ...): every prefix of a part holds each count of numbers in equal share
        return [t for group in zip_longest(*by_count) for t in group if t is not None]

    test = draw(n_test)
    validation = draw(n_validation)
    return RowSplit(drop_heldout(tasks, taken), validation, test, name)


def drop_heldout(tasks: Iterable[CountdownTask], keys: set[tuple[tuple[int, ...], int]]) -> list[CountdownTask]:
    """``tasks`` without those whose :func:`task_key` is in ``keys``, order kept."""
    return [t for t in tasks if task_key(t) not in keys]


def rows_sha256(tasks: list[CountdownTask]) -> str:
    """SHA-256 (hex) of the rows' targets and numbers in file order: the line ``"{target}:{n1},{n2},...\\n"`` per row,
    numbers in the row's order. A copy of a file in another format has the same value."""
    digest = hashlib.sha256()
    for t in tasks:
        digest.update(f"{t.target}:{','.join(map(str, t.nums))}\n".encode())
    return digest.hexdigest()


def block_of(tasks: list[CountdownTask]) -> HeldoutBlock:
    """:data:`FRESH` for the rows of ``pool.parquet`` (:data:`FRESH_POOL_ROWS` rows whose :func:`rows_sha256` is
    :data:`FRESH_POOL_SHA256`), else :data:`ORIGINAL`."""
    return FRESH if len(tasks) == FRESH_POOL_ROWS and rows_sha256(tasks) == FRESH_POOL_SHA256 else ORIGINAL


def load_split(source: str, *, data_split: str = "train", seed: int | None = None, n_test: int | None = None,
               n_validation: int | None = None, limit: int | None = None) -> RowSplit:
    """:func:`split_rows` of a Countdown file or Hub dataset (:func:`rlft.tasks.countdown.loaders.load_countdown`) with
    its held-out block (:func:`block_of`: :data:`FRESH` for ``pool.parquet``'s rows, else :data:`ORIGINAL`).

    ``seed``, ``n_test``, ``n_validation``: override the block's (None: the block's own). ``limit``: read at most this
    many rows, but never fewer than the held-out block needs (so the held-out rows are the same whatever ``limit``:
    at least :data:`FRESH_POOL_ROWS` + 1 rows are read, enough to recognise the pool); None: every row.

    Raises:
        rlft.data.files.DataError: a malformed row; ValueError: see :func:`split_rows`.
    """
    from rlft.tasks.countdown.fresh_rows import POOL_ROWS_IN_TRAIN
    from rlft.tasks.countdown.loaders import load_countdown

    rows = None if limit is None else max(limit, FRESH_POOL_ROWS + 1)
    tasks = load_countdown(source, split=data_split, limit=rows)
    block = block_of(tasks)
    block = replace(block, **{k: v for k, v in (("seed", seed), ("n_test", n_test), ("n_validation", n_validation))
                              if v is not None})
    unused = frozenset(task_key(tasks[i]) for i in POOL_ROWS_IN_TRAIN) if block.name == FRESH.name else frozenset()
    return split_rows(tasks, n_test=block.n_test, n_validation=block.n_validation, seed=block.seed, pool=block.pool,
                      source=str(source), unused=unused, name=block.name)


def by_size(tasks: list[CountdownTask]) -> dict[int, list[int]]:
    """Indices of ``tasks`` by their count of numbers, ascending: ``{3: [0, 2, ...], 4: [1, ...]}``."""
    out: dict[int, list[int]] = {}
    for i, t in enumerate(tasks):
        out.setdefault(len(t.nums), []).append(i)
    return dict(sorted(out.items()))
