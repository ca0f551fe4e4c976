"""Countdown reasoning traces (scored by the exact reward) and prompt templates."""

from __future__ import annotations

import copy
import re

import pytest

from rlft.rewards.countdown import compute_score
from rlft.tasks.countdown.generator import PRESETS, generate_tasks
from rlft.tasks.countdown.prompts import (
    BASE_TEMPLATE,
    PROMPT_TEMPLATES,
    base_prompt,
    chat_prompt,
    parse_query,
    short_prompt,
)
from rlft.tasks.countdown.solver import apply
from rlft.tasks.countdown.traces import sft_examples, write_trace
from rlft.types import CountdownTask

from tests.conftest import QWEN25_CHAT_TEMPLATE, SHARED_DATA

ROW0 = CountdownTask(nums=(44, 19, 35), target=98)
ROW0_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer.\nUser: Using the numbers [44, 19, 35], create an equation that equals 98. You can use "
    "basic arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>.\nAssistant: Let me solve this step by step.\n<think>"
)
STEP = re.compile(r"\b(\d+)([-+*/])(\d+)=(\d+)\b")


@pytest.fixture(scope="module")
def tasks_by_preset():
    return {name: generate_tasks(spec, 150, seed=11) for name, spec in PRESETS.items()}


@pytest.mark.parametrize("style", ["direct", "search"])
def test_every_trace_scores_one_and_its_arithmetic_is_right(tasks_by_preset, style):
    for name, tasks in tasks_by_preset.items():
        for task in tasks:
            trace = write_trace(task, style)
            for prompt in (base_prompt(task), short_prompt(task)):
                assert compute_score(prompt + trace, task.ground_truth()) == 1.0, (name, task, trace)
            think, answer_line = trace.rsplit("\n", 1)
            assert answer_line.startswith("<answer>") and answer_line.endswith("</answer>")
            assert think.endswith("</think>") and not trace.endswith("\n")
            work, _, check = think.partition(" Check: ")
            steps = STEP.findall(work)
            assert steps and len(steps) == work.count("="), trace
            for a, op, b, v in steps:
                assert apply(int(a), op, int(b)) == int(v), (a, op, b, v, trace)
            if style == "search":
                expr, value = check.removesuffix(".</think>").split("=")
                assert eval(expr) == task.target == int(value)  # noqa: S307 - our own text


def test_trace_format_examples():
    task = CountdownTask(nums=(3, 5, 7), target=22)
    assert write_trace(task, "direct") == " 3*5=15, 15+7=22.</think>\n<answer>3 * 5 + 7</answer>"
    # First steps ranked by closeness to 22: 3*7=21 (1 away) fails (21+5=26 is the closest finish),
    # then 3*5=15 (7 away) works.
    assert write_trace(task, "search") == (
        " 3*7=21, 21+5=26, no.\n3*5=15, 15+7=22. Check: 3*5+7=22.</think>\n<answer>3 * 5 + 7</answer>"
    )
    assert write_trace(task, "search", max_dead_ends=0) == (
        " 3*5=15, 15+7=22. Check: 3*5+7=22.</think>\n<answer>3 * 5 + 7</answer>"
    )


