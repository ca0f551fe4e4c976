"""scripts/plot_curriculum.py: the SEC bucket curves read from metrics records, the PNG, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def plot():
    return load_script("plot_curriculum")


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_bucket_curves_follow_steps_per_bucket(plot):
    records = [{"step": 1, "curriculum/p_n3_a": 0.5, "curriculum/p_n4_a": 0.5, "loss": 1.0},
               {"step": 2, "curriculum/p_n3_a": 0.7, "curriculum/p_n4_a": 0.3},
               {"step": 3, "loss": 0.5}]  # a record without the bandit's keys adds no point
    assert plot.bucket_curves(records) == {"n3_a": ([1, 2], [0.5, 0.7]), "n4_a": ([1, 2], [0.5, 0.3])}


def test_main_writes_the_png(plot, tmp_path):
    sec = _write(tmp_path / "sec.jsonl", [{"step": s, "curriculum/p_n3_a": 0.4 + s / 10, "curriculum/p_n4_a": 0.6 - s / 10,
                                           "completion/truncated_frac": s / 20} for s in (1, 2, 3)])
    uniform = _write(tmp_path / "uni.jsonl", [{"step": s, "completion/truncated_frac": s / 10} for s in (1, 2, 3)])
    out = tmp_path / "plots" / "c.png"
    plot.main(["--sec", str(sec), "--uniform", str(uniform), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_name_the_file(plot, tmp_path):
    uniform = _write(tmp_path / "uni.jsonl", [{"step": 1, "completion/truncated_frac": 0.0}])
    with pytest.raises(SystemExit, match="uni.jsonl has no curriculum"):
        plot.main(["--sec", str(uniform), "--uniform", str(uniform), "--out", str(tmp_path / "x.png")])
    with pytest.raises(SystemExit, match="missing.jsonl does not exist"):
        plot.main(["--sec", str(tmp_path / "missing.jsonl"), "--uniform", str(uniform), "--out", str(tmp_path / "x.png")])
