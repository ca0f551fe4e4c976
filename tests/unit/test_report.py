"""rlft.eval.report: the samples-vs-score plot shared by the demo and scripts/countdown_ablation.py."""

from __future__ import annotations

from unittest import mock

import pytest

from rlft.eval import report


def _lines(runs, tmp_path, **kwargs):
    """The (x, y) data of every line plot_samples_vs_score draws, read back from matplotlib."""
    drawn = []
    real_plot = report.plt.Axes.plot

    def spy(ax, xs, ys, *args, **kw):
        drawn.append((list(xs), list(ys), kw.get("label")))
        return real_plot(ax, xs, ys, *args, **kw)

    with mock.patch.object(report.plt.Axes, "plot", spy):
        path = report.plot_samples_vs_score(runs, tmp_path / "svs.png", **kwargs)
    return path, drawn


def test_samples_vs_score_starts_at_the_sft_score_unless_the_run_has_its_own_point(tmp_path):
    with_start = [{"step": 0, "samples/total": 0, "eval/score": 0.38}, {"step": 1, "samples/total": 128},
                  {"step": 5, "samples/total": 640, "eval/score": 0.41}]
    without = [{"step": 10, "samples/total": 1280, "eval/score": 0.40},
               {"step": 20, "samples/total": 2560, "eval/score": 0.42}]
    path, drawn = _lines({"a": with_start, "b": without}, tmp_path, start=0.37)
    assert path == tmp_path / "svs.png" and path.stat().st_size > 1000
    assert drawn == [([0, 640], [0.38, 0.41], "a"), ([0, 1280, 2560], [0.37, 0.40, 0.42], "b")]
    _, drawn = _lines({"b": without}, tmp_path)  # no start given: the run's own points only
    assert drawn == [([1280, 2560], [0.40, 0.42], "b")]


def test_samples_vs_score_without_evaluations_draws_nothing(tmp_path):
    assert report.plot_samples_vs_score({"a": [{"step": 1, "samples/total": 64}], "b": []}, tmp_path / "x.png",
                                        start=0.4) is None
    assert not (tmp_path / "x.png").exists()


def test_paired_vs_samples_spreads_only_the_points_that_share_an_x(tmp_path):
    """Error bars at (x, diff) with their intervals as distances from the point; two points at x = 200 move 1% of the
    span (200) apart, the point alone at x = 100 stays; nothing to draw: None and no file."""
    drawn = []

    def spy(xs, ys, **kw):
        drawn.append((kw["label"], list(xs), list(ys), kw["yerr"]))

    with mock.patch("matplotlib.axes.Axes.errorbar", side_effect=spy):
        path = report.plot_paired_vs_samples({"a": [(100, 0.02, -0.01, 0.05), (200, 0.03, 0.0, 0.06)],
                                              "b": [(200, -0.01, -0.04, 0.02)]}, tmp_path / "p.png",
                                             title="t", xlabel="x", ylabel="y", hlines=((0.0, "reference", "--"),))
    assert path == tmp_path / "p.png" and path.stat().st_size > 1000
    assert drawn[0][:3] == ("a", [100, 199.0], [0.02, 0.03]) and drawn[1][:3] == ("b", [201.0], [-0.01])
    assert drawn[0][3] == [[pytest.approx(0.03), pytest.approx(0.03)], [pytest.approx(0.03), pytest.approx(0.03)]]
    assert report.plot_paired_vs_samples({"a": []}, tmp_path / "none.png", title="t", xlabel="x", ylabel="y") is None
    assert not (tmp_path / "none.png").exists()
