"""One rule for test-look ledgers (rlft.lab.ledger.check_ledger_target): a ledger is a .jsonl file whose lines are all
looks, never an input or an output of the evaluation (by resolved identity), writable, checked before the evaluation
runs, by every writer: `rlft eval countdown --ledger`, rlft.lab.pipeline.evaluate_cached and the demo."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest

from rlft.cli import main
from rlft.lab.ledger import LEDGER_NAME, check_ledger_target, read_looks
from rlft.rollout.base import SamplingParams
from rlft.types import CountdownTask
from rlft.validation import UsageError

LOOK = '{"time": "2026-12-01T00:00:00Z", "score": 0.5, "model_sha256": null}\n'
ROWS = '{"target": 6, "nums": [1, 2, 3]}\n{"target": 10, "nums": [1, 2, 3, 4]}\n'
DEMO_LEDGER = Path(__file__).resolve().parents[2] / "docs/results/countdown-real/demo/eval/test_looks.jsonl"


@pytest.fixture
def files(tmp_path):
    """A model folder (config.json only: nothing here loads it), a Parquet-named and a JSONL data file, a ledger."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}\n')
    (tmp_path / "rows.parquet").write_bytes(b"PAR1 not really parquet PAR1")
    (tmp_path / "rows.jsonl").write_text(ROWS)
    (tmp_path / "out").mkdir()
    (tmp_path / LEDGER_NAME).write_text(LOOK)
    return tmp_path


def _refused(capsys, *args: str) -> str:
    """`rlft eval countdown ARGS` exits 2 at parse time with one line on stderr; returns it."""
    with pytest.raises(SystemExit) as e:
        main(["eval", "countdown", *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def _snapshot(folder: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case, message", [
    ("output by another spelling", "is the evaluation's output --output"),
    ("output beside itself", "the ledger beside --output"),
    ("data file", "a test-look ledger is a .jsonl file"),
    ("data file by a link", "is the evaluation's input --data"),
    ("data file by a hard link", "is the evaluation's input --data"),
    ("model config", "a test-look ledger is a .jsonl file"),
    ("inside the model folder", "lies inside the evaluation's input --model"),
    ("rows, not looks", "line 1 is a JSON object without time, score, not a test look"),
    ("not a .jsonl name", "a test-look ledger is a .jsonl file"),
])
def test_eval_countdown_refuses_a_ledger_that_is_not_one(files, capsys, case, message):
    """Each of these exited 0 with "test look recorded" and broke the file it appended to (the evaluation JSON, the
    data, the model's config.json); now the command stops at parse time, before any model loads, and writes nothing."""
    t, model = files, str(files / "model")
    args = {
        "output by another spelling": ["--data", str(t / "rows.jsonl"), "--output", str(t / "out/ev.jsonl"),
                                       "--ledger", str(t / "model/../out/ev.jsonl")],
        "output beside itself": ["--output", str(t / "out" / LEDGER_NAME)],
        "data file": ["--data", str(t / "rows.parquet"), "--ledger", str(t / "rows.parquet")],
        "data file by a link": ["--data", str(t / "rows.jsonl"), "--ledger", str(t / "link.jsonl")],
        "data file by a hard link": ["--data", str(t / "rows.jsonl"), "--ledger", str(t / "hard.jsonl")],
        "model config": ["--ledger", str(t / "model/config.json")],
        "inside the model folder": ["--ledger", str(t / "model/looks.jsonl")],
        "rows, not looks": ["--ledger", str(t / "rows.jsonl")],
        "not a .jsonl name": ["--ledger", str(t / "out/looks.json")],
    }[case]
    (t / "link.jsonl").symlink_to(t / "rows.jsonl")
    os.link(t / "rows.jsonl", t / "hard.jsonl")
    before = _snapshot(t)
    err = _refused(capsys, "--model", model, *args)
    assert message in err, err
    assert _snapshot(t) == before


@pytest.mark.parametrize("split", ["validation", "train", "all"])
def test_eval_countdown_refuses_a_ledger_where_no_test_look_is_recorded(files, capsys, split):
    """--ledger with another --split was silently ignored; now it is refused at parse time (with --data and without)."""
    for data in (["--data", str(files / "rows.jsonl")], []):
        if split == "all" and not data:
            continue
        err = _refused(capsys, "--model", str(files / "model"), *data, "--split", split, "--ledger",
                       str(files / LEDGER_NAME))
        assert f"--ledger needs --split test: --split {split} is not a look at the test rows" in err


def test_an_unwritable_or_cut_ledger_is_refused_before_the_evaluation(files, capsys):
    """Found at parse time, not after the evaluation: a folder on the way that is a file, a folder or file that
    cannot be written, a ledger whose last line a write did not finish (the next look would be glued onto it)."""
    model = str(files / "model")
    err = _refused(capsys, "--model", model, "--ledger", str(files / "rows.parquet/looks.jsonl"))
    assert f"{files / 'rows.parquet'} is a file, not a folder" in err
    denied = {str(files / "out"), str(files / LEDGER_NAME)}
    with mock.patch("os.access", side_effect=lambda p, mode: str(p) not in denied):
        assert "cannot create it in" in _refused(capsys, "--model", model, "--ledger", str(files / "out/new.jsonl"))
        assert "the file cannot be written" in _refused(capsys, "--model", model, "--ledger", str(files / LEDGER_NAME))
    ledger = files / LEDGER_NAME
    ledger.write_text(LOOK + '{"time": "2026-12-02T00:00:00Z", "sco')
    err = _refused(capsys, "--model", model, "--ledger", str(ledger))
    assert "its last line (2) is cut (no newline at its end, not JSON" in err and "move that line aside" in err
    assert ledger.read_text().endswith('"sco')


def test_evaluate_cached_checks_its_ledger_before_hashing_or_loading(files):
    """The demo's and the ablation runner's writer: the same rule, before the weights are hashed or a model loads."""
    from rlft.lab.pipeline import EvalJob, evaluate_cached

    model = files / "model"
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=8)
    job = EvalJob(files / "out/test.json", [CountdownTask((1, 2), 3)], params, test_look=True)
    for ledger, message in ((model / LEDGER_NAME, "lies inside the evaluation's input model"),
                            (files / "out/test.json", ".jsonl file"), (files / "rows.jsonl", "not a test look"),
                            (files / "rows.parquet/looks.jsonl", "is a file, not a folder")):
        with mock.patch("rlft.checkpoint.weights_sha256", side_effect=AssertionError("hashed")), \
                pytest.raises(UsageError, match="test-look ledger .*" + message.replace(".", r"\.")):
            evaluate_cached(model, {"test": job}, prompt_template="short", batch_size=4, ledger=ledger)