def test_search_traces_are_deterministic_and_the_knob_changes_length(tasks_by_preset):
    tasks = tasks_by_preset["standard"]
    assert [write_trace(t) for t in tasks] == [write_trace(t) for t in tasks]
    assert [write_trace(t, seed=1) for t in tasks] == [write_trace(t, seed=1) for t in tasks]
    assert [write_trace(t, seed=1) for t in tasks] != [write_trace(t, seed=2) for t in tasks]
    # Without a seed the shown dead ends are the best-ranked ones: a prefix of the full search.
    for t in tasks:
        full = write_trace(t, max_dead_ends=99).split("\n")
        short = write_trace(t, max_dead_ends=1).split("\n")
        if len(full) > 3:
            assert short[0] == full[0] and short[1:] == full[-2:]
    lengths = [sum(len(write_trace(t, max_dead_ends=k)) for t in tasks) for k in (0, 1, 2, 4)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    for k in (0, 1, 3):
        assert all(write_trace(t, max_dead_ends=k).count(", no.") <= k for t in tasks)


def test_bounded_trace_examples():
    """(3, 5, 7) -> 22: the first-ranked try 3*7=21 fails (closest finish 21+5=26); the second, 3*5=15, works.
    A searcher that always gives up answers its closest attempt (3*7+5=26, wrong: format score 0.1); one that
    never gives up writes the whole search to the solution, the same text as ``search`` with no dead-end cap."""
    task = CountdownTask(nums=(3, 5, 7), target=22)
    dead_end = " 3*7=21, 21+5=26, no.\n"
    assert write_trace(task, "bounded",
                       give_up=1.0) == dead_end + "Closest: 3*7+5=26.</think>\n<answer>3 * 7 + 5</answer>"
    assert write_trace(task, "bounded", give_up=0.0) == (
        dead_end + "3*5=15, 15+7=22. Check: 3*5+7=22.</think>\n<answer>3 * 5 + 7</answer>"
    )
    assert write_trace(task, "bounded", give_up=0.0) == write_trace(task, "search", max_dead_ends=99)
    assert write_trace(task, "bounded", give_up=0.0, max_tries=1) == write_trace(task, "bounded", give_up=1.0)
    assert compute_score(short_prompt(task) + write_trace(task, "bounded", give_up=1.0), task.ground_truth()) == 0.1
    # a first-ranked success is written the same whatever the patience
    first = CountdownTask(nums=(3, 5, 7), target=26)
    assert write_trace(first, "bounded",
                       give_up=1.0) == " 3*7=21, 21+5=26. Check: 3*7+5=26.</think>\n<answer>3 * 7 + 5</answer>"


def test_bounded_traces_score_one_or_format_and_follow_their_rules(tasks_by_preset):
    """Every bounded trace: right arithmetic, ranked tries in order, either the solution (score 1) or a give-up
    answering the closest attempt (score 0.1); seeded; the correct share falls with ``give_up`` and matches the
    rank distribution (give-up draws are independent of the task)."""
    from rlft.tasks.countdown.traces import _candidates, is_solvable

    tasks = tasks_by_preset["medium3"]
    shares = []
    for give_up in (0.0, 0.3, 0.6, 1.0):
        correct = 0
        for i, task in enumerate(tasks):
            trace = write_trace(task, "bounded", seed=i, give_up=give_up, max_tries=4)
            assert trace == write_trace(task, "bounded", seed=i, give_up=give_up, max_tries=4)
            score = compute_score(short_prompt(task) + trace, task.ground_truth())
            lines = trace.split("</think>")[0].strip().split("\n")
            tries = [line for line in lines if not line.startswith("Closest")]
            ranked = _candidates(tuple(task.nums), task.target)
            rank = next(r for r, (_, rest) in enumerate(ranked) if is_solvable(rest, task.target))
            for line, (step, _) in zip(tries, ranked):  # the tries are the ranked candidates, in order
                a, op, b, v = step
                assert line.startswith(f"{a}{op}{b}={v},"), (line, step)
            for a, op, b, v in STEP.findall("\n".join(t.partition(" Check:")[0] for t in tries)):
                assert apply(int(a), op, int(b)) == int(v), trace
            if score == 1.0:
                correct += 1
                assert len(tries) == rank + 1 and "Check:" in tries[-1] and not lines[-1].startswith("Closest")
            else:
                assert score == 0.1 and lines[-1].startswith("Closest: ") and all(t.endswith(", no.") for t in tries)
                assert len(tries) <= min(rank, 4) and (give_up > 0 or len(tries) == 4)
                values = [int(STEP.findall(t)[-1][3]) for t in tries]
                closest = int(lines[-1].removesuffix(".").rsplit("=", 1)[1])
                assert abs(closest - task.target) == min(abs(v - task.target) for v in values)
        shares.append(correct / len(tasks))
    assert shares == sorted(shares, reverse=True) and shares[-1] < shares[0]
    expected = [
        sum((1 - give_up)**r for r in (rank_of(t) for t in tasks) if r < 4) / len(tasks)
        for give_up in (0.0, 0.3, 0.6, 1.0)
    ]
    assert shares[0] == pytest.approx(expected[0]) and shares[-1] == pytest.approx(expected[-1])
    assert shares[2] == pytest.approx(expected[2], abs=0.08)


def rank_of(task: CountdownTask) -> int:
    """0-based rank of the first ranked candidate that can still reach the target."""
    from rlft.tasks.countdown.traces import _candidates, is_solvable

    return next(
        r for r, (_, rest) in enumerate(_candidates(tuple(task.nums), task.target)) if is_solvable(rest, task.target))


def test_bounded_trace_arguments_are_checked():
    task = CountdownTask(nums=(3, 5, 7), target=22)
    with pytest.raises(ValueError, match="give_up"):
        write_trace(task, "bounded", give_up=1.5)
    with pytest.raises(ValueError, match="max_tries"):
        write_trace(task, "bounded", max_tries=0)


def test_unsolvable_task_and_unknown_style_raise():
    with pytest.raises(ValueError, match="no solution"):
        write_trace(CountdownTask(nums=(1, 1, 1), target=100))
    with pytest.raises(ValueError, match="style"):
        write_trace(ROW0, "poetry")  # type: ignore[arg-type]


def test_sft_examples_pair_prompt_and_trace():
    tasks = generate_tasks(PRESETS["easy3"], 5, seed=0)
    examples = sft_examples(tasks, base_prompt, "direct")
    assert [e.prompt for e in examples] == [base_prompt(t) for t in tasks]
    assert [e.completion for e in examples] == [write_trace(t, "direct") for t in tasks]


def test_base_prompt_is_tinyzero_text():
    assert base_prompt(ROW0) == ROW0_PROMPT
    assert BASE_TEMPLATE.format(numbers=[44, 19, 35], target=98) == ROW0_PROMPT
    assert parse_query(ROW0_PROMPT) == ((44, 19, 35), 98)
    assert parse_query("no task here") is None


def test_base_prompt_matches_the_real_parquet_row0():
    path = SHARED_DATA / "countdown" / "train.parquet"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path}")
    import pyarrow.parquet as pq

    row = pq.read_table(path, columns=["question"]).slice(0, 1).to_pylist()[0]
    assert row["question"].rstrip(" ") == ROW0_PROMPT  # that copy ends with "<think> "


