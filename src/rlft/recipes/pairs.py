"""On-policy Countdown preference pairs for DPO: sample n responses per prompt, score, keep best vs worst.

For every prompt (Countdown training tasks, generated or from a file), sample ``num_samples``
responses from the model at a non-zero temperature, score each with the TinyZero-exact scorer
(:func:`rlft.rewards.countdown.score_completions`: 1.0 correct, 0.1 answer but wrong, 0.0 no answer),
and keep ``chosen`` = the highest-scoring response and ``rejected`` = the lowest-scoring one. When the
best and the worst score are equal (all responses tie: very common with scores 0 / 0.1 / 1), the prompt
is dropped and counted (docs/design.md pitfall 4). Among equal best (or worst) responses the first sampled
one is taken.

Output: a JSONL file (written atomically) with one row per kept prompt::

    {"prompt": str, "chosen": str, "rejected": str, "score_chosen": float, "score_rejected": float,
     "nums": [int, ...], "target": int, "chosen_finish_reason": "stop"|"length",
     "rejected_finish_reason": "stop"|"length"}

and next to it ``<output stem>.stats.json`` with the counts (prompts tried, kept, dropped as ties), and
``<output stem>.samples.jsonl``, the journal of every sampled response (:func:`journal_path`): sampling goes in
chunks of 64 prompts, each written there when done, and a run killed mid-way continues from it when started again
with the same options (a journal of other options is refused, at parse time, unless ``--overwrite``). An existing
pairs or stats file is refused unless ``--overwrite``; a folder, or a path inside a model folder, always
(:func:`check_pairs_outputs`). Under torchrun the command is refused: it samples in one process.
Responses are the generated text with special tokens skipped, so they hold no EOS; the DPO recipe's
tokenization appends one. A response that hit ``max_new_tokens`` (finish reason ``length``) gets that
EOS too, so the counts of such responses among kept pairs are reported.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlft.data.files import write_jsonl
from rlft.fsio import atomic_write_json
from rlft.rewards.countdown import score_completions
from rlft.rollout.base import GenerationEngine, Sample, SamplingParams
from rlft.rollout.journal import sample_with_journal
from rlft.types import CountdownTask
from rlft.validation import OptionError, require, validate_options
from rlft.options import MAX_NEW_TOKENS, MAX_NEW_TOKENS_CUDA, DeviceOptions, EnvOptions, RolloutOptions
from rlft.tasks.countdown.options import CountdownTrainingOptions

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class PairsConfig(DeviceOptions, RolloutOptions, EnvOptions, CountdownTrainingOptions):
    """Sample responses to Countdown training prompts, score them, and write best-vs-worst preference pairs."""

    model: str = "runs/sft/model"
    """Model to sample from (usually the SFT model folder): built-in name, local HF folder, or Hub id."""
    num_prompts: int = 512
    """Prompts to sample for: generated training tasks, or training rows of --data."""
    start: int = 0
    """Skip this many tasks first (generated training tasks or rows of --data); set it to SFT's
    --num-train to sample on prompts the SFT model was not trained on."""
    num_samples: int = 2
    """Responses sampled per prompt (>= 2); chosen = best score, rejected = worst."""
    temperature: float = 1.0
    """Sampling temperature (> 0: identical greedy samples would always tie)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 is off."""
    max_new_tokens: int | None = None
    """Most tokens per response; None: 1024 on CUDA, 256 on CPU."""
    batch_size: int = 32
    """Sequences generated together."""
    output: str = "runs/pairs/countdown.jsonl"
    """Where to write the pairs (JSONL); stats go to the same name with suffix .stats.json, every sample
    to .samples.jsonl
    (the journal a killed run continues from). An existing file is refused unless --overwrite; a folder, or a path in a
    model folder, always."""
    overwrite: bool = False
    """Replace an existing --output file and its .stats.json (and a journal of other options: sampled again)."""
    seed: int = 0
    """Sampling seed."""

    def __post_init__(self) -> None:
        validate_options(self)
        self._check_countdown()
        self._check_env(rollout_engine=self.rollout_engine)
        require(self.env in (None, "countdown", "countdown-calc"),
                f"--env {self.env}: `rlft pairs countdown` samples the Countdown environments (countdown, "
                "countdown-calc)")
        _validate(self)

    def check_outputs(self) -> None:
        """Refuse what this run's writes would destroy, before any work (:func:`check_pairs_outputs`)."""
        check_pairs_outputs(self)


