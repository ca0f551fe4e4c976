"""Run folders: never overwrite another run, never resume into a different one.

A training recipe uses four calls (its config needs ``output_dir``, ``resume``, ``overwrite`` and
``resume_override`` fields)::

    run = claim_run_dir(cfg)            # first thing: refuses a folder holding another run; writes nothing
    ...                                 # load tokenizer, read and validate data
    run_dir = run.open()                # now: --overwrite moves the old run aside; partial saves removed
    ...
    save_checkpoint(run_dir, ..., config=cfg)   # config.yaml is written with the first checkpoint
    save_model_folder(run_dir / "model", ...); write_run_config(run_dir, cfg)   # ... or the final model

Rules (:func:`claim_run_dir`):

- a new or empty folder (or one holding only files a failed start leaves, e.g. ``data_stats.json``)
  starts a new run;
- a folder holding a run (``config.yaml``, ``metrics.jsonl``, ``checkpoints/step-*`` or ``model/``)
  is refused unless ``--resume`` or ``--overwrite``;
- ``--resume`` compares the config with the saved ``config.yaml``: a longer ``--max-steps`` is fine,
  any other difference is listed and refused unless ``--resume-override`` names it (a command without that option,
  ``rlft demo``, is told to rerun with the saved values or start over). The folder's own path is not an option: a run
  folder moved or renamed resumes, and a path option pointing inside the moved folder (the demo's stages name the SFT
  model, the pairs and the rows under it) counts as the same when it names the same place in it;
- ``--overwrite`` moves the old folder aside to ``<name>.replaced-<UTC time>`` (said in the log) when
  :meth:`RunFolder.open` is called, i.e. only once inputs are validated;
- a folder holding anything else (not an rlft run) is refused unless ``--overwrite``.

- ``.``, ``..`` (and paths ending in them) are made absolute first (:func:`run_dir_path`); ``--overwrite`` of a
  folder holding the current folder, or of a mount point, is refused (it cannot be moved aside).

The command line runs the same checks at parse time (:func:`check_run_dir`, also for ``--dry-run``), before any data
or model loads; they include the one precision rule of a training run: no float16 weights
(:func:`rlft.precision.check_training_dtype`). Single output files (``--output`` of ``pairs countdown`` and
``eval countdown``, the results of ``eval winrate``) follow the same rule (:func:`check_output_file`): an existing
file is refused unless
``--overwrite``; a folder, or a path inside a model folder, always. A command or script writing several files checks
them together (:func:`check_outputs`): none may be one of its inputs, or another of them.

Which checkpoint a resume starts from, and the refusal to restart a run whose checkpoints are all
unusable, is :func:`rlft.recipes.common.prepare_training`'s part.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from rlft import distributed
from rlft.checkpoint import CONFIG, checkpoint_folders, count_metrics, remove_partial_saves
from rlft.checkpoint import config_dict, write_run_config  # noqa: F401 (re-exported: config.yaml is part of a run folder)
from rlft.composed import option_fields
from rlft.provenance import record_environment
from rlft.validation import OptionError, UsageError

log = logging.getLogger("rlft")

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "model")
"""Entries that make a folder hold a run (``metrics.jsonl`` only when not empty)."""
LEFTOVERS = ("data_stats.json", "ref_logps.pt", "eval.json", "environment.jsonl")
"""Files a run writes before its first checkpoint: alone, they do not make a folder hold a run."""
RUN_CONTROL = ("resume", "overwrite", "resume_override", "distributed", "output_dir", "time_limit",
               "max_flops")
"""Fields that say how to start or run, not what to train: never compared on resume (``distributed``: the result
does not depend on the strategy, and checkpoints resume under either; runs saved with the old default ``ddp``
resume under the new ``auto``; ``output_dir``: the folder being resumed, wherever it is now; ``time_limit``,
``max_flops``: where an invocation stops, as a longer ``max_steps`` may differ)."""


class RunFolderError(UsageError):
    """The output folder holds another run, or resuming it would mix two different runs."""


def run_contents(path: Path) -> list[str]:
    """The entries of ``path`` that make it hold a run (see :data:`RUN_FILES`)."""
    found = []
    for name in RUN_FILES:
        entry = path / name
        if name == "metrics.jsonl":
            if count_metrics(entry):
                found.append(name)
        elif name == "checkpoints":
            if checkpoint_folders(path):
                found.append("checkpoints/")
        elif name == "model":
            if entry.is_dir() and any(entry.iterdir()):
                found.append("model/")
        elif entry.exists():
            found.append(name)
    return found


def config_differences(saved: dict, cfg: Any) -> dict[str, tuple[Any, Any]]:
    """Fields whose value in ``cfg`` differs from the saved ``config.yaml`` mapping: ``{name: (saved, new)}``.

    Not compared: :data:`RUN_CONTROL` fields (``output_dir`` among them: a moved run folder resumes), fields the saved
    file lacks, a ``max_steps`` that is at least the saved one (a resumed run may go longer), and a path that names the
    same place inside the run folder after it moved (:func:`moved_root`: saved ``runs/demo/sft/model`` is
    ``runs/old/demo/sft/model`` when ``runs/demo/rl`` is now ``runs/old/demo/rl``).
    """
    new = config_dict(cfg)
    moved = moved_root(saved.get("output_dir"), new.get("output_dir"))
    out = {}
    for name, value in new.items():
        if name in RUN_CONTROL or name not in saved or saved[name] == value:
            continue
        if name == "max_steps" and isinstance(value, int) and isinstance(saved[name], int) and value >= saved[name]:
            continue
        if moved and isinstance(value, str) and isinstance(saved[name], str) and _relocated(saved[name],
                                                                                            moved) == _absolute(value):
            continue
        out[name] = (saved[name], value)
    return out


def _absolute(path: str) -> Path:
    return Path(path).expanduser().resolve()


def moved_root(saved_dir: Any, new_dir: Any) -> tuple[Path, Path] | None:
    """``(old root, new root)`` when a run folder saved as ``saved_dir`` is now ``new_dir``: the two absolute paths
    less the parts they end in alike (``/a/runs/demo/rl`` -> ``/b/old/demo/rl``: ``(/a/runs, /b/old)``); None when they
    are the same place, are not both paths, or the old root is the file system's root (too wide to map)."""
    if not isinstance(saved_dir, str) or not isinstance(new_dir, str):
        return None
    old, new = _absolute(saved_dir).parts, _absolute(new_dir).parts
    tail = 0
    while tail < min(len(old), len(new)) - 1 and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    if old == new or len(old) - tail < 2:
        return None
    return Path(*old[: len(old) - tail]), Path(*new[: len(new) - tail])


