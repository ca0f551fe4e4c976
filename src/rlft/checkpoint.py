"""Atomic checkpoints that a killed run resumes from.

Layout of a run directory::

    run_dir/
      checkpoints/step-00000050/   HF model folder (+ tokenizer), trainer_state.pt, manifest.json
      checkpoints/latest           text file naming the newest complete checkpoint
      model/                       the final model, a standard HF folder
      metrics.jsonl                one JSON object per logged step
      config.yaml                  the run's options (:func:`write_run_config`), with the first checkpoint

A checkpoint is written to a temporary folder and renamed into place, and ``latest`` is replaced
atomically afterwards, so a kill at any moment leaves either the old or the new checkpoint, never a
half-written one. ``trainer_state.pt`` holds the optimizer, scheduler, RNG states and the step.
``manifest.json``, written last, lists every file of the checkpoint with its size and SHA-256, so a
checkpoint damaged later (a file deleted or cut short, a disk error) is recognised
(:func:`checkpoint_problem`) and resuming falls back to the previous one. Hidden ``.step-*`` /
``.model.*`` folders are saves killed mid-write; :func:`remove_partial_saves` deletes them.

Single files are written atomically by :mod:`rlft.fsio`. Which folder may hold a run, and whether a resume
matches the saved ``config.yaml``, is :mod:`rlft.run_folder`'s part (it builds on this module).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import yaml

from rlft.composed import option_values
from rlft.fsio import atomic_write_text

log = logging.getLogger("rlft")

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.pt"
CONFIG = "config.yaml"


def config_dict(cfg: Any) -> dict:
    """``asdict(cfg)`` (a composed config's options flat: :func:`rlft.composed.option_values`) with tuples as lists
    and paths as strings: what ``config.yaml`` holds."""

    def plain(value):
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        return value

    return {k: plain(v) for k, v in option_values(cfg).items()}  # flat names, also of a composed config


def write_run_config(run_dir: str | Path, cfg: Any) -> Path:
    """Write ``run_dir/config.yaml`` (:func:`config_dict` of the config dataclass ``cfg``) atomically; returns its
    path."""
    path = Path(run_dir) / CONFIG
    atomic_write_text(path, yaml.safe_dump(config_dict(cfg), sort_keys=False))
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_sha256(model: str | Path) -> str | None:
    """A content hash of a local model folder's weights: the SHA-256 of its one ``*.safetensors`` file (what
    ``sha256sum model.safetensors`` prints), or, for a sharded folder, the SHA-256 of its ``"name sha256"`` lines in
    name order. None when ``model`` is not a folder holding ``*.safetensors`` (a built-in name or Hub id).

    Evaluations record it, so files from two different trainings saved at the same path cannot be merged or paired
    as one model's."""
    folder = Path(model).expanduser()
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    if len(files) == 1:
        return _sha256(files[0])
    return hashlib.sha256("".join(f"{f.name} {_sha256(f)}\n" for f in files).encode()).hexdigest()


def weights_fingerprint(model: str | Path) -> list[list]:
    """``[name, bytes, mtime_ns]`` of each weights file (``*.safetensors``, ``*.bin``) in a local model folder, sorted
    by name; ``[]`` for a built-in name or Hub id. What named the weights in cache keys and journals before 2026-12-02,
    and what names a folder of ``*.bin`` weights since (:func:`weights_id`)."""
    folder = Path(model)
    if not folder.is_dir():
        return []
    files = sorted(f for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern))
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def legacy_weights_match(recorded: object, model: str | Path) -> bool:
    """Whether ``recorded``, the value that named ``model``'s weights in a cache key or sampling journal written before
    2026-12-02 (:func:`weights_fingerprint`: name, bytes and mtime of each file), still matches its files: such a
    record is honoured while they are untouched."""
    return recorded == weights_fingerprint(model)


def weights_id(model: str | Path, sha256: str | None) -> str | list:
    """What names ``model``'s weights in an evaluation's cache key or a sampling journal: ``sha256``, their SHA-256
    (:func:`weights_sha256` of ``model``; reading the 135M model's 0.5 GB takes ~1 s), or, where that is None,
    :func:`weights_fingerprint` (a folder of ``*.bin`` weights; ``[]`` for a built-in name or Hub id)."""
    return sha256 or weights_fingerprint(model)


def write_manifest(folder: Path) -> None:
    """Write ``folder/manifest.json``: every other file's relative path, size and SHA-256."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    atomic_write_text(folder / MANIFEST, json.dumps({"files": entries}, indent=1))


def checkpoint_problem(folder: Path) -> str | None:
    """Why the checkpoint ``folder`` cannot be resumed from, or None when it is complete.

    With a ``manifest.json``: every listed file must exist with its size and SHA-256. Without one (a
    checkpoint from an older rlft): ``trainer_state.pt`` and a weights file must exist.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return "not a folder"
    manifest = folder / MANIFEST
    if not manifest.is_file():
        if not (folder / TRAINER_STATE).is_file():
            return f"{TRAINER_STATE} is missing"
        if not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
            return "no weights file (*.safetensors)"
        return None
    try:
        entries = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{MANIFEST} is unreadable"
    for name, entry in entries.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} has {size} bytes, expected {entry['size']} (cut short?)"
        if _sha256(path) != entry["sha256"]:
            return f"{name} does not match its SHA-256 in {MANIFEST} (damaged)"
    return None


