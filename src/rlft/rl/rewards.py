"""Rewards of the RL loop: one object, chosen once, scoring ``(prompt, completion)`` pairs.

Three kinds: a rule function of :data:`rlft.rewards.registry.REWARD_FUNCTIONS` (Countdown's exact
score), a local reward model (:class:`~rlft.rewards.reward_model.RewardModelScorer`) or a remote
OpenAI-compatible judge (:class:`~rlft.rewards.remote.RemoteRewardJudge`). The record,
:class:`rlft.rl.records.Reward` (re-exported here), holds the function and its kind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlft.rewards.registry import RewardFunction, get_reward_function
from rlft.rl.records import Reward, RolloutReward

__all__ = ["Reward", "RolloutReward", "make_reward"]

if TYPE_CHECKING:
    from rlft.rl.config import RLConfig

log = logging.getLogger("rlft")

def make_reward(cfg: RLConfig, reward_fn: RewardFunction | None = None) -> Reward:
    """The reward of the run, picked once: ``reward_fn`` (an override) if given, else the reward model
    (``cfg.reward_model``: a :class:`~rlft.rewards.reward_model.RewardModelScorer`, loaded here), else the
    remote judge (``cfg.reward == "remote"``), else the rule function ``cfg.reward``.

    Rule functions get ``(prompt texts, completions, ground truths)``; judges ``(prompt messages,
    completions)``.
    """
    if reward_fn is None and cfg.reward_model is not None:
        from rlft.rewards.reward_model import RewardModelScorer

        scorer = RewardModelScorer(cfg.reward_model, batch_size=cfg.micro_batch_size, device=cfg.device,
                                   dtype=cfg.dtype)
        log.info("reward: reward model %s", cfg.reward_model)
        return Reward(lambda prompts, completions: scorer.score([p.messages for p in prompts], completions),
                      "reward_model")
    if reward_fn is None and cfg.reward == "remote":
        from rlft.rewards.remote import RemoteRewardJudge

        judge = RemoteRewardJudge(cfg.base_url, cfg.judge_model, api_key_env=cfg.api_key_env,
                                  timeout_s=cfg.judge_timeout, max_retries=cfg.judge_max_retries)
        log.info("reward: remote judge %s at %s", cfg.judge_model, cfg.base_url)
        return Reward(lambda prompts, completions: judge.score([p.messages for p in prompts], completions), "remote")
    if reward_fn is None:
        reward_fn = get_reward_function(cfg.reward, also=("remote",))
        if cfg.prompts_data is not None and cfg.reward == "countdown":
            raise ValueError(
                "chat prompts (--prompts-data) have no Countdown answer: pass --reward-model, --reward remote or a toy rule reward"
            )
    fn = reward_fn
    return Reward(
        lambda prompts, completions: fn([p.text for p in prompts], completions, [p.ground_truth for p in prompts]),
        "rule")
