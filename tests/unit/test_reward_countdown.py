"""Tests for rlft.rewards.countdown: every rule by hand, a differential test against the reference
semantics (re-implemented here with Python's eval, in this test only), and bounded work on hostile input."""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import re
import time
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlft.rewards import countdown
from rlft.rewards.countdown import (
    MAX_EXPRESSION_CHARS,
    compute_score,
    compute_score_lenient,
    evaluate_expression,
    extract_solution,
    score_completions,
)

GT = {"target": 9, "numbers": [1, 2, 3]}


def ans(expr: str, prefix: str = "User: use 1 2 3 to make 9.\nAssistant: <think>hmm</think>\n") -> str:
    return f"{prefix}<answer>{expr}</answer>"


# ----------------------------------------------------------------------------------------------------
# The reference, re-implemented with eval for the differential test (TEST ONLY).
# ----------------------------------------------------------------------------------------------------


def reference_eval(expr: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compile() warns about e.g. "(1)(2)"
        return eval(expr, {"__builtins__": None}, {})  # noqa: S307 - the reference's own call


def reference_compute_score(solution_str, ground_truth, format_score=0.1, score=1.0):
    target, numbers = ground_truth["target"], ground_truth["numbers"]
    if "Assistant:" in solution_str:
        text = solution_str.split("Assistant:", 1)[1]
    elif "<|im_start|>assistant" in solution_str:
        text = solution_str.split("<|im_start|>assistant", 1)[1]
    else:
        return 0
    text = text.split("\n")[-1]
    matches = list(re.finditer(r"<answer>(.*?)</answer>", text))
    if not matches:
        return 0
    equation = matches[-1].group(1).strip()
    try:
        valid = sorted(int(n) for n in re.findall(r"\d+", equation)) == sorted(numbers)
    except Exception:
        valid = False
    if not valid:
        return format_score
    try:
        if not re.match(r"^[\d+\-*/().\s]+$", equation):
            return format_score
        result = reference_eval(equation)
    except Exception:
        return format_score
    try:
        return score if abs(result - target) < 1e-5 else format_score
    except Exception:
        return format_score


def both(text, gt, **kwargs):
    """compute_score(text, gt), after checking that the eval-based reference gives the same score."""
    ours = compute_score(text, gt, **kwargs)
    kwargs.pop("method", None)
    assert ours == reference_compute_score(text, gt, **kwargs), (text, gt)
    return ours


# ----------------------------------------------------------------------------------------------------
# Hand-written cases, one per rule (each also checked against the eval-based reference)
# ----------------------------------------------------------------------------------------------------


def test_correct_answer_scores_one():
    assert both(ans("(1+2)*3"), GT) == 1.0
    assert both(ans("3*(2+1)"), GT) == 1.0
    assert both(ans("((1 + 2)) * (3)"), GT) == 1.0


def test_wrong_value_gets_format_score():
    assert both(ans("1+2+3"), GT) == 0.1
    assert both(ans("1*2*3"), GT) == 0.1


def test_missing_assistant_marker_scores_zero():
    assert both("<answer>(1+2)*3</answer>", GT) == 0
    assert both("assistant: <answer>(1+2)*3</answer>", GT) == 0  # case-sensitive
    assert both("<|im_start|>user\n<answer>(1+2)*3</answer>", GT) == 0


def test_im_start_assistant_fallback():
    text = "<|im_start|>user\nmake 9<|im_end|>\n<|im_start|>assistant\n<think>x</think>\n<answer>(1+2)*3</answer>"
    assert both(text, GT) == 1.0
    assert both("<|im_start|>assistant<answer>(1+2)*3</answer>", GT) == 1.0


def test_assistant_colon_takes_precedence_over_im_start():
    # The answer is after "<|im_start|>assistant" but before "Assistant:", whose text is what counts.
    text = "<|im_start|>assistant\n<answer>(1+2)*3</answer> Assistant: no answer here"
    assert both(text, GT) == 0
    # The split is at the *first* "Assistant:"; later ones are just text.
    assert both("Assistant: x Assistant: <answer>(1+2)*3</answer>", GT) == 1.0


def test_only_the_last_line_counts():
    assert both(ans("(1+2)*3") + "\nThat is my answer.", GT) == 0
    assert both(ans("(1+2)*3") + "\n", GT) == 0  # an empty last line
    assert both(ans("(1+2)*3", prefix="Assistant: <answer>1+2+3</answer>\n"), GT) == 1.0
    assert both(ans("1+2+3", prefix="Assistant: <answer>(1+2)*3</answer>\n"), GT) == 0.1
    # The tag must open and close on the last line.
    assert both("Assistant: <answer>(1+2)\n*3</answer>", GT) == 0


def test_last_answer_tag_wins():
    assert both("Assistant: <answer>1+2+3</answer> or <answer>(1+2)*3</answer>", GT) == 1.0
    assert both("Assistant: <answer>(1+2)*3</answer> or <answer>1+2+3</answer>", GT) == 0.1
    # Non-overlapping, leftmost-first matching: the second <answer> is inside the first match.
    assert extract_solution("Assistant: <answer>a<answer>(1+2)*3</answer>") == "a<answer>(1+2)*3"
    assert both("Assistant: <answer>a<answer>(1+2)*3</answer>", GT) == 0.1
    assert extract_solution("Assistant: <answer>(1+2)*3</answer><answer>unclosed") == "(1+2)*3"


def test_empty_answer_gets_format_score():
    assert both("Assistant: <answer></answer>", GT) == 0.1
    assert both("Assistant: <answer>   </answer>", GT) == 0.1
    assert extract_solution("Assistant: <answer> </answer>") == ""


def test_numbers_are_a_multiset():
    assert both(ans("(1+2)*3"), {"target": 9, "numbers": [3, 1, 2]}) == 1.0  # any order
    assert both(ans("3*3"), GT) == 0.1  # 1 and 2 missing, 3 repeated
    assert both(ans("(1+2)*3*1"), GT) == 0.1  # extra constant
    assert both(ans("(1+2)*3+0"), GT) == 0.1  # extra zero
    assert both(ans("3*3"), {"target": 9, "numbers": [3, 3]}) == 1.0  # repeated given number
    assert both(ans("3*3*3"), {"target": 27, "numbers": [3, 3]}) == 0.1
    assert both(ans("12-3"), {"target": 9, "numbers": [1, 2, 3]}) == 0.1  # "12" is one number


def test_number_check_precedes_evaluation():
    assert both(ans("(1+2)*3=9"), GT) == 0.1  # the extra 9 fails the number check
    assert both(ans("(1+2)*3=9"), {"target": 9, "numbers": [1, 2, 3, 9]}) == 0.1  # "=" not allowed
    assert both(ans("x=(1+2)*3"), GT) == 0.1


def test_leading_zeros_and_zero():
    assert both(ans("05+4"), {"target": 9, "numbers": [5, 4]}) == 0.1  # SyntaxError in Python
    assert both(ans("0+9"), {"target": 9, "numbers": [0, 9]}) == 1.0
    assert both(ans("00+9"), {"target": 9, "numbers": [0, 9]}) == 1.0  # "00" is a valid int
    assert both(ans("9*0+9"), {"target": 9, "numbers": [0, 9, 9]}) == 1.0


def test_decimals_are_digit_runs():
    assert both(ans("3.0+4"), {"target": 7, "numbers": [3, 0, 4]}) == 1.0
    assert both(ans("3.0+4"), {"target": 7, "numbers": [3, 4]}) == 0.1  # the 0 is a number
    assert both(ans("3.5*2"), {"target": 7, "numbers": [3, 5, 2]}) == 1.0  # the reference's quirk
    assert both(ans("3.+4"), {"target": 7, "numbers": [3, 4]}) == 1.0
    assert both(ans(".5*14"), {"target": 7, "numbers": [5, 14]}) == 1.0
    assert both(ans("1.2.3"), {"target": 7, "numbers": [1, 2, 3]}) == 0.1


def test_power_floordiv_and_unary():
    assert both(ans("2**3+1"), GT | {"numbers": [2, 3, 1]}) == 1.0
    assert both(ans("7//2+1"), {"target": 4, "numbers": [7, 2, 1]}) == 1.0
    assert both(ans("7/2+1"), {"target": 4, "numbers": [7, 2, 1]}) == 0.1  # true division
    assert both(ans("--3*3"), {"target": 9, "numbers": [3, 3]}) == 1.0
    assert both(ans("-3*-3"), {"target": 9, "numbers": [3, 3]}) == 1.0
    assert both(ans("1-10"), {"target": -9, "numbers": [1, 10]}) == 1.0
    assert both(ans("4**-1*8"), {"target": 2, "numbers": [4, 1, 8]}) == 1.0  # 2**-1 is a float


def test_arithmetic_errors_get_format_score():
    assert both(ans("1/(2-2)"), {"target": 1, "numbers": [1, 2, 2]}) == 0.1
    assert both(ans("1//(2-2)"), {"target": 1, "numbers": [1, 2, 2]}) == 0.1
    assert both(ans("0**-1"), {"target": 1, "numbers": [0, 1]}) == 0.1
    assert both(ans("10.0**400"), {"target": 1, "numbers": [10, 0, 400]}) == 0.1
    assert both(ans("(1)(2)"), {"target": 2, "numbers": [1, 2]}) == 0.1
    assert both(ans("()"), {"target": 0, "numbers": []}) == 0.1
    assert both(ans("..."), {"target": 0, "numbers": []}) == 0.1


def test_whitespace_variants():
    assert both(ans("  (1 + 2)\t*  3 "), GT) == 1.0
    assert both(ans("(1+2)\x0c*3"), GT) == 1.0  # form feed is Python whitespace
    assert both(ans("(1+2)\x0b*3"), GT) == 0.1  # vertical tab passes the regex, not the parser
    assert both(ans("(1+2)\r*3"), GT) == 0.1  # \r is a line break to the parser
    assert both(ans("(1+2)\u00a0*3"), GT) == 0.1  # non-breaking space: \s, not Python


def test_non_ascii_digits_pass_the_checks_but_not_the_parser():
    # "\d" matches U+0663 (ARABIC-INDIC DIGIT THREE) and int() reads it as 3, but Python cannot parse it.
    assert both(ans("(1+2)*\u0663"), GT) == 0.1


def test_near_target_floats():
    assert both(ans("49/7.000001"), {"target": 7, "numbers": [49, 7, 1]}) == 1.0  # off by 1e-6
    assert both(ans("49/7.0001"), {"target": 7, "numbers": [49, 7, 1]}) == 0.1  # off by 1e-4


def test_complex_results_are_compared_like_python():
    # A negative base to a fractional power is complex; abs(complex - target) is its distance.
    assert isinstance(evaluate_expression("(0-8)**(1/3)"), complex)
    assert both(ans("(0-8)**(1/3)"), {"target": 2, "numbers": [0, 8, 1, 3]}) == 0.1
    # (-4)**.5 squared is -4 plus a rounding-error imaginary part: within 1e-5 of a real target.
    assert both(ans("((0-4)**.5)**2+8"), {"target": 4, "numbers": [0, 4, 5, 2, 8]}) == 1.0


def test_format_score_and_score_parameters():
    assert both(ans("(1+2)*3"), GT, format_score=0.0, score=2.0) == 2.0
    assert both(ans("1+2+3"), GT, format_score=-0.5, score=2.0) == -0.5
    assert both("Assistant: nothing", GT, format_score=-0.5, score=2.0) == 0
    assert both(ans("(1+2)*3"), GT, method="flexible") == 1.0  # method is ignored


def test_numpy_like_ground_truth_and_missing_keys():
    assert both(ans("(1+2)*3"), {"target": 9, "numbers": (3, 2, 1)}) == 1.0
    with pytest.raises(KeyError):
        compute_score(ans("(1+2)*3"), {"numbers": [1, 2, 3]})


def test_evaluate_expression_api():
    assert evaluate_expression("1+2") == 3 and type(evaluate_expression("1+2")) is int
    assert evaluate_expression("7/2") == 3.5
    assert evaluate_expression("2**-1") == 0.5
    assert evaluate_expression("-2**2") == -4
    assert evaluate_expression("2**3**2") == 512  # right-associative
    assert evaluate_expression("  1+2") == 3  # leading blanks ignored, as by eval
    assert evaluate_expression("(" * 150 + "1" + ")" * 150) == 1
    assert evaluate_expression("-" * 1000 + "1") == 1  # deeper than Python's recursion limit
    bad_expressions = ["05", "1.2.3", "1/0", "x", "1=1", "", "()", "...", "(1)(2)", "10.0**400", "9**9**9**9"]
    for bad in bad_expressions + ["(" * 300 + "1" + ")" * 300]:
        with pytest.raises(ValueError):
            evaluate_expression(bad)


def test_big_but_bounded_integers_are_exact():
    assert evaluate_expression("2**60000-2**60000+5") == 5
    assert compute_score(ans("(99**99-99**99)*9+1"), {"target": 1, "numbers": [99, 99, 99, 99, 9, 1]}) == 1.0
    with pytest.raises(ValueError):
        evaluate_expression("2**70000")  # beyond MAX_INT_BITS
    with pytest.raises(ValueError):
        evaluate_expression("(2**40000)*(2**40000)")


# ----------------------------------------------------------------------------------------------------
# score_completions and the lenient variant
# ----------------------------------------------------------------------------------------------------


def test_score_completions():
    gts = [GT, GT, GT, GT]
    prompts = [
        "User: make 9\nAssistant: <think>",  # marker in the prompt: prompt + completion is scored
        "<|im_start|>user\nmake 9<|im_end|>\n<|im_start|>assistant\n",
        "Make 9 from 1 2 3.",  # no marker: "Assistant:" + completion is scored
        "Make 9 from 1 2 3.",
    ]
    completions = ["x</think>\n<answer>(1+2)*3</answer>", "<answer>(1+2)*3</answer>", "<answer>(1+2)*3</answer>", "no"]
    assert score_completions(prompts, completions, gts) == [1.0, 1.0, 1.0, 0.0]
    assert score_completions(prompts[:1], ["<answer>1+2+3</answer>"], [GT], format_score=0.0, score=5.0) == [0.0]
    assert score_completions(prompts[:1], ["<answer>3*(1+2)</answer>"], [GT], format_score=0.0, score=5.0) == [5.0]
    # Same as compute_score on the full text, including the last-line rule.
    assert score_completions(prompts[:1], ["<answer>(1+2)*3</answer>\nok"], [GT]) == [0.0]
    with pytest.raises(ValueError):
        score_completions(prompts, completions, gts[:2])


def test_accuracy_reward_pays_no_format_credit():
    from rlft.rewards.registry import get_reward_function

    prompt = "Make 9 from 1 2 3."
    completions = ["<answer>(1+2)*3</answer>", "<answer>1+2+3</answer>", "<answer>1+2</answer>", "no answer", ""]
    # correct; uses every number but equals 6; misses a number; no tag; empty: only the first pays.
    assert score_completions([prompt] * 5, completions, [GT] * 5) == [1.0, 0.1, 0.1, 0.0, 0.0]
    reward = get_reward_function("countdown_accuracy")
    assert reward([prompt] * 5, completions, [GT] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        reward([prompt], completions, [GT])


def test_lenient_variant():
    assert compute_score(ans("(1+2)*3") + "\nThat is my answer.", GT) == 0
    assert compute_score_lenient(ans("(1+2)*3") + "\nThat is my answer.", GT) == 1.0
    assert compute_score_lenient("<answer>(1+2)*3</answer>", GT) == 1.0  # no marker needed
    assert compute_score_lenient("Assistant: <answer>(1+2)*3</answer>\n<answer>1+2+3</answer>\n", GT) == 0.1
    assert compute_score_lenient("Assistant: <answer>(1+2)\n*3</answer>", GT) == 0  # one-line tags only
    assert compute_score_lenient("Assistant: nothing", GT) == 0


# ----------------------------------------------------------------------------------------------------
# Differential tests against the eval-based reference
# ----------------------------------------------------------------------------------------------------

_WS = st.sampled_from(["", "", " ", "  ", "\t"])
_INT_LITERALS = st.one_of(st.integers(0, 30).map(str), st.sampled_from(["0", "00", "05", "100"]))
_FLOAT_LITERALS = st.sampled_from(["3.", ".5", "2.5", "0.0", "1.", "7.000001", "0.1"])
_EXPONENTS = st.sampled_from(["0", "1", "2", "3", "-1", "-2", ".5", "2.", "(-1)"])


def _extend(children):
    binary = st.tuples(children, _WS, st.sampled_from(["+", "-", "*", "/", "//"]), _WS, children).map("".join)
    # The base of ** is parenthesised and the exponent is a small literal, so eval stays cheap.
    power = st.tuples(children, _WS, _EXPONENTS).map(lambda t: f"({t[0]}){t[1]}**{t[2]}")
    unary = st.tuples(st.sampled_from(["-", "+", "--", "- "]), children).map("".join)
    parens = children.map(lambda e: f"({e})")
    return st.one_of(binary, power, unary, parens)


ARITHMETIC = st.recursive(st.one_of(_INT_LITERALS, _FLOAT_LITERALS), _extend, max_leaves=8)
# Random strings over the allowed alphabet (and a few disallowed characters), without "**" so that
# the reference's eval cannot blow up.
RANDOM_TEXT = st.text(alphabet=list("0123456789+-*/(). \t") + ["\u0663", "=", "x", "\x0b"], max_size=25).filter(
    lambda s: "**" not in s
)


def _same_value(a, b) -> bool:
    return type(a) is type(b) and (a == b or (a != a and b != b))  # nan == nan here


def _check_against_reference(data, expr: str) -> None:
    try:
        expected = reference_eval(expr) if re.match(r"^[\d+\-*/().\s]+$", expr) else None
    except Exception:
        expected = None
    if expected is None:
        with pytest.raises(ValueError):
            evaluate_expression(expr)
    else:
        try:
            got = evaluate_expression(expr)
        except ValueError:
            got = None  # only fine if the reference value is not a number (tuple, Ellipsis, ...)
        if isinstance(expected, (int, float, complex)):
            assert _same_value(got, expected), (expr, got, expected)
        else:
            assert got is None

    # The whole scorer: numbers taken from the expression (sometimes perturbed), target near the value.
    digit_runs = re.findall(r"\d+", expr)
    try:
        numbers = [int(n) for n in digit_runs]
    except ValueError:
        numbers = []
    numbers = data.draw(st.sampled_from([numbers, numbers, numbers[1:], numbers + [1], [1, 2, 3]]))
    if isinstance(expected, (int, float)) and math.isfinite(expected) and abs(expected) < 1e15:
        target = round(expected) + data.draw(st.sampled_from([0, 0, 0, 1, -1]))
    else:
        target = data.draw(st.integers(-5, 100))
    prefix = data.draw(
        st.sampled_from(["Assistant: ", "<|im_start|>assistant\n", "U: x\nAssistant: <think>\n</think>\n", "", "A: "])
    )
    suffix = data.draw(st.sampled_from(["", "", " done", "\nmore", "<answer>1</answer>"]))
    text = f"{prefix}<answer>{expr}</answer>{suffix}"
    gt = {"target": target, "numbers": numbers}
    assert compute_score(text, gt) == reference_compute_score(text, gt), (text, gt)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=ARITHMETIC, data=st.data())
def test_differential_structured_expressions(expr, data):
    _check_against_reference(data, expr)


@settings(max_examples=500, deadline=None)
@given(expr=RANDOM_TEXT, data=st.data())
def test_differential_random_alphabet(expr, data):
    _check_against_reference(data, expr)


_TAG_PIECES = st.sampled_from(["<answer>", "</answer>", "a", "1+2", " ", "\n", "<", "answer>", "</", "Assistant:"])


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(_TAG_PIECES, max_size=14))
def test_answer_extraction_matches_regex(pieces):
    text = "".join(pieces)
    expected = [m.group(1) for m in re.finditer(r"<answer>(.*?)</answer>", text)]
    assert list(countdown._answer_tags(text)) == expected
    gt = {"target": 3, "numbers": [1, 2]}
    assert compute_score(text, gt) == reference_compute_score(text, gt)


