"""Reverse a word, checked exactly: a user's environment for rlft in one file (no tools, one turn).

    rlft rl --env examples/envs/reverse.py:Reverse --max-new-tokens 16 --max-steps 20
    rlft eval env --env examples/envs/reverse.py:Reverse --model runs/rl/model
"""

import random

from rlft.environment import Environment

WORDS = ("apple river stone cloud green tiger piano lemon chair bread night ocean plant music light sugar paper "
         "honey storm grape money horse smile dream water earth glass knife spoon queen").split()


class Reverse(Environment):
    """Prompt: a word; reward 1.0 when the completion's first line is the word reversed, else 0.0."""

    def rows(self, split):
        rng = random.Random({"train": 0, "validation": 1, "test": 2}[split])
        held = set(WORDS[-6:])  # the last six words never appear in training prompts
        words = [w for w in WORDS if (w in held) == (split != "train")]
        rows = []
        for word in words * (4 if split == "train" else 1):
            word = word if rng.random() < 0.5 else word.upper()
            rows.append({"prompt": f"Reverse the word.\nWord: {word}\nReversed:", "answer": word[::-1]})
        return rows

    def reward(self, row, completion):
        first_line = completion.strip().split("\n")[0].strip()
        return float(first_line == row["answer"])
