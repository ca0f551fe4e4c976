"""Rewards of the RL loop: one object, chosen once, scoring ``(prompt, completion)`` pairs.

Three kinds: a rule function of :data:`rlft.rewards.registry.REWARD_FUNCTIONS` (Countdown's exact
score), a local reward model (:class:`~rlft.rewards.reward_model.RewardModelScorer`) or a remote
OpenAI-compatible judge (:class:`~rlft.rewards.remote.RemoteRewardJudge`). The record,
:class:`rlft.rl.records.Reward` (re-exported here), holds the function and its kind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlft.rewards.registry import NEEDS_COUNTDOWN_TASK, RewardFunction, get_reward_function
from rlft.rl.records import Reward, RolloutReward

__all__ = ["Reward", "RolloutReward", "make_reward"]

if TYPE_CHECKING:
    from rlft.rl.options import RewardOptions

log = logging.getLogger("rlft")


def make_reward(scoring: RewardOptions, reward_fn: RewardFunction | None = None, *, chat_prompts: bool = False,
                batch_size: int = 8, device: str = "auto", dtype: str = "auto") -> Reward:
    """The reward of the run, picked once from its reward block (never the whole config): ``reward_fn`` (an
    override) if given, else the reward model (``scoring.reward_model``: a
    :class:`~rlft.rewards.reward_model.RewardModelScorer` scoring ``batch_size`` replies at a time on ``device`` in
    ``dtype``, loaded here), else the remote judge (``scoring.reward == "remote"``), else the rule function
    ``scoring.reward``.

    Rule functions get ``(prompt texts, completions, ground truths)``; judges ``(prompt messages,
    completions)``.

    Raises:
        ValueError: a reward of :data:`~rlft.rewards.registry.NEEDS_COUNTDOWN_TASK` for ``chat_prompts``
            (``--prompts-data``: no Countdown answer).
    """
    if reward_fn is None and scoring.reward_model is not None:
        from rlft.rewards.reward_model import RewardModelScorer

        scorer = RewardModelScorer(scoring.reward_model, batch_size=batch_size, device=device, dtype=dtype)
        log.info("reward: reward model %s", scoring.reward_model)
        return Reward(lambda prompts, completions: scorer.score([p.messages for p in prompts], completions),
                      "reward_model")
    if reward_fn is None and scoring.reward == "remote":
        from rlft.rewards.remote import RemoteRewardJudge

        judge = RemoteRewardJudge(scoring.base_url, scoring.judge_model, api_key_env=scoring.api_key_env,
                                  timeout_s=scoring.judge_timeout, max_retries=scoring.judge_max_retries)
        log.info("reward: remote judge %s at %s", scoring.judge_model, scoring.base_url)
        return Reward(lambda prompts, completions: judge.score([p.messages for p in prompts], completions), "remote")
    if reward_fn is None:
        reward_fn = get_reward_function(scoring.reward, also=("remote",))
        if chat_prompts and scoring.reward in NEEDS_COUNTDOWN_TASK:
            raise ValueError("chat prompts (--prompts-data) have no Countdown answer: pass --reward-model, --reward "
                             "remote or a toy rule reward")
    fn = reward_fn
    return Reward(
        lambda prompts, completions: fn([p.text for p in prompts], completions, [p.ground_truth for p in prompts]),
        "rule")
