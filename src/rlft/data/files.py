"""Reading rows from local JSONL / JSON / Parquet files or Hugging Face Hub datasets.

Every row comes with its 0-based index so that errors can name the file, row and field. A JSONL
line that is not a JSON object is not raised on the spot: it is yielded as a :class:`DataError` in
place of the row, so a caller can raise it or count it as a skipped row (never lose it silently).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
GZIP_SUFFIXES = (".jsonl", ".json")
"""Formats also read gzip-compressed (``.jsonl.gz``, ``.json.gz``)."""


class DataError(ValueError):
    """A malformed input row; the message names the source, the 0-based row and the field."""

    def __init__(self, source: str, row: int, field: str, problem: str):
        super().__init__(f"{source}: row {row}: field {field!r}: {problem}")
        self.source, self.row, self.field, self.problem = source, row, field, problem


class HubUnavailableError(ConnectionError):
    """A Hub dataset could not be loaded (offline, unknown id or split)."""


def read_rows(
    source: str | Path, *, split: str = "train", start: int = 0, limit: int | None = None, columns: list[str] | None = None
) -> Iterator[tuple[int, dict | DataError]]:
    """Yield ``(row_index, row)`` for rows ``[start, start + limit)`` of a local file or Hub dataset.

    Local files: ``.jsonl`` (one JSON object per line; blank lines are skipped), ``.json`` (a list of
    objects, or JSON Lines under a .json name), both also gzip-compressed (``.jsonl.gz``, ``.json.gz``),
    ``.parquet`` (only ``columns`` that exist are read, when given). Anything else is a Hub dataset id, loaded with ``datasets.load_dataset(source,
    split=split)``. A row that is not a JSON object is yielded as a :class:`DataError`.

    Raises:
        FileNotFoundError: a local-looking path that does not exist.
        DataError: a ``.json`` file that holds neither a list nor JSON Lines.
        HubUnavailableError: the Hub dataset could not be loaded; the message says to pass a local file.
    """
    path = Path(source).expanduser()
    stop = None if limit is None else start + limit
    kind = _kind(path)
    if kind in LOCAL_SUFFIXES or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"data file {source} is missing")
        if kind not in LOCAL_SUFFIXES:
            raise ValueError(
                f"{path}: unsupported file type; expected one of {', '.join(LOCAL_SUFFIXES)} "
                f"(or {', '.join(s + '.gz' for s in GZIP_SUFFIXES)})"
            )
        rows = _read_local(path, columns)
        for i, row in enumerate(rows[start:stop], start=start):
            if isinstance(row, str):  # a line that did not parse: _read_local kept the reason
                yield i, DataError(str(source), i, "<line>", row)
            elif not isinstance(row, dict):
                yield i, DataError(str(source), i, "<line>", f"expected a JSON object, got {type(row).__name__}")
            else:
                yield i, row
        return
    try:
        import datasets

        dataset = datasets.load_dataset(str(source), split=split)
    except Exception as e:  # offline, unknown id, missing split: all end here
        raise HubUnavailableError(
            f"could not load Hub dataset {str(source)!r} (split {split!r}): {type(e).__name__}: {e}. "
            "The Hub may be unreachable (offline?) or the id wrong; pass a local .jsonl/.json/.parquet file instead."
        ) from None
    end = len(dataset) if stop is None else min(len(dataset), stop)
    for i in range(min(start, end), end):
        yield i, dict(dataset[i])


def _kind(path: Path) -> str:
    """The format suffix: ``.jsonl`` for ``x.jsonl`` and ``x.jsonl.gz`` (other ``.gz`` files: ``.gz``)."""
    if path.suffix == ".gz" and len(path.suffixes) >= 2 and path.suffixes[-2] in GZIP_SUFFIXES:
        return path.suffixes[-2]
    return path.suffix


def _read_local(path: Path, columns: list[str] | None) -> list:
    """All rows of a file: dicts, other JSON values, or a string saying why a line did not parse."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        wanted = [c for c in names if c in columns] if columns else None
        return pq.read_table(path, columns=wanted).to_pylist()
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = f.read()
    else:
        text = path.read_text(encoding="utf-8")
    if _kind(path) == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # maybe JSON Lines under a .json name (what `Dataset.to_json` writes)
        if isinstance(data, list):
            return data
        if data is not None:
            raise DataError(str(path), 0, "<file>", "a .json file must hold a list of objects (or JSON Lines)")
    rows: list = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            rows.append(f"not valid JSON ({e.msg})")
    return rows


def write_jsonl(path: str | Path, rows) -> None:
    """Write rows (dicts) as JSONL atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
