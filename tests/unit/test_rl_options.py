"""rlft.rl.options: RLConfig's option blocks, and the options ``rlft rl`` refuses because they would do nothing in the
chosen setup (or are out of range), at parse time, as one line with exit code 2."""

from __future__ import annotations

import dataclasses

import pytest

from rlft.cli import main
from rlft.options import SpeedOptions
from rlft.rl.config import RLConfig, rloo_config
from rlft.rl.options import (ChatPromptOptions, CurriculumOptions, GroupFilterOptions, ImportanceOptions, InLoopEvalOptions,
                             KLOptions, PolicyLossOptions, ReplayOptions, RewardOptions, SamplingOptions, ShapingOptions)
from rlft.tasks.countdown.options import CountdownTrainingOptions
from rlft.validation import OptionError

BLOCKS = (SamplingOptions, PolicyLossOptions, KLOptions, ImportanceOptions, GroupFilterOptions, CurriculumOptions,
          ShapingOptions, InLoopEvalOptions, ChatPromptOptions, RewardOptions, CountdownTrainingOptions, SpeedOptions,
          ReplayOptions)


def test_rl_config_is_its_blocks():
    for block in BLOCKS:
        assert issubclass(RLConfig, block)
    own = set(RLConfig.__dict__["__annotations__"])
    from_blocks = {f.name for block in BLOCKS for f in dataclasses.fields(block)}
    assert not own & from_blocks  # a field lives in one place
    # the 84 options of 2026-11-27, --compile, --repetition-limit/-penalty, --replay-size, --max-staleness,
    # --max-tokens-per-micro-batch
    assert len(dataclasses.fields(RLConfig)) == 91
    assert RLConfig().compile is False and RLConfig(compile=True).compile is True


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
    ({"clip_low": 0.1, "loss": "raft", "advantage": "raft"}, "--clip-low is only read by a loss that clips .*--loss raft does not"),
    ({"clip_low": 1.0, "loss": "ppo"}, r"--clip-low must lie in \(0, 1\)"),
    ({"clip_low": 1.5, "loss": "ppo"}, r"--clip-low must lie in \(0, 1\)"),
    ({"clip_low": 0.0, "loss": "ppo"}, r"--clip-low must lie in \(0, 1\)"),
    ({"max_staleness": 2}, "--max-staleness is only read with --replay-size"),
    ({"replay_size": -1}, "--replay-size must be >= 0"),
    ({"replay_size": 8, "loss": "topr", "max_staleness": 0}, "--max-staleness must be >= 1"),
    ({"replay_size": 8}, "--replay-size trains on stale samples, whose importance ratio is unbounded under --loss reinforce"),
    ({"replay_size": 8, "loss": "raft", "advantage": "raft"}, "unbounded under --loss raft: use --loss topr or a loss that clips"),
    ({"replay_size": 8, "loss": "topr", "is_correction": "token_truncate"}, "--is-correction with --replay-size: the ratio"),
    ({"loss": "topr", "is_correction": "sequence_mask"}, "--is-correction with --loss topr: the ratio already divides"),
    ({"replay_size": 8, "loss": "ppo", "is_correction": "token_mask"}, "--is-correction with --replay-size"),
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
