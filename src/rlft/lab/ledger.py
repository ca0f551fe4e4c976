"""The test-look ledger: one JSON line per evaluation on the held-out test rows, so a study can say how many times its
test set was looked at (issue protocol: screens stay on validation; every look at test is counted).

Each line (:func:`look_record`) holds the evaluated weights' ``model_sha256`` (None for a built-in name or Hub id), the
``model`` path, an optional ``label`` (the recipe or variant), the UTC ``time`` (ISO 8601), the ``rlft_commit`` and
``rlft_dirty`` of the code (the evaluation file's ``environment`` when it has one, else this checkout's:
:func:`rlft.provenance.git_commit`), the ``score`` (mean over tasks x samples) with ``score_by_size``, ``num_tasks``,
``mode``, ``k``, ``split``, ``data``, ``heldout`` (which test rows: ``original`` or ``fresh``, :func:`looked_rows`) and
the ``eval_file`` path.

Lines are appended atomically: one ``os.write`` of one whole line to a file opened with ``O_APPEND`` (then fsync), so
concurrent writers never interleave within a line and a reader never sees half of one on a local file system.
``rlft eval ledger [PATH]`` prints the count and a table per model (:func:`summarize_looks`); ``--model-sha256`` takes
the full hash or a unique prefix of at least 8 hex digits.

One rule for every writer (:func:`check_ledger_target`, run before the evaluation): a ledger is a ``.jsonl`` file whose
lines are all looks (JSON objects with the :data:`LOOK_KEYS`); it is never an input of the evaluation (a data file,
anything inside a model folder) nor one of its outputs (compared by resolved identity), and it must be writable. A file
is only ever appended to, never truncated or replaced. A cut last line (no newline at its end: a write that did not
finish) is refused before an evaluation, naming the line to move aside; a writer that meets one anyway starts its look
on a new line, so the look is kept whole and the reader names the damaged line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from rlft.eval.countdown import CountdownEvalResult, eval_of_json, read_eval_json
from rlft.validation import OptionError, UsageError, require, validate_options

log = logging.getLogger("rlft")

LEDGER_NAME = "test_looks.jsonl"
"""The ledger's file name: ``rlft eval countdown --split test --output X`` would append to ``X``'s folder / this."""


def default_ledger_path(output: str | Path) -> Path:
    """Where the test looks of an evaluation written to ``output`` are counted:
    ``<output's folder>/test_looks.jsonl``."""
    return Path(output).expanduser().parent / LEDGER_NAME


LOOK_KEYS = ("time", "score")
"""The keys every ledger line has (:func:`look_record` writes them): a line without them is not a test look."""
MIN_SHA256_PREFIX = 8
"""The fewest hex digits ``rlft eval ledger --model-sha256`` takes (its table prints 12)."""
Paths = Mapping[str, Any] | Iterable[Any]
"""The other files of an evaluation: ``{option name: path}`` or a list of paths (None: none)."""


def _named(paths: Paths, what: str) -> list[tuple[str, Path]]:
    """``{name: path}`` or a list of paths as ``[(name, path)]``, Nones dropped (a list's paths are named ``what``)."""
    items = paths.items() if isinstance(paths, Mapping) else ((what, p) for p in paths)
    return [(name, Path(p).expanduser()) for name, p in items if p is not None and str(p) != ""]


def _same_or_inside(target: Path, other: Path) -> bool:
    """``target`` is the file ``other`` (same inode where both exist, else the same resolved path) or lies inside the
    folder ``other``."""
    try:
        if other.is_dir():
            return Path(os.path.realpath(target)).is_relative_to(os.path.realpath(other))
        if target.exists() and other.exists():
            return os.path.samefile(target, other)
    except OSError:
        return False
    return os.path.realpath(target) == os.path.realpath(other)


def _not_a_look(line: bytes) -> str | None:
    """Why ``line`` (one line of a ledger, bytes) is not a test look; None when it is one."""
    try:
        record = json.loads(line)
    except ValueError as e:
        return f"not JSON ({e})"
    if not isinstance(record, dict):
        return "not a JSON object"
    missing = [key for key in LOOK_KEYS if key not in record]
    return f"a JSON object without {', '.join(missing)}" if missing else None


