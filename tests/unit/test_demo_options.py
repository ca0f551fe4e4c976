"""rlft.lab.demo_config: DemoConfig's option blocks, --quick under explicit options, and the stages' options
checked when the demo is parsed, in the demo's own option names."""

from __future__ import annotations

import dataclasses

import pytest

from rlft.cli import main
from rlft.composed import option_fields
from rlft.lab.demo_config import (QUICK, RL_OPTIONS, DemoConfig, DemoEvalOptions, DemoPreferenceOptions,
                                      DemoRLOptions, DemoSFTOptions, DemoUltraFeedbackOptions)
from rlft.rl.config import RLConfig
from rlft.validation import OptionError

BLOCKS = (DemoSFTOptions, DemoRLOptions, DemoPreferenceOptions, DemoEvalOptions, DemoUltraFeedbackOptions)


def test_demo_config_is_its_blocks():
    names = [f.name for f in dataclasses.fields(DemoConfig)]
    assert len(names) == len(set(names)) == 83
    in_blocks = [f.name for block in BLOCKS for f in dataclasses.fields(block)]
    assert len(in_blocks) == len(set(in_blocks)) and not set(DemoConfig.__dict__["__annotations__"]) & set(in_blocks)
    assert all(n.startswith("rl_") for n in (f.name for f in dataclasses.fields(DemoRLOptions)))
    assert set(RL_OPTIONS.values()) <= set(names) and set(RL_OPTIONS) <= {f.name for f in option_fields(RLConfig)}


def test_quick_sizes_apply_where_an_option_is_left_at_its_default():
    quick = DemoConfig(quick=True)
    assert {name: getattr(quick, name) for name in QUICK} == QUICK
    assert quick.effective() is quick and DemoConfig().effective() == DemoConfig()
    assert DemoConfig().sft_steps == 40  # without --quick nothing changes
    # explicit options win over --quick: 0 skips the stage (demo_countdown runs RL if rl_steps, pairs + DPO if
    # pairs_prompts, the sampled evaluation if passk)
    cfg = DemoConfig(quick=True, rl_steps=0, pairs_prompts=0, passk=0, sft_steps=1, filtered_steps=0)
    assert (cfg.rl_steps, cfg.pairs_prompts, cfg.passk, cfg.sft_steps, cfg.filtered_steps) == (0, 0, 0, 1, 0)
    assert (cfg.num_train, cfg.eval_limit, cfg.max_new_tokens) == (64, 8, 32)  # the rest still quick
    # building it again from its values (resume, replace) gives the same config
    assert DemoConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}) == cfg
    assert dataclasses.replace(cfg, output_dir="x").rl_steps == 0


def test_quick_with_explicit_options_on_the_command_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main([
        "demo", "--quick", "--rl-steps", "0", "--pairs-prompts", "0", "--passk", "0", "--sft-steps", "1", "--dry-run"
    ])
    plan = capsys.readouterr().out
    for name, value in (("rl_steps", 0), ("pairs_prompts", 0), ("passk", 0), ("sft_steps", 1), ("num_train", 64)):
        assert any(line.split()[:2] == [name, str(value)] or line.split()[:2] == [name + ":", str(value)]
                   for line in plan.splitlines()), (name, plan)


@pytest.mark.parametrize("options, message", [
    ({"rl_k": 1}, "--rl-advantage grpo needs --rl-k >= 2 samples per prompt"),
    ({"rl_temperature": 0.0}, "--rl-temperature must be > 0"),
    ({"rl_overlong_buffer": 300}, r"--rl-overlong-buffer \(300\) must be <= --max-new-tokens \(256\)"),
    ({"rl_overlong_buffer": 64, "quick": True}, r"--rl-overlong-buffer \(64\) must be <= --max-new-tokens \(32\)"),
    ({"rl_lora_r": 4, "rl_lora_alpha": 0.0}, "--rl-lora-alpha must be > 0"),
    ({"rl_repetition_penalty": -0.5}, r"--rl-repetition-penalty is only read with --rl-repetition-limit \("),
    ({"rl_repetition_limit": 3, "rl_repetition_penalty": 0.5}, r"--rl-repetition-penalty must be <= 0"),
    ({"rl_repetition_limit": 1}, r"--rl-repetition-limit must be >= 2"),
    ({"pairs_temperature": 0.0}, "--pairs-temperature must be > 0"),
    ({"pairs_samples": 1}, "--pairs-samples must be >= 2"),
    ({"passk": 4, "passk_temperature": 0.0}, "--passk-temperature must be > 0"),
    ({"track": "ultrafeedback", "uf_rloo_k": 1}, "--uf-rloo-k must be >= 2"),
    ({"track": "ultrafeedback", "uf_eval_prompts": 0}, "--uf-eval-prompts must be >= 1"),
    ({"track": "ultrafeedback", "uf_max_length": 70}, r"--uf-max-length \(70\) must exceed --uf-max-new-tokens \(64\)"),
])
def test_stage_options_are_refused_at_parse_time_in_the_demo_words(options, message):
    with pytest.raises(OptionError, match=message):
        DemoConfig(**options)


def test_the_repetition_options_reach_the_rl_stage():
    cfg = DemoConfig(rl_repetition_limit=4, rl_repetition_penalty=-0.5)
    assert (cfg.rl_options()["repetition_limit"], cfg.rl_options()["repetition_penalty"]) == (4, -0.5)
    assert (DemoConfig().rl_repetition_limit, DemoConfig().rl_repetition_penalty) == (None, None)  # off by default


def test_a_skipped_stage_is_not_checked():
    DemoConfig(rl_steps=0, rl_k=1, rl_temperature=0.0)
    DemoConfig(pairs_prompts=0, pairs_temperature=0.0)
    DemoConfig(passk=0, passk_temperature=0.0)
    DemoConfig(track="ultrafeedback", rl_k=1)  # the Countdown RL stage does not run on that track


@pytest.mark.parametrize("args, message", [
    (["--rl-k", "1"], "--rl-k >= 2"),
    (["--rl-overlong-buffer", "300"], "--rl-overlong-buffer (300) must be <= --max-new-tokens (256)"),
    (["--rl-temperature", "0"], "--rl-temperature must be > 0"),
    (["--rl-repetition-penalty", "-0.5"], "--rl-repetition-penalty is only read with --rl-repetition-limit"),
])
def test_dry_run_refuses_them_in_one_line(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["demo", *args, "--dry-run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1 and "--k " not in err, err
