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
