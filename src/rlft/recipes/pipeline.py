"""Multi-stage runs: the pieces ``rlft demo`` (both tracks) and ``scripts/countdown_ablation.py`` share.

A multi-stage run is a sequence of stages, each writing one output (a model folder, a data file), and evaluations
of the models they produce. A stage whose output is already there is skipped, so a killed run started again
continues where it stopped. This module is their one home:

- :func:`run_stage` runs a stage unless its output is done (:func:`done`), times it (:class:`Timer`) and drops its
  resumable checkpoints once its model is saved (:func:`drop_checkpoints`);
- :func:`evaluate_cached` loads a model folder once, evaluates it on named Countdown task sets with given
  :class:`~rlft.rollout.base.SamplingParams` (HF engine) and writes each result as JSON in the ``rlft eval countdown``
  format (:class:`~rlft.eval.countdown.CountdownEvalResult` fields, plus ``eval_s``, ``model`` and ``cache_key``).
  A cached result is reused only while its :func:`cache_key` matches: the model folder's weights files (name, size,
  mtime: :func:`rlft.recipes.pairs.weights_fingerprint`), the sampling parameters, the prompt template and the tasks.
  A rebuilt model at the same path is therefore evaluated again, never paired with its predecessor's scores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from rlft.eval.countdown import CountdownEvalResult
from rlft.rollout.base import SamplingParams
from rlft.types import CountdownTask

log = logging.getLogger("rlft")


class Timer:
    """``with Timer(timings, "SFT"): ...`` stores the block's wall-clock seconds in ``timings["SFT"]`` (also when
    the block raises)."""

    def __init__(self, timings: dict[str, float], name: str):
        self.timings, self.name = timings, name

    def __enter__(self) -> "Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.timings[self.name] = time.perf_counter() - self.t0


def finished(output: str | Path) -> bool:
    """Whether one stage output is there: a file that exists, or a model folder holding ``config.json``."""
    output = Path(output)
    return output.is_file() or (output / "config.json").is_file()


def done(resume: bool, *outputs: str | Path) -> bool:
    """Whether a stage may be skipped: ``resume`` is set and every one of its ``outputs`` is :func:`finished`."""
    return resume and all(finished(o) for o in outputs)


def drop_checkpoints(model_dir: str | Path | None, keep: bool = False) -> None:
    """Delete the ``checkpoints/`` folder beside a stage's finished ``model_dir`` (one holding ``config.json``) unless
    ``keep``: a finished stage resumes from its model, and each checkpoint of a 135M model is ~1.5 GB. Nothing
    happens for ``None``, a file or an unfinished model folder."""
    if model_dir is not None and not keep and (Path(model_dir) / "config.json").is_file():
        shutil.rmtree(Path(model_dir).parent / "checkpoints", ignore_errors=True)


def run_stage(name: str, outputs: str | Path | Iterable[str | Path], build: Callable[[], Any], *,
              timings: dict[str, float], resume: bool, keep_checkpoints: bool = True) -> Path:
    """Run one stage: call ``build()`` unless :func:`done` (``resume`` and every output there), under a
    :class:`Timer` named ``name``; then, unless ``keep_checkpoints``, :func:`drop_checkpoints` of the first output.

    ``outputs``: the stage's output path, or several (the first is the one returned: a stage's model folder or main
    file). ``build`` must write them; what it returns is ignored. Returns the first output as a Path.
    """
    paths = [Path(outputs)] if isinstance(outputs, (str, Path)) else [Path(o) for o in outputs]
    with Timer(timings, name):
        if not done(resume, *paths):
            build()
        drop_checkpoints(paths[0], keep_checkpoints)
    return paths[0]


# --------------------------------------------------------------------------- cached evaluation


@dataclass(frozen=True)
class EvalJob:
    """One evaluation of a model: the B ``tasks``, each sampled ``params.k`` times with ``params``, the result cached
    in ``path`` (a JSON file)."""

    path: Path
    tasks: list[CountdownTask]
    params: SamplingParams


def cache_key(model: str | Path, job: EvalJob, prompt_template: str) -> dict:
    """What a cached evaluation must share with the one asked for: the model folder's weights files
    (``[[name, bytes, mtime_ns], ...]``; ``[]`` for a built-in name or Hub id), the sampling parameters, the prompt
    template and a SHA-256 of the tasks (numbers and target of each, in order)."""
    from rlft.recipes.pairs import weights_fingerprint

    tasks = hashlib.sha256(json.dumps([[list(t.nums), t.target] for t in job.tasks]).encode()).hexdigest()
    return {"model_weights": weights_fingerprint(str(model)), "sampling": asdict(job.params),
            "prompt_template": prompt_template, "tasks_sha256": tasks}


def read_cached(path: Path, key: dict, job: EvalJob) -> CountdownEvalResult | None:
    """The result cached in ``path`` when it answers ``job``, else None (logged when a file is there but stale).

    A file with a ``cache_key`` must match ``key``; a file without one (written before keys were recorded, or
    archived) is taken as it is. Either way its samples per task and its number of tasks must be the job's.
    """
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    recorded = data.get("cache_key")
    stale = [name for name in key if recorded is not None and recorded.get(name) != key[name]]
    if data.get("k") != job.params.k or len(data.get("task_scores", [])) != len(job.tasks):
        stale.append("size")
    if stale:
        log.info("%s is stale (%s differ): evaluating again", path, ", ".join(stale))
        return None
    return CountdownEvalResult.from_dict(data)


def evaluate_cached(model: str | Path, jobs: dict[str, EvalJob], *, prompt_template: str, batch_size: int,
                    device: str = "auto", dtype: str = "auto", reuse: bool = True, label: str | None = None,
                    show_progress: bool = False) -> dict[str, CountdownEvalResult]:
    """Evaluate ``model`` (a local folder, built-in name or Hub id) on every job; returns ``{job name: result}`` in
    the order of ``jobs``.

    With ``reuse``, a job whose cached file answers it (:func:`read_cached`) is read back; the model is loaded (once)
    only when some job is left. Each evaluated job is written to its ``path`` (atomically) as
    ``{**result.to_dict(), "eval_s", "model", "cache_key"}``, and its metrics printed under
    ``"<label> on <job name>"``. ``batch_size``: sequences generated together.

    Raises:
        rlft.models.ModelNotFoundError: a job is left and the model cannot be loaded.
        ValueError: a job has no tasks.
    """
    from rlft.eval.countdown import evaluate_countdown, print_result
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.rollout.hf import HFEngine
    from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt

    results: dict[str, CountdownEvalResult] = {}
    keys = {name: cache_key(model, job, prompt_template) for name, job in jobs.items()}
    todo = []
    for name, job in jobs.items():
        cached = read_cached(job.path, keys[name], job) if reuse else None
        if cached is None:
            todo.append(name)
        else:
            results[name] = cached
            log.info("reusing %s", job.path)
    if todo:
        tokenizer = load_tokenizer(str(model))
        engine = HFEngine(load_model(str(model), pick_device(device, dtype)), tokenizer, batch_size=batch_size,
                          show_progress=show_progress, add_special_tokens=adds_special_tokens(prompt_template))
        for name in todo:
            job = jobs[name]
            t0 = time.perf_counter()
            prompts = [render_prompt(prompt_template, t, tokenizer) for t in job.tasks]
            result = evaluate_countdown(engine, job.tasks, prompts, job.params)
            data = {**result.to_dict(), "eval_s": time.perf_counter() - t0, "model": str(model), "cache_key": keys[name]}
            job.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = job.path.with_name(job.path.name + ".tmp")
            tmp.write_text(json.dumps(data, indent=2))
            tmp.replace(job.path)
            print_result(result, title=f"{label or model} on {name}")
            log.info("%s on %s (%d tasks): score %.4f", label or model, name, len(job.tasks), result.mean_score)
            results[name] = result
    return {name: results[name] for name in jobs}