def check_ledger_target(path: str | Path, *, inputs: Paths = (), outputs: Paths = (), option: str = "test-look ledger",
                        allow_cut_end: bool = False) -> Path:
    """Check that a look may be appended to the ledger ``path``, before the evaluation runs; writes nothing. Returns
    ``path`` as a ``Path`` (``~`` expanded).

    ``inputs`` / ``outputs``: the evaluation's other files, ``{option name: path}`` (or a list of paths; None and Hub
    ids are skipped by existence); the ledger must be none of them and lie inside no input folder (a model folder).
    ``option``: how messages name the ledger (``--ledger``). ``allow_cut_end``: accept a cut last line (the writer then
    starts the look on a new line: :func:`append_line`); False refuses it.

    Raises:
        OptionError: one line naming ``path`` and why: a folder; not a ``.jsonl`` name; an input or output (by resolved
            identity) or inside an input folder; a folder on its way is a file, or it cannot be created or written;
            a line that is not a test look (naming its number); a cut last line (unless ``allow_cut_end``).
    """
    text = str(path)
    target = Path(path).expanduser()
    if text.endswith(("/", os.sep)) or target.name in ("", ".", "..") or target.is_dir():
        raise OptionError(f"{option} {text} is a folder: name the ledger file (e.g. {LEDGER_NAME})")
    if target.suffix != ".jsonl":
        raise OptionError(f"{option} {text}: a test-look ledger is a .jsonl file (e.g. {LEDGER_NAME}); name one")
    for kind, paths in (("input", inputs), ("output", outputs)):
        for name, other in _named(paths, f"an {kind}"):
            if _same_or_inside(target, other):
                where = "lies inside" if other.is_dir() else "is"
                raise OptionError(f"{option} {text} {where} the evaluation's {kind} {name} {other}: a ledger holds "
                                  f"test looks only; choose another {option}")
    _check_writable(target, text, option)
    if target.is_file():
        with target.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                why = _not_a_look(line)
                if why is not None and why.startswith("not JSON") and not line.endswith(b"\n"):
                    if allow_cut_end:
                        break
                    raise OptionError(f"{option} {text}: its last line ({number}) is cut (no newline at its end, "
                                      f"{why}): a write that did not finish; move that line aside, then rerun")
                if why is not None:
                    raise OptionError(f"{option} {text}: line {number} is {why}, not a test look: the file holds "
                                      f"something else; choose another {option}")
    return target


def _check_writable(target: Path, text: str, option: str) -> None:
    """OptionError unless ``target`` can be appended to (an existing file) or created (its nearest existing folder)."""
    if target.exists():
        if not os.access(target, os.W_OK):
            raise OptionError(f"{option} {text}: the file cannot be written (permission denied)")
        return
    folder = next(f for f in Path(os.path.abspath(target)).parents if f.exists())
    if not folder.is_dir():
        raise OptionError(f"{option} {text}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OptionError(f"{option} {text}: cannot create it in {folder} (permission denied)")


def look_record(result: CountdownEvalResult, config: dict, *, eval_path: str | Path | None = None,
                label: str | None = None, environment: dict | None = None) -> dict:
    """The ledger line of one evaluation (see the module docstring). ``config``: the evaluation's ``config`` (``model``,
    ``model_sha256``, ``split``, ``data``; missing keys are None); ``environment``: its ``environment`` record, whose
    ``rlft_commit`` wins over this checkout's."""
    from rlft.provenance import git_commit

    env = environment or {}
    if env.get("rlft_commit"):
        commit, dirty = env["rlft_commit"], env.get("rlft_dirty")
    else:
        import rlft.provenance

        commit, dirty = git_commit(Path(rlft.provenance.__file__).resolve().parent)
    by_size = {name: m["score"] for name, m in (result.by_size or {}).items()}
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model_sha256": config.get("model_sha256"),
            "model": config.get("model"), "label": label, "score": result.mean_score, "score_by_size": by_size,
            "num_tasks": result.num_tasks, "mode": result.mode, "k": result.k, "split": config.get("split"),
            "data": config.get("data"), "heldout": config.get("heldout"),
            "eval_file": str(eval_path) if eval_path is not None else None,
            "rlft_commit": commit, "rlft_dirty": dirty}


def append_line(path: str | Path, record: dict) -> None:
    """Append ``record`` as one JSON line to ``path`` with a single ``os.write`` on an ``O_APPEND`` descriptor, then
    fsync (the folder is created when missing). A file whose last line is cut (no newline at its end) gets the line on
    a line of its own, never glued to the cut one (logged; :func:`read_looks` then names the damaged line).

    Raises:
        OSError: the file cannot be opened or written, or the write was short (naming ``path``).
    """
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # a cut last line: start this one on a line of its own
            log.warning("%s: its last line is cut (no newline at its end); this look starts on a new line", path)
            line = b"\n" + line
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"{path}: wrote {written} of {len(line)} bytes of a ledger line")
        os.fsync(fd)
    finally:
        os.close(fd)


