"""bench/reuse_cost.py: the step-cost arithmetic by hand, and --quick on the CPU (sampling and an update run on the
synthetic workload, the EOS bias keeps completions short, and the reported costs follow from the medians)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import run_quick_bench

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "reuse_cost.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("reuse_cost_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_costs_by_hand():
    # sampling 6 s, an update pass 2 s, 64 samples a step: r=1 8 s; r=2 10 s (1.25x); r=4 14 s (1.75x)
    costs = load_bench().step_costs(6.0, 2.0, samples=64)
    assert [c["r"] for c in costs] == [1, 2, 4]
    assert [c["step_s"] for c in costs] == [8.0, 10.0, 14.0]
    assert [c["vs_on_policy"] for c in costs] == pytest.approx([1.0, 1.25, 1.75])
    assert [c["samples_per_s"] for c in costs] == pytest.approx([8.0, 6.4, 64 / 14])


def test_quick_run_samples_and_updates(tmp_path):
    report = run_quick_bench(SCRIPT, tmp_path)
    assert len(report["rounds"]) == 3  # a warm-up round and two timed ones
    for r in report["rounds"]:
        assert r["sample_s"] > 0 and r["update_s"] > 0
        assert r["tokens"] == round(r["mean_length"] * 8) and r["at_limit"] < 0.5  # 2 prompts x k=4, <= 16 tokens
    timed = report["rounds"][1:]
    assert report["sample_s"] == pytest.approx(sum(r["sample_s"] for r in timed) / 2)  # median of two
    assert [c["step_s"] for c in report["costs"]] == pytest.approx(
        [report["sample_s"] + r * report["update_s"] for r in (1, 2, 4)])
    assert "decoder refill" in report["stdout"]  # the CPU's sampling decoder at T=1
