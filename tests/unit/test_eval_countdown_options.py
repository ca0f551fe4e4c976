"""`rlft eval countdown` refuses, before any model is loaded or sampled: --mode sampled at temperature 0 (k copies of
the greedy answer), and a --select-reward-model that is missing or not a reward model (a causal LM would get a random
score head, reported as "reward model") (issue 46)."""

from __future__ import annotations

import pytest

from rlft.cli import main
from rlft.eval.countdown_command import EvalCountdownConfig, run_eval_countdown
from rlft.validation import OptionError
from tests.conftest import make_tiny_rm, save_model_dir

SELECT_RM = ["eval", "countdown", "--mode", "sampled", "--k", "4", "--select", "reward-model", "--select-reward-model"]


def cli(capsys, *args) -> tuple[int, str]:
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_sampled_mode_at_temperature_zero_is_refused(capsys):
    with pytest.raises(OptionError, match="--mode sampled needs --temperature > 0"):
        EvalCountdownConfig(mode="sampled", k=4, temperature=0.0)
    with pytest.raises(OptionError, match="--mode sampled needs --temperature > 0"):
        EvalCountdownConfig(mode="sampled", k=1, temperature=0.0)
    EvalCountdownConfig(mode="sampled", k=4, temperature=0.6)
    EvalCountdownConfig(mode="greedy")
    code, err = cli(capsys, "eval", "countdown", "--mode", "sampled", "--k", "4", "--temperature", "0", "--dry-run")
    assert code == 2 and "--mode sampled needs --temperature > 0" in err and err.count("\n") == 1, err


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, smol_tokenizer):
    return save_model_dir(tmp_path_factory.mktemp("rm"), make_tiny_rm(smol_tokenizer), smol_tokenizer)


def test_a_causal_lm_or_a_missing_folder_is_refused_at_parse_time(capsys, tmp_path, tiny_model_dir, rm_dir):
    code, err = cli(capsys, *SELECT_RM, tiny_model_dir, "--dry-run")
    assert code == 2 and f"--select-reward-model {tiny_model_dir} is not a reward model" in err and err.count(
        "\n") == 1, err
    code, err = cli(capsys, *SELECT_RM, "smollm2-135m", "--dry-run")  # the built-in causal LM
    assert code == 2 and "is not a reward model" in err, err
    for missing in (tmp_path / "no-rm", "runs/rm/model", "rm"):
        code, err = cli(capsys, *SELECT_RM, missing, "--dry-run")
        assert code == 2 and f"--select-reward-model {missing}: no such folder" in err and err.count("\n") == 1, err
    code, err = cli(capsys, *SELECT_RM, tmp_path, "--dry-run")  # a folder, but no model in it
    assert code == 2 and "not a loadable model folder" in err, err
    code, err = cli(capsys, *SELECT_RM, rm_dir, "--dry-run")
    assert code == 0, err


def test_run_refuses_it_before_loading_or_sampling(tiny_model_dir, monkeypatch):
    import rlft.models as models
    import rlft.rollout.engines as engines

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded or sampled before the reward model was checked")

    monkeypatch.setattr(engines, "make_engine", never)
    monkeypatch.setattr(models, "load_tokenizer", never)
    cfg = EvalCountdownConfig(model=str(tiny_model_dir), mode="sampled", k=2, limit=2, device="cpu",
                              select=("reward-model",), select_reward_model=str(tiny_model_dir))
    with pytest.raises(OptionError, match="is not a reward model"):
        run_eval_countdown(cfg)