def _relocated(path: str, moved: tuple[Path, Path]) -> Path | None:
    """``path`` (absolute) with the old root replaced by the new one; None when it lies outside the old root."""
    absolute = _absolute(path)
    try:
        return moved[1] / absolute.relative_to(moved[0])
    except ValueError:
        return None


@dataclass(frozen=True)
class RunFolder:
    """A checked output folder; :meth:`open` creates it (returned by :func:`claim_run_dir`)."""

    path: Path
    holds_run: bool
    """The folder holds a run (resumed with ``--resume``, moved aside with ``--overwrite``)."""
    overwrite: bool
    resume: bool

    def open(self) -> Path:
        """Create the folder (call once inputs are validated): with ``--overwrite`` the old folder is
        moved aside first; leftovers of saves killed mid-write are removed; a line saying which code and machine
        ran is appended to ``environment.jsonl`` (:func:`rlft.provenance.record_environment`). Returns the path.

        Under torchrun only rank 0 touches the folder; every rank waits for it (barrier) before returning."""
        if distributed.is_main():
            self._open()
        distributed.barrier()
        return self.path

    def _open(self) -> None:
        if self.overwrite and self.path.exists() and any(self.path.iterdir()):
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            aside = self.path.with_name(f"{self.path.name}.replaced-{stamp}")
            n = 1
            while aside.exists():
                n += 1
                aside = self.path.with_name(f"{self.path.name}.replaced-{stamp}-{n}")
            os.replace(self.path, aside)
            log.warning("--overwrite: moved the previous contents of %s to %s", self.path, aside)
        self.path.mkdir(parents=True, exist_ok=True)
        remove_partial_saves(self.path)
        record_environment(self.path)


def claim_run_dir(cfg: Any, output_dir: str | Path | None = None) -> RunFolder:
    """Check that ``cfg`` may write into its output folder, before anything is read or written.

    ``cfg`` needs ``output_dir`` (or pass ``output_dir``) and may have ``resume``, ``overwrite`` and
    ``resume_override`` (missing ones count as False / empty). Writes nothing.

    Raises:
        OptionError: both ``--resume`` and ``--overwrite``; ``--resume-override`` names an unknown option.
        RunFolderError: the path is a file; the folder holds a run and neither ``--resume`` nor
            ``--overwrite`` is given; it holds something that is not a run and ``--overwrite`` is not
            given; ``--resume`` with options that differ from the saved ``config.yaml`` and are not
            named by ``--resume-override``.
        UsageError: launched by torchrun (``WORLD_SIZE`` > 1) without a process group, i.e. by a recipe
            that does not support data-parallel training (see :mod:`rlft.distributed`).

    Under torchrun every rank checks the folder, then waits for the others (barrier), so that no rank
    checks it after rank 0 has opened it.
    """
    if distributed.launched() and not distributed.active():
        raise UsageError("this command does not support torchrun (data-parallel training) yet: run it in one process")
    folder = check_run_dir(cfg, output_dir)
    distributed.barrier()
    return folder


