"""Multi-stage runs: the pieces ``rlft demo`` (both tracks) and ``scripts/countdown_ablation.py`` share.

A multi-stage run is a sequence of stages, each writing one output (a model folder, a data file), and evaluations
of the models they produce. A stage whose output is already there is skipped, so a killed run started again
continues where it stopped. This module is their one home:

- :func:`run_stage` runs a stage unless its output is done (:func:`done`), times it (:class:`Timer`) and drops its
  resumable checkpoints once its model is saved (:func:`drop_checkpoints`);
- :func:`evaluate_cached` loads a model folder once, evaluates it on named Countdown task sets with given
  :class:`~rlft.rollout.base.SamplingParams` (HF engine) and writes each result as JSON in the ``rlft eval countdown``
  format (:class:`~rlft.eval.countdown.CountdownEvalResult` fields, plus ``eval_s``, ``model`` and ``cache_key``).
  A cached result is reused only while its :func:`cache_key` matches: the SHA-256 of the model folder's weights
  (:func:`rlft.checkpoint.weights_sha256`), the sampling parameters, the prompt template, the tasks and, for rollouts
  with tool calls (``--env countdown-calc``), the environment and its bounds (:func:`env_key`). A model
  trained again at the same path is therefore evaluated again unless it is the same bytes (a bit-for-bit rebuild
  reuses its predecessor's scores, which are its own), never paired with another model's scores;
- a study's settings and variants as data (:func:`load_settings`, :func:`load_variants`: YAML files such as
  ``configs/countdown/ablation/``) and the held-out tasks a setting evaluates on (:func:`heldout_tasks`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable

from rlft.eval.countdown import CountdownEvalResult
from rlft.rollout.base import SamplingParams
from rlft.rollout.turns import ToolUse
from rlft.types import CountdownTask
from rlft.validation import OptionError

log = logging.getLogger("rlft")


class StageTimes(dict):
    """Wall-clock seconds per stage of a pipeline run (``{stage: seconds}``), written to ``journal`` (JSON, in the
    run folder) after every stage. A resumed run starts from the journal and adds its own seconds, so a report of a
    demo that was killed and resumed shows what each stage took, not the seconds of skipping it.

    Raises:
        ValueError: ``resume`` and a ``journal`` that is damaged or not ``{name: seconds}`` (named).
    """

    def __init__(self, journal: str | Path, resume: bool):
        super().__init__()
        self.journal = Path(journal)
        if resume and self.journal.exists():
            from rlft.lab.script_io import read_json

            earlier = read_json(self.journal, "the stage seconds of an earlier run")
            if not isinstance(earlier, dict) or not all(isinstance(v, (int, float)) for v in earlier.values()):
                raise ValueError(f"{self.journal}: not {{stage: seconds}} (delete it to start the timings afresh)")
            self.update({k: float(v) for k, v in earlier.items() if k != "total"})

    def add(self, name: str, seconds: float) -> None:
        """``seconds`` more for stage ``name``; the journal is rewritten (atomically)."""
        from rlft.fsio import atomic_write_json

        self[name] = self.get(name, 0.0) + seconds
        atomic_write_json(self.journal, {k: v for k, v in self.items() if k != "total"})

    def with_total(self) -> "StageTimes":
        """Itself with ``total``: the sum of the stages."""
        self["total"] = sum(v for k, v in self.items() if k != "total")
        return self


class Timer:
    """``with Timer(timings, "SFT"): ...`` adds the block's wall-clock seconds to ``timings["SFT"]`` (also when the
    block raises; :meth:`StageTimes.add`: to the earlier run's, and the journal is written)."""

    def __init__(self, timings: StageTimes, name: str):
        self.timings, self.name = timings, name

    def __enter__(self) -> "Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.timings.add(self.name, time.perf_counter() - self.t0)


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
              timings: StageTimes, resume: bool, keep_checkpoints: bool = True) -> Path:
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
    test_look: bool = False
    """The tasks are held-out TEST tasks: a fresh evaluation appends a line to the test-look ledger
    (:func:`evaluate_cached`'s ``ledger``; a cached result read back is not a new look)."""


def env_key(env: str | None, tool_use: ToolUse | None) -> dict | None:
    """The environment an evaluation ran in, as its cache key and config record it: None for one turn without tools
    (every evaluation before environments, and ``--env countdown``), else ``{"name": env, "tools": [their names],
    "max_turns", "max_observation_tokens", "tool_timeout"}`` (tool_timeout in seconds)."""
    if tool_use is None:
        return None if env in (None, "countdown") else {"name": env, "tools": []}
    return {"name": env, "tools": sorted(tool_use.tools), "max_turns": tool_use.max_turns,
            "max_observation_tokens": tool_use.max_observation_tokens, "tool_timeout": tool_use.timeout_s}


