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

Refused (one line, exit 2: :mod:`rlft.lab.script_io`): an existing ``--markdown`` / ``--plot`` without
``--overwrite``, or one that is an input; a name or label given twice; a greedy file of other tasks, weights, prompt
template or ``max_new_tokens`` (:func:`rlft.eval.countdown.other_settings`); ``--sizes`` above every model's k.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from rlft.eval.best_of_n import (LABELS, available_selectors, check_same_tasks, equal_cost_comparison, selection_row,
                                 tokens_per_task)
from rlft.eval.countdown import (CountdownEvalResult, mean_interval, other_settings, other_weights, paired_difference,
                                 read_eval_file)
from rlft.eval.report import markdown_table, plt
from rlft.eval.select import SELECTORS, selected_scores
from rlft.eval.stats import format_difference
from rlft.fsio import atomic_write_text
from rlft.lab.script_io import ArgumentParser, check_outputs, check_picture, fail, run_script

SIZES = (1, 2, 4, 8, 16)
DIRECT_SELECTORS = ("majority", "oracle")


def check_same_model(name: str, sampled: dict, greedy: dict, greedy_path: str) -> None:
    """ScriptError when the two ``config``s record other weights (``model_sha256``), prompt templates or
    ``max_new_tokens``: samples pair only with the same model file's greedy answers, prompted and cut alike."""
    a, b = sampled.get("model_sha256"), greedy.get("model_sha256")
    if other_weights(a, b):
        fail(f"--model {name}: {greedy_path} evaluated weights {b[:16]}..., the samples {a[:16]}...: "
             "pair the greedy evaluation of the same model file")
    if differ := "; ".join(
            f"{key} {a!r} in the samples, {b!r} there" for key, (a, b) in other_settings(sampled, greedy).items()):
        fail(f"--model {name}: {greedy_path} was evaluated with other settings ({differ}): "
             "pair a greedy evaluation alike")


def named(spec: str, option: str) -> tuple[str, list[str]]:
    """``NAME=PATH[,PATH]`` -> ``(NAME, [PATH, ...])``; ScriptError naming the option otherwise."""
    name, sep, paths = spec.partition("=")
    if not sep or not name.strip() or not paths.strip() or any(not p.strip() for p in paths.split(",")):
        fail(f"{option} {spec!r}: expected NAME=PATH[,PATH]")
    return name.strip(), [p.strip() for p in paths.split(",")]


def parse_specs(args) -> tuple[list[tuple[str, list[str], bool]], list[tuple[str, str]]]:
    """``([(name, paths, direct)], [(label, path)])`` of the options; ScriptError when a name or label is given
    twice."""
    models = [(*named(s, "--direct" if direct else "--model"), direct)
              for s, direct in [(s, False) for s in args.model] + [(s, True) for s in args.direct]]
    points = [(label, paths[0]) for label, paths in (named(s, "--point") for s in args.point)]
    for kind, names in (("--model / --direct name", [m[0] for m in models]), ("--point label", [p[0] for p in points])):
        if twice := sorted({n for n in names if names.count(n) > 1}):
            fail(f"{kind} {', '.join(map(repr, twice))} given twice: give each a name of its own")
    return models, points


def mean_ci(scores: list[float]) -> tuple[float, float]:
    """``(mean, half width of its 95% interval)`` over tasks (normal approximation)."""
    return mean_interval([[x] for x in scores])


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
        return (f"{model} vs {label}: the long search's {point['tokens']:.0f} tokens per task lie outside "
                f"{model}'s curve ({span[0]:.0f}-{span[1]:.0f} tokens per task); no comparison without extrapolating.")
    ci = "" if cmp["ci_low"] is None else f" [95% CI {cmp['ci_low']:+.3f}, {cmp['ci_high']:+.3f}]"
    sure = cmp["ci_low"] is not None and (cmp["ci_low"] > 0 or cmp["ci_high"] < 0)
    winner = f"{model} best-of-N" if cmp["diff"] > 0 else label if cmp["diff"] < 0 else "neither"
    return (f"{model} vs {label}, at {cmp['tokens']:.0f} tokens per task: {LABELS[cmp['selector']]} (between "
            f"n={cmp['n_low']} and n={cmp['n_high']}, w={cmp['w']:.2f}) scores {cmp['score']:.3f}, the long search "
            f"{cmp['point_score']:.3f}: difference {cmp['diff']:+.3f}{ci}; better at equal generated tokens: "
            + (winner if sure or cmp["ci_low"] is None else
               f"not resolved (the interval includes 0; ahead on the point estimate: {winner})") + ".")


def _cell(p: dict) -> str:
    return f"{p['score']:.3f}" if p["diff"] is None else f"{p['score']:.3f} ({format_difference(p)})"


