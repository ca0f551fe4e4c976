"""Evaluating any environment (:mod:`rlft.environment`): rollouts on a split's rows, scored by the environment's own
reward; ``rlft eval env`` and the RL loop's in-loop evaluation of a user's environment.

Shape legend: B rows, k samples per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlft.environment import Environment, env_reward
from rlft.rollout.base import GenerationEngine, SamplingParams
from rlft.rollout.turns import ToolUse


@dataclass
class EnvEvalResult:
    """One evaluation of an environment: its means over all rows x samples, and the per-row lists."""

    num_rows: int
    k: int
    mean_reward: float
    """Mean reward over every row x sample."""
    solved_rate: float
    """Share of samples whose reward is at least 1 (the usual "correct" of a 0/1 reward)."""
    truncated_rate: float
    """Share of samples cut at the token budget (or by the loop stop, or the turn budget)."""
    tool_calls_per_answer: float
    tool_errors_per_answer: float
    mean_model_tokens: float
    """Mean tokens the model wrote per sample (observations not counted)."""
    row_rewards: list[list[float]] = field(default_factory=list)
    """``(B, k)``: each sample's reward, rows in the split's order."""
    row_tool_calls: list[list[int]] = field(default_factory=list)
    """``(B, k)``: each sample's tool calls."""
    examples: list[dict] = field(default_factory=list)
    """The first rows' prompt and first completion."""

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The means as a metrics record (``eval/reward``, ``eval/solved``, ``eval/truncated_frac``, and with tools
        ``eval/tool_calls``, ``eval/tool_errors``)."""
        out = {f"{prefix}reward": self.mean_reward, f"{prefix}solved": self.solved_rate,
               f"{prefix}truncated_frac": self.truncated_rate}
        if any(map(any, self.row_tool_calls)):
            out |= {f"{prefix}tool_calls": self.tool_calls_per_answer,
                    f"{prefix}tool_errors": self.tool_errors_per_answer}
        return out


def row_prompt(row: dict, tokenizer) -> str:
    """The text a row's ``prompt`` gives the policy: a string as it is, a list of messages through the tokenizer's own
    chat template (:func:`rlft.data.chat.render_generation_prompt`; a tokenizer with none is refused, one line)."""
    if isinstance(row["prompt"], str):
        return row["prompt"]
    from rlft.data.chat import ensure_chat_template, render_generation_prompt

    ensure_chat_template(tokenizer, None)
    return render_generation_prompt(tokenizer, row["prompt"])


def evaluate_env(engine: GenerationEngine, env: Environment, rows: list[dict], prompts: list[str],
                 params: SamplingParams, tool_use: ToolUse | None = None, *, num_examples: int = 3) -> EnvEvalResult:
    """``params.k`` rollouts of each row's rendered prompt (``prompts[b]``, with ``tool_use``'s tools, each row its
    tools' context), each scored by ``env.reward(row, completion)``.

    Raises:
        ValueError: no rows, ``len(rows) != len(prompts)``, or a reward that is not a finite number (naming the row).
    """
    if not rows:
        raise ValueError(f"{type(env).__name__}: no rows to evaluate")
    if len(rows) != len(prompts):
        raise ValueError(f"{len(rows)} rows but {len(prompts)} prompts")
    if tool_use is None:
        samples = engine.generate(prompts, params)
    else:
        samples = engine.generate(prompts, params, tool_use=tool_use, contexts=rows)
    rewards = [[env_reward(env, row, s.text, b) for s in row_samples]
               for b, (row, row_samples) in enumerate(zip(rows, samples))]
    flat = [s for row in samples for s in row]
    n = len(flat)
    return EnvEvalResult(
        num_rows=len(rows), k=params.k, mean_reward=sum(map(sum, rewards)) / n,
        solved_rate=sum(x >= 1.0 for row in rewards for x in row) / n,
        truncated_rate=sum(s.finish_reason == "length" for s in flat) / n,
        tool_calls_per_answer=sum(s.tool_calls for s in flat) / n,
        tool_errors_per_answer=sum(s.tool_errors for s in flat) / n,
        mean_model_tokens=sum(s.model_tokens for s in flat) / n, row_rewards=rewards,
        row_tool_calls=[[s.tool_calls for s in row] for row in samples],
        examples=[{"prompt": p[-200:], "completion": row[0].text, "reward": r[0]}
                  for p, row, r in list(zip(prompts, samples, rewards))[:num_examples]])
