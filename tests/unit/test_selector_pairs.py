"""scripts/selector_pairs.py on a fake evaluation: one selector's pick minus another's, task by task, by hand."""

from __future__ import annotations

import json
import math
import re

import pytest

from rlft.eval.countdown import CountdownEvalResult
from rlft.lab.script_io import ScriptError
from tests.conftest import load_script

Z = 1.959963984540054


def write(path, **extra) -> str:
    """3 tasks x 2 samples: scores (.1, 1), (1, .1), (0, 1); answer values (5, 9), (3, 4), (unparsable, 7)."""
    result = CountdownEvalResult(num_tasks=3, k=2, mode="sampled", mean_score=0.0, accuracy=0.0, format_rate=0.0,
                                 pass_at_k={1: 0.0}, mean_completion_tokens=0.0, truncated_rate=0.0,
                                 task_scores=[[0.1, 1.0], [1.0, 0.1], [0.0, 1.0]], task_tokens=[[5, 5]] * 3,
                                 task_values=[[5.0, 9.0], [3.0, 4.0], [None, 7.0]], task_certainty=[[None] * 2] * 3,
                                 tasks=[{"nums": [1, 2], "target": t} for t in (3, 4, 5)], **extra)
    path.write_text(json.dumps(result.to_dict()))
    return str(path)


def test_reward_model_minus_majority_and_oracle_at_n2_by_hand(tmp_path, capsys):
    """n=2. Majority: every value has one vote, ties go to the first voter: samples 0, 0 and 1 (the unparsable one
    does not vote) -> (.1, 1, 1). Oracle: (1, 1, 1). Reward model (scores (.2, .9), (.5, .1), (.3, .1)): samples 1, 0, 0
    -> (1, 1, 0). Minus majority: (.9, 0, -1), mean -1/30, 1 better / 1 worse; minus oracle: (0, 0, -1)."""
    m = load_script("selector_pairs")
    path = write(tmp_path / "s.json", task_rm_scores=[[0.2, 0.9], [0.5, 0.1], [0.3, 0.1]])
    rows = m.pairs(path, "reward-model", ["majority", "oracle"], [2])
    assert m.pairs(path, "reward-model", ["majority", "oracle"]) == m.pairs(path, "reward-model",
                                                                            ["majority", "oracle"], [1, 2])
    assert [(r["n"], r["b"]) for r in rows] == [(2, "majority"), (2, "oracle")]
    d = [0.9, 0.0, -1.0]
    mean = sum(d) / 3
    half = Z * math.sqrt(sum((x - mean) ** 2 for x in d) / 2) / math.sqrt(3)
    assert rows[0]["a_score"] == pytest.approx(2 / 3) and rows[0]["b_score"] == pytest.approx(0.7)
    assert rows[0]["diff"] == pytest.approx(mean) and rows[0]["ci_high"] == pytest.approx(mean + half)
    assert (rows[0]["better"], rows[0]["worse"]) == (1, 1)
    assert rows[1]["diff"] == pytest.approx(-1 / 3) and (rows[1]["better"], rows[1]["worse"]) == (0, 1)
    m.main([path, "--b", "majority", "--sizes", "2"])
    assert (f"n= 2 reward-model 0.667 minus majority 0.700: {mean:+.3f} "
            f"[{mean - half:+.3f}, {mean + half:+.3f}] (1 / 1)" in capsys.readouterr().out)


def test_a_file_without_what_a_selector_needs_is_refused(tmp_path):
    m = load_script("selector_pairs")
    path = write(tmp_path / "s.json")
    with pytest.raises(ScriptError, match="s.json: reward-model: no reward-model scores"):
        m.pairs(path, "reward-model", ["majority"], [2])
    with pytest.raises(ScriptError, match="self-certainty: the engine reported no self-certainty"):
        m.pairs(path, "majority", ["self-certainty"], [2])


def test_sizes_below_1_or_above_k_are_one_line_errors_with_exit_2(tmp_path, capsys):
    """k=2: --sizes 4 (or 4 8 16: every value past k) drew nothing and exited 0; --sizes 0 was a traceback. Both are
    refused, naming the option, as is a file that is not an evaluation."""
    m = load_script("selector_pairs")
    path = write(tmp_path / "s.json")
    (tmp_path / "cut.json").write_text('{"num_tasks": 3, "k": 2, "task_sc')
    cases = [([path, "--a", "majority", "--b", "oracle", "--sizes", "4", "8",
               "16"], "--sizes 4 8 16: .*s.json has 2 samples per task"),
             ([path, "--a", "majority", "--b", "oracle", "--sizes", "1", "4"], "--sizes 4: "),
             ([path, "--a", "majority", "--b", "oracle", "--sizes", "0"], "--sizes must be >= 1, got 0"),
             ([str(tmp_path / "cut.json"), "--a", "majority", "--b",
               "oracle"], "cut.json: not an `rlft eval countdown` JSON")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            m.run_script(m.main, argv, prog="selector_pairs.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("selector_pairs.py: error: "), err
        assert re.search(message, err), (message, err)
