"""rlft.rl.options: RLConfig's option blocks, and the options ``rlft rl`` refuses because they would do nothing in the
chosen setup (or are out of range), at parse time, as one line with exit code 2."""

from __future__ import annotations

import dataclasses

import pytest

from rlft.cli import main
from rlft.options import SpeedOptions
from rlft.rl.config import RLConfig, rloo_config
from rlft.rl.options import (ChatPromptOptions, CurriculumOptions, GroupFilterOptions, ImportanceOptions,
                             InLoopEvalOptions, KLOptions, PolicyLossOptions, ReplayOptions, RewardOptions,
                             SamplingOptions, ShapingOptions)
from rlft.tasks.countdown.options import CountdownTrainingOptions
from rlft.validation import OptionError

BLOCKS = (SamplingOptions, PolicyLossOptions, KLOptions, ImportanceOptions, GroupFilterOptions, CurriculumOptions,
          ShapingOptions, InLoopEvalOptions, ChatPromptOptions, RewardOptions, CountdownTrainingOptions, SpeedOptions,
          ReplayOptions)


def test_rl_config_holds_its_blocks_as_fields():
    from rlft.composed import block_fields, option_fields

    blocks = block_fields(RLConfig)
    assert len(blocks) == len(dataclasses.fields(RLConfig))  # nothing but blocks
    for block in BLOCKS:
        assert [name for name, cls in blocks.items() if issubclass(cls, block)], block.__name__
    names = [f.name for f in option_fields(RLConfig)]
    # the 84 options of 2026-11-27, --compile, --repetition-limit/-penalty, --replay-size, --max-staleness,
    # --max-tokens-per-micro-batch, --positive-weight; --env, --max-turns, --max-observation-tokens, --tool-timeout,
    # --hint, --hint-fraction, --time-limit, --max-flops (2026-12-06); each in one block
    assert len(names) == len(set(names)) == 100
    assert RLConfig().compile is False and RLConfig(compile=True).compile is True
    cfg = RLConfig(k=3, beta=0.2, lr=1e-4)  # flat keywords go to their blocks; flat names read through
    assert (cfg.sampling.k, cfg.kl.beta, cfg.optim.lr, cfg.k, cfg.beta) == (3, 0.2, 1e-4, 3, 0.2)
    again = dataclasses.replace(cfg, k=5)
    assert (again.sampling.k, again.kl.beta, again.optim.lr) == (5, 0.2, 1e-4)
    assert RLConfig(sampling=SamplingOptions(k=6), temperature=0.5).sampling == SamplingOptions(k=6, temperature=0.5)
    with pytest.raises(TypeError, match="no_such_option"):
        RLConfig(no_such_option=1)
    with pytest.raises(AttributeError, match="no_such_option"):
        cfg.no_such_option


