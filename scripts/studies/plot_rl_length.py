"""How RL's gain grows with its length: RL runs from one start (say 20 and 60 steps of the same recipe), each end
model's paired gain over the start against the samples the run generated, and the in-loop held-out score along the way.

Reads each run's ``metrics.jsonl`` (``samples/total``, ``flops/estimated`` and the ``eval/score`` records the RL loop
logs every ``eval_every`` steps) and its end model's greedy evaluation, and the start's evaluation of the same tasks
(checked); prints a Markdown table and writes one PNG with two panels:

1. the end model minus the start, paired task by task (:func:`rlft.eval.countdown.paired_difference`), with its 95%
   interval, at the samples the run generated;
2. the in-loop score (the loop's own held-out subset, usually 100 rows: noisier than panel 1) against samples.

    D=docs/results/countdown-real/data
    G=$D/sft_patient_grpo
    python scripts/studies/plot_rl_length.py --start $D/sft_patient_s0_eval_validation_greedy.json.gz \\
        --run "20 steps=${G}_s0_metrics.jsonl,${G}_s0_eval_validation_greedy.json.gz" \\
        --run "60 steps=${G}_60_s0_metrics.jsonl,${G}_60_s0_eval_validation_greedy.json.gz" \\
        --out longer_rl_s0.png

Refused, one line and exit code 2 (:mod:`rlft.lab.script_io`), naming the file: a missing file, an evaluation of other
tasks, a run with no ``samples/total`` records, an existing ``--out`` without ``--overwrite``, an ``--out`` that is an
input.
"""

from __future__ import annotations


from rlft.eval.countdown import paired_difference, read_eval_file
from rlft.eval.report import save_panels
from rlft.eval.stats import format_difference
from rlft.lab.script_io import fail, read_labelled_run, run_script, start_and_runs_args


def load_run(spec: str, start) -> dict:
    """One run: label, step records (those with ``samples/total``), its end evaluation and the paired difference from
    ``start``. ScriptError naming the file when it is missing, holds no step records or is of other tasks."""
    label, records, eval_path = read_labelled_run(spec, "samples/total")
    end = read_eval_file(eval_path)[0]
    if end.tasks != start.tasks:
        fail(f"{eval_path}: other tasks than the start's evaluation (nums and target, in order)")
    return {"label": label, "records": records, "end": end, "samples": records[-1]["samples/total"],
            "flops": records[-1].get("flops/estimated"), "diff": paired_difference(end.task_scores, start.task_scores)}


def table(start, runs: list[dict]) -> str:
    """Markdown: per run, samples generated, estimated FLOPs, end score and its paired gain over the start."""
    lines = ["| run | samples generated | estimated FLOPs | greedy score | minus the start [95% CI] (better / worse) |",
             "|---|---|---|---|---|", f"| start | 0 | - | {start.mean_score:.3f} | - |"]
    for r in runs:
        flops = "-" if r["flops"] is None else f"{r['flops']:.2e}"
        d = r["diff"]
        lines.append(f"| {r['label']} | {r['samples']:,} | {flops} | {r['end'].mean_score:.3f} | "
                     f"{format_difference(d)} ({d['better']} / {d['worse']}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = start_and_runs_args(__doc__.split("\n\n")[0], argv)
    start = read_eval_file(args.start)[0]
    runs = [load_run(spec, start) for spec in args.run]
    print(table(start, runs))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    for r in runs:
        d = r["diff"]
        axes[0].errorbar([r["samples"]], [d["diff"]], yerr=[[d["diff"] - d["ci_low"]], [d["ci_high"] - d["diff"]]],
                         marker="o", capsize=4, label=r["label"])
        points = [(x["samples/total"], x["eval/score"]) for x in r["records"] if "eval/score" in x]
        if points:
            axes[1].plot(*zip(*points), marker="o", label=r["label"])
    axes[0].axhline(0, color="grey", linestyle="--", linewidth=1)
    axes[0].set(xlabel="samples generated", ylabel="end model minus start",
                title=f"paired gain over the start, 95% CI ({start.num_tasks} tasks)")
    axes[1].set(xlabel="samples generated", ylabel="greedy score", title="in-loop score (the loop's held-out subset)")
    for ax in axes:
        ax.set_xlim(left=0)
    print(f"wrote {save_panels(fig, axes, args.out)}")


if __name__ == "__main__":
    run_script(main)