def stats_path(output: str | Path) -> Path:
    """``runs/pairs/countdown.jsonl`` -> ``runs/pairs/countdown.stats.json``."""
    return Path(output).with_suffix(".stats.json")


def journal_path(output: str | Path) -> Path:
    """``runs/pairs/countdown.jsonl`` -> ``runs/pairs/countdown.samples.jsonl``: every sampled response, chunk by
    chunk (:mod:`rlft.rollout.journal`); a killed run resumes from it, and it is kept (all samples, not only pairs)."""
    return Path(output).with_suffix(".samples.jsonl")


def model_weights_id(model: str, journal: Path) -> str | list:
    """What names ``model``'s weights in the meta of ``journal``: :func:`rlft.checkpoint.weights_id`, their SHA-256
    (reading the 135M model's 0.5 GB takes ~1 s), so a model rebuilt bit for bit, or copied, continues the journal
    and other weights saved at the same path do not. A journal written before 2026-12-02 names them by
    :func:`rlft.checkpoint.weights_fingerprint` (name, bytes, mtime): that value is kept while it still matches the
    files, so the journal is continued."""
    from rlft.checkpoint import legacy_weights_match, weights_id, weights_sha256
    from rlft.rollout.journal import recorded_meta

    recorded = (recorded_meta(journal) or {}).get("model_weights")
    if legacy_weights_match(recorded, model):
        return recorded  # the files' fingerprint ([] for a built-in name or Hub id, as weights_id gives)
    return weights_id(model, weights_sha256(model))


JOURNAL_KEYS = ("model", "data", "data_split", "data_heldout", "preset", "split_seed", "heldout_size", "start",
                "prompt_template", "num_samples", "temperature", "top_p", "top_k", "seed", "dtype")
"""The options a journal must share with the run that continues it (with the resolved ``max_new_tokens`` and the
model's :func:`model_weights_id`; each journalled prompt is also checked against this run's)."""


def resolved_max_new_tokens(cfg: PairsConfig) -> int:
    """``cfg.max_new_tokens``, or its default on the device ``cfg`` runs on: 1024 on CUDA, 256 elsewhere."""
    from rlft.models import pick_device

    cuda = pick_device(cfg.device, cfg.dtype).device.type == "cuda"
    return cfg.max_new_tokens or (MAX_NEW_TOKENS_CUDA if cuda else MAX_NEW_TOKENS)


def journal_meta(cfg: PairsConfig, max_new_tokens: int) -> dict:
    """The meta of ``cfg``'s journal: :data:`JOURNAL_KEYS`, the resolved ``max_new_tokens``, the model's weights
    (:func:`model_weights_id`)."""
    return {**{key: getattr(cfg, key) for key in JOURNAL_KEYS}, "max_new_tokens": max_new_tokens,
            "model_weights": model_weights_id(cfg.model, journal_path(cfg.output)),
            **({"env": cfg.env, "max_turns": cfg.max_turns, "max_observation_tokens": cfg.max_observation_tokens}
               if cfg.env == "countdown-calc" else {})}


def _own_stats(path: Path, output: str) -> bool:
    """``path`` is a stats file this command wrote for ``output`` (left behind when the pairs file was removed)."""
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("output") == str(output)


def check_pairs_outputs(cfg: PairsConfig) -> dict:
    """The files ``cfg`` writes may be written: the pairs file and its stats file are new (or ``--overwrite``; a stats
    file this command wrote for the same ``--output`` may be replaced), none is a folder or in a model folder
    (:func:`rlft.run_folder.check_output_file`), and a journal there is this run's (it is continued) or
    ``--overwrite`` is given (it is then replaced). Reads only the journal's first line (and hashes the model's
    weights); writes nothing. Returns the journal meta it checked against (:func:`journal_meta`).

    Raises:
        OutputPathError: see above (a ValueError: the CLI exits with code 2).
    """
    from rlft.rollout.journal import journal_differences
    from rlft.run_folder import OutputPathError, check_output_file

    journal, stats = journal_path(cfg.output), stats_path(cfg.output)
    if journal.is_dir():
        raise OutputPathError(f"--output {cfg.output}: its journal {journal} is a folder; choose another --output")
    meta = journal_meta(cfg, resolved_max_new_tokens(cfg))
    differ = journal_differences(journal, meta)
    if differ and not cfg.overwrite:
        raise OutputPathError(
            f"--output {cfg.output}: the journal {journal} was written by another sampling run (differs in "
            f"{', '.join(differ)}); pass --overwrite to sample again, or choose another --output")
    also = () if stats.is_file() and _own_stats(stats, cfg.output) else (stats,)
    check_output_file(cfg.output, overwrite=cfg.overwrite, also=also)
    return meta


