"""Where Countdown answers fail: cut, invalid numbers, arithmetic or search (docs/results/tools/).

Reads ``rlft eval countdown --keep-completions --output`` files (greedy) and sorts every answer that is not correct:

- **cut**: no answer on the last line (scored 0: cut at the token budget or never written);
- **numbers**: an answer that does not use each given number exactly once;
- **arithmetic**: an equation the model wrote itself (``a op b = c`` in its own text, tool observations left out)
  is false, or the answer's value is not what it claims;
- **search**: otherwise: valid numbers and correct arithmetic, but the answer misses the target (the search stopped
  before a solution).

Prints one Markdown row per file, by count of numbers (3, 4, all), with the failures' shares of the answers.

    python scripts/studies/tool_failures.py patient_s0=runs/patient_s0_test.json calc_s0=runs/calc_s0_test.json

Refused, one line and exit code 2 (:mod:`rlft.lab.script_io`): a missing file, an evaluation without completions.
"""

from __future__ import annotations

import re
from collections import Counter

from rlft.eval.countdown import read_eval_file
from rlft.lab.script_io import ArgumentParser, fail, run_script
from rlft.rewards.countdown import evaluate_expression, extract_solution
from rlft.tasks.countdown.calc import trace_segments

EQUATION = re.compile(r"([\d+\-*/() ]+)=\s*(-?\d+(?:\.\d+)?)")
CATEGORIES = ("correct", "cut", "numbers", "arithmetic", "search")


def own_text(completion: str) -> str:
    """The completion without its tool observations (what the model wrote)."""
    return "".join(text for text, own in trace_segments(completion) if own)


def wrong_equation(text: str) -> bool:
    """True when some ``EXPR = c`` in ``text`` is false, ``EXPR`` the longest run of digits, operators and
    parentheses before the ``=`` (``3*7+5=26`` is one equation, not ``5=26``); evaluated exactly by the score's parser
    (division by zero is false)."""
    for expr, value in EQUATION.findall(text):
        expr = expr.strip()
        if not re.search(r"\d\s*[-+*/]", expr):
            continue  # no operation: "x = 5"
        try:
            if abs(float(evaluate_expression(expr)) - float(value)) > 1e-6:
                return True
        except (ValueError, ZeroDivisionError, SyntaxError, TypeError, OverflowError):
            return True
    return False


def category(completion: str, score: float, nums: list[int], target: int) -> str:
    """One of :data:`CATEGORIES` for one greedy answer (its Countdown score given)."""
    if score == 1.0:
        return "correct"
    answer = extract_solution("Assistant:" + completion)
    if score == 0.0 or answer is None:
        return "cut"
    used = sorted(int(n) for n in re.findall(r"\d+", answer))
    if used != sorted(nums):
        return "numbers"
    try:
        value = evaluate_expression(answer)
    except (ValueError, ZeroDivisionError, SyntaxError, TypeError, OverflowError):
        return "arithmetic"
    own = own_text(completion)
    if wrong_equation(own):
        return "arithmetic"
    claimed = re.findall(r"=\s*(-?\d+)", own.splitlines()[-2] if len(own.splitlines()) > 1 else "")
    if claimed and abs(float(value) - int(claimed[-1])) > 1e-6:
        return "arithmetic"
    return "search"


def summarize(path: str) -> dict[str, Counter]:
    """``{"3" | "4" | "all": Counter of categories}`` of one evaluation file."""
    result = read_eval_file(path)[0]
    if not result.task_completions:
        fail(f"{path}: no completions (evaluate with --keep-completions)")
    out: dict[str, Counter] = {"3": Counter(), "4": Counter(), "all": Counter()}
    for task, scores, texts in zip(result.tasks, result.task_scores, result.task_completions):
        for score, text in zip(scores, texts):
            kind = category(text, score, task["nums"], task["target"])
            out[str(len(task["nums"]))][kind] += 1
            out["all"][kind] += 1
    return out


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="LABEL=eval.json (rlft eval countdown --keep-completions --output)")
    args = parser.parse_args(argv)
    print("| model | numbers | n | " + " | ".join(CATEGORIES) + " |")
    print("|---|---|---|" + "---|" * len(CATEGORIES))
    for spec in args.files:
        label, _, path = spec.rpartition("=")
        for size, counts in summarize(path).items():
            n = sum(counts.values())
            shares = " | ".join(f"{counts[c] / n:.3f}" for c in CATEGORIES)
            print(f"| {label or path} | {size} | {n} | {shares} |")


if __name__ == "__main__":
    run_script(main)
