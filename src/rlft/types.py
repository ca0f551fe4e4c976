"""Record and batch types shared across rlft.

Shape legend: B batch, G (or k) samples per prompt, T tokens, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CountdownTask:
    """One Countdown instance: reach ``target`` using each of ``nums`` exactly once.

    The same record comes from the local generator, the Countdown-Tasks-3to4 loader and the
    cog_behav loader.
    """

    nums: tuple[int, ...]
    """The given numbers, in the order shown to the model."""
    target: int
    """The value the expression must equal."""
    solution: str | None = None
    """A correct expression when one is known (generator: always; loaders: when the source has one)."""
    query: str | None = None
    """The source's own prompt text (cog_behav rows), else None."""
    completion: str | None = None
    """The source's own reasoning trace (cog_behav rows), else None."""

    def ground_truth(self) -> dict:
        """The ``ground_truth`` dict taken by :func:`rlft.rewards.countdown.compute_score`."""
        return {"target": self.target, "numbers": list(self.nums)}


@dataclass(frozen=True)
class PromptCompletion:
    """A text pair for supervised fine-tuning: the loss is taken on ``completion`` (+ EOS) only."""

    prompt: str
    completion: str


@dataclass
class TokenBatch:
    """A right-padded batch of token sequences for teacher-forced training.

    ``loss_mask[b, t] == 1`` means token ``input_ids[b, t]`` is a training target (it is predicted
    from positions ``< t``). Padding is never a target, but a real EOS at the end of a completion is,
    even when ``pad_token_id == eos_token_id``: masks are built from lengths, never from token values.
    """

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long, 1 on real tokens
    loss_mask: torch.Tensor  # (B, T) float, 1 on completion tokens (and their EOS)

    def to(self, device: torch.device | str) -> "TokenBatch":
        return TokenBatch(
            self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device)
        )

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())
