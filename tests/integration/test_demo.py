"""`rlft demo --quick` end to end on a tiny random model: evaluations, SFT, report and plots."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.recipes.demo import DemoConfig, run_demo
from tests.conftest import SHARED_DATA, make_tiny_model, save_model_dir, write_jsonl_rows


@pytest.fixture
def demo_model_dir(tmp_path, smol_tokenizer):
    """A fresh tiny model folder per test, its generation config stopping at SmolLM2's EOS."""
    model = make_tiny_model(len(smol_tokenizer))
    model.generation_config.eos_token_id = smol_tokenizer.eos_token_id
    return save_model_dir(tmp_path / "tiny", model, smol_tokenizer)


def test_quick_demo_writes_report(demo_model_dir, tmp_path):
    torch.set_num_threads(1)
    real = SHARED_DATA / "countdown" / "train.parquet"
    cfg = DemoConfig(model=str(demo_model_dir), runs_dir=str(tmp_path / "runs"), name="q", quick=True,
                     real_data=str(real) if real.is_file() else None, device="cpu")
    report = run_demo(cfg)
    run_dir = tmp_path / "runs" / "q"
    assert report == run_dir / "report.md"
    text = report.read_text()
    for model in ("base", "sft", "rloo"):
        assert f"\n| {model} | " in text, f"no {model} row in the results table"
    assert "pass@2 (T=1)" in text
    assert "standard (generated)" in text
    # A random model's samples all score 0, so every pair ties: DPO is skipped, and the report says why.
    assert "on-policy pairs: 8 prompts tried, 0 kept, 8 dropped as ties" in text
    assert "DPO skipped" in text and "\n| dpo | " not in text
    if real.is_file():
        assert "Countdown-Tasks-3to4 (real)" in text
    for png in ("scores.png", "loss_sft.png", "reward_mean.png"):
        assert (run_dir / png).stat().st_size > 1000
    steps = [json.loads(line)["step"] for line in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    evals = sorted(p.name for p in (run_dir / "eval").glob("*.json"))
    for model in ("base", "sft", "rloo"):
        assert f"{model}--easy3.json" in evals and f"{model}--passatk.json" in evals
    assert (run_dir / "rloo" / "model" / "config.json").is_file()
    assert not list(run_dir.glob("*/checkpoints")), "finished stages keep no checkpoints by default"

    # --resume reuses finished evaluations, models and the pairs file instead of redoing them; given
    # non-tied pairs (written here by hand), it trains and evaluates DPO.
    mtimes = {p: p.stat().st_mtime_ns for p in (run_dir / "eval").glob("*.json")}
    pairs = run_dir / "pairs" / "countdown.jsonl"
    rows = [{"prompt": f"User: Using the numbers [1, 2, {i}], make {i + 3}.\nAssistant: <think>", "chosen": f" 1+2=3, 3+{i}={i + 3}.</think>\n<answer>1 + 2 + {i}</answer>",
             "rejected": " no idea</think>\n<answer>1</answer>", "score_chosen": 1.0, "score_rejected": 0.1} for i in range(4)]
    write_jsonl_rows(pairs, rows)
    pairs.with_suffix(".stats.json").write_text(json.dumps({"prompts": 4, "kept": 4, "dropped_ties": 0}))
    run_demo(DemoConfig(**{**cfg.__dict__, "resume": True}))
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    text = report.read_text()
    assert "\n| dpo | " in text and "on-policy pairs: 4 prompts tried, 4 kept" in text
    assert (run_dir / "loss_dpo.png").is_file()
    assert "| rloo - sft | 8 |" in text and "| dpo - sft | 8 |" in text  # paired over the 8 quick held-out tasks

    # A cached evaluation of another size (here: a 3-task one) is not reused but evaluated again.
    path = run_dir / "eval" / "sft--easy3.json"
    small = json.loads(path.read_text())
    path.write_text(json.dumps({**small, "num_tasks": 3, "task_scores": small["task_scores"][:3]}))
    run_demo(DemoConfig(**{**cfg.__dict__, "resume": True}))
    again = json.loads(path.read_text())
    assert again["num_tasks"] == 8 and again["task_scores"] == small["task_scores"]
    assert (run_dir / "eval" / "sft--standard.json").stat().st_mtime_ns == mtimes[run_dir / "eval" / "sft--standard.json"]
