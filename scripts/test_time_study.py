"""Test-time scaling study: best-of-N curves of sampled Countdown evaluations against greedy and single long searches,
at equal generated tokens. Read-only over ``rlft eval countdown --output`` JSON files; nothing is loaded or sampled.

    python scripts/test_time_study.py \\
        --model sft=runs/tts/sft_sampled.json,runs/tts/sft_greedy.json --model rl=runs/tts/rl_sampled.json \\
        --point "bounded greedy=runs/tts/rl_greedy_4096.json" --direct direct=runs/tts/direct_sampled.json \\
        --plot runs/tts/score_vs_tokens.png --markdown runs/tts/study.md

- ``--model NAME=SAMPLED[,GREEDY]``: a sampled evaluation (k samples per task, e.g. 16) and the same model's greedy one
  on the same tasks (checked); without GREEDY, the greedy baseline stored in SAMPLED's ``selection`` (``--select``).
  Every selector the file supports (:func:`rlft.eval.best_of_n.available_selectors`) is applied to the first n samples,
  n in ``--sizes`` (1 2 4 8 16, those <= k), and paired against the greedy answers (95% interval).
- ``--point LABEL=GREEDY``: one evaluation (e.g. greedy with a larger max_new_tokens: a single long search), drawn
  at its tokens per task.
- ``--direct NAME=SAMPLED``: a direct-trace model's samples (no greedy needed): majority and oracle curves.
- ``--versus A B``: two ``--model`` names on the same tasks: A's best-of-N minus B's per selector, at the same n and
  at B's tokens per task (:func:`versus`).

Printed (and written with ``--markdown``): the score-vs-N table (cells ``score (minus greedy [95% CI])``), the tokens
generated per task, the long searches, and for every long search and model the comparison at equal generated tokens
(:func:`rlft.eval.best_of_n.equal_cost_comparison`). ``--plot``: score against tokens per task (log2 x axis), one
line per model x selector with 95% error bars (the interval of the mean selected score over tasks), greedy and long
searches as points.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from rlft.eval.best_of_n import (LABELS, available_selectors, check_same_tasks, equal_cost_comparison, selection_row,
                                 tokens_per_task)
from rlft.eval.countdown import CountdownEvalResult, other_weights, paired_difference, read_eval_file
from rlft.eval.report import markdown_table
from rlft.eval.select import SELECTORS, selected_scores

SIZES = (1, 2, 4, 8, 16)
DIRECT_SELECTORS = ("majority", "oracle")


def load(path: str) -> CountdownEvalResult:
    """An evaluation file (:func:`rlft.eval.countdown.read_eval_file`); SystemExit naming it when it is missing or not an
    evaluation."""
    return load_with_config(path)[0]


def load_with_config(path: str) -> tuple[CountdownEvalResult, dict]:
    """:func:`load` and the file's ``config`` (``{}`` when it has none)."""
    try:
        return read_eval_file(path)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def check_same_weights(name: str, sampled: dict, greedy: dict, greedy_path: str) -> None:
    """SystemExit when both ``config``s record a ``model_sha256`` and they differ: a model's samples are paired only
    with the greedy answers of the same model file."""
    a, b = sampled.get("model_sha256"), greedy.get("model_sha256")
    if other_weights(a, b):
        raise SystemExit(f"--model {name}: {greedy_path} evaluated weights {b[:16]}..., the samples {a[:16]}...: "
                         "pair the greedy evaluation of the same model file")


def named(spec: str, option: str) -> tuple[str, list[str]]:
    """``NAME=PATH[,PATH]`` -> ``(NAME, [PATH, ...])``; SystemExit naming the option otherwise."""
    name, sep, paths = spec.partition("=")
    if not sep or not name.strip() or not paths.strip():
        raise SystemExit(f"{option} {spec!r}: expected NAME=PATH[,PATH]")
    return name.strip(), [p.strip() for p in paths.split(",")]


def mean_ci(scores: list[float]) -> tuple[float, float]:
    """``(mean, half width of its 95% interval)`` over tasks (normal approximation)."""
    d = paired_difference([[x] for x in scores], [[0.0]] * len(scores))
    return d["diff"], d["ci_high"] - d["diff"]


