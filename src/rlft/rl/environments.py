"""A user's environment (``--env path/to/file.py:ClassName``, :class:`rlft.environment.Environment`) as the RL loop's
reward and prompt source: its rows become :class:`~rlft.rl.records.RLPrompt` records (the row is the ground truth the
reward and the tools receive), its ``reward`` the loop's :class:`~rlft.rl.records.Reward`, its tools the rollouts'
:class:`~rlft.rollout.turns.ToolUse`, and its held-out rows the in-loop evaluation (:func:`rlft.eval.environment.
evaluate_env`). The built-in environments (countdown, countdown-calc, chat) are built by :mod:`rlft.rl.prompts` and
:mod:`rlft.rl.rewards` from their options, as before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlft.environment import Environment, env_reward, env_rows, is_user_env, load_environment
from rlft.eval.environment import evaluate_env, row_prompt
from rlft.options import EnvOptions
from rlft.rl.prompts import PromptSource, evaluate_sharded
from rlft.rl.records import Reward, RLPrompt
from rlft.rollout.base import SamplingParams
from rlft.rollout.turns import tool_use_for

if TYPE_CHECKING:
    from rlft.rl.config import RLConfig

log = logging.getLogger("rlft")


def load_user_env(options: EnvOptions) -> Environment | None:
    """The user's environment that ``--env`` names (loaded from its file), or None for a built-in one.

    Raises:
        ValueError: see :func:`rlft.environment.load_environment`."""
    return load_environment(options.env) if is_user_env(options.env) else None


def environment_reward(env: Environment) -> Reward:
    """``env.reward`` as the loop's reward: ``fn(prompts, completions)`` calls it on each prompt's row."""

    def fn(prompts: list[RLPrompt], completions: list[str]) -> list[float]:
        return [env_reward(env, p.ground_truth, c, i) for i, (p, c) in enumerate(zip(prompts, completions))]

    return Reward(fn, "rule")


def rendered(env: Environment, split: str, tokenizer) -> list[RLPrompt]:
    """The rows of ``split`` as prompts: a text prompt as it is, a list of messages through the tokenizer's chat
    template (:func:`rlft.data.chat.render_generation_prompt`)."""
    prompts = []
    for row in env_rows(env, split):
        prompt = row["prompt"]
        prompts.append(RLPrompt(row_prompt(row, tokenizer), None if isinstance(prompt, str) else prompt, row))
    return prompts


def environment_source(env: Environment, cfg: RLConfig, tokenizer, reward: Reward) -> PromptSource:
    """The loop's prompt source of a user's environment: its ``train`` rows; with ``--eval-every``, the first
    ``--eval-limit`` rows of ``--eval-rows`` (validation or test), evaluated greedily with its tools (``eval/reward``,
    ``eval/solved``, ``eval/truncated_frac``, ``eval/tool_calls``, ``eval/tool_errors``).

    Raises:
        ValueError: no training rows; a malformed row (naming it).
    """
    name = type(env).__name__
    train = rendered(env, "train", tokenizer)
    if not train:
        raise ValueError(f"{name}.rows('train') returned no rows")
    held = rendered(env, cfg.eval_rows, tokenizer)[: cfg.eval_limit] if cfg.eval_every else []
    if cfg.eval_every and not held:
        log.warning("%s has no %s rows: no in-loop evaluation", name, cfg.eval_rows)
    tool_use = tool_use_for(env.tools, cfg.environment, env.max_turns)  # its own max_turns, else --max-turns
    log.info("environment %s: %d training rows, %d held-out %s rows, %s", name, len(train), len(held), cfg.eval_rows,
             f"tools {', '.join(tool_use.tools)} (at most {tool_use.max_turns} turns)" if tool_use else "no tools")
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=cfg.eval_max_new_tokens)

    def evaluate(engine) -> dict[str, float]:
        def part(indices: list[int]) -> dict[str, float]:
            chosen = [held[i] for i in indices]
            return evaluate_env(engine, env, [p.ground_truth for p in chosen], [p.text for p in chosen], params,
                                tool_use).metrics()

        return evaluate_sharded(engine, len(held), part, params) if held else {}

    return PromptSource(train, held, evaluate, "env", tool_use)
