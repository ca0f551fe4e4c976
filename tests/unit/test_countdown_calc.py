"""The Countdown calculator tool (rlft.rewards.countdown_calc) and the ``calc`` prompt template: values and errors by
hand, through the rollout's tool runner, hostile input refused fast, and the prompt's exact text."""

from __future__ import annotations

import re
import time

import pytest

from rlft.rewards.countdown_calc import CALC_TOOLS, calc, numbers_used
from rlft.rollout.tools import ends_with_call, last_call, parse_tool_call, run_tool_call
from rlft.tasks.countdown.calc import CALC_INSTRUCTIONS, CALC_TOOL
from rlft.tasks.countdown.prompts import PROMPT_TEMPLATES, base_prompt, calc_prompt, parse_query, render_prompt
from rlft.types import CountdownTask

TASK = CountdownTask(nums=(3, 5, 22), target=30)
TRUTH = TASK.ground_truth()  # {"target": 30, "numbers": [3, 5, 22]}


@pytest.mark.parametrize("expression, value", [
    ("3*5+22", 37),  # 15 + 22
    ("22-3*5", 7),  # 22 - 15
    ("(22-5)*3", 51),  # 17 * 3
    ("22+5+3", 30),
    (" 22 + 3 ", 25),  # spaces around, as the score's parser allows
    ("3+5", 8),  # a sub-multiset: fewer numbers are a fine question
    ("22", 22),
    ("22/5", 4.4),
    ("3/5", 0.6),
    ("5/22*3", 15 / 22),  # 0.6818..., Python's float
])
def test_values_by_hand_with_the_task_numbers(expression, value):
    result = calc(expression, TRUTH)
    assert result == value and type(result) is type(value)


def test_integral_values_are_ints_and_the_rest_floats():
    assert calc("6/3") == 2 and type(calc("6/3")) is int  # 2.0 from true division -> 2
    assert calc("7/2") == 3.5 and type(calc("7/2")) is float
    assert calc("3.5*2") == 7 and type(calc("3.5*2")) is int
    assert calc("2**10") == 1024 and calc("7//2") == 3  # the score's parser allows ** and //
    assert calc("(44-19)*35") == 875 and calc("93-24+2") == 71


def test_numbers_are_counted_as_the_score_counts_them():
    assert numbers_used("(44-19)*35") == ["44", "19", "35"]
    assert numbers_used("3.5+05") == ["3", "5", "5"]  # digit runs, leading zeros dropped
    assert calc("3.5", {"numbers": [3, 5]}) == 3.5  # 3.5 uses 3 and 5
    assert calc("3+5", {"nums": [5, 3]}) == 8  # a loader's "nums" key is read too


