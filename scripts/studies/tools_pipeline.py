"""The calculator study's pipeline (docs/results/tools/): each model's test score against the estimated FLOPs its
pipeline used, SFT then RL, with and without the calculator.

Reads a study folder laid out by ``docs/results/tools/run.sh``, ``test.sh`` and ``rl.sh`` (per arm ``patient`` /
``calc`` and seed S: ``sft_<arm>_sS/metrics.jsonl``, ``<arm>_sS_test.json``, ``rl_<arm>_sS/metrics.jsonl``,
``rl_<arm>_sS_test.json``; seeds whose files are all there), or the archive ``docs/results/tools/data``, and writes:

- a Markdown table, one row per arm and seed: the SFT stage's and the whole pipeline's estimated FLOPs (the last
  ``flops/estimated`` of each run's metrics, SFT's plus RL's), the RL steps, the scores after SFT and after RL
  (mixed, 3 and 4 numbers) and RL minus SFT on the same tasks with its paired 95% interval (mixed and 4 numbers);
- a PNG with two panels (mixed, 4 numbers): score against pipeline FLOPs, one line per arm and seed from its SFT
  model to its RL model, with the 95% interval of each mean (unpaired).

    python scripts/studies/tools_pipeline.py --study /work/study --markdown pipeline.md --out pipeline.png

Refused, one line and exit code 2 (:mod:`rlft.lab.script_io`): no seed with all its files, an unreadable file, a
metrics file without ``flops/estimated``, evaluations of one arm and seed on different tasks, an existing output
without ``--overwrite``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlft.compute import final_flops
from rlft.eval.countdown import mean_interval, paired_difference, read_eval_file
from rlft.eval.report import markdown_table
from rlft.eval.stats import format_difference
from rlft.fsio import atomic_write_text
from rlft.lab.script_io import ArgumentParser, check_outputs, check_picture, fail, read_metrics, run_script

ARMS = ("patient", "calc")
SIZES = ("all", "3", "4")


def files(study: Path, arm: str, seed: int) -> dict[str, Path]:
    """The four files of ``arm`` and ``seed`` in ``study``: as the scripts write them, or as archived in
    ``docs/results/tools/data`` (``<run>_metrics.jsonl``, gzipped evaluations), whichever exists (the first if none)."""
    def first(*names: str) -> Path:
        return next((study / n for n in names if (study / n).is_file()), study / names[0])

    return {"sft_metrics": first(f"sft_{arm}_s{seed}/metrics.jsonl", f"sft_{arm}_s{seed}_metrics.jsonl"),
            "sft_eval": first(f"{arm}_s{seed}_test.json", f"{arm}_s{seed}_test.json.gz"),
            "rl_metrics": first(f"rl_{arm}_s{seed}/metrics.jsonl", f"rl_{arm}_s{seed}_metrics.jsonl"),
            "rl_eval": first(f"rl_{arm}_s{seed}_test.json", f"rl_{arm}_s{seed}_test.json.gz")}


def scores(task_scores: list[list[float]], tasks: list[dict], size: str) -> list[list[float]]:
    """The rows of ``task_scores`` whose task has ``size`` numbers ('all': every row)."""
    return [s for s, t in zip(task_scores, tasks) if size == "all" or len(t["nums"]) == int(size)]


def arm_row(paths: dict[str, Path]) -> dict:
    """One arm and seed: FLOPs, RL steps, scores by size after SFT and RL, RL - SFT paired (mixed, 4 numbers)."""
    sft, _ = read_eval_file(paths["sft_eval"])
    rl, _ = read_eval_file(paths["rl_eval"])
    if sft.tasks != rl.tasks:
        fail(f"{paths['sft_eval']} and {paths['rl_eval']} hold different tasks")
    row = {"sft_flops": final_flops(paths["sft_metrics"]),
           "rl_steps": max((r["step"] for r in read_metrics(paths["rl_metrics"])), default=0)}
    row["flops"] = row["sft_flops"] + final_flops(paths["rl_metrics"])
    for stage, result in (("sft", sft), ("rl", rl)):
        for size in SIZES:
            row[f"{stage}_{size}"] = mean_interval(scores(result.task_scores, result.tasks, size))
    for size in ("all", "4"):
        row[f"gain_{size}"] = paired_difference(scores(rl.task_scores, rl.tasks, size),
                                                scores(sft.task_scores, sft.tasks, size))
    return row


def table(rows: dict[tuple[str, int], dict]) -> str:
    """The Markdown table of :func:`arm_row` rows keyed by (arm, seed)."""
    header = ["arm", "seed", "SFT FLOPs", "pipeline FLOPs", "RL steps", "after SFT: mixed / 3 / 4",
              "after RL: mixed / 3 / 4", "RL - SFT, mixed", "RL - SFT, 4 numbers"]
    cells = [[arm, seed, f"{r['sft_flops']:.3g}", f"{r['flops']:.3g}", r["rl_steps"],
              *(" / ".join(f"{r[f'{stage}_{size}'][0]:.3f}" for size in SIZES) for stage in ("sft", "rl")),
              format_difference(r["gain_all"]), format_difference(r["gain_4"])] for (arm, seed), r in rows.items()]
    return markdown_table(header, cells) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, required=True, help="the study folder (run.sh, test.sh, rl.sh outputs)")
    parser.add_argument("--markdown", type=Path, required=True, help="the table to write (a new file)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write (a new file)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    args = parser.parse_args(argv)
    check_picture("--out", args.out)
    seeds = [s for s in range(10) if all(p.is_file() for arm in ARMS for p in files(args.study, arm, s).values())]
    if not seeds:
        fail(f"{args.study} holds no seed with every file of both arms (sft_<arm>_sS/metrics.jsonl, "
             "<arm>_sS_test.json, rl_<arm>_sS/metrics.jsonl, rl_<arm>_sS_test.json)")
    inputs = [p for s in seeds for arm in ARMS for p in files(args.study, arm, s).values()]
    check_outputs({"--out": args.out, "--markdown": args.markdown}, inputs, overwrite=args.overwrite)
    rows = {(arm, s): arm_row(files(args.study, arm, s)) for s in seeds for arm in ARMS}
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.markdown, table(rows))

    from rlft.eval.report import plt, save_panels

    fig, panels = plt.subplots(1, 2, figsize=(11, 4))
    for panel, size, title in zip(panels, ("all", "4"), ("mixed", "4 numbers")):
        for (arm, seed), r in rows.items():
            x = [r["sft_flops"], r["flops"]]
            y, err = zip(r[f"sft_{size}"], r[f"rl_{size}"])
            panel.errorbar(x, y, yerr=err, marker="o" if seed == seeds[0] else "s", capsize=3,
                           color="C1" if arm == "calc" else "C0", ls="-" if seed == seeds[0] else "--",
                           label=f"{arm}, seed {seed}")
        panel.set(xlabel="pipeline FLOPs (estimated): SFT, then SFT + RL", ylabel="score, fresh test rows",
                  title=f"{title}: SFT -> RL")
    save_panels(fig, panels, args.out)
    print(args.markdown.read_text(), end="")
    print(args.out)


if __name__ == "__main__":
    run_script(main)
