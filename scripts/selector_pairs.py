"""One selector minus another on the same samples, task by task: e.g. the reward model's pick minus self-certainty's
in a sampled ``rlft eval countdown --output`` file, at each n (the first n of each task's k samples).

    python scripts/selector_pairs.py docs/results/test-time/data/rl_rebuilt_eval_test_sampled_rm_k16.json \\
        --a reward-model --b self-certainty majority --sizes 2 4 8 16

Prints one line per n and selector B: A's mean selected score, B's, and A minus B with its paired 95% interval
(:func:`rlft.eval.countdown.paired_difference`) and the tasks where A's pick scores higher / lower. Read-only.
"""

from __future__ import annotations

import argparse

from rlft.eval.best_of_n import available_selectors
from rlft.eval.countdown import paired_difference, read_eval_file
from rlft.eval.select import SELECTORS, selected_scores


def pairs(path: str, a: str, bs: list[str], sizes: list[int]) -> list[dict]:
    """``[{"n", "b", "a_score", "b_score", "diff", "ci_low", "ci_high", "better", "worse"}]`` for each n <= k in
    ``sizes`` and each selector of ``bs``. SystemExit naming the file when it is not an evaluation or lacks what a
    selector needs (e.g. reward-model scores)."""
    try:
        result = read_eval_file(path)[0]
    except ValueError as e:
        raise SystemExit(str(e)) from None
    _, skipped = available_selectors(result, [a, *bs])
    if skipped:
        raise SystemExit(f"{path}: " + "; ".join(f"{s}: {why}" for s, why in skipped.items()))

    def pick(name: str, n: int) -> list[float]:
        return selected_scores(name, result.task_scores, result.task_values, result.task_certainty, n,
                               result.task_rm_scores or None)

    rows = []
    for n in [n for n in sizes if n <= result.k]:
        chosen_a = pick(a, n)
        for b in bs:
            chosen_b = pick(b, n)
            d = paired_difference([[x] for x in chosen_a], [[x] for x in chosen_b])
            rows.append({"n": n, "b": b, "a_score": sum(chosen_a) / len(chosen_a), "b_score": sum(chosen_b) / len(chosen_b),
                         **{k: d[k] for k in ("diff", "ci_low", "ci_high", "better", "worse")}})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sampled", help="a sampled `rlft eval countdown --output` file")
    parser.add_argument("--a", default="reward-model", choices=SELECTORS, help="the selector whose pick comes first")
    parser.add_argument("--b", nargs="+", default=["self-certainty"], choices=SELECTORS, help="the selectors subtracted")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="the n's")
    args = parser.parse_args(argv)
    for r in pairs(args.sampled, args.a, args.b, args.sizes):
        print(f"n={r['n']:2d} {args.a} {r['a_score']:.3f} minus {r['b']} {r['b_score']:.3f}: {r['diff']:+.3f} "
              f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] ({r['better']} / {r['worse']})")


if __name__ == "__main__":
    main()
