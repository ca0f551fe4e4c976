"""Experiment tracking (``--report-to``): the TensorBoard event file holds exactly the metrics.jsonl scalars."""

from __future__ import annotations

import json
import sys

import pytest

from rlft.checkpoint import MetricsLog
from rlft.tracking import attach_tracker, open_tracker, scalars


def read_events(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_keeps_numbers_only():
    step, values = scalars({
        "step": 3, "loss/sft": 1.5, "tokens": 7, "flag": True, "name": "x", "lst": [1], "none": None
    })
    assert step == 3 and values == {"loss/sft": 1.5, "tokens": 7.0}


def test_tensorboard_gets_every_metrics_record(tmp_path):
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    tracker = attach_tracker(metrics, "tensorboard", tmp_path, {"lr": 0.1})
    records = [{"step": s, "epoch": s / 4, "loss/sft": 2.0 / s, "lr": 1e-3 * s, "tokens": 100 * s} for s in (1, 2, 3)]
    records[-1]["eval/accuracy"] = 0.75
    for r in records:
        metrics.log(r)
    tracker.close()
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == records
    events = read_events(tmp_path / "tensorboard")
    assert set(events) == {"epoch", "loss/sft", "lr", "tokens", "eval/accuracy"}
    for name in ("epoch", "loss/sft", "lr", "tokens"):
        assert [s for s, _ in events[name]] == [1, 2, 3]
        assert [v for _, v in events[name]] == pytest.approx([r[name] for r in records], rel=1e-6)  # stored as float32
    assert events["eval/accuracy"] == [(3, 0.75)]


def test_none_and_unknown_and_missing_packages(tmp_path, monkeypatch):
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    assert attach_tracker(metrics, "none", tmp_path) is None and metrics.sink is None
    with pytest.raises(ValueError, match="unknown --report-to"):
        open_tracker("mlflow", tmp_path)
    for name in ("wandb", "trackio"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails even where the package is installed
        with pytest.raises(ImportError, match=rf"pip install 'rlft\[{name}\]'"):
            open_tracker(name, tmp_path)


def test_wandb_style_module_gets_steps_and_config(tmp_path, monkeypatch):
    import types

    calls = []
    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)) or "run",
                                 log=lambda values, step=None: calls.append(("log", values, step)),
                                 finish=lambda: calls.append(("finish",)))
    monkeypatch.setitem(sys.modules, "trackio", fake)
    metrics = MetricsLog(tmp_path / "run" / "metrics.jsonl")
    tracker = attach_tracker(metrics, "trackio", tmp_path / "run", {"lr": 0.5})
    metrics.log({"step": 2, "loss": 0.25, "note": "skip"})
    tracker.close()
    assert calls[0] == ("init", {"project": "rlft", "name": "run", "config": {"lr": 0.5}})
    assert calls[1:] == [("log", {"loss": 0.25}, 2), ("finish",)]


def test_sft_recipe_reports_to_tensorboard(tiny_model_dir, tmp_path):
    from tests.unit.test_sft_recipe import make_cfg

    from rlft.recipes.sft import train_sft

    train_sft(make_cfg(tiny_model_dir, tmp_path / "run", max_steps=2, save_every=0, report_to="tensorboard"))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    events = read_events(tmp_path / "run" / "tensorboard")
    assert set(events) == {k for k in records[0] if k != "step"}
    assert [s for s, _ in events["loss/sft"]] == [1, 2]
    assert [v for _, v in events["loss/sft"]] == pytest.approx([r["loss/sft"] for r in records], rel=1e-6)
