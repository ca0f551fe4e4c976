"""The RL loop's in-loop evaluation (:class:`InLoopEval`): when it runs, and every look at test rows counted.

The prompt source evaluates (:attr:`rlft.rl.prompts.PromptSource.evaluate`: greedy, on the held-out prompts, every rank
its shard); this module decides when: with ``--eval-every N``, at step 0 (unless ``--no-eval-at-start`` or resumed),
every N steps and at the last step. When the held-out rows are a dataset's test rows (``--eval-rows test``), each
evaluation is a look at the test set, and the main rank tells the run's recorder of it (:data:`InLoopLookCallback`;
``rlft rl`` counts it in ``<output_dir>/test_looks.jsonl``: :class:`rlft.lab.test_looks.InLoopLooks`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, ContextManager

from rlft import distributed
from rlft.eval.countdown import CountdownEvalResult
from rlft.rl.prompts import PromptSource

InLoopLookCallback = Callable[[CountdownEvalResult, int], None]
"""Told of each in-loop evaluation of test rows (main rank): what a look records (score, accuracy, format rate, tasks,
greedy, k 1; the loop keeps no completion lengths: NaN) and the step it followed (0: before the first)."""


class InLoopEval:
    """The run's evaluation schedule and, on test rows, who counts its looks.

    Args:
        source: the prompt source (its held-out prompts and ``evaluate``).
        every: ``--eval-every`` (0: never).
        total_steps: the run's last step (always evaluated when ``every`` is set).
        at_start: ``--eval-at-start``.
        on_look: told of each evaluation (:data:`InLoopLookCallback`); None: the held-out rows are not test rows.
    """

    def __init__(self, source: PromptSource, every: int, total_steps: int, *, at_start: bool = True,
                 on_look: InLoopLookCallback | None = None) -> None:
        self.source, self.every, self.total_steps, self.at_start = source, every, total_steps, at_start
        self.on_look = on_look
        self.on = bool(every and source.eval)

    @classmethod
    def for_run(cls, cfg, source: PromptSource, on_test_look: InLoopLookCallback | None) -> InLoopEval:
        """The evaluation of ``cfg`` (an :class:`rlft.rl.config.RLConfig`); on Countdown test rows
        (``--eval-rows test``) each look goes to ``on_test_look``."""
        test = source.kind == "countdown" and cfg.eval_rows == "test"
        return cls(source, cfg.eval_every, cfg.max_steps, at_start=cfg.eval_at_start,
                   on_look=on_test_look if test else None)

    def due(self, step: int) -> bool:
        """Whether the run evaluates after ``step`` steps (0: before the first)."""
        if not self.on:
            return False
        if step == 0:
            return self.at_start
        return step % self.every == 0 or step == self.total_steps

    def evaluate(self, engine, step: int) -> dict[str, float]:
        """Evaluate now (every rank: its shard) and, on test rows, tell ``on_look`` (the main rank); returns the
        ``eval/*`` metrics. Raises what ``on_look`` raises (``rlft rl``: a ledger that cannot take the line)."""
        metrics = self.source.evaluate(engine)
        if self.on_look is not None and distributed.is_main():
            self._count(metrics, step)
        return metrics

    def after_step(self, engine, step: int, generating: Callable[[], ContextManager] = contextlib.nullcontext
                   ) -> dict[str, float]:
        """After ``step`` steps: the ``eval/*`` metrics and ``time/eval_s`` when an evaluation is due (run inside
        ``generating()``, e.g. the eager layers of a compiled model), else nothing."""
        if not self.due(step):
            return {}
        t0 = time.perf_counter()
        with generating():
            metrics = self.evaluate(engine, step)
        return {**metrics, "time/eval_s": time.perf_counter() - t0}

    def _count(self, metrics: dict[str, float], step: int) -> None:
        assert self.on_look is not None
        accuracy = metrics["eval/accuracy"]
        # what a look records (score, tasks, mode, k); the loop keeps no completion lengths: NaN, never written
        result = CountdownEvalResult(num_tasks=len(self.source.eval), k=1, mode="greedy",
                                     mean_score=metrics["eval/score"], accuracy=accuracy,
                                     format_rate=metrics["eval/format_rate"], pass_at_k={1: accuracy},
                                     mean_completion_tokens=float("nan"), truncated_rate=float("nan"))
        self.on_look(result, step)
