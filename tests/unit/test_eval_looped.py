"""rlft.eval.countdown records which samples the loop stop ended (``task_looped``, ``looped_rate``)."""

from __future__ import annotations

import json

from rlft.eval.countdown import CountdownEvalResult, evaluate_countdown, merge_samples
from rlft.rollout.base import Sample, SamplingParams
from rlft.types import CountdownTask

TASKS = [CountdownTask((3, 5), 8), CountdownTask((2, 7), 14)]
PROMPTS = [
    f"User: Using the numbers [{t.nums[0]}, {t.nums[1]}], create an equation that equals {t.target}.\n"
    "Assistant: <think>"
    for t in TASKS
]
CORRECT = {8: " 3+5=8.</think>\n<answer>3 + 5</answer>", 14: " 2*7=14.</think>\n<answer>2 * 7</answer>"}
LOOP = " 3+5=8, no.\n3+5=8, no.\n3+5=8, no.\n"


class Engine:
    """Sample 0 of each task answers correctly; sample 1 of task 0 was ended by the loop stop."""

    def generate(self, prompts, params: SamplingParams):
        out = []
        for b, task in enumerate(TASKS):
            row = [Sample([1, 2, 0], CORRECT[task.target], "stop")]
            if params.k > 1:
                looped = b == 0
                row.append(
                    Sample([5] * 12, LOOP, "length", looped=looped
                           ) if looped else Sample([1, 0], CORRECT[task.target], "stop"))
            out.append(row)
        return out


def test_looped_samples_are_recorded_beside_truncated():
    result = evaluate_countdown(Engine(), TASKS, PROMPTS, SamplingParams(k=2, temperature=1.0))
    assert result.task_looped == [[False, True], [False, False]]
    assert result.task_truncated == [[False, True], [False, False]]  # looped rows count as truncated too
    assert result.looped_rate == 0.25 and result.truncated_rate == 0.25
    assert result.task_scores == [[1.0, 0.0], [1.0, 1.0]]  # a looped row has no answer
    again = CountdownEvalResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.task_looped == result.task_looped and again.looped_rate == 0.25
    merged = merge_samples([result, result])
    assert merged.task_looped == [[False, True, False, True], [False, False, False, False]
                                  ] and merged.looped_rate == 0.25


def test_files_without_the_fields_still_load_and_merge():
    old = evaluate_countdown(Engine(), TASKS, PROMPTS, SamplingParams(k=2, temperature=1.0)).to_dict()
    del old["task_looped"], old["looped_rate"]
    result = CountdownEvalResult.from_dict(old)
    assert result.task_looped == [] and result.looped_rate == 0.0
    merged = merge_samples([result, CountdownEvalResult.from_dict(old)])
    assert merged.task_looped == [] and merged.looped_rate == 0.0
