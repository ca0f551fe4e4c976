"""Countdown reward, exactly compatible with TinyZero's ``countdown.compute_score`` -- without ``eval``.

The Countdown task: given ``numbers`` and a ``target``, write an arithmetic expression that uses every
number exactly once and evaluates to the target. ``ground_truth = {"target": int, "numbers": list[int]}``
(the verl / TinyZero signature, so this is a drop-in replacement).

Rules of the reference (TinyZero ``verl/utils/reward_score/countdown.py``), reproduced exactly
==========================================================================================
1. **Response.** The input is the full decoded text, prompt included. Keep what follows the first
   ``"Assistant:"``; if that marker is absent, what follows the first ``"<|im_start|>assistant"``;
   if neither is present the score is ``0``.
2. **Last line only.** Keep only the text after the last ``"\\n"`` of the response.
3. **Answer.** On that line, take the *last* match of ``<answer>(.*?)</answer>`` (non-overlapping
   matches, left to right, as ``re.finditer`` finds them) and ``.strip()`` it. No match -> ``0``.
   An empty ``<answer></answer>`` *is* an answer (it then fails the checks below -> format score).
4. **Numbers.** The digit runs of the answer (``re.findall(r"\\d+", answer)``, each ``int``-ed), sorted,
   must equal ``sorted(numbers)``: each given number used exactly once, no extra constants. This is a
   purely textual check, so ``"3.5"`` counts as the numbers 3 and 5, and ``"05"`` as the number 5.
   Failure -> ``format_score``.
5. **Characters.** The answer must match ``^[\\d+\\-*/().\\s]+$`` (digits, ``+ - * / ( ) .``,
   whitespace), so ``=``, letters, ``%``, ``^`` ... all fail -> ``format_score``.
6. **Evaluation.** The reference evaluates the answer as a Python expression (``eval`` with
   ``{"__builtins__": None}``). Here it is parsed with :func:`ast.parse` -- the very same parser -- and
   evaluated by a small tree walker with Python's own arithmetic: ``+ - * / // **`` and unary ``+ -``
   on ``int``/``float`` literals; ints stay exact, ``/`` is true division, ``2**-1 == 0.5``, a negative
   base to a fractional power is complex, exactly as in Python. Anything that raises in Python
   (``SyntaxError`` such as ``05`` or ``1.2.3``, ``ZeroDivisionError``, ``OverflowError`` such as
   ``10.0**400``) -> ``format_score``. Every other construct the allowed characters can spell
   (``()``, ``...``, calls such as ``(1)(2)``) has a non-numeric value or raises in the reference, so it
   can never be correct there either -> ``format_score``.
7. **Comparison.** Correct iff ``abs(value - target) < 1e-5`` -> ``score``; otherwise (or if the
   comparison itself raises) -> ``format_score``.

So the result is ``0.0`` (no answer found), ``format_score`` (answer found but not a correct use of the
numbers) or ``score`` (correct). ``method`` is accepted and ignored, as in the reference.

The only deliberate deviation: bounded work
-------------------------------------------
The reference can hang or exhaust memory on hostile answers (``9**9**9**9``); ``re.finditer`` on a
megabyte of ``<answer>`` tags without a closing tag is quadratic. Here:

* the answer tags are found by a linear scan with the same semantics as the reference regex;
* an answer longer than :data:`MAX_EXPRESSION_CHARS` characters gets ``format_score`` without being
  examined (a real Countdown answer is a few dozen characters);
* an integer intermediate result of more than :data:`MAX_INT_BITS` bits is refused (checked *before*
  computing ``*`` and ``**``) -> ``format_score``. Such an answer can only score in the reference if
  later operations cancel the huge value back down to the target, which needs a ground truth with
  absurd numbers (e.g. ``2**70000 - 2**70000 + 5``);
* parser limits (about 200 nested parentheses, a few thousand chained operators) are CPython's own,
  identical for ``ast.parse`` and the reference's ``eval``; the exact limit depends on how deep the
  Python stack already is, so an answer right at that limit may fail here and pass there.

A "lenient" variant (not the default)
-------------------------------------
The last-line rule makes the reference give ``0`` to a correct answer that is followed by anything on
a later line (e.g. ``"<answer>1+2</answer>\\nDone."``), and it requires an assistant marker.
:func:`compute_score_lenient` changes exactly that: the marker is optional (without one the whole text
is the response) and the last answer tag anywhere in the response counts (a tag still has to open and
close on one line, as the regex's ``.`` does not match a newline). This is the extraction used by the
cognitive-behaviors fork of TinyZero. Everything else (number check, characters, evaluation) is
unchanged. A further relaxation some projects use -- accepting ``"expr = target"`` by scoring the left
side of ``=`` -- is *not* implemented: such answers get ``format_score`` in both variants.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "MAX_EXPRESSION_CHARS",
    "MAX_INT_BITS",
    "compute_score",
    "compute_score_lenient",
    "evaluate_expression",
    "extract_solution",
    "score_completions",
]

#: Answers longer than this many characters get the format score without being examined.
MAX_EXPRESSION_CHARS = 10_000
#: Integer intermediate results with more bits than this are refused (``ValueError``).
#: 65,536 bits is about 19,700 decimal digits: far beyond any Countdown answer, yet cheap to compute.
MAX_INT_BITS = 1 << 16

_ASSISTANT_MARKERS = ("Assistant:", "<|im_start|>assistant")  # checked in this order
_OPEN, _CLOSE = "<answer>", "</answer>"
_ALLOWED_CHARS = re.compile(r"^[\d+\-*/().\s]+$")  # used with .match(), as in the reference
_DIGIT_RUN = re.compile(r"\d+")

_BINARY_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY_OPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


# ----------------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------------


def _response_after_marker(text: str) -> str | None:
    """What follows the first ``"Assistant:"`` (else the first ``"<|im_start|>assistant"``); None if neither."""
    for marker in _ASSISTANT_MARKERS:
        if marker in text:
            return text.split(marker, 1)[1]
    return None


def _answer_tags(text: str):
    """Yield the group of every match of ``<answer>(.*?)</answer>`` in ``text``, like ``re.finditer``.

    Same matches as the regex (left to right, non-overlapping, ``.`` not matching ``"\\n"``), but in
    linear time: the regex rescans to the end of the line from every unclosed ``<answer>``.
    """
    pos, line_end = 0, -1
    while True:
        start = text.find(_OPEN, pos)
        if start < 0:
            return
        if start > line_end:  # entered a new line: find where it ends
            line_end = text.find("\n", start)
            if line_end < 0:
                line_end = len(text)
        body = start + len(_OPEN)
        end = text.find(_CLOSE, body, line_end)
        if end < 0:  # no closing tag on this line: no match can start anywhere on it
            pos = line_end + 1
            continue
        yield text[body:end]
        pos = end + len(_CLOSE)


def _last_answer(text: str) -> str | None:
    """The stripped group of the last ``<answer>...</answer>`` match in ``text``, or None."""
    last = None
    for last in _answer_tags(text):
        pass
    return None if last is None else last.strip()


def extract_solution(solution_str: str) -> str | None:
    """The answer the reference would score (rules 1-3 of the module docstring), or None if there is none."""
    response = _response_after_marker(solution_str)
    if response is None:
        return None
    last_line = response.rpartition("\n")[2]  # == response.split("\n")[-1]
    return _last_answer(last_line)


# ----------------------------------------------------------------------------------------------------
# Checking and evaluating an answer
# ----------------------------------------------------------------------------------------------------


def _uses_exactly(expr: str, numbers: Any) -> bool:
    """Rule 4: the digit runs of ``expr`` are exactly the multiset ``numbers`` (False if comparing raises)."""
    try:
        used = sorted(int(run) for run in _DIGIT_RUN.findall(expr))
        return used == sorted(numbers)
    except Exception:  # e.g. a digit run too long for int() or unsortable numbers: the reference says False
        return False


def _bounded(value: Any) -> Any:
    """``value`` unchanged, or ValueError if it is an int of more than MAX_INT_BITS bits."""
    if type(value) is int and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"integer of more than {MAX_INT_BITS} bits")
    return value


def _apply_binary(op: type[ast.operator], left: Any, right: Any) -> Any:
    """``left <op> right`` with Python semantics, refusing int results of more than MAX_INT_BITS bits.

    For ``*`` and ``**`` on ints the size is bounded *before* computing (operands are already bounded,
    so every other operation is cheap).
    """
    if type(left) is int and type(right) is int:
        if op is ast.Mult and left.bit_length() + right.bit_length() - 1 > MAX_INT_BITS:
            raise ValueError("product too large")
        if op is ast.Pow and abs(left) > 1 and right > 0:
            # |left| >= 2 ** (bits - 1), so the power has at least (bits - 1) * right + 1 bits.
            if (left.bit_length() - 1) * right + 1 > MAX_INT_BITS:
                raise ValueError("power too large")
    return _bounded(_BINARY_OPS[op](left, right))


def _evaluate_tree(root: ast.expr) -> Any:
    """Evaluate a parsed arithmetic expression (iteratively: the parser allows ~3000 levels of nesting).

    Operands are evaluated left before right, as Python does. Raises ValueError on a node other than
    a number literal or an allowed unary/binary operator, and whatever Python's arithmetic raises.
    """
    values: list[Any] = []
    todo: list[tuple[ast.expr, bool]] = [(root, False)]  # (node, operands already evaluated?)
    while todo:
        node, operands_done = todo.pop()
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            values.append(_bounded(node.value))
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
            if operands_done:
                values.append(_UNARY_OPS[type(node.op)](values.pop()))
            else:
                todo += [(node, True), (node.operand, False)]
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            if operands_done:
                right = values.pop()
                left = values.pop()
                values.append(_apply_binary(type(node.op), left, right))
            else:
                todo += [(node, True), (node.right, False), (node.left, False)]
        else:
            # (), ..., calls like (1)(2): in the reference these raise or are non-numeric, never correct.
            raise ValueError(f"not an arithmetic expression: {type(node).__name__}")
    return values.pop()


def evaluate_expression(expr: str) -> int | float | complex:
    """Value of an arithmetic expression, as Python would compute it, without ``eval``.

    Accepts exactly what the reference's ``evaluate_equation`` accepts: the characters
    ``[\\d+\\-*/().\\s]`` and Python expression syntax (leading spaces/tabs are ignored, as by ``eval``).
    Returns an ``int``, ``float``, or -- for a negative number to a fractional power -- a ``complex``.

    Raises ValueError (chaining the original error, if any) whenever the reference would return None:
    disallowed characters, a syntax error, a non-arithmetic construct, or an arithmetic error
    (``ZeroDivisionError``, ``OverflowError``, ...). Also raises ValueError, instead of doing unbounded
    work, for expressions longer than MAX_EXPRESSION_CHARS or int intermediates beyond MAX_INT_BITS.
    """
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    if not _ALLOWED_CHARS.match(expr):
        raise ValueError("invalid characters in expression")
    try:
        # SyntaxError, or RecursionError / MemoryError from CPython's parser limits on deep nesting.
        tree = ast.parse(expr.lstrip(" \t"), mode="eval")
        return _evaluate_tree(tree.body)
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"cannot evaluate {expr[:50]!r}: {type(exc).__name__}: {exc}") from exc


# ----------------------------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------------------------


def _score_answer(answer: str | None, ground_truth: Mapping[str, Any], format_score: float, score: float) -> float:
    """Rules 4-7 for an extracted answer (None -> 0.0). Raises KeyError if ground_truth lacks a key."""
    target = ground_truth["target"]
    numbers = ground_truth["numbers"]
    if answer is None:
        return 0.0
    if len(answer) > MAX_EXPRESSION_CHARS:  # bounded work; same result as below unless absurdly long
        return format_score
    if not _uses_exactly(answer, numbers):
        return format_score
    try:
        value = evaluate_expression(answer)
    except ValueError:
        return format_score
    try:
        if abs(value - target) < 1e-5:
            return score
    except Exception:  # e.g. a target that is not a number, as in the reference's try/except
        pass
    return format_score


def compute_score(
    solution_str: str,
    ground_truth: Mapping[str, Any],
    method: str = "strict",
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """TinyZero's Countdown reward (see the module docstring for the exact rules).

    Args:
        solution_str: the full decoded text, prompt included.
        ground_truth: ``{"target": int, "numbers": list[int]}`` (numbers may be any sortable sequence).
        method: accepted for signature compatibility and ignored, as in the reference.
        format_score: returned when an answer is found but is not a correct solution.
        score: returned for a correct solution.

    Returns:
        ``0.0`` if there is no assistant marker or no ``<answer>...</answer>`` on the last line of the
        response; ``score`` if the answer uses each number exactly once and evaluates to within 1e-5 of
        the target; ``format_score`` otherwise. Never raises for any ``solution_str`` (only for a
        ``ground_truth`` without the two keys, as the reference does).
    """
    del method
    return _score_answer(extract_solution(solution_str), ground_truth, format_score, score)


def compute_score_lenient(
    solution_str: str,
    ground_truth: Mapping[str, Any],
    method: str = "lenient",
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """Like :func:`compute_score`, but the last answer tag anywhere in the response counts.

    The response is the text after the assistant marker, or the whole text when there is no marker,
    and text on later lines no longer hides the answer. Returns the same values as
    :func:`compute_score`: ``0.0`` (no answer tag), ``format_score`` or ``score``. Not the default.
    """
    del method
    response = _response_after_marker(solution_str)
    if response is None:
        response = solution_str
    return _score_answer(_last_answer(response), ground_truth, format_score, score)


def score_completions(
    prompts: Sequence[str],
    completions: Sequence[str],
    ground_truths: Sequence[Mapping[str, Any]],
    *,
    format_score: float = 0.1,
    score: float = 1.0,
) -> list[float]:
    """:func:`compute_score` for a batch of (prompt, completion, ground truth) triples.

    If a prompt contains ``"Assistant:"`` or ``"<|im_start|>assistant"``, the text scored is
    ``prompt + completion``, exactly what the reference sees when given the full decoded sequence.
    Otherwise it is ``"Assistant:" + completion``, so that a completion is not scored 0 merely because
    a custom prompt has no assistant marker.

    Returns one score per triple (``0.0``, ``format_score`` or ``score``). Raises ValueError if the
    three sequences differ in length.
    """
    if not len(prompts) == len(completions) == len(ground_truths):
        raise ValueError(
            f"got {len(prompts)} prompts, {len(completions)} completions and {len(ground_truths)} ground truths"
        )
    return [compute_score(_scored_text(prompt, completion), ground_truth, format_score=format_score, score=score)
            for prompt, completion, ground_truth in zip(prompts, completions, ground_truths)]


def accuracy_completions(prompts: Sequence[str], completions: Sequence[str],
                         ground_truths: Sequence[Mapping[str, Any]]) -> list[float]:
    """:func:`score_completions` without the format credit (``format_score=0``): 1.0 for a correct answer, 0.0 for
    anything else, a wrong or missing answer alike. A training reward (``--reward countdown_accuracy``) for runs that
    must not be paid for finishing: with the 0.1 credit, a short RL run from the patient SFT model mostly learns to
    end its answers inside the token budget (docs/results/tools). Evaluation keeps the spec's score. Raises
    ValueError if the three sequences differ in length."""
    return score_completions(prompts, completions, ground_truths, format_score=0.0)


def _scored_text(prompt: str, completion: str) -> str:
    """The text :func:`score_completions` scores: ``prompt + completion`` when the prompt has an assistant marker,
    else ``"Assistant:" + completion``."""
    has_marker = any(marker in prompt for marker in _ASSISTANT_MARKERS)
    return prompt + completion if has_marker else _ASSISTANT_MARKERS[0] + completion


def answer_value(prompt: str, completion: str) -> float | None:
    """The value of the answer :func:`score_completions` would score for ``(prompt, completion)``, as a float; None
    when there is no answer on the last line, or it does not evaluate to a real number (bad characters, syntax,
    division by zero, a complex power, bounded-work refusals). The numbers used are not checked: two answers
    that equal the same value (e.g. the target) agree, which is what a majority vote over answers counts."""
    answer = extract_solution(_scored_text(prompt, completion))
    if answer is None or len(answer) > MAX_EXPRESSION_CHARS:
        return None
    try:
        value = evaluate_expression(answer)
    except ValueError:
        return None
    if isinstance(value, complex):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if value == value and abs(value) != float("inf") else None
