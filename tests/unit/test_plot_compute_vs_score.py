"""scripts/studies/plot_compute_vs_score.py: the unpaired 95% interval of an archived evaluation (by hand), and one-line
errors (exit 2) for a missing or damaged archived file."""

from __future__ import annotations

import json

import pytest

from rlft.lab.script_io import run_script
from tests.conftest import load_script


@pytest.fixture(scope="module")
def plot():
    return load_script("plot_compute_vs_score")


def test_mean_ci_by_hand(plot, tmp_path):
    # scores 1, 0, 0.1, 1: mean 0.525; deviations 0.475, -0.525, -0.425, 0.475, squares 0.225625 + 0.275625 + 0.180625
    # + 0.225625 = 0.9075, / 3 = 0.3025, sd 0.55, half 1.959964 * 0.55 / 2 = 0.538990
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"task_scores": [[1.0], [0.0], [0.1], [1.0]]}))
    mean, half = plot.mean_ci(path)
    assert mean == pytest.approx(0.525) and half == pytest.approx(0.538990, abs=1e-6)


@pytest.mark.parametrize("content, message", [(None, "no such file"), ("{oops", "not JSON"), ("[]", "no task_scores")])
def test_bad_archived_files_are_one_line_exit_2(plot, tmp_path, capsys, content, message):
    path = tmp_path / "e.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        plot.mean_ci(path)
    with pytest.raises(SystemExit) as e:  # the whole script on a folder without the archive
        run_script(plot.main,
                   ["--data", str(tmp_path), "--out", str(tmp_path / "p.png")], prog="plot_compute_vs_score.py")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("plot_compute_vs_score.py: error: ") and len(
        err.strip().splitlines()) == 1
    assert "does not exist" in err and not (tmp_path / "p.png").exists()
