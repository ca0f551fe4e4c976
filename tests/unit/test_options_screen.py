"""scripts/studies/options_screen.py: the cost row, pass@k and the paired differences by hand, the Markdown and PNG,
and its one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlft.eval.countdown import read_eval_file
from rlft.lab.script_io import ScriptError
from rlft.validation import UsageError
from tests.conftest import load_script

screen = load_script("options_screen")
TASKS = [{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3], "target": 5}, {"nums": [1, 2, 3, 4], "target": 24},
         {"nums": [2, 3, 4, 5], "target": 7}]


def _eval(path: Path, scores: list[list[float]], tasks: list[dict] = TASKS, config: dict | None = None) -> Path:
    n, k = len(scores), len(scores[0])
    flat = [x for row in scores for x in row]
    path.write_text(json.dumps({
        "num_tasks": n, "k": k, "mode": "greedy" if k == 1 else "sampled", "mean_score": sum(flat) / len(flat),
        "accuracy": 0.0, "format_rate": 1.0, "pass_at_k": {"1": 0.0}, "mean_completion_tokens": 100.0,
        "truncated_rate": 0.0, "task_scores": scores, "tasks": tasks, "task_truncated": [[False] * k] * n,
        "task_tokens": [[1] * k] * n, "task_values": [[None] * k] * n, "task_certainty": [[None] * k] * n,
        **({"config": config} if config else {})}))
    return path


def _metrics(path: Path, hints: bool) -> Path:
    path.write_text("".join(json.dumps({
        "step": s, "groups/tried": 16, "groups/kept": 8, "tokens/generated": 1000 * s, "flops/estimated": 1e12 * s,
        "reward/accuracy": 0.1 * s, **({"hint/groups": 3.0, "hint/solved": 1.0} if hints else {})}) + "\n"
        for s in (1, 2)))
    return path


def test_cost_row_and_pass_at_k_by_hand(tmp_path):
    records = [json.loads(line) for line in _metrics(tmp_path / "m.jsonl", True).read_text().splitlines()]
    assert screen.cost(records) == [2, "32", "16", "3,000", "2e+12", "6", "2", "0.150"]
    no_hints = [{k: v for k, v in records[0].items() if not k.startswith("hint")}]
    assert screen.cost(no_hints) == [1, "16", "8", "1,000", "1e+12", "-", "-", "0.100"]
    big = [{**records[0], "tokens/generated": 1_234_567}]  # summed exactly, not through a 6-digit format
    assert screen.cost(big)[3] == "1,234,567"
    result = read_eval_file(_eval(tmp_path / "s.json", [[0.1, 1.0], [0.0, 0.1], [1.0, 1.0], [0.1, 0.1]]))[0]
    assert screen.pass_at_all(result) == [[1.0], [0.0], [1.0], [0.0]]
    assert screen.by_size(result, screen.pass_at_all(result), 4) == [[1.0], [0.0]]


def test_main_writes_tables_and_png_and_names_bad_input(tmp_path, capsys):
    start = _eval(tmp_path / "start.json", [[0.1], [0.0], [0.0], [0.0]])
    uniform = _eval(tmp_path / "u.json", [[1.0], [0.1], [0.0], [0.1]])
    hint = _eval(tmp_path / "h.json", [[1.0], [1.0], [1.0], [0.1]])
    (tmp_path / "u").mkdir(), (tmp_path / "h").mkdir()
    runs = ["--run", f"uniform={_metrics(tmp_path / 'u' / 'metrics.jsonl', False)},{uniform}",
            "--run", f"hint={_metrics(tmp_path / 'h' / 'metrics.jsonl', True)},{hint}"]
    passk = ["--passk", f"start={_eval(tmp_path / 'ps.json', [[0.0, 0.1]] * 4)}",
             "--passk", f"hint={_eval(tmp_path / 'ph.json', [[1.0, 0.1], [0.1, 0.1], [0.0, 1.0], [0.0, 0.0]])}"]
    md, png = tmp_path / "s.md", tmp_path / "s.png"
    screen.main(["--start", str(start), *runs, *passk, "--markdown", str(md), "--out", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert "| hint | 2 | 32 | 16 | 3,000 | 2e+12 | 6 | 2 | 0.150 |" in text
    assert "| uniform | 2 | 32 | 16 | 3,000 | 2e+12 | - | - | 0.150 |" in text
    # hint - uniform: per task +0, +0.9, +1, +0 -> mixed +0.475; 4 numbers: +1, +0 -> +0.5 (interval by hand below)
    assert "| hint | 0.775 / 1.000 / 0.550 | 0.750 / 0.500 | 0% | 100 | +0.475 [" in text
    # accuracy: hint solves tasks 0-2, uniform task 0: +0, +1, +1, +0 -> +0.5, sd 0.577 -> half-width 0.566
    assert text.count("+0.500 [-0.066, +1.066]") == 2  # this and the pass@2 difference below
    assert "| start | 0.025 / 0.050 / 0.000 | 0.000 / 0.000 | 0% | 100 | -0.275 [" in text
    # pass@2: hint passes tasks 1 and 3 (2 of 4), the start none; pass@1 = 2 correct of 8 samples
    assert "| hint | 0.250 / 0.250 | 0.500 / 0.500 | +0.500 [-0.066, +1.066] | +0.500 [-0.480, +1.480] |" in text
    screen.main([*runs, "--markdown", str(tmp_path / "n.md"), "--out", str(tmp_path / "n.png")])  # no start
    assert "| start |" not in (tmp_path / "n.md").read_text() and "| hint | 0.775" in (tmp_path / "n.md").read_text()
    with pytest.raises(ScriptError, match="--baseline nope: no --run or --control has that label"):
        screen.main(["--start", str(start), *runs, "--baseline", "nope", "--markdown", str(tmp_path / "a.md"),
                     "--out", str(tmp_path / "a.png")])
    other = _eval(tmp_path / "o.json", [[0.0]] * 4, TASKS[::-1])
    with pytest.raises(UsageError, match="are evaluations of different tasks"):
        screen.main(["--start", str(other), *runs, "--markdown", str(tmp_path / "b.md"),
                     "--out", str(tmp_path / "b.png")])
    with pytest.raises(ScriptError, match="one file must be labelled start"):
        screen.main(["--start", str(start), *runs, "--passk", f"hint={tmp_path / 'ph.json'}",
                     "--markdown", str(tmp_path / "c.md"), "--out", str(tmp_path / "c.png")])


def test_a_control_run_is_costed_compared_and_can_be_the_baseline(tmp_path):
    """An SFT control (no groups, no samples) gets '-' for them, its FLOPs, and its row in the greedy table; as the
    baseline, the RL run minus it, by hand."""
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"step": s, "loss/sft": 1.0, "flops/estimated": 1.5e12 * s}) + "\n"
                           for s in (1, 2, 3)))
    records = [json.loads(line) for line in sft.read_text().splitlines()]
    assert screen.cost(records) == [3, "-", "-", "-", "4.5e+12", "-", "-", "-"]
    rl = _eval(tmp_path / "rl.json", [[1.0], [0.1], [0.0], [0.1]])
    control = _eval(tmp_path / "c.json", [[0.1], [0.1], [1.0], [0.0]])
    (tmp_path / "r").mkdir()
    rl_metrics = _metrics(tmp_path / "r" / "metrics.jsonl", False)
    args = ["--run", f"rl={rl_metrics},{rl}", "--control", f"sft={sft},{control}",
            "--baseline", "sft", "--markdown", str(tmp_path / "s.md"), "--out", str(tmp_path / "s.png")]
    screen.main(args)
    text = (tmp_path / "s.md").read_text()
    assert "| sft | 3 | - | - | - | 4.5e+12 | - | - | - |" in text
    # rl - sft: per task +0.9, 0, -1, +0.1 -> mixed 0.000; 4 numbers: -1, +0.1 -> -0.450
    assert "| rl | 0.300 / 0.550 / 0.050 | 0.250 / 0.000 | 0% | 100 | +0.000 [" in text
    assert "| -0.450 [" in text
    with pytest.raises(ScriptError, match="a label given twice"):
        screen.main([*args[:4], "--control", f"rl={sft},{control}", *args[4:6], "--markdown", str(tmp_path / "t.md"),
                     "--out", str(tmp_path / "t.png")])


def test_evaluations_with_different_settings_are_refused_unless_allowed(tmp_path, capsys):
    """The same check as `rlft eval compare`: a run scored at another token budget, or with the calculator at another
    turn budget, is refused naming both labels; --allow-setting accepts it with a note."""
    cfg = {"max_new_tokens": 256, "prompt_template": "base", "env": None}
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    base = _eval(tmp_path / "a.json", [[0.1]] * 4, config=cfg)
    runs = ["--run", f"a={_metrics(tmp_path / 'a' / 'metrics.jsonl', False)},{base}", "--baseline", "a"]
    short = _eval(tmp_path / "b.json", [[1.0]] * 4, config={**cfg, "max_new_tokens": 128})
    other = ["--run", f"b={_metrics(tmp_path / 'b' / 'metrics.jsonl', False)},{short}"]
    with pytest.raises(UsageError, match=r"a and b were evaluated with different max_new_tokens \(256 and 128\)"):
        screen.main([*runs, *other, "--markdown", str(tmp_path / "x.md"), "--out", str(tmp_path / "x.png")])
    screen.main([*runs, *other, "--allow-setting", "max_new_tokens", "--markdown", str(tmp_path / "y.md"),
                 "--out", str(tmp_path / "y.png")])
    assert "note: max_new_tokens differs (allowed): 256 in a, 128 in b" in capsys.readouterr().out
    calc = {**cfg, "prompt_template": "calc", "env": "countdown-calc", "max_observation_tokens": 32}
    start = _eval(tmp_path / "s.json", [[0.0]] * 4, config={**calc, "max_turns": 4})
    run = _eval(tmp_path / "c.json", [[0.1]] * 4, config={**calc, "max_turns": 8})
    calc_runs = ["--run", f"a={tmp_path / 'a' / 'metrics.jsonl'},{run}", "--baseline", "a"]
    with pytest.raises(UsageError, match="start and a were evaluated with different max_turns"):
        screen.main(["--start", str(start), *calc_runs, "--markdown", str(tmp_path / "z.md"),
                     "--out", str(tmp_path / "z.png")])
