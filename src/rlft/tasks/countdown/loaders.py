"""Load Countdown tasks from local files or the Hugging Face Hub.

Supported layouts, detected from the columns of the first row:

* **tasks** (``Jiayi-Pan/Countdown-Tasks-3to4``): ``target`` and ``nums`` (or ``numbers``).
  An optional ``solution`` string, or an ``answer`` text whose last ``<answer>...</answer>`` holds
  the expression (the UFT parquet), fills ``CountdownTask.solution``, as given by the source.
* **verl** (TinyZero preprocessed parquet): ``reward_model.ground_truth.{numbers, target}``.
* **cog_behav** (``Asap7772/cog_behav_all_strategies``): ``query`` and ``completion``; numbers and
  target are parsed from the query ("Using the numbers [..], create an equation that equals N"),
  and query and completion are kept on the record (its completions are not all correct, so no
  ``solution`` is taken from them).

The name ``countdown-3to4`` reads the rows that ship with rlft (:mod:`rlft.tasks.countdown.shipped`: rows
0..10239 of Countdown-Tasks-3to4, target and nums).

Invalid rows raise ValueError naming the file, the 0-based row and the field; with
``skip_invalid=True`` they are skipped and a warning says how many. Nothing is dropped silently.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from rlft.data.files import DataError, file_columns, read_rows
from rlft.tasks.countdown.prompts import parse_query
from rlft.tasks.countdown.shipped import resolve_rows
from rlft.types import CountdownTask

COLUMNS = ["target", "nums", "numbers", "solution", "answer", "reward_model", "query", "completion"]
"""The only columns read from Parquet files (the UFT parquet has large unrelated ones)."""
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class _RowError(ValueError):
    def __init__(self, field: str, problem: str):
        super().__init__(f"field {field!r}: {problem}")
        self.field, self.problem = field, problem


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _RowError(field, f"expected an integer, got {value!r}")
    return value


def _int_list(value: Any, field: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise _RowError(field, f"expected a non-empty list of integers, got {value!r}")
    nums = tuple(_int(x, field) for x in value)
    if min(nums) < 0:
        raise _RowError(field, f"expected non-negative integers, got {value!r}")
    return nums


def _get(row: dict, dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            raise _RowError(dotted, "missing")
        value = value[part]
    return value


def _detect(columns: set[str]) -> str | None:
    if "query" in columns and "completion" in columns:
        return "cog_behav"
    if "target" in columns and ({"nums", "numbers"} & columns):
        return "tasks"
    if "reward_model" in columns:
        return "verl"
    return None


def _layout_error(source, row: int, columns: set[str]) -> DataError:
    found = file_columns(source)
    return DataError(
        str(source),
        row,
        "<row>",
        f"unknown Countdown layout with columns {found if found is not None else sorted(columns)}; "
        "expected target + nums/numbers, reward_model.ground_truth, or query + completion",
    )


def _task(row: Any, layout: str) -> CountdownTask:
    if not isinstance(row, dict):
        raise _RowError("<row>", f"expected an object, got {type(row).__name__}")
    if layout == "tasks":
        key = "nums" if "nums" in row else "numbers"
        nums, target = _int_list(_get(row, key), key), _int(_get(row, "target"), "target")
        solution = row.get("solution")
        if not isinstance(solution, str) and isinstance(row.get("answer"), str):
            answers = _ANSWER_RE.findall(row["answer"])
            solution = answers[-1].strip() if answers else None
        return CountdownTask(nums, target, solution if isinstance(solution, str) else None)
    if layout == "verl":
        nums = _int_list(_get(row, "reward_model.ground_truth.numbers"), "reward_model.ground_truth.numbers")
        target = _int(_get(row, "reward_model.ground_truth.target"), "reward_model.ground_truth.target")
        return CountdownTask(nums, target)
    query, completion = _get(row, "query"), _get(row, "completion")
    if not isinstance(query, str):
        raise _RowError("query", f"expected a string, got {query!r}")
    if not isinstance(completion, str) or not completion.strip():
        raise _RowError("completion", f"expected a non-empty string, got {completion!r}")
    parsed = parse_query(query)
    if parsed is None:
        raise _RowError("query", "no 'Using the numbers [...], create an equation that equals N' in it")
    return CountdownTask(parsed[0], parsed[1], query=query, completion=completion)


def load_countdown(
    source: str | Path,
    *,
    split: str = "train",
    limit: int | None = None,
    start: int = 0,
    skip_invalid: bool = False,
) -> list[CountdownTask]:
    """Countdown tasks from a local ``.jsonl``/``.json``/``.parquet`` file, a Hub dataset id, or ``countdown-3to4``
    (the rows that ship with rlft, :func:`rlft.tasks.countdown.shipped.resolve_rows`).

    ``start``/``limit`` select source rows ``[start, start + limit)`` before validation (row
    numbers in errors count from the file's first row). ``split`` applies to Hub datasets only.
    A bad row raises :class:`rlft.data.files.DataError` (a ValueError) naming the file, row and
    field; with ``skip_invalid=True`` bad rows are skipped and a warning reports how many. Hub loading
    needs network access; offline it raises ``HubUnavailableError`` (a ConnectionError) suggesting
    a local file.
    """
    source = resolve_rows(source)
    rows = list(read_rows(source, split=split, start=start, limit=limit, columns=COLUMNS))
    first = next(((i, r) for i, r in rows if isinstance(r, dict)), None)
    layout = _detect(set(first[1])) if first is not None else ""
    if layout is None:
        raise _layout_error(source, first[0], set(first[1]))
    tasks, bad = [], []
    for i, row in rows:
        try:
            if isinstance(row, DataError):
                raise row
            tasks.append(_task(row, layout))
        except (_RowError, DataError) as e:
            error = e if isinstance(e, DataError) else DataError(str(source), i, e.field, e.problem)
            if not skip_invalid:
                raise error from None
            bad.append(str(error))
    if bad:
        warnings.warn(f"skipped {len(bad)} invalid rows of {source} (first: {bad[0]})", stacklevel=2)
    return tasks


def tail_by_size(tasks: list[CountdownTask], n: int, sizes: tuple[int, ...] = (3, 4)) -> dict[int, list[CountdownTask]]:
    """The last ``n`` tasks with each count of numbers in ``sizes``, in file order: ``{3: [...], 4: [...]}``
    (a size with no tasks maps to an empty list). Countdown-Tasks-3to4 mixes 3- and 4-number rows; its tail is
    the part no rlft stage trains on, and the two sizes are reported separately."""
    return {size: [t for t in tasks if len(t.nums) == size][-n:] if n else [] for size in sizes}
