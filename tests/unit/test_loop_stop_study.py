"""scripts/studies/loop_stop_study.py: the simulated stop on hand-made completions (cut, tokens saved, scores changed)."""

from __future__ import annotations

from tests.conftest import load_script

study = load_script("loop_stop_study")
PROMPT = "User: Using the numbers [8, 20, 4], create an equation that equals 32. Answer as <answer> expression </answer>.\nAssistant: <think>"
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
