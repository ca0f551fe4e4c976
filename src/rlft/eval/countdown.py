"""Countdown evaluation: sample completions for held-out tasks, score them, report accuracy and pass@k.

Scores come from :func:`rlft.rewards.countdown.score_completions` (the TinyZero-exact scorer on
``prompt + completion``): 1.0 correct, 0.1 an answer that is wrong, 0.0 no answer.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from rlft.eval.passk import mean_pass_at_k
from rlft.eval.stats import Z_95
from rlft.rewards.countdown import answer_value, score_completions
from rlft.rollout.base import GenerationEngine, SamplingParams
from rlft.rollout.turns import ToolUse
from rlft.types import CountdownTask

PROMPT_TAIL_CHARS = 200


@dataclass
class CountdownEvalResult:
    """Metrics of one evaluation; every rate is over all tasks x samples unless said otherwise."""

    num_tasks: int
    k: int
    """Samples per task."""
    mode: str
    """"greedy" (temperature 0) or "sampled"."""
    mean_score: float
    """Mean score (0 / 0.1 / 1) over all tasks x samples."""
    accuracy: float
    """Fraction of samples scoring 1.0."""
    format_rate: float
    """Fraction of samples scoring >= 0.1 (an answer tag on the last line)."""
    pass_at_k: dict[int, float]
    """Sampled: unbiased pass@j for j in the powers of 2 below k, and k; greedy: {1: accuracy}."""
    mean_completion_tokens: float
    truncated_rate: float
    """Fraction of samples that hit max_new_tokens (finish_reason "length"), the looped ones included."""
    looped_rate: float = 0.0
    """Fraction of samples the loop stop (``SamplingParams.stop_repeats``) ended after a repeated line; they are
    counted as truncated too (no EOS, no answer). 0.0 without the stop, or in a file written before it existed."""
    examples: list[dict] = field(default_factory=list)
    """The first few tasks: prompt_tail, completion (first sample), score, target, nums."""
    task_scores: list[list[float]] = field(default_factory=list)
    """Per task, in task order, the scores of its k samples: shape (num_tasks, k). Paired comparisons
    of two models on the same tasks read it (:func:`paired_difference`)."""
    tasks: list[dict] = field(default_factory=list)
    """Per task, in task order: ``{"nums": [...], "target": n}`` (so an archived evaluation names its tasks)."""
    task_truncated: list[list[bool]] = field(default_factory=list)
    """(num_tasks, k): True where the sample hit max_new_tokens without EOS."""
    task_looped: list[list[bool]] = field(default_factory=list)
    """(num_tasks, k): True where the loop stop ended the sample (then ``task_truncated`` is True too); empty in a
    file written before the stop existed."""
    task_tokens: list[list[int]] = field(default_factory=list)
    """(num_tasks, k): generated tokens of each sample (the cost of test-time selection)."""
    task_values: list[list[float | None]] = field(default_factory=list)
    """(num_tasks, k): the value of each sample's answer expression (:func:`rlft.rewards.countdown.answer_value`),
    None where there is no answer or it does not parse (majority voting reads it)."""
    task_certainty: list[list[float | None]] = field(default_factory=list)
    """(num_tasks, k): each sample's self-certainty (mean KL(U || p) over its tokens, Kang et al. 2025) when the
    engine reports it, else None."""
    task_rm_scores: list[list[float]] = field(default_factory=list)
    """(num_tasks, k): each sample's reward-model score (``rlft eval countdown --select-reward-model``; the input
    layout is :data:`rlft.eval.best_of_n.RM_INPUT`), so the reward-model selection can be recomputed from the file;
    empty when no reward model scored the samples."""
    selection: dict = field(default_factory=dict)
    """Best-of-N curves against a greedy baseline (``rlft eval countdown --select``; :mod:`rlft.eval.best_of_n`):
    ``greedy``, ``sizes``, ``rows`` (one per selector@n), ``skipped``, ``reward_model``, ``reward_model_input``; empty
    without --select."""
    task_tool_calls: list[list[int]] = field(default_factory=list)
    """(num_tasks, k): complete tool calls of each sample (``--env countdown-calc``); empty without tools."""
    task_tool_errors: list[list[int]] = field(default_factory=list)
    """(num_tasks, k): of those, the calls answered with an error; empty without tools."""
    task_completions: list[list[str]] = field(default_factory=list)
    """(num_tasks, k): each sample's text (``rlft eval countdown --keep-completions``); empty otherwise."""
    tool_calls_per_answer: float = 0.0
    """Mean tool calls per sample (0.0 without tools)."""
    tool_errors_per_answer: float = 0.0
    """Mean tool calls answered with an error per sample."""
    by_size: dict[str, dict] = field(default_factory=dict)
    """Per count of numbers (``"3"``, ``"4"``) and ``"all"``: ``n`` tasks, ``score``, ``accuracy``, ``format_rate``,
    ``truncated_rate`` over that subset's samples (:func:`size_summary`)."""

    def to_dict(self) -> dict:
        """A JSON-ready dict (``json.dump`` turns the pass_at_k keys into strings; see :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CountdownEvalResult":
        """Inverse of :meth:`to_dict`, also after a JSON round trip; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        kwargs = {key: value for key, value in data.items() if key in known}
        kwargs["pass_at_k"] = {int(j): float(v) for j, v in data["pass_at_k"].items()}
        return cls(**kwargs)


