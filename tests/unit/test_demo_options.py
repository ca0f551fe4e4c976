"""rlft.lab.demo_config: DemoConfig's option blocks, --quick under explicit options, and the stages' options
checked when the demo is parsed, in the demo's own option names; --env countdown-calc (rlft.lab.demo_env): the stages'
configs it gives, its refusals, and evaluations cached apart from those without tools."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from unittest import mock

import pytest

from rlft.cli import main
from rlft.composed import option_fields
from rlft.lab.demo_config import (QUICK, RL_OPTIONS, DemoConfig, DemoEvalOptions, DemoPreferenceOptions,
                                      DemoRLOptions, DemoSFTOptions, DemoUltraFeedbackOptions)
from rlft.lab.demo_countdown import pairs_config, rl_config, sft_config
from rlft.lab.demo_env import DemoEnvOptions
from rlft.recipes.pairs import PairsConfig
from rlft.recipes.sft import SFTConfig
from rlft.rl.config import RLConfig
from rlft.validation import OptionError

BLOCKS = (DemoSFTOptions, DemoRLOptions, DemoPreferenceOptions, DemoEvalOptions, DemoUltraFeedbackOptions,
          DemoEnvOptions)


def test_demo_config_is_its_blocks():
    names = [f.name for f in dataclasses.fields(DemoConfig)]
    assert len(names) == len(set(names)) == 87
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


# --------------------------------------------------------------------------- --env countdown|countdown-calc

ROWS, MODEL, NUM_TRAIN = "countdown-3to4", "start-model", 9240


def _stages(cfg: DemoConfig, out: Path) -> tuple[SFTConfig, SFTConfig, RLConfig, PairsConfig]:
    """The SFT, filtered SFT, RL and pairs configs the Countdown track builds from ``cfg``; nothing runs."""
    cfg = cfg.effective()
    return (sft_config(cfg, ROWS, cfg.model, out / "sft"),
            sft_config(cfg, ROWS, MODEL, out / "filtered", filtered=True),
            rl_config(cfg, ROWS, MODEL, NUM_TRAIN, out / "rl"),
            pairs_config(cfg, ROWS, MODEL, NUM_TRAIN, out / "pairs" / "countdown.jsonl"))


def test_countdown_calc_gives_every_stage_the_calculator(tmp_path):
    """SFT: the calculator's traces and prompt; RL and pairs: --env countdown-calc with the demo's bounds; the
    evaluations: the 'calc' prompt and the calculator's tools (countdown_env)."""
    from rlft.eval.countdown_command import countdown_env
    from rlft.rewards.countdown_calc import CALC_TOOLS

    cfg = DemoConfig(env="countdown-calc", max_turns=3, max_observation_tokens=16, tool_timeout=2.0)
    assert (cfg.prompt_template, cfg.trace_style) == ("calc", "calc") and cfg.effective() == cfg
    sft, filtered, rl, pairs = _stages(cfg, tmp_path)
    for c in (sft, filtered):
        assert (c.trace_style, c.prompt_template) == ("calc", "calc")
    assert filtered.correct_only and not sft.correct_only
    assert (rl.env, rl.max_turns, rl.max_observation_tokens, rl.tool_timeout) == ("countdown-calc", 3, 16, 2.0)
    assert rl.prompt_template == "calc"
    assert (pairs.env, pairs.max_turns, pairs.max_observation_tokens, pairs.tool_timeout,
            pairs.prompt_template) == ("countdown-calc", 3, 16, 2.0, "calc")
    template, tool_use = countdown_env(cfg)
    assert template == "calc" and dict(tool_use.tools) == dict(CALC_TOOLS)
    assert (tool_use.max_turns, tool_use.max_observation_tokens, tool_use.timeout_s) == (3, 16, 2.0)
    # with --quick too, and the config rebuilt from its values (resume) is the same one
    quick = DemoConfig(env="countdown-calc", quick=True)
    assert (quick.prompt_template, quick.trace_style, quick.sft_steps) == ("calc", "calc", QUICK["sft_steps"])
    assert DemoConfig(**{f.name: getattr(quick, f.name) for f in dataclasses.fields(quick)}) == quick


def test_default_env_gives_the_configs_of_before(tmp_path):
    """--env countdown (the default): the stages' configs are the ones the demo built before it had --env (written
    out here as it built them), with no environment set (env None: rl's and pairs' own default)."""
    cfg = DemoConfig()
    assert (cfg.env, cfg.prompt_template, cfg.trace_style, cfg.env_options()) == ("countdown", "short", "bounded", {})
    assert DemoConfig(env="countdown") == cfg
    sft, filtered, rl, pairs = _stages(cfg, tmp_path)
    before_sft = SFTConfig(model=cfg.model, data="countdown", preset="standard", num_train=8000, correct_only=False,
                           heldout_size=1000, heldout_data=ROWS, trace_style="bounded", max_dead_ends=2, give_up=0.6,
                           max_tries=6, prompt_template="short", output_dir=str(tmp_path / "sft"), max_length=512,
                           batch_size=16, micro_batch_size=8, max_steps=40, lr=1e-4, schedule="constant",
                           warmup_ratio=0.03, save_every=10, split_seed=1234, seed=0, resume=False, device="auto",
                           dtype="auto")
    assert sft == before_sft
    assert filtered == dataclasses.replace(before_sft, model=MODEL, correct_only=True, max_steps=35, save_every=8,
                                           output_dir=str(tmp_path / "filtered"))
    before_rl = RLConfig(**cfg.rl_options(), model=MODEL, data=ROWS, num_train=NUM_TRAIN,
                         output_dir=str(tmp_path / "rl"), eval_at_start=True, eval_rows="validation",
                         eval_max_new_tokens=256, save_every=1, resume=False)
    assert rl == before_rl and rl.env is None and rl.prompt_template == "short"
    before_pairs = PairsConfig(model=MODEL, data=ROWS, num_prompts=128, start=NUM_TRAIN - 128, prompt_template="short",
                               num_samples=2, temperature=1.0, max_new_tokens=256, batch_size=256,
                               output=str(tmp_path / "pairs" / "countdown.jsonl"), seed=0, device="auto", dtype="auto")
    assert pairs == before_pairs and pairs.env is None


