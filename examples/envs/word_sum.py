"""Add numbers written in words, with an `add` tool: a user's environment with a tool, in one file.

The model may call <tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>; the observation
<tool_response>7</tool_response> comes back, and the rollout goes on until it answers "Answer: 7".

    rlft rl --env examples/envs/word_sum.py:WordSum --max-new-tokens 64 --max-turns 4
    rlft eval env --env examples/envs/word_sum.py:WordSum --model runs/rl/model
"""

import random
import re

from rlft.environment import Environment

NAMES = "zero one two three four five six seven eight nine ten eleven twelve".split()


def add(a: int, b: int) -> int:
    """The sum of two integers."""
    return int(a) + int(b)


class WordSum(Environment):
    """Prompt: two or three numbers in words; reward 1.0 for the exact sum on an "Answer:" line, 0.1 for an answer
    line that is wrong, 0.0 for none."""

    tools = {"add": add}
    max_turns = 4

    def rows(self, split):
        rng = random.Random({"train": 0, "validation": 1, "test": 2}[split])
        count = {"train": 200, "validation": 50, "test": 50}[split]
        rows = []
        for _ in range(count):
            numbers = [rng.randrange(13) for _ in range(rng.choice((2, 3)))]
            words = ", ".join(NAMES[n] for n in numbers)
            rows.append({"prompt": f"Add these numbers: {words}.\n", "numbers": numbers, "answer": sum(numbers)})
        return rows

    def reward(self, row, completion):
        answers = re.findall(r"Answer:\s*(-?\d+)", completion)
        if not answers:
            return 0.0
        return 1.0 if int(answers[-1]) == row["answer"] else 0.1
