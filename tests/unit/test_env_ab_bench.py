"""bench/env_ab.py: the arms alternate which runs first, only B gets the extra variables, a failing command stops it."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/env_ab")


def test_arm_order_alternates(bench):
    assert bench.arm_order(1) == ["A", "B"]
    assert bench.arm_order(3) == ["A", "B", "B", "A", "A", "B"]


@pytest.mark.parametrize("item", ["NOEQUALS", "=value"])
def test_bad_assignment_is_refused(bench, item):
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        bench.parse_assignments([item])


def test_only_b_sees_the_variable(bench, tmp_path, monkeypatch):
    monkeypatch.delenv("RLFT_ENV_AB_PROBE", raising=False)
    out = tmp_path / "report.txt"
    probe = "import os; print('probe=' + os.environ.get('RLFT_ENV_AB_PROBE', 'unset'))"
    assert bench.main(["--set", "RLFT_ENV_AB_PROBE=on", "--rounds", "2", "--output", str(out), "--",
                       sys.executable, "-c", probe]) == 0
    lines = out.read_text().splitlines()
    runs = [(line.split(":")[0].split("] ")[1], lines[i + 1].strip()) for i, line in enumerate(lines)
            if line.startswith("[")]
    assert runs == [("A", "probe=unset"), ("B", "probe=on"), ("B", "probe=on"), ("A", "probe=unset")]
    assert lines[-1].startswith("B / A wall time: ")


def test_a_failing_command_returns_its_status(bench):
    assert bench.main(["--set", "X=1", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
