"""Helpers the bench scripts share: peak memory, a callback that times TRL trainer steps, and the precision options.

Imported as ``benchlib`` by scripts run as ``python bench/<script>.py`` (their folder is on sys.path).
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import torch


def peak_memory(device: torch.device) -> str:
    """CUDA: the allocator's peak; CPU: the process's max RSS (it only grows: one measured side per process)."""
    if device.type == "cuda":
        return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (CUDA allocator)"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (max RSS)"


def step_timer(device: torch.device, times: list[float]):
    """A transformers ``TrainerCallback`` appending each optimizer step's wall seconds to ``times``
    (from step begin to step end; CUDA is synchronised at both ends)."""
    from transformers import TrainerCallback

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            sync()
            times.append(time.perf_counter() - self.t0)

    return StepTimer()


def add_precision_options(parser) -> None:
    """``--dtype`` (rlft's: auto or float32) and ``--trl-precision`` (default, bf16 or float32):
    see :func:`trl_precision`."""
    parser.add_argument(
        "--dtype", choices=["auto", "float32"], default="auto",
        help="rlft's --dtype (auto: bf16 weights on CUDA; bf16 autocast over float32 weights on a CPU with native bf16)"
    )
    parser.add_argument(
        "--trl-precision", choices=["default", "bf16", "float32"], default="default",
        help="TRL's bf16 flag: default leaves it unset (TRL then turns it on unless fp16 is), bf16 / float32 set it")


def trl_precision(args) -> dict:
    """The keyword TRL's config gets for ``--trl-precision``: nothing (TRL's own default), ``bf16=True`` (autocast
    bfloat16, on the CPU too), or ``bf16=False`` (float32 compute)."""
    return {"default": {}, "bf16": {"bf16": True}, "float32": {"bf16": False}}[args.trl_precision]


class Report:
    """Lines printed as they come (flushed) and kept, to write to ``--output`` at the end: ``say(text)``,
    ``write(path)``."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def write(self, path) -> None:
        """Write the kept lines to ``path`` atomically (:mod:`rlft.fsio`), its folder made when missing. The script
        checks ``path`` first (:func:`rlft.lab.script_io.check_outputs`)."""
        from rlft.fsio import atomic_write_text

        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(path).expanduser(), "\n".join(self.lines) + "\n")
