"""rlft.lora.merge_adapter: a saved adapter merged into its base folder equals the run's own merged model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlft.checkpoint import save_model_folder
from rlft.lora import LoRASettings, apply_lora, merge_adapter, merged_copy

from tests.conftest import load_weights


def test_a_saved_adapter_merged_into_its_base_gives_the_runs_merged_model(tiny_model_dir, smol_tokenizer, tmp_path):
    model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                       LoRASettings(r=4, alpha=8.0, dropout=0.0, target_modules="all-linear"))
    with torch.no_grad():  # B starts at zero: give the adapter an update to merge
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    save_model_folder(tmp_path / "adapter", model, smol_tokenizer)
    expected = merged_copy(model).state_dict()

    out = merge_adapter(tiny_model_dir, tmp_path / "adapter", tmp_path / "merged")

    got, base = load_weights(out), load_weights(tiny_model_dir)
    assert set(got) == set(base)
    changed = [k for k in got if not torch.equal(got[k], base[k])]
    assert changed and all("proj" in k for k in changed)  # the adapted linear layers moved, nothing else
    for key, value in got.items():
        assert torch.equal(value, expected[key].to(value.dtype)), key
    assert (out / "tokenizer.json").is_file()


def test_a_folder_without_an_adapter_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        merge_adapter(tiny_model_dir, tmp_path, tmp_path / "merged")
