"""`rlft demo` (``--track countdown``, the default): the Countdown story on one CPU.

base -> SFT on a fixed dataset of solver traces -> RL (the one RL loop, `rlft rl`: by default GRPO with group
filtering and LoRA), and SFT -> on-policy pairs -> DPO (by default without RPO's NLL term, with LoRA); every model
is evaluated on the same held-out tasks and ``<output_dir>/report.md`` (default ``runs/demo``) gets the results table, the paired table (each
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
from functools import partial
from pathlib import Path

from rlft.checkpoint import read_metrics
from rlft.console import console
from rlft.eval.countdown import CountdownEvalResult, paired_difference
from rlft.eval.report import markdown_table, plot_curve, plot_grouped_bars, plot_samples_vs_score
from rlft.recipes.demo_config import DemoConfig
from rlft.recipes.dpo import DPOConfig, train_dpo
from rlft.recipes.pairs import PairsConfig, make_countdown_pairs
from rlft.recipes.pipeline import EvalJob, Timer, evaluate_cached, run_stage
from rlft.recipes.rl import train_rl
from rlft.recipes.sft import SFTConfig, train_sft
from rlft.rl.config import RLConfig
from rlft.rollout.base import SamplingParams
from rlft.run_folder import claim_run_dir, write_run_config
from rlft.tasks.countdown.generator import PRESETS, generate_tasks, make_splits
from rlft.tasks.countdown.loaders import load_countdown, tail_by_size
from rlft.types import CountdownTask

log = logging.getLogger("rlft")

REAL_DATA_CANDIDATES = ("../shared/data/countdown/train.parquet", "shared/data/countdown/train.parquet")


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


def _eval_jobs(cfg: DemoConfig, sets: dict[str, list[CountdownTask]], out_dir: Path, label: str,
               sampled: bool = True) -> dict[str, EvalJob]:
    """Every evaluation of model ``label``: greedy on each set, plus (``sampled``) the sampled evaluation on the
    held-out set; each cached in :func:`eval_file`."""
    greedy = SamplingParams(k=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    jobs = {name: EvalJob(eval_file(out_dir, label, name), tasks, greedy) for name, tasks in sets.items()}
    if cfg.passk and sampled:
        sampling = SamplingParams(k=cfg.passk, temperature=cfg.passk_temperature, top_p=cfg.passk_top_p,
                                  max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
        jobs[SAMPLED_SET] = EvalJob(eval_file(out_dir, label, SAMPLED_SET), sets[heldout_set(cfg)][: cfg.passk_limit], sampling)
    return jobs


def eval_file(out_dir: Path, label: str, set_name: str) -> Path:
    """Where the evaluation of model ``label`` on ``set_name`` is saved: ``medium3 held-out`` -> ``<label>--medium3-held-out.json``."""
    return out_dir / f"{label}--{re.sub(r'[^a-z0-9]+', '-', set_name.lower()).strip('-')}.json"


def evaluate_model(model_name: str, label: str, sets: dict[str, list[CountdownTask]], cfg: DemoConfig, out_dir: Path,
                   sampled: bool = True) -> dict[str, CountdownEvalResult]:
    """Evaluate one model on every job of :func:`_eval_jobs`; results cached as JSON in ``out_dir`` and, with
    ``--resume``, reused while the model's weights, sampling and tasks are unchanged (:func:`evaluate_cached`)."""
    return evaluate_cached(model_name, _eval_jobs(cfg, sets, out_dir, label, sampled), prompt_template=cfg.prompt_template,
                           batch_size=cfg.eval_batch_size, device=cfg.device, dtype=cfg.dtype, reuse=cfg.resume,
                           label=label, show_progress=True)


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
    text = f"""# rlft Countdown demo: {run_dir.name}

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


def run_countdown_demo(cfg: DemoConfig) -> Path:
    """Run the Countdown demo; returns the report path. With --resume, stages whose output exists are skipped and
    evaluations whose cache still answers them are read back (:mod:`rlft.recipes.pipeline`)."""
    cfg = cfg.effective()
    run_dir = claim_run_dir(cfg).open()  # an earlier demo: --resume or --overwrite
    write_run_config(run_dir, cfg)
    sets = eval_sets(cfg)
    timings: dict[str, float] = {}
    notes: list[str] = []
    stage = partial(run_stage, timings=timings, resume=cfg.resume, keep_checkpoints=cfg.keep_checkpoints)
    common = dict(split_seed=cfg.split_seed, heldout_size=cfg.heldout_size, prompt_template=cfg.prompt_template,
                  seed=cfg.seed, resume=cfg.resume, device=cfg.device, dtype=cfg.dtype)

    with Timer(timings, "evaluate base"):  # greedy on the held-out set only: the untuned model writes no answer
        held_out = heldout_set(cfg)       # (0.000 everywhere, 250 s of the 45-minute budget when it ran every set)
        results = {"base": evaluate_model(cfg.model, "base", {held_out: sets[held_out]}, cfg, run_dir / "eval", sampled=False)}

    sft = stage("SFT", run_dir / "sft" / "model", lambda: train_sft(SFTConfig(
        model=cfg.model, data="countdown", preset=cfg.preset, num_train=cfg.num_train, trace_style=cfg.trace_style,
        max_dead_ends=cfg.max_dead_ends, give_up=cfg.give_up, max_tries=cfg.max_tries, output_dir=str(run_dir / "sft"),
        max_length=256, batch_size=cfg.batch_size, micro_batch_size=cfg.micro_batch_size, max_steps=cfg.sft_steps, lr=cfg.lr,
        save_every=max(cfg.sft_steps // 4, 1), **common)))
    with Timer(timings, "evaluate SFT"):
        results["sft"] = evaluate_model(str(sft), "sft", sets, cfg, run_dir / "eval")

    if cfg.rl_steps:
        rl = stage("RL", run_dir / "rl" / "model", lambda: train_rl(RLConfig(
            model=str(sft), preset=cfg.preset, num_train=cfg.rl_num_train, output_dir=str(run_dir / "rl"),
            advantage=cfg.rl_advantage, loss=cfg.rl_loss, loss_mode=cfg.rl_loss_mode, filter_groups=cfg.rl_filter_groups,
            max_prompt_batches=cfg.rl_max_prompt_batches, lora_r=cfg.rl_lora_r, lora_alpha=cfg.rl_lora_alpha,
            k=cfg.rl_k, prompts_per_step=cfg.rl_prompts_per_step, max_steps=cfg.rl_steps, lr=cfg.rl_lr, beta=cfg.rl_beta,
            temperature=cfg.rl_temperature, max_new_tokens=cfg.max_new_tokens, micro_batch_size=cfg.update_micro_batch_size,
            gen_batch_size=cfg.rl_k * cfg.rl_prompts_per_step, eval_every=cfg.rl_eval_every, eval_at_start=False,
            eval_limit=cfg.rl_eval_limit, eval_max_new_tokens=cfg.max_new_tokens, save_every=max(cfg.rl_steps // 3, 1),
            **common)))
        with Timer(timings, "evaluate RL"):
            results["rl"] = evaluate_model(str(rl), "rl", sets, cfg, run_dir / "eval")

    if cfg.pairs_prompts:
        pairs_path = stage("on-policy pairs", run_dir / "pairs" / "countdown.jsonl", lambda: make_countdown_pairs(PairsConfig(
            model=str(sft), preset=cfg.preset, num_prompts=cfg.pairs_prompts, start=cfg.num_train,
            split_seed=cfg.split_seed, heldout_size=cfg.heldout_size, prompt_template=cfg.prompt_template,
            num_samples=cfg.pairs_samples, temperature=cfg.pairs_temperature, max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.eval_batch_size, output=str(run_dir / "pairs" / "countdown.jsonl"), seed=cfg.seed,
            device=cfg.device, dtype=cfg.dtype)))
        stats = json.loads(pairs_path.with_suffix(".stats.json").read_text())
        notes.append(f"on-policy pairs: {stats['prompts']} prompts tried, {stats['kept']} kept, {stats['dropped_ties']} dropped as ties")
        if stats["kept"] == 0:
            notes.append("DPO skipped: every sampled pair was a tie")
            timings["DPO"] = 0.0
        else:
            dpo = stage("DPO", run_dir / "dpo" / "model", lambda: train_dpo(DPOConfig(
                model=str(sft), data=str(pairs_path), output_dir=str(run_dir / "dpo"), beta=cfg.dpo_beta, loss_type=cfg.dpo_loss_type,
                rpo_alpha=cfg.dpo_rpo_alpha, lora_r=cfg.dpo_lora_r, lora_alpha=cfg.dpo_lora_alpha, max_length=256,
                batch_size=cfg.dpo_batch_size, micro_batch_size=cfg.dpo_micro_batch_size, epochs=cfg.dpo_epochs, lr=cfg.dpo_lr,
                optimizer=cfg.dpo_optimizer, save_every=5, seed=cfg.seed, resume=cfg.resume, device=cfg.device, dtype=cfg.dtype)))
            with Timer(timings, "evaluate DPO"):
                results["dpo"] = evaluate_model(str(dpo), "dpo", sets, cfg, run_dir / "eval")

    timings["total"] = sum(timings.values())
    report = write_report(cfg, run_dir, results, sets, timings, notes)
    console.print(f"[bold green]Report written to {report}[/]")
    return report
