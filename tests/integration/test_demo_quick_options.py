"""`rlft demo --quick` with explicit options: they win over --quick, and 0 skips RL, pairs + DPO, and the sampled
evaluation, filtered SFT (issue 46: before, `--quick --rl-steps 0 --pairs-prompts 0 --passk 0 --sft-steps 1` ran all
of them and 4 SFT steps)."""

from __future__ import annotations

import json

import torch

from rlft.cli import main
from tests.conftest import make_tiny_model, save_model_dir


def test_explicit_options_win_over_quick(tmp_path, smol_tokenizer, monkeypatch):
    torch.set_num_threads(1)
    model = make_tiny_model(len(smol_tokenizer))
    model.generation_config.eos_token_id = smol_tokenizer.eos_token_id
    model_dir = save_model_dir(tmp_path / "tiny", model, smol_tokenizer)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "demo"
    main([
        "demo", "--quick", "--rl-steps", "0", "--pairs-prompts", "0", "--passk", "0", "--sft-steps", "1",
        "--filtered-steps", "0", "--model",
        str(model_dir), "--output-dir",
        str(out), "--rows", "None", "--device", "cpu"
    ])
    steps = [json.loads(line)["step"] for line in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]  # one SFT step, not --quick's 4
    assert not any((out / stage).exists() for stage in ("filtered", "rl", "pairs", "dpo"))
    assert sorted(p.name for p in (out / "eval").glob("*.json")) == ["base--greedy.json",
                                                                     "sft--greedy.json"]  # no sampled one
    assert (out / "report.md").is_file()
