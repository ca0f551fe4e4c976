"""scripts/studies/plot_truncation.py on hand-built files: the table's numbers, the PNG written, the refusals (one
line, exit 2), a last metrics line cut short by a kill left out, and the PNG that never replaces an input or an existing
file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlft.eval.countdown import summarize
from rlft.lab.script_io import ScriptError, read_labelled_run
from tests.conftest import load_script

TASKS = [{"nums": [1, 2, 3], "target": 6}, {"nums": [4, 5, 6, 7], "target": 22}]


def write_eval(path: Path, scores: list[float], cut: list[bool], tokens: list[int], tasks=TASKS) -> str:
    result = summarize("greedy", task_scores=[[s] for s in scores], tasks=tasks, task_truncated=[[c] for c in cut],
                       task_tokens=[[t] for t in tokens], task_values=[[None]] * 2, task_certainty=[[None]] * 2)
    path.write_text(json.dumps(result.to_dict()))
    return str(path)


def write_metrics(path: Path, cut: list[float]) -> str:
    path.write_text("".join(
        json.dumps({"step": i + 1, "completion/truncated_frac": c, "completion/mean_tokens": 50 + i}) + "\n"
        for i, c in enumerate(cut)))
    return str(path)


def test_table_and_plot(tmp_path, capsys):
    start = write_eval(tmp_path / "start.json", [0.1, 0.1], [False, False], [60, 80])
    metrics = write_metrics(tmp_path / "m.jsonl", [0.0, 0.25])
    run = f"rl={metrics},{write_eval(tmp_path / 'rl.json', [1.0, 0.0], [False, True], [90, 256])}"
    load_script("plot_truncation").main(["--start", start, "--run", run, "--out", str(tmp_path / "t.png")])
    out = capsys.readouterr().out
    assert "| start | 0.100 / 0.100 / 0.100 | 0.000 | 1.000 | 0.000 | 70 |" in out
    assert "| rl | 0.500 / 1.000 / 0.000 | 0.500 | 0.500 | 0.500 | 173 |" in out
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_refuses_other_tasks_and_a_malformed_run(tmp_path):
    start = write_eval(tmp_path / "start.json", [0.1, 0.1], [False, False], [60, 80])
    other = write_eval(tmp_path / "o.json", [0.1, 0.1], [False, False], [60, 80], tasks=TASKS[::-1])
    metrics = write_metrics(tmp_path / "m.jsonl", [0.0])
    script = load_script("plot_truncation")
    with pytest.raises(ScriptError, match="o.json: other tasks"):
        script.main(["--start", start, "--run", f"rl={metrics},{other}", "--out", str(tmp_path / "t.png")])
    with pytest.raises(ScriptError, match="expected LABEL=METRICS.jsonl,EVAL.json"):
        script.main(["--start", start, "--run", f"rl={metrics}", "--out", str(tmp_path / "t.png")])
    (tmp_path / "sft.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    with pytest.raises(ScriptError, match="no step records with completion/truncated_frac"):
        script.main([
            "--start", start, "--run", f"rl={tmp_path / 'sft.jsonl'},{start}", "--out",
            str(tmp_path / "t.png")
        ])


def test_a_last_metrics_line_cut_short_is_left_out(tmp_path, capsys):
    """A run killed mid-write (or still running) leaves half a line: the plot is drawn from the whole records, with a
    note; a broken line before the last is an error naming the file and line."""
    start = write_eval(tmp_path / "start.json", [0.1, 0.1], [False, False], [60, 80])
    metrics = Path(write_metrics(tmp_path / "m.jsonl", [0.0, 0.25]))
    metrics.write_text(metrics.read_text() + '{"step": 3, "completion/trunc')
    run = f"rl={metrics},{write_eval(tmp_path / 'rl.json', [1.0, 0.0], [False, True], [90, 256])}"
    script = load_script("plot_truncation")
    assert [r["step"] for r in read_labelled_run(run, "completion/truncated_frac")[1]] == [1, 2]
    script.main(["--start", start, "--run", run, "--out", str(tmp_path / "t.png")])
    assert "m.jsonl: line 3 is cut short" in capsys.readouterr().err and (tmp_path / "t.png").stat().st_size > 1000
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], lines[2], lines[1]]) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        script.run_script(script.main, ["--start", start, "--run", run, "--out",
                                        str(tmp_path / "u.png")], prog="plot_truncation.py")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "m.jsonl: line 2 is not a JSON object" in err


def test_out_never_replaces_an_input_or_an_existing_file(tmp_path, capsys):
    start = write_eval(tmp_path / "start.json", [0.1, 0.1], [False, False], [60, 80])
    metrics = write_metrics(tmp_path / "m.jsonl", [0.0])
    before = Path(metrics).read_bytes()
    script = load_script("plot_truncation")
    for out, extra, message in ((metrics, ["--overwrite"], "--out .*m.jsonl: name a .png, .pdf or .svg file"),
                                (start, [], "--out .*start.json: name a .png"),
                                (str(tmp_path / "old.png"), [], "old.png already exists; pass --overwrite")):
        (tmp_path / "old.png").write_bytes(b"old")
        with pytest.raises(SystemExit) as exit_info:
            script.run_script(script.main, ["--start", start, "--run", f"rl={metrics},{start}", "--out", out, *extra],
                              prog="plot_truncation.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and re.search(message, err), err
    assert Path(metrics).read_bytes() == before and (tmp_path / "old.png").read_bytes() == b"old"
    script.main(["--start", start, "--run", f"rl={metrics},{start}", "--out", str(tmp_path / "old.png"), "--overwrite"])
    assert (tmp_path / "old.png").read_bytes()[:4] == b"\x89PNG"
