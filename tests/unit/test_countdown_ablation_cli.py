"""scripts/countdown_ablation.py's command line: a user's mistake (``--tasks 0``, ``--every 0``, a missing SFT start, an
unknown variant, a bad setting) is one line on stderr with exit code 2, before any model loads or folder is written."""

from __future__ import annotations

import re

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def ablation():
    return load_script("countdown_ablation")


def errors(ablation, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        ablation.run_script(ablation.main, argv, prog="countdown_ablation.py")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("countdown_ablation.py: error: "), err
    return err


@pytest.mark.parametrize("argv, message", [
    (["run", "--tasks", "0"], "--tasks must be >= 1, got 0"),
    (["sft-curve", "--every", "0"], "--every must be >= 1, got 0"),
    (["run", "--steps", "-1"], "--steps must be >= 1, got -1"),
    (["run", "--real", "-2"], "--real must be >= 0, got -2"),
    (["run", "--sft", "{tmp}/no-sft"], "--sft .*no-sft: no model folder \\(config.json\\) there"),
    (["run", "--setting", "nosuch"], "--setting nosuch: not in .*settings.yaml"),
    (["list", "--variants", "nosuch"], "unknown variant\\(s\\) nosuch"),
    (["pairs", "--variants", "grpo_filter_lora_2e4"], "pairs: 'grpo_filter_lora_2e4' is not a DPO variant"),
    (["frobnicate"], "argument command: invalid choice"),
])
def test_user_errors_are_one_line_with_exit_code_2(ablation, tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--out", str(tmp_path / "out")]
    assert re.search(message, errors(ablation, argv, capsys))
    assert not (tmp_path / "out").exists()


def test_a_missing_sft_start_is_refused_before_the_start_is_evaluated(ablation, tmp_path, capsys, monkeypatch):
    """`run` with the setting's default SFT start absent on this machine: refused up front, nothing evaluated."""
    evaluated = []
    monkeypatch.chdir(tmp_path)  # the setting's SFT start is a relative path: absent here
    monkeypatch.setattr(ablation, "evaluate", lambda *args, **kwargs: evaluated.append(args))
    err = errors(ablation, ["run", "--setting", "direct", "--out", str(tmp_path / "out")], capsys)
    assert "no model folder (config.json) there" in err and evaluated == []


def test_checkpoint_merges_the_kept_adapter_into_its_own_start_only(ablation, tmp_path, capsys, monkeypatch,
                                                                   tiny_model_dir, smol_tokenizer):
    """`checkpoint --sft M`: M must hold the weights the kept adapter was trained from (its recorded SHA-256). Another
    model of the same shape, or of another shape, is one line (exit 2) naming the hashes, and nothing is merged; the
    adapter's own start merges and is evaluated; a merged model kept from before is checked again when reused."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from rlft.checkpoint import save_model_folder, weights_sha256
    from rlft.lora import LoRASettings, apply_lora

    from tests.conftest import make_tiny_model, save_model_dir

    start = shutil.copytree(tiny_model_dir, tmp_path / "sft")
    model = apply_lora(AutoModelForCausalLM.from_pretrained(start), LoRASettings(4, 8.0, 0.0, "all-linear"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    out, variant = tmp_path / "out", "grpo_filter_lora_2e4"
    save_model_folder(out / variant / "s0" / "step10_checkpoint", model, smol_tokenizer)
    evaluated = []
    monkeypatch.setattr(ablation, "evaluate", lambda ab, model, folder, seed: evaluated.append(model) or {})
    argv = ["checkpoint", "--variants", variant, "--step", "10", "--out", str(out), "--sft"]
    other = save_model_dir(tmp_path / "other", make_tiny_model(len(smol_tokenizer), seed=1), smol_tokenizer)
    wide = save_model_dir(tmp_path / "wide", make_tiny_model(len(smol_tokenizer), hidden=64), smol_tokenizer)
    capsys.readouterr()  # apply_lora's log line
    for sft in (other, wide):
        err = errors(ablation, argv + [str(sft)], capsys)
        assert f"holds other weights (SHA-256 {weights_sha256(sft)})" in err and weights_sha256(start) in err
        assert str(start) in err and str(sft) in err
    assert evaluated == [] and not (out / variant / "s0" / "step10").exists()
    ablation.run_script(ablation.main, argv + [str(start)], prog="countdown_ablation.py")
    merged = out / variant / "s0" / "step10" / "model"
    assert evaluated == [merged] and (merged / "config.json").is_file()
    capsys.readouterr()
    errors(ablation, argv + [str(other)], capsys)  # the merged model exists now: the start is still checked
    assert evaluated == [merged]
