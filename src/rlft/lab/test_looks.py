"""Every look at the test rows counted: the lab's side of ``rlft eval countdown --split test`` and of the RL loop's
in-loop evaluation on test rows (``rlft rl --eval-rows test``).

The library evaluates and tells its caller of each look (:data:`rlft.eval.countdown_command.TestLookCallback`,
:data:`rlft.rl.evaluation.InLoopLookCallback`); the command line maps ``eval countdown``, ``rl`` and ``rloo`` to the
functions here, which count every look in the test-look ledger (:mod:`rlft.lab.ledger`):

- :func:`run_eval_countdown_counted`: the ledger is ``--ledger``, else ``test_looks.jsonl`` beside ``--output``
  (:func:`eval_ledger_path`); it is checked before the model loads (:func:`check_eval_ledger`, also run at parse time
  and by ``--dry-run``), and the look is appended once the evaluation is written. A test evaluation with neither file
  is not recorded, with a warning.
- :func:`train_rl_counted`: ``<output_dir>/test_looks.jsonl`` gets one line per in-loop evaluation of test rows
  (:class:`InLoopLooks`); :func:`rlft.recipes.rl.train_rl` refuses ``--eval-rows test`` without such a recorder.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlft.eval.countdown import CountdownEvalResult
from rlft.eval.countdown_command import EvalCountdownConfig, run_eval_countdown
from rlft.lab.ledger import LEDGER_NAME, check_ledger_target, default_ledger_path, record_test_look
from rlft.recipes import rl as rl_recipe
from rlft.rl.config import RLConfig
from rlft.run_folder import run_dir_path

log = logging.getLogger("rlft")


def eval_ledger_path(cfg: EvalCountdownConfig) -> str | Path | None:
    """The ledger an evaluation's look goes to: ``--ledger``, else (``--split test`` with ``--output``)
    :func:`rlft.lab.ledger.default_ledger_path`; None: not a look at the test rows, or nowhere to record it."""
    if cfg.split != "test" or not (cfg.ledger or cfg.output):
        return None
    return cfg.ledger or default_ledger_path(cfg.output)


def check_eval_ledger(cfg: EvalCountdownConfig) -> None:
    """Before anything loads (at parse time too): the ledger of :func:`eval_ledger_path` may take a look.

    Raises:
        OptionError: one line naming the ledger (``--ledger``, or the one beside ``--output``): a folder, not a
            ``.jsonl`` file, one of the evaluation's inputs or its ``--output``, not writable, or holding a line that
            is not a look (:func:`rlft.lab.ledger.check_ledger_target`).
    """
    if (ledger := eval_ledger_path(cfg)) is not None:
        check_ledger_target(ledger, inputs=cfg.input_paths(), outputs={"--output": cfg.output},
                            option="--ledger" if cfg.ledger else "the ledger beside --output")


def run_eval_countdown_counted(cfg: EvalCountdownConfig) -> CountdownEvalResult:
    """``rlft eval countdown``: :func:`rlft.eval.countdown_command.run_eval_countdown`, its look at the test rows
    (``--split test``) appended to the ledger of :func:`eval_ledger_path` (the evaluation file, when written, named in
    the line; a warning when there is no ledger).

    Raises:
        OptionError: the ledger cannot take the look (:func:`check_eval_ledger`), before the model loads; and what
            ``run_eval_countdown`` raises.
        OSError: the ledger line cannot be written.
    """
    check_eval_ledger(cfg)
    ledger = eval_ledger_path(cfg)

    def count(result: CountdownEvalResult, config: dict) -> None:
        if ledger is None:
            log.warning("an evaluation of the test rows without --output or --ledger: this look is not recorded")
            return
        record_test_look(result, config, ledger, eval_path=cfg.output, inputs=cfg.input_paths())
        log.info("test look recorded in %s", ledger)

    return run_eval_countdown(cfg, on_test_look=count)


class InLoopLooks:
    """The RL loop's test looks counted: each in-loop evaluation of test rows is one line in
    ``<output_dir>/test_looks.jsonl``, with the run's folder as ``model`` (the weights are the policy in training, so
    ``model_sha256`` is None), ``rlft rl in-loop, step S`` as ``label`` and the score over the evaluated tasks
    (per-size scores are not kept in the loop, so ``score_by_size`` is empty). Called on the main rank only."""

    def __init__(self, cfg: RLConfig) -> None:
        run_dir = run_dir_path(cfg.output_dir)
        self.ledger = run_dir / LEDGER_NAME
        self.look = {"model": str(run_dir), "model_sha256": None, "split": "test", "data": cfg.data}

    def __call__(self, result: CountdownEvalResult, step: int) -> None:
        """Append the look of the evaluation after ``step`` steps (0: before the first).

        Raises:
            UsageError / OSError: the ledger cannot take the line (:func:`rlft.lab.ledger.record_test_look`).
        """
        record_test_look(result, self.look, self.ledger, label=f"rlft rl in-loop, step {step}")


def train_rl_counted(cfg: RLConfig) -> Path:
    """``rlft rl`` and ``rlft rloo`` (and the RL runs of ``scripts/countdown_ablation.py``):
    :func:`rlft.recipes.rl.train_rl` with its test looks counted (:class:`InLoopLooks`, used with ``--eval-rows
    test``); returns the final model's folder."""
    return rl_recipe.train_rl(cfg, on_test_look=InLoopLooks(cfg))
