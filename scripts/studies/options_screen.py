"""The options screen's report (docs/results/rl-edge/): RL runs with one option each against the uniform run, from
their metrics and their evaluations on the same validation rows.

Reads ``--start`` (the start's greedy evaluation; optional), ``--run LABEL=METRICS.jsonl,EVAL.json`` per run (its greedy
evaluation on the same tasks), optionally ``--control LABEL=METRICS.jsonl,EVAL.json`` per control run (an SFT run
continued from the same start, given an RL run's FLOPs: no groups or samples of its own), one of the runs or controls
being ``--baseline``, and optionally ``--passk LABEL=EVAL.json`` (sampled evaluations with k samples per task, one of
them labelled ``start``), and writes a Markdown file with three tables:

- the runs' cost: steps, groups tried and kept, generated tokens, the last ``flops/estimated``, hinted groups and the
  hinted ones that held a success (``hint/groups``, ``hint/solved`` summed; ``-`` when not logged, as for a control's
  groups and generated tokens), and the samples' accuracy (the mean of ``reward/accuracy`` over the steps: score 1,
  whatever the training reward);
- the greedy scores: mixed, 3 and 4 numbers, the accuracy (mixed, 4 numbers), the share of answers cut at the token
  budget and each run minus the baseline on the same tasks with its paired 95% interval (score: mixed and 4
  numbers; accuracy: mixed);
- pass@1 and pass@k (k samples: pass@k of a task is 1 when one of them scores 1), and each minus the start's pass@k
  with its paired interval;

and a PNG: each run minus the baseline, mixed, 3 and 4 numbers, with the paired intervals::

    python scripts/studies/options_screen.py --start screen_start.json --baseline uniform \\
        --run uniform=rl_order_none/metrics.jsonl,screen_rl_order_none.json \\
        --run hint=rl_opt_hint/metrics.jsonl,screen_rl_opt_hint.json --passk start=passk_start.json \\
        --markdown screen.md --out screen.png

Refused, one line and exit code 2 (:mod:`rlft.lab.script_io`): a malformed ``--run`` or ``--control``, metrics
without step records, an unreadable evaluation, evaluations of different tasks or with different settings
(:func:`rlft.eval.compare.check_settings`: token budget, prompt template, environment, turn budgets, mode; each
``--allow-setting NAME`` accepts one, as ``rlft eval compare`` does), a ``--baseline`` that is no run's
label, a label given twice, ``--passk`` files without a ``start`` or with one sample per task, an existing output
without ``--overwrite``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from rlft.eval.compare import check_comparable
from rlft.eval.countdown import CountdownEvalResult, paired_difference, read_eval_file, size_summary, subset
from rlft.eval.report import markdown_table, save_panels
from rlft.eval.stats import format_difference
from rlft.fsio import atomic_write_text
from rlft.lab.script_io import ArgumentParser, check_outputs, check_picture, fail, read_labelled_run, run_script

SLICES = {"mixed": None, "3": 3, "4": 4}


def cost(records: list[dict]) -> list[object]:
    """One run's cost row (after its label): steps, groups tried, kept, generated tokens, FLOPs, hinted groups, hinted
    groups with a success, the samples' mean accuracy."""
    def total(key: str) -> str:
        return f"{sum(r[key] for r in records if key in r):g}" if any(key in r for r in records) else "-"

    accuracy = [r["reward/accuracy"] for r in records if "reward/accuracy" in r]
    generated = [r["tokens/generated"] for r in records if "tokens/generated" in r]
    return [len(records), total("groups/tried"), total("groups/kept"), f"{sum(generated):,.0f}" if generated else "-",
            f"{max(r.get('flops/estimated', 0.0) for r in records):.3g}", total("hint/groups"), total("hint/solved"),
            f"{sum(accuracy) / len(accuracy):.3f}" if accuracy else "-"]


def pass_at_all(result: CountdownEvalResult) -> list[list[float]]:
    """Per task, ``[1.0]`` when one of its samples scores 1, else ``[0.0]`` (pass@k with k the samples per task)."""
    return [[float(any(x == 1.0 for x in row))] for row in result.task_scores]


def by_size(result: CountdownEvalResult, rows: list[list[float]], size: int | None) -> list[list[float]]:
    """The rows (one per task of ``result``) of the tasks with ``size`` numbers (None: all): :func:`subset` of
    ``result`` with ``rows`` as its scores."""
    return subset(replace(result, task_scores=rows), size)


def greedy_table(greedy: dict[str, CountdownEvalResult], baseline: str) -> str:
    header = ["model", "score mixed / 3 / 4", "accuracy mixed / 4", "cut", "mean tokens",
              f"- {baseline}, mixed", f"- {baseline}, 4 numbers", f"accuracy - {baseline}, mixed"]
    base, rows = greedy[baseline], []
    for name, result in greedy.items():
        s = size_summary(result)
        diff = ["-"] * 3 if name == baseline else [
            *(format_difference(paired_difference(subset(result, v), subset(base, v))) for v in (None, 4)),
            format_difference(paired_difference(solved(result.task_scores), solved(base.task_scores)))]
        rows.append([name, f"{s['all']['score']:.3f} / {s['3']['score']:.3f} / {s['4']['score']:.3f}",
                     f"{s['all']['accuracy']:.3f} / {s['4']['accuracy']:.3f}", f"{s['all']['truncated_rate']:.0%}",
                     f"{result.mean_completion_tokens:.0f}", *diff])
    return markdown_table(header, rows)


