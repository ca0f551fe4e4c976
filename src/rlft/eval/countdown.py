"""Countdown evaluation: sample completions for held-out tasks, score them, report accuracy and pass@k.

Scores come from :func:`rlft.rewards.countdown.score_completions` (the TinyZero-exact scorer on
``prompt + completion``): 1.0 correct, 0.1 an answer that is wrong, 0.0 no answer.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

from rlft.eval.passk import mean_pass_at_k
from rlft.eval.stats import Z_95
from rlft.rewards.countdown import score_completions
from rlft.validation import validate_options
from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt
from rlft.rollout.base import GenerationEngine, SamplingParams
from rlft.types import CountdownTask
from rlft.options import DeviceOptions, RolloutOptions

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
    """Fraction of samples that hit max_new_tokens (finish_reason "length")."""
    examples: list[dict] = field(default_factory=list)
    """The first few tasks: prompt_tail, completion (first sample), score, target, nums."""
    task_scores: list[list[float]] = field(default_factory=list)
    """Per task, in task order, the scores of its k samples: shape (num_tasks, k). Paired comparisons
    of two models on the same tasks read it (:func:`paired_difference`)."""

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
) -> CountdownEvalResult:
    """Generate ``params.k`` completions for each of the B prompts and score them against ``tasks``.

    ``prompts[b]`` is the rendered prompt of ``tasks[b]``. Greedy mode is ``params.temperature == 0``.

    Raises:
        ValueError: no tasks, ``len(tasks) != len(prompts)``, or an engine result of the wrong shape.
    """
    if not tasks:
        raise ValueError("no tasks to evaluate")
    if len(tasks) != len(prompts):
        raise ValueError(f"{len(tasks)} tasks but {len(prompts)} prompts")
    samples = engine.generate(prompts, params)
    if len(samples) != len(prompts) or any(len(s) != params.k for s in samples):
        raise ValueError(f"the engine must return {len(prompts)} lists of {params.k} samples")

    scores = [  # scores[b][j]
        score_completions([prompt] * params.k, [s.text for s in row], [task.ground_truth()] * params.k)
        for task, prompt, row in zip(tasks, prompts, samples)
    ]
    flat = [x for row in scores for x in row]
    flat_samples = [s for row in samples for s in row]
    accuracy = sum(x == 1.0 for x in flat) / len(flat)
    greedy = params.temperature == 0.0
    if greedy:
        pass_at = {1: accuracy}
    else:
        correct = [sum(x == 1.0 for x in row) for row in scores]
        pass_at = {j: mean_pass_at_k(params.k, correct, j) for j in pass_at_k_sizes(params.k)}
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
    return CountdownEvalResult(
        num_tasks=len(tasks),
        k=params.k,
        mode="greedy" if greedy else "sampled",
        mean_score=sum(flat) / len(flat),
        accuracy=accuracy,
        format_rate=sum(x >= 0.1 for x in flat) / len(flat),
        pass_at_k=pass_at,
        mean_completion_tokens=sum(len(s.completion_ids) for s in flat_samples) / len(flat_samples),
        truncated_rate=sum(s.finish_reason == "length" for s in flat_samples) / len(flat_samples),
        examples=examples,
        task_scores=scores,
    )


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


@dataclass(frozen=True)
class EvalCountdownConfig(DeviceOptions, RolloutOptions):
    """Evaluate a model on held-out Countdown tasks."""

    model: str = "smollm2-135m"
    """Built-in model name, local Hugging Face folder, or Hub id."""
    data: str | None = None
    """None: the generated held-out split of `preset` (the same make_splits(split_seed) that training
    uses); else a Countdown JSONL/Parquet file or Hub dataset with target + nums/numbers."""
    split: str = "test"
    """Split to read when `data` is a Hub id."""
    preset: str = "easy3"
    """Generator preset for the held-out split when `data` is None."""
    split_seed: int = 1234
    """Seed of make_splits when `data` is None; keep it equal to training's."""
    limit: int | None = 100
    """Evaluate the first `limit` tasks (None: all)."""
    prompt_template: str = "base"
    """Prompt template name: "base" (TinyZero text), "chat" (the model's chat template) or "short"."""
    mode: Literal["greedy", "sampled"] = "greedy"
    """greedy: one temperature-0 completion per task; sampled: `k` samples at `temperature`/`top_p`."""
    k: int = 1
    """Samples per task in sampled mode (pass@1..pass@k are reported)."""
    temperature: float = 1.0
    """Sampling temperature in sampled mode."""
    top_p: float = 1.0
    """Nucleus sampling mass in sampled mode."""
    max_new_tokens: int | None = None
    """Most tokens per completion; None: 1024 on CUDA, 256 on CPU (the reference evaluates with >= 1024)."""
    batch_size: int = 32
    """Sequences generated together."""
    output: str | None = None
    """Write the metrics and examples to this JSON file."""
    seed: int = 0
    """Sampling seed."""

    def __post_init__(self) -> None:
        validate_options(self)