def run_dir_path(output_dir: str | Path) -> Path:
    """``output_dir`` as a path (``~`` expanded); ``.``, ``..`` and paths ending in them made absolute, so that the
    folder has a name (to move it aside with ``--overwrite``, to log it)."""
    path = Path(output_dir).expanduser()
    return Path(os.path.abspath(path)) if path.name in ("", ".", "..") else path


def check_run_dir(cfg: Any, output_dir: str | Path | None = None, *, notes: bool = True) -> RunFolder:
    """:func:`claim_run_dir`'s checks alone: no torchrun check, no barrier, nothing read but the folder and its
    ``config.yaml``, nothing written. The CLI runs it at parse time (and ``--dry-run``), before any model loads,
    with ``notes=False``: what it would log (a resume with overridden options, ...) is logged by the run's own claim.

    Raises:
        OptionError, RunFolderError: as :func:`claim_run_dir`; also ``--overwrite`` of a folder holding the current
            folder (``.``, ``..``) or of a mount point (it cannot be moved aside); ``--dtype float16`` (a training run
            never trains float16 weights: :func:`rlft.precision.check_training_dtype`).
    """
    from rlft.precision import check_training_dtype

    check_training_dtype(getattr(cfg, "dtype", None))
    path = run_dir_path(output_dir if output_dir is not None else cfg.output_dir)
    resume, overwrite = bool(getattr(cfg, "resume", False)), bool(getattr(cfg, "overwrite", False))
    overrides = tuple(getattr(cfg, "resume_override", ()) or ())
    if resume and overwrite:
        raise OptionError("--resume and --overwrite contradict each other: pass one of them")
    known = {f.name for f in option_fields(cfg)}
    if unknown := [name for name in overrides if name.replace("-", "_") not in known]:
        raise OptionError(f"--resume-override: unknown option(s) {', '.join(unknown)}")
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"output folder {path} is a file, not a folder")
    entries = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    found = run_contents(path) if entries else []
    others = [e for e in entries if e not in RUN_FILES and e not in LEFTOVERS and not e.startswith(".")]
    if overwrite:
        if entries:
            _check_movable(path)
        return RunFolder(path, bool(found), True, False)
    if others and not found:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise RunFolderError(f"output folder {path} is not empty and holds no rlft run ({shown}); "
                             "choose another --output-dir, or pass --overwrite to move its contents aside")
    if not found:
        if resume and notes:
            log.info("--resume: no run in %s yet, starting a new one", path)
        return RunFolder(path, False, False, resume)
    if not resume:
        raise RunFolderError(
            f"output folder {path} already holds a run ({', '.join(found)}); "
            "pass --resume to continue it or --overwrite to replace it (or choose another --output-dir)")
    _check_resume_config(path, cfg, {o.replace("-", "_") for o in overrides}, notes)
    return RunFolder(path, True, False, True)


def _as_flag(name: str, value: Any) -> str:
    """A saved option as it is typed on the command line: ``--seed 0``, ``--quick`` / ``--no-quick`` for a flag,
    ``--rows None``, a list as its items, a string quoted when it holds a space."""
    option = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return option if value else f"--no-{option[2:]}"
    items = value if isinstance(value, (list, tuple)) else [value]
    return " ".join([
        option, *(repr(v) if isinstance(v, str) and (not v or any(c.isspace() for c in v)) else str(v) for v in items)
    ])


def _check_movable(path: Path) -> None:
    """Refuse ``--overwrite`` of a folder that cannot be moved aside: it holds the current folder, or is a mount
    point."""
    target, cwd = path.resolve(), Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise RunFolderError(f"--overwrite would move {path} aside, and it holds the current folder {cwd}; "
                             "run from another folder, or name a new subfolder as --output-dir")
    if os.path.ismount(target):
        raise RunFolderError(
            f"--overwrite cannot move {path} aside: it is a mount point; name a subfolder as --output-dir")