REFUSED = [
    # (options, what the one-line error says)
    ({"overlong_penalty": 0.5}, "--overlong-penalty is only read with --overlong-buffer"),
    ({"overlong_penalty": 0.5, "overlong_buffer": 0}, "--overlong-penalty is only read with --overlong-buffer"),
    ({"repetition_penalty": -0.5}, "--repetition-penalty is only read with --repetition-limit"),
    ({"repetition_limit": 1}, "--repetition-limit must be >= 2"),
    ({"repetition_limit": 4, "repetition_penalty": 0.5}, "--repetition-penalty must be <= 0"),
    ({"curriculum_tau": 0.4}, "--curriculum-tau is only read with --curriculum sec"),
    ({"curriculum_alpha": 0.3}, "--curriculum-alpha is only read with --curriculum sec"),
    ({"is_cap": 2.0}, "--is-cap is only read with --is-correction"),
    ({"is_cap": 0.5, "is_correction": "token_truncate"}, "--is-cap must be >= 1"),
    ({"clip_high": 0.28}, "--clip-high is only read by a loss that clips .*--loss reinforce does not"),
    ({"clip_low": 0.1, "loss": "raft",
      "advantage": "raft"}, "--clip-low is only read by a loss that clips .*--loss raft does not"),
    ({"clip_low": 1.0, "loss": "ppo"}, r"--clip-low must lie in \(0, 1\)"),
    ({"clip_low": 1.5, "loss": "ppo"}, r"--clip-low must lie in \(0, 1\)"),
    ({"clip_low": 0.0, "loss": "ppo"}, r"--clip-low must lie in \(0, 1\)"),
    ({"max_staleness": 2}, "--max-staleness is only read with --replay-size"),
    ({"replay_size": -1}, "--replay-size must be >= 0"),
    ({"replay_size": 8, "loss": "topr", "max_staleness": 0}, "--max-staleness must be >= 1"),
    ({"replay_size": 8},
     "--replay-size trains on stale samples, whose importance ratio is unbounded under --loss reinforce"),
    ({"replay_size": 8, "loss": "raft",
      "advantage": "raft"}, "unbounded under --loss raft: use --loss topr or a loss that clips"),
    ({"replay_size": 8, "loss": "topr",
      "is_correction": "token_truncate"}, "--is-correction with --replay-size: the ratio"),
    ({"loss": "topr", "is_correction": "sequence_mask"}, "--is-correction with --loss topr: the ratio already divides"),
    ({"replay_size": 8, "loss": "ppo", "is_correction": "token_mask"}, "--is-correction with --replay-size"),
    # dead: the sampler stops a sample at its 5th identical line (--stop-repeats 5), so none repeats a line 6 times
    ({"repetition_limit": 6}, "--repetition-limit 6 can never act: --stop-repeats 5 stops a sample at its 5th "),
    ({"repetition_limit": 4, "stop_repeats": 3, "repetition_penalty": -0.5}, "--repetition-limit 4 can never act: "
     "--stop-repeats 3"),
    # the buffer holds --max-staleness x --prompts-per-step groups: 2 x 8 = 16
    ({"replay_size": 17, "max_staleness": 2, "loss": "topr"},
     r"--replay-size 17 can never be drawn: the buffer holds at most 16 groups \(--max-staleness 2 x"),
    ({"raft_threshold": 1.0}, "--raft-threshold is only read by --advantage raft; --advantage grpo selects no samples"),
    ({"beta": 0.0, "ref_model": "other"}, "--ref-model is only read with --beta > 0: --beta 0 loads no reference"),
    ({"beta": 0.0, "kl_mode": "loss"}, "--kl-mode is only read with --beta > 0"),
    ({"beta": 0.0, "kl_estimator": "k3"}, "--kl-estimator is only read with --beta > 0"),
    ({"eval_split": "test_prefs"}, r"--eval-split is only read with --prompts-data \(chat prompts\)"),
    ({"eval_prompts": 10}, "--eval-prompts is only read with --prompts-data"),
    ({"max_prompt_tokens": 256}, "--max-prompt-tokens is only read with --prompts-data"),
    ({"prompts_limit": 100}, "--prompts-limit is only read with --prompts-data"),
    ({"judge_timeout": 5.0}, r"--judge-timeout is only read with --reward remote \(the remote judge\)"),
    ({"base_url": "http://localhost:8000/v1"}, "--base-url is only read with --reward remote"),
    ({"eval_rows": "test"}, "--eval-rows test is only read with --data"),
]


@pytest.mark.parametrize("options, message", REFUSED)
def test_options_that_do_nothing_or_are_out_of_range_are_refused(options, message):
    with pytest.raises(OptionError, match=message):
        RLConfig(**options)


