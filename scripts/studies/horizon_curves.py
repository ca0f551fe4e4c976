"""Greedy validation score against estimated training FLOPs, one curve per run: an SFT run to its plateau, the RL run
started from one of its checkpoints and the SFT run continued from there (issue 73's long horizon and its control).

Each ``--curve LABEL=METRICS.jsonl`` is a run's metrics (``flops/estimated``, cumulative in the run, resumed runs
included: the last record of a step counts); ``--from LABEL=OTHER:STEP`` starts it at another curve's step (its FLOPs
are added, so every x is counted from the base model); ``--point LABEL:STEP=EVAL.json`` is the evaluation of that
curve's checkpoint at that step (step 0 of a ``--from`` curve is its start: use the other curve's file). Writes:

- a Markdown table: per point, the FLOPs (est., from the base model), the score (mixed / 3 / 4 numbers), the share of
  answers cut at the token budget, and the paired difference from the curve's previous point (mixed and 4 numbers,
  95% interval): the plateau is where these straddle 0;
- a PNG: score against FLOPs, mixed and 4 numbers, with each point's 95% interval of the mean (unpaired).

    python scripts/studies/horizon_curves.py --curve sft=sft_s0/metrics.jsonl \\
        --point sft:50=sft50.json --point sft:100=sft100.json \\
        --curve rl=rl_s0/metrics.jsonl --from rl=sft:100 --point rl:0=sft100.json --point rl:20=rl20.json \\
        --markdown curves.md --out curves.png

Every file must score the same tasks with the same settings (:func:`rlft.eval.compare.check_comparable`; each
``--allow-setting NAME`` accepts one). Refused, one line and exit code 2 (:mod:`rlft.lab.script_io`): a malformed
option, a label given twice or unknown, a step the metrics do not log, a ``--from`` cycle, unreadable files, different
tasks or settings, an existing output without ``--overwrite``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlft.eval.compare import check_comparable
from rlft.eval.countdown import (CountdownEvalResult, mean_interval, paired_difference, read_eval_file, size_summary,
                                 subset)
from rlft.eval.report import markdown_table, save_panels
from rlft.eval.stats import format_difference
from rlft.fsio import atomic_write_text
from rlft.lab.script_io import ArgumentParser, check_outputs, check_picture, fail, read_metrics, run_script

SLICES = {"mixed": None, "4 numbers": 4}


def step_flops(records: list[dict]) -> dict[int, float]:
    """Step -> cumulative ``flops/estimated`` of a run's records (the last record of a step wins, as after a resume;
    step 0 is 0 FLOPs unless logged)."""
    flops = {0: 0.0}
    for r in records:
        if "step" in r and "flops/estimated" in r:
            flops[int(r["step"])] = float(r["flops/estimated"])
    return flops


def labelled_step(text: str, usage: str) -> tuple[str, int]:
    """``LABEL:STEP`` -> (label, step); ScriptError ``usage`` unless the label is not empty and the step is a whole
    number."""
    label, colon, step = text.rpartition(":")
    if not colon or not label.strip() or not step.strip().isdigit():
        fail(usage)
    return label.strip(), int(step)


def parse_point(spec: str) -> tuple[str, int, str]:
    """``--point LABEL:STEP=PATH`` -> (label, step, path); ScriptError if malformed."""
    usage = f"--point {spec!r}: expected LABEL:STEP=PATH"
    left, _, path = spec.partition("=")
    label, step = labelled_step(left, usage)
    if not path.strip():
        fail(usage)
    return label, step, path.strip()


def parse_from(spec: str) -> tuple[str, str, int]:
    """``--from LABEL=OTHER:STEP`` -> (label, other, step); ScriptError if malformed."""
    usage = f"--from {spec!r}: expected LABEL=OTHER:STEP"
    label, _, right = spec.partition("=")
    if not label.strip():
        fail(usage)
    return (label.strip(), *labelled_step(right, usage))


def offsets(curves: dict[str, dict[int, float]], starts: dict[str, tuple[str, int]]) -> dict[str, float]:
    """Each curve's FLOPs before its step 0: the FLOPs of the point it starts from (recursively), 0 for a curve that
    starts from the base model. ScriptError on an unknown label, a step the other run does not log, or a cycle."""
    out: dict[str, float] = {}

    def resolve(label: str, seen: tuple[str, ...]) -> float:
        if label in out:
            return out[label]
        if label in seen:
            fail(f"--from: a cycle through {' -> '.join((*seen, label))}")
        if label not in starts:
            out[label] = 0.0
            return 0.0
        other, step = starts[label]
        if other not in curves:
            fail(f"--from {label}={other}:{step}: no --curve is labelled {other}")
        if step not in curves[other]:
            fail(f"--from {label}={other}:{step}: {other}'s metrics log no step {step}")
        out[label] = resolve(other, (*seen, label)) + curves[other][step]
        return out[label]

    for label in curves:
        resolve(label, ())
    return out


def curve_rows(points: dict[str, dict[int, CountdownEvalResult]], x: dict[tuple[str, int], float]) -> list[list]:
    """The Markdown rows: per curve, its points in step order, each against the curve's previous point."""
    rows = []
    for label, by_step in points.items():
        previous = None
        for step, result in sorted(by_step.items()):
            s = size_summary(result)
            diff = ["-", "-"] if previous is None else [
                format_difference(paired_difference(subset(result, size), subset(previous, size)))
                for size in SLICES.values()]
            rows.append([label, step, f"{x[label, step]:.3g}",
                         " / ".join(f"{s[k]['score']:.3f}" for k in ("all", "3", "4") if k in s),
                         f"{s['all']['truncated_rate']:.0%}", *diff])
            previous = result
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--curve", action="append", required=True, help="LABEL=METRICS.jsonl (repeat)")
    parser.add_argument("--from", dest="starts", action="append", default=[],
                        help="LABEL=OTHER:STEP: the curve starts at OTHER's step STEP (repeat)")
    parser.add_argument("--point", action="append", required=True, help="LABEL:STEP=EVAL.json (repeat)")
    parser.add_argument("--allow-setting", action="append", default=[],
                        help="an evaluation setting allowed to differ between the files (repeat; as eval compare)")
    parser.add_argument("--markdown", type=Path, required=True, help="the table to write (a new file)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write (a new file)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    args = parser.parse_args(argv)
    check_picture("--out", args.out)
    specs = [spec.partition("=") for spec in args.curve]
    if any(not label.strip() or not path.strip() for label, _, path in specs):
        fail("--curve: expected LABEL=METRICS.jsonl")
    labels = [label.strip() for label, _, _ in specs]
    if len(set(labels)) < len(labels):
        fail(f"--curve: a label given twice among {labels}")
    point_specs = [parse_point(spec) for spec in args.point]
    check_outputs({"--out": args.out, "--markdown": args.markdown},
                  [*(Path(p.strip()) for _, _, p in specs), *(Path(p) for _, _, p in point_specs)],
                  overwrite=args.overwrite)
    flops = {label.strip(): step_flops(read_metrics(path.strip())) for label, _, path in specs}
    starts = {}
    for spec in args.starts:
        label, other, step = parse_from(spec)
        if label not in flops:
            fail(f"--from {spec}: no --curve is labelled {label}")
        starts[label] = (other, step)
    before = offsets(flops, starts)
    points: dict[str, dict[int, CountdownEvalResult]] = {label: {} for label in labels}
    files, x = {}, {}
    for label, step, path in point_specs:
        if label not in flops:
            fail(f"--point {label}:{step}: no --curve is labelled {label}")
        if step not in flops[label]:
            fail(f"--point {label}:{step}: {label}'s metrics log no step {step}")
        if step in points[label]:
            fail(f"--point {label}:{step}: given twice")
        files[f"{label}:{step}"] = read_eval_file(path)
        points[label][step] = files[f"{label}:{step}"][0]
        x[label, step] = before[label] + flops[label][step]
    for note in check_comparable(files, tuple(args.allow_setting)):
        print(f"note: {note}")
    header = ["curve", "step", "FLOPs (est.)", "score mixed / 3 / 4", "cut",
              *(f"- previous point, {name}" for name in SLICES)]
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.markdown, markdown_table(header, curve_rows(points, x)) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SLICES), figsize=(5.5 * len(SLICES), 3.8))
    for ax, (name, size) in zip(axes, SLICES.items()):
        for i, (label, by_step) in enumerate(points.items()):
            steps = sorted(by_step)
            means, halves = zip(*(mean_interval(subset(by_step[s], size)) for s in steps))
            ax.errorbar([x[label, s] for s in steps], means, yerr=halves, fmt="o-", capsize=3, color=f"C{i}",
                        label=label)
        ax.set(title=f"{name}", xlabel="estimated training FLOPs from the base model",
               ylabel="greedy score (95% interval of the mean)")
    save_panels(fig, axes, args.out)
    print(args.markdown.read_text(), end="")
    print(args.out)


if __name__ == "__main__":
    run_script(main)