# ----------------------------------------------------------------------------------------------------
# Bounded work and no code execution
# ----------------------------------------------------------------------------------------------------

MEGABYTE = 1_000_000
HOSTILE = [
    (ans("9**9**9**9"), [9, 9, 9, 9]),
    (ans("1**9**9**9**9"), [1, 9, 9, 9, 9]),
    (ans("(9**9**9)//9"), [9, 9, 9, 9]),
    (ans("2**99999999"), [2, 99999999]),
    (ans("(-1)**(9**99999)"), [1, 9, 99999]),
    (ans("2.5**99999999"), [2, 5, 99999999]),
    (ans("(" * 10_000 + "1" + ")" * 10_000), [1]),
    (ans("-" * 10_000 + "1"), [1]),
    (ans("(-" * 5_000 + "1" + ")" * 5_000), [1]),
    (ans("+".join(["1"] * 4_000)), [1] * 4_000),
    (ans("9" * 5_000), [int("9" * 4_000)]),
    (ans("1+" * (MEGABYTE // 2) + "1"), [1] * (MEGABYTE // 2 + 1)),
    ("Assistant: " + "<answer>" * (MEGABYTE // 8), [1]),
    ("Assistant: " + "<answer>2</answer>" * (MEGABYTE // 18), [1]),
    ("Assistant: " + ("<answer>\n" * (MEGABYTE // 9)) + "</answer>", [1]),
    ("Assistant:" * (MEGABYTE // 10), [1]),
    ("x" * MEGABYTE, [1]),
    (ans(" " * MEGABYTE + "2"), [2]),
]


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_hostile_input_is_fast_and_never_raises(index):
    text, numbers = HOSTILE[index]
    for scorer in (compute_score, compute_score_lenient):
        start = time.perf_counter()
        result = scorer(text, {"target": 1, "numbers": numbers})
        assert time.perf_counter() - start < 1.0
        assert result in (0, 0.1)


def test_deep_but_valid_expressions_still_score():
    # Deeper than Python's default recursion limit; the reference's eval handles these, and so must we.
    assert compute_score(ans("-" * 1_000 + "5"), {"target": 5, "numbers": [5]}) == 1.0
    assert compute_score(ans("+".join(["1"] * 2_000)), {"target": 2_000, "numbers": [1] * 2_000}) == 1.0


def test_answers_longer_than_the_cap_get_format_score():
    # (Surrounding whitespace is stripped before the length is measured.)
    assert compute_score(ans("(1+2)" + " " * MAX_EXPRESSION_CHARS + "*3"), GT) == 0.1
    assert both(ans("(1+2)" + " " * (MAX_EXPRESSION_CHARS - 100) + "*3"), GT) == 1.0


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.sampled_from(["", "Assistant: ", "<|im_start|>assistant\n"]),
    body=st.one_of(st.text(max_size=200), st.text(alphabet="0123456789+-*/(). \n<>answer", max_size=200)),
    numbers=st.lists(st.integers(0, 20), max_size=5),
    target=st.integers(-100, 100),
)
def test_arbitrary_text_never_raises(prefix, body, numbers, target):
    for text in (prefix + body, f"{prefix}<answer>{body}</answer>"):
        start = time.perf_counter()
        assert compute_score(text, {"target": target, "numbers": numbers}) in (0, 0.1, 1.0)
        assert compute_score_lenient(text, {"target": target, "numbers": numbers}) in (0, 0.1, 1.0)
        assert time.perf_counter() - start < 1.0


def test_module_never_calls_eval_or_exec(monkeypatch):
    source = inspect.getsource(countdown)
    assert "eval(" not in source and "exec(" not in source
    calls = [node.func for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]
    names = {f.id for f in calls if isinstance(f, ast.Name)} | {f.attr for f in calls if isinstance(f, ast.Attribute)}
    assert not names & {"eval", "exec", "__import__", "system", "import_module"}
    assert "compile" not in {f.id for f in calls if isinstance(f, ast.Name)}  # (re.compile is fine)

    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    assert compute_score(ans("(1+2)*3"), GT) == 1.0
    assert compute_score(ans("1/(3-3)+2"), GT) == 0.1
    assert score_completions(["p"], ["<answer>3*(2+1)</answer>"], [GT]) == [1.0]


def test_rewards_needing_a_countdown_task_are_marked_and_refused_on_chat_prompts():
    """The registry's mark matches what each reward does with a chat prompt's empty ground truth: the marked ones
    cannot score it (and make_reward refuses them for chat prompts), the others score it."""
    from rlft.rewards.registry import NEEDS_COUNTDOWN_TASK, REWARD_FUNCTIONS
    from rlft.rl.options import RewardOptions
    from rlft.rl.rewards import make_reward

    assert NEEDS_COUNTDOWN_TASK <= set(REWARD_FUNCTIONS)
    for name, fn in REWARD_FUNCTIONS.items():
        if name in NEEDS_COUNTDOWN_TASK:
            with pytest.raises((KeyError, TypeError, ValueError)):
                fn(["p"], ["<answer>1+2</answer>"], [{}])
            with pytest.raises(ValueError, match="no Countdown answer"):
                make_reward(RewardOptions(reward=name), chat_prompts=True)
        else:
            assert len(fn(["p"], ["Yes"], [{}])) == 1
            make_reward(RewardOptions(reward=name), chat_prompts=True)
