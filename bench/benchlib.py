"""Helpers the bench scripts share: peak memory, and a callback that times TRL trainer steps.

Imported as ``benchlib`` by scripts run as ``python bench/<script>.py`` (their folder is on sys.path).
"""

from __future__ import annotations

import resource
import time

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
