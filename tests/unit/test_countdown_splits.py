"""rlft.tasks.countdown.splits: the held-out block of a Countdown dataset, and per-size evaluation summaries."""

from __future__ import annotations

import random

import pytest

from rlft.eval.countdown import CountdownEvalResult, size_summary, subset
from rlft.rewards.countdown import answer_value
from rlft.tasks.countdown.generator import task_key
from rlft.tasks.countdown.splits import RowSplit, drop_heldout, load_split, split_rows
from rlft.types import CountdownTask
from tests.conftest import SHARED_DATA


def rows(n: int, seed: int = 0) -> list[CountdownTask]:
    rng = random.Random(seed)
    return [
        CountdownTask(tuple(rng.randint(1, 99) for _ in range(rng.choice((3, 4)))), rng.randint(10, 100))
        for _ in range(n)
    ]


def test_split_is_stratified_distinct_disjoint_and_seeded():
    tasks = rows(3000)
    tasks[2500] = tasks[10]  # a duplicate of an early row, beyond the pool
    split = split_rows(tasks, n_test=100, n_validation=60, pool=2000)
    for part, n in ((split.test, 100), (split.validation, 60)):
        assert len(part) == n
        assert sum(len(t.nums) == 3 for t in part) == n // 2 and sum(len(t.nums) == 4 for t in part) == n // 2
        assert len({task_key(t) for t in part}) == n
    held = split.heldout_keys()
    assert len(held) == 160 and not {task_key(t) for t in split.test} & {task_key(t) for t in split.validation}
    assert not held & {task_key(t) for t in split.train}  # the duplicate at row 2500 goes too when row 10 is held out
    assert len(split.train) == sum(task_key(t) not in held for t in tasks)
    assert [t for t in tasks if task_key(t) not in held] == split.train  # file order kept
    assert all(tasks.index(t) < 2000 for t in split.test + split.validation)  # drawn from the pool only
    again = split_rows(tasks, n_test=100, n_validation=60, pool=2000)
    assert again == split
    other = split_rows(tasks, n_test=100, n_validation=60, pool=2000, seed=7)
    assert other.test != split.test
    # the held-out block does not depend on rows beyond the pool (a longer copy of the dataset)
    assert split_rows(tasks[:2000], n_test=100, n_validation=60, pool=2000).test == split.test


def test_split_refuses_too_few_distinct_tasks_and_names_the_source():
    tasks = [CountdownTask((1, 2, 3), 10)] * 50 + [CountdownTask((1, 2, 3, 4), 10)] * 50
    with pytest.raises(ValueError, match=r"tiny\.jsonl.*3-number"):
        split_rows(tasks, n_test=4, n_validation=0, source="tiny.jsonl")


def test_part_and_drop_heldout():
    split = RowSplit([CountdownTask((1, 2, 3), 10)], [], [CountdownTask((4, 5, 6), 20)])
    assert split.part("test") == split.test and split.part("train") == split.train
    with pytest.raises(ValueError, match="unknown split"):
        split.part("dev")
    assert drop_heldout([CountdownTask((6, 4, 5), 20), CountdownTask((1, 2, 3), 10)],
                        split.heldout_keys()) == [CountdownTask((1, 2, 3), 10)]


@pytest.mark.skipif(not (SHARED_DATA / "countdown" / "train.parquet").is_file(), reason="needs ../shared/data")
def test_real_file_split_sizes():
    split = load_split(str(SHARED_DATA / "countdown" / "train.parquet"))
    assert len(split.test) == len(split.validation) == 500
    assert sum(len(t.nums) == 4 for t in split.test) == 250
    assert len(split.train) == 9238  # 10,240 rows - 1,000 held out - 2 later rows that repeat a held-out task
    assert not split.heldout_keys() & {task_key(t) for t in split.train}


def test_size_summary_and_subset_by_hand():
    result = CountdownEvalResult(
        num_tasks=3, k=2, mode="sampled", mean_score=0.0, accuracy=0.0, format_rate=0.0, pass_at_k={1: 0.0},
        mean_completion_tokens=0.0, truncated_rate=0.0, task_scores=[[1.0, 0.1], [0.0, 0.0], [1.0, 1.0]],
        tasks=[{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3, 4], "target": 10},
               {"nums": [2, 3, 4], "target": 9}], task_truncated=[[False, False], [True, False], [False, False]])
    summary = size_summary(result)
    assert list(summary) == ["3", "4", "all"]
    assert summary["3"] == {
        "n": 2, "score": pytest.approx(3.1 / 4), "accuracy": 0.75, "format_rate": 1.0, "truncated_rate": 0.0
    }
    assert summary["4"] == {"n": 1, "score": 0.0, "accuracy": 0.0, "format_rate": 0.0, "truncated_rate": 0.5}
    assert summary["all"]["score"] == pytest.approx(3.1 / 6) and summary["all"]["truncated_rate"] == pytest.approx(
        1 / 6)
    assert subset(result, 4) == [[0.0, 0.0]] and subset(result, None) == result.task_scores


@pytest.mark.parametrize("completion, value", [
    (" ok</think>\n<answer>(3 + 5) * 2</answer>", 16.0),
    (" ok</think>\n<answer>7 / 2</answer>", 3.5),
    (" ok</think>\n<answer>1 / 0</answer>", None),     # raises: does not vote
    (" ok</think>\n<answer>3 x 5</answer>", None),     # bad character
    (" <answer>2 + 2</answer>\nmore text", None),        # not on the last line: the scorer sees no answer
    (" nothing", None),
    (" ok</think>\n<answer>(-8) ** 0.5</answer>", None),  # complex
])
def test_answer_value(completion, value):
    assert answer_value("Assistant: Let me solve this step by step.\n<think>", completion) == value


def test_a_study_setting_with_a_dataset_evaluates_on_its_heldout_rows(tmp_path):
    from dataclasses import replace

    from rlft.lab.pipeline import heldout_tasks, load_settings
    from rlft.validation import OptionError
    from tests.conftest import write_jsonl_rows

    tasks = rows(2400, seed=3)
    data = write_jsonl_rows(tmp_path / "rows.jsonl", [{"target": t.target, "nums": list(t.nums)} for t in tasks])
    settings = load_settings(__import__("pathlib").Path(__file__).parents[2] / "configs" / "countdown" / "ablation")
    setting = replace(settings["real"], tasks={**settings["real"].tasks, "data": str(data)})
    split = split_rows(tasks)
    assert heldout_tasks(setting, 40, "test") == split.test[:40]
    assert heldout_tasks(setting, 500, "validation") == split.validation
    with pytest.raises(OptionError, match="501"):
        heldout_tasks(setting, 501, "test")


def test_every_prefix_of_a_heldout_part_is_balanced():
    split = split_rows(rows(3000), n_test=100, n_validation=60, pool=2000)
    for part in (split.test, split.validation):
        assert [len(t.nums) for t in part[:6]] == [3, 4, 3, 4, 3, 4]