def record_test_look(eval_path_or_result: str | Path | CountdownEvalResult, config: Any = None,
                     ledger_path: str | Path | None = None, *, label: str | None = None,
                     eval_path: str | Path | None = None, inputs: Paths = ()) -> dict:
    """Append one line for a test evaluation to ``ledger_path``; returns the line's record.

    ``eval_path_or_result``: an ``rlft eval countdown --output`` file (read with
    :func:`rlft.eval.countdown.read_eval_json`, once; its ``config`` and ``environment`` are used, ``config`` keys given
    here win) or a :class:`CountdownEvalResult` in memory (then ``config`` is needed: a dict or the command's config
    dataclass, with ``model_sha256`` added; ``eval_path`` names the file it was written to). ``ledger_path`` None:
    :func:`default_ledger_path` of the evaluation file. The ledger is checked by :func:`check_ledger_target` (the
    evaluation file is its output, ``inputs`` its inputs, ``{name: path}``; a cut last line is not glued onto).

    Raises:
        UsageError: the file is not an evaluation; a result without ``config``; no ledger path can be formed; the
            ledger is not one (:func:`check_ledger_target`).
        OSError: the ledger cannot be written.
    """
    environment = None
    if isinstance(eval_path_or_result, CountdownEvalResult):
        if config is None:
            raise UsageError("record_test_look: an evaluation result needs its config (model, model_sha256, split)")
        result, file_config = eval_path_or_result, {}
    else:
        eval_path = eval_path_or_result
        try:
            data = read_eval_json(eval_path)
            result, file_config = eval_of_json(data, eval_path)
            environment = data.get("environment")
        except (OSError, ValueError) as e:
            raise UsageError(str(e)) from None
    given = asdict(config) if is_dataclass(config) and not isinstance(config, type) else dict(config or {})
    config = {**file_config, **given}
    if ledger_path is None:
        if eval_path is None:
            raise UsageError("record_test_look: pass ledger_path (or eval_path, whose folder holds the ledger)")
        ledger_path = default_ledger_path(eval_path)
    check_ledger_target(ledger_path, inputs=inputs, outputs={"file": eval_path}, allow_cut_end=True)
    record = look_record(result, config, eval_path=eval_path, label=label,
                         environment=environment if isinstance(environment, dict) else None)
    append_line(ledger_path, record)
    return record


def read_looks(ledger_path: str | Path) -> list[dict]:
    """Every line of a ledger, in order ([] when the file does not exist).

    Raises:
        UsageError: a line that is not a JSON object (naming the file and the line number; a damaged line, e.g. one a
            write did not finish, is to be moved aside), or a folder.
    """
    path = Path(ledger_path).expanduser()
    if not path.exists():
        return []
    if path.is_dir():
        raise UsageError(f"{ledger_path} is a folder, not a test-look ledger (a {LEDGER_NAME} file)")
    looks = []
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            cut = number == len(lines) and not text.endswith("\n")
            why = "cut (no newline at its end: a write that did not finish)" if cut else "damaged (a cut write?)"
            raise UsageError(f"{ledger_path}: line {number} is not JSON ({e}): {why}; move that line aside to count "
                             "the others") from None
        if not isinstance(record, dict):
            raise UsageError(f"{ledger_path}: line {number} is not a JSON object")
        looks.append(record)
    return looks


def count_test_looks(ledger_path: str | Path, model_sha256: str | None = None) -> int:
    """How many test looks ``ledger_path`` records (0 when it does not exist); with ``model_sha256``, of those weights
    only."""
    return sum(model_sha256 is None or r.get("model_sha256") == model_sha256 for r in read_looks(ledger_path))


def summarize_looks(looks: list[dict]) -> list[dict]:
    """One row per model, in order of first look: ``model_sha256`` (None: weights unknown, grouped by ``model``),
    ``models`` and ``labels`` (distinct, in order), ``looks``, ``first`` and ``last`` times, ``scores`` (in order)."""
    rows: dict[tuple, dict] = {}
    for r in looks:
        key = (r.get("model_sha256"),) if r.get("model_sha256") else (None, r.get("model"))
        row = rows.setdefault(key, {"model_sha256": r.get("model_sha256"), "models": [], "labels": [], "looks": 0,
                                    "first": r.get("time"), "last": r.get("time"), "scores": []})
        row["looks"] += 1
        row["last"] = r.get("time")
        row["scores"].append(r.get("score"))
        for name, value in (("models", r.get("model")), ("labels", r.get("label"))):
            if value is not None and value not in row[name]:
                row[name].append(value)
    return list(rows.values())


