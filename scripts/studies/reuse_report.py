"""The sample-reuse screens (docs/results/sample-reuse): their table, the leader rule, and held-out score against
samples generated. Read-only, from the run files of ``scripts/countdown_ablation.py run`` alone:

    python scripts/studies/reuse_report.py --out runs/real/ablation --seed 0 --split validation --tasks 500

For the on-policy reference (``--reference``, r = 1) and every variant of ``--variants-file`` (5_reuse.yaml) with a
folder ``<out>/<variant>/s<seed>``: its reuse factor r (:func:`reuse_factor`), what it generated and trained (the last
``metrics.jsonl`` record: ``samples/total``, ``tokens/generated_total``, ``tokens/trained_total``,
``flops/estimated``), its summed ``time/step_s``, the mean ``replay/share`` of its steps, the in-loop greedy scores
(``eval/score``, the first ``eval_limit`` held-out rows) and its end evaluation (``eval_val_greedy_<tasks>.json`` on
validation rows, ``eval_greedy_<tasks>.json`` on test rows) paired task by task against the reference's
(:func:`rlft.eval.compare.compare_results`: difference, 95% interval), and the same evaluation of its step-10 model
(``<out>/<variant>/s<seed>/step10/``, from ``scripts/countdown_ablation.py checkpoint --step 10``: half the samples)
paired against the reference's end. Then the protocol's leader rule (:func:`leader`) and
``<out>/reuse_samples_vs_score_s<seed>.png`` (:func:`rlft.eval.report.plot_samples_vs_score`, the start
``<start>/s<seed>``'s score on the same first rows drawn at 0 samples). A run still training (no end evaluation) is
listed with its in-loop points. ``--split test`` (the confirmation) lists only the runs with a test evaluation, and
neither applies the leader rule nor draws the in-loop plot; both splits draw each run's step-10 and end models paired
against the reference's end, against samples generated (``<out>/reuse_paired_vs_samples_<split>_s<seed>.png``). A
missing reference or a file that is not an evaluation: one line, exit 2; so is a plot that exists already, checked
before anything is read (:func:`rlft.lab.script_io.check_outputs`; ``--overwrite`` replaces it).
"""

from __future__ import annotations

from pathlib import Path

from rlft.checkpoint import read_metrics
from rlft.eval.compare import check_same_tasks, compare_results, load
from rlft.eval.stats import format_difference
from rlft.lab.pipeline import read_yaml
from rlft.lab.script_io import ArgumentParser, check_outputs, fail, run_script

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ROOT / "configs" / "countdown" / "ablation" / "5_reuse.yaml"


def reuse_factor(spec: dict) -> int:
    """Times each kept group is trained on: ``ppo_epochs`` (default 1), times ``1 + max_staleness`` when the variant
    replays (``replay_size`` > 0: a group is trained at its own step and at each of the ``max_staleness`` after)."""
    epochs = int(spec.get("ppo_epochs", 1))
    return epochs * (1 + int(spec.get("max_staleness", 0))) if spec.get("replay_size", 0) else epochs


def method(spec: dict) -> str:
    """How a variant reuses samples, in words: "PPO epochs", "TOPR replay", "TOPR" (no reuse) or "on-policy"."""
    if spec.get("replay_size", 0):
        return f"{spec.get('loss', 'ppo').upper()} replay"
    if int(spec.get("ppo_epochs", 1)) > 1:
        return "PPO epochs"
    return "TOPR" if spec.get("loss") == "topr" else "on-policy"


HALF_STEP = 10
"""The step whose model has generated half a 20-step run's samples (the protocol's half-sample point)."""


def run_row(name: str, spec: dict, folder: Path, end_file: str) -> dict:
    """What one run generated, trained and scored (see the module docstring); ``end`` is its end evaluation's path,
    ``result`` that evaluation and ``score`` its mean score (all three None before it exists); ``half_end``,
    ``half_result``, ``half_score``: the same for its step-10 model."""
    records = read_metrics(folder / "run" / "metrics.jsonl")
    last = records[-1] if records else {}
    shares = [r["replay/share"] for r in records if "replay/share" in r]
    end = folder / end_file
    result = load(str(end))[0] if end.exists() else None
    half_end = folder / f"step{HALF_STEP}" / end_file
    half = load(str(half_end))[0] if half_end.exists() else None
    return {"name": name, "method": method(spec), "r": reuse_factor(spec), "steps": last.get("step", 0),
            "samples": last.get("samples/total"), "generated": last.get("tokens/generated_total"),
            "trained": last.get("tokens/trained_total"), "flops": last.get("flops/estimated"),
            "step_s": sum(r.get("time/step_s", 0.0) for r in records),
            "replay_share": sum(shares) / len(shares) if shares else 0.0,
            "inloop": {r["step"]: r["eval/score"] for r in records if "eval/score" in r},
            "records": records, "end": end if result else None, "result": result,
            "score": result.mean_score if result else None, "half_end": half_end if half else None, "half_result": half,
            "half_score": half.mean_score if half else None}


