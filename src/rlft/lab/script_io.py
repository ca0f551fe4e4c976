"""The one rule of ``scripts/`` (and ``bench/``), shared with the lab and the ``rlft`` command line: what a script
may write, how it reads its JSON inputs, and how it reports a user's mistake.

- **Outputs** (:func:`check_outputs`, the library's :func:`rlft.run_folder.check_outputs`, imported here so that a
  script imports its rules from one module): every file a script writes (``--json``, ``--markdown``, ``--plot``, ...)
  is checked before any work, as ``rlft --output`` is (:func:`rlft.run_folder.check_output_file`): never a folder or a
  path inside a model folder, never an existing file unless ``--overwrite``, and never one of the script's inputs
  (not even with ``--overwrite``) nor another of its outputs.
- **JSON inputs** (:func:`read_json`): a file that is missing, unreadable or not JSON is an error naming the file
  (never a bare "Unterminated string ..." from the parser). A run's ``metrics.jsonl`` (:func:`read_metrics`) is read
  as a resumed run keeps it: a last line cut short by a kill is left out, with a note. The lab's demo and pipeline
  read their files with them too.
- **Errors** (:func:`run_script`): a user error, :class:`ScriptError` (or any :class:`rlft.validation.UsageError`,
  ``ValueError`` or ``OSError``: a bad file named by its message; or one of rlft's own errors, e.g. a model that does
  not load; or ``SystemExit("message")``, as older scripts raise) is one line on stderr,
  ``<script>: error: <message>``, and exit code 2; :class:`ArgumentParser` reports a bad flag the same way.
  ``RLFT_DEBUG=1`` shows the traceback instead.

A script's ``__main__`` block is ``run_script(main)``; its ``main(argv)`` checks the inputs and outputs before any
model loads or any file is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn

from rlft.run_folder import check_outputs
from rlft.validation import UsageError

__all__ = ["ArgumentParser", "ScriptError", "check_outputs", "check_picture", "fail", "parse_labelled_run",
           "read_json", "read_labelled_run", "read_metrics", "run_script", "start_and_runs_args"]


class ScriptError(UsageError):
    """A mistake in how a script was called or in the files it was given; the message names the option or file
    (the script exits with code 2)."""


def fail(message: str) -> NoReturn:
    """Raise :class:`ScriptError` with ``message``."""
    raise ScriptError(message)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (an unknown flag, a missing one, a bad value) raise
    :class:`ScriptError`, printed by :func:`run_script` as one line (exit 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        raise ScriptError(f"{message} (--help for usage)")


PICTURES = (".png", ".pdf", ".svg")
"""The file names a plot may have: matplotlib picks the format from the name."""


def check_picture(option: str, path: str | Path) -> None:
    """ScriptError unless ``path`` ends in one of :data:`PICTURES` (else the plot would fail after the work is done)."""
    if Path(path).suffix.lower() not in PICTURES:
        fail(f"{option} {path}: name a {', '.join(PICTURES[:-1])} or {PICTURES[-1]} file (the format follows the name)")


def parse_labelled_run(spec: str) -> tuple[str, Path, Path]:
    """A study script's ``--run LABEL=METRICS.jsonl,EVAL.json`` -> (label, metrics path, evaluation path).

    Raises:
        ScriptError: naming the option: no ``=``, an empty label, or not exactly two non-empty paths.
    """
    label, sep, paths = spec.partition("=")
    parts = [p.strip() for p in paths.split(",")]
    if not sep or not label.strip() or len(parts) != 2 or not all(parts):
        fail(f"--run {spec!r}: expected LABEL=METRICS.jsonl,EVAL.json")
    return label.strip(), Path(parts[0]), Path(parts[1])


def read_labelled_run(spec: str, key: str) -> tuple[str, list[dict], Path]:
    """A study script's ``--run LABEL=METRICS.jsonl,EVAL.json`` read: (label, the step records of the metrics file that
    carry ``key``, the evaluation path; :func:`read_metrics`, so a last line cut short by a kill is left out).

    Raises:
        ScriptError: naming the option or the file: a malformed ``spec`` (:func:`parse_labelled_run`), a missing
            metrics file, or one with no step record carrying ``key``.
    """
    label, metrics, eval_path = parse_labelled_run(spec)
    if not metrics.is_file():
        fail(f"{metrics} does not exist")
    records = [r for r in read_metrics(metrics) if "step" in r and key in r]
    if not records:
        fail(f"{metrics}: no step records with {key} (not an RL run's metrics?)")
    return label, records, eval_path


def start_and_runs_args(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The arguments of a script that draws RL runs against their start, checked before any work: ``--start`` (the
    start's evaluation), ``--run LABEL=METRICS.jsonl,EVAL.json`` (repeatable, :func:`parse_labelled_run`), ``--out``
    (a picture, :func:`check_picture`) and ``--overwrite``.

    Raises:
        ScriptError: a bad option.
        rlft.run_folder.OutputPathError: ``--out`` is one of the inputs, or exists and not ``--overwrite``
            (:func:`check_outputs`).
    """
    parser = ArgumentParser(description=description)
    parser.add_argument("--start", type=Path, required=True, help="the start model's greedy evaluation")
    parser.add_argument("--run", action="append", required=True, help="LABEL=METRICS.jsonl,EVAL.json (repeat)")
    parser.add_argument("--out", type=Path, required=True, help="the picture (a new .png, .pdf or .svg file)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    check_picture("--out", args.out)
    inputs = [args.start] + [p for spec in args.run for p in parse_labelled_run(spec)[1:]]
    check_outputs({"--out": args.out}, inputs, overwrite=args.overwrite)
    return args


def read_json(path: str | Path, what: str = "a JSON file") -> Any:
    """The JSON value in ``path``.

    Raises:
        ValueError: naming ``path`` (and ``what`` it should be): it does not exist, is a folder, cannot be read, is
            not UTF-8 or not JSON (with the parser's message and position).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"{path}: no such file ({what})")
    if p.is_dir():
        raise ValueError(f"{path} is a folder, not {what}")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno}); expected {what}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; expected {what}") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e}); expected {what}") from None


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl``, as :class:`rlft.checkpoint.MetricsLog` keeps them on resume: a last
    line that does not parse (cut short by a kill; the run may still be writing) is left out with a note on stderr.

    Raises:
        ValueError: naming the file: it does not exist, or a line before the last is not a JSON object (line number).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"{path}: no such file (a run's metrics.jsonl)")
    lines = [(i, line) for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if line.strip()]
    records = []
    for i, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            if i == lines[-1][0]:
                print(f"note: {path}: line {i} is cut short (a run killed mid-write, or still writing): left out",
                      file=sys.stderr)
                break
            raise ValueError(f"{path}: line {i} is not a JSON object (not a run's metrics.jsonl?)")
        records.append(record)
    return records


def one_line(error: BaseException) -> str:
    """An exception's message on one line (its type when it has none; a missing file's name added)."""
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, OSError) and error.filename and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    return text


def run_script(main: Callable[[list[str] | None], Any], argv: list[str] | None = None, prog: str | None = None) -> None:
    """Call ``main(argv)``; a user error (:class:`rlft.validation.UsageError`, ``ValueError``, ``OSError``, an
    exception class of rlft's own such as :class:`rlft.models.ModelNotFoundError`, a ``SystemExit`` whose code is a
    message) is printed as ``<prog>: error: <message>`` on one line and ends the process with exit
    code 2 (``SystemExit(2)``).
    ``prog``: the script's file name (default ``sys.argv[0]``'s). ``RLFT_DEBUG=1``: the traceback is printed too."""
    prog = prog or Path(sys.argv[0]).name
    try:
        main(argv)
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise  # an exit code (argparse's --help: 0)
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as e:
        if not isinstance(e, (UsageError, ValueError, OSError)) and not type(e).__module__.startswith("rlft."):
            raise  # a bug: its traceback
        if os.environ.get("RLFT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None
