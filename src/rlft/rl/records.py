"""Records the RL loop's parts hand each other: a prompt (:class:`RLPrompt`), the reward (:class:`Reward`), one
sampled step (:class:`StepSamples`, what :func:`rlft.rl.sampling.sample_step` returns and the loop reads) and what one
update did (:class:`StepUpdate`).

A leaf of :mod:`rlft.rl`: it imports nothing from it, so the prompt sources, the rewards, the curriculum, sampling
and the metrics all import their records from here without a cycle (``rl/config`` imports ``rl/curriculum``, which
imports only this module).

Shape legend: B kept groups (prompts) of the step on every rank together, k samples per prompt, G >= B groups tried,
N = ``len(local) * k`` rows of this rank's batch, T tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from rlft.rollout.base import Sample
from rlft.types import TokenBatch


@dataclass(frozen=True)
class RLPrompt:
    """One RL prompt: the text the policy continues, and what its reward needs."""

    text: str
    """The prompt string given to the sampler (a rendered Countdown prompt or chat generation prompt)."""
    messages: list[dict] | None = None
    """Chat track: the conversation before the reply (what a reward model scores the reply against)."""
    ground_truth: dict | None = None
    """What a rule reward gets as its ground truth: ``CountdownTask.ground_truth()``; on the chat track
    ``{"messages": messages}``."""


RolloutReward = Callable[[list[RLPrompt], list[str]], list[float]]
"""``reward(prompts, completions) -> one raw reward per (prompt, completion)``."""


@dataclass(frozen=True)
class Reward:
    """A reward the loop calls as ``fn(prompts, completions) -> list[float]`` (one raw reward each); built once by
    :func:`rlft.rl.rewards.make_reward`."""

    fn: RolloutReward
    kind: Literal["rule", "reward_model", "remote"]
    """'rule': a function of :data:`~rlft.rewards.registry.REWARD_FUNCTIONS` or an override (accuracy and
    format-rate metrics make sense); else a learned judge's scores."""


@dataclass
class StepSamples:
    """One step's sampled groups: their rewards, this rank's batch and what sampling them cost.

    ``B`` counts the step's kept groups on every rank together; under torchrun a rank holds the prompts, samples
    and batch rows of its own groups only (``local``), but every rank knows the rewards of all ``B``."""

    prompts: list[RLPrompt]
    """This rank's kept prompts (all ``B`` in one process), in the order of ``local``."""
    samples: list[list[Sample]]
    """Their lists of ``k`` samples."""
    local: list[int]
    """Positions in ``0..B-1`` of this rank's groups (``range(B)`` in one process)."""
    raw: torch.Tensor
    """``(B, k)`` raw rewards of the kept groups."""
    shaped: torch.Tensor
    """``(B, k)`` the rewards the advantages start from: ``raw`` after the repetition rule, plus the truncation penalty
    and DAPO's overlong punishment, when they are on (:func:`rlft.rl.shaping.shaped_rewards`, computed once, by
    sampling; the loop
    subtracts the KL from them with ``--kl-mode reward``). ``--filter-groups`` keeps the groups these vary in."""
    truncated: torch.Tensor
    """``(B, k)`` 1.0 where a sample hit max_new_tokens without EOS."""
    lengths: torch.Tensor
    """``(B, k)`` completion lengths in the model's own tokens (EOS included; a rollout's observations not counted),
    float."""
    all_raw: torch.Tensor
    """``(G, k)`` raw rewards of every group sampled this step (G >= B)."""
    tried: list[int]
    """``(G,)`` the training-prompt index of every group sampled this step (every rank's), in sampling order."""
    kept: list[int]
    """``(B,)`` positions in ``tried`` of the kept groups, in the order of ``raw``."""
    generate_s: float
    """Seconds this rank spent generating."""
    generated_tokens: int = 0
    """Completion tokens this rank generated this step (every tried group of its shard, EOS included)."""
    batch: TokenBatch | None = None
    """This rank's right-padded teacher-forcing batch on the CPU (``(N, T)``; row ``b * k + j`` is
    ``samples[b][j]``, prompt ids as the sampler tokenized them: :func:`rlft.rl.batch.rollout_batch`); None when
    :func:`~rlft.rl.sampling.sample_step` was given no tokenizer."""
    repeated: torch.Tensor | None = None
    """``(B, k)`` 1.0 where a sample writes one identical line ``--repetition-limit`` times or more
    (:func:`rlft.rl.shaping.repeated_samples`; all 0 when the option is off); None: a record built without it."""
    hints: dict[str, float] = field(default_factory=dict)
    hinted: list[int] = field(default_factory=list)
    """``--hint solver``: positions in ``tried`` of the groups sampled again with a solver prefix (their own k samples
    all failed; ``all_raw`` holds the hinted samples' rewards)."""
    """``--hint solver``: the step's ``hint/*`` metrics (:func:`rlft.rl.hints.hint_metrics`); empty without hints."""

    @property
    def groups(self) -> int:
        """B: the kept groups of the step, every rank's."""
        return self.raw.shape[0]

    @property
    def fresh(self) -> int:
        """The step's own kept groups, every rank's (``len(kept)``): B, or with ``--replay-size`` the first of the B
        groups, the replayed ones coming after them (:func:`rlft.rl.sampling.with_replayed`)."""
        return len(self.kept)

    @property
    def samples_tried(self) -> int:
        """G * k: samples generated this step, every rank's (``samples/step``)."""
        return self.all_raw.numel()


@dataclass(frozen=True)
class StepUpdate:
    """What step 6 of the loop did (:func:`rlft.recipes.rl.update_policy`): the rows it trained on, its metrics and
    the log-probs its first epoch computed. M rows of this rank's N."""

    rows: torch.Tensor
    """``(M,)`` long: the indices of this rank's batch rows that went through a forward and backward."""
    epoch_metrics: list[dict[str, float]]
    """One dict per optimizer step (``ppo_epochs`` of them): the losses reduced over ranks, ``grad_norm``, ``lr``."""
    logprobs: torch.Tensor | None
    """``(M, T)`` the first epoch's log-probs of the updated rows (the sampling policy's); None when none was
    updated."""
