"""The test-look ledger (rlft.lab.ledger): one JSON line per test evaluation, appended in one write; counts per model;
`rlft eval ledger [PATH]`."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path
from unittest import mock

import pytest

from rlft.cli import main
from rlft.eval.countdown import summarize
from rlft.lab.ledger import (LEDGER_NAME, count_test_looks, default_ledger_path, read_looks, record_test_look,
                              summarize_looks)
from rlft.validation import UsageError

TASKS = [{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3, 4], "target": 10}]


def result(scores):
    return summarize("greedy", task_scores=[[s] for s in scores], tasks=TASKS, task_truncated=[[False]] * 2,
                     task_tokens=[[5]] * 2, task_values=[[None]] * 2, task_certainty=[[None]] * 2)


def eval_file(path: Path, scores, sha: str | None, commit: str | None = "c0ffee") -> Path:
    data = {**result(scores).to_dict(), "config": {"model": f"runs/{sha}/model", "model_sha256": sha, "split": "test",
                                                   "data": "countdown.parquet"}}
    if commit:
        data["environment"] = {"rlft_commit": commit, "rlft_dirty": False}
    path.write_text(json.dumps(data))
    return path


def test_record_from_a_file_and_count_per_model(tmp_path):
    a = eval_file(tmp_path / "a.json", [1.0, 0.1], "aa" * 32)
    b = eval_file(tmp_path / "b.json", [0.0, 0.0], "bb" * 32, commit=None)
    ledger = tmp_path / "looks" / LEDGER_NAME
    first = record_test_look(a, None, ledger, label="real_grpo s0")
    record_test_look(b, None, ledger)
    record_test_look(a, {"model": "elsewhere/model"}, ledger)  # config keys given win over the file's
    lines = ledger.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line) for line in lines)
    assert first == json.loads(lines[0])
    assert (first["model_sha256"], first["model"], first["label"],
            first["num_tasks"]) == ("aa" * 32, "runs/" + "aa" * 32 + "/model", "real_grpo s0", 2)
    assert first["score"] == pytest.approx(0.55) and first["score_by_size"] == {
        "3": 1.0, "4": pytest.approx(0.1), "all": pytest.approx(0.55)
    }
    assert (first["rlft_commit"], first["split"], first["eval_file"]) == ("c0ffee", "test", str(a))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["time"])
    # without an environment in the file: this checkout's commit (rlft.provenance.git_commit)
    with mock.patch("rlft.provenance.git_commit", return_value=("1234abcd", True)):
        record = record_test_look(b, None, ledger)
    assert (record["rlft_commit"], record["rlft_dirty"]) == ("1234abcd", True)
    assert count_test_looks(ledger) == 4
    assert count_test_looks(ledger, "aa" * 32) == 2 and count_test_looks(ledger, "bb" * 32) == 2
    assert count_test_looks(ledger, "cc" * 32) == 0 and count_test_looks(tmp_path / "none.jsonl") == 0
    rows = summarize_looks(read_looks(ledger))
    assert [(r["model_sha256"][:2], r["looks"], r["labels"]) for r in rows] == [("aa", 2, ["real_grpo s0"]),
                                                                                ("bb", 2, [])]
    assert rows[0]["models"] == ["runs/" + "aa" * 32 + "/model", "elsewhere/model"]


def test_record_from_a_result_in_memory_next_to_its_output(tmp_path):
    out = tmp_path / "results" / "eval_test.json"
    record = record_test_look(result([1.0, 1.0]), {"model": "m", "model_sha256": None, "split": "test"}, eval_path=out)
    assert default_ledger_path(out) == tmp_path / "results" / LEDGER_NAME
    assert read_looks(tmp_path / "results" / LEDGER_NAME) == [record] and record["eval_file"] == str(out)
    with pytest.raises(UsageError, match="needs its config"):
        record_test_look(result([1.0, 1.0]), None, tmp_path / "l.jsonl")
    with pytest.raises(UsageError, match="does not exist"):
        record_test_look(tmp_path / "missing.json", None, tmp_path / "l.jsonl")


def _append(args):
    path, i = args
    from rlft.lab.ledger import append_line

    append_line(path, {"i": i, "pad": "x" * 2000})


def test_concurrent_appends_never_interleave(tmp_path):
    ledger = tmp_path / LEDGER_NAME
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_append, [(str(ledger), i) for i in range(40)])
    looks = read_looks(ledger)
    assert sorted(r["i"] for r in looks) == list(range(40)) and all(len(r["pad"]) == 2000 for r in looks)


def test_a_damaged_line_is_named(tmp_path, capsys):
    ledger = tmp_path / LEDGER_NAME
    ledger.write_text('{"model_sha256": "aa", "score": 0.5}\n{"model_sha2')
    with pytest.raises(UsageError, match=r"test_looks.jsonl: line 2 is not JSON .*: cut \(no newline at its end"):
        count_test_looks(ledger)
    with pytest.raises(SystemExit) as e:
        main(["eval", "ledger", str(ledger)])
    assert e.value.code == 2 and "line 2 is not JSON" in capsys.readouterr().err


def test_a_look_after_a_cut_line_starts_on_its_own_line(tmp_path, caplog):
    """A ledger whose last line a write did not finish: the next look is not glued onto it (it would be lost in the
    damaged line); it is appended whole on the next line, and the reader names the damaged line 2."""
    ledger = tmp_path / LEDGER_NAME
    ledger.write_text('{"time": "t0", "score": 0.5}\n{"time": "t1", "sco')
    record = record_test_look(eval_file(tmp_path / "e.json", [1.0, 0.0], "aa" * 32), None, ledger)
    lines = ledger.read_text().splitlines()
    assert lines[1] == '{"time": "t1", "sco' and json.loads(lines[2]) == record and len(lines) == 3
    with pytest.raises(UsageError, match=r"line 2 is not JSON .*: damaged"):
        read_looks(ledger)
    assert "its last line is cut (no newline at its end); this look starts on a new line" in caplog.text


def test_model_sha256_takes_a_unique_prefix(tmp_path, capsys):
    """`rlft eval ledger --model-sha256` with the 12 digits its own table prints counts that model's looks; a prefix
    of two models is refused naming both, one under 8 digits is refused at parse time; the full hash as before."""
    ledger = tmp_path / LEDGER_NAME
    a, b, c = "ab12" * 16, "ab12ab12" + "cd" * 28, "ff" * 32  # a and b share their first 8 digits, not 9
    for sha in (a, b, a, c):
        record_test_look(eval_file(tmp_path / "e.json", [1.0, 0.0], sha), None, ledger)
    capsys.readouterr()
    for given, count in ((a[:12], 2), (a[:12].upper(), 2), (b[:9], 1), (a, 2), (c[:8], 1), ("12345678", 0)):
        main(["eval", "ledger", str(ledger), "--model-sha256", given])
        out = capsys.readouterr().out
        assert out.startswith(f"{ledger}: {count} test look"), (given, out)
    for given, message in (("ab12", "at least its first 8 hex digits"), ("ab12xyz9", "at least its first 8 hex"),
                           ("ab12ab12", "ambiguous")):
        with pytest.raises(SystemExit) as e:
            main(["eval", "ledger", str(ledger), "--model-sha256", given])
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert a[:16] in err and b[:16] in err


def test_command_prints_the_count_and_a_table_per_model(tmp_path, capsys):
    ledger = tmp_path / LEDGER_NAME
    for scores, sha, label in (([1.0, 0.1], "aa" * 32, "sft"), ([0.0, 0.0], "bb" * 32, "rl s0"), ([1.0, 1.0], "aa" * 32,
                                                                                                  None)):
        record_test_look(eval_file(tmp_path / "e.json", scores, sha), None, ledger, label=label)
    main(["eval", "ledger", str(ledger)])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{ledger}: 3 test looks of 2 models"
    assert out[2].startswith("aaaaaaaaaaaa       2  ") and "0.550, 1.000" in out[2] and "sft" in out[2]
    assert out[3].startswith("bbbbbbbbbbbb       1  ") and "rl s0" in out[3]
    main(["eval", "ledger", str(ledger), "--model-sha256", "bb" * 32])
    assert capsys.readouterr().out.startswith(f"{ledger}: 1 test look of 1 model")
    with pytest.raises(SystemExit) as e:
        main(["eval", "ledger", str(tmp_path / "nothing.jsonl")])
    assert e.value.code == 2 and "no such test-look ledger" in capsys.readouterr().err
