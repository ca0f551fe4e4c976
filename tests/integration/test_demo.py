"""`rlft demo --quick` end to end on a tiny random model: evaluations, SFT, report and plots."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.recipes.demo import DemoConfig, run_demo
from tests.conftest import SHARED_DATA, make_tiny_model


@pytest.fixture
def tiny_model_dir(tmp_path, smol_tokenizer):
    path = tmp_path / "tiny"
    model = make_tiny_model(len(smol_tokenizer))
    model.generation_config.eos_token_id = smol_tokenizer.eos_token_id
    model.save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return path


def test_quick_demo_writes_report(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    real = SHARED_DATA / "countdown" / "train.parquet"
    cfg = DemoConfig(model=str(tiny_model_dir), runs_dir=str(tmp_path / "runs"), name="q", quick=True,
                     real_data=str(real) if real.is_file() else None, device="cpu")
    report = run_demo(cfg)
    run_dir = tmp_path / "runs" / "q"
    assert report == run_dir / "report.md"
    text = report.read_text()
    assert "| base | easy3 held-out | 8 |" in text and "| sft | easy3 held-out | 8 |" in text
    assert "standard (generated)" in text
    if real.is_file():
        assert "Countdown-Tasks-3to4 (real)" in text
    for png in ("scores.png", "sft_loss.png"):
        assert (run_dir / png).stat().st_size > 1000
    steps = [json.loads(line)["step"] for line in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    evals = sorted(p.name for p in (run_dir / "eval").glob("*.json"))
    assert "base--easy3.json" in evals and "sft--easy3.json" in evals

    # --resume reuses finished evaluations and the trained model instead of redoing them.
    mtimes = {p: p.stat().st_mtime_ns for p in (run_dir / "eval").glob("*.json")}
    run_demo(DemoConfig(**{**cfg.__dict__, "resume": True}))
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
