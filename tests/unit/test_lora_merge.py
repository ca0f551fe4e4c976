"""rlft.lora.merge_adapter: a saved adapter merged into its base folder equals the run's own merged model; every saved
adapter records its base model's folder and weights SHA-256, and a merge into other weights, another shape, or over
the base or the adapter itself is refused with one line."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlft.checkpoint import save_checkpoint, save_model_folder, weights_sha256
from rlft.lora import BASE_RECORD, LoRASettings, apply_lora, merge_adapter, merged_copy, save_final_model
from rlft.validation import UsageError

from tests.conftest import load_weights, make_tiny_model, save_model_dir

SETTINGS = LoRASettings(r=4, alpha=8.0, dropout=0.0, target_modules="all-linear")


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


def adapted(folder):
    """``folder``'s model (float32) with LoRA adapters whose B matrices are non-zero (an update to merge)."""
    model = apply_lora(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), SETTINGS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    return model


class Lines(logging.Handler):
    """The rlft logger's warning lines (a handler of its own: setup_logging may have stopped propagation)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def warnings_of_rlft():
    handler, logger = Lines(), logging.getLogger("rlft")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def test_every_saved_adapter_records_its_base_model(tiny_model_dir, smol_tokenizer, tmp_path):
    """The final adapter/ and each checkpoint hold base_model.json: the resolved folder the base was loaded from and
    sha256sum of its model.safetensors; the merged model/ (a plain model) holds none."""
    model = adapted(tiny_model_dir)
    save_final_model(tmp_path / "run", model, smol_tokenizer)
    optim = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    ckpt = save_checkpoint(tmp_path / "run", 1, model, smol_tokenizer, optim, None)
    expected = {"model": str(tiny_model_dir.resolve()), "model_sha256": weights_sha256(tiny_model_dir)}
    assert len(expected["model_sha256"]) == 64
    for folder in (tmp_path / "run" / "adapter", ckpt):
        assert json.loads((folder / BASE_RECORD).read_text()) == expected
    assert not (tmp_path / "run" / "model" / BASE_RECORD).exists()
    assert BASE_RECORD in json.loads((ckpt / "manifest.json").read_text())["files"]  # checked like the weights


def test_an_adapter_merges_into_its_base_under_any_path_and_nothing_else(tiny_model_dir, smol_tokenizer, tmp_path):
    save_model_folder(tmp_path / "adapter", adapted(tiny_model_dir), smol_tokenizer)
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy_of_a")  # the same weights elsewhere: the same model
    out = merge_adapter(copy, tmp_path / "adapter", tmp_path / "merged")
    assert load_weights(out).keys() == load_weights(tiny_model_dir).keys()

    other = save_model_dir(tmp_path / "b", make_tiny_model(len(smol_tokenizer), seed=1), smol_tokenizer)  # same shape
    sha_a, sha_b = weights_sha256(tiny_model_dir), weights_sha256(other)
    with pytest.raises(UsageError) as refused:
        merge_adapter(other, tmp_path / "adapter", tmp_path / "merged_b")
    message = str(refused.value)
    assert "\n" not in message and sha_a in message and sha_b in message
    assert str(tiny_model_dir.resolve()) in message and str(other) in message and "other weights" in message
    assert not (tmp_path / "merged_b").exists()

    wide = save_model_dir(tmp_path / "wide", make_tiny_model(len(smol_tokenizer), hidden=64), smol_tokenizer)
    with pytest.raises(UsageError, match="holds other weights") as refused:  # another shape: other weights, first
        merge_adapter(wide, tmp_path / "adapter", tmp_path / "merged_wide")
    assert "\n" not in str(refused.value) and not (tmp_path / "merged_wide").exists()


def test_an_adapter_without_a_record_merges_with_a_warning_but_not_into_another_shape(
        tiny_model_dir, smol_tokenizer, tmp_path, warnings_of_rlft):
    """Adapters saved before the record existed: merged as before, with one warning line; another shape (wider layers,
    or fewer layers: peft itself would load the adapter's first layer silently) is one line, never a traceback."""
    model = adapted(tiny_model_dir)
    save_model_folder(tmp_path / "adapter", model, smol_tokenizer)
    (tmp_path / "adapter" / BASE_RECORD).unlink()
    out = merge_adapter(tiny_model_dir, tmp_path / "adapter", tmp_path / "merged")
    assert warnings_of_rlft == [(f"{tmp_path / 'adapter'} records no base model (an adapter saved before rlft recorded "
                                 f"it): merged into {tiny_model_dir} unchecked")]
    expected = merged_copy(model).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in load_weights(out).items())

    wide = save_model_dir(tmp_path / "wide", make_tiny_model(len(smol_tokenizer), hidden=64), smol_tokenizer)
    shape = (r"adapter does not fit .*wide \(another shape\): .*q_proj.lora_A.default.weight is "
             r"torch.Size\(\[4, 32\]\) in the adapter, torch.Size\(\[4, 64\]\) in the model$")
    with pytest.raises(UsageError, match=shape):
        merge_adapter(wide, tmp_path / "adapter", tmp_path / "merged_wide")
    shallow = save_model_dir(tmp_path / "shallow", make_tiny_model(len(smol_tokenizer), layers=1), smol_tokenizer)
    with pytest.raises(UsageError, match=r"\(another shape\): the adapter has base_model.model.model.layers.1.\S+, "
                                         "which the model lacks$"):
        merge_adapter(shallow, tmp_path / "adapter", tmp_path / "merged_shallow")
    assert not (tmp_path / "merged_wide").exists() and not (tmp_path / "merged_shallow").exists()


def test_out_may_not_be_the_base_or_the_adapter(tiny_model_dir, smol_tokenizer, tmp_path, monkeypatch):
    base = shutil.copytree(tiny_model_dir, tmp_path / "base")
    save_model_folder(tmp_path / "adapter", adapted(base), smol_tokenizer)
    before = weights_sha256(base)
    monkeypatch.chdir(tmp_path)
    for out, message in ((base, "out .*base is the base model .*base: writing it would replace it"),
                         ("./sub/../base", "is the base model"),  # the same folder, spelled otherwise
                         (tmp_path / "adapter", "is the adapter"),
                         (tmp_path, "holds the base model"),  # replacing it would delete the base
                         (base / "merged", "lies inside the base model")):
        with pytest.raises(UsageError, match=message):
            merge_adapter(base, tmp_path / "adapter", out)
    assert weights_sha256(base) == before and (tmp_path / "adapter" / "adapter_config.json").is_file()


def test_resuming_an_adapter_over_other_base_weights_is_refused(tiny_model_dir, smol_tokenizer, tmp_path):
    """A checkpoint's adapter loaded onto a base whose weights changed since it was saved (apply_lora adapter_from)."""
    save_model_folder(tmp_path / "ckpt", adapted(tiny_model_dir), smol_tokenizer)
    assert apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), SETTINGS, adapter_from=tmp_path / "ckpt")
    other = save_model_dir(tmp_path / "b", make_tiny_model(len(smol_tokenizer), seed=1), smol_tokenizer)
    with pytest.raises(UsageError, match="holds other weights"):
        apply_lora(AutoModelForCausalLM.from_pretrained(other), SETTINGS, adapter_from=tmp_path / "ckpt")
