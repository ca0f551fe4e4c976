"""The curriculum screen's curves: SEC's bucket probabilities per step, and the share of training samples cut at the
budget per step for the curriculum run and the uniform run it is compared with.

Reads only two RL runs' ``metrics.jsonl`` (``curriculum/p_<bucket>`` and ``completion/truncated_frac`` records) and
writes one PNG with two panels:

    python scripts/plot_curriculum.py --sec docs/results/countdown-real/data/sec_s0_metrics.jsonl \\
        --uniform docs/results/countdown-real/data/rl_s0_metrics.jsonl \\
        --out docs/results/countdown-real/curriculum_s0.png

Refused, one line and exit code 2 (:mod:`rlft.lab.script_io`), naming the file: metrics that are missing or hold no
curriculum records, an existing ``--out`` without ``--overwrite``, an ``--out`` that is an input. A last metrics line
cut short by a kill is left out (:func:`rlft.lab.script_io.read_metrics`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlft.lab.script_io import ArgumentParser, check_outputs, check_picture, fail, read_metrics, run_script


def load(path: Path) -> list[dict]:
    """The step records of ``path``; ValueError naming it when it is absent or not a metrics file."""
    return [r for r in read_metrics(path) if "step" in r]


def bucket_curves(records: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """``{bucket: (steps, probabilities)}`` from the ``curriculum/p_<bucket>`` keys, in the order first seen."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for r in records:
        for key, value in r.items():
            if key.startswith("curriculum/p_"):
                steps, probs = curves.setdefault(key.removeprefix("curriculum/p_"), ([], []))
                steps.append(r["step"])
                probs.append(value)
    return curves


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sec", type=Path, required=True, help="metrics.jsonl of the --curriculum sec run")
    parser.add_argument("--uniform", type=Path, required=True, help="metrics.jsonl of the uniform run")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write (a new file)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    check_picture("--out", args.out)
    check_outputs({"--out": args.out}, [args.sec, args.uniform], overwrite=args.overwrite)
    sec, uniform = load(args.sec), load(args.uniform)
    curves = bucket_curves(sec)
    if not curves:
        fail(f"{args.sec} has no curriculum/p_<bucket> records (not a --curriculum sec run)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for bucket, (steps, probs) in curves.items():
        left.plot(steps, probs, marker="o", ms=3, label=bucket, linestyle="-" if bucket.startswith("n3") else "--")
    left.axhline(1 / len(curves), color="grey", lw=0.8, label="uniform")
    left.set(xlabel="RL step", ylabel="probability of drawing the bucket",
             title="SEC bandit over (numbers, target band)")
    left.legend(fontsize=7, ncol=2)
    for name, records in (("SEC curriculum", sec), ("uniform", uniform)):
        points = [(r["step"], r["completion/truncated_frac"]) for r in records if "completion/truncated_frac" in r]
        right.plot(*zip(*points), marker="o", ms=3, label=name)
    right.set(xlabel="RL step", ylabel="share of training samples cut",
              title="Training samples cut at the token budget")
    right.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    run_script(main)
