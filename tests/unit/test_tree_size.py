"""The tracked tree stays small: model files are outputs, never committed.

A GPU machine receives the working tree in one transfer of at most 64 MiB, and a checkout is what CI clones; so no
tracked file may be over 2 MB (a LoRA adapter of the built-in model is 19.6 MB) and the whole tracked tree stays under
25 MB. Results name their model files by SHA-256 and the command that rebuilds them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_BYTES = 2 * 1000 * 1000
MAX_TREE_BYTES = 25 * 1000 * 1000
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def oversized(sizes: dict[str, int], limit: int) -> list[str]:
    return [f"{name} ({size / 1e6:.1f} MB)" for name, size in sorted(sizes.items()) if size > limit]


def test_the_check_flags_a_large_file():
    assert oversized({"a.txt": 10, "adapter.safetensors": 19_593_064},
                     MAX_FILE_BYTES) == ["adapter.safetensors (19.6 MB)"]


def test_no_tracked_file_is_over_2_mb():
    sizes = {str(p.relative_to(ROOT)): p.stat().st_size for p in tracked_files()}
    assert sizes, "git ls-files listed nothing"
    big = oversized(sizes, MAX_FILE_BYTES)
    assert not big, ("tracked files over 2 MB (model files are outputs: record their SHA-256 and rebuild command): "
                     + ", ".join(big))


def test_no_model_weights_are_tracked():
    weights = [str(p.relative_to(ROOT)) for p in tracked_files() if p.name.endswith(WEIGHT_SUFFIXES)]
    assert not weights, "model weights are tracked (never commit one; name it by SHA-256 in the results): " + ", ".join(
        weights)


def test_the_tracked_tree_is_at_most_25_mb():
    total = sum(p.stat().st_size for p in tracked_files())
    assert total <= MAX_TREE_BYTES, f"the tracked tree is {total / 1e6:.1f} MB, over {MAX_TREE_BYTES / 1e6:.0f} MB"
