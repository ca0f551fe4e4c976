"""rlft.eval.report: the samples-vs-score plot shared by the demo and scripts/countdown_ablation.py."""

from __future__ import annotations

from unittest import mock

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
    without = [{"step": 10, "samples/total": 1280, "eval/score": 0.40}, {"step": 20, "samples/total": 2560, "eval/score": 0.42}]
    path, drawn = _lines({"a": with_start, "b": without}, tmp_path, start=0.37)
    assert path == tmp_path / "svs.png" and path.stat().st_size > 1000
    assert drawn == [([0, 640], [0.38, 0.41], "a"), ([0, 1280, 2560], [0.37, 0.40, 0.42], "b")]
    _, drawn = _lines({"b": without}, tmp_path)  # no start given: the run's own points only
    assert drawn == [([1280, 2560], [0.40, 0.42], "b")]


def test_samples_vs_score_without_evaluations_draws_nothing(tmp_path):
    assert report.plot_samples_vs_score({"a": [{"step": 1, "samples/total": 64}], "b": []}, tmp_path / "x.png", start=0.4) is None
    assert not (tmp_path / "x.png").exists()
