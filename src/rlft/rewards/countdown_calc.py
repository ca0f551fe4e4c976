"""Countdown's calculator tool: the value of an arithmetic expression over a task's numbers, or a one-line error.

The model calls it as ``<tool_call>{"name": "calc", "arguments": {"expression": "3*5+7"}}</tool_call>``
(:mod:`rlft.rollout.tools` runs the call; :mod:`rlft.tasks.countdown.calc` holds the prompt's instructions). The
expression is evaluated by the score's own parser (:func:`rlft.rewards.countdown.evaluate_expression`: ``ast``, no
``eval``, the same characters and arithmetic as the reference score, hostile input refused at once), so the tool
and the reward never disagree on a value.

It lives beside the score, not in ``tasks/countdown``: docs/design.md's layer table lets ``rewards/`` import the
score's parser, and ``tasks/`` may import only layer 0 and ``data``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from rlft.rewards.countdown import MAX_EXPRESSION_CHARS, evaluate_expression

__all__ = ["CALC_TOOLS", "MAX_RESULT_DIGITS", "calc", "numbers_used"]

MAX_RESULT_DIGITS = 1_000
"""Integer results of more than about this many decimal digits (``MAX_RESULT_DIGITS * 3.33`` bits) are refused: a
Countdown value has a few."""
_BITS_PER_DIGIT = 3.33  # log2(10) rounded up: an int of more than MAX_RESULT_DIGITS * 3.33 bits has more digits
_DIGIT_RUN = re.compile(r"\d+")


def numbers_used(expression: str) -> list[str]:
    """The numbers ``expression`` writes, as the score counts them (rule 4 of :mod:`rlft.rewards.countdown`): its
    digit runs, leading zeros dropped (``"3.5"`` uses 3 and 5, ``"05"`` uses 5), as decimal strings."""
    return [run.lstrip("0") or "0" for run in _DIGIT_RUN.findall(expression)]


def _check_numbers(expression: str, numbers: Any) -> None:
    """ValueError unless the numbers ``expression`` uses are a sub-multiset of ``numbers`` (each at most as often)."""
    try:
        given = [str(int(n)) for n in numbers]
    except (TypeError, ValueError):
        raise ValueError(f"the task's numbers must be integers, got {numbers!r:.80}") from None
    listed = ", ".join(given)
    have = Counter(given)
    for number, count in Counter(numbers_used(expression)).items():
        if have[number] == 0:
            shown = number if len(number) <= 20 else f"a {len(number)}-digit number"
            raise ValueError(f"uses {shown}, not among the numbers {listed}")
        if count > have[number]:
            times = "once" if have[number] == 1 else f"{have[number]} times"
            raise ValueError(f"uses {number} {count} times, but the numbers {listed} have it {times}")


def calc(expression: str, context: dict | None = None) -> int | float:
    """The value of ``expression``: an ``int`` when it is integral (``"6/3"`` -> ``2``), else a ``float``.

    Args:
        expression: arithmetic over numbers with ``+ - * / ( )`` (and whatever else the score's parser accepts:
            ``//``, ``**``, decimals), at most :data:`rlft.rewards.countdown.MAX_EXPRESSION_CHARS` characters.
        context: a Countdown ground truth (:meth:`rlft.types.CountdownTask.ground_truth`: ``{"target", "numbers"}``;
            ``"nums"`` is read too) or None. Given, the numbers the expression writes must be a sub-multiset of the
            task's: each used at most as often as given (fewer is fine: a partial expression is a valid question).

    Raises:
        ValueError, with a one-line message (the model's observation): not a string; a number not among the task's
        or used too often (``uses 7, not among the numbers 3, 5, 22``); disallowed characters; a syntax error;
        division by zero; too long, too deep or too large (the parser's bounds, refused without doing the work); a
        complex or non-finite value; an integer result of more than about
        :data:`MAX_RESULT_DIGITS` digits; a ``context`` without
        ``numbers``.
    """
    if not isinstance(expression, str):
        raise ValueError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    if context is not None:
        numbers = context.get("numbers", context.get("nums"))
        if numbers is None:
            raise ValueError("the task's context has no 'numbers'")
        _check_numbers(expression, numbers)
    try:
        value = evaluate_expression(expression)
    except ValueError as exc:
        cause = exc.__cause__
        if isinstance(cause, ZeroDivisionError):
            raise ValueError("division by zero") from None
        if isinstance(cause, SyntaxError):
            raise ValueError(f"syntax error in {expression[:50]!r}") from None
        if isinstance(cause, (RecursionError, MemoryError)):
            raise ValueError("the expression is too deep to parse") from None
        raise ValueError(str(exc).splitlines()[0] if str(exc) else "cannot evaluate the expression") from None
    if isinstance(value, complex):
        raise ValueError("the value is a complex number")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("the value is not a finite number")
        return int(value) if value.is_integer() else value
    if value.bit_length() > MAX_RESULT_DIGITS * _BITS_PER_DIGIT:
        raise ValueError(f"the value has more than {MAX_RESULT_DIGITS} digits")
    return value


CALC_TOOLS = {"calc": calc}
"""The Countdown tools by name, for a rollout engine (:func:`rlft.rollout.tools.run_tool_call`)."""
