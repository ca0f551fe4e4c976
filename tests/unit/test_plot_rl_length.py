"""scripts/studies/plot_rl_length.py on hand-built files: the table's paired gain computed by hand, the PNG written,
and the refusals (one line, exit 2) naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlft.eval.countdown import summarize
from rlft.lab.script_io import ScriptError
from tests.conftest import load_script

TASKS = [{"nums": [1, 2, 3], "target": 6}, {"nums": [4, 5, 6, 7], "target": 22}]


def write_eval(path: Path, scores: list[float], tasks=TASKS) -> str:
    result = summarize("greedy", task_scores=[[s] for s in scores], tasks=tasks, task_truncated=[[False]] * 2,
                       task_tokens=[[50]] * 2, task_values=[[None]] * 2, task_certainty=[[None]] * 2)
    path.write_text(json.dumps(result.to_dict()))
    return str(path)


def write_metrics(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


RECORDS = [{"step": 1, "samples/total": 32, "flops/estimated": 1e12, "eval/score": 0.5},
           {"step": 2, "samples/total": 64, "flops/estimated": 2e12}]


def test_table_and_plot(tmp_path, capsys):
    start = write_eval(tmp_path / "start.json", [0.1, 0.1])
    run = f"rl={write_metrics(tmp_path / 'm.jsonl', RECORDS)},{write_eval(tmp_path / 'rl.json', [1.0, 0.0])}"
    load_script("plot_rl_length").main(["--start", start, "--run", run, "--out", str(tmp_path / "g.png")])
    out = capsys.readouterr().out
    # per task d = 0.9, -0.1: mean 0.4, sd sqrt(0.5), half-width 1.96 * sqrt(0.5) / sqrt(2) = 0.980
    assert "| start | 0 | - | 0.100 | - |" in out
    assert "| rl | 64 | 2.00e+12 | 0.500 | +0.400 [-0.580, +1.380] (1 / 1) |" in out
    assert (tmp_path / "g.png").stat().st_size > 1000


def test_refusals_name_the_file(tmp_path):
    start = write_eval(tmp_path / "start.json", [0.1, 0.1])
    other = write_eval(tmp_path / "o.json", [0.1, 0.1], tasks=TASKS[::-1])
    metrics = write_metrics(tmp_path / "m.jsonl", RECORDS)
    script = load_script("plot_rl_length")
    with pytest.raises(ScriptError, match="o.json: other tasks"):
        script.main(["--start", start, "--run", f"rl={metrics},{other}", "--out", str(tmp_path / "g.png")])
    with pytest.raises(ScriptError, match="expected LABEL=METRICS.jsonl,EVAL.json"):
        script.main(["--start", start, "--run", f"rl={metrics}", "--out", str(tmp_path / "g.png")])
    sft = write_metrics(tmp_path / "sft.jsonl", [{"step": 1, "loss": 1.0}])
    with pytest.raises(ScriptError, match="sft.jsonl: no step records with samples/total"):
        script.main(["--start", start, "--run", f"rl={sft},{start}", "--out", str(tmp_path / "g.png")])
    with pytest.raises(ScriptError, match="does not exist"):
        script.main([
            "--start", start, "--run", f"rl={tmp_path / 'none.jsonl'},{start}", "--out",
            str(tmp_path / "g.png")
        ])
    with pytest.raises(ScriptError):  # the PNG never replaces an input
        script.main(["--start", start, "--run", f"rl={metrics},{start}", "--out", start])
