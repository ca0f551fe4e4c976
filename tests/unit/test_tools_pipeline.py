"""scripts/studies/tools_pipeline.py: a study folder's rows by hand (FLOPs summed, scores by size, RL - SFT paired),
the table and PNG, and its one-line refusals."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rlft.lab.script_io import ScriptError
from tests.conftest import load_script

tp = load_script("tools_pipeline")
TASKS = [{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3], "target": 5}, {"nums": [1, 2, 3, 4], "target": 24},
         {"nums": [2, 3, 4, 5], "target": 7}]


def _eval(path: Path, scores: list[float], tasks: list[dict] = TASKS) -> None:
    n = len(scores)
    path.write_text(json.dumps({
        "num_tasks": n, "k": 1, "mode": "greedy", "mean_score": sum(scores) / n, "accuracy": 0.0, "format_rate": 1.0,
        "pass_at_k": {"1": 0.0}, "mean_completion_tokens": 1.0, "truncated_rate": 0.0,
        "task_scores": [[s] for s in scores], "tasks": tasks, "task_truncated": [[False]] * n,
        "task_tokens": [[1]] * n, "task_values": [[None]] * n, "task_certainty": [[None]] * n}))


def _metrics(path: Path, flops: list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": i + 1, "flops/estimated": f}) + "\n" for i, f in enumerate(flops)))


@pytest.fixture
def study(tmp_path):
    for arm, sft, rl in (("patient", [0.1, 0.0, 0.0, 0.0], [1.0, 0.1, 0.0, 0.1]),
                         ("calc", [1.0, 0.1, 0.1, 0.0], [1.0, 1.0, 1.0, 0.1])):
        _metrics(tmp_path / f"sft_{arm}_s0" / "metrics.jsonl", [1e12, 2e12])
        _metrics(tmp_path / f"rl_{arm}_s0" / "metrics.jsonl", [5e11, 1e12, 1.5e12])
        _eval(tmp_path / f"{arm}_s0_test.json", sft)
        _eval(tmp_path / f"rl_{arm}_s0_test.json", rl)
    return tmp_path


def test_row_by_hand(study):
    row = tp.arm_row(tp.files(study, "calc", 0))
    assert row["sft_flops"] == 2e12 and row["flops"] == pytest.approx(3.5e12) and row["rl_steps"] == 3
    assert row["sft_all"][0] == pytest.approx(0.3) and row["rl_4"][0] == pytest.approx(0.55)
    assert row["rl_3"] == (pytest.approx(1.0), pytest.approx(0.0))  # both solved: no spread
    gain = row["gain_4"]  # 4 numbers: (1.0 - 0.1) and (0.1 - 0.0) -> mean 0.5
    assert gain["diff"] == pytest.approx(0.5) and gain["ci_low"] < 0.5 < gain["ci_high"]
    assert row["gain_all"]["diff"] == pytest.approx((0.0 + 0.9 + 0.9 + 0.1) / 4)


def test_main_writes_the_table_and_png_and_refuses_bad_input(study, tmp_path, capsys):
    md, png = tmp_path / "out" / "t.md", tmp_path / "out" / "t.png"
    tp.main(["--study", str(study), "--markdown", str(md), "--out", str(png)])
    text = md.read_text()
    assert "| calc | 0 | 2e+12 | 3.5e+12 | 3 | 0.300 / 0.550 / 0.050 | 0.775 / 1.000 / 0.550 |" in text
    assert png.stat().st_size > 0
    with pytest.raises(SystemExit) as exit_:
        tp.run_script(tp.main, ["--study", str(study), "--markdown", str(md), "--out", str(png)], prog="t")
    assert exit_.value.code == 2 and "already exists" in capsys.readouterr().err
    _eval(study / "rl_calc_s0_test.json", [1.0, 1.0, 1.0, 0.1], tasks=TASKS[::-1])
    with pytest.raises(ScriptError, match="different tasks"):
        tp.main(["--study", str(study), "--markdown", str(md), "--out", str(png), "--overwrite"])
    with pytest.raises(ScriptError, match="no seed"):
        tp.main(["--study", str(tmp_path / "out"), "--markdown", str(md), "--out", str(png), "--overwrite"])


def test_the_archive_layout_is_read_too(study, tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    for arm in tp.ARMS:
        for key, path in tp.files(study, arm, 0).items():
            name = {"sft_metrics": f"sft_{arm}_s0_metrics.jsonl", "rl_metrics": f"rl_{arm}_s0_metrics.jsonl",
                    "sft_eval": f"{arm}_s0_test.json.gz", "rl_eval": f"rl_{arm}_s0_test.json.gz"}[key]
            data = path.read_bytes()
            (archive / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    assert tp.arm_row(tp.files(archive, "calc", 0)) == tp.arm_row(tp.files(study, "calc", 0))
