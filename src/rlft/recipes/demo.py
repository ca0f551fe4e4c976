"""`rlft demo`: the Countdown story on one CPU.

base -> SFT on a fixed dataset of solver traces -> RL (the one RL loop, `rlft rl`: by default GRPO with group
filtering and LoRA), and SFT -> on-policy pairs -> DPO (by default without RPO's NLL term, with LoRA); every model
is evaluated on the same held-out tasks and ``runs/<name>/report.md`` gets the results table, the paired table (each
model against the SFT start, task by task), the RL run's held-out score against samples generated, and plots.
The defaults are the ``medium3`` setting and the recipes of ``docs/results/countdown-medium3``, with the RL rate and
DPO loss that did best in ``docs/results/countdown-bounded``. Evaluation sets:

- ``<preset> held-out``: the first ``eval_limit`` generated held-out tasks of the training preset (greedy),
  and the first ``passk_limit`` of them sampled (``passk`` samples at T=0.6, top-p 0.95); no stage trains on
  the first ``heldout_size`` held-out tasks;
- ``standard (generated)``: the Countdown-Tasks-3to4 distribution (3-4 numbers in 1-99), generated;
- ``Countdown-Tasks-3to4 (real), 3 numbers`` and ``..., 4 numbers``: the last rows of each size of the real
  dataset, when a local copy is given or found.

Time budget of the defaults (2-core CPU, SmolLM2-135M in float32): measured 47.7 min before the base model's
evaluation was cut to greedy held-out only and RL's step-0 evaluation dropped; ~44.3 min estimated since (see
the README). Every finished evaluation is saved as JSON; ``--resume`` reuses those and resumes each stage from
its last checkpoint, so a killed demo continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal


from rlft.checkpoint import read_metrics
from rlft.console import console
from rlft.eval.countdown import CountdownEvalResult, evaluate_countdown, paired_difference, print_result
from rlft.eval.report import markdown_table, plot_curve, plot_grouped_bars, plot_samples_vs_score
from rlft.models import DEFAULT_MODEL, load_model, load_tokenizer, pick_device
from rlft.recipes.dpo import DPOConfig, train_dpo
from rlft.recipes.pairs import PairsConfig, make_countdown_pairs
from rlft.recipes.rl import AdvantageName, LossMode, PolicyLossName, RLConfig, train_rl
from rlft.recipes.sft import SFTConfig, train_sft
from rlft.run_folder import claim_run_dir, write_run_config
from rlft.validation import require, validate_options
from rlft.rollout.base import SamplingParams
from rlft.rollout.hf import HFEngine
from rlft.tasks.countdown.generator import PRESETS, generate_tasks, make_splits
from rlft.tasks.countdown.loaders import load_countdown, tail_by_size
from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt
from rlft.types import CountdownTask

log = logging.getLogger("rlft")

REAL_DATA_CANDIDATES = ("../shared/data/countdown/train.parquet", "shared/data/countdown/train.parquet")


@dataclass(frozen=True)
class DemoConfig:
    """Base model -> SFT on Countdown solver traces -> RL and DPO from SFT -> evaluation -> Markdown report with plots."""

    name: str = "countdown"
    """Run name; everything goes to <runs-dir>/<name>/."""
    runs_dir: str = "runs"
    """Parent folder of runs."""
    model: str = DEFAULT_MODEL
    """Base model: built-in name, local HF folder or Hub id."""
    quick: bool = False
    """A few-minute smoke version: tiny data, a handful of steps, short evaluations."""
    preset: str = "medium3"
    """Countdown preset for training and the held-out evaluation (medium3: 3 numbers in 1-25, targets 10-75, 18,644
    distinct solvable tasks, distinct held-out tasks; see docs/results/countdown-medium3)."""
    heldout_size: int = 1000
    """Generated held-out tasks (distinct for medium3) that no stage trains on: SFT, RL and the pair prompts draw
    their tasks from the training split of make_splits(preset, ..., heldout_size, split_seed); every evaluation
    uses a prefix of them."""
    prompt_template: str = "short"
    """Prompt template for training and evaluation: short (compact, CPU-friendly), base (TinyZero), chat."""
    trace_style: str = "direct"
    """SFT trace style: direct (solution steps), search (dead ends, backtracking, check) or bounded (a ranked
    search that may give up and answer its closest attempt; ~48% of the traces are correct, like the spec's
    cog_behav_all_strategies; generations need ~144 tokens: see docs/results/countdown-bounded)."""
    give_up: float = 0.6
    """Bounded traces: probability of giving up after each dead end."""
    max_tries: int = 6
    """Bounded traces: candidates tried at most before giving up."""
    max_dead_ends: int = 2
    """Dead ends shown per search trace."""
    num_train: int = 3000
    """SFT's fixed dataset: one solver trace for each of the first num_train training tasks."""
    sft_steps: int = 125
    """SFT optimizer steps (the documented medium3 curve of 300 cosine steps rises to ~200 steps: 0.375 at 150, 0.415
    at 200 and 300 on 200 tasks; 125 steps of a 125-step schedule keep the demo within its time budget, so the
    demo's SFT start is not the converged one of docs/results/countdown-medium3)."""
    batch_size: int = 16
    """SFT examples per step."""
    micro_batch_size: int = 16
    """SFT examples per forward/backward pass."""
    lr: float = 2e-4
    """SFT peak learning rate (cosine decay, 5% warmup)."""
    rl_steps: int = 12
    """RL steps on the SFT model (`rlft rl`; 0 skips RL)."""
    rl_num_train: int = 20000
    """Training tasks the RL prompts are drawn from (the training split; its first num_train are SFT's)."""
    rl_k: int = 8
    """RL samples per prompt."""
    rl_prompts_per_step: int = 8
    """RL prompt groups trained on per step."""
    rl_advantage: AdvantageName = "grpo"
    """RL advantage estimator (see `rlft rl --advantage`)."""
    rl_loss: PolicyLossName = "ppo"
    """RL policy loss (see `rlft rl --loss`)."""
    rl_loss_mode: LossMode = "seq_mean"
    """RL loss aggregation (see `rlft rl --loss-mode`)."""
    rl_filter_groups: bool = True
    """Drop groups whose k rewards are all equal and refill the step from further prompts (see `rlft rl --filter-groups`)."""
    rl_max_prompt_batches: int = 3
    """With rl_filter_groups: at most this many batches of rl_prompts_per_step prompts are sampled per step."""
    rl_lora_r: int = 16
    """RL LoRA rank (0: full fine-tuning)."""
    rl_lora_alpha: float = 32.0
    """RL LoRA alpha."""
    rl_lr: float = 2e-4
    """RL learning rate (constant; 2e-4 is the best LoRA rate of docs/results/countdown-bounded, full fine-tuning
    wants ~1e-6 to 5e-6)."""
    rl_beta: float = 0.0
    """RL KL coefficient (0: no reference model and no KL)."""
    rl_temperature: float = 1.0
    """RL sampling temperature (log-probs are taken at the same temperature)."""
    update_micro_batch_size: int = 32
    """Sequences per forward/backward pass of the RL and DPO updates (gradient accumulation is exact, so this trades
    memory for speed only; 8 keeps 144-token runs such as --trace-style bounded within 24 GB)."""
    rl_eval_every: int = 5
    """Greedy evaluation on the first rl_eval_limit held-out tasks every N RL steps and at the end: the points of the
    samples-vs-score plot, which starts from the SFT model's score on the same tasks (no step-0 evaluation; 0: none)."""
    rl_eval_limit: int = 100
    """Held-out tasks of the in-loop RL evaluation."""
    pairs_prompts: int = 480
    """Training prompts (after SFT's num_train) sampled for on-policy DPO pairs (0 skips pairs and DPO)."""
    pairs_samples: int = 2
    """Samples per prompt from the SFT model; the pair is best vs worst score, ties dropped."""
    pairs_temperature: float = 1.0
    """Sampling temperature of the on-policy pairs."""
    dpo_epochs: float = 2.0
    """DPO epochs over the kept pairs."""
    dpo_batch_size: int = 32
    """DPO pairs per step."""
    dpo_lr: float = 1e-4
    """DPO peak learning rate (cosine, 10% warmup)."""
    dpo_optimizer: Literal["adamw", "sgd"] = "adamw"
    """DPO optimizer (see `rlft dpo --optimizer`)."""
    dpo_beta: float = 0.1
    """DPO beta."""
    dpo_loss_type: Literal["dpo", "ipo", "rpo"] = "dpo"
    """Preference loss: dpo, ipo, or rpo (DPO + dpo_rpo_alpha * NLL of the chosen response). dpo: without the NLL
    term DPO scored level with or above RPO on the same pairs (docs/results/countdown-medium3, session 8); in
    docs/results/countdown-bounded the two are level (+0.003 [-0.005, +0.012]), each ~+0.02 above its SFT start."""
    dpo_rpo_alpha: float = 1.0
    """Weight of the chosen-response NLL when dpo_loss_type is rpo."""
    dpo_lora_r: int = 16
    """DPO LoRA rank (0: full fine-tuning)."""
    dpo_lora_alpha: float = 32.0
    """DPO LoRA alpha."""
    passk: int = 4
    """Samples per task of the sampled evaluation on the held-out set (mean score, pass@1, pass@k; 0 skips it)."""
    passk_temperature: float = 0.6
    """Sampling temperature of the sampled evaluation."""
    passk_top_p: float = 0.95
    """Nucleus mass of the sampled evaluation."""
    passk_limit: int = 100
    """Held-out tasks in the sampled evaluation (the first N)."""
    eval_limit: int = 200
    """Held-out tasks of the training preset evaluated greedily (the first N; at most heldout_size)."""
    standard_limit: int = 50
    """Generated standard-distribution tasks to evaluate (0 to skip)."""
    real_data: str | None = "auto"
    """Countdown-Tasks-3to4 file for the real-data evaluation; 'auto' looks for ../shared/data/countdown/train.parquet; None skips."""
    real_limit: int = 50
    """Real tasks to evaluate per number count: the last N 3-number rows and the last N 4-number rows of the file,
    reported as two sets."""
    max_new_tokens: int = 64
    """Most generated tokens per completion (traces are 30-70 tokens; the reference uses >= 1024 on GPU)."""
    eval_batch_size: int = 50
    """Sequences generated together during evaluation."""
    split_seed: int = 1234
    """Seed of the generated train/held-out split."""
    seed: int = 0
    """Training seed."""
    resume: bool = False
    """Reuse finished evaluations, models and pairs, and resume an unfinished stage from its last checkpoint."""
    overwrite: bool = False
    """Start over in a runs_dir/name folder that holds an earlier demo: it is moved aside to <name>.replaced-<time>
    (logged). Without it (or --resume) such a folder is refused."""
    keep_checkpoints: bool = False
    """Keep each stage's resumable checkpoints (weights + optimizer state, ~1.5 GB each for the 135M model) after
    its final model is saved; by default they are deleted then, as a finished stage resumes from its model."""
    device: str = "auto"
    """'auto', 'cpu', 'cuda', ..."""
    dtype: str = "auto"
    """'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16'."""
    track: Literal["countdown", "ultrafeedback"] = "countdown"
    """countdown: the Countdown story above. ultrafeedback: preference data -> SFT (or Pref-FT), DPO, reward model,
    RLOO with that reward model, win-rates judged by it (rlft.recipes.demo_ultrafeedback; run name 'ultrafeedback'
    unless --name is given). It reads --data and the --uf-* options, plus model, name, runs_dir, quick, dpo_beta,
    eval_batch_size, split_seed, seed, resume, device, dtype; the other options are Countdown's.
    Its small --uf-* defaults fit 36 of 45 minutes (measured) on a 2-core CPU with the 135M model in float32 (the token budget
    of each stage is in that module's docstring); --quick shrinks them to a smoke test."""
    data: str | None = None
    """UltraFeedback track: preference pairs, a .jsonl/.json/.parquet file or Hub id (flattened
    prompt/chosen/rejected strings, H4 message lists, HH-RLHF). None: ../shared/data/ultrafeedback/train_clean.jsonl
    when present, else HuggingFaceH4/ultrafeedback_binarized from the Hub. Only the first 2000 rows are read."""
    uf_data_split: str = "train_prefs"
    """UltraFeedback track: split of --data when it is a Hub id (H4: train_prefs; trl-lib: train)."""
    uf_sft_data: str | None = None
    """UltraFeedback track: SmolTalk (messages rows: a file or Hub id such as HuggingFaceTB/smol-smoltalk) for the
    SFT stage. None, or a source that cannot be read (offline): Pref-FT on the chosen replies of the training pairs."""
    uf_train_pairs: int = 400
    """UltraFeedback track: training pairs (ties included; DPO and the reward model drop them, ~11%), sampled (seeded
    by split_seed) from pairs whose prompts are not held out. The reward model trains on all of them (uf_rm_steps);
    SFT and DPO on the first uf_sft_steps x 8 and uf_pref_steps x 8."""
    uf_eval_prompts: int = 96
    """UltraFeedback track: held-out prompts (disjoint from training) for the win-rates; the reward model's
    held-out accuracy is measured on their non-tie pairs."""
    uf_max_length: int = 192
    """UltraFeedback track: longest prompt + reply in tokens for SFT, DPO and the reward model (UF replies
    are longer: most are truncated, and counted). Only pairs whose rendered prompt is at most
    uf_max_length - uf_max_new_tokens tokens are used (the others are set aside, counted)."""
    uf_max_new_tokens: int = 64
    """UltraFeedback track: most generated tokens per reply (RLOO samples, win-rate responses)."""
    uf_sft_steps: int = 30
    """UltraFeedback track: SFT optimizer steps of 8 conversations."""
    uf_pref_steps: int = 24
    """UltraFeedback track: DPO optimizer steps, each of 8 pairs (one epoch of the first uf_pref_steps x 8 pairs)."""
    uf_rm_steps: int = 45
    """UltraFeedback track: reward-model optimizer steps of 8 pairs (~one epoch of the non-tie training pairs)."""
    uf_rm_train_layers: int | None = 6
    """UltraFeedback track: the reward model trains only its top N blocks, final norm and head (None: all); with 6 of
    SmolLM2-135M's 30 blocks a step costs ~2.6x less, so it sees about twice the pairs of DPO in less time."""
    uf_rm_head_lr: float = 1e-3
    """UltraFeedback track: learning rate of the reward model's new score head (the body uses 5e-5)."""
    uf_rm_head_init: Literal["normal", "zero"] = "normal"
    """UltraFeedback track: init of the new score head: normal N(0, 1/(d+1)) or zero (rewards start at 0)."""
    uf_rloo_steps: int = 10
    """UltraFeedback track: RLOO steps of 4 prompts x uf_rloo_k samples, rewarded by the trained reward model."""
    uf_rloo_k: int = 4
    """UltraFeedback track: RLOO samples per prompt."""
    uf_rloo_beta: float = 0.001
    """UltraFeedback track: RLOO KL coefficient (a learned reward can be gamed, so the KL to SFT stays on)."""
    uf_truncation_penalty: float | None = -1.0
    """UltraFeedback track: added to the reward-model score of RLOO samples that hit uf_max_new_tokens without
    ending their turn (about one Bradley-Terry logit: a reply that finishes beats a cut one unless the reward
    model rates the cut one a logit higher); None: off."""

    def __post_init__(self) -> None:
        validate_options(self)
        require(self.eval_limit <= self.heldout_size and self.rl_eval_limit <= self.heldout_size,
                f"--eval-limit ({self.eval_limit}) and --rl-eval-limit ({self.rl_eval_limit}) must be <= --heldout-size "
                f"({self.heldout_size}) so evaluation tasks are never trained on")
        # DPOConfig checks this too, but only once the DPO stage starts: here it fails before SFT and RL run
        require(self.dpo_batch_size % self.dpo_micro_batch_size == 0,
                f"--dpo-batch-size ({self.dpo_batch_size}) must be a multiple of --update-micro-batch-size "
                f"({self.update_micro_batch_size}) when it is the larger")
        require(self.passk_limit <= self.eval_limit,
                f"--passk-limit ({self.passk_limit}) must be <= --eval-limit ({self.eval_limit}): the sampled evaluation uses a prefix of the greedy one's tasks")

    @property
    def dpo_micro_batch_size(self) -> int:
        """Pairs per forward/backward pass of the DPO update: ``update_micro_batch_size``, at most ``dpo_batch_size``."""
        return min(self.update_micro_batch_size, self.dpo_batch_size)

    def effective(self) -> "DemoConfig":
        """This config, with the small sizes of ``--quick`` applied when it is set."""
        if not self.quick:
            return self
        return replace(self, num_train=64, sft_steps=4, batch_size=8, micro_batch_size=8, eval_limit=8,
                       standard_limit=4, real_limit=4, max_new_tokens=32, rl_steps=2, rl_num_train=64, rl_k=4,
                       rl_prompts_per_step=2, rl_max_prompt_batches=2, rl_eval_every=1, rl_eval_limit=4,
                       pairs_prompts=8, pairs_samples=2, dpo_batch_size=2, passk=2, passk_limit=4,
                       uf_train_pairs=16, uf_eval_prompts=6, uf_max_length=96, uf_max_new_tokens=16, uf_sft_steps=2,
                       uf_pref_steps=2, uf_rm_steps=2, uf_rloo_steps=2)


