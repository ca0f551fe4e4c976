"""scripts/studies/horizon_curves.py: FLOPs counted from the base model through --from, the step-to-step paired
differences by hand, the PNG, and its one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlft.lab.script_io import ScriptError
from rlft.validation import UsageError
from tests.conftest import load_script

curves = load_script("horizon_curves")
TASKS = [{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3], "target": 5}, {"nums": [1, 2, 3, 4], "target": 24},
         {"nums": [2, 3, 4, 5], "target": 7}]
CONFIG = {"max_new_tokens": 256, "prompt_template": "base", "env": None}


def _eval(path: Path, scores: list[float], tasks: list[dict] = TASKS, config: dict = CONFIG) -> Path:
    path.write_text(json.dumps({
        "num_tasks": len(scores), "k": 1, "mode": "greedy", "mean_score": sum(scores) / len(scores),
        "accuracy": 0.0, "format_rate": 1.0, "pass_at_k": {"1": 0.0}, "mean_completion_tokens": 100.0,
        "truncated_rate": 0.0, "task_scores": [[x] for x in scores], "tasks": tasks,
        "task_truncated": [[x == 0.0] for x in scores], "task_tokens": [[1]] * len(scores),
        "task_values": [[None]] * len(scores), "task_certainty": [[None]] * len(scores), "config": config}))
    return path


def _metrics(path: Path, flops_per_step: float, steps: int, resumed_at: int | None = None) -> Path:
    records = [{"step": s, "flops/estimated": flops_per_step * s} for s in range(1, steps + 1)]
    if resumed_at is not None:  # a resume logs its steps again; the last record of a step counts
        records[resumed_at - 1:resumed_at] = [{"step": resumed_at, "flops/estimated": -1.0},
                                                {"step": resumed_at, "flops/estimated": flops_per_step * resumed_at}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_curves_count_flops_from_the_base_model_and_pair_each_point_with_the_previous(tmp_path, capsys):
    sft = _metrics(tmp_path / "sft.jsonl", 1e12, 4, resumed_at=2)
    rl = _metrics(tmp_path / "rl.jsonl", 5e12, 2)
    s2 = _eval(tmp_path / "s2.json", [0.1, 0.0, 0.0, 0.1])
    s4 = _eval(tmp_path / "s4.json", [1.0, 0.1, 0.0, 0.1])
    r2 = _eval(tmp_path / "r2.json", [1.0, 1.0, 1.0, 0.1])
    md, png = tmp_path / "c.md", tmp_path / "c.png"
    curves.main(["--curve", f"sft={sft}", "--curve", f"rl={rl}", "--from", "rl=sft:2",
                 "--point", f"sft:2={s2}", "--point", f"sft:4={s4}", "--point", f"rl:0={s2}", "--point", f"rl:2={r2}",
                 "--markdown", str(md), "--out", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert "| sft | 2 | 2e+12 | 0.050 / 0.050 / 0.050 | 50% | - | - |" in text
    # sft:4 - sft:2 per task +0.9, +0.1, 0, 0 -> +0.250; 4 numbers 0, 0 -> +0.000 [+0.000, +0.000]
    assert "| sft | 4 | 4e+12 | 0.300 / 0.550 / 0.050 | 25% | +0.250 [" in text
    assert text.count("+0.000 [+0.000, +0.000]") == 1
    # rl starts at sft's step 2 (2e12): its step 2 is 2e12 + 2 x 5e12
    assert "| rl | 0 | 2e+12 |" in text and "| rl | 2 | 1.2e+13 | 0.775 / 1.000 / 0.550 | 0% | +0.725 [" in text
    # 4 numbers: +1.0, +0.0 -> +0.500, sd 0.707 -> half-width 1.96 x 0.5 = 0.980
    assert "+0.500 [-0.480, +1.480]" in text


def test_bad_input_is_named_in_one_line(tmp_path):
    sft = _metrics(tmp_path / "sft.jsonl", 1e12, 2)
    s1 = _eval(tmp_path / "s1.json", [0.1, 0.0, 0.0, 0.1])
    out = ["--markdown", str(tmp_path / "x.md"), "--out", str(tmp_path / "x.png")]
    with pytest.raises(ScriptError, match="sft's metrics log no step 3"):
        curves.main(["--curve", f"sft={sft}", "--point", f"sft:3={s1}", *out])
    with pytest.raises(ScriptError, match="expected LABEL:STEP=PATH"):
        curves.main(["--curve", f"sft={sft}", "--point", f"sft:two={s1}", *out])
    with pytest.raises(ScriptError, match="expected LABEL=OTHER:STEP"):
        curves.main(["--curve", f"sft={sft}", "--from", "sft=other", "--point", f"sft:1={s1}", *out])
    with pytest.raises(ScriptError, match="a cycle through a -> b -> a"):
        curves.main(["--curve", f"a={sft}", "--curve", f"b={sft}", "--from", "a=b:1", "--from", "b=a:1",
                     "--point", f"a:1={s1}", *out])
    with pytest.raises(ScriptError, match="no --curve is labelled rl"):
        curves.main(["--curve", f"sft={sft}", "--point", f"rl:1={s1}", *out])
    other = _eval(tmp_path / "o.json", [0.0] * 4, TASKS[::-1])
    with pytest.raises(UsageError, match="are evaluations of different tasks"):
        curves.main(["--curve", f"sft={sft}", "--point", f"sft:1={s1}", "--point", f"sft:2={other}", *out])
    short = _eval(tmp_path / "short.json", [0.0] * 4, config={**CONFIG, "max_new_tokens": 128})
    with pytest.raises(UsageError, match="different max_new_tokens"):
        curves.main(["--curve", f"sft={sft}", "--point", f"sft:1={s1}", "--point", f"sft:2={short}", *out])