def curves(result: CountdownEvalResult, greedy: list[list[float]] | None, selectors, sizes) -> dict[str, list[dict]]:
    """Per selector, one point per n <= k: :func:`rlft.eval.best_of_n.selection_row` (without greedy: no paired
    difference) plus ``chosen`` (the per-task selected scores) and ``half`` (the score's own 95% half width)."""
    rm = result.task_rm_scores or None
    out = {}
    for name in selectors:
        points = []
        for n in [n for n in sizes if n <= result.k]:
            chosen = selected_scores(name, result.task_scores, result.task_values, result.task_certainty, n, rm)
            tokens = tokens_per_task(result.task_tokens, n)
            row = selection_row(name, n, chosen, greedy if greedy is not None else [[0.0]] * len(chosen), tokens)
            if greedy is None:
                row.update(diff=None, ci_low=None, ci_high=None)
            points.append({**row, "chosen": chosen, "half": mean_ci(chosen)[1]})
        out[name] = points
    return out


def verdict(model: str, label: str, cmp: dict | None, point: dict, span: tuple[float, float]) -> str:
    """One sentence, with numbers, on which is better at the long search's cost."""
    if cmp is None:
        return (f"{model} vs {label}: the long search's {point['tokens']:.0f} tokens per task lie outside {model}'s curve "
                f"({span[0]:.0f}-{span[1]:.0f} tokens per task); no comparison without extrapolating.")
    ci = "" if cmp["ci_low"] is None else f" [95% CI {cmp['ci_low']:+.3f}, {cmp['ci_high']:+.3f}]"
    sure = cmp["ci_low"] is not None and (cmp["ci_low"] > 0 or cmp["ci_high"] < 0)
    winner = f"{model} best-of-N" if cmp["diff"] > 0 else label if cmp["diff"] < 0 else "neither"
    return (f"{model} vs {label}, at {cmp['tokens']:.0f} tokens per task: {LABELS[cmp['selector']]} (between n={cmp['n_low']} "
            f"and n={cmp['n_high']}, w={cmp['w']:.2f}) scores {cmp['score']:.3f}, the long search {cmp['point_score']:.3f}: "
            f"difference {cmp['diff']:+.3f}{ci}; better at equal generated tokens: "
            + (winner if sure or cmp["ci_low"] is None else f"not resolved (the interval includes 0; ahead on the point estimate: {winner})") + ".")


def _cell(p: dict) -> str:
    if p["diff"] is None:
        return f"{p['score']:.3f}"
    return f"{p['score']:.3f} ({p['diff']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}])"


def table(models: dict[str, dict], sizes) -> str:
    """Markdown: per model, a greedy row, one row per selector (cells by n), and the tokens generated per task."""
    header = ["model", "answer", *(f"n={n}" for n in sizes)]
    rows = []
    for name, m in models.items():
        if m["greedy"] is not None:
            g = m["greedy"]
            rows.append([name, f"greedy: {g['score']:.3f}, {g['tokens']:.0f} tokens per task", *("" for _ in sizes)])
        for sel, pts in m["curves"].items():
            by_n = {p["n"]: p for p in pts}
            rows.append([name, LABELS[sel], *(_cell(by_n[n]) if n in by_n else "-" for n in sizes)])
        by_n = {p["n"]: p for p in next(iter(m["curves"].values()), [])}
        rows.append([name, "tokens per task", *(f"{by_n[n]['tokens_per_task']:.0f}" if n in by_n else "-" for n in sizes)])
    return markdown_table(header, rows)


