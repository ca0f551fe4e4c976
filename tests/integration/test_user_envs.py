"""A user's environment, written outside rlft, trained and evaluated through `--env path/file.py:Class` (the examples
in examples/envs/), and the errors of an environment that cannot be used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlft.checkpoint import read_metrics
from rlft.cli import main
from tests.conftest import ROOT, save_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")

RL = ["--k", "2", "--prompts-per-step", "4", "--max-steps", "3", "--lr", "1e-3", "--beta", "0", "--save-every", "0",
      "--device", "cpu", "--dtype", "float32", "--gen-batch-size", "8", "--eval-every", "3", "--eval-limit", "4"]


def user_copy(tmp_path: Path, name: str) -> Path:
    """The example copied into a folder of the user's, away from rlft's tree."""
    folder = tmp_path / "my_task"
    folder.mkdir(exist_ok=True)
    return Path(shutil.copy(ROOT / "examples" / "envs" / name, folder / name))


def test_reverse_trains_and_evaluates_from_a_user_file(tiny_model_dir, tmp_path):
    env = f"{user_copy(tmp_path, 'reverse.py')}:Reverse"
    out = tmp_path / "rl"
    main(["rl", "--env", env, "--model", str(tiny_model_dir), "--output-dir", str(out), "--max-new-tokens", "8", *RL])
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records if "reward/mean" in r] == [1, 2, 3]
    assert {"eval/reward", "eval/solved", "eval/truncated_frac"} <= set(records[-1])
    assert "tools/calls" not in records[-1]  # no tools: one turn
    report = tmp_path / "eval.json"
    main(["eval", "env", "--env", env, "--model", str(out / "model"), "--max-new-tokens", "8", "--output", str(report),
          "--device", "cpu"])
    result = json.loads(report.read_text())
    assert result["num_rows"] == 6 and len(result["row_rewards"]) == 6 and result["config"]["env"] == env


def test_word_sum_with_a_tool_trains_and_evaluates(tool_model, smol_tokenizer, tmp_path):
    # a tiny model that learned to call `add` (tests/tool_model.py) calls it on WordSum's prompts too
    model_dir = save_model_dir(tmp_path / "caller", tool_model, smol_tokenizer)
    env = f"{user_copy(tmp_path, 'word_sum.py')}:WordSum"
    out = tmp_path / "rl"
    main(["rl", "--env", env, "--model", str(model_dir), "--output-dir", str(out), "--max-new-tokens", "40",
          "--temperature", "0.7", *RL])
    records = [r for r in read_metrics(out / "metrics.jsonl") if "reward/mean" in r]
    assert len(records) == 3 and sum(r["tools/calls"] for r in records) > 0
    assert all(r["tools/observation_tokens"] >= 0 for r in records)
    report = tmp_path / "eval.json"
    main(["eval", "env", "--env", env, "--model", str(out / "model"), "--max-new-tokens", "40", "--limit", "8",
          "--output", str(report), "--device", "cpu"])
    result = json.loads(report.read_text())
    assert result["num_rows"] == 8 and result["tool_calls_per_answer"] > 0
    # on-policy pairs of the environment, scored by its reward, DPO-ready
    pairs = tmp_path / "pairs.jsonl"
    main(["pairs", "env", "--env", env, "--model", str(model_dir), "--num-prompts", "8", "--num-samples", "4",
          "--temperature", "1.0", "--max-new-tokens", "40", "--output", str(pairs), "--device", "cpu"])
    stats = json.loads(pairs.with_suffix(".stats.json").read_text())
    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    assert stats["prompts"] == 8 and stats["kept"] == len(rows) and stats["tool_calls_per_sample"] > 0
    assert all(r["score_chosen"] > r["score_rejected"] for r in rows)


@pytest.mark.parametrize("body,error", [
    ("", "defines no class Task"),
    ("class Task:\n    pass\n", "must subclass rlft.environment.Environment"),
    ("from rlft.environment import Environment\nclass Task(Environment):\n    def rows(self, split):\n"
     "        return []\n", "does not define reward()"),
    ("raise RuntimeError('boom')\n", "importing"),
    ("from rlft.environment import Environment\nclass Task(Environment):\n    def rows(self, split):\n"
     "        return [{'question': 'x'}]\n    def reward(self, row, completion):\n        return 1.0\n",
     "rows('train'), row 0: needs a 'prompt'"),
])
def test_unusable_environment_is_one_line(tmp_path, tiny_model_dir, capsys, body, error):
    path = tmp_path / "task.py"
    path.write_text(body)
    with pytest.raises(SystemExit) as exit_:
        main(["rl", "--env", f"{path}:Task", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "o"), *RL])
    assert exit_.value.code in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and error in err[0], err


def test_env_options_refused_at_parse_time(capsys, tmp_path):
    for argv, error in ((["rl", "--env", "nope.py:X"], "no file nope.py"),
                        (["rl", "--env", "chat"], "--env chat needs --prompts-data"),
                        (["rl", "--env", "countdown-calc", "--rollout-engine", "vllm"], "cannot pause a row"),
                        (["eval", "env"], "needs --env")):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--output-dir", str(tmp_path / "o")] if argv[0] == "rl" else argv)
        assert exit_.value.code == 2
        assert error in capsys.readouterr().err