def test_chat_prompt_uses_the_tokenizer_template(smol_tokenizer):
    prompt = chat_prompt(ROW0, smol_tokenizer)
    assert prompt.endswith("<|im_start|>assistant\nLet me solve this step by step.\n<think>")
    assert "<|im_start|>user\nUsing the numbers [44, 19, 35], create an equation that equals 98." in prompt
    trace = write_trace(ROW0)
    assert compute_score(prompt + trace, ROW0.ground_truth()) == 1.0


def test_chat_prompt_with_qwen_chatml_and_without_template(smol_tokenizer):
    tokenizer = copy.copy(smol_tokenizer)
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    prompt = chat_prompt(ROW0, tokenizer)
    assert prompt.startswith("<|im_start|>system\nYou are Qwen")
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\nLet me solve this step by step.\n<think>")

    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        chat_prompt(ROW0, tokenizer)
    with pytest.raises(ValueError, match="chat template"):
        chat_prompt(ROW0)


def test_prompt_templates_by_name(smol_tokenizer):
    assert set(PROMPT_TEMPLATES) == {"base", "chat", "short", "calc"}
    for name, fn in PROMPT_TEMPLATES.items():
        prompt = fn(ROW0, smol_tokenizer)
        assert "Assistant:" in prompt or "<|im_start|>assistant" in prompt
        assert prompt.endswith("<think>")