def plot(models: dict[str, dict], points: dict[str, dict], path: Path) -> Path:
    """Score against tokens per task (log2 x): a line per model x selector with 95% error bars; greedy and the long
    searches as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    # colour: the model; line style and marker: the selector
    styles = {"majority": ("-", "o"), "self-certainty": ("--", "s"), "self-certainty-vote": ("-.", "^"),
              "reward-model": ((0, (5, 1, 1, 1, 1, 1)), "D"), "oracle": (":", "x")}
    for c, (name, m) in enumerate(models.items()):
        color = f"C{c}"
        for sel, pts in m["curves"].items():
            linestyle, marker = styles.get(sel, ("-", "o"))
            ax.errorbar([p["tokens_per_task"] for p in pts], [p["score"] for p in pts], yerr=[p["half"] for p in pts],
                        color=color, linestyle=linestyle, marker=marker, ms=4, capsize=2,
                        label=f"{name}: {LABELS[sel]}" + (" (direct)" if m["direct"] else ""))
        if m["greedy"] is not None:
            g = m["greedy"]
            ax.errorbar([g["tokens"]], [g["score"]], yerr=[g["half"]], color=color, marker="s", ms=6, capsize=2,
                        linestyle="none", label=f"{name}: greedy")
    for k, (label, p) in enumerate(points.items()):
        ax.errorbar([p["tokens"]], [p["score"]], yerr=[p["half"]], color="black", marker="*^vD"[k % 4], ms=10,
                    capsize=3, linestyle="none", label=f"{label} (single long search)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens generated per task (log2)")
    ax.set_ylabel("mean score of the answer kept (0 / 0.1 / 1)")
    ax.set_title("Test-time scaling: best-of-N vs a single long search")
    ax.grid(alpha=0.3)
    ncol = 1 + (len(ax.get_legend_handles_labels()[0]) - 1) // 24  # ~24 entries fit beside 5 inches of axes
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=ncol)  # beside the axes: never over a curve
    fig.set_size_inches(10 + 3 * (ncol - 1), 5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def greedy_entry(result: CountdownEvalResult) -> dict:
    score, half = mean_ci([row[0] for row in result.task_scores])
    return {"score": score, "half": half, "tokens": tokens_per_task(result.task_tokens, 1), "task_scores": result.task_scores,
            "tasks": result.tasks}


def build(args) -> tuple[dict, dict]:
    """``(models, points)`` from the parsed options (see the module docstring); SystemExit on a bad file."""
    sizes = sorted(set(args.sizes))
    models = {}
    for spec, direct in [(s, False) for s in args.model] + [(s, True) for s in args.direct]:
        name, paths = named(spec, "--direct" if direct else "--model")
        sampled, sampled_config = load_with_config(paths[0])
        greedy = None
        if not direct and len(paths) > 1:
            g, greedy_config = load_with_config(paths[1])
            check_same_weights(name, sampled_config, greedy_config, paths[1])
            try:
                check_same_tasks(sampled.tasks, g, paths[1])
            except ValueError as e:
                raise SystemExit(f"--model {name}: {e}") from None
            greedy = greedy_entry(g)
        elif not direct:
            stored = sampled.selection.get("greedy")
            if stored is None:
                raise SystemExit(f"--model {name}: {paths[0]} has no stored greedy baseline (run with --select or pass "
                                 "NAME=SAMPLED,GREEDY)")
            score, half = mean_ci([row[0] for row in stored["task_scores"]])
            greedy = {"score": score, "half": half, "tokens": stored["tokens_per_task"], "task_scores": stored["task_scores"],
                      "tasks": sampled.tasks}
        selectors, skipped = available_selectors(sampled, DIRECT_SELECTORS if direct else args.selectors or SELECTORS)
        for sel, why in skipped.items():
            print(f"note: {name}: {sel} skipped: {why}", file=sys.stderr)
        models[name] = {"direct": direct, "greedy": greedy, "tasks": sampled.tasks,
                        "curves": curves(sampled, greedy["task_scores"] if greedy else None, selectors, sizes)}
    points = {}
    for spec in args.point:
        label, paths = named(spec, "--point")
        result = load(paths[0])
        points[label] = {**greedy_entry(result), "accuracy": result.accuracy}
    return models, points


def versus(models: dict[str, dict], names: list[str]) -> str:
    """``--versus A B``: Markdown of model A's best-of-N minus model B's, per selector both have and n of B's curve:
    at the same n (paired task by task, 95% interval), and at B's tokens per task (A's curve of the same selector
    interpolated to B's cost, :func:`rlft.eval.best_of_n.equal_cost_comparison`; "-" for the oracle and where B's cost
    lies outside A's curve; a row only where one of the two exists). SystemExit when A or B is not a ``--model`` name or their tasks differ."""
    if len(names) != 2 or any(n not in models for n in names):
        raise SystemExit(f"--versus {names}: expected two --model names ({', '.join(models)})")
    (na, a), (nb, b) = ((n, models[n]) for n in names)
    if a["tasks"] != b["tasks"]:
        raise SystemExit(f"--versus {names}: {na} and {nb} were evaluated on other tasks (no paired difference)")
    rows = []
    for sel in [s for s in a["curves"] if s in b["curves"]]:
        by_n = {p["n"]: p for p in a["curves"][sel]}
        for q in b["curves"][sel]:
            p, same = by_n.get(q["n"]), "-"
            if p is not None:
                d = paired_difference([[x] for x in p["chosen"]], [[x] for x in q["chosen"]])
                same = f"{p['score']:.3f} - {q['score']:.3f} = {d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
            point = {"tokens": q["tokens_per_task"], "score": q["score"], "task_scores": [[x] for x in q["chosen"]]}
            cmp = None if sel == "oracle" else equal_cost_comparison({sel: a["curves"][sel]}, point)
            at = "-" if cmp is None else (f"{cmp['score']:.3f} (n={cmp['n_low']}-{cmp['n_high']}) - {q['score']:.3f} = "
                                          f"{cmp['diff']:+.3f} [{cmp['ci_low']:+.3f}, {cmp['ci_high']:+.3f}]")
            if p is not None or cmp is not None:  # else B's n is past A's samples and B's cost past A's curve
                tokens = f"{p['tokens_per_task']:.0f}" if p is not None else "-"
                rows.append([LABELS[sel], q["n"], same, f"{tokens} / {q['tokens_per_task']:.0f}", at])
    header = ["selector", "n", f"{na} minus {nb}, same n [95% CI]", "tokens per task", f"{na} at {nb}'s tokens minus {nb}"]
    return f"## {na} against {nb}, task by task\n\n" + markdown_table(header, rows)


