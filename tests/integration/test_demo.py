"""`rlft demo --quick` end to end on a tiny random model: evaluations, SFT, RL, report and plots."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.recipes.demo import DemoConfig, run_demo
from rlft.validation import OptionError
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
    cfg = DemoConfig(model=str(demo_model_dir), output_dir=str(tmp_path / "runs" / "q"), quick=True,
                     real_data=str(real) if real.is_file() else None, device="cpu", give_up=0.3, max_tries=4)
    report = run_demo(cfg)
    run_dir = tmp_path / "runs" / "q"
    assert report == run_dir / "report.md"
    text = report.read_text()
    for model in ("base", "sft", "rl"):
        assert f"\n| {model} | " in text, f"no {model} row in the results table"
    assert "| sampled score | pass@1 | pass@2 |" in text and "temperature 0.6, top-p 0.95" in text
    assert "standard (generated)" in text
    # The paired table (each model against the SFT start) and the samples-vs-score plot of the RL run.
    assert "## Paired against the SFT start" in text
    assert "| base - sft | 8 |" in text and "| rl - sft | 8 |" in text
    assert "![samples vs score](samples_vs_score.png)" in text
    assert (run_dir / "samples_vs_score.png").stat().st_size > 1000
    rl_evals = [r for r in map(json.loads, (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()) if "eval/score" in r]
    assert [(r["step"], r["samples/total"] > 0) for r in rl_evals] == [(1, True), (2, True)]  # no step-0 evaluation:
    assert "(SFT, 0 samples) -> " in text  # the curve starts from the SFT model's score on the same tasks
    # A random model's samples all score 0, so every pair ties: DPO is skipped, and the report says why.
    assert "on-policy pairs: 8 prompts tried, 0 kept, 8 dropped as ties" in text
    assert "DPO skipped" in text and "\n| dpo | " not in text
    if real.is_file():
        assert "Countdown-Tasks-3to4 (real), 3 numbers" in text and "Countdown-Tasks-3to4 (real), 4 numbers" in text
    for png in ("scores.png", "loss_sft.png", "reward_mean.png"):
        assert (run_dir / png).stat().st_size > 1000
    steps = [json.loads(line)["step"] for line in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    sft_config = (run_dir / "sft" / "config.yaml").read_text()  # the bounded-trace options reach the SFT stage
    assert "give_up: 0.3\n" in sft_config and "max_tries: 4\n" in sft_config
    evals = sorted(p.name for p in (run_dir / "eval").glob("*.json"))
    for model in ("sft", "rl"):
        assert f"{model}--medium3-held-out.json" in evals and f"{model}--sampled.json" in evals
    assert [e for e in evals if e.startswith("base--")] == ["base--medium3-held-out.json"]  # the base model: greedy held-out only
    assert "\n| base - sft | 8 |" in text and text.split("\n| base | ")[1].split("\n")[0].endswith("| - | - | - |")
    assert (run_dir / "rl" / "model" / "config.json").is_file() and (run_dir / "rl" / "adapter").is_dir()  # LoRA: adapter + merged model
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
    assert "| rl - sft | 8 |" in text and "| dpo - sft | 8 |" in text  # paired over the 8 quick held-out tasks

    # A cached evaluation of another size (here: a 3-task one) is not reused but evaluated again.
    path = run_dir / "eval" / "sft--medium3-held-out.json"
    small = json.loads(path.read_text())
    path.write_text(json.dumps({**small, "num_tasks": 3, "task_scores": small["task_scores"][:3]}))
    run_demo(DemoConfig(**{**cfg.__dict__, "resume": True}))
    again = json.loads(path.read_text())
    assert again["num_tasks"] == 8 and again["task_scores"] == small["task_scores"]
    standard = run_dir / "eval" / "sft--standard-generated.json"
    assert standard.stat().st_mtime_ns == mtimes[standard]


def test_demo_defaults_are_the_medium3_setting():
    """The defaults: medium3 with 1000 held-out tasks, the RL loop's GRPO + filtering + LoRA recipe at lr 2e-4, DPO
    (no NLL term) with LoRA; a stage is skipped with 0."""
    cfg = DemoConfig()
    assert (cfg.preset, cfg.heldout_size, cfg.prompt_template, cfg.trace_style, cfg.num_train) == ("medium3", 1000, "short", "direct", 3000)
    assert (cfg.rl_advantage, cfg.rl_loss, cfg.rl_loss_mode, cfg.rl_filter_groups, cfg.rl_lora_r) == ("grpo", "ppo", "seq_mean", True, 16)
    assert cfg.rl_lr == 2e-4
    assert (cfg.dpo_loss_type, cfg.dpo_lora_r, cfg.pairs_samples) == ("dpo", 16, 2)
    assert (cfg.eval_limit, cfg.passk_limit, cfg.passk, cfg.passk_temperature, cfg.passk_top_p) == (200, 100, 4, 0.6, 0.95)
    DemoConfig(rl_steps=0, pairs_prompts=0)  # skips RL, and pairs + DPO
    with pytest.raises(OptionError, match="--eval-limit"):
        DemoConfig(eval_limit=2000)
    assert DemoConfig().update_micro_batch_size == 32
    DemoConfig(update_micro_batch_size=8)  # divides the DPO batch of 32
    with pytest.raises(OptionError, match="--update-micro-batch-size"):
        DemoConfig(update_micro_batch_size=5)
