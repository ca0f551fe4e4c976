"""Countdown loaders: the real parquet, hand-made fixtures in each schema, malformed rows, the Hub."""

from __future__ import annotations

import collections
import json
import time
import warnings

import pytest

from rlft.rewards.countdown import compute_score
from rlft.tasks.countdown.loaders import load_countdown, tail_by_size
from rlft.tasks.countdown.prompts import base_prompt
from rlft.types import CountdownTask

from tests.conftest import ASSETS, SHARED_DATA

FIXTURES = ASSETS / "countdown"
REAL = SHARED_DATA / "countdown" / "train.parquet"


def test_real_parquet():
    if not REAL.is_file():
        pytest.skip(f"shared data not found at {REAL} (expected ../shared/data next to the repo)")
    tasks = load_countdown(REAL)
    assert len(tasks) == 10_240
    assert (tasks[0].nums, tasks[0].target) == ((44, 19, 35), 98)
    assert collections.Counter(len(t.nums) for t in tasks) == {3: 5052, 4: 5188}
    # Its `answer` column gives a correct solution for every row; spot-check a few.
    for t in tasks[::512]:
        assert compute_score(f"Assistant: <answer>{t.solution}</answer>", t.ground_truth()) == 1.0
    assert load_countdown(REAL, start=10, limit=3) == tasks[10:13]


def test_tasks_jsonl_fixture():
    tasks = load_countdown(FIXTURES / "tasks_3to4.jsonl")
    assert len(tasks) == 6
    assert tasks[0] == CountdownTask(nums=(44, 19, 35), target=98)
    assert tasks[4].nums == (88, 3, 9, 4) and tasks[4].target == 25
    assert load_countdown(FIXTURES / "tasks_3to4.jsonl", start=1, limit=2) == tasks[1:3]
    assert load_countdown(FIXTURES / "tasks_3to4.jsonl", start=5, limit=10) == tasks[5:]


def test_verl_json_and_numbers_column_and_parquet(tmp_path):
    expected = load_countdown(FIXTURES / "tasks_3to4.jsonl", limit=3)
    assert load_countdown(FIXTURES / "verl.json") == expected
    # `numbers` instead of `nums`, a `solution` column, and a parquet file.
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"target": t.target, "numbers": list(t.nums), "solution": "x"} for t in expected]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tasks.parquet")
    loaded = load_countdown(tmp_path / "tasks.parquet")
    assert [(t.nums, t.target, t.solution) for t in loaded] == [(t.nums, t.target, "x") for t in expected]


def test_cog_behav_fixture():
    tasks = load_countdown(FIXTURES / "cog_behav.jsonl")
    assert [(t.nums, t.target) for t in tasks] == [
        ((12, 4, 2), 14),
        ((7, 3, 19, 2), 24),
        ((15, 9, 22), 16),
        ((8, 21, 5, 3), 11),
    ]
    rows = [json.loads(line) for line in (FIXTURES / "cog_behav.jsonl").read_text().splitlines()]
    for task, row in zip(tasks, rows):
        assert task.query == row["query"] and task.completion == row["completion"]
        assert task.solution is None  # cog_behav completions are not all correct
        assert base_prompt(task) == row["query"] + "\n<think>"
    # Scored with the exact reward: rows 0-2 are correct, row 3 is a wrong (format-only) answer.
    scores = [compute_score(t.query + t.completion, t.ground_truth()) for t in tasks]
    assert scores == [1.0, 1.0, 1.0, 0.1]


@pytest.mark.parametrize(
    "name, row, field",
    [
        ("malformed.jsonl", 1, "target"),
        ("malformed_cog_behav.jsonl", 1, "query"),
    ],
)
def test_bad_row_raises_naming_file_row_field(name, row, field):
    with pytest.raises(ValueError) as info:
        load_countdown(FIXTURES / name)
    message = str(info.value)
    assert name in message and f"row {row}:" in message and repr(field) in message


@pytest.mark.parametrize(
    "start, row, field",
    [(2, 2, "nums"), (3, 3, "<line>"), (4, 4, "target")],
)
def test_each_malformed_row_is_reported(start, row, field):
    with pytest.raises(ValueError, match=rf"malformed\.jsonl: row {row}: field '{field}'"):
        load_countdown(FIXTURES / "malformed.jsonl", start=start, limit=1)


def test_blank_completion_is_reported():
    with pytest.raises(ValueError, match=r"row 2: field 'completion'"):
        load_countdown(FIXTURES / "malformed_cog_behav.jsonl", start=2)


def test_skip_invalid_counts_and_warns():
    with pytest.warns(UserWarning, match=r"skipped 4 invalid rows of .*malformed\.jsonl"):
        tasks = load_countdown(FIXTURES / "malformed.jsonl", skip_invalid=True)
    assert [t.target for t in tasks] == [98, 63]
    with pytest.warns(UserWarning, match=r"skipped 2 invalid rows"):
        assert len(load_countdown(FIXTURES / "malformed_cog_behav.jsonl", skip_invalid=True)) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when nothing is skipped
        load_countdown(FIXTURES / "tasks_3to4.jsonl", skip_invalid=True)


def test_missing_file_and_unknown_layout(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_countdown(tmp_path / "nope.jsonl")
    (tmp_path / "odd.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(ValueError, match="unknown Countdown layout"):
        load_countdown(tmp_path / "odd.jsonl")


def test_hub_failure_is_a_clear_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nobody/no-such-countdown' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match="Hub may be unreachable.*local .jsonl"):
        load_countdown("nobody/no-such-countdown")
    assert time.perf_counter() - start < 1.0


def test_hub_rows_are_loaded_with_start_and_limit(monkeypatch):
    import datasets

    rows = [
        {"target": 98, "nums": [44, 19, 35]},
        {"target": 64, "nums": [63, 95, 96]},
        {"target": 1, "nums": [1]},
    ]
    calls = []

    def fake_load(source, split):
        calls.append((source, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    tasks = load_countdown("Jiayi-Pan/Countdown-Tasks-3to4", split="train", start=1, limit=1)
    assert calls == [("Jiayi-Pan/Countdown-Tasks-3to4", "train")]
    assert tasks == [CountdownTask(nums=(63, 95, 96), target=64)]


def test_tail_by_size_takes_the_last_rows_of_each_size_in_order():
    tasks = [CountdownTask(nums=tuple(range(1, size + 1)), target=i) for i, size in enumerate([3, 4, 3, 3, 4, 4, 4])]
    tails = tail_by_size(tasks, 2)
    assert [t.target for t in tails[3]] == [2, 3]
    assert [t.target for t in tails[4]] == [5, 6]
    assert [t.target for t in tail_by_size(tasks, 10)[3]] == [0, 2, 3]  # fewer than n: all of them
    assert tail_by_size(tasks, 0) == {3: [], 4: []}  # 0 is none, not the whole list ([-0:])
    assert tail_by_size(tasks, 2, sizes=(5,)) == {5: []}
