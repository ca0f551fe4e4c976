"""Reading rows from local JSONL / JSON / Parquet files or Hugging Face Hub datasets.

Every row comes with its 0-based index so that errors can name the file, row and field. A JSONL
line that is not a JSON object (or not UTF-8) is not raised on the spot: it is yielded as a
:class:`DataError` in place of the row, so a caller can raise it or count it as a skipped row (never
lose it silently). A file that cannot be read at all (a directory, a damaged Parquet or gzip file)
raises a :class:`DataError` naming it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from rlft.fsio import atomic_open

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


def read_rows(source: str | Path, *, split: str = "train", start: int = 0, limit: int | None = None,
              columns: list[str] | None = None) -> Iterator[tuple[int, dict | DataError]]:
    """Yield ``(row_index, row)`` for rows ``[start, start + limit)`` of a local file or Hub dataset.

    Local files: ``.jsonl`` (one JSON object per line; blank lines are skipped), ``.json`` (a list of
    objects, or JSON Lines under a .json name), both also gzip-compressed (``.jsonl.gz``, ``.json.gz``),
    ``.parquet`` (only ``columns`` that exist are read, when given). Anything else is a Hub dataset id, loaded
    with ``datasets.load_dataset(source, split=split)``. A row that is not a JSON object is yielded as
    a :class:`DataError`.

    Raises:
        FileNotFoundError: a local-looking path that does not exist.
        DataError: a directory; a ``.json`` file that holds neither a list nor JSON Lines; a Parquet or
            gzip file that cannot be read.
        HubUnavailableError: the Hub dataset could not be loaded; the message says to pass a local file.
    """
    path = Path(source).expanduser()
    stop = None if limit is None else start + limit
    kind = _kind(path)
    if kind in LOCAL_SUFFIXES or path.exists():
        if path.is_dir():
            raise DataError(str(source), 0, "<file>", "is a directory, not a data file")
        if not path.is_file():
            raise FileNotFoundError(f"data file {source} is missing")
        if kind not in LOCAL_SUFFIXES:
            raise ValueError(
                f"{path}: unsupported file type; expected one of {', '.join(LOCAL_SUFFIXES)} "
                f"(or {', '.join(s + '.gz' for s in GZIP_SUFFIXES)})"
            )
        rows = _read_local(path, columns)
        for i, row in enumerate(rows[start:stop], start=start):
            if isinstance(row, _BadLine):  # a line that did not parse: _read_local kept the reason
                yield i, DataError(str(source), i, "<line>", row.reason)
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


def file_columns(path: str | Path) -> list[str] | None:
    """The column names of a Parquet file (None for other files or when it cannot be read)."""
    path = Path(path)
    if path.suffix != ".parquet" or not path.is_file():
        return None
    try:
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    except Exception:
        return None


def _read_parquet(path: Path, columns: list[str] | None) -> list:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        wanted = [c for c in names if c in columns] if columns else None
        if columns and not wanted:
            raise DataError(
                str(path), 0, "<columns>",
                f"none of the columns {', '.join(columns)}; the file has {', '.join(names) or 'no columns'}")
        return pq.read_table(path, columns=wanted).to_pylist()
    except DataError:
        raise
    except Exception as e:  # pyarrow's ArrowInvalid / OSError on a damaged or non-Parquet file
        raise DataError(str(path), 0, "<file>",
                        f"not a readable Parquet file ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def _decode_lines(data: bytes) -> list[str | UnicodeDecodeError]:
    """The lines of ``data`` (split on ``\\n``), each decoded as UTF-8 on its own (a BOM on the first is
    dropped); a line that is not UTF-8 is kept as its ``UnicodeDecodeError``."""
    out: list[str | UnicodeDecodeError] = []
    for j, raw in enumerate(data.split(b"\n")):
        if j == 0 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            out.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            out.append(e)
    return out


class _BadLine:
    """A line that did not parse, with the reason (kept in place of its row)."""

    def __init__(self, reason: str):
        self.reason = reason


def _read_local(path: Path, columns: list[str] | None) -> list:
    """All rows of a file: dicts, other JSON values, or a :class:`_BadLine` saying why a line did not parse."""
    if path.suffix == ".parquet":
        return _read_parquet(path, columns)
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as f:
                data = f.read()
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
            raise DataError(str(path), 0, "<file>", f"not a readable gzip file ({type(e).__name__}: {e})") from None
    else:
        data = path.read_bytes()
    lines = _decode_lines(data)
    if _kind(path) == ".json" and not any(isinstance(line, UnicodeDecodeError) for line in lines):
        try:
            parsed = json.loads("\n".join(lines))  # type: ignore[arg-type]
        except (json.JSONDecodeError, RecursionError):
            parsed = None  # maybe JSON Lines under a .json name (what `Dataset.to_json` writes)
        if isinstance(parsed, list):
            return parsed
        if parsed is not None:
            raise DataError(str(path), 0, "<file>", "a .json file must hold a list of objects (or JSON Lines)")
    rows: list = []
    for number, line in enumerate(lines, start=1):
        if isinstance(line, UnicodeDecodeError):
            rows.append(
                _BadLine(
                    f"line {number}: not valid UTF-8 (byte 0x{line.object[line.start]:02x} at column {line.start + 1})")
            )
            continue
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            rows.append(_BadLine(f"line {number}: not valid JSON ({e.msg})"))
        except RecursionError:
            rows.append(_BadLine(f"line {number}: not valid JSON (nested too deeply)"))
    return rows


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file that rlft wrote (:func:`write_jsonl`), blank lines skipped. User data goes through
    :func:`read_rows`, whose errors name the file, row and field."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: str | Path, rows) -> None:
    """Write rows (dicts) as JSONL atomically (:func:`rlft.fsio.atomic_open`), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
