"""Reading rows from local JSONL / JSON / Parquet files or Hugging Face Hub datasets.

Every row comes with its 0-based index so that errors can name the file, row and field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


class DataError(ValueError):
    """A malformed input row; the message names the source, the 0-based row and the field."""

    def __init__(self, source: str, row: int, field: str, problem: str):
        super().__init__(f"{source}: row {row}: field {field!r}: {problem}")
        self.source, self.row, self.field, self.problem = source, row, field, problem


def read_rows(source: str, *, split: str = "train") -> Iterator[tuple[int, dict]]:
    """Yield ``(row_index, row_dict)`` from a local file or a Hub dataset.

    Local files: ``.jsonl`` (one JSON object per line; blank lines are an error), ``.json`` (a list
    of objects), ``.parquet``. Anything else is treated as a Hub dataset id loaded with
    ``datasets.load_dataset(source, split=split)``.

    Raises:
        FileNotFoundError: a local-looking path that does not exist.
        DataError: a JSONL line that is not a JSON object.
        ConnectionError: the Hub dataset could not be loaded (e.g. offline); the message says to
            pass a local file instead.
    """
    path = Path(source).expanduser()
    if path.suffix in (".jsonl", ".json", ".parquet") or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"data file {source} does not exist")
        yield from _read_local(path)
        return
    try:
        import datasets

        dataset = datasets.load_dataset(source, split=split)
    except Exception as e:  # offline, unknown id, missing split: all end here
        raise ConnectionError(
            f"could not load Hub dataset {source!r} (split {split!r}): {type(e).__name__}: {e}. "
            "If the Hub is unreachable, download it elsewhere and pass a local .jsonl/.parquet file."
        ) from None
    for i, row in enumerate(dataset):
        yield i, dict(row)


def _read_local(path: Path) -> Iterator[tuple[int, dict]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        for i, row in enumerate(table.to_pylist()):
            yield i, row
        return
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise DataError(str(path), 0, "<file>", "a .json file must hold a list of objects")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DataError(str(path), i, "<row>", f"expected a JSON object, got {type(row).__name__}")
            yield i, row
        return
    with path.open() as f:
        for i, line in enumerate(f):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(str(path), i, "<line>", f"not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(str(path), i, "<line>", f"expected a JSON object, got {type(row).__name__}")
            yield i, row


def write_jsonl(path: str | Path, rows) -> None:
    """Write rows (dicts) as JSONL atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