def read_eval_json(path: str | Path) -> dict:
    """The JSON object of an ``rlft eval countdown --output`` file, plain or gzip-compressed (a name ending ``.gz``,
    as the archived evaluations under ``docs/results/*/data/`` are stored).

    Raises:
        ValueError: naming ``path``: it does not exist, cannot be read or decompressed, or is not a JSON object.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"{path} does not exist (an `rlft eval countdown --output` file)")
    try:
        raw = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, EOFError) as e:  # gzip.BadGzipFile is an OSError; JSONDecodeError a ValueError
        raise ValueError(f"{path}: not an `rlft eval countdown` JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not an `rlft eval countdown` JSON (a {type(data).__name__}, not an object)")
    return data


def read_eval_file(path: str | Path) -> tuple[CountdownEvalResult, dict]:
    """An ``rlft eval countdown --output`` file, plain or ``.gz`` (:func:`read_eval_json`): ``(result, config)``
    (``config`` is ``{}`` when the file has none).

    Raises:
        ValueError: naming ``path``: it does not exist, cannot be read, or is not an evaluation's JSON.
    """
    return eval_of_json(read_eval_json(path), path)


def eval_of_json(data: dict, path: str | Path) -> tuple[CountdownEvalResult, dict]:
    """``(result, config)`` of an evaluation file's JSON object already read (:func:`read_eval_json`), for a caller
    that also needs its other keys; ``path`` only names the file in the error.

    Raises:
        ValueError: naming ``path``: the object is not an evaluation's JSON.
    """
    try:
        return CountdownEvalResult.from_dict(data), data.get("config") or {}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not an `rlft eval countdown` JSON ({type(e).__name__}: {e})") from None


def other_weights(recorded: str | None, expected: str | None) -> bool:
    """True when two evaluations' weights SHA-256s (``config.model_sha256``) are both known and differ; a file
    written before weights were recorded (None) is not checked."""
    return recorded is not None and expected is not None and recorded != expected


PAIRED_SETTINGS = ("prompt_template", "max_new_tokens")
"""The ``config`` fields two evaluations paired task by task must share (besides tasks and weights): the prompt the
model saw and the token budget its answers were cut at."""


def other_settings(config_a: dict, config_b: dict) -> dict[str, tuple]:
    """``{field: (a's value, b's value)}`` of the :data:`PAIRED_SETTINGS` whose values two evaluations' ``config``s
    both record and that differ (empty: nothing to refuse); a field a file does not record (written before it was, or
    archived) is not checked, as in :func:`other_weights`."""
    out = {}
    for key in PAIRED_SETTINGS:
        a, b = config_a.get(key), config_b.get(key)
        if a is not None and b is not None and a != b:
            out[key] = (a, b)
    return out


def pass_at_k_sizes(k: int) -> list[int]:
    """1, 2, 4, ... up to k, and k itself: ``pass_at_k_sizes(6) == [1, 2, 4, 6]``."""
    sizes = {k}
    j = 1
    while j < k:
        sizes.add(j)
        j *= 2
    return sorted(sizes)


def evaluate_countdown(
    engine: GenerationEngine,
    tasks: list[CountdownTask],
    prompts: list[str],
    params: SamplingParams,
    *,
    num_examples: int = 3,
    tool_use: ToolUse | None = None,
    keep_completions: bool = False,
) -> CountdownEvalResult:
    """Generate ``params.k`` completions for each of the B prompts and score them against ``tasks``.

    ``prompts[b]`` is the rendered prompt of ``tasks[b]``. Greedy mode is ``params.temperature == 0``. ``tool_use``:
    rollouts with tool calls (the calculator of ``--env countdown-calc``; each task's ground truth is its tools'
    context); the score is the same rule on the final answer, and the tool calls and errors of each sample are kept.
    ``keep_completions``: the result holds every sample's text (``task_completions``).

    Raises:
        ValueError: no tasks, ``len(tasks) != len(prompts)``, or an engine result of the wrong shape.
    """
    if not tasks:
        raise ValueError("no tasks to evaluate")
    if len(tasks) != len(prompts):
        raise ValueError(f"{len(tasks)} tasks but {len(prompts)} prompts")
    if tool_use is None:
        samples = engine.generate(prompts, params)
    else:
        samples = engine.generate(prompts, params, tool_use=tool_use, contexts=[t.ground_truth() for t in tasks])
    if len(samples) != len(prompts) or any(len(s) != params.k for s in samples):
        raise ValueError(f"the engine must return {len(prompts)} lists of {params.k} samples")

    scores = [  # scores[b][j]
        score_completions([prompt] * params.k, [s.text for s in row], [task.ground_truth()] * params.k)
        for task, prompt, row in zip(tasks, prompts, samples)
    ]
    examples = [
        {
            "prompt_tail": prompt[-PROMPT_TAIL_CHARS:],
            "completion": row[0].text,
            "score": row_scores[0],
            "target": task.target,
            "nums": list(task.nums),
        }
        for task, prompt, row, row_scores in list(zip(tasks, prompts, samples, scores))[:num_examples]
    ]
    result = summarize(
        "greedy" if params.temperature == 0.0 else "sampled",
        task_scores=scores,
        tasks=[{"nums": list(task.nums), "target": task.target} for task in tasks],
        task_truncated=[[s.finish_reason == "length" for s in row] for row in samples],
        task_tokens=[[len(s.completion_ids) for s in row] for row in samples],
        task_values=[[answer_value(prompt, s.text) for s in row] for prompt, row in zip(prompts, samples)],
        task_certainty=[[s.self_certainty for s in row] for row in samples],
        examples=examples,
        task_looped=[[s.looped for s in row] for row in samples],
    )
    if keep_completions:
        result.task_completions = [[s.text for s in row] for row in samples]
    if tool_use is not None:
        result.task_tool_calls = [[s.tool_calls for s in row] for row in samples]
        result.task_tool_errors = [[s.tool_errors for s in row] for row in samples]
        count = len(tasks) * params.k
        result.tool_calls_per_answer = sum(map(sum, result.task_tool_calls)) / count
        result.tool_errors_per_answer = sum(map(sum, result.task_tool_errors)) / count
        result.by_size = size_summary(result)
    return result


def summarize(mode: str, *, task_scores: list[list[float]], tasks: list[dict], task_truncated: list[list[bool]],
              task_tokens: list[list[int]], task_values: list[list[float | None]],
              task_certainty: list[list[float | None]], examples: list[dict] | None = None,
              task_rm_scores: list[list[float]] | None = None,
              task_looped: list[list[bool]] | None = None) -> CountdownEvalResult:
    """A :class:`CountdownEvalResult` from its per-task lists, each of shape (num_tasks, k): the rates are means
    over all tasks x samples; pass@j (sampled: j in :func:`pass_at_k_sizes`, unbiased estimator; greedy: {1:
    accuracy}); ``by_size`` (:func:`size_summary`). ``mode``: ``"greedy"`` or ``"sampled"``.

    Raises:
        ValueError: no tasks, or a task whose lists do not all hold the same k samples.
    """
    if not task_scores:
        raise ValueError("no tasks to summarize")
    k, n = len(task_scores[0]), len(task_scores)
    if len(tasks) != n:
        raise ValueError(f"tasks: every per-task list needs {n} tasks (task_scores' length), got {len(tasks)} tasks")
    per_task = {"task_scores": task_scores, "task_truncated": task_truncated, "task_tokens": task_tokens,
                "task_values": task_values, "task_certainty": task_certainty,
                **({"task_rm_scores": task_rm_scores} if task_rm_scores else {}),
                **({"task_looped": task_looped} if task_looped else {})}
    for name, rows in per_task.items():
        if k == 0 or len(rows) != n or any(len(row) != k for row in rows):
            raise ValueError(f"{name}: every per-task list needs {n} tasks of {k} samples each (task_scores' shape), "
                             f"got {len(rows)} tasks" +
                             (f" of {sorted({len(row) for row in rows})} samples" if rows else ""))
    flat = [x for row in task_scores for x in row]
    accuracy = sum(x == 1.0 for x in flat) / len(flat)
    if mode == "greedy":
        pass_at = {1: accuracy}
    else:
        correct = [sum(x == 1.0 for x in row) for row in task_scores]
        pass_at = {j: mean_pass_at_k(k, correct, j) for j in pass_at_k_sizes(k)}
    result = CountdownEvalResult(
        num_tasks=len(task_scores),
        k=k,
        mode=mode,
        mean_score=sum(flat) / len(flat),
        accuracy=accuracy,
        format_rate=sum(x >= 0.1 for x in flat) / len(flat),
        pass_at_k=pass_at,
        mean_completion_tokens=sum(x for row in task_tokens for x in row) / len(flat),
        truncated_rate=sum(x for row in task_truncated for x in row) / len(flat),
        looped_rate=sum(x for row in task_looped for x in row) / len(flat) if task_looped else 0.0,
        examples=examples or [],
        task_scores=task_scores,
        tasks=tasks,
        task_truncated=task_truncated,
        task_tokens=task_tokens,
        task_values=task_values,
        task_certainty=task_certainty,
        task_rm_scores=task_rm_scores or [],
        task_looped=task_looped or [],
    )
    result.by_size = size_summary(result)
    return result


def size_summary(result: CountdownEvalResult) -> dict[str, dict]:
    """Metrics per count of numbers (``"3"``, ``"4"``, ...) and over all tasks (``"all"``): ``n`` (tasks),
    ``score`` (mean over the subset's samples), ``accuracy`` (score 1.0), ``format_rate`` (score >= 0.1),
    ``truncated_rate`` (hit max_new_tokens). Reads ``tasks``, ``task_scores`` and ``task_truncated``; a result
    without ``tasks`` (an older file) gets ``"all"`` only."""
    groups: dict[str, list[int]] = {}
    for i, task in enumerate(result.tasks):
        groups.setdefault(str(len(task["nums"])), []).append(i)
    groups = dict(sorted(groups.items(), key=lambda kv: int(kv[0])))
    groups["all"] = list(range(len(result.task_scores)))
    out = {}
    for name, rows in groups.items():
        scores = [x for i in rows for x in result.task_scores[i]]
        cut = [x for i in rows for x in result.task_truncated[i]] if result.task_truncated else []
        out[name] = {
            "n": len(rows), "score": sum(scores) / len(scores), "accuracy": sum(x == 1.0 for x in scores) / len(scores),
            "format_rate": sum(x >= 0.1 for x in scores) / len(scores),
            "truncated_rate": sum(cut) / len(cut) if cut else float("nan")
        }
        if result.task_tool_calls:
            answers = len(rows) * result.k
            out[name]["tool_calls"] = sum(x for i in rows for x in result.task_tool_calls[i]) / answers
            out[name]["tool_errors"] = sum(x for i in rows for x in result.task_tool_errors[i]) / answers
    return out


def subset(result: CountdownEvalResult, size: int | None) -> list[list[float]]:
    """``task_scores`` of the tasks with ``size`` numbers (None: every task), in task order."""
    if size is None:
        return result.task_scores
    return [row for task, row in zip(result.tasks, result.task_scores) if len(task["nums"]) == size]


def paired_difference(a: list[list[float]], b: list[list[float]], *, z: float = Z_95) -> dict:
    """Mean score of model A minus model B on the same N tasks, with a paired 95% confidence interval.

    ``a`` and ``b`` are :attr:`CountdownEvalResult.task_scores` of the two models, shape (N, k_a) and
    (N, k_b), rows in the same task order. Per task i, ``d_i = mean(a[i]) - mean(b[i])``; returns
    ``{"n", "diff", "ci_low", "ci_high", "better", "worse"}``: ``diff`` = mean of d (equals
    A's mean score minus B's when k is constant), the CI is ``diff +- z * sd(d) / sqrt(N)`` (normal
    approximation with the sample standard deviation, ddof 1; zero width when N == 1), ``better`` /
    ``worse`` count tasks with ``d_i > 0`` / ``d_i < 0``. Pairing removes the between-task variance,
    so the interval is much narrower than the two unpaired ones would suggest.

    Raises:
        ValueError: no tasks, a different number of tasks, or a task with no scores.
    """
    if not a or len(a) != len(b):
        raise ValueError(f"paired comparison needs the same non-zero number of tasks, got {len(a)} and {len(b)}")
    if any(not row for row in (*a, *b)):
        raise ValueError("every task needs at least one score")
    d = [sum(x) / len(x) - sum(y) / len(y) for x, y in zip(a, b)]
    n = len(d)
    diff = sum(d) / n
    sd = math.sqrt(sum((x - diff) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    half = z * sd / math.sqrt(n)
    return {"n": n, "diff": diff, "ci_low": diff - half, "ci_high": diff + half,
            "better": sum(x > 0 for x in d), "worse": sum(x < 0 for x in d)}


def mean_interval(task_scores: list[list[float]], *, z: float = Z_95) -> tuple[float, float]:
    """``(mean, half-width of its 95% interval)`` of one model's score over N tasks (``task_scores``: shape (N, k), the
    per-task means averaged), unpaired: :func:`paired_difference` against a score of 0 on every task. Raises
    ValueError as it does."""
    d = paired_difference(task_scores, [[0.0]] * len(task_scores), z=z)
    return d["diff"], d["ci_high"] - d["diff"]


def print_result(result: CountdownEvalResult, title: str = "Countdown eval") -> None:
    """Print the metrics as a rich table, then the per-size table when the tasks have several sizes."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("tasks x samples", f"{result.num_tasks} x {result.k} ({result.mode})"),
        ("mean score", f"{result.mean_score:.4f}"),
        ("accuracy", f"{result.accuracy:.4f}"),
        ("format rate", f"{result.format_rate:.4f}"),
        *((f"pass@{j}", f"{v:.4f}") for j, v in result.pass_at_k.items()),
        ("mean completion tokens", f"{result.mean_completion_tokens:.1f}"),
        *([("tool calls / errors per answer", f"{result.tool_calls_per_answer:.2f} / "
            f"{result.tool_errors_per_answer:.2f}")] if result.task_tool_calls else []),
        ("truncated rate", f"{result.truncated_rate:.4f}"),
        *((("looped rate", f"{result.looped_rate:.4f}"),) if result.task_looped else ()),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
    if len(result.by_size) > 2:  # sizes and "all"
        sizes = Table(title="by count of numbers")
        for column in ("numbers", "tasks", "score", "accuracy", "format rate", "truncated rate"):
            sizes.add_column(column, justify="right")
        for name, m in result.by_size.items():
            sizes.add_row(name, str(m["n"]), f"{m['score']:.4f}", f"{m['accuracy']:.4f}", f"{m['format_rate']:.4f}",
                          f"{m['truncated_rate']:.4f}")
        Console().print(sizes)


