"""Reward functions by name, for recipes that pick one from the command line (``--reward``).

Every reward function has the signature ``fn(prompts, completions, ground_truths) -> list[float]``:
three equally long lists (the prompt text, the sampled completion text without the prompt, and a
per-example ground-truth dict such as ``CountdownTask.ground_truth()``), one float per triple.
"""

from __future__ import annotations

from collections.abc import Callable

from rlft.rewards.countdown import accuracy_completions, score_completions

RewardFunction = Callable[[list[str], list[str], list[dict]], list[float]]


def uppercase_start(prompts: list[str], completions: list[str], ground_truths: list[dict]) -> list[float]:
    """Toy reward for smoke tests: 1.0 if the completion's first non-space character is an uppercase
    letter, else 0.0. Ignores prompts and ground truths. A tiny random model learns it in a few
    dozen steps, which makes it a quick end-to-end check that a policy-gradient loop improves reward."""
    if not len(prompts) == len(completions) == len(ground_truths):
        raise ValueError(
            f"got {len(prompts)} prompts, {len(completions)} completions and {len(ground_truths)} ground truths")
    return [1.0 if text.lstrip()[:1].isupper() else 0.0 for text in completions]


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "countdown": score_completions,
    "countdown_accuracy": accuracy_completions,
    "uppercase_start": uppercase_start,
}
"""``countdown``: TinyZero's exact Countdown score (0 no answer / 0.1 wrong answer / 1 correct), see
:mod:`rlft.rewards.countdown`. ``countdown_accuracy``: the same without the format credit (0 / 1).
``uppercase_start``: the toy reward above.

Learned rewards are not functions of this registry: a local reward model
(:class:`rlft.rewards.reward_model.RewardModelScorer`) and a remote judge
(:class:`rlft.rewards.remote.RemoteRewardJudge`) score ``(prompt messages, response)`` pairs with
``score(prompts, responses) -> list[float]``; recipes wrap them (e.g. ``rlft.rl.rewards.make_reward``)."""


NEEDS_COUNTDOWN_TASK: frozenset[str] = frozenset({"countdown", "countdown_accuracy"})
"""The registry's rewards that read a Countdown task's ground truth (``target``, ``nums``): chat prompts
(``--prompts-data``) carry none, so recipes refuse these names there (``rlft.rl.rewards.make_reward``)."""


def get_reward_function(name: str, *, also: tuple[str, ...] = ()) -> RewardFunction:
    """``REWARD_FUNCTIONS[name]``; ValueError naming the choices (plus ``also``, the names a caller
    handles itself, such as ``"remote"``) for an unknown name."""
    if name not in REWARD_FUNCTIONS:
        raise ValueError(f"unknown reward {name!r}; choose from {sorted(REWARD_FUNCTIONS) + list(also)}")
    return REWARD_FUNCTIONS[name]
