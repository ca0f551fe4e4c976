"""rlft.data.files: reading rows from JSONL / JSON / Parquet / Hub ids, errors that name file and row."""

from __future__ import annotations

import json
import re
import sys
import types

import pytest

from rlft.data.files import DataError, read_rows, write_jsonl

ROWS = [
    {"prompt": "Q: 1+1?", "completion": " 2", "n": 1},
    {"prompt": "Q: caf\u00e9?", "completion": " \u4f60\u597d\n", "n": 2},
    {"prompt": "", "completion": " x", "n": None},
]


def test_read_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert list(read_rows(str(path))) == list(enumerate(ROWS))


def test_read_json_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS))
    assert list(read_rows(str(path))) == list(enumerate(ROWS))


def test_read_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    assert list(read_rows(str(path))) == list(enumerate(ROWS))


def test_json_that_is_not_a_list_raises_data_error(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"prompt": "x"}))
    with pytest.raises(DataError, match="list of objects"):
        list(read_rows(str(path)))


def test_bad_jsonl_line_is_yielded_as_data_error_naming_file_and_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n" + '{"prompt": "x", "completion": \n' +
        json.dumps(ROWS[0]) + "\n")
    rows = list(read_rows(str(path)))
    assert rows[0] == (0, ROWS[0]) and rows[1] == (1, ROWS[1]) and rows[3] == (3, ROWS[0])
    index, err = rows[2]
    assert index == 2 and isinstance(err, DataError)
    assert err.source == str(path) and err.row == 2
    assert str(path) in str(err) and "row 2" in str(err) and "not valid JSON" in str(err)


def test_jsonl_line_that_is_not_an_object_is_yielded_as_data_error(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n[1, 2]\n")
    (_, first), (_, second) = read_rows(str(path))
    assert first == ROWS[0]
    assert isinstance(second, DataError) and re.search(r"row 1: .*expected a JSON object, got list", str(second))


@pytest.mark.parametrize("name", ["missing.jsonl", "missing.parquet", "missing.json"])
def test_missing_file_raises_file_not_found(tmp_path, name):
    with pytest.raises(FileNotFoundError, match="missing"):
        list(read_rows(str(tmp_path / name)))


def test_hub_id_unreachable_raises_connection_error_with_advice(monkeypatch):
    calls = []

    def offline(source, split):
        calls.append((source, split))
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    try:
        import datasets
    except ImportError:  # still exercise the path with a stand-in module
        datasets = types.ModuleType("datasets")
        monkeypatch.setitem(sys.modules, "datasets", datasets)
        monkeypatch.setattr(datasets, "load_dataset", offline, raising=False)
    else:
        monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConnectionError) as info:
        list(read_rows("someone/some-dataset", split="test"))
    message = str(info.value)
    assert calls == [("someone/some-dataset", "test")]
    assert "someone/some-dataset" in message and "'test'" in message
    assert "couldn't connect" in message and "local" in message


def test_hub_id_rows_are_indexed(monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets, "load_dataset", lambda source, split: list(ROWS))
    assert list(read_rows("someone/ds")) == list(enumerate(ROWS))


def test_write_jsonl_round_trip(tmp_path):
    path = tmp_path / "sub" / "out.jsonl"
    write_jsonl(path, ROWS)
    assert list(read_rows(str(path))) == list(enumerate(ROWS))
    assert path.read_text().count("\n") == len(ROWS)
    assert [p.name for p in path.parent.iterdir()] == ["out.jsonl"]  # no temp file left behind
    # Overwrites, from a generator too.
    write_jsonl(path, (r for r in ROWS[:1]))
    assert list(read_rows(str(path))) == [(0, ROWS[0])]