def cache_key(weights: str | list, job: EvalJob, prompt_template: str, env: dict | None = None) -> dict:
    """What a cached evaluation must share with the one asked for: the model's weights
    (:func:`rlft.checkpoint.weights_id`), the sampling parameters, the prompt template, a SHA-256 of the tasks
    (numbers and target of each, in order) and, when given, the environment (:func:`env_key`; a key without one is
    an evaluation without tools, and neither is reused for the other: :func:`read_cached`)."""
    tasks = hashlib.sha256(json.dumps([[list(t.nums), t.target] for t in job.tasks]).encode()).hexdigest()
    return {"weights": weights, "sampling": asdict(job.params), "prompt_template": prompt_template,
            "tasks_sha256": tasks, **({"env": env} if env is not None else {})}


def _legacy_weights_match(recorded: dict, model: str | Path | None) -> bool:
    """A key written before 2026-12-02 names the weights files by ``[[name, bytes, mtime_ns], ...]``
    (:func:`rlft.checkpoint.weights_fingerprint`) instead of their SHA-256: it still matches while those files are
    untouched."""
    from rlft.checkpoint import legacy_weights_match

    return "weights" not in recorded and model is not None and legacy_weights_match(recorded.get("model_weights"),
                                                                                    model)


def read_cached(path: Path, key: dict, job: EvalJob, model: str | Path | None = None) -> CountdownEvalResult | None:
    """The result cached in ``path`` when it answers ``job``, else None (logged when a file is there but stale).

    A file with a ``cache_key`` must match ``key`` (an older key that names ``model``'s weights files by size and
    mtime instead of their SHA-256 matches while they are untouched); a file without one (written before keys were
    recorded, or archived) is taken as it is. Either way its samples per task and its number of tasks must be the job's.

    Raises:
        ValueError: naming ``path``: it is not JSON (damaged) or not an evaluation; deleting it evaluates again.
    """
    from rlft.lab.script_io import read_json

    if not path.is_file():
        return None
    what = "an evaluation rlft cached (delete the file to evaluate again)"
    data = read_json(path, what)
    if not isinstance(data, dict) or not isinstance(data.get("cache_key", {}), (dict, type(None))):
        raise ValueError(f"{path}: not {what}")
    recorded = data.get("cache_key")
    legacy = recorded is not None and _legacy_weights_match(recorded, model)
    names = [*key, *(["env"] if "env" not in key else [])]  # an evaluation with tools never answers one without
    stale = [name for name in names if recorded is not None and recorded.get(name) != key.get(name)
             and not (legacy and name == "weights")]
    if data.get("k") != job.params.k or len(data.get("task_scores", [])) != len(job.tasks):
        stale.append("size")
    if stale:
        log.info("%s is stale (%s differ): evaluating again", path, ", ".join(stale))
        return None
    try:
        return CountdownEvalResult.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not {what} ({type(e).__name__}: {e})") from None