def test_the_same_options_are_accepted_where_they_are_read():
    RLConfig(overlong_buffer=16, overlong_penalty=0.5)
    RLConfig(repetition_limit=4, repetition_penalty=-0.5)
    RLConfig(curriculum="sec", curriculum_tau=0.4, curriculum_alpha=0.3)
    RLConfig(is_correction="token_truncate", is_cap=2.0)
    RLConfig(is_correction="sequence_mask", is_cap=1.0)
    RLConfig(loss="ppo", clip_low=0.1, clip_high=0.28)
    RLConfig(loss="raft++", advantage="raft", clip_high=0.3)
    RLConfig(loss="topr", replay_size=8, max_staleness=3)
    RLConfig(loss="ppo", replay_size=8)
    RLConfig(loss="raft++", advantage="raft", replay_size=8)
    RLConfig(loss="topr")  # TOPR alone: the behaviour ratio on fresh samples
    RLConfig(repetition_limit=5)  # = --stop-repeats: the looped samples hold their line 5 times, so it acts on them
    RLConfig(repetition_limit=8, stop_repeats=None)  # no loop stop: any limit can act
    RLConfig(repetition_limit=8, stop_repeats=8)
    RLConfig(loss="topr", replay_size=16, max_staleness=2)  # exactly what the buffer holds
    RLConfig(advantage="raft", loss="raft", raft_threshold=1.0)
    RLConfig(beta=0.01, kl_mode="loss", kl_estimator="k3", ref_model="other")
    RLConfig(beta=0.0, kl_mode="reward", kl_estimator="k1")  # the defaults, given
    RLConfig(prompts_data="prefs.jsonl", reward_model="rm", eval_split="test_prefs", eval_prompts=10, prompts_limit=100,
             max_prompt_tokens=256)
    RLConfig(prompts_data="prefs.jsonl", reward="remote", judge_timeout=5.0, base_url="http://localhost:8000/v1")
    RLConfig(data="rows.parquet", eval_rows="test")
    RLConfig(eval_at_start=False)  # harmless without --eval-every: not refused (bench/rl_step.py passes it)
    rloo_config()  # the defaults of every block are consistent, rloo's too
    # explicitly given at its default, an option is not "set": the same as leaving it out
    RLConfig(loss="reinforce", clip_low=0.2, clip_high=None, is_cap=3.0, curriculum_tau=1.0, overlong_penalty=1.0)


@pytest.mark.parametrize("args, message", [
    (["--overlong-penalty", "0.5"], "--overlong-penalty is only read with --overlong-buffer"),
    (["--repetition-penalty", "-0.5"], "--repetition-penalty is only read with --repetition-limit"),
    (["--repetition-limit", "1"], "--repetition-limit must be >= 2"),
    (["--repetition-limit", "3", "--repetition-penalty", "0.5"], "--repetition-penalty must be <= 0"),
    (["--curriculum-tau", "0.4"], "--curriculum-tau is only read with --curriculum sec"),
    (["--is-cap", "2"], "--is-cap is only read with --is-correction"),
    (["--clip-high", "0.28"], "--clip-high is only read by a loss that clips"),
    (["--loss", "ppo", "--clip-low", "1"], "--clip-low must lie in (0, 1)"),
    (["--is-correction", "token_mask", "--is-cap", "0.5"], "--is-cap must be >= 1"),
    (["--max-staleness", "2"], "--max-staleness is only read with --replay-size"),
    (["--replay-size", "8"], "--replay-size trains on stale samples"),
    (["--repetition-limit", "6"], "--repetition-limit 6 can never act: --stop-repeats 5"),
    (["--beta", "0", "--kl-estimator", "k3"], "--kl-estimator is only read with --beta > 0"),
    (["--max-steps", "100", "--ppo-epochs", "200000"], "--max-steps 100 x --ppo-epochs 200000 makes 20,000,000"),
])
@pytest.mark.parametrize("command", ["rl", "rloo"])
def test_the_command_line_refuses_them_in_one_line(capsys, tmp_path, monkeypatch, command, args, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([command, *args, "--dry-run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_compile_parses_and_dry_runs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["rl", "--compile", "--dry-run"])
    assert "compile" in capsys.readouterr().out


def test_rl_samples_stop_after_five_identical_lines_by_default():
    """The loop-stop default decided in docs/results/speed/loop_stop.md: RL sampling stops a sample at the 5th
    identical line; --stop-repeats changes it, None turns it off, and below 2 is refused."""
    from rlft.rl.sampling import sampling_params
    from rlft.validation import OptionError

    assert sampling_params(RLConfig()).stop_repeats == 5
    assert sampling_params(RLConfig(stop_repeats=None)).stop_repeats is None
    assert sampling_params(RLConfig(stop_repeats=3)).stop_repeats == 3
    with pytest.raises(OptionError, match="--stop-repeats"):
        RLConfig(stop_repeats=1)