def solved(task_scores: list[list[float]]) -> list[list[float]]:
    """Per task, 1.0 for each sample that scores 1 and 0.0 for any other: the accuracy's rows."""
    return [[float(x == 1.0) for x in row] for row in task_scores]


def passk_table(sampled: dict[str, CountdownEvalResult]) -> str:
    k = sampled["start"].k
    header = ["model", "pass@1 mixed / 4", f"pass@{k} mixed / 4", f"pass@{k} - start, mixed", f"pass@{k} - start, 4"]
    start = pass_at_all(sampled["start"])
    rows = []
    for name, result in sampled.items():
        passed = pass_at_all(result)
        cells = [name]
        for values in (solved(result.task_scores), passed):
            mixed, four = (by_size(result, values, size) for size in (None, 4))
            cells.append(" / ".join(f"{sum(map(sum, v)) / sum(map(len, v)):.3f}" for v in (mixed, four)))
        for size in (None, 4):
            cells.append("-" if name == "start" else format_difference(paired_difference(
                by_size(result, passed, size), by_size(result, start, size))))
        rows.append(cells)
    return markdown_table(header, rows)


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", type=Path, help="the start's greedy evaluation (optional: a row of its own)")
    parser.add_argument("--run", action="append", required=True, help="LABEL=METRICS.jsonl,EVAL.json (repeat)")
    parser.add_argument("--control", action="append", default=[],
                        help="LABEL=METRICS.jsonl,EVAL.json: an SFT run given an RL run's FLOPs (repeat)")
    parser.add_argument("--baseline", default="uniform", help="the label of the run the others are compared with")
    parser.add_argument("--passk", action="append", default=[], help="LABEL=EVAL.json, sampled (repeat; one 'start')")
    parser.add_argument("--markdown", type=Path, required=True, help="the tables to write (a new file)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write (a new file)")
    parser.add_argument("--allow-setting", action="append", default=[],
                        help="an evaluation setting allowed to differ between the files (repeat; as eval compare)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    args = parser.parse_args(argv)
    check_picture("--out", args.out)
    runs = [read_labelled_run(spec, "groups/tried") for spec in args.run]
    runs += [read_labelled_run(spec, "flops/estimated") for spec in args.control]
    labels = [label for label, _, _ in runs]
    if len(set(labels)) < len(labels) or (args.start and "start" in labels):
        fail(f"--run / --control: a label given twice among {labels}")
    passk_specs = [spec.partition("=") for spec in args.passk]
    if any(not label or not path for label, _, path in passk_specs):
        fail("--passk: expected LABEL=EVAL.json")
    check_outputs({"--out": args.out, "--markdown": args.markdown},
                  [*([args.start] if args.start else []), *(p for _, _, p in runs),
                   *(Path(p) for _, _, p in passk_specs)],
                  overwrite=args.overwrite)
    if args.baseline not in labels:
        fail(f"--baseline {args.baseline}: no --run or --control has that label")
    greedy_files = {**({"start": read_eval_file(args.start)} if args.start else {}),
                    **{label: read_eval_file(p) for label, _, p in runs}}
    allowed = tuple(args.allow_setting)
    notes = check_comparable(greedy_files, allowed)
    greedy = {label: result for label, (result, _) in greedy_files.items()}
    text = ["## Cost\n", markdown_table(
        ["run", "steps", "groups tried", "kept", "generated tokens", "FLOPs (est.)", "hinted groups",
         "hinted, solved", "sample accuracy"], [[label, *cost(records)] for label, records, _ in runs]),
        "\n## Greedy scores\n", greedy_table(greedy, args.baseline)]
    if passk_specs:
        sampled_files = {label: read_eval_file(path) for label, _, path in passk_specs}
        sampled = {label: result for label, (result, _) in sampled_files.items()}
        if "start" not in sampled:
            fail("--passk: one file must be labelled start")
        if any(r.k < 2 for r in sampled.values()):
            fail("--passk: sampled evaluations with k >= 2 samples per task are needed")
        notes += check_comparable(sampled_files, allowed)
        text += ["\n## pass@k (sampled, temperature 1)\n", passk_table(sampled)]
    for note in notes:
        print(f"note: {note}")
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.markdown, "\n".join(text) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [label for label, _, _ in runs if label != args.baseline]
    fig, axes = plt.subplots(1, len(SLICES), figsize=(4 * len(SLICES), 3.5), sharey=True)
    for ax, (slice_name, size) in zip(axes, SLICES.items()):
        for i, label in enumerate(others):
            d = paired_difference(subset(greedy[label], size), subset(greedy[args.baseline], size))
            ax.errorbar([i], [d["diff"]], yerr=[[d["diff"] - d["ci_low"]], [d["ci_high"] - d["diff"]]], fmt="o",
                        capsize=4, color=f"C{i}", label=label)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(others)), others)
        ax.set(title=f"{slice_name}: run - {args.baseline}", ylabel="greedy score difference (paired 95% CI)")
    save_panels(fig, axes, args.out)
    print(args.markdown.read_text(), end="")
    print(args.out)


if __name__ == "__main__":
    run_script(main)
