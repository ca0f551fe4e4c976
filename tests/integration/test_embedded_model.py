"""The real built-in model: conversion/caching, a few SFT steps, generation and scoring."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.models import embedded_model_path, load_model, load_tokenizer, resolve_model


@pytest.fixture(scope="module")
def embedded_path():
    try:
        return embedded_model_path()
    except Exception as e:  # noqa: BLE001 - report why, do not hide it
        pytest.fail(f"built-in model unavailable: {e}")


def test_builtin_name_resolves_to_cached_folder(embedded_path):
    assert resolve_model("smollm2-135m") == str(embedded_path)
    assert (embedded_path / "model.safetensors").is_file()
    config = json.loads((embedded_path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama"


def test_sft_a_few_steps_then_generate(embedded_path, tmp_path):
    from rlft.recipes.sft import SFTConfig, train_sft
    from rlft.rollout import HFEngine, SamplingParams
    from rlft.eval.countdown import evaluate_countdown
    from rlft.tasks.countdown.generator import PRESETS, make_splits
    from rlft.tasks.countdown.prompts import render_prompt

    out = tmp_path / "sft"
    final = train_sft(SFTConfig(data="countdown", preset="easy3", num_train=8, prompt_template="short",
                                trace_style="direct", output_dir=str(out), batch_size=4, micro_batch_size=2,
                                max_steps=2, lr=1e-5, save_every=0, device="cpu"))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(0 < r["loss/sft"] < 10 for r in records)

    base = load_model("smollm2-135m")
    tuned = load_model(str(final))
    changed = [n for n, p in tuned.named_parameters() if not torch.equal(p, dict(base.named_parameters())[n])]
    assert len(changed) == len(list(tuned.parameters()))

    tokenizer = load_tokenizer(str(final))
    _, test = make_splits(PRESETS["easy3"], 0, 2, 1234)
    prompts = [render_prompt("short", t, tokenizer) for t in test]
    result = evaluate_countdown(HFEngine(tuned, tokenizer), test, prompts,
                                SamplingParams(temperature=0.0, max_new_tokens=8))
    assert result.num_tasks == 2
    assert 0.0 <= result.mean_score <= 1.0
    assert result.mean_completion_tokens <= 8