def evaluate_cached(model: str | Path, jobs: dict[str, EvalJob], *, prompt_template: str, batch_size: int,
                    device: str = "auto", dtype: str = "auto", reuse: bool = True, label: str | None = None,
                    show_progress: bool = False, ledger: str | Path | None = None, env: str | None = None,
                    tool_use: ToolUse | None = None) -> dict[str, CountdownEvalResult]:
    """Evaluate ``model`` (a local folder, built-in name or Hub id) on every job; returns ``{job name: result}`` in
    the order of ``jobs``.

    With ``reuse``, a job whose cached file answers it (:func:`read_cached`) is read back; the model is loaded (once)
    only when some job is left. Each evaluated job is written to its ``path`` (atomically) as
    ``{**result.to_dict(), "eval_s", "model", "cache_key", "config"}`` (``config``: the weights' ``model_sha256``,
    ``max_new_tokens``, ``prompt_template`` and ``stop_repeats``, as ``rlft eval countdown`` records them, so
    ``--greedy-from`` and ``scripts/merge_sampled_evals.py`` can refuse another model file), and its metrics printed
    under ``"<label> on <job name>"``. ``batch_size``: sequences generated together.
    ``tool_use``: rollouts with tool calls (:func:`rlft.eval.countdown.evaluate_countdown`'s; ``env``, the
    environment's name, e.g. countdown-calc): the environment and its bounds join every job's cache key and written
    ``config`` (:func:`env_key`), so a cached evaluation without tools is never reused for one with them, nor the
    other way round. ``ledger``: the test-look ledger (:mod:`rlft.lab.ledger`) that every fresh evaluation of a job with
    ``test_look`` appends a line to (the weights' SHA-256, ``label``, date, commit, score); None: not recorded. It is
    checked first, before anything is hashed or evaluated (:func:`rlft.lab.ledger.check_ledger_target`: a ``.jsonl``
    file of looks that can be written, not inside the model folder nor a job's file) and only ever appended to.

    Raises:
        rlft.models.ModelNotFoundError: a job is left and the model cannot be loaded.
        UsageError: the ledger is not one or cannot be written (one line naming it).
        ValueError: a job has no tasks.
    """
    from rlft.checkpoint import weights_id, weights_sha256
    from rlft.eval.countdown import evaluate_countdown, print_result
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.rollout.hf import HFEngine
    from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt

    if ledger is not None and any(job.test_look for job in jobs.values()):
        from rlft.lab.ledger import check_ledger_target

        check_ledger_target(ledger, inputs={"model": model},
                            outputs={f"{name} file": job.path for name, job in jobs.items()})
    results: dict[str, CountdownEvalResult] = {}
    precision = str(pick_device(device, dtype).for_inference().label)  # a bf16 evaluation is not a float32 one
    sha256 = weights_sha256(model)  # hashed once for every job's key and the written config
    weights = weights_id(model, sha256)
    environment = env_key(env, tool_use)
    keys = {name: {**cache_key(weights, job, prompt_template, environment), "precision": precision}
            for name, job in jobs.items()}
    tools = {"tool_use": tool_use} if tool_use is not None else {}
    todo = []
    for name, job in jobs.items():
        cached = read_cached(job.path, keys[name], job, model) if reuse else None
        if cached is None:
            todo.append(name)
        else:
            results[name] = cached
            log.info("reusing %s", job.path)
    if todo:
        tokenizer = load_tokenizer(str(model))
        # evaluation only generates: weights in the compute dtype under mixed precision (DeviceSpec.for_inference)
        engine = HFEngine(load_model(str(model),
                                     pick_device(device, dtype).for_inference()), tokenizer, batch_size=batch_size,
                          show_progress=show_progress, add_special_tokens=adds_special_tokens(prompt_template))
        for name in todo:
            job = jobs[name]
            t0 = time.perf_counter()
            prompts = [render_prompt(prompt_template, t, tokenizer) for t in job.tasks]
            result = evaluate_countdown(engine, job.tasks, prompts, job.params, **tools)
            data = {
                **result.to_dict(), "eval_s": time.perf_counter() - t0, "model": str(model), "cache_key": keys[name],
                "config": {
                    "model_sha256": sha256, "max_new_tokens": job.params.max_new_tokens,
                    "prompt_template": prompt_template, "stop_repeats": job.params.stop_repeats,
                    **({"env": environment} if environment is not None else {})
                }
            }
            job.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = job.path.with_name(job.path.name + ".tmp")
            tmp.write_text(json.dumps(data, indent=2))
            tmp.replace(job.path)
            if job.test_look and ledger is not None:
                from rlft.lab.ledger import record_test_look

                record_test_look(result, {**data["config"], "model": str(model), "split": "test"},
                                 ledger, label=f"{label or model} {name}", eval_path=job.path, inputs={"model": model})
            print_result(result, title=f"{label or model} on {name}")
            log.info("%s on %s (%d tasks): score %.4f", label or model, name, len(job.tasks), result.mean_score)
            results[name] = result
    return {name: results[name] for name in jobs}


# --------------------------------------------------------------------------- studies: settings and variants as data

SCIENTIFIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")
VARIANT_KINDS = ("rl", "dpo", "sft")