def merge_samples(results: list[CountdownEvalResult]) -> CountdownEvalResult:
    """One sampled evaluation with every sample of ``results``: per task, the samples of ``results[0]``, then
    ``results[1]``'s, ... (k = the sum of their k), and every rate recomputed (:func:`summarize`). For best-of-N
    curves past the k one run can afford: evaluations of the same model on the same tasks at different seeds are
    independent samples. Which model, temperature and seed each file used is the caller's check (their ``config``).

    Raises:
        ValueError: fewer than two results, a greedy one, different tasks (nums and target, in order), or reward-model
            scores in some results but not all (they would be lost).
    """
    if len(results) < 2:
        raise ValueError(f"merging needs at least two sampled evaluations, got {len(results)}")
    if any(r.mode != "sampled" for r in results):
        raise ValueError("only sampled evaluations can be merged (a greedy one has one deterministic sample per task)")
    for i, r in enumerate(results[1:], start=1):
        if r.tasks != results[0].tasks:
            raise ValueError(f"evaluation {i} is of other tasks than evaluation 0 (nums and target, in order)")
    with_rm = [bool(r.task_rm_scores) for r in results]
    if any(with_rm) and not all(with_rm):
        raise ValueError(f"reward-model scores in evaluations {[i for i, x in enumerate(with_rm) if x]} only: "
                         "score the others with the same --select-reward-model, or merge only files without them")

    def joined(name: str) -> list[list]:
        return [[x for r in results for x in getattr(r, name)[t]] for t in range(results[0].num_tasks)]

    return summarize("sampled", task_scores=joined("task_scores"), tasks=results[0].tasks,
                     task_truncated=joined("task_truncated"), task_tokens=joined("task_tokens"),
                     task_values=joined("task_values"), task_certainty=joined("task_certainty"),
                     examples=results[0].examples, task_rm_scores=joined("task_rm_scores") if all(with_rm) else None,
                     task_looped=joined("task_looped") if all(r.task_looped for r in results) else None)
