"""The Countdown demo's ``report.md``: held-out scores by count of numbers, paired differences of each stage against its
own start (and of the pipeline against the SFT model), best-of-N selection of the sampled evaluation, the RL run's
validation score against samples generated, curves."""

from __future__ import annotations

from pathlib import Path

from rlft.lab.script_io import read_metrics
from rlft.eval.compare import check_same_tasks
from rlft.eval.countdown import CountdownEvalResult, paired_difference, subset
from rlft.eval.report import markdown_table, plot_curve, plot_grouped_bars, plot_samples_vs_score
from rlft.eval.select import selected_scores
from rlft.eval.stats import format_difference
from rlft.lab.demo_config import DemoConfig

GREEDY, SAMPLED = "greedy", "sampled"
SIZES = ((None, "mixed"), (3, "3 numbers"), (4, "4 numbers"))
SELECTORS = (("majority", "majority@{k}"), ("self-certainty", "self-certainty@{k}"),
             ("self-certainty-vote", "self-certainty vote@{k}"), ("oracle", "oracle@{k} = pass@{k} (upper bound)"))


def _lora(r: int) -> str:
    return f"LoRA r={r}" if r else "full fine-tuning"


def _mean(rows: list[list[float]]) -> float:
    flat = [x for row in rows for x in row]
    return sum(flat) / len(flat) if flat else float("nan")


def scores_table(cfg: DemoConfig, results: dict[str, dict[str, CountdownEvalResult]]) -> str:
    """One row per model: greedy mixed score, accuracy, format and truncation rates, 3- and 4-number scores (with
    ``--env countdown-calc``, the greedy answers' tool calls and errors per answer); and the sampled evaluation's mean
    score and pass@k."""
    header = ["model", "score (mixed)", "accuracy", "format rate", "truncated", "score, 3 numbers", "score, 4 numbers",
              "accuracy, 4 numbers"]
    tools = cfg.env == "countdown-calc"
    if tools:
        header += ["tool calls / answer", "tool errors / answer"]
    if cfg.passk:
        header += ["sampled score", "pass@1", f"pass@{cfg.passk}"]
    rows, most = [], max(by[GREEDY].num_tasks for by in results.values())
    for model, by in results.items():
        g = by[GREEDY]
        sizes = g.by_size
        name = model if g.num_tasks == most else f"{model} (first {g.num_tasks} rows)"  # the base model: a prefix
        row = [name, g.mean_score, g.accuracy, g.format_rate, g.truncated_rate, sizes.get("3", {}).get("score", "-"),
               sizes.get("4", {}).get("score", "-"), sizes.get("4", {}).get("accuracy", "-")]
        if tools:
            row += [g.tool_calls_per_answer, g.tool_errors_per_answer]
        if cfg.passk:
            s = by.get(SAMPLED)
            row += [s.mean_score, s.pass_at_k[1], s.pass_at_k[cfg.passk]] if s is not None else ["-", "-", "-"]
        rows.append(row)
    return markdown_table(header, rows)


def comparisons(results: dict[str, dict], starts: dict[str, str]) -> list[tuple[str, str]]:
    """``(model, start)`` pairs of the paired table: each trained model against its own start (``starts``: label ->
    start label), then each model whose start is not the SFT model against SFT (the pipeline's gain so far)."""
    own = [(m, s) for m, s in starts.items() if m in results and s in results]
    return own + [(m, "sft") for m, s in own if s != "sft" and "sft" in results]


def paired_table(cfg: DemoConfig, results: dict[str, dict[str, CountdownEvalResult]], starts: dict[str, str]) -> str:
    """Each model minus its start, and minus SFT when that is not its start (:func:`comparisons`), on the same test
    rows: greedy mixed, 3-number and 4-number differences with 95% intervals, tasks better/worse, the share of answers
    cut at max_new_tokens of both, and the sampled difference.

    Raises:
        UsageError: two evaluations of different tasks (:func:`rlft.eval.compare.check_same_tasks`).
    """
    pairs = comparisons(results, starts)
    if not pairs:
        return "none (no model with its start evaluated)"
    header = ["comparison", "greedy, mixed", "3 numbers", "4 numbers", "tasks better / worse", "cut: model / start"]
    if cfg.passk:
        header.append(f"sampled ({cfg.passk} samples, first {cfg.passk_limit} rows)")
    rows = []
    for model, start in pairs:
        by, base = results[model], results[start]
        check_same_tasks(by[GREEDY], base[GREEDY], f"{model}'s evaluation", f"{start}'s evaluation", unrecorded_ok=True)
        cells = [f"{model} - {start}"]
        for size, _ in SIZES:
            a, b = subset(by[GREEDY], size), subset(base[GREEDY], size)
            if not a:
                cells.append("-")
                continue
            d = paired_difference(a, b)
            cells.append(f"{format_difference(d)} (n={d['n']})" if size is None else format_difference(d))
        mixed = paired_difference(by[GREEDY].task_scores, base[GREEDY].task_scores)
        cells += [
            f"{mixed['better']} / {mixed['worse']}",
            f"{by[GREEDY].truncated_rate:.0%} / {base[GREEDY].truncated_rate:.0%}"
        ]
        if cfg.passk:
            ok = SAMPLED in by and SAMPLED in base
            cells.append(
                format_difference(paired_difference(by[SAMPLED].task_scores, base[SAMPLED].task_scores)) if ok else "-")
        rows.append(cells)
    return markdown_table(header, rows)


