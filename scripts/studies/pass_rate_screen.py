"""The pass-rate screen's report: ``--curriculum pass-rate`` against the uniform order, from the two RL runs' metrics.

Reads the runs' ``metrics.jsonl`` and writes a Markdown table (per run: steps, groups tried and kept, groups tried per
kept one (the sampling a group with signal cost), generated tokens, estimated FLOPs, the logged
``curriculum/groups_saved`` and ``curriculum/flops_saved`` summed, the first and last ``eval/score``) and a PNG with
two panels: the pass-rate run's bucket probabilities and pass-rate estimates per step, and each run's groups tried
per step (with ``--filter-groups`` a step samples batches of prompts until it holds ``--prompts-per-step`` groups with
signal: fewer tried, less sampling)::

    python scripts/studies/pass_rate_screen.py --pass-rate runs/rl_order_pass-rate/metrics.jsonl \\
        --uniform runs/rl_order_none/metrics.jsonl --markdown screen.md --out screen.png

Refused, one line and exit code 2 (:mod:`rlft.lab.script_io`): metrics missing or without steps, a pass-rate run
without ``curriculum/q_<bucket>`` records, an existing output without ``--overwrite``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlft.eval.report import markdown_table
from rlft.fsio import atomic_write_text
from rlft.lab.script_io import ArgumentParser, check_outputs, check_picture, fail, read_metrics, run_script


def steps_of(path: Path) -> list[dict]:
    """The step records (step >= 1) of ``path``."""
    return [r for r in read_metrics(path) if r.get("step", 0) >= 1 and "groups/tried" in r]


def summary(records: list[dict], evals: list[dict]) -> dict[str, float]:
    """One run's totals: steps, groups tried and kept, generated tokens, the last ``flops/estimated``, the sums of the
    saving's metrics (0 when not logged) and the first and last ``eval/score`` of ``evals`` (NaN when none)."""
    tried = sum(r["groups/tried"] for r in records)
    kept = sum(r["groups/kept"] for r in records)
    scores = [r["eval/score"] for r in evals if "eval/score" in r]
    return {"steps": len(records), "tried": tried, "kept": kept, "per_kept": tried / kept if kept else float("inf"),
            "tokens": sum(r.get("tokens/generated", 0) for r in records),
            "flops": max((r.get("flops/estimated", 0.0) for r in records), default=0.0),
            "groups_saved": sum(r.get("curriculum/groups_saved", 0.0) for r in records),
            "flops_saved": sum(r.get("curriculum/flops_saved", 0.0) for r in records),
            "score_first": scores[0] if scores else float("nan"), "score_last": scores[-1] if scores else float("nan")}


def table(rows: dict[str, dict[str, float]]) -> str:
    """The Markdown table of :func:`summary` rows, one per run name."""
    header = ["run", "steps", "groups tried", "kept", "tried per kept", "generated tokens", "FLOPs (est.)",
              "groups saved (logged)", "FLOPs saved (logged)", "eval/score first -> last"]
    cells = [[name, s["steps"], s["tried"], s["kept"], f"{s['per_kept']:.2f}", f"{s['tokens']:,}", f"{s['flops']:.3g}",
              f"{s['groups_saved']:.1f}", f"{s['flops_saved']:.3g}", f"{s['score_first']:.3f} -> {s['score_last']:.3f}"]
             for name, s in rows.items()]
    return markdown_table(header, cells) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pass-rate", type=Path, required=True, help="metrics.jsonl of the --curriculum pass-rate run")
    parser.add_argument("--uniform", type=Path, required=True, help="metrics.jsonl of the uniform run")
    parser.add_argument("--markdown", type=Path, required=True, help="the table to write (a new file)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write (a new file)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    args = parser.parse_args(argv)
    check_picture("--out", args.out)
    check_outputs({"--out": args.out, "--markdown": args.markdown}, [args.pass_rate, args.uniform],
                  overwrite=args.overwrite)
    runs = {"pass-rate": args.pass_rate, "uniform": args.uniform}
    records = {name: steps_of(path) for name, path in runs.items()}
    for name, path in runs.items():
        if not records[name]:
            fail(f"{path} holds no RL step records")
    estimates = sorted({k.removeprefix("curriculum/q_") for r in records["pass-rate"] for k in r
                        if k.startswith("curriculum/q_")})
    if not estimates:
        fail(f"{args.pass_rate} has no curriculum/q_<bucket> records (not a --curriculum pass-rate run)")
    rows = {name: summary(records[name], read_metrics(runs[name])) for name in runs}
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.markdown, table(rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in records["pass-rate"]]
    for i, bucket in enumerate(estimates):
        color = f"C{i % 10}"
        left.plot(steps, [r[f"curriculum/p_{bucket}"] for r in records["pass-rate"]], color=color, marker="o", ms=3,
                  label=f"{bucket}: P(draw)")
        left.plot(steps, [r[f"curriculum/q_{bucket}"] for r in records["pass-rate"]], color=color, ls=":", lw=1)
    left.set(xlabel="RL step", ylabel="probability (solid) / pass-rate estimate (dotted)",
             title="pass-rate buckets")
    left.legend(fontsize=6, ncol=2)
    for name, recs in records.items():
        right.plot([r["step"] for r in recs], [r["groups/tried"] for r in recs], marker="o", ms=3, label=name)
    right.set(xlabel="RL step", ylabel="groups sampled", title="Groups sampled per step to fill the batch")
    right.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(args.markdown.read_text(), end="")
    print(args.out)


if __name__ == "__main__":
    run_script(main)