def report(models: dict, points: dict, sizes, versus_pairs=()) -> str:
    """The Markdown of the study: the score-vs-N table, the long searches, the equal-cost comparisons."""
    text = ["## Score against N (score (minus greedy [95% CI]); the oracle is pass@n, an upper bound)", "",
            table(models, sizes)]
    if points:
        text += ["", "## Single long searches", "",
                 markdown_table(["long search", "score", "95% CI half width", "tokens per task"],
                                [[k, p["score"], f"{p['half']:.3f}", f"{p['tokens']:.0f}"] for k, p in points.items()]),
                 "", "## At equal generated tokens", ""]
        for label, p in points.items():
            for name, m in models.items():
                xs = [q["tokens_per_task"] for sel, pts in m["curves"].items() if sel != "oracle" for q in pts]
                cmp = equal_cost_comparison(m["curves"], p, same_tasks=m["tasks"] == p["tasks"])
                text.append("- " + verdict(name, label, cmp, p, (min(xs, default=math.nan), max(xs, default=math.nan))))
    for names in versus_pairs:
        text += ["", versus(models, names)]
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], help="NAME=SAMPLED.json[,GREEDY.json]")
    parser.add_argument("--point", action="append", default=[], help="LABEL=EVAL.json: a single long search")
    parser.add_argument("--direct", action="append", default=[], help="NAME=SAMPLED.json: a direct-trace model's samples")
    parser.add_argument("--versus", action="append", nargs=2, default=[], metavar=("A", "B"),
                        help="two --model names: A's best-of-N minus B's, task by task")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="the n's of the curves")
    parser.add_argument("--selectors", nargs="+", choices=SELECTORS, default=None, help="default: all a file supports")
    parser.add_argument("--plot", default="test_time_study.png", help="PNG of score against tokens per task")
    parser.add_argument("--markdown", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    if not args.model and not args.direct:
        parser.error("give at least one --model or --direct")
    if any(n < 1 for n in args.sizes):
        parser.error("--sizes must be >= 1")
    models, points = build(args)
    text = report(models, points, sorted(set(args.sizes)), args.versus)
    print(text)
    if args.markdown:
        Path(args.markdown).expanduser().write_text(text)
    print(f"plot: {plot(models, points, Path(args.plot).expanduser())}")


if __name__ == "__main__":
    main()
