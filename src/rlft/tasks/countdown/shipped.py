"""The Countdown-Tasks-3to4 rows that ship with rlft: ``--data countdown-3to4`` (and the demo's default rows).

``data/countdown_3to4.parquet`` holds the ``target`` and ``nums`` columns of rows 0..10239 of
``Jiayi-Pan/Countdown-Tasks-3to4`` in file order (source and licence: ``data/README.md``), about 45 KB. They are
every row the demo and the README's examples read: the held-out block (500 test + 500 validation rows,
:mod:`rlft.tasks.countdown.splits`) is drawn from these 10,240 rows, and the RL stage draws its prompts through a
seeded permutation of all the training rows, so the same rows in the same order give the same tasks, prompts and
pairs as a copy of the full file.

:func:`resolve_rows` turns the name :data:`SHIPPED_NAME` into the file's path (the loaders call it, so every command
that takes a Countdown ``--data`` takes the name); :func:`write_shipped_rows` rebuilds the file::

    python -m rlft.tasks.countdown.shipped ../shared/data/countdown/train.parquet
"""

from __future__ import annotations

import sys
from pathlib import Path

SHIPPED_NAME = "countdown-3to4"
"""The name that stands for the shipped rows wherever a Countdown ``--data`` (or the demo's ``--rows``) is read."""
SHIPPED_ROWS = Path(__file__).resolve().parent / "data" / "countdown_3to4.parquet"
"""The shipped rows: ``target`` (int64) and ``nums`` (list of int64), rows 0..10239 of Countdown-Tasks-3to4."""
SHIPPED_COUNT = 10_240
"""Rows in :data:`SHIPPED_ROWS` (:data:`rlft.tasks.countdown.splits.SPLIT_POOL`: the held-out block's pool)."""


def resolve_rows(source: str | Path) -> str | Path:
    """``source``, or the shipped file's path when ``source`` is :data:`SHIPPED_NAME`.

    Raises:
        FileNotFoundError: the name was given but the file is not installed (a copy of rlft without its package data).
    """
    if str(source) != SHIPPED_NAME:
        return source
    if not SHIPPED_ROWS.is_file():
        raise FileNotFoundError(f"{SHIPPED_NAME}: the Countdown rows that ship with rlft ({SHIPPED_ROWS}) are missing; "
                                "reinstall rlft, or pass a Countdown-Tasks-3to4 file or Hub id")
    return SHIPPED_ROWS


def write_shipped_rows(source: str | Path, dest: str | Path = SHIPPED_ROWS, rows: int = SHIPPED_COUNT) -> int:
    """Write the ``target`` and ``nums`` columns of the first ``rows`` rows of the Parquet file ``source`` (a copy of
    Countdown-Tasks-3to4, e.g. ``../shared/data/countdown/train.parquet``) to ``dest``, zstd-compressed, without
    the source's schema metadata. Returns the rows written.

    Raises:
        ValueError: ``source`` has fewer than ``rows`` rows, or no ``target``/``nums`` column (named).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = pq.read_schema(source).names
    if missing := [c for c in ("target", "nums") if c not in names]:
        raise ValueError(f"{source}: no {', '.join(missing)} column (columns: {', '.join(names)})")
    table = pq.read_table(source, columns=["target", "nums"])
    if table.num_rows < rows:
        raise ValueError(f"{source}: {table.num_rows} rows, fewer than the {rows} to ship")
    table = table.slice(0, rows)
    out = pa.table({"target": table["target"].cast(pa.int64()), "nums": table["nums"].cast(pa.list_(pa.int64()))})
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(out, dest, compression="zstd")
    return out.num_rows


def main(argv: list[str] | None = None) -> int:
    """``python -m rlft.tasks.countdown.shipped SOURCE [DEST]``: rebuild the shipped rows from ``SOURCE``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m rlft.tasks.countdown.shipped SOURCE.parquet [DEST.parquet]", file=sys.stderr)
        return 2
    try:
        n = write_shipped_rows(*args)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {n} rows to {args[1] if len(args) == 2 else SHIPPED_ROWS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
