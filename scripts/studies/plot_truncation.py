"""The truncation screen's picture: RL runs with and without the options for answers that run over the budget
(``--mask-truncated``, ``--overlong-buffer``), before and after RL.

Reads each run's ``metrics.jsonl`` and greedy evaluation (``rlft eval countdown --output`` JSON, the same tasks for
every run, checked) and the start's evaluation; writes one PNG with three panels and prints a Markdown table:

1. the share of training samples cut at ``max_new_tokens`` per step (``completion/truncated_frac``);
2. the mean generated tokens of the training samples per step (``completion/mean_tokens``);
3. greedy evaluation: score and share of answers cut, for the start and each run.

    D=docs/results/countdown-real/data  # the SFT start is its step-350 checkpoint
    python scripts/studies/plot_truncation.py --start $D/sft_step350_eval_validation_greedy.json.gz \\
        --run "real_grpo=$D/rl_s0_metrics.jsonl,$D/rl_s0_eval_validation_greedy.json.gz" \\
        --run "mask=$D/mask_s0_metrics.jsonl,$D/mask_s0_eval_validation_greedy.json.gz" --out truncation_s0.png

Refused, one line and exit code 2 (:mod:`rlft.lab.script_io`), naming the file: a missing file, an evaluation of other
tasks, a run with no step records, an existing ``--out`` without ``--overwrite``, an ``--out`` that is an input. A last
metrics line cut short by a kill is left out (:func:`rlft.lab.script_io.read_metrics`).
"""

from __future__ import annotations

from pathlib import Path

from rlft.eval.countdown import CountdownEvalResult, read_eval_file
from rlft.eval.report import save_panels
from rlft.lab.script_io import fail, read_labelled_run, run_script, start_and_runs_args


def load_eval(path: Path) -> CountdownEvalResult:
    """A greedy evaluation file (:func:`rlft.eval.countdown.read_eval_file`); ValueError naming it when missing or not
    an evaluation."""
    return read_eval_file(path)[0]


def table(rows: list[tuple[str, CountdownEvalResult]]) -> str:
    """Markdown: per model, score (mixed / 3 / 4 numbers), accuracy, format rate, cut share, tokens per answer."""
    lines = ["| greedy | score (mixed / 3 / 4) | accuracy | format rate | cut | tokens |", "|---|---|---|---|---|---|"]
    for label, r in rows:
        sizes = " / ".join(f"{r.by_size[k]['score']:.3f}" for k in ("3", "4") if k in r.by_size)
        lines.append(f"| {label} | {r.mean_score:.3f} / {sizes} | {r.accuracy:.3f} | {r.format_rate:.3f} | "
                     f"{r.truncated_rate:.3f} | {r.mean_completion_tokens:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = start_and_runs_args(__doc__.split("\n\n")[0], argv)
    start = load_eval(args.start)
    runs = [read_labelled_run(spec, "completion/truncated_frac") for spec in args.run]
    evals = [("start", start)]
    for label, _, path in runs:
        result = load_eval(path)
        if result.tasks != start.tasks:
            fail(f"{path}: other tasks than {args.start} (nums and target, in order)")
        evals.append((label, result))
    print(table(evals))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, records, _ in runs:
        steps = [r["step"] for r in records]
        axes[0].plot(steps, [r["completion/truncated_frac"] for r in records], marker="o", label=label)
        axes[1].plot(steps, [r.get("completion/mean_tokens", float("nan")) for r in records], marker="o", label=label)
    axes[0].set(xlabel="RL step", ylabel="share of training samples cut", title="training samples cut at the budget")
    axes[1].set(xlabel="RL step", ylabel="tokens", title="training samples: mean generated tokens")
    x = range(len(evals))
    axes[2].bar([i - 0.2 for i in x], [r.mean_score for _, r in evals], width=0.4, label="score")
    axes[2].bar([i + 0.2 for i in x], [r.truncated_rate for _, r in evals], width=0.4, label="answers cut")
    axes[2].set_xticks(list(x), [label for label, _ in evals])
    axes[2].set(title=f"greedy, {start.num_tasks} tasks", ylim=(0, 1))
    print(f"wrote {save_panels(fig, axes, args.out)}")


if __name__ == "__main__":
    run_script(main)