def read_yaml(path: str | Path) -> dict:
    """The mapping in a YAML file, ``1e-4``-style strings read as floats (YAML 1.1 reads them as strings).

    Raises:
        OptionError: the file is missing, is not YAML or holds no mapping (the message names the file).
    """
    import yaml

    def number(value):
        if isinstance(value, dict):
            return {k: number(v) for k, v in value.items()}
        return float(value) if isinstance(value, str) and SCIENTIFIC.match(value) else value

    path = Path(path)
    if not path.is_file():
        raise OptionError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise OptionError(f"{path}: not YAML ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise OptionError(f"{path}: expected a mapping")
    return number(data)


@dataclass(frozen=True)
class Setting:
    """One setting of a study's ``settings.yaml`` (e.g. ``configs/countdown/ablation/settings.yaml``): what every
    variant shares. The mappings are passed as they are to the recipe configs named."""

    name: str
    sft: str
    """The SFT start every variant starts from (a model folder)."""
    tasks: dict
    """Every stage's task source: RLConfig, PairsConfig and SFTConfig fields (preset, split_seed, heldout_size,
    prompt_template, or a data file); evaluations use a prefix of its held-out tasks (:func:`heldout_tasks`)."""
    validation_start: int
    """Held-out tasks from here on are the validation split; those before it the test split."""
    trace_style: str
    """Continued SFT's traces (SFTConfig.trace_style)."""
    give_up: float
    max_new_tokens: int
    """The generation budget: rollouts, pairs and evaluations alike."""
    micro_batch_size: int
    """RL update and DPO micro-batch."""
    device: str
    dtype: str
    rl: dict
    """RLConfig options of every RL variant."""
    pairs: dict
    """PairsConfig options of the DPO variants' on-policy pairs."""
    dpo: dict
    """DPOConfig options of every DPO variant."""
    sft_continued: dict
    """SFTConfig options of continued SFT."""
    eval: dict
    """``batch_size`` of the evaluation, and ``sampled``: the SamplingParams (k, temperature, top_p) of the sampled
    one."""


def load_settings(folder: str | Path) -> dict[str, Setting]:
    """``{name: Setting}`` of ``folder/settings.yaml``: its ``common`` mapping with each entry of ``settings`` on top
    (a mapping such as ``rl`` merged key by key).

    Raises:
        OptionError: no such file, or a setting with an unknown or missing key (named with the file and setting).
    """
    path = Path(folder) / "settings.yaml"
    data = read_yaml(path)
    known = {f.name for f in fields(Setting)} - {"name"}
    settings = {}
    for name, own in (data.get("settings") or {}).items():
        merged = dict(data.get("common") or {})
        for key, value in (own or {}).items():
            merged[key] = {**merged[key], **value} if isinstance(merged.get(key), dict) else value
        if wrong := set(merged) ^ known:
            raise OptionError(f"{path}: setting {name!r}: unknown or missing key(s) {', '.join(sorted(wrong))}")
        settings[name] = Setting(name=name, **merged)
    return settings


def load_variants(folder: str | Path) -> dict[str, dict]:
    """``{name: spec}`` of every ``*.yaml`` file in ``folder`` but settings.yaml, in file-name order, then the order
    within each file (the order reports list them in). A spec is a mapping with ``kind`` (one of VARIANT_KINDS) and
    its options; ``pairs_of``, ``start_from`` and ``budget_of``, when given, name another variant.

    Raises:
        OptionError: a name defined twice, a bad kind, or a reference to no variant (named with the file).
    """
    variants, where = {}, {}
    for path in sorted(p for p in Path(folder).glob("*.yaml") if p.name != "settings.yaml"):
        for name, spec in read_yaml(path).items():
            if name in variants:
                raise OptionError(f"{path}: variant {name!r} is already defined in {where[name]}")
            if not isinstance(spec, dict) or spec.get("kind") not in VARIANT_KINDS:
                raise OptionError(f"{path}: variant {name!r}: kind must be one of {', '.join(VARIANT_KINDS)}")
            variants[name], where[name] = spec, path
    for name, spec in variants.items():
        for key in ("pairs_of", "start_from", "budget_of"):
            if key in spec and spec[key] not in variants:
                raise OptionError(f"{where[name]}: variant {name!r}: {key} {spec[key]!r} is not a variant")
    return variants


def heldout_tasks(setting: Setting, n: int, split: str = "test") -> list[CountdownTask]:
    """The first ``n`` test tasks of the setting: with a Countdown dataset as its task source (``tasks.data``), the
    first ``n`` rows of its test or validation part (:func:`rlft.tasks.countdown.splits.load_split`); else its
    generated held-out tasks 0 .., or with ``split="validation"`` held-out ``validation_start`` ...

    Raises:
        OptionError: more held-out tasks than the split has.
    """
    from rlft.tasks.countdown.generator import PRESETS, make_splits

    if setting.tasks.get("data"):
        from rlft.tasks.countdown.splits import load_split

        part = load_split(setting.tasks["data"], data_split=setting.tasks.get("data_split", "train")).part(split)
        if n > len(part):
            raise OptionError(f"the {split} rows of {setting.tasks['data']} are {len(part)}, not {n}")
        return part[:n]
    t, start = setting.tasks, setting.validation_start
    if split == "validation":
        if n > t["heldout_size"] - start:
            raise OptionError(f"the validation split has {t['heldout_size'] - start} tasks, not {n}")
        return make_splits(PRESETS[t["preset"]], 0, start + n, t["split_seed"])[1][start:]
    return make_splits(PRESETS[t["preset"]], 0, n, t["split_seed"])[1]