def looked_rows(record: dict) -> str:
    """Which test rows a look read: its ``heldout`` block (``fresh``: the 1,000 fresh test rows of pool.parquet;
    ``original``: a file's 500 test rows, now a development set; rlft.tasks.countdown.splits), else ``original`` for a
    look at a ``--data`` file recorded before the field existed, ``generated`` for generated tasks (no ``data``)."""
    return record.get("heldout") or ("original" if record.get("data") else "generated")


def format_looks(path: str, looks: list[dict]) -> str:
    """The count, then a table per model: SHA-256 (first 12 hex digits), looks, first and last time, scores, labels and
    model paths; then the looks per test rows (:func:`looked_rows`: fresh, original, generated)."""
    rows = summarize_looks(looks)
    lines = [f"{path}: {len(looks)} test look{'s' if len(looks) != 1 else ''} "
             f"of {len(rows)} model{'s' if len(rows) != 1 else ''}"]
    if rows:
        lines.append(f"{'model SHA-256':<14} {'looks':>5}  {'first':<20}  {'last':<20}  {'scores':<24}  labels / model")
    for row in rows:
        sha = row["model_sha256"][:12] if row["model_sha256"] else "-"
        scores = ", ".join("-" if s is None else f"{s:.3f}" for s in row["scores"][-4:])
        scores = ("..., " if len(row["scores"]) > 4 else "") + scores
        names = ", ".join([*row["labels"], *map(str, row["models"])]) or "-"
        lines.append(
            f"{sha:<14} {row['looks']:>5}  {row['first'] or '-':<20}  {row['last'] or '-':<20}  {scores:<24}  {names}")
    by_rows: dict[str, int] = {}
    for r in looks:
        by_rows[looked_rows(r)] = by_rows.get(looked_rows(r), 0) + 1
    if by_rows:  # the fresh and the original test rows are counted apart
        lines.append("looks by test rows: " + ", ".join(f"{name} {n}" for name, n in by_rows.items()))
    return "\n".join(lines)


@dataclass(frozen=True)
class EvalLedgerConfig:
    """Count the test looks a ledger records (one line per test evaluation), per model."""

    path: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="[PATH]")] = LEDGER_NAME
    """The ledger file (default: test_looks.jsonl in the current folder; rlft eval countdown's is next to
    its --output)."""
    model_sha256: str | None = None
    """Count only the looks at these weights: the SHA-256 an evaluation's config.model_sha256 records, or a unique
    prefix of it (at least 8 hex digits; the table prints 12)."""

    def __post_init__(self) -> None:
        validate_options(self)
        sha = self.model_sha256
        require(sha is None or re.fullmatch(f"[0-9a-fA-F]{{{MIN_SHA256_PREFIX},64}}", sha) is not None,
                f"--model-sha256 {sha}: give the weights' SHA-256 or at least its first {MIN_SHA256_PREFIX} hex digits "
                "(the table of `rlft eval ledger` prints 12)")


def match_model_sha256(looks: list[dict], prefix: str) -> str | None:
    """The one ``model_sha256`` of ``looks`` that begins with ``prefix`` (hex digits, any case); None when none does.

    Raises:
        OptionError: the prefix begins the hashes of several models (naming them; give more digits).
    """
    prefix = prefix.lower()
    shas = (r.get("model_sha256") for r in looks)
    found = list(dict.fromkeys(sha for sha in shas if isinstance(sha, str) and sha.lower().startswith(prefix)))
    if len(found) > 1:
        shown = ", ".join(sha[:16] for sha in found[:4]) + (", ..." if len(found) > 4 else "")
        raise OptionError(f"--model-sha256 {prefix} is ambiguous: it begins the SHA-256 of {len(found)} models "
                          f"({shown}); give more digits")
    return found[0] if found else None


def run_eval_ledger(cfg: EvalLedgerConfig) -> dict:
    """Print the ledger's count and its table per model; returns ``{"path", "looks", "models"}`` (the count, filtered by
    ``cfg.model_sha256`` when set: the full hash or a unique prefix, :func:`match_model_sha256`, and
    :func:`summarize_looks`'s rows).

    Raises:
        UsageError: the ledger does not exist, is a folder, or holds a bad line; an ambiguous ``--model-sha256``
            prefix (the CLI exits 2).
    """
    if not Path(cfg.path).expanduser().exists():
        raise UsageError(f"{cfg.path}: no such test-look ledger (rlft eval countdown --split test appends to one)")
    looks = read_looks(cfg.path)
    if cfg.model_sha256 is not None:
        sha = match_model_sha256(looks, cfg.model_sha256)
        looks = [r for r in looks if sha is not None and r.get("model_sha256") == sha]
    print(format_looks(cfg.path, looks))
    return {"path": cfg.path, "looks": len(looks), "models": summarize_looks(looks)}
