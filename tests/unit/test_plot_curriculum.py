"""scripts/studies/plot_curriculum.py: the SEC bucket curves read from metrics records, the PNG, its errors (one line,
exit 2), a last metrics line cut short by a kill, and an --out that never replaces an input or an existing file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlft.lab.script_io import ScriptError
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
    sec = _write(tmp_path / "sec.jsonl", [{
        "step": s, "curriculum/p_n3_a": 0.4 + s / 10, "curriculum/p_n4_a": 0.6 - s / 10,
        "completion/truncated_frac": s / 20
    } for s in (1, 2, 3)])
    uniform = _write(tmp_path / "uni.jsonl", [{"step": s, "completion/truncated_frac": s / 10} for s in (1, 2, 3)])
    out = tmp_path / "plots" / "c.png"
    plot.main(["--sec", str(sec), "--uniform", str(uniform), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_name_the_file(plot, tmp_path):
    uniform = _write(tmp_path / "uni.jsonl", [{"step": 1, "completion/truncated_frac": 0.0}])
    with pytest.raises(ScriptError, match="uni.jsonl has no curriculum"):
        plot.main(["--sec", str(uniform), "--uniform", str(uniform), "--out", str(tmp_path / "x.png")])
    with pytest.raises(ValueError, match="missing.jsonl: no such file"):
        plot.main([
            "--sec",
            str(tmp_path / "missing.jsonl"), "--uniform",
            str(uniform), "--out",
            str(tmp_path / "x.png")
        ])


def test_a_last_line_cut_short_is_left_out_and_out_is_checked(plot, tmp_path, capsys):
    """The SEC run was killed mid-write: its half line is left out (a note), not a JSONDecodeError traceback. --out
    naming an input is refused even with --overwrite; an existing --out needs --overwrite."""
    sec = _write(tmp_path / "sec.jsonl",
                 [{"step": s, "curriculum/p_n3_a": 0.5, "completion/truncated_frac": 0.1} for s in (1, 2)])
    sec.write_text(sec.read_text() + '{"step": 3, "curriculum/p_n3')
    uniform = _write(tmp_path / "uni.jsonl", [{"step": 1, "completion/truncated_frac": 0.0}])
    assert [r["step"] for r in plot.load(sec)] == [1, 2]
    plot.main(["--sec", str(sec), "--uniform", str(uniform), "--out", str(tmp_path / "c.png")])
    assert "sec.jsonl: line 3 is cut short" in capsys.readouterr().err
    before = uniform.read_bytes()
    for out, extra, message in ((uniform, ["--overwrite"], "--out .*uni.jsonl: name a .png, .pdf or .svg file"),
                                (tmp_path / "c.png", [], "c.png already exists; pass --overwrite")):
        with pytest.raises(SystemExit) as exit_info:
            plot.run_script(plot.main,
                            ["--sec", str(sec), "--uniform",
                             str(uniform), "--out",
                             str(out), *extra], prog="plot_curriculum.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and re.search(message, err), err
    assert uniform.read_bytes() == before