def test_check_ledger_target_compares_by_identity(files):
    """The same file under another name (a hard link, a symlinked folder, ``..``) is the same file; a new ledger
    beside an input is fine, and an existing ledger of looks is accepted (with a cut end only when asked)."""
    (files / "alias").symlink_to(files / "out")
    os.link(files / "rows.jsonl", files / "rows-copy.jsonl")
    for ledger, other in ((files / "alias/ev.jsonl", files / "out/ev.jsonl"),
                          (files / "rows-copy.jsonl", files / "rows.jsonl"),
                          (files / "model/../out/x.jsonl", files / "out/x.jsonl")):
        with pytest.raises(UsageError, match="is the evaluation's output"):
            check_ledger_target(ledger, outputs=[other])
    assert check_ledger_target(files / LEDGER_NAME, inputs={"--data": files / "rows.jsonl"}) == files / LEDGER_NAME
    (files / LEDGER_NAME).write_text(LOOK + '{"time"')
    assert check_ledger_target(files / LEDGER_NAME, allow_cut_end=True) == files / LEDGER_NAME


def test_an_overwritten_demo_carries_its_looks_into_the_new_ledger(tmp_path, monkeypatch):
    """`rlft demo --overwrite` moves the earlier run aside; its test looks stay counted: they are appended to the
    new run's ledger before anything else (the count was lost when a rerun started a fresh ledger)."""
    import rlft.lab.demo_countdown as demo
    from rlft.lab.demo_config import DemoConfig

    run = tmp_path / "demo"
    (run / "eval").mkdir(parents=True)
    looks = [json.loads(LOOK), {**json.loads(LOOK), "time": "2026-12-02T00:00:00Z", "label": "sft greedy"}]
    (run / "eval" / LEDGER_NAME).write_text("".join(json.dumps(r) + "\n" for r in looks))

    class Stop(Exception):
        pass

    monkeypatch.setattr(demo, "rows_source", mock.Mock(side_effect=Stop))
    with pytest.raises(Stop):
        demo.run_countdown_demo(DemoConfig(output_dir=str(run), overwrite=True))
    assert read_looks(run / "eval" / LEDGER_NAME) == looks
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("demo.replaced-")]
    assert len(aside) == 1 and read_looks(aside[0] / "eval" / LEDGER_NAME) == looks


def test_the_demo_record_ledger_holds_every_look_in_time_order():
    """docs/results/countdown-real/demo/eval/test_looks.jsonl: the 2026-11-27 and 2026-11-28 demos' 5 looks each
    (restored from git history after the 2026-12-02 rerun replaced the file), then the rerun's 5; a ledger by the
    rule."""
    looks = read_looks(DEMO_LEDGER)
    times = [r["time"] for r in looks]
    assert len(looks) == 15 and times == sorted(times)
    assert [t[:10] for t in times[::5]] == ["2026-11-27", "2026-11-28", "2026-12-02"]
    assert check_ledger_target(DEMO_LEDGER) == DEMO_LEDGER