def _check_resume_config(path: Path, cfg: Any, overrides: set[str], notes: bool = True) -> None:
    config = path / CONFIG
    if not config.is_file():
        if notes:
            log.warning("--resume: %s has no %s to check the options against", path, CONFIG)
        return
    try:
        saved = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise RunFolderError(
            f"--resume: {config} is unreadable ({type(e).__name__}); pass --overwrite to start over") from None
    if not isinstance(saved, dict):
        raise RunFolderError(f"--resume: {config} does not hold a mapping of options; pass --overwrite to start over")
    diffs = config_differences(saved, cfg)
    refused = {k: v for k, v in diffs.items() if k not in overrides}
    if refused:
        listed = "; ".join(f"--{k.replace('_', '-')} {old!r} -> {new!r}" for k, (old, new) in refused.items())
        names = " ".join(k.replace("_", "-") for k in refused)
        if "resume_override" in {f.name for f in option_fields(cfg)}:
            advice = f"pass --resume-override {names} to resume with the new values anyway"
        else:  # rlft demo: each stage resumes with the options it started with, so there is nothing to override
            saved_values = " ".join(_as_flag(k, old) for k, (old, _) in refused.items())
            advice = (f"rerun with the saved values ({saved_values}), or pass --overwrite to start over (the folder is "
                      "moved aside), or choose another --output-dir")
        raise RunFolderError(f"--resume: options differ from the run in {path} ({listed}); {advice}")
    if diffs and notes:
        log.warning("--resume: resuming with changed options: %s",
                    "; ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in diffs.items()))


# ----------------------------------------------------------------------------- output files

MODEL_FOLDER_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                      "adapter_config.json", "adapter_model.safetensors")
"""Files that make a folder a model folder: commands never write their outputs into one."""


class OutputPathError(UsageError):
    """An output path (``--output``, ``--output-dir`` of an evaluation) that a command must not write to."""


def model_folder_file(folder: Path) -> str | None:
    """The first of :data:`MODEL_FOLDER_FILES` in ``folder`` (None: not a model folder)."""
    return next((name for name in MODEL_FOLDER_FILES if (Path(folder) / name).is_file()), None)


def check_output_file(path: str | Path, *, option: str = "--output", overwrite: bool = False,
                      also: tuple[Path, ...] = ()) -> Path:
    """Check that a command may write the file ``path`` (and its companion files ``also``, e.g. ``<name>.stats.json``),
    before any work: the rule of run folders for single files. Writes nothing; returns ``path`` as a ``Path``.

    Raises:
        OutputPathError: ``path`` names a folder (an existing one, or ``.``, ``..``, a trailing ``/``); its folder is
            a model folder (it holds ``config.json``, ``model.safetensors``, ...; even with ``--overwrite``); a
            folder on its way is a file; ``path`` or one of ``also`` exists (a folder always, a file unless
            ``overwrite``).
    """
    text = str(path)
    target = Path(path).expanduser()
    if text.endswith(("/", os.sep)) or target.name in ("", ".", "..") or target.is_dir():
        raise OutputPathError(f"{option} {text} is a folder; name a file to write (in it, or elsewhere)")
    parent = target.parent
    if (found := model_folder_file(parent)) is not None:
        raise OutputPathError(f"{option} {text} would write into the model folder {parent} (it holds {found}); "
                              f"choose another {option}")
    for folder in (parent, *parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise OutputPathError(f"{option} {text}: {folder} is a file, not a folder")
            break
    for file in (target, *also):
        if file.is_dir():
            raise OutputPathError(f"{option} {text}: {file} is a folder; choose another {option}")
        if file.exists() and not overwrite:
            raise OutputPathError(f"{option} {text}: {file} already exists; pass --overwrite to replace it, "
                                  f"or choose another {option}")
    return target


def _same_file(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


def check_outputs(outputs: dict[str, str | Path | None], inputs: Iterable[str | Path] = (), *,
                  overwrite: bool = False) -> dict[str, Path]:
    """Check, before any work, that a command or script may write each of ``outputs`` (``{option: path}``; None: not
    asked for): :func:`check_output_file` for each, and never one of ``inputs`` (not even with ``overwrite``) nor
    another of the outputs. Writes nothing; returns ``{option: Path}`` of the paths given.

    Raises:
        OutputPathError: an output is one of ``inputs`` (even with ``overwrite``), two options name the same file, or
            :func:`check_output_file` refuses one (a folder, inside a model folder, exists and not ``overwrite``).
    """
    given = {option: Path(path) for option, path in outputs.items() if path is not None}
    read = [Path(p) for p in inputs]
    for option, path in given.items():
        if (same := next((p for p in read if _same_file(p, path)), None)) is not None:
            raise OutputPathError(
                f"{option} {path} is the input {same}: writing it would replace it; choose another {option}")
        if (other := next((o for o, q in given.items() if o != option and _same_file(q, path)), None)) is not None:
            raise OutputPathError(f"{option} and {other} name the same file {path}; choose two files")
        check_output_file(path, option=option, overwrite=overwrite)
    return given
