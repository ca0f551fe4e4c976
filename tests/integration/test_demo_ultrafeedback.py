"""`rlft demo --track ultrafeedback --quick` end to end on a tiny random model: split, SFT (Pref-FT), DPO,
reward model, RLOO, win-rates, report and plots; `--resume` reuses every finished stage."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rlft.cli import main
from rlft.lab.demo import DemoConfig
from rlft.lab.demo_ultrafeedback import compare_judged, split_preferences
from tests.conftest import SHARED_DATA, make_tiny_model, save_model_dir, write_jsonl_rows

UF = SHARED_DATA / "ultrafeedback" / "train_clean.jsonl"


@pytest.fixture
def demo_model_dir(tmp_path, smol_tokenizer):
    """A fresh tiny model folder per test, its generation config stopping at SmolLM2's EOS."""
    model = make_tiny_model(len(smol_tokenizer))
    model.generation_config.eos_token_id = smol_tokenizer.eos_token_id
    return save_model_dir(tmp_path / "tiny", model, smol_tokenizer)


def _h4_rows(n: int) -> list[dict]:
    """Hand-made rows in the HuggingFaceH4/ultrafeedback_binarized train_prefs schema (every 5th a score tie,
    every 7th with a system message and a prior exchange)."""
    rows = []
    for i in range(n):
        prompt = f"Name a colour that starts with the letter {chr(65 + i % 26)} (question {i})."
        history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello!"}] if i % 7 == 0 else []
        user = {"role": "user", "content": prompt}
        rows.append({
            "prompt": prompt, "prompt_id": f"{i:064x}",
            "chosen": [*history, user, {"role": "assistant", "content": f"A colour: option {i}, bright and clear."}],
            "rejected": [*history, user, {"role": "assistant", "content": "I don't know."}],
            "messages": [*history, user, {"role": "assistant", "content": f"A colour: option {i}, bright and clear."}],
            "score_chosen": 7.0 if i % 5 == 0 else 8.5, "score_rejected": 7.0 if i % 5 == 0 else 2.0,
        })
    return rows


def test_split_is_disjoint_seeded_and_counts_ties(tmp_path, smol_tokenizer):
    src = tmp_path / "h4.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _h4_rows(30)) + '{"prompt": "x", "chosen": "not a list"}\n')
    kwargs = dict(train_pairs=12, eval_prompts=6, max_prompt_tokens=200, seed=3)
    stats = split_preferences(str(src), "train_prefs", smol_tokenizer, tmp_path / "a", **kwargs)
    assert (stats["rows_read"], stats["skipped_invalid"], stats["valid"], stats["ties"]) == (31, 1, 30, 6)
    assert (stats["eval_prompts"], stats["eval_pairs"], stats["train_pairs"], stats["unused"]) == (6, 6, 12, 12)
    train = [json.loads(x) for x in (tmp_path / "a" / "train.jsonl").read_text().splitlines()]
    held = [json.loads(x) for x in (tmp_path / "a" / "eval.jsonl").read_text().splitlines()]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert stats["train_ties"] == sum(r["score_chosen"] == r["score_rejected"] for r in train)
    assert any(r["chosen"][0]["role"] == "system" for r in train + held) or stats["train_pairs"] < 12
    again = split_preferences(str(src), "train_prefs", smol_tokenizer, tmp_path / "b", **kwargs)
    assert again == stats and (tmp_path / "b" / "train.jsonl").read_text() == (tmp_path / "a" /
                                                                               "train.jsonl").read_text()
    short = split_preferences(str(src), "train_prefs", smol_tokenizer, tmp_path / "c",
                              **{**kwargs, "max_prompt_tokens": 45})
    assert 0 < short["long_prompts_set_aside"] < 30  # the system + history prompts are the long ones
    with pytest.raises(ValueError, match="too few"):
        split_preferences(str(src), "train_prefs", smol_tokenizer, tmp_path / "d", **{**kwargs, "eval_prompts": 30})


def test_compare_judged_counts_identical_responses_as_ties():
    p = [{"role": "user", "content": q} for q in "abc"]
    a = [{"prompt": [m], "policy_response": r, "policy_reward": w}
         for m, r, w in zip(p, ["x", "y", "z"], [1.0, 0.0, 2.0])]
    b = [{"prompt": [m], "policy_response": r, "policy_reward": w}
         for m, r, w in zip(p, ["x", "w", "v"], [0.5, 1.0, 1.0])]
    s = compare_judged(a, b)
    assert (s["wins"], s["ties"], s["losses"], s["win_rate"]) == (1, 1, 1, 0.5)