def selection_table(cfg: DemoConfig, results: dict[str, dict[str, CountdownEvalResult]]) -> str:
    """Best-of-N selection over each sampled model's ``passk`` samples (:mod:`rlft.eval.select`): the selected
    answers' score, paired against the same model's greedy answers on the same rows, and the tokens generated per
    task (the cost)."""
    rows = []
    for model, by in results.items():
        sampled, greedy = by.get(SAMPLED), by[GREEDY]
        if sampled is None:
            continue
        n = sampled.num_tasks
        base = greedy.task_scores[:n]
        greedy_tokens = sum(t[0] for t in greedy.task_tokens[:n]) / n if greedy.task_tokens else float("nan")
        sampled_tokens = sum(sum(t) for t in sampled.task_tokens) / n if sampled.task_tokens else float("nan")
        rows.append([model, "greedy (1 answer)", _mean(base), "-", f"{greedy_tokens:.0f}"])
        for name, label in SELECTORS:
            if name.startswith("self-certainty") and any(c is None for row in sampled.task_certainty for c in row):
                continue
            chosen = selected_scores(name, sampled.task_scores, sampled.task_values, sampled.task_certainty, sampled.k)
            d = paired_difference([[x] for x in chosen], base)
            rows.append([
                model, label.format(k=sampled.k),
                sum(chosen) / n,
                format_difference(d), f"{sampled_tokens:.0f}"
            ])
    if not rows:
        return "none (no sampled evaluation)"
    return markdown_table(["model", "answer", "score", "minus greedy [95% CI]", "tokens generated per task"], rows)


def _metrics(path: Path) -> list[dict]:
    """A stage's metrics records ([] for a stage that did not run); a last line cut short by a kill is left out, any
    other damage is a ValueError naming the file (:func:`rlft.lab.script_io.read_metrics`)."""
    return read_metrics(path) if Path(path).is_file() else []


def _curve_section(title: str, metrics_path: Path, keys: list[tuple[str, str]], png_dir: Path) -> str:
    records = _metrics(metrics_path)
    if not records:
        return ""
    lines = [f"### {title}", ""]
    for key, label in keys:
        if any(key in r for r in records):
            png = plot_curve(records, key, png_dir / f"{title.lower().replace(' ', '_')}_{key.replace('/', '_')}.png",
                             title=f"{title}: {label}")
            last = [r[key] for r in records if key in r][-1]
            lines += [f"{label}: last {last:.3f}.", "", f"![{label}]({png.name})", ""]
    return "\n".join(lines)


def samples_vs_score_section(cfg: DemoConfig, run_dir: Path) -> str:
    """The RL run's greedy score on validation rows (its in-loop evaluations, from step 0) against samples generated."""
    records = _metrics(run_dir / "rl" / "metrics.jsonl")
    png = plot_samples_vs_score({"rl": records}, run_dir / "samples_vs_score.png",
                                ylabel=f"greedy score (first {cfg.rl_eval_limit} validation rows)",
                                title="RL from its start: validation score against samples generated")
    if png is None:
        return ""
    trail = " -> ".join(
        f"{r['eval/score']:.3f} ({int(r['samples/total']):,} samples)" for r in records if "eval/score" in r)
    return (
        f"## Validation score against samples generated (RL)\n\nGreedy score of the RL policy on the first "
        f"{cfg.rl_eval_limit} held-out validation rows, during training: {trail}. Samples generated include the groups "
        "group filtering dropped.\n\n"
        f"![samples vs score]({png.name})\n")