def _real_data_path(cfg: DemoConfig) -> Path | None:
    if cfg.real_data is None:
        return None
    if cfg.real_data != "auto":
        return Path(cfg.real_data)
    return next((Path(p) for p in REAL_DATA_CANDIDATES if Path(p).is_file()), None)


def heldout_set(cfg: DemoConfig) -> str:
    """Name of the held-out evaluation set (``"medium3 held-out"``): every model's paired comparison is on it."""
    return f"{cfg.preset} held-out"


def eval_sets(cfg: DemoConfig) -> dict[str, list[CountdownTask]]:
    """The named evaluation sets of the demo (see the module docstring); the held-out set comes first."""
    sets = {heldout_set(cfg): make_splits(PRESETS[cfg.preset], 0, cfg.eval_limit, cfg.split_seed)[1]}
    if cfg.standard_limit:
        sets["standard (generated)"] = generate_tasks(PRESETS["standard"], cfg.standard_limit, seed=f"demo-standard-{cfg.split_seed}")
    real = _real_data_path(cfg)
    if real is not None and cfg.real_limit:
        for count, tasks in tail_by_size(load_countdown(str(real)), cfg.real_limit).items():
            if tasks:
                sets[f"Countdown-Tasks-3to4 (real), {count} numbers"] = tasks
    elif cfg.real_data == "auto":
        log.info("no local Countdown-Tasks-3to4 copy found (%s); skipping the real-data evaluation", ", ".join(REAL_DATA_CANDIDATES))
    return sets


