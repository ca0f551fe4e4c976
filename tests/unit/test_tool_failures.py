"""scripts/studies/tool_failures.py: each failure class from a hand-written answer, and the file refusals."""

from __future__ import annotations

import json

import pytest

from rlft.rollout.tools import format_observation
from tests.conftest import load_script

tf = load_script("tool_failures")
NUMS, TARGET = [3, 5, 7], 22


@pytest.mark.parametrize("completion,score,kind", [
    (" 3*5=15, 15+7=22.</think>\n<answer>3 * 5 + 7</answer>", 1.0, "correct"),
    (" 3*7=21, 21+5=26, no.\n3*7=21, 21+5=26, no.", 0.0, "cut"),
    (" 3*5=15.</think>\n<answer>3 * 5</answer>", 0.1, "numbers"),
    (" 3*7=21, 21+5=22.</think>\n<answer>3 * 7 + 5</answer>", 0.1, "arithmetic"),  # 21 + 5 is not 22
    (" 3*7=21, 21+5=26.\nClosest: 3*7+5=26.</think>\n<answer>3 * 7 + 5</answer>", 0.1, "search"),
    # with a calculator: the observation's numbers are the tool's, not the model's arithmetic
    (' <tool_call>{"name":"calc","arguments":{"expression":"3*7+5"}}</tool_call>' + format_observation("26")
     + "Closest: 3*7+5=26.</think>\n<answer>3 * 7 + 5</answer>", 0.1, "search"),
])
def test_each_failure_class(completion, score, kind):
    assert tf.category(completion, score, NUMS, TARGET) == kind


def test_a_file_without_completions_is_refused(tmp_path, capsys):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"num_tasks": 1, "k": 1, "mode": "greedy", "mean_score": 0.0, "accuracy": 0.0,
                                "format_rate": 0.0, "pass_at_k": {"1": 0.0}, "mean_completion_tokens": 1.0,
                                "truncated_rate": 0.0, "task_scores": [[0.0]], "tasks": [{"nums": NUMS, "target": 22}],
                                "task_truncated": [[False]], "task_tokens": [[1]], "task_values": [[None]],
                                "task_certainty": [[None]]}))
    with pytest.raises(SystemExit) as exit_:
        tf.run_script(tf.main, [f"x={path}"], prog="tool_failures.py")
    assert exit_.value.code == 2 and "no completions" in capsys.readouterr().err
