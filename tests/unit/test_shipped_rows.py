"""The Countdown-Tasks-3to4 rows that ship with rlft (rlft.tasks.countdown.shipped): they are the rows the demo read
from ../shared, they select the held-out tasks of the recorded demo, the demo reads them by default, and every
Countdown ``--data`` takes their name."""

from __future__ import annotations

import fnmatch
import gzip
import json
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlft.plan import describe_data
from rlft.lab.demo_config import DemoConfig
from rlft.lab.demo_countdown import rows_source
from rlft.tasks.countdown import shipped
from rlft.tasks.countdown.loaders import load_countdown
from rlft.tasks.countdown.shipped import SHIPPED_NAME, SHIPPED_ROWS, resolve_rows, write_shipped_rows
from rlft.tasks.countdown.splits import load_split
from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[2]
SHARED_ROWS = SHARED_DATA / "countdown" / "train.parquet"
DEMO_RECORD = ROOT / "docs" / "results" / "countdown-real" / "demo"
needs_shared = pytest.mark.skipif(not SHARED_ROWS.is_file(), reason="no ../shared/data/countdown/train.parquet")


def pairs(tasks) -> list[tuple[tuple[int, ...], int]]:
    return [(tuple(t.nums), t.target) for t in tasks]


def recorded_tasks(path: Path) -> list[tuple[tuple[int, ...], int]]:
    """The tasks of an archived ``rlft eval countdown`` file, in its order."""
    opened = gzip.open(path, "rt") if path.suffix == ".gz" else path.open()
    with opened as f:
        return [(tuple(t["nums"]), t["target"]) for t in json.load(f)["tasks"]]


def test_the_shipped_file_is_small_and_holds_only_target_and_nums():
    table = pq.read_table(SHIPPED_ROWS)
    assert SHIPPED_ROWS.stat().st_size < 100_000
    assert table.column_names == ["target", "nums"] and table.num_rows == 10_240
    assert table.slice(0, 1).to_pylist() == [{"target": 98, "nums": [44, 19, 35]}]  # row 0 of Countdown-Tasks-3to4
    assert (SHIPPED_ROWS.parent / "README.md").is_file()  # source and licence beside it


@needs_shared
def test_the_shipped_rows_are_the_rows_the_demo_read_from_shared():
    assert pairs(load_countdown(SHIPPED_NAME)) == pairs(load_countdown(SHARED_ROWS))


@needs_shared
def test_the_held_out_split_selects_the_same_tasks_as_from_shared():
    ours, theirs = load_split(SHIPPED_NAME), load_split(str(SHARED_ROWS))
    for part in ("train", "validation", "test"):
        assert pairs(ours.part(part)) == pairs(theirs.part(part)), part


def test_the_held_out_split_selects_the_recorded_demos_tasks():
    """Without ../shared too: the test rows are those of the archived demo's evaluations (2026-12-02), in order, and
    the validation rows those of its three-seed validation check."""
    split = load_split(SHIPPED_NAME)
    assert pairs(split.test) == recorded_tasks(DEMO_RECORD / "eval" / "rl--greedy.json")
    assert pairs(split.validation) == recorded_tasks(DEMO_RECORD / "seeds_validation" / "filtered_val.json.gz")
    assert len(split.train) == 10_240 - 1_000 - 2  # two training rows repeat a held-out task (the study's 9,238)


def test_the_demo_reads_the_shipped_rows_without_shared(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ../shared beside this folder
    rows, note = rows_source(DemoConfig(), tmp_path / "run")
    assert rows == SHIPPED_NAME and "shipped with rlft" in note
    assert resolve_rows(rows) == SHIPPED_ROWS
    assert not (tmp_path / "run").exists()  # no stand-in generated
    assert rows_source(DemoConfig(rows="x.parquet"), tmp_path / "run")[0] == "x.parquet"


def test_the_name_reads_the_file_and_a_missing_file_is_named(tmp_path, monkeypatch):
    assert resolve_rows("other.parquet") == "other.parquet"
    assert "ship with rlft" in describe_data(SHIPPED_NAME)
    monkeypatch.setattr(shipped, "SHIPPED_ROWS", tmp_path / "gone.parquet")
    with pytest.raises(FileNotFoundError, match="countdown-3to4: the Countdown rows that ship with rlft .*gone"):
        load_countdown(SHIPPED_NAME)


def test_the_rebuild_keeps_target_and_nums_of_the_first_rows(tmp_path):
    source = tmp_path / "full.parquet"
    pq.write_table(pa.table({"target": [5, 6, 7], "nums": [[1, 4], [2, 3, 1], [7]], "answer": ["a", "b", "c"]}), source)
    dest = tmp_path / "out" / "rows.parquet"
    assert write_shipped_rows(source, dest, rows=2) == 2
    assert pq.read_table(dest).to_pylist() == [{"target": 5, "nums": [1, 4]}, {"target": 6, "nums": [2, 3, 1]}]
    with pytest.raises(ValueError, match="3 rows, fewer than the 4 to ship"):
        write_shipped_rows(source, dest, rows=4)
    pq.write_table(pa.table({"target": [5]}), source)
    with pytest.raises(ValueError, match="no nums column"):
        write_shipped_rows(source, dest, rows=1)
    assert shipped.main([]) == 2


def test_the_file_is_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["rlft"]
    relative = SHIPPED_ROWS.relative_to(ROOT / "src" / "rlft").as_posix()
    assert any(fnmatch.fnmatch(relative, p) for p in patterns), (relative, patterns)
