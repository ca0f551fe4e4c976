"""scripts/studies/pass_rate_screen.py: the runs' totals by hand, the Markdown table and PNG, and its one-line errors;
and bench/tool_rollout.py's candidate names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlft.lab.script_io import ScriptError
from tests.conftest import load_script


@pytest.fixture(scope="module")
def screen():
    return load_script("pass_rate_screen")


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _step(step: int, tried: int, **extra) -> dict:
    return {"step": step, "groups/tried": tried, "groups/kept": 8, "tokens/generated": 100 * tried,
            "flops/estimated": 1e12 * step, **extra}


def test_summary_by_hand(screen):
    records = [_step(1, 24, **{"curriculum/groups_saved": 2.0, "curriculum/flops_saved": 1e10}),
               _step(2, 16, **{"curriculum/groups_saved": -1.0, "curriculum/flops_saved": -5e9})]
    evals = [{"step": 0, "eval/score": 0.2}, *records, {"step": 2, "eval/score": 0.25}]
    s = screen.summary(records, evals)
    assert (s["steps"], s["tried"], s["kept"], s["tokens"], s["flops"]) == (2, 40, 16, 4000, 2e12)
    assert s["per_kept"] == 2.5 and s["groups_saved"] == 1.0 and s["flops_saved"] == 5e9
    assert (s["score_first"], s["score_last"]) == (0.2, 0.25)
    assert "| x | 2 | 40 | 16 | 2.50 | 4,000 | 2e+12 | 1.0 | 5e+09 | 0.200 -> 0.250 |" in screen.table({"x": s})


def test_main_writes_the_table_and_png_and_names_bad_input(screen, tmp_path):
    passing = _write(tmp_path / "p.jsonl", [{"step": 0, "eval/score": 0.1}] + [
        _step(s, 16, **{"curriculum/p_n3_r0": 0.5, "curriculum/q_n3_r0": 0.6, "curriculum/groups_saved": 1.0})
        for s in (1, 2)])
    uniform = _write(tmp_path / "u.jsonl", [_step(s, 24) for s in (1, 2)])
    md, png = tmp_path / "s.md", tmp_path / "s.png"
    screen.main(["--pass-rate", str(passing), "--uniform", str(uniform), "--markdown", str(md), "--out", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert "| pass-rate | 2 | 32 | 16 | 2.00 |" in text and "| uniform | 2 | 48 | 16 | 3.00 |" in text
    with pytest.raises(ScriptError, match="u.jsonl has no curriculum/q_<bucket> records"):
        screen.main(["--pass-rate", str(uniform), "--uniform", str(uniform), "--markdown", str(tmp_path / "a.md"),
                     "--out", str(tmp_path / "a.png")])
    empty = _write(tmp_path / "e.jsonl", [{"step": 0, "eval/score": 0.1}])
    with pytest.raises(ScriptError, match="e.jsonl holds no RL step records"):
        screen.main(["--pass-rate", str(passing), "--uniform", str(empty), "--markdown", str(tmp_path / "b.md"),
                     "--out", str(tmp_path / "b.png")])


def test_tool_rollout_bench_refuses_an_unknown_candidate(capsys):
    bench = load_script("bench/tool_rollout")
    with pytest.raises(SystemExit) as exit_info:
        bench.run_script(bench.main, ["--model", "m", "--candidates", "refill-inline,fast"], prog="tool_rollout.py")
    assert exit_info.value.code == 2 and "unknown candidates ['fast']" in capsys.readouterr().err
