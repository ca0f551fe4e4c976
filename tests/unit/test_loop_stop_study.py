"""scripts/studies/loop_stop_study.py: the simulated stop on hand-made completions (cut, tokens saved, scores
changed)."""

from __future__ import annotations

from tests.conftest import load_script

study = load_script("loop_stop_study")
PROMPT = ("User: Using the numbers [8, 20, 4], create an equation that equals 32. "
          "Answer as <answer> expression </answer>.\nAssistant: <think>")
LINE = " 8+4=12, 12+20=32, no.\n"


def completion(text, score, finished, tokens):
    return study.Completion("g", PROMPT, text, [8, 20, 4], 32, score, finished, tokens)


def count_characters(text):  # one "token" a character: saved tokens are read off the strings
    return len(text)


def test_simulated_stop_by_hand():
    loop = completion(LINE * 6, 0.0, False, 6 * len(LINE))  # truncated: no answer either way
    late = completion(LINE * 3 + "Closest: 8+20+4=32.</think>\n<answer>8 + 20 + 4</answer>", 1.0, True, 200)
    wrong = completion(LINE * 3 + "</think>\n<answer>8 + 20 - 4</answer>", 0.1, True, 100)
    plain = completion(" 8+20=28, 28+4=32.</think>\n<answer>8 + 20 + 4</answer>", 1.0, True, 20)
    r3 = study.simulate([loop, late, wrong, plain], 3, count_characters)
    assert r3["stopped"] == 3 and r3["stopped_finished"] == 2
    saved = (6 * len(LINE) - 3 * len(LINE)) + (200 - 3 * len(LINE)) + (100 - 3 * len(LINE))
    assert abs(r3["saved_share"] - saved / (6 * len(LINE) + 200 + 100 + 20)) < 1e-12
    assert r3["changed"] == 2 and r3["lost_correct"] == 1 and r3["lost_format"] == 1
    assert abs(r3["diff"]["diff"] - (-1.0 - 0.1) / 4) < 1e-12 and r3["diff"]["worse"] == 2
    r4 = study.simulate([loop, late, wrong, plain], 4, count_characters)
    assert r4["stopped"] == 1 and r4["changed"] == 0 and r4["diff"]["diff"] == 0.0
    assert study.check_scores([late, wrong, plain]) == 0


def results_folder(tmp_path):
    """A ``--results`` folder holding one pairs file of one pair: a correct chosen completion and a rejected one that
    repeats LINE four times (truncated, score 0)."""
    import json

    data = tmp_path / "results" / "countdown-real" / "data"
    data.mkdir(parents=True)
    row = {"prompt": PROMPT, "nums": [8, 20, 4], "target": 32,
           "chosen": " 8+20=28, 28+4=32.</think>\n<answer>8 + 20 + 4</answer>", "score_chosen": 1.0,
           "chosen_finish_reason": "stop", "rejected": LINE * 4, "score_rejected": 0.0,
           "rejected_finish_reason": "length"}
    (data / "dpo_s0_pairs.jsonl").write_text(json.dumps(row) + "\n")
    return tmp_path / "results", data / "dpo_s0_pairs.jsonl"


def error_line(argv, capsys) -> str:
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        study.run_script(study.main, argv, prog="loop_stop_study.py")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("loop_stop_study.py: error: "), err
    return err


def test_output_is_never_an_input_nor_an_existing_file_without_overwrite(tmp_path, capsys):
    import json

    results, pairs = results_folder(tmp_path)
    before = pairs.read_text()
    for extra in ([], ["--overwrite"]):  # an input is refused even with --overwrite
        err = error_line(["--results", str(results), "--output", str(pairs), *extra], capsys)
        assert "--output" in err and "is the input" in err and "dpo_s0_pairs.jsonl" in err
    assert pairs.read_text() == before
    old = tmp_path / "rows.json"
    old.write_text("keep me")
    assert "rows.json already exists; pass --overwrite" in error_line(
        ["--results", str(results), "--repeats", "3", "--output", str(old)], capsys)
    assert old.read_text() == "keep me"
    study.run_script(study.main, ["--results", str(results), "--repeats", "3", "--output", str(old), "--overwrite"])
    rows = json.loads(old.read_text())
    # by hand: 2 completions; the rejected one's third LINE ends the loop at N = 3 (not finished, score 0 -> 0)
    assert [(r["group"], r["n"], r["completions"], r["stopped"], r["stopped_finished"], r["changed"],
             r["score_mismatches"]) for r in rows] == [("sft_start_pairs", 3, 2, 1, 0, 0, 0)]
    assert pairs.read_text() == before


def test_bad_options_and_files_are_one_line(tmp_path, capsys):
    results, pairs = results_folder(tmp_path)
    assert "--repeats '3,x': expected comma-separated whole numbers >= 2" in error_line(
        ["--results", str(results), "--repeats", "3,x"], capsys)
    assert "no evaluation or pair files found" in error_line(["--results", str(tmp_path / "none")], capsys)
    pairs.write_text(pairs.read_text() + '{"prompt": "x"}\n')
    assert f"{pairs}: line 2: no field 'chosen'" in error_line(["--results", str(results)], capsys)
