"""One selector minus another on the same samples, task by task: e.g. the reward model's pick minus self-certainty's
in a sampled ``rlft eval countdown --output`` file, at each n (the first n of each task's k samples).

    python scripts/selector_pairs.py docs/results/test-time/data/rl_rebuilt_eval_test_sampled_rm_k16.json.gz \\
        --a reward-model --b self-certainty majority --sizes 2 4 8 16

Prints one line per n and selector B: A's mean selected score, B's, and A minus B with its paired 95% interval
(:func:`rlft.eval.countdown.paired_difference`) and the tasks where A's pick scores higher / lower. Read-only.
Refused (one line, exit code 2: :mod:`rlft.lab.script_io`): a file that is not an evaluation or lacks what a selector
needs, and ``--sizes`` below 1 or above the file's k (they would draw nothing).
"""

from __future__ import annotations

from rlft.eval.best_of_n import available_selectors
from rlft.eval.countdown import paired_difference, read_eval_file
from rlft.eval.select import SELECTORS, selected_scores
from rlft.eval.stats import format_difference
from rlft.lab.script_io import ArgumentParser, fail, run_script


SIZES = (1, 2, 4, 8, 16)
"""The default n's: those up to the file's k."""


def pairs(path: str, a: str, bs: list[str], sizes: list[int] | None = None) -> list[dict]:
    """``[{"n", "b", "a_score", "b_score", "diff", "ci_low", "ci_high", "better", "worse"}]`` for each n <= k in
    ``sizes`` (None: :data:`SIZES` up to k) and each selector of ``bs``. ScriptError (or ValueError) naming the file
    when it is not an evaluation, lacks what a selector needs (e.g. reward-model scores), or has fewer
    than ``max(sizes)`` samples per task; or naming ``--sizes`` when one is below 1."""
    if bad := [n for n in sizes or () if n < 1]:
        fail(f"--sizes must be >= 1, got {' '.join(map(str, bad))}")
    result = read_eval_file(path)[0]
    _, skipped = available_selectors(result, [a, *bs])
    if skipped:
        fail(f"{path}: " + "; ".join(f"{s}: {why}" for s, why in skipped.items()))
    if above := [n for n in sizes or () if n > result.k]:
        fail(f"--sizes {' '.join(map(str, above))}: {path} has {result.k} samples per task (k); the first n of them "
             "are drawn, so n <= k")

    def pick(name: str, n: int) -> list[float]:
        return selected_scores(name, result.task_scores, result.task_values, result.task_certainty, n,
                               result.task_rm_scores or None)

    rows = []
    for n in sorted(set(sizes or [n for n in SIZES if n <= result.k])):
        chosen_a = pick(a, n)
        for b in bs:
            chosen_b = pick(b, n)
            d = paired_difference([[x] for x in chosen_a], [[x] for x in chosen_b])
            rows.append({
                "n": n, "b": b, "a_score": sum(chosen_a) / len(chosen_a), "b_score": sum(chosen_b) / len(chosen_b),
                **{k: d[k]
                   for k in ("diff", "ci_low", "ci_high", "better", "worse")}
            })
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sampled", help="a sampled `rlft eval countdown --output` file")
    parser.add_argument("--a", default="reward-model", choices=SELECTORS, help="the selector whose pick comes first")
    parser.add_argument("--b", nargs="+", default=["self-certainty"], choices=SELECTORS,
                        help="the selectors subtracted")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="the n's (default: 1 2 4 8 16 up to k)")
    args = parser.parse_args(argv)
    for r in pairs(args.sampled, args.a, args.b, args.sizes):
        print(f"n={r['n']:2d} {args.a} {r['a_score']:.3f} minus {r['b']} {r['b_score']:.3f}: "
              f"{format_difference(r)} ({r['better']} / {r['worse']})")


if __name__ == "__main__":
    run_script(main)
