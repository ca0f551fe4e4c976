"""``rlft eval compare A.json B.json [C.json ...]``: paired differences of ``rlft eval countdown --output`` files.

Sign convention: every difference is **B minus A** (the later file minus the first, BASE): positive means B scores
higher. Per task i, ``d_i = mean(B's scores on task i) - mean(A's)``; the difference is the mean of d over the tasks,
with the paired 95% interval of :func:`rlft.eval.countdown.paired_difference` (normal approximation, ``sd(d) /
sqrt(N)``). Each comparison is reported on all tasks ("mixed") and by count of numbers (3, 4), each with A's and B's
mean score, the difference and its interval, the tasks where B is better / worse / equal, and the share of answers
cut at max_new_tokens (truncated) of each file.

With more files, ``rlft eval compare BASE.json X.json Y.json ...`` compares each of X, Y, ... against BASE. The m
comparisons are one batch: beside each raw interval it reports the Holm-adjusted one (Holm 1979,
:func:`rlft.eval.stats.holm`), so that the chance of any of the m intervals missing is at most 5%. The batch is
adjusted per slice (mixed, 3 numbers, 4 numbers: m comparisons each). The adjusted interval of the comparison whose
p-value has rank i (1 = smallest) is the paired interval at error rate ``0.05 / (m - i + 1)``, held at the stopping
rank's rate once Holm's step-down stops (its levels never decrease with rank), so that it excludes 0 exactly when the
Holm-adjusted p-value is below 0.05.

With ``--seeds N``, each model is given as N consecutive files, its evaluations at N training seeds (``rlft eval
compare --seeds 2 A_s0.json A_s1.json B_s0.json B_s1.json``): per task, a model's score is the mean over its seeds
(:func:`pool_seeds`), and the difference and interval are those of these per-task seed means, so the interval covers
the tasks' variation given these runs, not the spread of a new seed. BASE may be one file (the start every seed
began from: ``--seeds 2 START.json B_s0.json B_s1.json``), which then stands for each seed. The seed files of one
model must be of the same tasks and settings (``--allow-setting`` does not apply within a model). The files are
grouped by count alone: N x models files (BASE of N), or 1 + N x models (a one-file BASE); any other count is refused,
naming the counts. A forgotten file can still leave a count that fits (``--seeds 2 A_s0 A_s1 B_s0`` reads as BASE
A_s0 and a model A_s1 + B_s0), so the grouping is checked by name (:func:`check_seed_groups`): a model whose seed
files differ in name once the seed (``s0``, ``seed1``, ``seed-2``, ...) is taken out, one of them matching a file of
another model, is refused, by file name and by the ``config.model`` the file evaluated. Two files of one model with
the same weights (equal ``config.model_sha256``) are not two seeds and are refused.

A slice with fewer tasks than :data:`MIN_SLICE_TASKS` (the mixed slice: fewer than 2) gets no interval and no
p-value ("n too small"; null in ``--json``) and stays out of the Holm batch of its slice: with so few tasks the
normal approximation says nothing (one task gave a zero-width interval with p = 0). Its means and counts are reported.

Refusals (one line, exit 2, naming the files; the input checks are :mod:`rlft.eval.compare_inputs`'s): a file that is
not an evaluation; one file given twice under any path (a symlink, ``..``, a hard link: the same device and inode); a
score that is not a finite number in [0, 1] (named by file, task and sample: ``task_scores[i][j]``); two files of
different task lists (the ``tasks`` lists themselves, nums and target in order, are compared, not only their count); a
file without a task list (an older evaluation) unless ``--allow-unrecorded-tasks``, which pairs by position; and files
whose evaluation settings differ (:data:`SETTINGS`: mode, k, temperature and top_p when both are sampled,
max_new_tokens, prompt_template, and a tool environment's max_turns and max_observation_tokens between files of that
environment) unless each differing setting is named in ``--allow-setting``: a difference is then the
model's only when everything else is held fixed. A setting a file does not record is not checked (the output says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from rlft.eval.compare_inputs import base_group, check_distinct_files, check_seed_groups, count_error, load
from rlft.eval.countdown import PAIRED_SETTINGS, CountdownEvalResult, paired_difference, size_summary
from rlft.eval.stats import ALPHA, Z_95, holm, normal_p_value, z_for_level
from rlft.options import MAX_NEW_TOKENS, MAX_NEW_TOKENS_CUDA
from rlft.validation import OptionError, UsageError, validate_options

SIGN = "B - A: the later file minus the first (BASE); positive means B scores higher"
"""The sign convention, written into every printed table and JSON."""
Setting = Literal["mode", "k", "temperature", "top_p", "stop_repeats", "max_new_tokens", "prompt_template", "max_turns",
                  "max_observation_tokens"]
TURN_SETTINGS: tuple[str, ...] = ("max_turns", "max_observation_tokens")
"""A tool environment's budgets (``--max-turns``, ``--max-observation-tokens``): checked only between two files of the
same ``env`` (a file without tools records their defaults, which bound nothing; a file with tools against one without
is a comparison of pipelines, as in the calculator study)."""
SETTINGS: tuple[str, ...] = ("mode", "k", "temperature", "top_p", "stop_repeats", *PAIRED_SETTINGS, *TURN_SETTINGS)
"""The evaluation settings that must be equal for a difference to be the model's (``--allow-setting`` accepts one):
the sampling (``stop_repeats``: the loop stop, "off" when a file does not record it: no evaluation had it before it
was recorded), :data:`rlft.eval.countdown.PAIRED_SETTINGS` (the prompt template and the token budget, which a
``--greedy-from`` baseline must share too) and :data:`TURN_SETTINGS` between files of one environment."""
SLICE_NAMES = {"all": "mixed", "3": "3 numbers", "4": "4 numbers"}
MIN_SLICE_TASKS = 10
"""The fewest tasks a count-of-numbers slice needs for an interval, p-value and Holm entry (below: "n too small", null
in --json); the mixed slice needs 2 (a standard deviation). At 1 task the interval had zero width and p = 0."""


@dataclass(frozen=True)
class EvalCompareConfig:
    """Paired difference B - A of `rlft eval countdown --output` files of the same tasks (positive: B scores higher)."""

    files: Annotated[tyro.conf.Positional[tuple[str, ...]], tyro.conf.arg(metavar="A.json B.json [C.json ...]")] = ()
    """A.json B.json: B minus A, paired task by task; A.json B.json C.json ...: each later file minus the first (BASE),
    with Holm-adjusted intervals across the batch beside the raw ones."""
    json: str | None = None
    """Write the comparison to this JSON file (an existing file is refused unless --overwrite; one of the inputs
    always)."""
    overwrite: bool = False
    """Replace an existing --json file."""
    holm: bool = True
    """With more than one comparison, report Holm-adjusted 95% intervals across the batch beside the raw
    ones (--no-holm: raw only)."""
    allow_setting: tuple[Setting, ...] = ()
    """Evaluation settings allowed to differ between the files (refused otherwise): mode, k, temperature, top_p,
    stop_repeats, max_new_tokens, prompt_template, and between files of one tool environment max_turns and
    max_observation_tokens. An allowed difference is named in the output."""
    allow_unrecorded_tasks: bool = False
    """Pair files that record no task list (older evaluations) by position, checking only their number of tasks."""
    seeds: int = 1
    """Evaluation files per model: the files are N consecutive files of each model, one per training seed (A_s0 A_s1
    B_s0 B_s1 ...), and each model's per-task score is its mean over them; BASE may be one file (a shared start). The
    count must be N x models or 1 + N x models; a model whose files' names (seed taken out) shift into another model's,
    or two files of one model with the same weights, are refused."""

    def __post_init__(self) -> None:
        validate_options(self)

    def check_outputs(self) -> None:
        """Before reading anything: a number of files :func:`base_group` can group, each an existing file, none named
        twice under any path (:func:`check_distinct_files`); a --json that may be written and is none of the inputs,
        even with --overwrite (:func:`rlft.run_folder.check_outputs`, the rule of every output).

        Raises:
            UsageError: the message names the file, or the counts (:func:`count_error`).
        """
        from rlft.run_folder import check_outputs

        if not base_group(len(self.files), self.seeds):
            raise OptionError(count_error(len(self.files), self.seeds))
        for name in self.files:
            if not Path(name).expanduser().is_file():
                raise OptionError(f"{name}: no such file (an `rlft eval countdown --output` JSON)")
        check_distinct_files(self.files)
        check_outputs({"--json": self.json}, self.files, overwrite=self.overwrite)


def check_same_tasks(a: CountdownEvalResult, b: CountdownEvalResult, name_a: str, name_b: str, *,
                     unrecorded_ok: bool = False) -> bool:
    """Refuse two evaluations of different tasks: their ``tasks`` lists (nums and target of each, in order) must be
    equal. Returns True when the lists were compared, False when a file records none and ``unrecorded_ok`` (the
    files are then paired by position, only their number of tasks checked).

    Raises:
        UsageError: different numbers of tasks; a file without a task list (unless ``unrecorded_ok``); the first task
            that differs (the message names both files, the task and how many tasks differ).
    """
    na, nb = len(a.task_scores), len(b.task_scores)
    if na != nb:
        raise UsageError(f"{name_a} has {na} tasks, {name_b} {nb}: compare evaluations of the same tasks")
    missing = [name for name, r in ((name_a, a), (name_b, b)) if not r.tasks]
    if missing:
        if unrecorded_ok:
            return False
        raise UsageError(f"{' and '.join(missing)} record{'s' if len(missing) == 1 else ''} no task list (an older "
                         f"evaluation), so {name_a} and {name_b} cannot be checked to be of the same tasks; evaluate "
                         "again, or pass --allow-unrecorded-tasks to pair them by position")
    key = [(list(t["nums"]), t["target"]) for t in a.tasks], [(list(t["nums"]), t["target"]) for t in b.tasks]
    differ = [i for i, (x, y) in enumerate(zip(*key)) if x != y]
    if differ:
        i = differ[0]
        raise UsageError(
            f"{name_a} and {name_b} are evaluations of different tasks ({len(differ)} of {na} differ; task "
            f"{i} is nums {key[0][i][0]} target {key[0][i][1]} in {name_a}, nums {key[1][i][0]} target "
            f"{key[1][i][1]} in {name_b}): compare evaluations of the same tasks in the same order")
    return True


def pool_seeds(runs: list[tuple[CountdownEvalResult, dict]], names: list[str], *,
               unrecorded_ok: bool = False) -> tuple[CountdownEvalResult, dict]:
    """One model's evaluations at N training seeds, ``runs`` (:func:`load` of each of ``names``), as one: per task, the
    samples of each seed in turn (k = N x each file's k), so a task's mean score is the mean of its seeds' means. The
    scores and cut flags are pooled, the rates recomputed from them; the other per-task lists are not carried. Returns
    ``(result, the first file's config)``; one run is returned as it is.

    Raises:
        UsageError: a seed file of other tasks than the first (:func:`check_same_tasks`, with ``unrecorded_ok``) or
            of other settings, k included (:func:`check_settings`, nothing allowed to differ).
    """
    if len(runs) == 1:
        return runs[0]
    first = runs[0][0]
    for run, name in zip(runs[1:], names[1:]):
        check_same_tasks(first, run[0], names[0], name, unrecorded_ok=unrecorded_ok)
        check_settings(runs[0], run, names[0], name)
    results = [r for r, _ in runs]

    def joined(rows: list[list[list]]) -> list[list]:
        return [[x for row in per_task for x in row] for per_task in zip(*rows)]

    scores = joined([r.task_scores for r in results])
    cut = joined([r.task_truncated for r in results]) if all(r.task_truncated for r in results) else []
    flat, flat_cut = [x for row in scores for x in row], [x for row in cut for x in row]
    pooled = CountdownEvalResult(
        num_tasks=len(scores), k=len(scores[0]), mode=first.mode, mean_score=sum(flat) / len(flat),
        accuracy=sum(x == 1.0 for x in flat) / len(flat), format_rate=sum(x >= 0.1 for x in flat) / len(flat),
        pass_at_k={}, mean_completion_tokens=float("nan"),
        truncated_rate=sum(flat_cut) / len(flat_cut) if flat_cut else float("nan"),
        task_scores=scores, tasks=first.tasks, task_truncated=cut)
    return pooled, runs[0][1]


def resolved_max_new_tokens(result: CountdownEvalResult, config: dict) -> int | None:
    """The token budget an evaluation ran with: ``config.max_new_tokens``; when unset there, the length of a truncated
    sample (it stopped at the budget), else the command's device default (256 on ``--device cpu``, 1024 on
    ``cuda``); None when none of these says."""
    if config.get("max_new_tokens") is not None:
        return config["max_new_tokens"]
    for cut_row, tokens_row in zip(result.task_truncated, result.task_tokens):
        for cut, tokens in zip(cut_row, tokens_row):
            if cut:
                return tokens
    device = str(config.get("device", ""))
    return MAX_NEW_TOKENS if device == "cpu" else MAX_NEW_TOKENS_CUDA if device.startswith("cuda") else None


def settings(result: CountdownEvalResult, config: dict) -> dict:
    """The file's values of :data:`SETTINGS` (None: not recorded; temperature and top_p only in sampled mode)."""
    sampled = result.mode == "sampled"
    return {"mode": result.mode, "k": result.k, "temperature": config.get("temperature") if sampled else None,
            "top_p": config.get("top_p") if sampled else None, "stop_repeats": config.get("stop_repeats") or "off",
            "max_new_tokens": resolved_max_new_tokens(result, config),
            "prompt_template": config.get("prompt_template"), "env": config.get("env"),
            **{name: config.get(name) for name in TURN_SETTINGS}}


def check_settings(a: tuple[CountdownEvalResult, dict], b: tuple[CountdownEvalResult, dict], name_a: str, name_b: str,
                   allowed: tuple[str, ...] = ()) -> list[str]:
    """Refuse evaluations whose :func:`settings` differ, but for the names in ``allowed``; returns notes (allowed
    differences, settings a file does not record).

    Raises:
        UsageError: naming the setting, both files and both values.
    """
    sa, sb = settings(*a), settings(*b)
    notes = []
    for name in SETTINGS:
        x, y = sa[name], sb[name]
        if name in TURN_SETTINGS and (sa["env"] is None or sa["env"] != sb["env"]):
            continue  # TURN_SETTINGS: only between files of one tool environment
        if x is None or y is None:
            if name in PAIRED_SETTINGS or sa["mode"] == sb["mode"] == "sampled":  # greedy has no temperature
                unknown = [n for n, v in ((name_a, x), (name_b, y)) if v is None]
                notes.append(f"{name} not recorded in {' and '.join(unknown)}: not checked")
            continue
        if x == y:
            continue
        if name not in allowed:
            raise UsageError(
                f"{name_a} and {name_b} were evaluated with different {name} ({x!r} and {y!r}): the "
                f"difference would not be the model's alone; pass --allow-setting {name} to compare anyway")
        notes.append(f"{name} differs (allowed): {x!r} in {name_a}, {y!r} in {name_b}")
    return notes


def check_comparable(files: dict[str, tuple[CountdownEvalResult, dict]], allowed: tuple[str, ...] = ()) -> list[str]:
    """Refuse a set of evaluations (label -> ``(result, config)``, as :func:`rlft.eval.countdown.read_eval_file`
    gives) unless each scored the first one's tasks in the same order (:func:`check_same_tasks`) with its settings
    but for the names in ``allowed`` (:func:`check_settings`); the study scripts' check before they pair files.
    Returns the notes (allowed differences, settings a file does not record).

    Raises:
        UsageError: naming the two labels (see :func:`check_same_tasks`, :func:`check_settings`).
    """
    (first_name, first), *rest = files.items()
    notes = []
    for name, other in rest:
        check_same_tasks(first[0], other[0], first_name, name)
        notes += check_settings(first, other, first_name, name, allowed)
    return notes


def slice_rows(a: CountdownEvalResult, b: CountdownEvalResult) -> dict[str, list[int]]:
    """Task indices of each slice of a comparison: ``"all"``, then per count of numbers (``"3"``, ``"4"``, ...) of A's
    tasks when both files record their tasks (else ``"all"`` only)."""
    sizes: dict[str, list[int]] = {}
    for i, task in enumerate(a.tasks if b.tasks else []):
        sizes.setdefault(str(len(task["nums"])), []).append(i)
    return {"all": list(range(len(a.task_scores))), **dict(sorted(sizes.items(), key=lambda kv: int(kv[0])))}


def _finite(x: float) -> float | None:
    return None if x is None or math.isnan(x) else x


def min_tasks(name: str) -> int:
    """The fewest tasks slice ``name`` needs for an interval: 2 for the mixed slice (``"all"``; a standard deviation),
    :data:`MIN_SLICE_TASKS` for a count of numbers."""
    return 2 if name == "all" else MIN_SLICE_TASKS


def compare_results(a: CountdownEvalResult, b: CountdownEvalResult, *, z: float = Z_95,
                    sized: bool = False) -> dict[str, dict]:
    """B minus A on each slice of :func:`slice_rows` (the caller has checked the tasks): ``{slice: {n, mean_a, mean_b,
    diff, ci_low, ci_high, p, better, worse, equal, cut_a, cut_b}}``. ``diff``/``ci_*``/``better``/``worse`` are
    :func:`rlft.eval.countdown.paired_difference` of B's and A's task scores (B better: d_i > 0); ``equal`` the
    tasks with d_i == 0; ``mean_*`` and ``cut_*`` (share of samples truncated; None when not recorded) are
    :func:`rlft.eval.countdown.size_summary`'s; ``p`` the two-sided p-value of d = 0
    (:func:`rlft.eval.stats.normal_p_value`). With ``sized`` (``rlft eval compare``), ``ci_low``, ``ci_high`` and
    ``p`` are None in a slice of fewer tasks than :func:`min_tasks` ("n too small"); without, every slice gets them
    (the study scripts' tables)."""
    sums = size_summary(a), size_summary(b)
    out = {}
    for name, rows in slice_rows(a, b).items():
        d = paired_difference([b.task_scores[i] for i in rows], [a.task_scores[i] for i in rows], z=z)
        if sized and d["n"] < min_tasks(name):
            d["ci_low"] = d["ci_high"] = None
        p = None if d["ci_high"] is None else normal_p_value(d["diff"], d["ci_high"] - d["diff"], z)
        out[name] = {
            "n": d["n"], "mean_a": sums[0][name]["score"], "mean_b": sums[1][name]["score"], "diff": d["diff"],
            "ci_low": d["ci_low"], "ci_high": d["ci_high"], "p": p, "better": d["better"], "worse": d["worse"],
            "equal": d["n"] - d["better"] - d["worse"], "cut_a": _finite(sums[0][name]["truncated_rate"]),
            "cut_b": _finite(sums[1][name]["truncated_rate"])
        }
    return out


def add_holm(pairs: list[tuple[CountdownEvalResult, CountdownEvalResult]], comparisons: list[dict[str, dict]],
             alpha: float = ALPHA) -> None:
    """Add ``holm`` (``{rank, level, p_adjusted, rejected, ci_low, ci_high}``) to every slice of ``comparisons`` (the
    :func:`compare_results` of each ``(A, B)`` in ``pairs``): per slice name, the comparisons that have it with a
    p-value form one batch (:func:`rlft.eval.stats.holm`); the adjusted interval is the paired interval at the Holm
    level's quantile. A slice without a p-value (too few tasks) gets ``holm`` None and is not counted in m."""
    for name in dict.fromkeys(s for c in comparisons for s in c):
        batch = [j for j, c in enumerate(comparisons) if name in c and c[name]["p"] is not None]
        for c in comparisons:
            if name in c and c[name]["p"] is None:
                c[name]["holm"] = None
        for j, h in zip(batch, holm([comparisons[j][name]["p"] for j in batch], alpha) if batch else []):
            a, b = pairs[j]
            rows = slice_rows(a, b)[name]
            d = paired_difference([b.task_scores[i] for i in rows], [a.task_scores[i] for i in rows],
                                  z=z_for_level(h["level"]))
            comparisons[j][name]["holm"] = {**h, "ci_low": d["ci_low"], "ci_high": d["ci_high"]}


def compare_files(paths: list[str], *, allow_setting: tuple[str, ...] = (), holm_adjust: bool = True,
                  unrecorded_tasks: bool = False, seeds: int = 1) -> dict:
    """Each model minus the first (the BASE): ``{"convention", "alpha", "base", "seeds", "holm" (m when the intervals
    are Holm-adjusted, else None), "comparisons": [{"a", "b", "tasks_checked", "notes", "slices"}]}`` (``slices``:
    :func:`compare_results`, with ``holm`` when adjusted). A model is one file, or with ``seeds`` N its N consecutive
    files pooled by :func:`pool_seeds` (named ``"a_s0.json + a_s1.json"``); BASE may then be one file
    (:func:`base_group`), pooled as N copies of itself (the same per-task means). Every file is read and checked
    before any difference is computed.

    Raises:
        UsageError: a number of files that is not BASE's one or ``seeds`` plus whole models of ``seeds``
            (:func:`count_error`); one file given twice (:func:`check_distinct_files`); a file is not an evaluation
            or holds a bad score (:func:`load`); a grouping a missing file shifted, or one model's weights as two seeds
            (:func:`check_seed_groups`); a model's seed files differ (:func:`pool_seeds`); or a model is of other tasks
            or settings than BASE (:func:`check_same_tasks`, :func:`check_settings`).
    """
    first = base_group(len(paths), seeds)
    if not first:
        raise UsageError(count_error(len(paths), seeds))
    check_distinct_files(paths)
    runs = [load(p) for p in paths]
    groups = [[0] * seeds if first == 1 else list(range(seeds))]  # a one-file BASE stands for each seed
    groups += [list(range(i, i + seeds)) for i in range(first, len(paths), seeds)]
    check_seed_groups(paths, [config for _, config in runs], groups)
    loaded = [pool_seeds([runs[i] for i in g], [paths[i] for i in g], unrecorded_ok=unrecorded_tasks) for g in groups]
    names = [" + ".join(paths[i] for i in dict.fromkeys(g)) for g in groups]  # a model's name: its files
    out = {"convention": SIGN, "alpha": ALPHA, "base": names[0], "seeds": seeds, "holm": None, "comparisons": []}
    for name, other in zip(names[1:], loaded[1:]):
        checked = check_same_tasks(loaded[0][0], other[0], names[0], name, unrecorded_ok=unrecorded_tasks)
        notes = check_settings(loaded[0], other, names[0], name, allow_setting)
        if not checked:
            notes.append("no task list recorded: paired by position")
        out["comparisons"].append({"a": names[0], "b": name, "tasks_checked": checked, "notes": notes})
    pairs = [(loaded[0][0], other[0]) for other in loaded[1:]]
    slices = [compare_results(a, b, sized=True) for a, b in pairs]
    if holm_adjust and len(pairs) > 1:
        add_holm(pairs, slices)
        out["holm"] = len(pairs)
    for comparison, s in zip(out["comparisons"], slices):
        comparison["slices"] = s
    return out


def _ci(low: float | None, high: float | None) -> str:
    return "n too small" if low is None or high is None else f"[{low:+.3f}, {high:+.3f}]"


def format_comparison(report: dict) -> str:
    """The report as plain text: the sign convention, then per comparison a row per slice (tasks, mean A, mean B,
    B - A with its 95% interval, the Holm-adjusted interval and p-value when the report has them, better/worse/equal,
    the cut shares) and its notes; "n too small" instead of the intervals of a slice of too few tasks."""
    m, seeds = report["holm"], report.get("seeds", 1)
    lines = [f"paired difference {SIGN}; 95% intervals" +
             (f", Holm-adjusted across the batch of {m} comparisons beside the raw ones" if m else "")
             + (f"; a model's score on a task is its mean over its {seeds} seed files" if seeds > 1 else "")]
    header = (f"{'tasks':<10} {'n':>5} {'mean A':>7} {'mean B':>7} {'B - A':>7}  {'95% CI':<18}" +
              (f" {'Holm 95% CI':<18} {'Holm p':>7}" if m else "") +
              f" {'better/worse/equal':>18} {'cut A':>6} {'cut B':>6}")
    for c in report["comparisons"]:
        lines += ["", f"B = {c['b']}", f"A = {c['a']}", header]
        for name, s in c["slices"].items():
            h = s.get("holm") or {"ci_low": None, "ci_high": None}
            p_adjusted = f"{h['p_adjusted']:>7.3g}" if "p_adjusted" in h else f"{'-':>7}"
            holm_cells = f" {_ci(h['ci_low'], h['ci_high']):<18} {p_adjusted}" if m else ""
            cut = " ".join(f"{'-' if x is None else f'{x:.3f}':>6}" for x in (s["cut_a"], s["cut_b"]))
            counts = f"{s['better']}/{s['worse']}/{s['equal']}"
            lines.append(
                f"{SLICE_NAMES.get(name, f'{name} numbers'):<10} {s['n']:>5} {s['mean_a']:>7.3f} {s['mean_b']:>7.3f} "
                f"{s['diff']:>+7.3f}  {_ci(s['ci_low'], s['ci_high']):<18}{holm_cells} {counts:>18} {cut}")
        lines += [f"note: {note}" for note in c["notes"]]
    return "\n".join(lines)


def run_eval_compare(cfg: EvalCompareConfig) -> dict:
    """Compare ``cfg.files`` (:func:`compare_files`), print the tables and write ``cfg.json`` if set; returns the
    report.

    Raises:
        UsageError: what :meth:`EvalCompareConfig.check_outputs` and :func:`compare_files` refuse (the CLI exits 2).
    """
    from rlft.fsio import atomic_write_json

    cfg.check_outputs()
    report = compare_files(list(cfg.files), allow_setting=cfg.allow_setting, holm_adjust=cfg.holm,
                           unrecorded_tasks=cfg.allow_unrecorded_tasks, seeds=cfg.seeds)
    print(format_comparison(report))
    if cfg.json is not None:
        path = Path(cfg.json).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, report)
    return report
