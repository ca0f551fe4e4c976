"""scripts/studies/trace_settings.py: the per-setting statistics on hand-made traces (values derived by hand), the
percentile and line rules, the token count of a known text, and (with ../shared/data) the task list against the SFT
recipe's own correct-only filter."""

from __future__ import annotations

import pytest

from rlft.rewards.countdown import score_completions
from rlft.lab.script_io import run_script
from rlft.tasks.countdown.prompts import render_prompt
from rlft.tasks.countdown.traces import write_trace
from rlft.types import CountdownTask
from tests.conftest import SHARED_DATA, load_script

HELDOUT = SHARED_DATA / "countdown" / "train.parquet"

T3 = CountdownTask((3, 5, 7), 22)
T3B = CountdownTask((4, 9, 2), 26)  # 4+9=13, 13*2=26
T4 = CountdownTask((1, 2, 3, 4), 24)
TASKS = [T3, T3B, T4]


@pytest.fixture(scope="module")
def ts():
    return load_script("trace_settings")


def prompts(tasks):
    return [render_prompt("short", t) for t in tasks]


def truths(tasks):
    return [t.ground_truth() for t in tasks]


def test_give_up_after_the_first_dead_end_is_two_lines_and_wrong(ts):
    # ranked first steps of 3 5 7 -> 22 by |result - 22|: 3*7=21 (1) first; then 21 5: 21+5=26 (4) beats 21-5=16 (6)
    text = write_trace(T3, "bounded", seed=0, give_up=1.0, max_tries=6)
    assert text == " 3*7=21, 21+5=26, no.\nClosest: 3*7+5=26.</think>\n<answer>3 * 7 + 5</answer>"
    s = ts.trace_stats(prompts([T3]), [text], truths([T3]), [40])
    assert s["lines"] == 2 and s["correct"] == 0 and s["n_correct"] == 0 and s["correct3"] == 0
    assert s["correct_tokens"] is None and s["correct_p90"] is None and s["correct_max"] is None
    assert s["correct4"] is None and s["correct_tokens4"] is None  # no 4-number task
    assert score_completions(prompts([T3]), [text], truths([T3])) == [pytest.approx(0.1)]


def test_direct_traces_are_correct_one_line(ts):
    texts = [write_trace(t, "direct") for t in TASKS]
    s = ts.trace_stats(prompts(TASKS), texts, truths(TASKS), [10, 20, 60])
    assert s["n"] == 3 and s["n_correct"] == 3 and s["correct"] == s["correct3"] == s["correct4"] == 1.0
    assert s["lines"] == 1.0 and s["tokens"] == pytest.approx(30.0) and s["correct_tokens"] == pytest.approx(30.0)
    assert s["correct_tokens3"] == pytest.approx(15.0) and s["correct_tokens4"] == pytest.approx(60.0)
    assert s["correct_p90"] == 60 and s["correct_max"] == 60 and s["over_budget"] == 0


def test_mixed_traces_by_hand(ts):
    right3 = " 3*5=15, 15+7=22. Check: 3*5+7=22.</think>\n<answer>3 * 5 + 7</answer>"  # 1 line, correct
    wrong3 = " 4*9=36, 36-2=34, no.\nClosest: 4*9-2=34.</think>\n<answer>4 * 9 - 2</answer>"  # 2 lines, 34 != 26
    right4 = (" 4*3=12, 12+2=14, 14+1=15, no.\n4*3=12, 12*2=24, 24*1=24. Check: 4*3*2*1=24.</think>\n"
              "<answer>4 * 3 * 2 * 1</answer>")  # 2 lines, correct
    s = ts.trace_stats(prompts(TASKS), [right3, wrong3, right4], truths(TASKS), [30, 40, 300])
    assert s["n_correct"] == 2 and s["correct"] == pytest.approx(2 / 3)
    assert s["correct3"] == pytest.approx(0.5) and s["correct4"] == 1.0
    assert s["tokens"] == pytest.approx(370 / 3) and s["correct_tokens"] == pytest.approx(165.0)  # (30 + 300) / 2
    assert s["correct_tokens3"] == pytest.approx(30.0) and s["correct_tokens4"] == pytest.approx(300.0)
    assert s["correct_p90"] == 300 and s["correct_max"] == 300  # nearest rank: ceil(0.9 * 2) = 2nd of 30, 300
    assert s["over_budget"] == pytest.approx(1 / 3) and s["lines"] == pytest.approx(5 / 3)
    assert ts.trace_stats(prompts(TASKS), [right3, wrong3, right4], truths(TASKS), [30, 40, 300], budget=300)[
        "over_budget"] == 0  # "over" is strictly more
    with pytest.raises(ValueError, match="2 token counts|2 counts"):
        ts.trace_stats(prompts(TASKS), [right3, wrong3, right4], truths(TASKS), [30, 40])


def test_p90_and_lines(ts):
    assert ts.p90(list(range(1, 11))) == 9 and ts.p90(list(range(20, 0, -1))) == 18 and ts.p90([7]) == 7
    assert ts.p90([]) is None
    assert ts.count_lines(" a, no.\nb, no.\nc.</think>\n<answer>x</answer>") == 3


def test_token_count_of_a_known_text(ts, smol_tokenizer):
    # SmolLM2 splits digits one by one and a space before a digit is its own token:
    # 3 * 5 = 1 5 , " " 1 5 + 7 = 2 2 . -> 16, then EOS
    assert ts.count_tokens(smol_tokenizer, ["3*5=15, 15+7=22.", ""]) == [17, 1]


def test_settings_are_the_asked_grid(ts):
    names = [s.name for s in ts.SETTINGS]
    assert names[:2] == ["direct", "search (2 dead ends)"] and len(names) == 10 and len(set(names)) == 10
    assert ts.START in ts.SETTINGS and "bounded 0 / 10" in names and "bounded 0.15 / 6" in names


def test_bad_num_train_is_one_line_exit_2(ts, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_script(ts.main, ["--num-train", "0", "--markdown", str(tmp_path / "t.md")], prog="trace_settings.py")
    assert e.value.code == 2 and "--num-train" in capsys.readouterr().err and not (tmp_path / "t.md").exists()


@pytest.mark.skipif(not HELDOUT.is_file(), reason="needs ../shared/data")
def test_task_list_matches_the_recipes_correct_only_filter(ts):
    from dataclasses import replace

    from rlft.models import DEFAULT_MODEL, load_tokenizer
    from rlft.recipes.sft import load_sft_pairs

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    s = ts.measure(ts.START, 60, tokenizer, str(HELDOUT))  # raises when the prompts differ from the recipe's
    kept = load_sft_pairs(replace(ts.sft_config(ts.START, 60, str(HELDOUT)), correct_only=True), tokenizer)
    assert s["n"] == 60 and s["n_correct"] == len(kept) and 0 < len(kept) < 60
