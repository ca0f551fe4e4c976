"""Run reports: PNG plots (matplotlib) and a Markdown summary of evaluation results."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_panels(fig, axes, path: Path) -> Path:
    """Finish a figure of panels and write it to ``path`` (the format follows its name): a legend and a light grid on
    each of ``axes``, a tight layout, ``path``'s folder made; the figure is closed. Returns ``path``."""
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def save_with_legend_beside(fig, ax, path: Path, *, title: str, xlabel: str, ylabel: str) -> Path:
    """Finish a one-axes figure and write it to ``path``: labels, title, the legend beside the axes (never over a
    line), a tight layout; the figure is closed. Returns ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_curve(records: list[dict], key: str, path: Path, *, title: str, smooth: int = 5) -> Path:
    """Plot ``key`` against ``step`` from metrics records (raw and a moving average); returns ``path``."""
    points = [(r["step"], r[key]) for r in records if key in r]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if points:
        steps, values = zip(*points)
        ax.plot(steps, values, alpha=0.35, label=key)
        if len(values) >= smooth:
            avg = [
                sum(values[max(0, i - smooth + 1):i + 1]) / len(values[max(0, i - smooth + 1):i + 1])
                for i in range(len(values))
            ]
            ax.plot(steps, avg, label=f"{key} (moving avg {smooth})")
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_samples_vs_score(runs: dict[str, list[dict]], path: Path, *, start: float | None = None,
                          start_label: str = "SFT start", ylabel: str = "greedy held-out score",
                          title: str = "Held-out score against samples generated") -> Path | None:
    """Held-out score against samples generated: one line per RL run; returns ``path``, or None when nothing to draw.

    ``runs`` maps a label to the run's metrics records (its ``metrics.jsonl``, as the RL loop logs them): the
    records carrying ``eval/score`` are drawn at their ``samples/total``. ``start`` is the initial model's
    score on the same tasks: a dashed line marks it, and a run with no point at 0 samples (evaluated with
    ``eval_at_start`` off) starts there; ``start_label`` names it in the legend.
    """
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)  # 20 distinct colours: an ablation draws more than tab10's 10 lines
    drawn = 0
    for label, records in runs.items():
        points = [(r["samples/total"], r["eval/score"]) for r in records if "eval/score" in r and "samples/total" in r]
        if not points:
            continue
        if start is not None and points[0][0] != 0:
            points.insert(0, (0, start))
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", label=label)
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    if start is not None:
        ax.axhline(start, color="grey", linestyle="--", linewidth=1, label=start_label)
    return save_with_legend_beside(fig, ax, path, title=title, xlabel="samples generated", ylabel=ylabel)


def plot_paired_vs_samples(points: dict[str, list[tuple[float, float, float, float]]], path: Path, *, title: str,
                           xlabel: str, ylabel: str, hlines: tuple[tuple[float, str, str], ...] = (),
                           connect: bool = False) -> Path | None:
    """Paired differences against samples generated, with their intervals: ``points[label]`` holds ``(x, diff, low,
    high)`` per point (a mean difference and its 95% interval, e.g. :func:`rlft.eval.compare.compare_results`'s
    ``"all"``), drawn as error bars; ``connect`` joins one label's points in order (a run's step-10 and end models).
    Points sharing an x are spread a little apart (1% of the x span each), so none hides another; the others stay
    put. ``hlines``: ``(y, label, linestyle)`` reference lines (0 for the paired reference, a bar). Returns ``path``,
    or None when there is no point (nothing written)."""
    if not any(points.values()):
        return None
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.set_prop_cycle(color=plt.cm.tab10.colors)
    span = max(x for rows in points.values() for x, *_ in rows) or 1
    sharing = Counter(x for rows in points.values() for x, *_ in rows)  # how many points stand at each x
    placed = Counter()
    for label, rows in points.items():
        if not rows:
            continue
        xs, ys, lo, hi = zip(*rows)
        spread = []
        for x in xs:  # the j-th of n points at one x: moved (j - (n - 1) / 2) % of the span
            spread.append(x + (placed[x] - (sharing[x] - 1) / 2) * span / 100)
            placed[x] += 1
        xs = spread
        ax.errorbar(xs, ys, yerr=[[y - low for y, low in zip(ys, lo)], [high - y for y, high in zip(ys, hi)]],
                    fmt="o-" if connect else "o", capsize=3, label=label)
    for y, label, style in hlines:
        ax.axhline(y, color="grey" if style == "--" else "black", linestyle=style, linewidth=1, label=label)
    return save_with_legend_beside(fig, ax, path, title=title, xlabel=xlabel, ylabel=ylabel)


def plot_grouped_bars(values: dict[str, dict[str, float]], path: Path, *, title: str, ylabel: str) -> Path:
    """Grouped bars: ``values[group][series]``, e.g. ``values["easy3"]["sft"] = 0.41``; a series missing from a group
    has no bar there."""
    groups = list(values)
    series = list(dict.fromkeys(s for g in groups for s in values[g]))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(5, 1.8 * len(groups) + 2), 3.5))
    for i, name in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [values[group].get(name, float("nan")) for group in groups]  # a series absent from a group: no bar
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, labels=["" if math.isnan(y) else f"{y:.2f}" for y in ys], fontsize=8)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0,
                max(1.0, max((v for g in values.values() for v in g.values() if not math.isnan(v)), default=1.0)) * 1.1)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    """A GitHub-flavoured Markdown table; floats are printed with 3 decimals."""
    def cell(v: object) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