SAMPLED_SET = "sampled"
"""Name of the sampled evaluation (``passk`` samples on the first ``passk_limit`` held-out tasks)."""


def _eval_jobs(cfg: DemoConfig, sets: dict[str, list[CountdownTask]], sampled: bool = True) -> dict[str, tuple[list[CountdownTask], SamplingParams]]:
    """Every evaluation of one model: greedy on each set, plus (``sampled``) the sampled evaluation on the held-out set."""
    greedy = SamplingParams(k=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    jobs = {name: (tasks, greedy) for name, tasks in sets.items()}
    if cfg.passk and sampled:
        sampling = SamplingParams(k=cfg.passk, temperature=cfg.passk_temperature, top_p=cfg.passk_top_p,
                                  max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
        jobs[SAMPLED_SET] = (sets[heldout_set(cfg)][: cfg.passk_limit], sampling)
    return jobs


def eval_file(out_dir: Path, label: str, set_name: str) -> Path:
    """Where the evaluation of model ``label`` on ``set_name`` is saved: ``medium3 held-out`` -> ``<label>--medium3-held-out.json``."""
    return out_dir / f"{label}--{re.sub(r'[^a-z0-9]+', '-', set_name.lower()).strip('-')}.json"


def evaluate_model(model_name: str, label: str, sets: dict[str, list[CountdownTask]], cfg: DemoConfig, out_dir: Path,
                   sampled: bool = True) -> dict[str, CountdownEvalResult]:
    """Evaluate one model on every job of :func:`_eval_jobs`; results cached as JSON in ``out_dir``."""
    jobs = _eval_jobs(cfg, sets, sampled)
    results, todo = {}, {}
    for set_name in jobs:
        path = eval_file(out_dir, label, set_name)
        cached = CountdownEvalResult.from_dict(json.loads(path.read_text())) if cfg.resume and path.is_file() else None
        tasks, params = jobs[set_name]
        if cached is not None and cached.k == params.k and len(cached.task_scores) == len(tasks):
            results[set_name] = cached
            log.info("reusing %s", path)
        else:  # not resuming, or a cached result of another size (or from before per-task scores were kept)
            todo[set_name] = path
    if todo:
        spec = pick_device(cfg.device, cfg.dtype)
        tokenizer = load_tokenizer(model_name)
        engine = HFEngine(load_model(model_name, spec), tokenizer, batch_size=cfg.eval_batch_size, show_progress=True,
                        add_special_tokens=adds_special_tokens(cfg.prompt_template))
        for set_name, path in todo.items():
            tasks, params = jobs[set_name]
            prompts = [render_prompt(cfg.prompt_template, t, tokenizer) for t in tasks]
            result = evaluate_countdown(engine, tasks, prompts, params)
            print_result(result, title=f"{label} on {set_name}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result.to_dict(), indent=2))
            results[set_name] = result
    return {name: results[name] for name in jobs}


def _curve_section(title: str, metrics_path: Path, keys: list[tuple[str, str]], png_dir: Path) -> str:
    records = read_metrics(metrics_path)
    if not records:
        return ""
    lines = [f"### {title}", ""]
    for key, label in keys:
        if any(key in r for r in records):
            png = plot_curve(records, key, png_dir / f"{key.replace('/', '_')}.png", title=f"{title}: {label}")
            last = [r[key] for r in records if key in r][-1]
            lines += [f"{label}: last {last:.3f}.", "", f"![{label}]({png.name})", ""]
    return "\n".join(lines)


def _paired_section(cfg: DemoConfig, results: dict[str, dict[str, CountdownEvalResult]], held_out: str) -> str:
    """Each model against the SFT start, task by task: greedy on the held-out set, and sampled when evaluated."""
    if "sft" not in results:
        return ""
    sft = results["sft"]
    header = ["comparison", "tasks", "greedy score difference", "95% CI", "tasks better", "tasks worse"]
    if cfg.passk:
        header += [f"sampled score difference [95% CI] ({min(cfg.passk_limit, cfg.eval_limit)} tasks)"]
    rows = []
    for model, by_set in results.items():
        if model == "sft":
            continue
        d = paired_difference(by_set[held_out].task_scores, sft[held_out].task_scores)
        row = [f"{model} - sft", d["n"], f"{d['diff']:+.3f}", f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]", d["better"], d["worse"]]
        if cfg.passk and SAMPLED_SET in by_set:
            s = paired_difference(by_set[SAMPLED_SET].task_scores, sft[SAMPLED_SET].task_scores)
            row.append(f"{s['diff']:+.3f} [{s['ci_low']:+.3f}, {s['ci_high']:+.3f}]")
        elif cfg.passk:
            row.append("-")
        rows.append(row)
    if not rows:
        return ""
    return ("## Paired against the SFT start\n\n"
            "Each model minus SFT on the same held-out tasks: the mean per-task score difference with its 95% CI (normal\n"
            "approximation), and the tasks where the model scores higher / lower than SFT (greedy).\n\n"
            + markdown_table(header, rows) + "\n")


def _samples_vs_score_section(cfg: DemoConfig, run_dir: Path, results: dict[str, dict[str, CountdownEvalResult]], held_out: str) -> str:
    """The RL run's held-out score against samples generated (its in-loop evaluations), from the SFT start."""
    records = read_metrics(run_dir / "rl" / "metrics.jsonl")
    start = None  # SFT's greedy score on the in-loop tasks (a prefix of its held-out evaluation), for a run without a step-0 point
    if "sft" in results:
        scores = results["sft"][held_out].task_scores[: cfg.rl_eval_limit]
        start = sum(row[0] for row in scores) / len(scores)
    png = plot_samples_vs_score({"rl": records}, run_dir / "samples_vs_score.png", start=start,
                                ylabel=f"greedy score (first {cfg.rl_eval_limit} held-out tasks)",
                                title="RL from SFT: held-out score against samples generated")
    if png is None:
        return ""
    points = [(int(r["samples/total"]), r["eval/score"]) for r in records if "eval/score" in r]
    steps = [f"{score:.3f} ({n:,} samples)" for n, score in points]
    if start is not None and not any(n == 0 for n, _ in points):  # no step-0 evaluation: start from SFT's score
        steps.insert(0, f"{start:.3f} (SFT, 0 samples)")
    trail = " -> ".join(steps)
    return (f"## Held-out score against samples generated (RL)\n\nGreedy score of the RL policy on the first {cfg.rl_eval_limit} "
            f"held-out tasks, evaluated during training: {trail}. Samples generated include the groups group filtering dropped.\n\n"
            f"![samples vs score]({png.name})\n")


def write_report(cfg: DemoConfig, run_dir: Path, results: dict[str, dict[str, CountdownEvalResult]], sets: dict[str, list[CountdownTask]], timings: dict[str, float], notes: list[str]) -> Path:
    """``report.md`` with the results tables, the paired table, plots and example completions; returns its path."""
    held_out = heldout_set(cfg)
    plot_grouped_bars({s: {m: results[m][s].mean_score for m in results if s in results[m]} for s in sets}, run_dir / "scores.png", title="Countdown mean score by model (greedy)", ylabel="mean score")
    header = ["model", "mean score", "accuracy", "format rate", "truncated"]
    if cfg.passk:
        header += ["sampled score", "pass@1", f"pass@{cfg.passk}"]
    main_rows = []
    for model, by_set in results.items():
        r = by_set[held_out]
        row = [model, r.mean_score, r.accuracy, r.format_rate, r.truncated_rate]
        if cfg.passk and SAMPLED_SET in by_set:
            sampled = by_set[SAMPLED_SET]
            row += [sampled.mean_score, sampled.pass_at_k[1], sampled.pass_at_k[cfg.passk]]
        elif cfg.passk:
            row += ["-", "-", "-"]
        main_rows.append(row)
    n_sampled = min(cfg.passk_limit, len(sets[held_out]))
    sampled_note = (f"Sampled columns: {cfg.passk} samples per task at temperature {cfg.passk_temperature}, top-p {cfg.passk_top_p}, on the "
                    f"first {n_sampled} held-out tasks (mean score over all samples; pass@k unbiased estimator)." if cfg.passk else "")
    other_rows = [[model, s, len(sets[s]), r.mean_score, r.accuracy, r.format_rate]
                  for model in results for s, r in results[model].items() if s not in (held_out, SAMPLED_SET)]
    examples = []
    for model in results:
        for ex in results[model][held_out].examples[:2]:
            examples.append(f"**{model}**, nums {ex['nums']} target {ex['target']}, score {ex['score']}:\n\n```\n{ex['completion'].strip()}\n```")
    curves = [
        _curve_section("SFT", run_dir / "sft" / "metrics.jsonl", [("loss/sft", "training loss")], run_dir),
        _curve_section("RL", run_dir / "rl" / "metrics.jsonl", [("reward/mean", "mean reward of the samples per step"), ("reward/accuracy", "accuracy of the samples per step"),
                                                               ("groups/kept", "varied groups kept per step"), ("kl/mean", "KL to SFT")], run_dir),
        _curve_section("DPO", run_dir / "dpo" / "metrics.jsonl", [("loss/dpo", "loss"), ("rewards/accuracy", "implicit reward accuracy")], run_dir),
    ]
    def lora(r: int) -> str:
        return f"LoRA r={r}" if r else "full fine-tuning"

    rl_recipe = (f"RL from SFT (`rlft rl`: {cfg.rl_advantage} advantages, {cfg.rl_loss} loss ({cfg.rl_loss_mode})"
                 f"{f', group filtering (at most {cfg.rl_max_prompt_batches} prompt batches per step)' if cfg.rl_filter_groups else ''}, "
                 f"{lora(cfg.rl_lora_r)}, lr {cfg.rl_lr}; {cfg.rl_steps} steps of {cfg.rl_prompts_per_step} prompts x k={cfg.rl_k} "
                 f"at temperature {cfg.rl_temperature}, beta {cfg.rl_beta})")
    dpo_recipe = (f"{cfg.dpo_loss_type.upper()}{f' (NLL weight {cfg.dpo_rpo_alpha})' if cfg.dpo_loss_type == 'rpo' else ''} from SFT on "
                  f"on-policy pairs ({cfg.pairs_prompts} prompts x {cfg.pairs_samples} samples of the SFT model at temperature "
                  f"{cfg.pairs_temperature}, best vs worst, ties dropped; {cfg.dpo_epochs:g} epochs in batches of {cfg.dpo_batch_size}, "
                  f"{lora(cfg.dpo_lora_r)}, {cfg.dpo_optimizer} lr {cfg.dpo_lr}, beta {cfg.dpo_beta})")
    text = f"""# rlft Countdown demo: {cfg.name}

Base model `{cfg.model}`. SFT on a fixed dataset of {cfg.num_train} `{cfg.trace_style}` solver traces of `{cfg.preset}` training
tasks ({cfg.sft_steps} steps of {cfg.batch_size}, lr {cfg.lr}, cosine); {rl_recipe}; {dpo_recipe}. Prompt template
`{cfg.prompt_template}`. No stage trains on the first {cfg.heldout_size} held-out `{cfg.preset}` tasks; every evaluation uses
a prefix of them. Scores use the TinyZero-exact `compute_score` (1.0 correct, 0.1 answer present but wrong, 0 no answer).

## Held-out tasks: {held_out} ({len(sets[held_out])} tasks, greedy, at most {cfg.max_new_tokens} new tokens)

{markdown_table(header, main_rows)}

{sampled_note}

{_paired_section(cfg, results, held_out)}
![scores](scores.png)

{_samples_vs_score_section(cfg, run_dir, results, held_out)}
## Other evaluation sets (greedy)

{markdown_table(["model", "eval set", "tasks", "mean score", "accuracy", "format rate"], other_rows) if other_rows else "none"}

## Training curves

{chr(10).join(c for c in curves if c)}

## Notes

{chr(10).join(f"- {n}" for n in notes) if notes else "none"}

## Timings

{markdown_table(["stage", "seconds"], [[k, f"{v:.0f}"] for k, v in timings.items()])}

## Example completions ({held_out})

{chr(10).join(examples)}
"""
    path = run_dir / "report.md"
    path.write_text(text)
    return path


class _Timer:
    def __init__(self, timings: dict[str, float], name: str):
        self.timings, self.name = timings, name

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.timings[self.name] = time.perf_counter() - self.t0


def _done(folder: Path, cfg: DemoConfig) -> bool:
    return cfg.resume and (folder / "config.json").is_file()


def drop_checkpoints(model_dir: Path | None, cfg: DemoConfig) -> None:
    """Delete the checkpoints/ beside a stage's finished ``model_dir`` unless ``cfg.keep_checkpoints``."""
    if model_dir is not None and not cfg.keep_checkpoints and (Path(model_dir) / "config.json").is_file():
        shutil.rmtree(Path(model_dir).parent / "checkpoints", ignore_errors=True)


def run_demo(cfg: DemoConfig) -> Path:
    """Run the demo; returns the report path. Stages whose output exists are skipped with --resume."""
    if cfg.track == "ultrafeedback":
        from rlft.recipes.demo_ultrafeedback import run_ultrafeedback_demo

        return run_ultrafeedback_demo(cfg)
    cfg = cfg.effective()
    run_dir = claim_run_dir(cfg, Path(cfg.runs_dir) / cfg.name).open()  # an earlier demo: --resume or --overwrite
    write_run_config(run_dir, cfg)
    sets = eval_sets(cfg)
    timings: dict[str, float] = {}
    notes: list[str] = []
    common = dict(split_seed=cfg.split_seed, heldout_size=cfg.heldout_size, prompt_template=cfg.prompt_template,
                  seed=cfg.seed, resume=cfg.resume, device=cfg.device, dtype=cfg.dtype)

    with _Timer(timings, "evaluate base"):  # greedy on the held-out set only: the untuned model writes no answer
        held_out = heldout_set(cfg)        # (0.000 everywhere, 250 s of the 45-minute budget when it ran every set)
        results = {"base": evaluate_model(cfg.model, "base", {held_out: sets[held_out]}, cfg, run_dir / "eval", sampled=False)}

    sft = run_dir / "sft" / "model"
    with _Timer(timings, "SFT"):
        if not _done(sft, cfg):
            sft = train_sft(SFTConfig(
                model=cfg.model, data="countdown", preset=cfg.preset, num_train=cfg.num_train, trace_style=cfg.trace_style,
                max_dead_ends=cfg.max_dead_ends, give_up=cfg.give_up, max_tries=cfg.max_tries, output_dir=str(run_dir / "sft"), max_length=256, batch_size=cfg.batch_size,
                micro_batch_size=cfg.micro_batch_size, max_steps=cfg.sft_steps, lr=cfg.lr, save_every=max(cfg.sft_steps // 4, 1), **common))
        drop_checkpoints(sft, cfg)
    with _Timer(timings, "evaluate SFT"):
        results["sft"] = evaluate_model(str(sft), "sft", sets, cfg, run_dir / "eval")

    if cfg.rl_steps:
        rl = run_dir / "rl" / "model"
        with _Timer(timings, "RL"):
            if not _done(rl, cfg):
                rl = train_rl(RLConfig(
                    model=str(sft), preset=cfg.preset, num_train=cfg.rl_num_train, output_dir=str(run_dir / "rl"),
                    advantage=cfg.rl_advantage, loss=cfg.rl_loss, loss_mode=cfg.rl_loss_mode, filter_groups=cfg.rl_filter_groups,
                    max_prompt_batches=cfg.rl_max_prompt_batches, lora_r=cfg.rl_lora_r, lora_alpha=cfg.rl_lora_alpha,
                    k=cfg.rl_k, prompts_per_step=cfg.rl_prompts_per_step, max_steps=cfg.rl_steps, lr=cfg.rl_lr, beta=cfg.rl_beta,
                    temperature=cfg.rl_temperature, max_new_tokens=cfg.max_new_tokens, micro_batch_size=cfg.update_micro_batch_size,
                    gen_batch_size=cfg.rl_k * cfg.rl_prompts_per_step, eval_every=cfg.rl_eval_every, eval_at_start=False,
                    eval_limit=cfg.rl_eval_limit, eval_max_new_tokens=cfg.max_new_tokens, save_every=max(cfg.rl_steps // 3, 1),
                    **common))
            drop_checkpoints(rl, cfg)
        with _Timer(timings, "evaluate RL"):
            results["rl"] = evaluate_model(str(rl), "rl", sets, cfg, run_dir / "eval")

    if cfg.pairs_prompts:
        pairs_path = run_dir / "pairs" / "countdown.jsonl"
        with _Timer(timings, "on-policy pairs"):
            if not (cfg.resume and pairs_path.is_file()):
                make_countdown_pairs(PairsConfig(
                    model=str(sft), preset=cfg.preset, num_prompts=cfg.pairs_prompts, start=cfg.num_train,
                    split_seed=cfg.split_seed, heldout_size=cfg.heldout_size, prompt_template=cfg.prompt_template,
                    num_samples=cfg.pairs_samples, temperature=cfg.pairs_temperature, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
                    output=str(pairs_path), seed=cfg.seed, device=cfg.device, dtype=cfg.dtype))
        stats = json.loads(pairs_path.with_suffix(".stats.json").read_text())
        notes.append(f"on-policy pairs: {stats['prompts']} prompts tried, {stats['kept']} kept, {stats['dropped_ties']} dropped as ties")
        dpo = run_dir / "dpo" / "model"
        with _Timer(timings, "DPO"):
            if stats["kept"] == 0:
                notes.append("DPO skipped: every sampled pair was a tie")
                dpo = None
            elif not _done(dpo, cfg):
                dpo = train_dpo(DPOConfig(
                    model=str(sft), data=str(pairs_path), output_dir=str(run_dir / "dpo"), beta=cfg.dpo_beta, loss_type=cfg.dpo_loss_type,
                    rpo_alpha=cfg.dpo_rpo_alpha, lora_r=cfg.dpo_lora_r, lora_alpha=cfg.dpo_lora_alpha, max_length=256,
                    batch_size=cfg.dpo_batch_size, micro_batch_size=cfg.dpo_micro_batch_size, epochs=cfg.dpo_epochs, lr=cfg.dpo_lr,
                    optimizer=cfg.dpo_optimizer, save_every=5, seed=cfg.seed, resume=cfg.resume, device=cfg.device, dtype=cfg.dtype))
            drop_checkpoints(dpo, cfg)
        if dpo is not None:
            with _Timer(timings, "evaluate DPO"):
                results["dpo"] = evaluate_model(str(dpo), "dpo", sets, cfg, run_dir / "eval")

    timings["total"] = sum(timings.values())
    report = write_report(cfg, run_dir, results, sets, timings, notes)
    console.print(f"[bold green]Report written to {report}[/]")
    return report