def remove_partial_saves(run_dir: Path) -> list[str]:
    """Delete the leftovers of saves killed mid-write (hidden ``.step-*``, ``.model.*``, ``.latest.*``
    and temp files) in ``run_dir`` and ``run_dir/checkpoints``; returns their names (also logged)."""
    run_dir = Path(run_dir)
    removed = []
    prefixes = (".step-", ".model.", ".latest.", ".config.yaml.", ".metrics.jsonl.", ".data_stats.json")
    for parent in (run_dir, run_dir / "checkpoints"):
        if not parent.is_dir():
            continue
        for entry in sorted(parent.iterdir()):
            if entry.name.startswith(prefixes):
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                removed.append(str(entry.relative_to(run_dir)))
    if removed:
        log.info("removed %d partial save(s) left by an interrupted run: %s", len(removed), ", ".join(removed))
    return removed


def save_model_folder(folder: Path, model, tokenizer, extra: dict[str, object] | None = None, manifest: bool = False,
                      state_dict: dict | None = None) -> None:
    """Save ``model`` and ``tokenizer`` as a standard HF folder, atomically (temp + rename).

    ``extra`` maps file names to objects saved with ``torch.save`` inside the same folder;
    ``manifest``: write ``manifest.json`` (sizes and hashes, :func:`write_manifest`) last;
    ``state_dict``: the weights to write instead of ``model.state_dict()`` (the full state dict of a
    sharded model, :func:`rlft.distributed.full_state_dicts`).
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        model.save_pretrained(tmp, **({"state_dict": state_dict} if state_dict is not None else {}))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if (base := getattr(model, "rlft_adapter_base", None)) is not None:  # rlft.lora: the adapter's base model
            atomic_write_text(tmp / "base_model.json", json.dumps(base, indent=1) + "\n")
        for name, obj in (extra or {}).items():
            torch.save(obj, tmp / name)
        if manifest:
            write_manifest(tmp)
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


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, optimizer, scheduler, extra_state: dict | None = None,
                    keep: int = 2, config=None, model_state: dict | None = None,
                    optimizer_state: dict | None = None) -> Path:
    """Write ``run_dir/checkpoints/step-XXXXXXXX`` atomically (with its manifest), point ``latest`` at
    it, keep the newest ``keep`` checkpoints. ``config`` (the run's config dataclass): also write
    ``run_dir/config.yaml`` (:func:`write_run_config`) once the checkpoint is complete.
    ``model_state``, ``optimizer_state``: full state dicts of a sharded model and its optimizer
    (:func:`rlft.distributed.full_state_dicts`; the optimizer's keyed by parameter name, recorded as
    ``optimizer_by_name``) to write instead of the live objects' own.

    Returns the checkpoint folder.
    """
    ckpt_root = Path(run_dir) / "checkpoints"
    folder = ckpt_root / f"step-{step:08d}"
    state = {
        "step": step,
        "optimizer": optimizer.state_dict() if optimizer_state is None else optimizer_state,
        "optimizer_by_name": optimizer_state is not None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        **(extra_state or {}),
    }
    save_model_folder(folder, model, tokenizer, extra={TRAINER_STATE: state}, manifest=True, state_dict=model_state)
    atomic_write_text(ckpt_root / "latest", folder.name)
    if config is not None:
        write_run_config(run_dir, config)
    for old in sorted(p for p in ckpt_root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def checkpoint_folders(run_dir: Path) -> list[Path]:
    """The ``checkpoints/step-*`` folders of a run, newest (highest step) first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted((p for p in root.glob("step-*") if p.is_dir()), key=lambda p: p.name, reverse=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (:func:`checkpoint_problem` finds nothing wrong), or None."""
    return next((c for c in checkpoint_folders(run_dir) if checkpoint_problem(c) is None), None)


def read_trainer_state(folder: Path) -> dict:
    """``trainer_state.pt`` of a checkpoint (raises what ``torch.load`` raises on a damaged file)."""
    return torch.load(Path(folder) / TRAINER_STATE, weights_only=False)


def restore_trainer_state(state: dict, optimizer, scheduler, model=None) -> None:
    """Restore optimizer, scheduler and RNG from a state read by :func:`read_trainer_state`.

    ``model``: the model the optimizer trains; needed for a sharded model (FSDP2) or a state saved from
    one (``optimizer_by_name``): :func:`rlft.distributed.load_optimizer_state` maps the state by name."""
    if model is not None:
        from rlft.distributed import load_optimizer_state

        load_optimizer_state(model, optimizer, state["optimizer"], by_name=bool(state.get("optimizer_by_name")))
    else:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])


def load_trainer_state(folder: Path, optimizer, scheduler) -> dict:
    """Restore optimizer, scheduler and RNG from a checkpoint; returns the whole state dict."""
    state = read_trainer_state(folder)
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


class MetricsLog:
    """Append-only ``metrics.jsonl``; on resume, lines logged after the checkpoint are dropped so
    the curve continues without duplicates or jumps (earlier lines are kept, never wiped).

    ``resume_step`` None starts a new log (the run folder holds no earlier run: see
    :mod:`rlft.run_folder`). A line that does not parse (cut short by a kill) is dropped with a warning.

    ``sink``: optional callable that also receives every logged record (an experiment tracker, see
    :func:`rlft.tracking.attach_tracker`); it may be set after construction."""

    def __init__(self, path: Path, resume_step: int | None = None, sink: Callable[[dict], None] | None = None):
        self.sink = sink
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept, torn = [], 0
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    torn += 1
                    continue
                if isinstance(record, dict) and record.get("step", 0) <= resume_step:
                    kept.append(line)
            if torn:
                log.warning("%s: dropped %d unreadable line(s) (cut short by a kill?)", self.path, torn)
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def log(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.sink is not None:
            self.sink(record)


def read_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` ([] when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def count_metrics(path: Path) -> int:
    """How many non-empty lines ``metrics.jsonl`` holds (0 when it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip())
