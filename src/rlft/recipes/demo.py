"""`rlft demo`: the Countdown story on one CPU in under 30 minutes.

Evaluate the base model, fine-tune it on solver-written reasoning traces (SFT), evaluate again,
and write ``runs/<name>/report.md`` with a table and plots. Evaluation sets:

- ``<preset> held-out``: generated tasks of the training preset that SFT never saw;
- ``standard (generated)``: the Countdown-Tasks-3to4 distribution (3-4 numbers in 1-99), generated;
- ``Countdown-Tasks-3to4 (real)``: rows of the real dataset, when a local copy is given or found.

Every finished evaluation is saved as JSON; ``--resume`` reuses those and resumes SFT from its last
checkpoint, so a killed demo continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from rlft.checkpoint import read_metrics
from rlft.console import console
from rlft.eval.countdown import CountdownEvalResult, evaluate_countdown, print_result
from rlft.eval.report import markdown_table, plot_curve, plot_grouped_bars
from rlft.models import DEFAULT_MODEL, load_model, load_tokenizer, pick_device
from rlft.recipes.sft import SFTConfig, train_sft
from rlft.rollout.base import SamplingParams
from rlft.rollout.hf import HFEngine
from rlft.tasks.countdown.generator import PRESETS, generate_tasks, make_splits
from rlft.tasks.countdown.loaders import load_countdown
from rlft.tasks.countdown.prompts import render_prompt
from rlft.types import CountdownTask

log = logging.getLogger("rlft")

REAL_DATA_CANDIDATES = ("../shared/data/countdown/train.parquet", "shared/data/countdown/train.parquet")


@dataclass(frozen=True)
class DemoConfig:
    """Base model -> SFT on Countdown solver traces -> evaluation -> Markdown report with plots."""

    name: str = "countdown"
    """Run name; everything goes to <runs-dir>/<name>/."""
    runs_dir: str = "runs"
    """Parent folder of runs."""
    model: str = DEFAULT_MODEL
    """Base model: built-in name, local HF folder or Hub id."""
    quick: bool = False
    """A few-minute smoke version: tiny data, a handful of steps, short evaluations."""
    preset: str = "easy3"
    """Countdown preset for training and the held-out evaluation (easy3: 3 numbers in 1-9, targets 10-30)."""
    prompt_template: str = "short"
    """Prompt template for training and evaluation: short (compact, CPU-friendly), base (TinyZero), chat."""
    trace_style: str = "direct"
    """SFT trace style: direct (solution steps) or search (dead ends, backtracking, check)."""
    max_dead_ends: int = 2
    """Dead ends shown per search trace."""
    num_train: int = 2000
    """Generated training tasks."""
    sft_steps: int = 100
    """SFT optimizer steps."""
    batch_size: int = 16
    """SFT examples per step."""
    micro_batch_size: int = 16
    """SFT examples per forward/backward pass."""
    lr: float = 3e-4
    """SFT peak learning rate (cosine decay, 5% warmup)."""
    eval_limit: int = 100
    """Held-out tasks of the training preset to evaluate (at most SFT's heldout_size, 200)."""
    standard_limit: int = 50
    """Generated standard-distribution tasks to evaluate (0 to skip)."""
    real_data: str | None = "auto"
    """Countdown-Tasks-3to4 file for the real-data evaluation; 'auto' looks for ../shared/data/countdown/train.parquet; None skips."""
    real_limit: int = 50
    """Real tasks to evaluate (the last N rows of the file)."""
    max_new_tokens: int = 96
    """Most generated tokens per completion (traces are 30-70 tokens; the reference uses >= 1024 on GPU)."""
    eval_batch_size: int = 50
    """Sequences generated together during evaluation."""
    split_seed: int = 1234
    """Seed of the generated train/held-out split."""
    seed: int = 0
    """Training seed."""
    resume: bool = False
    """Reuse finished evaluations and resume SFT from its last checkpoint."""
    device: str = "auto"
    """'auto', 'cpu', 'cuda', ..."""
    dtype: str = "auto"
    """'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16'."""

    def effective(self) -> "DemoConfig":
        """This config, with the small sizes of ``--quick`` applied when it is set."""
        if not self.quick:
            return self
        return replace(self, num_train=64, sft_steps=4, batch_size=8, micro_batch_size=8, eval_limit=8,
                       standard_limit=4, real_limit=4, max_new_tokens=32)


def _real_data_path(cfg: DemoConfig) -> Path | None:
    if cfg.real_data is None:
        return None
    if cfg.real_data != "auto":
        return Path(cfg.real_data)
    return next((Path(p) for p in REAL_DATA_CANDIDATES if Path(p).is_file()), None)


def eval_sets(cfg: DemoConfig) -> dict[str, list[CountdownTask]]:
    """The named evaluation sets of the demo (see the module docstring)."""
    sets = {f"{cfg.preset} held-out": make_splits(PRESETS[cfg.preset], 0, cfg.eval_limit, cfg.split_seed)[1]}
    if cfg.standard_limit:
        sets["standard (generated)"] = generate_tasks(PRESETS["standard"], cfg.standard_limit, seed=f"demo-standard-{cfg.split_seed}")
    real = _real_data_path(cfg)
    if real is not None and cfg.real_limit:
        total = len(load_countdown(str(real)))
        sets["Countdown-Tasks-3to4 (real)"] = load_countdown(str(real), start=max(0, total - cfg.real_limit))
    elif cfg.real_data == "auto":
        log.info("no local Countdown-Tasks-3to4 copy found (%s); skipping the real-data evaluation", ", ".join(REAL_DATA_CANDIDATES))
    return sets


def evaluate_model(model_name: str, label: str, sets: dict[str, list[CountdownTask]], cfg: DemoConfig, out_dir: Path) -> dict[str, CountdownEvalResult]:
    """Greedy evaluation of one model on every set; results cached as JSON in ``out_dir``."""
    results, todo = {}, {}
    for set_name in sets:
        path = out_dir / f"{label}--{set_name.split()[0]}.json"
        if cfg.resume and path.is_file():
            results[set_name] = CountdownEvalResult.from_dict(json.loads(path.read_text()))
            log.info("reusing %s", path)
        else:
            todo[set_name] = path
    if todo:
        spec = pick_device(cfg.device, cfg.dtype)
        tokenizer = load_tokenizer(model_name)
        engine = HFEngine(load_model(model_name, spec), tokenizer, batch_size=cfg.eval_batch_size, show_progress=True)
        params = SamplingParams(k=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
        for set_name, path in todo.items():
            tasks = sets[set_name]
            prompts = [render_prompt(cfg.prompt_template, t, tokenizer) for t in tasks]
            result = evaluate_countdown(engine, tasks, prompts, params)
            print_result(result, title=f"{label} on {set_name}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result.to_dict(), indent=2))
            results[set_name] = result
    return {name: results[name] for name in sets}


def write_report(cfg: DemoConfig, run_dir: Path, results: dict[str, dict[str, CountdownEvalResult]], sets: dict[str, list[CountdownTask]], timings: dict[str, float]) -> Path:
    """``report.md`` with the results table, plots and example completions; returns its path."""
    metrics = read_metrics(run_dir / "sft" / "metrics.jsonl")
    plot_curve(metrics, "loss/sft", run_dir / "sft_loss.png", title="SFT training loss")
    plot_grouped_bars({s: {m: results[m][s].mean_score for m in results} for s in sets}, run_dir / "scores.png", title="Countdown mean score by model", ylabel="mean score")
    rows = [[model, s, len(sets[s]), r.mean_score, r.accuracy, r.format_rate, r.truncated_rate]
            for model in results for s, r in results[model].items()]
    first_set = next(iter(sets))
    examples = []
    for model in results:
        for ex in results[model][first_set].examples[:2]:
            examples.append(f"**{model}**, nums {ex['nums']} target {ex['target']}, score {ex['score']}:\n\n```\n{ex['completion'].strip()}\n```")
    tokens_per_s = [r["tokens_per_s"] for r in metrics[1:]] or [0.0]
    text = f"""# rlft Countdown demo: {cfg.name}

Base model `{cfg.model}`; SFT on {cfg.num_train} generated `{cfg.preset}` tasks with `{cfg.trace_style}`
solver traces, {cfg.sft_steps} steps of {cfg.batch_size} (lr {cfg.lr}); prompt template `{cfg.prompt_template}`;
greedy decoding, at most {cfg.max_new_tokens} new tokens. Scores use the TinyZero-exact
`compute_score` (1.0 correct, 0.1 answer present but wrong, 0 no answer).

## Results

{markdown_table(["model", "eval set", "tasks", "mean score", "accuracy", "format rate", "truncated"], rows)}

![scores](scores.png)

## Training

Final SFT loss {metrics[-1]['loss/sft'] if metrics else float('nan'):.3f} after {len(metrics)} steps;
median throughput {sorted(tokens_per_s)[len(tokens_per_s) // 2]:.0f} tokens/s.

![SFT loss](sft_loss.png)

## Timings

{markdown_table(["stage", "seconds"], [[k, round(v, 1)] for k, v in timings.items()])}

## Example completions ({first_set})

{chr(10).join(examples)}
"""
    path = run_dir / "report.md"
    path.write_text(text)
    return path


def run_demo(cfg: DemoConfig) -> Path:
    """Run the demo; returns the report path."""
    cfg = cfg.effective()
    run_dir = Path(cfg.runs_dir) / cfg.name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
    sets = eval_sets(cfg)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    results = {"base": evaluate_model(cfg.model, "base", sets, cfg, run_dir / "eval")}
    timings["evaluate base"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    sft_cfg = SFTConfig(
        model=cfg.model, data="countdown", preset=cfg.preset, num_train=cfg.num_train, split_seed=cfg.split_seed,
        heldout_size=max(cfg.eval_limit, SFTConfig.heldout_size), trace_style=cfg.trace_style,
        max_dead_ends=cfg.max_dead_ends, prompt_template=cfg.prompt_template, output_dir=str(run_dir / "sft"),
        max_length=256, batch_size=cfg.batch_size, micro_batch_size=cfg.micro_batch_size, max_steps=cfg.sft_steps,
        lr=cfg.lr, save_every=max(cfg.sft_steps // 4, 1), seed=cfg.seed, resume=cfg.resume, device=cfg.device, dtype=cfg.dtype,
    )
    final = run_dir / "sft" / "model"
    if not (cfg.resume and (final / "config.json").is_file()):
        final = train_sft(sft_cfg)
    timings["SFT"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    results["sft"] = evaluate_model(str(final), "sft", sets, cfg, run_dir / "eval")
    timings["evaluate SFT"] = time.perf_counter() - t0

    report = write_report(cfg, run_dir, results, sets, timings)
    console.print(f"[bold green]Report written to {report}[/]")
    return report