def _validate(cfg: PairsConfig) -> None:
    if not cfg.temperature > 0:
        raise OptionError(
            f"temperature must be > 0 to sample different responses, got {cfg.temperature} "
            "(greedy samples of one prompt are identical and always tie)"
        )
    if cfg.num_samples < 2:
        raise OptionError(f"num_samples must be >= 2 to form a pair, got {cfg.num_samples}")
    if cfg.num_prompts < 1 or cfg.start < 0:
        raise OptionError(f"num_prompts must be >= 1 and start >= 0, got {cfg.num_prompts} and {cfg.start}")


def load_pair_tasks(cfg: PairsConfig) -> list[CountdownTask]:
    """Tasks ``start .. start + num_prompts`` of the generated training split, or of the training rows of
    ``cfg.data`` (its held-out validation and test rows, and rows equal to them, are never sampled):
    :meth:`rlft.tasks.countdown.options.CountdownTrainingOptions.training_tasks`."""
    tasks = cfg.training_tasks(cfg.num_prompts, start=cfg.start)[0]
    if not tasks:
        raise ValueError(f"no Countdown tasks in {cfg.data or cfg.preset}")
    return tasks


def best_and_worst(scores: list[float]) -> tuple[int, int] | None:
    """Indices of the first highest and the first lowest score; None when they are equal (a tie)."""
    best = max(range(len(scores)), key=lambda j: scores[j])
    worst = min(range(len(scores)), key=lambda j: scores[j])
    return None if scores[best] == scores[worst] else (best, worst)


def select_pairs(
    tasks: list[CountdownTask], prompts: list[str], samples: list[list[Sample]], scores: list[list[float]]
) -> tuple[list[dict], dict[str, int]]:
    """One JSONL row per prompt whose scores are not all equal; and the tie counts by tied score."""
    rows, ties = [], {}
    for task, prompt, row_samples, row_scores in zip(tasks, prompts, samples, scores):
        picked = best_and_worst(row_scores)
        if picked is None:
            key = f"{row_scores[0]:g}"
            ties[key] = ties.get(key, 0) + 1
            continue
        best, worst = picked
        rows.append({
            "prompt": prompt,
            "chosen": row_samples[best].text,
            "rejected": row_samples[worst].text,
            "score_chosen": float(row_scores[best]),
            "score_rejected": float(row_scores[worst]),
            "nums": list(task.nums),
            "target": task.target,
            "chosen_finish_reason": row_samples[best].finish_reason,
            "rejected_finish_reason": row_samples[worst].finish_reason,
        })
    return rows, ties


def make_pairs(
    engine: GenerationEngine, tasks: list[CountdownTask], prompts: list[str], params: SamplingParams, *,
    journal: Path | None = None, meta: dict | None = None, progress=None,
) -> tuple[list[dict], dict]:
    """Sample ``params.k`` responses per prompt, score them, keep best vs worst; returns (rows, stats).

    With ``journal``, sampling goes chunk by chunk through :func:`rlft.rollout.journal.sample_with_journal` (every
    finished chunk on disk under ``meta``; a killed run continues where it stopped), and ``stats["sampling_seconds"]``
    is the summed sampling time of every run that wrote it."""
    if journal is not None:
        samples, sampling_seconds = sample_with_journal(engine, prompts, params, journal, meta or {}, progress=progress)
    else:
        t0 = time.perf_counter()
        samples = engine.generate(prompts, params)
        sampling_seconds = time.perf_counter() - t0
    if len(samples) != len(prompts) or any(len(s) != params.k for s in samples):
        raise ValueError(f"the engine must return {len(prompts)} lists of {params.k} samples")
    scores = [
        score_completions([prompt] * params.k, [s.text for s in row], [task.ground_truth()] * params.k)
        for task, prompt, row in zip(tasks, prompts, samples)
    ]
    rows, ties = select_pairs(tasks, prompts, samples, scores)
    flat = [x for row in scores for x in row]
    stats = {
        "prompts": len(prompts),
        "kept": len(rows),
        "dropped_ties": len(prompts) - len(rows),
        "ties_by_score": dict(sorted(ties.items())),
        "samples_per_prompt": params.k,
        "mean_score": sum(flat) / len(flat),
        "accuracy": sum(x == 1.0 for x in flat) / len(flat),
        "kept_chosen_truncated": sum(r["chosen_finish_reason"] == "length" for r in rows),
        "kept_rejected_truncated": sum(r["rejected_finish_reason"] == "length" for r in rows),
        "sampling_seconds": sampling_seconds,
    }
    return rows, stats