def leader(reference: dict, rows: list[dict]) -> tuple[str | None, str]:
    """The protocol's rule (docs/results/sample-reuse, step 2, with its half-sample clause as amended on 2026-11-29,
    before the second screen: on the step-10 model's end-size evaluation, not the in-loop rows): of the finished reuse
    runs (r >= 2, an end evaluation), the one with the highest end score goes on if it scores at least the
    reference's end score, or if its step-10 model (half the samples) scores at least the reference's end score on
    the same rows. Returns ``(name or None, why)``; None also while the best run's step-10 model is not evaluated
    (``why`` says so)."""
    finished = [row for row in rows if row["r"] >= 2 and row["end"] is not None]
    if not finished:
        return None, "no reuse run (r >= 2) has its end evaluation yet"
    best, bar = max(finished, key=lambda row: row["score"]), reference["score"]
    if best["score"] >= bar:
        return best["name"], f"{best['name']} scores {best['score']:.3f} >= the on-policy {bar:.3f}"
    half = best.get("half_score")
    if half is None:
        return None, (
            f"undecided: the best, {best['name']}, scores {best['score']:.3f} < the on-policy {bar:.3f}, and its "
            f"step-{HALF_STEP} model is not evaluated yet (scripts/countdown_ablation.py checkpoint)")
    if half >= bar:
        return best["name"], (f"{best['name']}'s step-{HALF_STEP} model (half the samples) scores {half:.3f} >= the "
                              f"on-policy run's {bar:.3f} at its end")
    return None, (f"none goes on: the best, {best['name']}, scores {best['score']:.3f} < the on-policy {bar:.3f}, and "
                  f"its step-{HALF_STEP} model {half:.3f} < {bar:.3f}")


