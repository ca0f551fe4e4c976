"""Tables and plots of a Countdown ablation (``scripts/countdown_ablation.py``): read-only, from the run files alone.

Every finished variant/seed is paired against the SFT start task by task (mean difference, 95% interval, tasks
better/worse), from the ``eval_*.json`` files of ``--out/<variant>/s<seed>/`` and ``--out/sft_start/``:

    python scripts/ablation_report.py report --out runs/ablation --tasks 500   # table, samples_vs_score.png,
                                                                               # paired_vs_samples.png
    python scripts/ablation_report.py report --out runs/ablation --overwrite   # ... replacing earlier plots
    python scripts/ablation_report.py churn --out runs/ablation --tasks 500    # which tasks each run flips
    python scripts/ablation_report.py compare --pair A.json B.json             # A minus B, paired
                                                                               # (rlft eval compare B A)
    python scripts/ablation_report.py unpack --out runs/bounded/archive        # an archive's files, laid out for report

Variants are listed in the order of ``configs/countdown/ablation/`` (``--configs``). Nothing here loads a model: the
SFT start's evaluation must be there (``countdown_ablation.py run`` writes it). Pairs are :mod:`rlft.eval.compare`'s:
evaluations of other task lists, a missing or unreadable file: one line, exit 2; files that record no task list (the
generated-preset archives) are paired by position, their count checked, with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablation_archive import unpack_archive  # noqa: E402  (the unpack command)
from countdown_ablation import CONFIGS, pairs_file  # noqa: E402  (the runner's folder layout)

from rlft.eval.compare import check_same_tasks, compare_results, load as read  # noqa: E402
from rlft.eval.stats import format_difference  # noqa: E402
from rlft.lab.pipeline import load_variants  # noqa: E402
from rlft.lab.script_io import ArgumentParser, check_outputs, fail, run_script  # noqa: E402

PLOTS = ("samples_vs_score.png", "paired_vs_samples.png")
"""The pictures ``report`` writes in ``--out`` (an existing one is replaced only with ``--overwrite``)."""
UNCHECKED: set[tuple[str, str]] = set()  # files paired by position (one records no task list): main's note


def load(path: Path):  # an evaluation (rlft.eval.compare.load): UsageError naming it when missing or not one
    return read(str(path))[0]


def seed_folders(variants: dict, out: Path, kind: str | None = None):
    """``(variant name, seed folder)`` of every variant in ``variants`` order (of ``kind`` only when given), seeds
    sorted."""
    for name, spec in variants.items():
        if (kind is None or spec["kind"] == kind) and (out / name).exists():
            yield from ((name, folder) for folder in sorted((out / name).glob("s*")))


def paired(a: Path, b: Path) -> dict[str, dict]:
    """A minus B per slice ("all", "3", "4": :func:`rlft.eval.compare.compare_results` with B as its base) of two
    evaluation files of the same tasks. Raises UsageError naming the files when they are of other tasks."""
    ra, rb = load(a), load(b)
    if not check_same_tasks(rb, ra, str(b), str(a), unrecorded_ok=True):
        UNCHECKED.add((str(b), str(a)))
    return compare_results(rb, ra)


def ci(d: dict | None) -> str:
    return format_difference(d) if d else "-"


def report(variants: dict, out: Path, n: int) -> str:
    """Markdown table of every finished variant/seed (greedy on the first ``n`` test tasks) vs the SFT start."""
    def real_cells(folder: Path) -> str:  # greedy score on the real 3- and 4-number rows, when evaluated
        return " | ".join(
            f"{load(found[-1]).mean_score:.3f}" if (found := sorted(folder.glob(f"eval_real{size}_*.json"))) else "-"
            for size in (3, 4))

    def pass_cells(result) -> str:  # sampled pass@1 and pass@4, when evaluated
        return " | ".join(f"{result.pass_at_k[k]:.3f}" if result else "-" for k in (1, 4))

    rows = [
        "| variant | seed | greedy score | paired vs SFT [95% CI] | better/worse | sampled score | pass@1 | pass@4 | "
        "real 3-num | real 4-num | train s |", "|---|---|---|---|---|---|---|---|---|---|---|"
    ]
    s = load(start := out / "sft_start" / f"eval_greedy_{n}.json")
    sampled = load(p) if (p := out / "sft_start" / f"eval_sampled_{n}.json").exists() else None
    sampled_cell = f"{sampled.mean_score:.3f}" if sampled else "-"
    rows.append(f"| SFT start | - | {s.mean_score:.3f} | - | - | {sampled_cell} | {pass_cells(sampled)} | "
                f"{real_cells(out / 'sft_start')} | - |")
    for name, folder in seed_folders(variants, out):
        path = folder / f"eval_greedy_{n}.json"
        if not path.exists():
            continue
        g, d = load(path), paired(path, start)["all"]
        sp = folder / f"eval_sampled_{n}.json"
        smp = load(sp) if sp.exists() else None
        time_file = folder / "train_time.json"
        t = json.loads(time_file.read_text())["seconds"] if time_file.exists() else float("nan")
        extra = f"{smp.mean_score:.3f} ({ci(paired(sp, p)['all'])})" if smp and sampled else "-"
        rows.append(f"| {name} | {folder.name[1:]} | {g.mean_score:.3f} | {ci(d)} | "
                    f"{d['better']}/{d['worse']} | {extra} | {pass_cells(smp)} | {real_cells(folder)} | {t:.0f} |")
    return "\n".join(rows)


def sizes(variants: dict, out: Path, n: int, split: str) -> str:
    """Markdown table of every finished variant/seed on the first ``n`` rows of ``split`` (a setting whose tasks are a
    Countdown dataset's rows): greedy score and the paired difference against the SFT start for mixed, 3-number and
    4-number rows, truncation, and the sampled score's paired difference."""
    def file(folder: Path, mode: str) -> Path:
        return folder / f"eval_{'val_' if split == 'validation' else ''}{mode}_{n}.json"

    def scores(r) -> str:
        return " / ".join(f"{r.by_size[k]['score']:.3f}" if k in r.by_size else "-" for k in ("all", "3", "4"))

    start, sampled_start = file(out / "sft_start", "greedy"), file(out / "sft_start", "sampled")
    s = load(start)
    rows = ["| variant | seed | score (mixed / 3 / 4 numbers) | truncated | minus SFT, mixed | 3 numbers | 4 numbers | "
            "sampled minus SFT |", "|---|---|---|---|---|---|---|---|"]
    ss = f"{load(sampled_start).mean_score:.3f}" if sampled_start.exists() else "-"
    rows.append(f"| SFT start | - | {scores(s)} | {s.truncated_rate:.3f} | - | - | - | {ss} |")
    for name, folder in seed_folders(variants, out):
        if not (path := file(folder, "greedy")).exists():
            continue
        g, d = load(path), paired(path, start)
        cells = [ci(d.get(k)) for k in ("all", "3", "4")]
        sp = file(folder, "sampled")
        sampled = ci(paired(sp, sampled_start)["all"]) if sp.exists() and sampled_start.exists() else "-"
        rows.append(
            f"| {name} | {folder.name[1:]} | {scores(g)} | {g.truncated_rate:.3f} | {' | '.join(cells)} | {sampled} |")
    return "\n".join(rows)


def churn(variants: dict, out: Path, n: int) -> str:
    """Which held-out tasks the finished variants flip: per run, tasks whose greedy score changed vs the SFT
    start (up / down), the tasks changed by any run, and the mean pairwise Pearson correlation of the runs'
    per-task differences (near 0: each run flips its own tasks; near 1: every run flips the same ones; a pair with a
    run that changed no task has no correlation and is left out). Raises UsageError (naming the file) for a missing
    or unreadable SFT start, a run of other tasks, or no finished run."""
    import itertools
    import statistics

    start_path = out / "sft_start" / f"eval_greedy_{n}.json"
    start = [row[0] for row in load(start_path).task_scores]
    diffs = {}
    for name, folder in seed_folders(variants, out):  # the variants' finished seeds, as report() lists them
        if (path := folder / f"eval_greedy_{n}.json").exists():
            paired(path, start_path)  # the same tasks as the start (refused otherwise)
            diffs[f"{name} {folder.name}"] = [row[0] - s0 for row, s0 in zip(load(path).task_scores, start)]
    if not diffs:
        fail(f"no finished run under {out} has an eval_greedy_{n}.json to compare with {start_path}")
    lines = [f"{name}: {sum(d != 0 for d in v)} changed ({sum(d > 0 for d in v)} up, {sum(d < 0 for d in v)} down)"
             for name, v in diffs.items()]
    changed = sum(any(v[i] != 0 for v in diffs.values()) for i in range(len(start)))
    runs = list(itertools.combinations(diffs.values(), 2))
    pairs = [statistics.correlation(a, b) for a, b in runs if len(set(a)) > 1 and len(set(b)) > 1]
    left = f" ({len(runs) - len(pairs)} pairs with a run that changed no task left out)" if len(pairs) < len(
        runs) else ""
    lines.append(f"tasks changed by any run: {changed} of {len(start)}; per-task differences, " + (
        f"mean pairwise correlation {statistics.fmean(pairs):.2f} (min {min(pairs):.2f}, max {max(pairs):.2f}) over "
        f"{len(pairs)} pairs{left}"
        if pairs else f"no pairwise correlation (it needs two runs that changed tasks){left}"))
    return "\n".join(lines)


def inloop_eval_file(folder: Path) -> str:
    """The file-name prefix of the SFT start's greedy evaluation on the rows the RL run in ``folder`` evaluates in its
    loop (its first ``eval_limit`` held-out tasks): ``eval_val_greedy_`` (validation rows) when its ``config.yaml``
    says it trains on a Countdown dataset (``data``, held out) with ``eval_rows: validation``, else ``eval_greedy_``
    (test rows: a generated preset's held-out tasks; also a run without a ``config.yaml``, as the archives of the
    generated-preset studies are). Fields the file lacks take :class:`rlft.rl.config.RLConfig`'s defaults."""
    import yaml

    from rlft.rl.config import RLConfig

    path = folder / "run" / "config.yaml"
    cfg = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    on_validation = (cfg.get("data", RLConfig().data) and cfg.get("data_heldout", RLConfig().data_heldout)
                     and cfg.get("eval_rows", RLConfig().eval_rows) == "validation")
    return "eval_val_greedy_" if on_validation else "eval_greedy_"


def plot_samples_vs_score(variants: dict, out: Path, n_curve: int = 100) -> Path | None:
    """Held-out greedy score (the first ``n_curve`` tasks, logged by the RL loop every 10 steps) against
    samples generated, one line per RL variant/seed, starting at the SFT model's score; ``out/samples_vs_score.png``.

    The start is the SFT start's score on the same rows as the in-loop points (:func:`inloop_eval_file`: validation
    rows for runs on a Countdown dataset, test rows for a generated preset), the first ``n_curve`` tasks of a larger
    evaluation of them; without that evaluation (or when the runs evaluate different rows) no start is drawn. A run
    without a ``config.yaml`` (archives of the generated-preset studies) counts as evaluating test rows."""
    from rlft.checkpoint import read_metrics
    from rlft.eval.report import plot_samples_vs_score as plot_runs

    folders = list(seed_folders(variants, out, "rl"))
    prefixes = {inloop_eval_file(folder) for _, folder in folders}
    start = None
    if len(prefixes) == 1:
        prefix = prefixes.pop()
        for path in sorted((out / "sft_start").glob(f"{prefix}*.json")):
            scores = json.loads(path.read_text())["task_scores"]
            if len(scores) >= n_curve:
                start = sum(row[0] for row in scores[:n_curve]) / n_curve
                break
    runs = {f"{name} s{folder.name[1:]}": read_metrics(folder / "run" / "metrics.jsonl") for name, folder in folders}
    return plot_runs(runs, out / PLOTS[0], start=start, ylabel=f"greedy score ({n_curve} held-out tasks)",
                     title="Held-out score against samples seen")


def samples_generated(variants: dict, out: Path, name: str, folder: Path) -> int | None:
    """Samples a variant/seed generated before its update: an RL run's ``samples/total``, a DPO run's pair prompts x
    samples per prompt (``pairs.stats.json`` of the variant whose pairs it trains on) plus those of the variant it
    starts from (``start_from``), 0 for continued SFT (it trains on its fixed dataset); None when a record is
    missing."""
    from rlft.checkpoint import read_metrics

    spec = variants[name]
    if spec["kind"] == "rl":
        records = read_metrics(folder / "run" / "metrics.jsonl")
        return records[-1]["samples/total"] if records else None
    if spec["kind"] == "dpo":
        from rlft.recipes.pairs import stats_path

        stats = stats_path(pairs_file(variants, out, name, int(folder.name[1:])))
        if not stats.exists():
            return None
        stats = json.loads(stats.read_text())
        own = stats["prompts"] * stats["samples_per_prompt"]
        if "start_from" not in spec:
            return own
        earlier = samples_generated(variants, out, spec["start_from"], out / spec["start_from"] / folder.name)
        return None if earlier is None else own + earlier
    return 0


def plot_paired(variants: dict, out: Path, n: int) -> Path | None:
    """Every finished variant/seed's greedy score on the ``n`` held-out tasks, paired against the SFT start (mean
    difference with its 95% interval), against the samples it generated (:func:`samples_generated`; variants sharing
    an x are spread a little apart, seeds too), with the issue's +0.05 bar; ``out/paired_vs_samples.png`` (None when
    no run is finished)."""
    from rlft.eval.report import plot_paired_vs_samples

    sft = out / "sft_start" / f"eval_greedy_{n}.json"
    if not sft.exists():
        return None
    points = {}
    for name, folder in seed_folders(variants, out):
        path, x = folder / f"eval_greedy_{n}.json", samples_generated(variants, out, name, folder)
        if path.exists() and x is not None:
            d = paired(path, sft)["all"]
            points.setdefault(name, []).append((x, d["diff"], d["ci_low"], d["ci_high"]))
    labelled = {f"{name} ({len(rows)} seed{'s' if len(rows) > 1 else ''})": rows for name, rows in points.items()}
    return plot_paired_vs_samples(
        labelled, out / PLOTS[1], title="Every run on the held-out tasks, paired against the SFT start",
        xlabel="samples generated (continued SFT: 0, it trains on its dataset for RL's compute)",
        ylabel=f"greedy score - SFT start ({n} tasks, 95% CI)", hlines=((0.0, "SFT start", "--"),
                                                                        (0.05, "issue's bar (+0.05)", ":")))


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "command", choices=["report", "sizes", "churn", "compare", "unpack"],
        help="report: the table and plots; sizes: paired by count of numbers (a dataset's rows, --split); "
        "churn: the tasks each run flips; compare: two evaluation files, paired; unpack: copy an "
        "archive's run files (--archive) into --out, for report")
    parser.add_argument("--split", choices=["test", "validation"], default="test", help="sizes: the rows scored")
    parser.add_argument("--out", type=Path, default=Path("runs/ablation"), help="the ablation's run folder")
    parser.add_argument("--tasks", type=int, default=200, help="the test tasks scored (eval_greedy_<N>.json)")
    parser.add_argument("--configs", type=Path, default=CONFIGS, help="the folder of the variant files (their order)")
    parser.add_argument("--archive", type=Path, default=Path("docs/results/countdown-bounded/data"),
                        help="unpack: the folder of archived <variant>_s<seed>_<file> run files")
    parser.add_argument(
        "--pair", nargs=2, type=Path, metavar=("A", "B"),
        help="compare: two eval_*.json files of the same tasks; prints A minus B, paired, with its 95%% CI")
    parser.add_argument("--overwrite", action="store_true", help="report: replace the plots of an earlier report")
    args = parser.parse_args(argv)
    if args.command == "report":  # its plots (in --out): checked before anything is read
        for name in PLOTS:
            check_outputs({"--out": args.out / name}, overwrite=args.overwrite)
    if args.command == "compare" and not args.pair:
        parser.error("compare needs --pair A B")
    if args.command == "compare":
        d = paired(*args.pair)["all"]
        print(f"{args.pair[0]} ({d['mean_b']:.3f}) minus {args.pair[1]} ({d['mean_a']:.3f}) on {d['n']} tasks: "
              f"{format_difference(d)}, better/worse {d['better']}/{d['worse']}")
    elif args.command == "unpack":
        copied = unpack_archive(load_variants(args.configs), args.archive, args.out)
        print(f"{copied} files copied from {args.archive} into {args.out}")
    elif args.command == "churn":
        print(churn(load_variants(args.configs), args.out, args.tasks))
    elif args.command == "sizes":
        print(sizes(load_variants(args.configs), args.out, args.tasks, args.split))
    else:
        print(report(variants := load_variants(args.configs), args.out, args.tasks))
        print(plot_samples_vs_score(variants, args.out))
        print(plot_paired(variants, args.out, args.tasks))
    if UNCHECKED:
        print(f"note: {len(UNCHECKED)} pair(s) of files record no task list (older evaluations), paired by position "
              f"with their number of tasks checked, e.g. {' and '.join(sorted(UNCHECKED)[0])}", file=sys.stderr)


if __name__ == "__main__":  # user errors (a bad variant file, a missing or unreadable evaluation, other tasks):
    run_script(main)  # one line, exit 2
