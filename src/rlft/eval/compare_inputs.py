"""The input files of ``rlft eval compare``, read and checked before any difference is computed: how many files make
whole models (:func:`base_group`, :func:`count_error`), one file never given twice under two paths
(:func:`check_distinct_files`), each file an evaluation whose scores are finite numbers in [0, 1] (:func:`load`), and
each model's seed files one model's (:func:`check_seed_groups`: by name with the seed taken out, and by weights)."""

from __future__ import annotations

import os
import re
import reprlib
from pathlib import Path

from rlft.eval.countdown import CountdownEvalResult, read_eval_file
from rlft.validation import OptionError, UsageError

SEED_TOKEN = re.compile(r"(^|[/_.-])(?:seed[_-]?|s)\d+(?=$|[/_.-])", re.IGNORECASE)
"""A training seed in a file or model path: ``s0``, ``seed1``, ``seed_2``, ``seed-3`` between separators (/ _ . -)."""


def count_error(count: int, seeds: int) -> str:
    """The one-line refusal of ``count`` files that :func:`base_group` cannot group, naming the counts that fit."""
    n = seeds
    per = f"{n} files a model (--seeds {n}; BASE one or {n}), " if n > 1 else ""
    fits = f" (--seeds {n} takes {2 * n}, {3 * n}, ... files, or {n + 1}, {2 * n + 1}, ... with a one-file BASE)"
    return (f"two models or more are needed, {per}as A.json B.json (B minus A): got {count} "
            f"file{'s' * (count != 1)}{fits * (n > 1)}")


def check_distinct_files(paths: list[str]) -> None:
    """Refuse one file given twice under any path: equal (device, inode), so a symlink, ``..`` or a hard link of a
    file already given counts as that file. A path that cannot be read is left to :func:`load`.

    Raises:
        OptionError: naming both paths.
    """
    seen: dict[tuple[int, int], str] = {}
    for name in paths:
        try:
            stat = os.stat(Path(name).expanduser())
        except OSError:
            continue
        key = (stat.st_dev, stat.st_ino)
        if key in seen:
            raise OptionError(f"{name} is named twice (as {seen[key]} too: the same file under another path): compare "
                              "each file once")
        seen[key] = name


def load(path: str) -> tuple[CountdownEvalResult, dict]:
    """``read_eval_file(path)``, checked: ``task_scores`` a non-empty list of non-empty rows of scores, each a finite
    number in [0, 1] (Countdown's scores are 0, 0.1 and 1; a bool is not a score); ``task_truncated`` rows of
    true/false, one per score; each of ``tasks`` a ``{"nums": [...], "target": ...}``, one per row of scores.

    Raises:
        UsageError: not an evaluation file; a per-task list of another length; a value that breaks the rules above,
            naming ``path``, the field and the task (and sample) index, e.g. ``task_scores[3][0]``.
    """
    try:
        result, config = read_eval_file(path)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: config is {reprlib.repr(config)}, not an object of the evaluation's options")
    scores = result.task_scores
    if not isinstance(scores, list) or not scores:
        raise UsageError(f"{path}: no per-task scores (task_scores) to pair")
    for i, row in enumerate(scores):
        if not isinstance(row, list) or not row:
            raise UsageError(f"{path}: task_scores[{i}] is {reprlib.repr(row)}, not a list of task {i}'s sample "
                             "scores")
        for j, x in enumerate(row):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0:  # NaN fails too
                raise UsageError(f"{path}: task_scores[{i}][{j}] (task {i}, sample {j}) is {reprlib.repr(x)}: a "
                                 "score must be a finite number in [0, 1]")
    for name in ("tasks", "task_truncated"):
        rows = getattr(result, name)
        if not isinstance(rows, list) or (rows and len(rows) != len(scores)):
            size = len(rows) if isinstance(rows, list) else repr(rows)
            raise UsageError(f"{path}: {name} lists {size} tasks, task_scores {len(scores)}")
    for i, (cut, row) in enumerate(zip(result.task_truncated, scores)):
        if not isinstance(cut, list) or len(cut) != len(row) or any(x not in (True, False) for x in cut):
            raise UsageError(f"{path}: task_truncated[{i}] is {reprlib.repr(cut)}: task {i} needs one true/false a "
                             f"sample ({len(row)} scores)")
    for i, task in enumerate(result.tasks):
        if not isinstance(task, dict) or not isinstance(task.get("nums"), list) or "target" not in task:
            raise UsageError(f"{path}: tasks[{i}] is {reprlib.repr(task)}, not a task "
                             '({"nums": [...], "target": n})')
    return result, config


def base_group(count: int, seeds: int) -> int:
    """How many of ``count`` files are BASE's when each other model has ``seeds`` files: ``seeds`` when the count is a
    multiple of it, 1 when one more (a shared start; only for ``seeds`` > 1); 0 when neither, or fewer than two
    models."""
    if seeds >= 1 and count >= 2 * seeds and count % seeds == 0:
        return seeds
    if seeds > 1 and count >= 1 + seeds and count % seeds == 1:
        return 1
    return 0


def seed_stem(path: str) -> str:
    """``path`` (normalised) with every training seed in it (:data:`SEED_TOKEN`) taken out, so that the seed files of
    one model share it: ``runs/A_s1.json`` -> ``runs/A.json``, ``grpo/seed0/model`` -> ``grpo/model``."""
    return SEED_TOKEN.sub("", os.path.normpath(path))


def check_seed_groups(paths: list[str], configs: list[dict], groups: list[list[int]]) -> None:
    """Refuse a grouping of ``paths`` into models (``groups``: each model's file indices, BASE first) that a missing
    or misplaced file has shifted. Per model, the files' :func:`seed_stem` of their path, then of their
    ``config["model"]`` (the weights evaluated; files without it are skipped): when a model's files disagree and one
    of them shares its stem with a file of another model, the files are refused. Also refused: two files of one model
    with equal ``config["model_sha256"]`` (the same weights are not two seeds; None is not compared).

    Raises:
        UsageError: naming the files, the models they were read as, and the stem or the weights' hash.
    """
    groups = [list(dict.fromkeys(g)) for g in groups]  # a one-file BASE: its one file
    names = [" + ".join(paths[i] for i in g) for g in groups]
    for group in groups:
        weights: dict[str, int] = {}
        for i in group:
            sha = configs[i].get("model_sha256")
            sha = None if sha is None else str(sha)
            if sha is not None and sha in weights:
                raise UsageError(f"{paths[weights[sha]]} and {paths[i]} record the same weights (model_sha256 "
                                 f"{sha[:16]}...): one model file is not two training seeds; give a shared "
                                 "start once, as a one-file BASE")
            weights[sha] = i
    for label, keys in (("name", list(paths)), ("model", [str(c.get("model") or "") for c in configs])):
        stems = [seed_stem(os.path.abspath(k)) if k else "" for k in keys]
        for g, group in enumerate(groups):
            if len({stems[i] for i in group if stems[i]}) < 2:
                continue  # the model's files agree (or say nothing)
            for i in group:
                other = next((h for h, o in enumerate(groups) if h != g and stems[i] in {stems[j] for j in o}), None)
                if stems[i] and other is not None:
                    role = "BASE" if other == 0 else "model"
                    raise UsageError(
                        f"{paths[i]} would be a seed of {names[g]}, whose files' {label}s differ once the seed is "
                        f"taken out, while its {label} ({keys[i]}) matches that of {role} {names[other]}: a file is "
                        "likely missing or out of order; give each model's seed files together, BASE first (one file "
                        "or one a seed)")