def fmt(x, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def paired_cell(reference: dict, result, path: Path) -> str:
    """``result`` (from ``path``) minus the reference's end evaluation, task by task: ``+d [low, high]``."""
    check_same_tasks(reference["result"], result, str(reference["end"]), str(path))
    d = compare_results(reference["result"], result)["all"]
    return format_difference(d)


def table(reference: dict, rows: list[dict]) -> str:
    """Markdown: one line per run, the reference first; the end score paired against the reference's."""
    lines = [
        "| run | reuse | r | steps | samples generated | tokens generated | tokens trained | FLOPs | step time (min) "
        "| replayed share | in-loop (step: score) | end score (cut) | minus on-policy [95% CI] "
        f"| step-{HALF_STEP} model (cut) | its minus on-policy's end [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    ]
    for row in [reference, *rows]:
        inloop = ", ".join(f"{step}: {score:.3f}" for step, score in sorted(row["inloop"].items())) or "-"
        end, paired = "still training", "-"
        if row["end"] is not None:
            end = f"{row['score']:.3f} ({row['result'].truncated_rate:.0%})"
            if row is not reference:
                paired = paired_cell(reference, row["result"], row["end"])
        half, half_paired = "-", "-"
        if row.get("half_end") is not None:
            half = f"{row['half_score']:.3f} ({row['half_result'].truncated_rate:.0%})"
            half_paired = paired_cell(reference, row["half_result"], row["half_end"])
        lines.append(
            f"| {row['name']} | {row['method']} | {row['r']} | {row['steps']} | {fmt(row['samples'])} | "
            f"{fmt(row['generated'])} | {fmt(row['trained'])} | {fmt(row['flops'], '.2e')} | "
            f"{row['step_s'] / 60:.1f} | {row['replay_share']:.2f} | {inloop} | {end} | {paired} | {half} | "
            f"{half_paired} |"
        )
    return "\n".join(lines)


def plot(reference: dict, rows: list[dict], start_file: Path, path: Path) -> Path | None:
    """In-loop greedy score against samples generated, the start's score on the same first rows at 0 samples."""
    from rlft.eval.report import plot_samples_vs_score

    start = None
    if start_file.exists():
        scores = load(str(start_file))[0].task_scores
        limit = reference.get("eval_limit")
        if limit and len(scores) >= limit:
            start = sum(sum(s) / len(s) for s in scores[:limit]) / limit
    runs = {f"{row['name']} (r={row['r']})": row["records"] for row in [reference, *rows]}
    return plot_samples_vs_score(runs, path, start=start, start_label=f"start ({start_file.parent.parent.name})",
                                 ylabel=f"greedy score (first {reference.get('eval_limit', '?')} held-out rows)",
                                 title="Sample reuse: held-out score against samples generated")


def samples_at(row: dict, step: int) -> int | None:
    """``samples/total`` of the run's metrics record at ``step`` (None when it has none)."""
    return next((r.get("samples/total") for r in row["records"] if r.get("step") == step), None)


def paired_plot(reference: dict, rows: list[dict], tasks: int, split: str, path: Path) -> Path | None:
    """Each run's step-10 and end models on the ``tasks`` end-evaluation rows, minus the on-policy run's end (mean
    difference, 95% interval), against the samples each had generated (:func:`rlft.eval.report.plot_paired_vs_samples`):
    the study's verdict axis. None when no evaluation is in."""
    from rlft.eval.report import plot_paired_vs_samples

    points = {}
    for row in [reference, *rows]:
        own = points.setdefault(f"{row['name']} (r={row['r']})", [])
        for x, result in [(samples_at(row, HALF_STEP), row.get("half_result")), (row["samples"], row["result"])]:
            if x is not None and result is not None:
                d = compare_results(reference["result"], result)["all"]
                own.append((x, d["diff"], d["ci_low"], d["ci_high"]))
    return plot_paired_vs_samples(points, path, connect=True, title=f"Sample reuse: step-{HALF_STEP} and end models, "
                                  "paired against the on-policy run's end", xlabel="samples generated",
                                  ylabel=f"greedy score - on-policy's ({tasks} {split} rows, 95% CI)",
                                  hlines=((0.0, "on-policy run's end", "--"),))


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/real/ablation"), help="the ablation's run folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=["validation", "test"], default="validation",
                        help="the end evaluation's rows")
    parser.add_argument("--tasks", type=int, default=500, help="rows of the end evaluation (eval_*_<N>.json)")
    parser.add_argument("--reference", default="real_sft_patient_grpo", help="the on-policy run (r = 1)")
    parser.add_argument("--start", default="real_sft_patient", help="the variant every run starts from")
    parser.add_argument("--variants-file", type=Path, default=VARIANTS, help="the reuse variants (their order)")
    parser.add_argument("--overwrite", action="store_true", help="replace the plots of an earlier report")
    args = parser.parse_args(argv)
    end_file = f"eval_{'val_' if args.split == 'validation' else ''}greedy_{args.tasks}.json"
    seed = f"s{args.seed}"
    paired_png = args.out / f"reuse_paired_vs_samples_{args.split}_{seed}.png"
    curve_png = args.out / f"reuse_samples_vs_score_{seed}.png"  # validation only
    for png in (paired_png, curve_png) if args.split == "validation" else (paired_png,):
        check_outputs({"--out": png}, overwrite=args.overwrite)
    ref_folder = args.out / args.reference / seed
    reference = run_row(args.reference, {}, ref_folder, end_file)
    if reference["end"] is None:
        fail(f"{ref_folder / end_file}: the on-policy reference has no end evaluation")
    variants = read_yaml(args.variants_file)  # the one file: its start_from names variants of other files
    rows = [run_row(name, spec, args.out / name / seed, end_file) for name, spec in variants.items()
            if (args.out / name / seed).exists()]
    if args.split == "test":  # the confirmation: the runs evaluated on the test rows, no leader rule, no in-loop plot
        rows = [row for row in rows if row["end"] is not None or row["half_end"] is not None]
    config = ref_folder / "run" / "config.yaml"
    reference["eval_limit"] = read_yaml(config).get("eval_limit") if config.exists() else None
    print(table(reference, rows))
    if args.split == "validation":
        name, why = leader(reference, rows)
        print(f"\nleader by the protocol's rule (the half-sample clause on the step-{HALF_STEP} model's evaluation, as "
              f"amended on 2026-11-29): {name or 'none'} ({why})")
        start_file = args.out / args.start / seed / end_file
        print(plot(reference, rows, start_file, curve_png))
    print(paired_plot(reference, rows, args.tasks, args.split, paired_png))


if __name__ == "__main__":  # a missing reference, a file that is not an evaluation: one line, exit 2
    run_script(main)
