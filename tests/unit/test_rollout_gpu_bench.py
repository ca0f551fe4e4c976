"""bench/rollout_gpu.py --quick on the CPU: every candidate decodes the synthetic workload, and the EOS bias gives
the roughly geometric lengths it claims (rate 0.1, at most 16 tokens: mean (1 - 0.9^16) / 0.1 = 8.1)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_quick_bench

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "rollout_gpu.py"


def test_quick_run_decodes_with_every_candidate_and_biased_eos(tmp_path):
    report = run_quick_bench(SCRIPT, tmp_path)
    results = {r["candidate"]: r for r in report["results"]}
    assert sorted(results) == ["cb", "drop", "refill", "static"]
    for name, r in results.items():
        assert "failed" not in r, (name, r)
        assert r["tokens"] == round(r["mean_length"] * 16) and r["tokens_per_s"] > 0  # 4 prompts x k=4
        assert 4 <= r["mean_length"] <= 13 and r["at_limit"] < 0.5, (name, r)  # without the bias: all 16 tokens
