"""Off-policy reuse in the RL loop: the replay buffer's part of each step (``--replay-size``, :class:`Replay`).

Each step, after sampling: :meth:`Replay.add_replayed` drops the groups older than ``--max-staleness``, draws up to
``--replay-size`` of the others (seeded per step, without replacement: a resumed run draws the same groups) and appends
them after the fresh ones, shaped and filtered from their raw rewards as fresh groups are
(:func:`rlft.rl.sampling.with_replayed`). The loss then divides every row by its behaviour policy's log-probs
(:mod:`rlft.rl.logprobs`: the sampler's, stored with each sample). After the update, :meth:`Replay.after_update` logs
the ``replay/*`` metrics and stores the step's fresh groups. The buffer goes into every checkpoint
(``trainer_state.pt``'s ``replay``, :meth:`Replay.checkpoint_state`) and comes back on ``--resume``
(:meth:`Replay.for_run`). Without ``--replay-size`` every method leaves the step as it is and logs nothing, so the loop
calls them unconditionally. One process only (:func:`rlft.rl.ranks.start_ranks`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from rlft.rl.batch import replay_seed
from rlft.rl.logprobs import StepLogprobs
from rlft.rl.metrics import replay_log_ratios
from rlft.rl.records import RLPrompt, StepSamples, StepUpdate
from rlft.rl.replay import ReplayBuffer, ReplayGroup
from rlft.rl.sampling import fresh_groups, with_replayed
from rlft.validation import UsageError


class Replay:
    """The replay buffer of a run (None: no ``--replay-size``) and the groups the current step drew from it.

    Args:
        cfg: the run's :class:`rlft.rl.config.RLConfig` (``replay_size``, ``max_staleness``, ``prompts_per_step``,
            ``seed``, ``k``, and the shaping and filtering a replayed group gets).
        buffer: the buffer, holding the kept groups of the last ``max_staleness`` steps (all a draw can take).
    """

    def __init__(self, cfg, buffer: ReplayBuffer | None) -> None:
        self.cfg, self.buffer = cfg, buffer
        self.drawn: list[ReplayGroup] = []
        """The replayed groups of the current step, in the order they follow the fresh ones."""

    @classmethod
    def for_run(cls, cfg, trainer_state: dict | None, checkpoint: Path | None) -> Replay:
        """The run's buffer: empty, or on ``--resume`` as the checkpoint ``checkpoint`` left it (``trainer_state``).

        Raises:
            UsageError: ``--resume --replay-size`` from a checkpoint holding no buffer (written without
                ``--replay-size``), or holding groups of another k (``--resume-override k``).
        """
        if not cfg.replay_size:
            return cls(cfg, None)
        buffer = ReplayBuffer(cfg.max_staleness * cfg.prompts_per_step, cfg.max_staleness)
        if trainer_state is not None:  # resumed
            if "replay" not in trainer_state:
                raise UsageError(f"--resume with --replay-size: checkpoint {checkpoint} holds no replay buffer "
                                 "(written by a run without --replay-size); resume without it or start a new run")
            buffer.load_state_dict(trainer_state["replay"])
            stored = {len(g.samples) for g in buffer.groups}
            if stored - {cfg.k}:
                raise UsageError(f"--resume with --replay-size: checkpoint {checkpoint}'s replay buffer holds groups "
                                 f"of k={min(stored)} samples, this run samples k={cfg.k}; resume with --k "
                                 f"{min(stored)} or start a new run")
        return cls(cfg, buffer)

    def add_replayed(self, step: int, got: StepSamples, prompts: list[RLPrompt], tokenizer, *,
                     add_special_tokens: bool = True) -> StepSamples:
        """The step ``got`` with the groups drawn from the buffer after its own (``got`` itself without a buffer, or
        when none is drawn or kept); ``prompts``: the training prompts (a stored group keeps its index)."""
        self.drawn = []
        if self.buffer is None:
            return got
        self.buffer.evict(step)
        generator = torch.Generator().manual_seed(replay_seed(self.cfg.seed, step))
        drawn, _ = self.buffer.draw(self.cfg.replay_size, step, generator)
        got, self.drawn = with_replayed(self.cfg, got, drawn, prompts, tokenizer, add_special_tokens=add_special_tokens)
        return got

    def after_update(self, step: int, got: StepSamples, logprobs: StepLogprobs, update: StepUpdate) -> dict[str, float]:
        """The step's ``replay/*`` metrics (:meth:`rlft.rl.replay.ReplayBuffer.metrics`: the replayed rows' log-ratios
        to their behaviour policy before the update, :func:`rlft.rl.metrics.replay_log_ratios`); then the step's fresh
        groups, with their behaviour log-probs, join the buffer. Empty without a buffer."""
        if self.buffer is None:
            return {}
        fresh_rows = got.fresh * got.raw.shape[1]
        ratios = replay_log_ratios(logprobs.train, update.rows, logprobs.old, update.logprobs, logprobs.behaviour,
                                   fresh_rows)
        metrics = ReplayBuffer.metrics(self.drawn, fresh_rows, step, ratios)
        self.buffer.add(fresh_groups(got, got.fresh), step)
        return metrics

    @property
    def checkpoint_state(self) -> Callable[[], dict] | None:
        """What a checkpoint keeps besides the model and optimizer: ``{"replay": the buffer's state}``; None without
        a buffer (:func:`rlft.recipes.common.checkpoint_if_due`'s ``extra_state``)."""
        if self.buffer is None:
            return None
        return lambda: {"replay": self.buffer.state_dict()}
