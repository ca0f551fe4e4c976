"""Atomic file writes: a reader (or a resumed run) sees the old file or the new one, never half of one.

Each writer writes to a hidden temporary file beside the target (``.<name>.<random>.tmp``, same folder,
so the same file system), flushes and fsyncs it, then renames it over the target with ``os.replace``
(atomic on POSIX and Windows). A write that fails or is killed leaves the target untouched; the failed
write's temporary file is removed, a killed one's stays behind, hidden (:func:`rlft.checkpoint.remove_partial_saves`
deletes those of a run folder). The new file gets the permissions a plain ``open(path, "w")`` would
give it (``0o666`` less the umask).

Whole folders are swapped in the same way by :func:`rlft.checkpoint.save_model_folder`.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator


def _temp_beside(path: Path) -> tuple[int, Path]:
    """A new, empty hidden file in ``path``'s folder, opened for writing: ``(fd, its path)``."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:  # another writer drew the same name: draw again
            continue


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file that replaces ``path`` when the ``with`` block ends without an exception.

    ``mode``: ``"w"`` (text, ``encoding``) or ``"wb"`` (bytes: e.g. ``torch.save(obj, f)``). The parent
    folder must exist. On an exception the temporary file is removed, ``path`` is left as it was, and the
    exception propagates.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, mode, **({"encoding": encoding} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str, *, encoding: str = "utf-8") -> None:
    """Replace ``path`` by a file holding ``text`` (see :func:`atomic_open`)."""
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data`` (see :func:`atomic_open`)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_json(path: str | Path, obj: Any, *, indent: int | None = 2) -> None:
    """Replace ``path`` by ``obj`` as JSON (``indent`` spaces, a final newline; see :func:`atomic_open`); a name ending
    ``.gz`` gets the JSON gzip-compressed (level 9, no time stamp, so the same object gives the same bytes).

    Raises:
        TypeError: ``obj`` holds something JSON cannot represent (``path`` is left as it was).
    """
    text = json.dumps(obj, indent=indent) + "\n"
    if Path(path).name.endswith(".gz"):
        atomic_write_bytes(path, gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    else:
        atomic_write_text(path, text)
