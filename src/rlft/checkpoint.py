"""Atomic checkpoints that a killed run resumes from.

Layout of a run directory::

    run_dir/
      checkpoints/step-00000050/   HF model folder (+ tokenizer) and trainer_state.pt
      checkpoints/latest           text file naming the newest complete checkpoint
      model/                       the final model, a standard HF folder
      metrics.jsonl                one JSON object per logged step

A checkpoint is written to a temporary folder and renamed into place, and ``latest`` is replaced
atomically afterwards, so a kill at any moment leaves either the old or the new checkpoint, never a
half-written one. ``trainer_state.pt`` holds the optimizer, scheduler, RNG states and the step.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_model_folder(folder: Path, model, tokenizer, extra: dict[str, object] | None = None) -> None:
    """Save ``model`` and ``tokenizer`` as a standard HF folder, atomically (temp + rename).

    ``extra`` maps file names to objects saved with ``torch.save`` inside the same folder.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, obj in (extra or {}).items():
            torch.save(obj, tmp / name)
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, optimizer, scheduler, extra_state: dict | None = None, keep: int = 2) -> Path:
    """Write ``run_dir/checkpoints/step-XXXXXXXX`` atomically, point ``latest`` at it, prune old ones.

    Returns the checkpoint folder.
    """
    ckpt_root = Path(run_dir) / "checkpoints"
    folder = ckpt_root / f"step-{step:08d}"
    state = {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        **(extra_state or {}),
    }
    save_model_folder(folder, model, tokenizer, extra={"trainer_state.pt": state})
    _atomic_write_text(ckpt_root / "latest", folder.name)
    for old in sorted(p for p in ckpt_root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    folder = pointer.parent / pointer.read_text().strip()
    return folder if (folder / "trainer_state.pt").is_file() else None


def load_trainer_state(folder: Path, optimizer, scheduler) -> dict:
    """Restore optimizer, scheduler and RNG from a checkpoint; returns the whole state dict."""
    state = torch.load(Path(folder) / "trainer_state.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


class MetricsLog:
    """Append-only ``metrics.jsonl``; on resume, lines logged after the checkpoint are dropped so
    the curve continues without duplicates or jumps.

    ``sink``: optional callable that also receives every logged record (an experiment tracker, see
    :func:`rlft.tracking.attach_tracker`); it may be set after construction."""

    def __init__(self, path: Path, resume_step: int | None = None, sink: Callable[[dict], None] | None = None):
        self.sink = sink
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= resume_step]
            _atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def log(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.sink is not None:
            self.sink(record)


def read_metrics(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