def write_report(cfg: DemoConfig, run_dir: Path, results: dict[str, dict[str, CountdownEvalResult]],
                 timings: dict[str, float], notes: list[str], starts: dict[str, str]) -> Path:
    """``report.md`` with the tables, plots and example completions; returns its path. ``starts``: each trained
    model's start, by label."""
    bars = {label: {m: _mean(subset(by[GREEDY], size)) for m, by in results.items()} for size, label in SIZES}
    plot_grouped_bars(bars, run_dir / "scores.png", title="Countdown held-out test rows: mean score by model (greedy)",
                      ylabel="mean score")
    n = len(results["sft"][GREEDY].task_scores) if "sft" in results else cfg.eval_limit
    curves = [
        _curve_section("SFT", run_dir / "sft" / "metrics.jsonl", [("loss/sft", "training loss")], run_dir),
        _curve_section("Filtered SFT", run_dir / "filtered" / "metrics.jsonl", [("loss/sft", "training loss")],
                       run_dir),
        _curve_section("RL", run_dir / "rl" / "metrics.jsonl",
                       [("reward/mean", "mean reward of the samples per step"),
                        ("reward/accuracy", "accuracy of the samples per step"),
                        ("completion/truncated_frac", "samples cut at max_new_tokens"),
                        ("groups/kept", "varied groups kept per step")], run_dir),
        _curve_section("DPO", run_dir / "dpo" / "metrics.jsonl", [("loss/dpo", "loss"),
                                                                  ("rewards/accuracy", "implicit reward accuracy")],
                       run_dir),
    ]
    examples = [f"**{m}**, nums {ex['nums']} target {ex['target']}, score {ex['score']}:\n\n"
                f"```\n{ex['completion'].strip()}\n```"
                for m, by in results.items() for ex in by[GREEDY].examples[:2]]
    start = "filtered SFT" if "filtered" in results else "SFT"
    filtered = (
        f"Filtered SFT: {cfg.filtered_steps} more steps of {cfg.batch_size} from the SFT model on only the traces "
        "that reach the target (the same lr). " if "filtered" in results else "")
    selection = (f"## Best-of-N selection (sampled evaluation: {cfg.passk} samples at T {cfg.passk_temperature}, top-p "
                 f"{cfg.passk_top_p}, first {cfg.passk_limit} rows)\n\n{selection_table(cfg, results)}\n\n"
                 if cfg.passk else "")
    text = f"""# rlft Countdown demo: {run_dir.name}

Base model `{cfg.model}`. SFT: {cfg.sft_steps} steps of {cfg.batch_size} on `{cfg.trace_style}` solver traces \
of `{cfg.preset}`
tasks, give-ups included (lr {cfg.lr}, constant). {filtered}RL from {start}: `rlft rl`, \
{cfg.rl_advantage} advantages, {cfg.rl_loss} loss ({cfg.rl_loss_mode}),
{'group filtering, ' if cfg.rl_filter_groups else ''}{_lora(cfg.rl_lora_r)} at lr {cfg.rl_lr}, {cfg.rl_steps} steps of
{cfg.rl_prompts_per_step} prompts x k={cfg.rl_k} at temperature {cfg.rl_temperature}. \
{cfg.dpo_loss_type.upper()} from {start}:
{cfg.pairs_prompts} training rows x {cfg.pairs_samples} samples, best vs worst, ties dropped; beta {cfg.dpo_beta},
{cfg.dpo_epochs:g} epochs, {_lora(cfg.dpo_lora_r)} at lr {cfg.dpo_lr}. Prompt template `{cfg.prompt_template}`, at most
{cfg.max_new_tokens} new tokens. Scores use the TinyZero-exact `compute_score` (1.0 correct, 0.1 an answer that is
wrong, 0 none); the mixed 3/4-number score is the spec's metric.

## Held-out test rows ({n}, greedy)

{scores_table(cfg, results)}

## Paired: each stage against its start

Each model minus its start on the same rows (and minus SFT, the pipeline's gain, when that is not its start): mean
per-task score difference with its 95% interval (normal approximation), and the share of greedy answers cut at
{cfg.max_new_tokens} tokens.

{paired_table(cfg, results, starts)}

![scores](scores.png)

{selection}{samples_vs_score_section(cfg, run_dir)}
## Training curves

{chr(10).join(c for c in curves if c)}

## Notes

{chr(10).join(f"- {x}" for x in notes) if notes else "none"}

## Timings

{markdown_table(["stage", "seconds"], [[k, f"{v:.0f}"] for k, v in timings.items()])}

## Example completions (test rows, greedy)

{chr(10).join(examples)}
"""
    path = run_dir / "report.md"
    path.write_text(text)
    return path