DEFAULT_TEST_SIZE = 1024
"""Held-out tasks generated when ``data`` is None and ``limit`` is None."""


def load_eval_tasks(cfg: EvalCountdownConfig) -> list[CountdownTask]:
    """The tasks ``cfg`` names: a file/Hub dataset, or the held-out split of a generator preset.

    Generated: the first ``limit`` tasks of ``make_splits(PRESETS[preset], ..., seed=split_seed)``'s
    test split. Its test stream does not depend on ``n_train`` and is prefix-stable, so these are held
    out from a training run with the same preset and seed whenever that run's ``n_test >= limit``.
    """
    if cfg.data is not None:
        from rlft.tasks.countdown.loaders import load_countdown

        return load_countdown(cfg.data, split=cfg.split, limit=cfg.limit)
    from rlft.tasks.countdown.generator import PRESETS, make_splits

    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown preset {cfg.preset!r}; choose from {sorted(PRESETS)}")
    n_test = cfg.limit if cfg.limit is not None else DEFAULT_TEST_SIZE
    _, test = make_splits(PRESETS[cfg.preset], n_train=0, n_test=n_test, seed=cfg.split_seed)
    return test


def run_eval_countdown(cfg: EvalCountdownConfig) -> CountdownEvalResult:
    """Load the model, build tasks and prompts, evaluate, print a table, write ``cfg.output`` if set.

    Raises:
        rlft.models.ModelNotFoundError: the model cannot be loaded.
        ValueError: unknown preset or prompt template, or no tasks.
    """
    from rlft.models import load_tokenizer, pick_device
    from rlft.rollout.engines import make_engine

    spec = pick_device(cfg.device, cfg.dtype)
    tokenizer = load_tokenizer(cfg.model)
    tasks = load_eval_tasks(cfg)
    prompts = [render_prompt(cfg.prompt_template, task, tokenizer) for task in tasks]
    engine = make_engine(cfg.rollout_engine, cfg.model, tokenizer, spec, url=cfg.rollout_url, batch_size=cfg.batch_size,
                         show_progress=True, add_special_tokens=adds_special_tokens(cfg.prompt_template))
    max_new_tokens = cfg.max_new_tokens or (1024 if spec.device.type == "cuda" else 256)
    if cfg.mode == "greedy":
        params = SamplingParams(k=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=cfg.seed)
    else:
        params = SamplingParams(
            k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=max_new_tokens, seed=cfg.seed
        )
    result = evaluate_countdown(engine, tasks, prompts, params)
    print_result(result, title=f"Countdown eval: {cfg.model}")
    if cfg.output:
        path = Path(cfg.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**result.to_dict(), "config": asdict(cfg)}, indent=2))
    return result


def print_result(result: CountdownEvalResult, title: str = "Countdown eval") -> None:
    """Print the metrics as a rich table."""
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
        ("truncated rate", f"{result.truncated_rate:.4f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
