"""rlft.provenance: every opening of a run folder appends which code, libraries and machine ran, so a rebuilt run
can be told from the archived one; git state by hand on a scratch repository."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from rlft.provenance import ENVIRONMENT, cpu_bf16, cpu_id, git_commit
from rlft.run_folder import claim_run_dir

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Config:
    output_dir: str


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_each_opening_appends_the_code_and_machine(tmp_path):
    out = tmp_path / "run"
    claim_run_dir(Config(str(out))).open()
    (line,) = (out / ENVIRONMENT).read_text().splitlines()
    env = json.loads(line)
    expected, _ = git_commit(REPO)
    assert env["rlft_commit"] == expected and env["torch"] == torch.__version__
    assert env["cpu"] and isinstance(env["cpu_bf16"], list) and env["gpu"] is None and isinstance(env["argv"], list)
    assert env["threads"] == torch.get_num_threads() and (env["cpu_id"] is None or isinstance(env["cpu_id"], str))
    if expected is not None:  # a git checkout (tests and CI run in one)
        assert env["rlft_commit"] == git(REPO, "rev-parse", "HEAD") and isinstance(env["rlft_dirty"], bool)
    # the file alone does not make the folder hold a run: a second start is allowed, and adds its own line
    claim_run_dir(Config(str(out))).open()
    assert len((out / ENVIRONMENT).read_text().splitlines()) == 2


def test_git_commit_and_dirty_by_hand(tmp_path):
    assert git_commit(tmp_path) == (None, None)  # not a checkout
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "commit", "-q", "-m", "one")
    head = git(tmp_path, "rev-parse", "HEAD")
    assert git_commit(tmp_path) == (head, False)
    (tmp_path / "untracked.txt").write_text("not code")
    assert git_commit(tmp_path) == (head, False)  # untracked files do not count
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == (head, True)


def test_cpu_bf16_reads_the_flags_lines_by_hand():
    amx = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
           "flags\t\t: fpu avx512f avx512_bf16 amx_tile amx_bf16\n")
    epyc = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx512_bf16\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"
    assert cpu_bf16(amx) == ["amx_bf16", "avx512_bf16"]
    assert cpu_bf16(epyc) == ["avx512_bf16"]
    assert cpu_bf16(arm) == ["bf16"]
    assert cpu_bf16("flags\t: fpu sse avx2 amx_bf16x\n") == []  # whole flags only
    assert cpu_bf16("") == []


def test_cpu_id_reads_the_first_processor_by_hand():
    two = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) "
           "Processor\nstepping\t: 8\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 167\n")
    assert cpu_id(two) == "GenuineIntel family 6 model 143 stepping 8"  # "model name" is not "model"; CPU 1 not read
    epyc = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
    assert cpu_id(epyc) == "AuthenticAMD family 25 model 17"
    assert cpu_id("processor\t: 0\nFeatures\t: fp asimd bf16\n") is None  # Arm names other fields
    assert cpu_id("") is None