def make_countdown_pairs(cfg: PairsConfig, *, engine: GenerationEngine | None = None) -> dict:
    """Build the pairs file ``cfg.output`` and its stats file; returns the stats.

    ``engine`` replaces the model named by ``cfg.model`` (tests, or an engine already loaded).

    Raises:
        ValueError: temperature <= 0, num_samples < 2, unknown preset or template, no tasks.
        UsageError: launched by torchrun; an output that must not be written (:func:`check_pairs_outputs`); both
            before anything is loaded.
        rlft.models.ModelNotFoundError: the model cannot be loaded.
    """
    _validate(cfg)
    from rlft.distributed import require_one_process
    from rlft.models import pick_device
    from rlft.rollout.journal import journal_differences
    from rlft.eval.countdown_command import countdown_env
    from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt

    require_one_process("rlft pairs countdown")
    meta = check_pairs_outputs(cfg)  # its resolved max_new_tokens and the model's weights, hashed once
    t0 = time.perf_counter()
    spec = pick_device(cfg.device, cfg.dtype)
    tasks = load_pair_tasks(cfg)
    if engine is None:
        from rlft.models import load_tokenizer
        from rlft.rollout.engines import make_engine

        engine = make_engine(cfg.rollout_engine, cfg.model, load_tokenizer(cfg.model), spec, url=cfg.rollout_url,
                             batch_size=cfg.batch_size, show_progress=True,
                             add_special_tokens=adds_special_tokens(cfg.prompt_template))
    tokenizer = getattr(engine, "tokenizer", None)
    template, tool_use = countdown_env(cfg)  # --env countdown-calc: the 'calc' prompt and the calculator
    prompts = [render_prompt(template, task, tokenizer) for task in tasks]
    if tool_use is not None:
        from rlft.rollout.turns import WithTools

        engine = WithTools(engine, tool_use, {p: t.ground_truth() for p, t in zip(prompts, tasks)})
    params = SamplingParams(k=cfg.num_samples, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                            max_new_tokens=meta["max_new_tokens"], seed=cfg.seed)
    journal = journal_path(cfg.output)
    if cfg.overwrite and journal_differences(journal, meta):  # another run's samples: --overwrite samples again
        log.warning("--overwrite: removing %s (written by another sampling run)", journal)
        journal.unlink()
    log.info("sampling %d responses for each of %d prompts from %s (journal %s)", cfg.num_samples, len(prompts),
             cfg.model, journal)
    rows, stats = make_pairs(engine, tasks, prompts, params, journal=journal, meta=meta,
                             progress=lambda done, total: log.info("pairs: sampled %d / %d prompts", done, total))

    write_jsonl(cfg.output, rows)
    stats = {**stats, "output": str(cfg.output), "seconds": time.perf_counter() - t0, "config": asdict(cfg)}
    atomic_write_json(stats_path(cfg.output), stats)
    ties = ", ".join(f"all {score}: {n}" for score, n in stats["ties_by_score"].items()) or "none"
    log.info("pairs: %d prompts tried, %d kept, %d dropped as ties (%s); written to %s",
             stats["prompts"], stats["kept"], stats["dropped_ties"], ties, cfg.output)
    if not rows:
        log.warning(
            "no pairs kept: every prompt's responses tied; sample more (--num-samples) or at a higher temperature")
    return stats
