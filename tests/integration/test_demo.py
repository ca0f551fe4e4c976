"""`rlft demo --quick` end to end on a tiny random model: rows, evaluations by count of numbers, SFT, filtered SFT,
RL and pairs from it, best-of-N selection, the report (each stage paired against its start) and its plots, and
--resume."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.checkpoint import checkpoint_folders
from rlft.lab.demo import DemoConfig, run_demo
from rlft.tasks.countdown.splits import load_split
from rlft.validation import OptionError
from tests.conftest import make_tiny_model, save_model_dir, write_jsonl_rows


@pytest.fixture
def demo_model_dir(tmp_path, smol_tokenizer):
    """A fresh tiny model folder per test, its generation config stopping at SmolLM2's EOS."""
    model = make_tiny_model(len(smol_tokenizer))
    model.generation_config.eos_token_id = smol_tokenizer.eos_token_id
    return save_model_dir(tmp_path / "tiny", model, smol_tokenizer)


def test_quick_demo_writes_report(demo_model_dir, tmp_path):
    torch.set_num_threads(1)
    cfg = DemoConfig(model=str(demo_model_dir), output_dir=str(tmp_path / "runs" / "q"), quick=True, rows=None,
                     device="cpu", give_up=0.3, max_tries=4, passk=2)
    report = run_demo(cfg)
    run_dir = tmp_path / "runs" / "q"
    assert report == run_dir / "report.md"
    text = report.read_text()
    # no rows given: a generated stand-in, written to the run folder, split like the real rows
    rows = run_dir / "data" / "rows.jsonl"
    split = load_split(str(rows))
    assert "a generated stand-in for Countdown-Tasks-3to4 (2,400" in text and len(split.test) == 500
    for model in ("base", "sft", "filtered", "rl"):
        assert f"\n| {model} | " in text, f"no {model} row in the results table"
    assert "| score, 3 numbers | score, 4 numbers |" in text and "| sampled score | pass@1 | pass@2 |" in text
    # each stage against its own start, and RL against SFT (the pipeline's gain), in that order
    assert "## Paired: each stage against its start" in text
    paired = [
        line.split(" |")[0] for line in text.splitlines() if line.startswith("| ") and " - " in line.split(" |")[0]
    ]
    assert paired == ["| filtered - sft", "| rl - filtered", "| rl - sft"]
    assert "| base - sft |" not in text  # base is not trained from SFT: no paired row
    # filtered SFT continues from the SFT model on the correct traces only; RL starts from its model
    filtered_config = (run_dir / "filtered" / "config.yaml").read_text()
    assert "correct_only: true\n" in filtered_config and f"model: {run_dir / 'sft' / 'model'}\n" in filtered_config
    assert f"model: {run_dir / 'filtered' / 'model'}\n" in (run_dir / "rl" / "config.yaml").read_text()
    assert [json.loads(x)["step"] for x in (run_dir / "filtered" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert "(n=8)" in text  # the 8 quick test rows
    # best-of-N over the sampled evaluation's 2 samples, for the sampled models only
    for label in ("majority@2", "self-certainty@2", "self-certainty vote@2", "oracle@2 = pass@2 (upper bound)"):
        assert f"| sft | {label} |" in text and f"| rl | {label} |" in text
    assert "| base | majority" not in text
    assert "![samples vs score](samples_vs_score.png)" in text and (run_dir /
                                                                    "samples_vs_score.png").stat().st_size > 1000
    rl_evals = [
        r for r in map(json.loads, (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()) if "eval/score" in r
    ]
    assert [r["step"] for r in rl_evals] == [0, 1, 2]  # validation rows, from the SFT start on
    # A random model's samples all score 0, so every pair ties: DPO is skipped, and the report says why.
    assert "on-policy pairs: 8 prompts (the last training rows), 0 kept, 8 dropped as ties" in text
    assert "DPO skipped" in text and "\n| dpo | " not in text
    for png in ("scores.png", "sft_loss_sft.png", "filtered_sft_loss_sft.png", "rl_reward_mean.png"):
        assert (run_dir / png).stat().st_size > 1000
    assert "](filtered_sft_loss_sft.png)" in text  # the report links the curve by its file name
    steps = [json.loads(line)["step"] for line in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    sft_config = (run_dir / "sft" /
                  "config.yaml").read_text()  # the bounded-trace options and the held-out rows reach SFT
    assert "give_up: 0.3\n" in sft_config and "max_tries: 4\n" in sft_config and f"heldout_data: {rows}" in sft_config
    evals = sorted(p.name for p in (run_dir / "eval").glob("*.json"))
    assert evals == ["base--greedy.json", "filtered--greedy.json", "filtered--sampled.json", "rl--greedy.json",
                     "rl--sampled.json", "sft--greedy.json", "sft--sampled.json"]
    greedy = json.loads((run_dir / "eval" / "sft--greedy.json").read_text())
    test_keys = [(sorted(t.nums), t.target) for t in split.test[:8]]
    assert [(sorted(t["nums"]), t["target"]) for t in greedy["tasks"]] == test_keys  # the held-out test rows
    assert set(greedy["by_size"]) == {"3", "4", "all"}
    assert (run_dir / "rl" / "model" / "config.json").is_file() and (run_dir / "rl" /
                                                                     "adapter").is_dir()  # LoRA: adapter + merged model
    assert not list(run_dir.glob("*/checkpoints")), "finished stages keep no checkpoints by default"

    # --resume reuses finished evaluations, models and the pairs file instead of redoing them; given
    # non-tied pairs (written here by hand), it trains and evaluates DPO.
    mtimes = {p: p.stat().st_mtime_ns for p in (run_dir / "eval").glob("*.json")}
    pairs = run_dir / "pairs" / "countdown.jsonl"
    hand = [{
        "prompt": f"User: Using the numbers [1, 2, {i}], make {i + 3}.\nAssistant: <think>",
        "chosen": f" 1+2=3, 3+{i}={i + 3}.</think>\n<answer>1 + 2 + {i}</answer>",
        "rejected": " no idea</think>\n<answer>1</answer>", "score_chosen": 1.0, "score_rejected": 0.1
    } for i in range(4)]
    write_jsonl_rows(pairs, hand)
    pairs.with_suffix(".stats.json").write_text(json.dumps({"prompts": 4, "kept": 4, "dropped_ties": 0}))
    run_demo(DemoConfig(**{**cfg.__dict__, "resume": True}))
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    text = report.read_text()
    assert "\n| dpo | " in text and "on-policy pairs: 4 prompts (the last training rows), 4 kept" in text
    assert (run_dir / "dpo_loss_dpo.png").is_file() and "| dpo - filtered | " in text and "| dpo - sft | " in text

    # A cached evaluation of another size (here: a 3-task one) is not reused but evaluated again.
    path = run_dir / "eval" / "sft--greedy.json"
    small = json.loads(path.read_text())
    path.write_text(json.dumps({**small, "num_tasks": 3, "task_scores": small["task_scores"][:3]}))
    run_demo(DemoConfig(**{**cfg.__dict__, "resume": True}))
    again = json.loads(path.read_text())
    assert again["num_tasks"] == 8 and again["task_scores"] == small["task_scores"]
    sampled = run_dir / "eval" / "sft--sampled.json"
    assert sampled.stat().st_mtime_ns == mtimes[sampled]


def test_demo_defaults_are_the_countdown_real_setting():
    """The defaults: bounded standard-preset traces, the real rows that ship with rlft, 256 tokens; the RL loop's GRPO +
    filtering + LoRA recipe at lr 2e-4; RPO at beta 0.5 with LoRA; 80 SFT steps then 40 filtered ones; the sampled
    evaluation (pass@k and best-of-N) only when asked for; a stage is skipped with 0."""
    cfg = DemoConfig()
    assert (cfg.rows, cfg.preset, cfg.prompt_template, cfg.trace_style, cfg.max_new_tokens) == ("auto", "standard",
                                                                                                "short", "bounded", 256)
    assert (cfg.rl_advantage, cfg.rl_loss, cfg.rl_loss_mode, cfg.rl_filter_groups,
            cfg.rl_lora_r) == ("grpo", "ppo", "seq_mean", True, 16)
    assert cfg.rl_lr == 2e-4
    assert (cfg.dpo_loss_type, cfg.dpo_beta, cfg.dpo_lora_r, cfg.pairs_samples) == ("rpo", 0.5, 16, 2)
    assert (cfg.eval_limit, cfg.passk_limit, cfg.passk, cfg.passk_temperature, cfg.passk_top_p) == (500, 50, 0, 0.6,
                                                                                                    0.95)
    assert (cfg.sft_steps, cfg.filtered_steps, cfg.batch_size, cfg.eval_batch_size) == (40, 35, 16, 256)
    DemoConfig(rl_steps=0, pairs_prompts=0, filtered_steps=0)  # skips RL, pairs + DPO, and filtered SFT
    with pytest.raises(OptionError, match="--eval-limit"):
        DemoConfig(eval_limit=600)
    assert cfg.base_eval_limit == 100  # the base model, paired with nothing: a prefix of the rows
    with pytest.raises(OptionError, match="--base-eval-limit"):
        DemoConfig(eval_limit=50)
    DemoConfig(update_micro_batch_size=8)  # divides the DPO batch of 32
    with pytest.raises(OptionError, match="--update-micro-batch-size"):
        DemoConfig(update_micro_batch_size=5)


def test_a_moved_demo_resumes_its_unfinished_stage(demo_model_dir, tmp_path):
    """A demo killed in its RL stage, its folder then moved and renamed: --resume from the new place reuses the base,
    SFT and filtered SFT evaluations and models, and the RL stage resumes from its checkpoint although its saved
    options name the old folder (its --model is the filtered SFT stage's model, its --data the generated rows)."""
    import shutil

    torch.set_num_threads(1)
    old = tmp_path / "runs" / "demo"
    cfg = DemoConfig(model=str(demo_model_dir), output_dir=str(old), quick=True, rows=None, device="cpu",
                     pairs_prompts=0, passk=0, keep_checkpoints=True)
    run_demo(cfg)
    shutil.rmtree(old / "rl" / "model")  # as if killed after RL's step-1 checkpoint
    shutil.rmtree(old / "rl" / "adapter", ignore_errors=True)
    shutil.rmtree(old / "rl" / "checkpoints" / "step-00000002")  # the last step's, written beside model/
    assert [c.name for c in checkpoint_folders(old / "rl")] == ["step-00000001"]
    new = tmp_path / "archive" / "demo-moved"
    new.parent.mkdir()
    old.rename(new)
    evals = {p.name: p.stat().st_mtime_ns for p in (new / "eval").glob("*.json") if not p.name.startswith("rl--")}
    report = run_demo(DemoConfig(**{**cfg.__dict__, "output_dir": str(new), "resume": True}))
    assert report == new / "report.md" and (new / "rl" / "model" / "config.json").is_file()
    assert {p: (new / "eval" / p).stat().st_mtime_ns for p in evals} == evals  # reused, not evaluated again
    assert [json.loads(line)["step"] for line in (new / "rl" / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