@pytest.mark.parametrize("expression, message", [
    ("3*7", "uses 7, not among the numbers 3, 5, 22"),
    ("5*5+3", "uses 5 2 times, but the numbers 3, 5, 22 have it once"),
    ("22+22", "uses 22 2 times, but the numbers 3, 5, 22 have it once"),
    ("3+5+22+1", "uses 1, not among the numbers 3, 5, 22"),
    ("22/(5-5)", "uses 5 2 times"),  # the numbers are checked before the arithmetic
    ("3*+", "syntax error in '3*+'"),
    ("3 5", "syntax error in '3 5'"),
    ("22=3", "invalid characters in expression"),
    ("3^5", "invalid characters in expression"),
    ("abs(3)", "invalid characters in expression"),
    ("", "invalid characters in expression"),
])
def test_errors_with_the_task_numbers(expression, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        calc(expression, TRUTH)
    assert "\n" not in str(info.value)


def test_division_by_zero_and_other_errors_without_a_task():
    for expression in ("22/(5-5)", "1/0", "3//0"):
        with pytest.raises(ValueError, match="^division by zero$"):
            calc(expression)
    with pytest.raises(ValueError, match="division by zero"):
        calc("22/(5-5)", {"numbers": [22, 5, 5]})
    with pytest.raises(ValueError, match="must be a string, got int"):
        calc(35)  # type: ignore[arg-type]  # JSON arguments can hold any type
    with pytest.raises(ValueError, match="has no 'numbers'"):
        calc("3", {"target": 3})
    with pytest.raises(ValueError, match="must be integers"):
        calc("3", {"numbers": ["three"]})
    with pytest.raises(ValueError, match="complex"):
        calc("(0-8)**0.5")


@pytest.mark.parametrize("expression, message", [
    ("9**9**9**9", "power too large"),
    ("2**100000", "power too large"),
    ("2**4000", "more than 1000 digits"),  # 1,205 digits: bounded, yet not a value to print
    ("10.0**300*10.0**300", "not a finite number"),  # a float product overflows to inf without raising
    ("(" * 1000 + "1" + ")" * 1000, "syntax error"),  # CPython's parser: too many nested parentheses
    ("-" * 9000 + "1", "too deep to parse"),  # nested unary operators: a RecursionError in the parser
    ("1+" * 6000 + "1", "longer than 10000 characters"),
    ("1" * 1_000_000, "longer than 10000 characters"),
    ("9" * 5000, "syntax error"),  # an int literal over CPython's 4,300 digits
])
def test_hostile_input_is_refused_fast(expression, message):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        calc(expression)
    assert time.perf_counter() - start < 0.5, expression[:20]


def test_hostile_input_with_the_task_numbers_is_refused_before_any_arithmetic():
    start = time.perf_counter()
    for expression in ("22**22**22**22", "3" * 9000, "(" * 3000 + "3" + ")" * 3000):
        with pytest.raises(ValueError):
            calc(expression, TRUTH)
    assert time.perf_counter() - start < 0.5
    with pytest.raises(ValueError, match="uses a 9000-digit number, not among"):
        calc("3" * 9000, TRUTH)


def test_through_the_rollout_tool_runner():
    """What a rollout appends after a call: the value as text, or ``error: <the one line>``."""
    def call(expression: str) -> str:
        return f'{{"name": "calc", "arguments": {{"expression": "{expression}"}}}}'

    assert set(CALC_TOOLS) == {CALC_TOOL} and CALC_TOOLS[CALC_TOOL] is calc
    assert run_tool_call(call("93-24+2"), CALC_TOOLS, {"target": 71, "numbers": [93, 24, 2]}) == ("71", True)
    assert run_tool_call(call("22/5"), CALC_TOOLS, TRUTH) == ("4.4", True)
    assert run_tool_call(call("3*7"), CALC_TOOLS, TRUTH) == ("error: uses 7, not among the numbers 3, 5, 22", False)
    assert run_tool_call(call("3/(5-5)"), CALC_TOOLS) == ("error: division by zero", False)
    assert run_tool_call('{"name": "calc", "arguments": {"expr": "3"}}', CALC_TOOLS)[1] is False  # wrong argument


def test_calc_instructions_hold_a_call_that_runs():
    start = CALC_INSTRUCTIONS.index("<tool_call>")
    example = CALC_INSTRUCTIONS[: CALC_INSTRUCTIONS.index("</tool_call>") + len("</tool_call>")]
    assert ends_with_call(example) and "\n" not in CALC_INSTRUCTIONS and start > 0
    call = parse_tool_call(last_call(example))
    assert call.name == CALC_TOOL and call.arguments == {"expression": "(1+2)/3"}
    assert run_tool_call(last_call(example), CALC_TOOLS) == ("1", True)
    assert "<tool_response> </tool_response>" in CALC_INSTRUCTIONS


ROW0 = CountdownTask(nums=(44, 19, 35), target=98)
ROW0_CALC_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer.\nUser: Using the numbers [44, 19, 35], create an equation that equals 98. You can use "
    "basic arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>. You can compute an expression with the calculator: write "
    '<tool_call>{"name":"calc","arguments":{"expression":"(1+2)/3"}}</tool_call> and its value comes back in '
    "<tool_response> </tool_response> tags.\nAssistant: Let me solve this step by step.\n<think>"
)


def test_calc_prompt_is_base_with_the_instructions_in_the_user_text(smol_tokenizer):
    assert calc_prompt(ROW0) == ROW0_CALC_PROMPT
    assert render_prompt("calc", ROW0, smol_tokenizer) == ROW0_CALC_PROMPT
    assert PROMPT_TEMPLATES["calc"] is calc_prompt
    assert ROW0_CALC_PROMPT.replace(" " + CALC_INSTRUCTIONS, "") == base_prompt(ROW0)
    assert ROW0_CALC_PROMPT.count("Assistant:") == 1 and ROW0_CALC_PROMPT.endswith("\n<think>")
    assert parse_query(ROW0_CALC_PROMPT) == ((44, 19, 35), 98)