@pytest.mark.parametrize("options, message", [
    ({"env": "examples/envs/reverse.py:Reverse"}, "--env examples/envs/reverse.py:Reverse: the demo runs the built-in "
     r"Countdown environments \(countdown, countdown-calc\)"),
    ({"env": "chat"}, "--env chat: the demo runs the built-in Countdown environments"),
    ({"env": "countdown-calc", "track": "ultrafeedback"}, "--env countdown-calc is the Countdown track's: --track "
     "ultrafeedback"),
    ({"env": "countdown-calc", "prompt_template": "base"}, "--env countdown-calc runs with --prompt-template calc"),
    ({"env": "countdown-calc", "trace_style": "search"}, "--env countdown-calc runs with --trace-style calc"),
    ({"prompt_template": "calc", "trace_style": "calc"}, "--prompt-template calc is --env countdown-calc's"),
    ({"trace_style": "calc"}, "--trace-style calc is --env countdown-calc's"),
    ({"env": "countdown-calc", "max_turns": 0}, "--max-turns must be >= 1"),
])
def test_env_refusals(options, message):
    with pytest.raises(OptionError, match=message):
        DemoConfig(**options)


@pytest.mark.parametrize("args, message", [
    (["--env", "my_env.py:MyEnv"], "--env my_env.py:MyEnv: the demo runs the built-in Countdown environments"),
    (["--env", "countdown-calc", "--track", "ultrafeedback"], "--env countdown-calc is the Countdown track's"),
])
def test_env_refusals_on_the_command_line_in_one_line(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["demo", *args, "--dry-run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err


def test_dry_run_shows_the_calc_values_that_run(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["demo", "--env", "countdown-calc", "--quick", "--dry-run"])
    lines = [line.split("#")[0].split() for line in capsys.readouterr().out.splitlines()]
    for name, value in (("env", "countdown-calc"), ("prompt_template", "calc"), ("trace_style", "calc")):
        assert [name + ":", value] in lines, (name, lines)


class ToolEngine:
    """Every sample answers ``1 + 2`` and records whether it was given tools."""

    calls: list = []

    def __init__(self, model, tokenizer, **kwargs):
        pass

    def generate(self, prompts, params, tool_use=None, contexts=None):
        ToolEngine.calls.append(tool_use)
        return [[_sample()] * params.k for _ in prompts]


def _sample():
    from rlft.rollout.base import Sample

    return Sample([1], "</think><answer>1 + 2</answer>", "stop")


def test_an_evaluation_with_the_calculator_is_cached_apart_from_one_without(tmp_path):
    """The demo's evaluations (evaluate_cached): with tools, the environment and its bounds join the cache key, so a
    cached evaluation without tools is not reused for one with them, nor the other way round, nor one with other
    bounds; each is reused by its own kind."""
    from rlft.lab.pipeline import EvalJob, evaluate_cached
    from rlft.rollout.base import SamplingParams
    from rlft.rollout.turns import ToolUse
    from rlft.rewards.countdown_calc import CALC_TOOLS
    from rlft.types import CountdownTask

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"0123")
    path = tmp_path / "eval" / "sft--greedy.json"
    job = {"greedy": EvalJob(path, [CountdownTask((1, 2), 3)], SamplingParams(k=1, temperature=0.0, max_new_tokens=8))}
    calc, calc3 = ToolUse(CALC_TOOLS, 4, 32, 5.0), ToolUse(CALC_TOOLS, 3, 32, 5.0)

    def evaluate(**tools):
        return evaluate_cached(model, job, prompt_template="calc", batch_size=4, **tools)["greedy"]

    ToolEngine.calls = []
    with (mock.patch("rlft.models.load_tokenizer", return_value=None), mock.patch("rlft.models.load_model"),
          mock.patch("rlft.models.pick_device"), mock.patch("rlft.rollout.hf.HFEngine", ToolEngine)):
        evaluate()
        assert ToolEngine.calls == [None] and "env" not in json.loads(path.read_text())["cache_key"]
        evaluate()  # reused
        with_tools = evaluate(env="countdown-calc", tool_use=calc)
        assert ToolEngine.calls == [None, calc] and with_tools.task_tool_calls == [[0]]
        data = json.loads(path.read_text())
        env = {"name": "countdown-calc", "tools": ["calc"], "max_turns": 4, "max_observation_tokens": 32,
               "tool_timeout": 5.0}
        assert data["cache_key"]["env"] == env and data["config"]["env"] == env
        evaluate(env="countdown-calc", tool_use=calc)  # reused
        assert len(ToolEngine.calls) == 2
        evaluate(env="countdown-calc", tool_use=calc3)  # other bounds: evaluated again
        evaluate()  # without tools: a cached evaluation with them does not answer it
        assert ToolEngine.calls == [None, calc, calc3, None]
