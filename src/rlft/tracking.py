"""Experiment tracking: forward each ``metrics.jsonl`` record to TensorBoard, Weights & Biases or Trackio.

``--report-to none|tensorboard|wandb|trackio`` (default none). The tracker sees exactly the records
:class:`rlft.checkpoint.MetricsLog` writes, under the same names (``loss/sft``, ``lr``,
``tokens_per_s``, ``eval/accuracy``, ...), at ``step = record["step"]``; non-numeric values are skipped.

One line wires it into a recipe, after :func:`rlft.recipes.common.prepare_training`::

    tracker = attach_tracker(setup.metrics, cfg.report_to, run_dir, cfg)   # None for "none"
    ...                                                                     # the loop logs as before
    if tracker: tracker.close()

- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` writing to ``run_dir/tensorboard``
  (``pip install rlft[tensorboard]``), flushed after every record so a killed run keeps its curve;
- ``wandb``: ``wandb.init(project=$WANDB_PROJECT or "rlft", name=<run folder name>, dir=run_dir, config=cfg)``
  (``pip install rlft[wandb]``; log in with ``wandb login`` or ``WANDB_API_KEY``, or ``WANDB_MODE=offline``);
- ``trackio``: ``trackio.init(project=$TRACKIO_PROJECT or "rlft", name=<run folder name>, config=cfg)``
  (``pip install rlft[trackio]``), a local, wandb-compatible tracker.

wandb and trackio are imported only when chosen; a missing one raises ImportError naming the extra. The configs
check that the chosen package is installed when they are built (:func:`rlft.validation.check_tracker`), so the
command line refuses a missing one at parse time, before any data or model is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Literal, Protocol

ReportTo = Literal["none", "tensorboard", "wandb", "trackio"]
REPORT_TO = ("none", "tensorboard", "wandb", "trackio")


class Tracker(Protocol):
    def log(self, record: dict) -> None:
        """Send one metrics record (``record["step"]`` is its step)."""

    def close(self) -> None:
        """Flush and finish the run."""


def scalars(record: dict) -> tuple[int | None, dict[str, float]]:
    """``(step, {name: value})`` of a record: every int/float value except ``step`` itself (bools and
    strings, lists, None are skipped; NaN and inf are kept)."""
    step = record.get("step")
    values = {
        key: float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    return (int(step) if isinstance(step, (int, float)) and math.isfinite(step) else None), values


class TensorBoardTracker:
    """Scalars into ``log_dir`` with ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch's writer needs the tensorboard package
            raise ImportError("--report-to tensorboard needs tensorboard: pip install 'rlft[tensorboard]'") from e
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, record: dict) -> None:
        step, values = scalars(record)
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _ModuleTracker:
    """wandb and trackio share ``init(project, name, config)`` / ``log(dict, step)`` / ``finish()``."""

    def __init__(self, module, run):
        self.module, self.run = module, run

    def log(self, record: dict) -> None:
        step, values = scalars(record)
        if values:
            self.module.log(values, step=step) if step is not None else self.module.log(values)

    def close(self) -> None:
        self.module.finish()


def _import(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(
            f"--report-to {name} needs the {name} package, which is not installed: pip install 'rlft[{name}]'") from e


def _config_dict(config) -> dict:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config):
        from rlft.composed import option_values

        return option_values(config)  # flat option names
    return dict(config)


def open_tracker(report_to: str, run_dir: Path, config=None) -> Tracker | None:
    """The tracker ``report_to`` names, or None for ``"none"``.

    Args:
        run_dir: the run folder (TensorBoard writes ``run_dir/tensorboard``; its name names the run).
        config: the recipe's config dataclass (or a dict), recorded by wandb/trackio.
    Raises:
        ValueError: an unknown ``report_to``. ImportError: the chosen package is not installed.
    """
    run_dir = Path(run_dir)
    if report_to == "none":
        return None
    if report_to == "tensorboard":
        return TensorBoardTracker(run_dir / "tensorboard")
    if report_to == "wandb":
        wandb = _import("wandb")
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlft"), name=run_dir.name, dir=str(run_dir),
                         config=_config_dict(config))
        return _ModuleTracker(wandb, run)
    if report_to == "trackio":
        trackio = _import("trackio")
        run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", "rlft"), name=run_dir.name,
                           config=_config_dict(config))
        return _ModuleTracker(trackio, run)
    raise ValueError(f"unknown --report-to {report_to!r}; choose from {', '.join(REPORT_TO)}")


def attach_tracker(metrics, report_to: str, run_dir: Path, config=None) -> Tracker | None:
    """Open the tracker (:func:`open_tracker`) and make ``metrics`` (a :class:`rlft.checkpoint.MetricsLog`)
    forward every record it logs to it; returns it (None for ``"none"``) so the recipe can ``close()`` it.
    Under torchrun only rank 0 opens a tracker (the others get None)."""
    from rlft.distributed import is_main

    if not is_main():
        return None
    tracker = open_tracker(report_to, run_dir, config)
    if tracker is not None:
        metrics.sink = tracker.log
    return tracker
