"""The test-look ledger: one JSON line per evaluation on the held-out test rows, so a study can say how many times its
test set was looked at (issue protocol: screens stay on validation; every look at test is counted).

Each line (:func:`look_record`) holds the evaluated weights' ``model_sha256`` (None for a built-in name or Hub id), the
``model`` path, an optional ``label`` (the recipe or variant), the UTC ``time`` (ISO 8601), the ``rlft_commit`` and
``rlft_dirty`` of the code (the evaluation file's ``environment`` when it has one, else this checkout's:
:func:`rlft.provenance.git_commit`), the ``score`` (mean over tasks x samples) with ``score_by_size``, ``num_tasks``,
``mode``, ``k``, ``split``, ``data`` and the ``eval_file`` path.

Lines are appended atomically: one ``os.write`` of one whole line to a file opened with ``O_APPEND`` (then fsync), so
concurrent writers never interleave within a line and a reader never sees half of one on a local file system.
``rlft eval ledger [PATH]`` prints the count and a table per model (:func:`summarize_looks`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from rlft.eval.countdown import CountdownEvalResult, eval_of_json, read_eval_json
from rlft.validation import UsageError, validate_options

LEDGER_NAME = "test_looks.jsonl"
"""The ledger's file name: ``rlft eval countdown --split test --output X`` would append to ``X``'s folder / this."""


def default_ledger_path(output: str | Path) -> Path:
    """Where the test looks of an evaluation written to ``output`` are counted: ``<output's folder>/test_looks.jsonl``."""
    return Path(output).expanduser().parent / LEDGER_NAME


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
            "data": config.get("data"), "eval_file": str(eval_path) if eval_path is not None else None,
            "rlft_commit": commit, "rlft_dirty": dirty}


def append_line(path: str | Path, record: dict) -> None:
    """Append ``record`` as one JSON line to ``path`` with a single ``os.write`` on an ``O_APPEND`` descriptor, then
    fsync (the folder is created when missing).

    Raises:
        OSError: the file cannot be opened or written, or the write was short (naming ``path``).
    """
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"{path}: wrote {written} of {len(line)} bytes of a ledger line")
        os.fsync(fd)
    finally:
        os.close(fd)


def record_test_look(eval_path_or_result: str | Path | CountdownEvalResult, config: Any = None,
                     ledger_path: str | Path | None = None, *, label: str | None = None,
                     eval_path: str | Path | None = None) -> dict:
    """Append one line for a test evaluation to ``ledger_path``; returns the line's record.

    ``eval_path_or_result``: an ``rlft eval countdown --output`` file (read with
    :func:`rlft.eval.countdown.read_eval_json`, once; its ``config`` and ``environment`` are used, ``config`` keys given
    here win) or a :class:`CountdownEvalResult` in memory (then ``config`` is needed: a dict or the command's config
    dataclass, with ``model_sha256`` added; ``eval_path`` names the file it was written to). ``ledger_path`` None:
    :func:`default_ledger_path` of the evaluation file.

    Raises:
        UsageError: the file is not an evaluation; a result without ``config``; no ledger path can be formed.
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
    record = look_record(result, config, eval_path=eval_path, label=label,
                         environment=environment if isinstance(environment, dict) else None)
    append_line(ledger_path, record)
    return record


def read_looks(ledger_path: str | Path) -> list[dict]:
    """Every line of a ledger, in order ([] when the file does not exist).

    Raises:
        UsageError: a line that is not a JSON object (naming the file and the line number), or a folder.
    """
    path = Path(ledger_path).expanduser()
    if not path.exists():
        return []
    if path.is_dir():
        raise UsageError(f"{ledger_path} is a folder, not a test-look ledger (a {LEDGER_NAME} file)")
    looks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise UsageError(f"{ledger_path}: line {number} is not JSON ({e})") from None
        if not isinstance(record, dict):
            raise UsageError(f"{ledger_path}: line {number} is not a JSON object")
        looks.append(record)
    return looks


def count_test_looks(ledger_path: str | Path, model_sha256: str | None = None) -> int:
    """How many test looks ``ledger_path`` records (0 when it does not exist); with ``model_sha256``, of those weights only."""
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


def format_looks(path: str, looks: list[dict]) -> str:
    """The count, then a table per model: SHA-256 (first 12 hex digits), looks, first and last time, scores, labels and
    model paths."""
    rows = summarize_looks(looks)
    lines = [f"{path}: {len(looks)} test look{'s' if len(looks) != 1 else ''} of {len(rows)} model{'s' if len(rows) != 1 else ''}"]
    if rows:
        lines.append(f"{'model SHA-256':<14} {'looks':>5}  {'first':<20}  {'last':<20}  {'scores':<24}  labels / model")
    for row in rows:
        sha = row["model_sha256"][:12] if row["model_sha256"] else "-"
        scores = ", ".join("-" if s is None else f"{s:.3f}" for s in row["scores"][-4:])
        scores = ("..., " if len(row["scores"]) > 4 else "") + scores
        names = ", ".join([*row["labels"], *map(str, row["models"])]) or "-"
        lines.append(f"{sha:<14} {row['looks']:>5}  {row['first'] or '-':<20}  {row['last'] or '-':<20}  {scores:<24}  {names}")
    return "\n".join(lines)


@dataclass(frozen=True)
class EvalLedgerConfig:
    """Count the test looks a ledger records (one line per test evaluation), per model."""

    path: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="[PATH]")] = LEDGER_NAME
    """The ledger file (default: test_looks.jsonl in the current folder; rlft eval countdown's is next to its --output)."""
    model_sha256: str | None = None
    """Count only the looks at these weights (the SHA-256 an evaluation's config.model_sha256 records)."""

    def __post_init__(self) -> None:
        validate_options(self)


def run_eval_ledger(cfg: EvalLedgerConfig) -> dict:
    """Print the ledger's count and its table per model; returns ``{"path", "looks", "models"}`` (the count, filtered by
    ``cfg.model_sha256`` when set, and :func:`summarize_looks`'s rows).

    Raises:
        UsageError: the ledger does not exist, is a folder, or holds a bad line (the CLI exits 2).
    """
    if not Path(cfg.path).expanduser().exists():
        raise UsageError(f"{cfg.path}: no such test-look ledger (rlft eval countdown --split test appends to one)")
    looks = [r for r in read_looks(cfg.path) if cfg.model_sha256 is None or r.get("model_sha256") == cfg.model_sha256]
    print(format_looks(cfg.path, looks))
    return {"path": cfg.path, "looks": len(looks), "models": summarize_looks(looks)}
