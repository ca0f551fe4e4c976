"""Where a run ran: rlft's code, the libraries and the machine.

Each time a run folder is opened (a fresh run or a ``--resume``), :func:`record_environment` appends one JSON line to
``run_dir/environment.jsonl``. A run rebuilt later, on another machine or another commit, can then be told apart
from the archived one before its results are compared: two trainings with the same options can differ (bf16
kernels, changed code), and the config alone does not say which code ran.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ENVIRONMENT = "environment.jsonl"


def git_commit(folder: Path) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout holding ``folder``: HEAD's full hash, and whether tracked files
    differ from it. ``(None, None)`` outside a checkout or without git (an installed wheel)."""
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True,
                                  timeout=10).stdout.strip()

        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None


def read_cpuinfo() -> str:
    """The text of ``/proc/cpuinfo``; empty where it cannot be read (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name, from ``cpuinfo`` (the text of ``/proc/cpuinfo``; None reads it), else
    :func:`platform.processor`."""
    for line in (read_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


CPU_ID_FIELDS = ("vendor_id", "cpu family", "model", "stepping")
"""The ``/proc/cpuinfo`` fields that tell CPU generations apart where the ``model name`` does not: a cloud VM may name
two generations alike ("Intel(R) Xeon(R) Processor"), and their bf16 kernels may round differently."""


def cpu_id(cpuinfo: str | None = None) -> str | None:
    """The first processor's :data:`CPU_ID_FIELDS` as ``"GenuineIntel family 6 model 167 stepping 1"``, from
    ``cpuinfo`` (the text of ``/proc/cpuinfo``; None reads it); the fields present, in that order; None where none are
    (not Linux, or Arm, which names others)."""
    found: dict[str, str] = {}
    for line in (read_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep:
            if found:
                break  # the end of the first processor's block
            continue
        if key in CPU_ID_FIELDS and key not in found:
            found[key] = value.strip()
    parts = [found["vendor_id"]] if "vendor_id" in found else []
    parts += [f"{'family' if key == 'cpu family' else key} {found[key]}" for key in CPU_ID_FIELDS[1:] if key in found]
    return " ".join(parts) or None


BF16_FLAGS = ("amx_bf16", "avx512_bf16", "avx_ne_convert", "bf16")
"""``/proc/cpuinfo`` flags that name a bf16 instruction set (x86 AMX and AVX-512, AVX-NE-CONVERT; ``bf16`` on Arm).
bf16 matrix products round differently on each, so a bf16 training run rebuilt on another of them is another file
(docs/results/countdown-real/adapters/README.md: AMX gives the archived start back, avx512_bf16 alone does not)."""


def cpu_bf16(cpuinfo: str | None = None) -> list[str]:
    """The :data:`BF16_FLAGS` the CPU has, in that order: parsed from ``cpuinfo`` (the text of ``/proc/cpuinfo``;
    None reads it). Empty where there are none or the file cannot be read (not Linux)."""
    flags: set[str] = set()
    for line in (read_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, Arm
            flags.update(value.split())
    return [flag for flag in BF16_FLAGS if flag in flags]


def environment() -> dict:
    """What ran: ``rlft_commit`` and ``rlft_dirty`` (:func:`git_commit` of rlft's source), the versions of python,
    torch and transformers, the ``cpu``, its generation (``cpu_id``, :func:`cpu_id`) and bf16 instruction sets
    (``cpu_bf16``, :func:`cpu_bf16`), torch's intra-op ``threads`` (a sum split over other threads rounds
    differently), the ``gpu`` (CUDA device 0's name, or None), the host and the command line."""
    import torch
    import transformers

    commit, dirty = git_commit(Path(__file__).resolve().parent)
    cpuinfo = read_cpuinfo()
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rlft_commit": commit, "rlft_dirty": dirty,
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cpu": cpu_name(cpuinfo), "cpu_id": cpu_id(cpuinfo), "cpu_bf16": cpu_bf16(cpuinfo),
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "host": platform.node(), "argv": sys.argv}


def record_environment(run_dir: str | Path) -> dict:
    """Append :func:`environment` as one line to ``run_dir/environment.jsonl``; returns it."""
    env = environment()
    with (Path(run_dir) / ENVIRONMENT).open("a") as f:
        f.write(json.dumps(env) + "\n")
    return env