def test_quick_ultrafeedback_demo(demo_model_dir, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)  # no --output-dir: runs/demo-ultrafeedback, under tmp_path
    data = UF
    if not UF.is_file():  # CI has ../shared; elsewhere a hand-made H4 file
        data = tmp_path / "h4.jsonl"
        write_jsonl_rows(data, _h4_rows(40))
    args = ["demo", "--track", "ultrafeedback", "--quick", "--model", str(demo_model_dir), "--data", str(data),
            "--device", "cpu", "--uf-sft-data", str(tmp_path / "no_smoltalk.jsonl")]
    main(args)
    run_dir = tmp_path / "runs" / "demo-ultrafeedback"  # the default output folder follows the track
    text = (run_dir / "report.md").read_text()
    quick = DemoConfig(quick=True).effective()
    for model in ("base", "sft", "dpo", "rloo"):
        assert f"\n| {model} | " in text, f"no {model} row in the results table"
    for model in ("sft", "dpo", "rloo"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {model} | "))
        numbers = [float(x) for x in re.findall(r"\d+\.\d+", row)]
        win_rates, cis = numbers[:1], numbers[1:3]
        assert all(0.0 <= x <= 1.0 for x in win_rates + cis)
        assert cis[0] <= win_rates[0] <= cis[1]
    assert re.search(r"\*\*RM accuracy\*\* \(held-out pairs .*\): (0|1)\.\d{3} \(95% CI \[", text)
    assert "no_smoltalk.jsonl could not be read" in text and "Pref-FT" in text  # the SFT source falls back
    assert "DPO ties dropped" in text and "long prompts set aside" in text
    split = json.loads((run_dir / "data" / "split.json").read_text())
    assert split["eval_prompts"] == quick.uf_eval_prompts and split["train_pairs"] == quick.uf_train_pairs
    if data == UF:
        assert (split["rows_read"], split["skipped_invalid"], split["ties"]) == (1000, 2, 111)
    for png in ("winrates.png", "sft_loss_sft.png", "dpo_loss_dpo.png", "dpo_rewards_accuracy.png", "rm_loss_bt.png",
                "rm_rm_accuracy.png", "rloo_reward_mean.png"):
        assert (run_dir / png).stat().st_size > 1000, png
    for label in ("sft", "dpo", "rloo"):
        summary = json.loads((run_dir / "winrate" / f"{label}_vs_base" / "winrate.json").read_text())
        assert summary["n"] == quick.uf_eval_prompts and summary["reference"].endswith("base.jsonl")
    for label in ("dpo", "rloo"):
        assert 0.0 <= json.loads((run_dir / "winrate" / f"{label}_vs_sft.json").read_text())["win_rate"] <= 1.0
    base = [json.loads(x) for x in (run_dir / "responses" / "base.jsonl").read_text().splitlines()]
    assert len(base) == quick.uf_eval_prompts and {"prompt", "response", "truncated"} <= set(base[0])
    dpo_stats = json.loads((run_dir / "dpo" / "data_stats.json").read_text())
    assert dpo_stats["dropped_ties"] == split["train_ties"] and dpo_stats["data_format"] == "chat"
    rm_eval = json.loads((run_dir / "rm" / "eval.json").read_text())
    assert rm_eval["n"] == split["eval_pairs"] - split["eval_ties"]
    assert not list(run_dir.glob("*/checkpoints")), "finished stages keep no checkpoints by default"

    # --resume: every finished stage is reused (no file rewritten); only the report is written again.
    watched = [
        run_dir / "data" / "train.jsonl", run_dir / "data" / "eval.jsonl", *(run_dir / "responses").glob("*.jsonl"),
        *(run_dir / "winrate").rglob("*.json*")
    ]
    watched += [run_dir / stage / "model" / "model.safetensors" for stage in ("sft", "dpo", "rm", "rloo")]
    mtimes = {p: p.stat().st_mtime_ns for p in watched}
    main([*args, "--resume"])
    assert {p: p.stat().st_mtime_ns for p in watched} == mtimes
    assert (run_dir / "report.md").read_text().split("## Timings")[0] == text.split("## Timings")[0]
