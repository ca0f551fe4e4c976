"""The RL loop's in-loop evaluation (:class:`InLoopEval`): when it runs, and every look at test rows counted.

The prompt source evaluates (:attr:`rlft.rl.prompts.PromptSource.evaluate`: greedy, on the held-out prompts, every rank
its shard); this module decides when: with ``--eval-every N``, at step 0 (unless ``--no-eval-at-start`` or resumed),
every N steps and at the last step. When the held-out rows are a dataset's test rows (``--eval-rows test``), each
evaluation is a look at the test set, and the main rank appends one line for it to ``<output_dir>/test_looks.jsonl``
(:func:`rlft.eval.ledger.record_test_look`): the run's folder as ``model`` (the weights are the policy in training, so
``model_sha256`` is None), ``rlft rl in-loop, step S`` as ``label``, the score over the evaluated tasks (per-size scores
are not kept in the loop, so ``score_by_size`` is empty).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, ContextManager

from rlft import distributed
from rlft.rl.prompts import PromptSource


class InLoopEval:
    """The run's evaluation schedule and, on test rows, its ledger.

    Args:
        source: the prompt source (its held-out prompts and ``evaluate``).
        every: ``--eval-every`` (0: never).
        total_steps: the run's last step (always evaluated when ``every`` is set).
        at_start: ``--eval-at-start``.
        ledger: the test-look ledger; None: the held-out rows are not test rows.
        look: the ledger line's ``config`` (``model``, ``split``, ``data``).
    """

    def __init__(self, source: PromptSource, every: int, total_steps: int, *, at_start: bool = True,
                 ledger: Path | None = None, look: dict | None = None) -> None:
        self.source, self.every, self.total_steps, self.at_start = source, every, total_steps, at_start
        self.ledger, self.look = ledger, look or {}
        self.on = bool(every and source.eval)

    @classmethod
    def for_run(cls, cfg, source: PromptSource, run_dir: Path) -> InLoopEval:
        """The evaluation of ``cfg`` (an :class:`rlft.rl.config.RLConfig`); on Countdown test rows
        (``--eval-rows test``) its looks are counted in ``run_dir / test_looks.jsonl``."""
        from rlft.eval.ledger import LEDGER_NAME

        test = source.kind == "countdown" and cfg.eval_rows == "test"
        return cls(source, cfg.eval_every, cfg.max_steps, at_start=cfg.eval_at_start,
                   ledger=Path(run_dir) / LEDGER_NAME if test else None,
                   look={"model": str(run_dir), "model_sha256": None, "split": "test", "data": cfg.data})

    def due(self, step: int) -> bool:
        """Whether the run evaluates after ``step`` steps (0: before the first)."""
        if not self.on:
            return False
        if step == 0:
            return self.at_start
        return step % self.every == 0 or step == self.total_steps

    def evaluate(self, engine, step: int) -> dict[str, float]:
        """Evaluate now (every rank: its shard) and count the look on test rows (the main rank writes the line);
        returns the ``eval/*`` metrics.

        Raises:
            UsageError / OSError: the ledger cannot take the line (:func:`rlft.eval.ledger.record_test_look`).
        """
        metrics = self.source.evaluate(engine)
        if self.ledger is not None and distributed.is_main():
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
        from rlft.eval.countdown import CountdownEvalResult
        from rlft.eval.ledger import record_test_look

        accuracy = metrics["eval/accuracy"]
        # what a look records (score, tasks, mode, k); the loop keeps no completion lengths: NaN, never written
        result = CountdownEvalResult(num_tasks=len(self.source.eval), k=1, mode="greedy",
                                     mean_score=metrics["eval/score"], accuracy=accuracy,
                                     format_rate=metrics["eval/format_rate"], pass_at_k={1: accuracy},
                                     mean_completion_tokens=float("nan"), truncated_rate=float("nan"))
        record_test_look(result, self.look, self.ledger, label=f"rlft rl in-loop, step {step}")
