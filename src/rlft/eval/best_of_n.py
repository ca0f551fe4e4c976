"""Best-of-N curves of a sampled Countdown evaluation, paired against a greedy one; and best-of-N chat responses.

One sampling run of k samples per task gives the whole score-vs-N curve: each selector of :mod:`rlft.eval.select`
is applied to the *first* n of every task's k samples, for each n of ``sizes`` (:func:`selection_rows`). Every
selector@n is reported with

- ``score``: the mean rule score (0 / 0.1 / 1) of the selected samples over the tasks; ``accuracy``: the fraction of
  tasks whose selected sample scores 1.0;
- ``diff``, ``ci_low``, ``ci_high``, ``better``, ``worse``: the selected score minus the greedy answer's score on the
  same tasks, with a paired 95% interval (:func:`rlft.eval.countdown.paired_difference`);
- ``tokens_per_task``: the cost, the tokens generated for the first n samples of a task (their sum), averaged over
  the tasks; the same for every selector at a given n (a selector generates all n and keeps one).

``oracle`` (the sample with the best rule score) is the upper bound, not a selector a user can run: its accuracy
is pass@n (the empirical one of the first n samples, not the unbiased estimator over all k).

Chat prompts (``rlft eval winrate --best-of-n``): :func:`pick_best` keeps, per prompt, the response a reward model
(the *selector*) scores highest among the policy's N samples.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlft.eval.countdown import CountdownEvalResult, pass_at_k_sizes, paired_difference
from rlft.eval.select import selected_scores
from rlft.eval.stats import format_difference

LABELS = {"majority": "majority", "self-certainty": "self-certainty", "self-certainty-vote": "self-certainty vote",
          "reward-model": "reward model", "oracle": "oracle = pass@n (upper bound)"}
"""Selector name -> its label in tables (the oracle's says it is an upper bound)."""

RM_INPUT = ("a Countdown sample is scored as the conversation [user: the rendered prompt string (the --prompt-template "
            "text, as given to the policy), assistant: the completion], the layout of the `rlft pairs countdown` rows "
            "an `rlft rm` Countdown reward model trains on")
"""How ``--select-reward-model`` presents a Countdown sample to a chat reward model (written to the JSON)."""


def selection_sizes(k: int, requested: Sequence[int] = ()) -> list[int]:
    """The n's of a curve: ``requested`` sorted without repeats, or (empty) the powers of 2 below ``k`` and ``k``.

    Raises:
        ValueError: an n outside ``[1, k]``.
    """
    if bad := [n for n in requested if not 1 <= n <= k]:
        raise ValueError(f"--select-n {bad[0]} is outside [1, --k {k}]")
    return sorted(set(requested)) if requested else pass_at_k_sizes(k)


def tokens_per_task(task_tokens: list[list[int]], n: int) -> float:
    """Mean over tasks of the summed tokens of each task's first ``n`` samples; NaN without token counts."""
    if not task_tokens:
        return float("nan")
    return sum(sum(row[:n]) for row in task_tokens) / len(task_tokens)


def available_selectors(result: CountdownEvalResult, wanted: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``(selectors of wanted that the result supports, {skipped selector: why})``: the self-certainty ones need
    every sample's certainty, ``reward-model`` needs ``task_rm_scores``."""
    kept, skipped = [], {}
    certain = bool(result.task_certainty) and all(c is not None for row in result.task_certainty for c in row)
    for name in wanted:
        if name.startswith("self-certainty") and not certain:
            skipped[
                name] = "the engine reported no self-certainty for some samples (only the hf row-dropping decoder does)"
        elif name == "reward-model" and not result.task_rm_scores:
            skipped[name] = "no reward-model scores (--select-reward-model)"
        else:
            kept.append(name)
    return kept, skipped


def check_same_tasks(tasks: list[dict], greedy: CountdownEvalResult, source: str) -> None:
    """Refuse a greedy baseline that is not a greedy evaluation of ``tasks`` (``[{"nums", "target"}]``, the sampled
    run's), in the same order.

    Raises:
        ValueError: the message names ``source`` and the first task that differs, or the mode.
    """
    if greedy.mode != "greedy" or greedy.k != 1:
        raise ValueError(
            f"{source} is a {greedy.mode} evaluation with k={greedy.k}; the baseline must be greedy (--mode greedy)")
    if not greedy.tasks:
        raise ValueError(f"{source} names no tasks (an older evaluation file); evaluate greedy again")
    if len(greedy.tasks) != len(tasks):
        raise ValueError(f"{source} has {len(greedy.tasks)} tasks, the sampled evaluation {len(tasks)}: "
                         "evaluate both on the same tasks (--data, --split, --limit, --preset, --split-seed)")
    for i, (g, s) in enumerate(zip(greedy.tasks, tasks)):
        if list(g["nums"]) != list(s["nums"]) or g["target"] != s["target"]:
            raise ValueError(
                f"{source}: task {i} is nums {list(g['nums'])} target {g['target']}, the sampled evaluation's "
                f"is nums {list(s['nums'])} target {s['target']}: the tasks must be the same, in the same order")


def greedy_summary(greedy: CountdownEvalResult, source: str) -> dict:
    """What a selection report keeps of its greedy baseline: ``source`` (a file or "this run"), ``mean_score``,
    ``accuracy``, ``tokens_per_task`` and the per-task ``task_scores`` / ``task_tokens`` (N, 1) the paired intervals
    are computed from."""
    return {"source": source, "mean_score": greedy.mean_score, "accuracy": greedy.accuracy,
            "tokens_per_task": tokens_per_task(greedy.task_tokens, 1), "task_scores": greedy.task_scores,
            "task_tokens": greedy.task_tokens}


def selection_row(name: str, n: int, chosen: list[float], greedy_scores: list[list[float]], tokens: float) -> dict:
    """One selector@n: label, score, accuracy, the paired difference against greedy, tokens per task (module doc)."""
    d = paired_difference([[x] for x in chosen], greedy_scores)
    return {"selector": name, "n": n, "label": LABELS.get(name, name), "upper_bound": name == "oracle",
            "score": sum(chosen) / len(chosen), "accuracy": sum(x == 1.0 for x in chosen) / len(chosen),
            **{key: d[key] for key in ("diff", "ci_low", "ci_high", "better", "worse")}, "tokens_per_task": tokens}


def selection_rows(sampled: CountdownEvalResult, greedy_scores: list[list[float]], selectors: Sequence[str],
                   sizes: Sequence[int]) -> list[dict]:
    """Every selector at every n (selector-major, n ascending) as :func:`selection_row` dicts.

    ``greedy_scores``: the greedy baseline's ``task_scores``, (num_tasks, 1), in the sampled run's task order.

    Raises:
        ValueError: a task count that differs; see :func:`rlft.eval.select.selected_scores`.
    """
    if len(greedy_scores) != sampled.num_tasks:
        raise ValueError(
            f"the greedy baseline has {len(greedy_scores)} tasks, the sampled evaluation {sampled.num_tasks}")
    rm = sampled.task_rm_scores or None
    rows = []
    for name in selectors:
        for n in sizes:
            chosen = selected_scores(name, sampled.task_scores, sampled.task_values, sampled.task_certainty, n, rm)
            rows.append(selection_row(name, n, chosen, greedy_scores, tokens_per_task(sampled.task_tokens, n)))
    return rows


def bracket(xs: list[float], x: float) -> tuple[int, int, float] | None:
    """``(i, j, w)`` with ``xs[i] <= x <= xs[j]``, ``x = (1 - w) xs[i] + w xs[j]``; None when ``x`` lies outside
    ``[min(xs), max(xs)]`` (no extrapolation). ``xs`` ascending."""
    if not xs or not xs[0] <= x <= xs[-1]:
        return None
    for i in range(len(xs) - 1):
        if xs[i] <= x <= xs[i + 1]:
            width = xs[i + 1] - xs[i]
            return i, i + 1, 0.0 if width == 0 else (x - xs[i]) / width
    return len(xs) - 1, len(xs) - 1, 0.0  # a one-point curve hit exactly


def equal_cost_comparison(model_curves: dict[str, list[dict]], point: dict, same_tasks: bool = True) -> dict | None:
    """The best non-oracle selector's curve at the long search's token cost against the long search.

    Each curve is interpolated *linearly in tokens* between the two n's that bracket ``point["tokens"]``: a run that
    uses the smaller n with probability 1 - w and the larger with probability w costs exactly that many tokens on
    average and scores exactly the interpolated mean, so the comparison is at equal expected cost. The best
    selector is the one with the highest interpolated score. ``point``: ``tokens``, ``score``, ``task_scores``
    ((N, 1)); with ``same_tasks`` the difference gets a paired 95% interval from the per-task mixtures.

    Returns:
        None when no non-oracle curve reaches the point's cost; else ``{"selector", "tokens", "score" (interpolated),
        "point_score", "diff", "ci_low", "ci_high" (None without same_tasks), "n_low", "n_high", "w"}``.
    """
    best = None
    for name, pts in model_curves.items():
        if name == "oracle":
            continue
        b = bracket([p["tokens_per_task"] for p in pts], point["tokens"])
        if b is None:
            continue
        i, j, w = b
        score = (1 - w) * pts[i]["score"] + w * pts[j]["score"]
        if best is None or score > best["score"]:
            best = {"selector": name, "tokens": point["tokens"], "score": score, "point_score": point["score"],
                    "diff": score - point["score"], "ci_low": None, "ci_high": None, "n_low": pts[i]["n"],
                    "n_high": pts[j]["n"], "w": w, "_mix": (pts[i]["chosen"], pts[j]["chosen"])}
    if best is None:
        return None
    lo, hi = best.pop("_mix")
    if same_tasks:
        mix = [[(1 - best["w"]) * a + best["w"] * b] for a, b in zip(lo, hi)]
        d = paired_difference(mix, point["task_scores"])
        best.update(diff=d["diff"], ci_low=d["ci_low"], ci_high=d["ci_high"])
    return best


def print_selection(selection: dict, title: str = "Best-of-N selection") -> None:
    """The ``selection`` dict of ``rlft eval countdown`` (``greedy`` and ``rows``) as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("answer", "n", "score", "accuracy", "minus greedy [95% CI]", "better / worse", "tokens per task"):
        table.add_column(column, justify="left" if column == "answer" else "right")
    g = selection["greedy"]
    table.add_row(f"greedy ({g['source']})", "1", f"{g['mean_score']:.4f}", f"{g['accuracy']:.4f}", "-", "-",
                  f"{g['tokens_per_task']:.1f}")
    for row in selection["rows"]:
        table.add_row(row["label"], str(row["n"]), f"{row['score']:.4f}", f"{row['accuracy']:.4f}",
                      format_difference(row), f"{row['better']} / {row['worse']}", f"{row['tokens_per_task']:.1f}")
    Console().print(table)
    for name, why in selection.get("skipped", {}).items():
        Console().print(f"[yellow]{name} skipped[/]: {why}")


def rm_scores(scorer, prompts: list, completions: list[list[str]]) -> list[list[float]]:
    """``(num_tasks, k)`` reward-model scores of every sample: ``scorer.score`` (one call, all samples) on the
    rendered prompt as the user turn and the completion as the assistant turn (:data:`RM_INPUT`)."""
    flat_prompts = [p for p, row in zip(prompts, completions) for _ in row]
    flat = scorer.score(flat_prompts, [c for row in completions for c in row])
    out, i = [], 0
    for row in completions:
        out.append([float(x) for x in flat[i : i + len(row)]])
        i += len(row)
    return out


def pick_best(selector, prompts: list, candidates: list[list[str]]) -> tuple[list[int], list[list[float]]]:
    """Chat best-of-N: per prompt, the index of the candidate response the ``selector`` (anything with
    ``score(prompts, responses) -> list[float]``, e.g. a reward model) scores highest (the first on ties), and all
    the candidates' scores, ``(B, N)``."""
    from rlft.eval.select import best_scored

    scores = rm_scores(selector, prompts, candidates)
    return [best_scored(row) for row in scores], scores