def table(models: dict[str, dict], sizes) -> str:
    """Markdown: per model, a greedy row, one row per selector (cells by n), and the tokens generated per task."""
    header = ["model", "answer", *(f"n={n}" for n in sizes)]
    rows = []
    for name, m in models.items():
        if (g := m["greedy"]) is not None:
            rows.append([name, f"greedy: {g['score']:.3f}, {g['tokens']:.0f} tokens per task", *("" for _ in sizes)])
        for sel, pts in m["curves"].items():
            by_n = {p["n"]: p for p in pts}
            rows.append([name, LABELS[sel], *(_cell(by_n[n]) if n in by_n else "-" for n in sizes)])
        by_n = {p["n"]: p for p in next(iter(m["curves"].values()), [])}
        rows.append([name, "tokens per task",
                     *(f"{by_n[n]['tokens_per_task']:.0f}" if n in by_n else "-" for n in sizes)])
    return markdown_table(header, rows)


def plot(models: dict[str, dict], points: dict[str, dict], path: Path) -> Path:
    """Score against tokens per task (log2 x): a line per model x selector with 95% error bars; greedy and the long
    searches as points."""
    fig, ax = plt.subplots(figsize=(10, 5))
    # colour: the model; line style and marker: the selector
    styles = {"majority": ("-", "o"), "self-certainty": ("--", "s"), "self-certainty-vote": ("-.", "^"),
              "reward-model": ((0, (5, 1, 1, 1, 1, 1)), "D"), "oracle": (":", "x")}
    for c, (name, m) in enumerate(models.items()):
        for sel, pts in m["curves"].items():
            linestyle, marker = styles.get(sel, ("-", "o"))
            ax.errorbar([p["tokens_per_task"] for p in pts], [p["score"] for p in pts], yerr=[p["half"] for p in pts],
                        color=f"C{c}", linestyle=linestyle, marker=marker, ms=4, capsize=2,
                        label=f"{name}: {LABELS[sel]}" + (" (direct)" if m["direct"] else ""))
        if (g := m["greedy"]) is not None:
            ax.errorbar([g["tokens"]], [g["score"]], yerr=[g["half"]], color=f"C{c}", marker="s", ms=6, capsize=2,
                        linestyle="none", label=f"{name}: greedy")
    for k, (label, p) in enumerate(points.items()):
        ax.errorbar([p["tokens"]], [p["score"]], yerr=[p["half"]], color="black", marker="*^vD"[k % 4], ms=10,
                    capsize=3, linestyle="none", label=f"{label} (single long search)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="tokens generated per task (log2)", ylabel="mean score of the answer kept (0 / 0.1 / 1)",
           title="Test-time scaling: best-of-N vs a single long search")
    ax.grid(alpha=0.3)
    ncol = 1 + (len(ax.get_legend_handles_labels()[0]) - 1) // 24  # ~24 entries fit beside 5 inches of axes
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=ncol)  # beside the axes, not over a curve
    fig.set_size_inches(10 + 3 * (ncol - 1), 5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def greedy_entry(result: CountdownEvalResult) -> dict:
    score, half = mean_ci([row[0] for row in result.task_scores])
    return {"score": score, "half": half, "tokens": tokens_per_task(result.task_tokens, 1),
            "task_scores": result.task_scores, "tasks": result.tasks}


def build(args) -> tuple[dict, dict, list[int]]:
    """``(models, points, the n's)`` from the parsed options (module docstring); ScriptError or ValueError naming a
    file."""
    sizes = sorted(set(args.sizes or SIZES))
    specs, point_specs = parse_specs(args)
    models = {}
    for name, paths, direct in specs:
        sampled, sampled_config = read_eval_file(paths[0])
        greedy = None
        if not direct and len(paths) > 1:
            g, greedy_config = read_eval_file(paths[1])
            check_same_model(name, sampled_config, greedy_config, paths[1])
            try:
                check_same_tasks(sampled.tasks, g, paths[1])
            except ValueError as e:
                fail(f"--model {name}: {e}")
            greedy = greedy_entry(g)
        elif not direct:
            stored = sampled.selection.get("greedy")
            if stored is None:
                fail(f"--model {name}: {paths[0]} has no stored greedy baseline "
                     "(run with --select or pass NAME=SAMPLED,GREEDY)")
            score, half = mean_ci([row[0] for row in stored["task_scores"]])
            greedy = {"score": score, "half": half, "tokens": stored["tokens_per_task"],
                      "task_scores": stored["task_scores"], "tasks": sampled.tasks}
        selectors, skipped = available_selectors(sampled, DIRECT_SELECTORS if direct else args.selectors or SELECTORS)
        for sel, why in skipped.items():
            print(f"note: {name}: {sel} skipped: {why}", file=sys.stderr)
        models[name] = {"direct": direct, "greedy": greedy, "tasks": sampled.tasks, "k": sampled.k,
                        "curves": curves(sampled, greedy["task_scores"] if greedy else None, selectors, sizes)}
    if (above := [n for n in sizes if n > max(m["k"] for m in models.values())]) and args.sizes:
        fail(f"--sizes {' '.join(map(str, above))}: more than every model's samples per task "
             f"(k {', '.join(str(m['k']) for m in models.values())}): they would draw nothing")
    points = {}
    for label, path in point_specs:
        result = read_eval_file(path)[0]
        points[label] = {**greedy_entry(result), "accuracy": result.accuracy}
    return models, points, [n for n in sizes if n not in above]


def versus(models: dict[str, dict], names: list[str]) -> str:
    """``--versus A B``: Markdown of model A's best-of-N minus model B's, per selector both have and n of B's curve:
    at the same n (paired task by task, 95% interval), and at B's tokens per task (A's curve of the same selector
    interpolated to B's cost, :func:`rlft.eval.best_of_n.equal_cost_comparison`; "-" for the oracle and where B's cost
    lies outside A's curve; a row only where one of the two exists). ScriptError when A or B is not a ``--model`` name
    or their tasks differ."""
    if len(names) != 2 or any(n not in models for n in names) or names[0] == names[1]:
        fail(f"--versus {names}: expected two different --model names ({', '.join(models)})")
    (na, a), (nb, b) = ((n, models[n]) for n in names)
    if a["tasks"] != b["tasks"]:
        fail(f"--versus {names}: {na} and {nb} were evaluated on other tasks (no paired difference)")
    rows = []
    for sel in [s for s in a["curves"] if s in b["curves"]]:
        by_n = {p["n"]: p for p in a["curves"][sel]}
        for q in b["curves"][sel]:
            p, same = by_n.get(q["n"]), "-"
            if p is not None:
                d = paired_difference([[x] for x in p["chosen"]], [[x] for x in q["chosen"]])
                same = f"{p['score']:.3f} - {q['score']:.3f} = {format_difference(d)}"
            point = {"tokens": q["tokens_per_task"], "score": q["score"], "task_scores": [[x] for x in q["chosen"]]}
            cmp = None if sel == "oracle" else equal_cost_comparison({sel: a["curves"][sel]}, point)
            at = "-" if cmp is None else (f"{cmp['score']:.3f} (n={cmp['n_low']}-{cmp['n_high']}) - {q['score']:.3f} = "
                                          + format_difference(cmp))
            if p is not None or cmp is not None:  # else B's n is past A's samples and B's cost past A's curve
                tokens = f"{p['tokens_per_task']:.0f}" if p is not None else "-"
                rows.append([LABELS[sel], q["n"], same, f"{tokens} / {q['tokens_per_task']:.0f}", at])
    header = ["selector", "n", f"{na} minus {nb}, same n [95% CI]", "tokens per task",
              f"{na} at {nb}'s tokens minus {nb}"]
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
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], help="NAME=SAMPLED.json[,GREEDY.json]")
    parser.add_argument("--point", action="append", default=[], help="LABEL=EVAL.json: a single long search")
    parser.add_argument("--direct", action="append", default=[],
                        help="NAME=SAMPLED.json: a direct-trace model's samples")
    parser.add_argument("--versus", action="append", nargs=2, default=[], metavar=("A", "B"),
                        help="two --model names: A's best-of-N minus B's, task by task")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="the n's of the curves (1 2 4 8 16 up to k)")
    parser.add_argument("--selectors", nargs="+", choices=SELECTORS, default=None, help="default: all a file supports")
    parser.add_argument("--plot", default="test_time_study.png", help="PNG of score against tokens per task")
    parser.add_argument("--markdown", default=None, help="also write the report here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --plot / --markdown")
    args = parser.parse_args(argv)
    if not args.model and not args.direct:
        fail("give at least one --model or --direct")
    if any(n < 1 for n in args.sizes or ()):
        fail(f"--sizes must be >= 1, got {' '.join(map(str, args.sizes))}")
    check_picture("--plot", args.plot)
    specs, point_specs = parse_specs(args)
    inputs = [p for _, paths, _ in specs for p in paths] + [p for _, p in point_specs]
    out = check_outputs({"--markdown": args.markdown, "--plot": args.plot}, inputs, overwrite=args.overwrite)
    models, points, sizes = build(args)
    print(text := report(models, points, sizes, args.versus))
    if "--markdown" in out:
        atomic_write_text(out["--markdown"].expanduser(), text)
    print(f"plot: {plot(models, points, out['--plot'].expanduser())}")


if __name__ == "__main__":
    run_script(main)
