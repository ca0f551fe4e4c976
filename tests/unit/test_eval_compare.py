"""`rlft eval compare`: paired B - A of two evaluation files against hand-computed values, refusals (other tasks,
other settings, outputs), and Holm's step-down adjustment (rlft.eval.stats.holm) against a hand computation."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import pytest

from rlft.cli import main
from rlft.eval.compare import compare_files, compare_results, load
from rlft.eval.stats import Z_95, format_difference, holm, normal_p_value, z_for_level
from rlft.validation import UsageError

TASKS = [{"nums": [1, 2, 3], "target": 6}, {"nums": [2, 3, 4], "target": 9}, {"nums": [3, 4, 5], "target": 12},
         {"nums": [1, 2, 3, 4], "target": 10}, {"nums": [2, 3, 4, 5],
                                                "target": 14}, {"nums": [3, 4, 5, 6], "target": 18}]
A_SCORES = [1.0, 0.0, 0.1, 1.0, 0.0, 0.1]
A_CUT = [False, True, False, False, True, False]
B_SCORES = [1.0, 1.0, 1.0, 0.1, 0.0, 1.0]
B_CUT = [False, False, False, True, False, False]
Y_SCORES = [1.0] * 6


def eval_file(path, scores, cut=None, tasks=TASKS, **config):
    """A greedy `rlft eval countdown --output` JSON written by hand (k = 1); returns its path as a string."""
    cut = cut or [False] * len(scores)
    n = len(scores)
    path.write_text(json.dumps({
        "num_tasks": n, "k": 1, "mode": "greedy", "mean_score": sum(scores) / n,
        "accuracy": sum(s == 1.0 for s in scores) / n, "format_rate": sum(s >= 0.1 for s in scores) / n,
        "pass_at_k": {"1": sum(s == 1.0 for s in scores) / n}, "mean_completion_tokens": 10.0,
        "truncated_rate": sum(cut) / n, "task_scores": [[s] for s in scores], "tasks": tasks,
        "task_truncated": [[c] for c in cut], "task_tokens": [[256 if c else 10] for c in cut],
        "config": {"model": str(path), "max_new_tokens": 256, "prompt_template": "base", **config}}))
    return str(path)


def test_hand_computed_pair(tmp_path):
    a = eval_file(tmp_path / "a.json", A_SCORES, A_CUT)
    b = eval_file(tmp_path / "b.json", B_SCORES, B_CUT)
    report = compare_files([a, b])
    (c,) = report["comparisons"]
    assert c["tasks_checked"] and report["holm"] is None and report["convention"].startswith("B - A")
    s = c["slices"]
    # d = B - A per task = [0, 1, 0.9, -0.9, 0, 0.9]; mean 1.9 / 6 = 0.316667
    # deviations -0.316667, 0.683333, 0.583333, -1.216667, -0.316667, 0.583333; squares sum 2.828333; / 5 = 0.565667
    # sd 0.752108, se = sd / sqrt(6) = 0.307046, half = 1.959964 * 0.307046 = 0.601801 -> [-0.285134, +0.918468]
    m = s["all"]
    assert (m["n"], m["mean_a"], m["mean_b"]) == (6, pytest.approx(2.2 / 6), pytest.approx(4.1 / 6))
    assert m["diff"] == pytest.approx(1.9 / 6)
    assert (m["ci_low"], m["ci_high"]) == (pytest.approx(-0.285134, abs=1e-5), pytest.approx(0.918468, abs=1e-5))
    assert (m["better"], m["worse"], m["equal"]) == (3, 1, 2)
    assert (m["cut_a"], m["cut_b"]) == (pytest.approx(2 / 6), pytest.approx(1 / 6))
    # the 3- and 4-number slices have 3 tasks each, fewer than MIN_SLICE_TASKS: `rlft eval compare` gives them no
    # interval; compare_results without `sized` (the study scripts') still does, checked by hand below
    assert [(s[k]["n"], s[k]["ci_low"], s[k]["ci_high"], s[k]["p"]) for k in ("3", "4")] == [(3, None, None, None)] * 2
    raw = compare_results(load(a)[0], load(b)[0])
    assert raw["all"] == m and {k: v for k, v in raw["3"].items() if not k.startswith(("ci_", "p"))} == {
        k: v for k, v in s["3"].items() if not k.startswith(("ci_", "p"))}
    # 3 numbers: d = [0, 1, 0.9], mean 0.633333; squares of deviations 0.401111 + 0.134444 + 0.071111 = 0.606667;
    # / 2 = 0.303333, sd 0.550757, se 0.317980, half 0.623229 -> [+0.010104, +1.256562]
    t = raw["3"]
    assert (t["n"], t["diff"]) == (3, pytest.approx(0.633333, abs=1e-6))
    assert (t["ci_low"], t["ci_high"]) == (pytest.approx(0.010104, abs=1e-5), pytest.approx(1.256562, abs=1e-5))
    assert (t["better"], t["worse"], t["equal"], t["cut_a"], t["cut_b"]) == (2, 0, 1, pytest.approx(1 / 3), 0.0)
    # 4 numbers: d = [-0.9, 0, 0.9], mean 0, sd 0.9, se 0.519615, half 1.018427
    f = raw["4"]
    assert (f["diff"], f["ci_low"], f["ci_high"]) == (pytest.approx(0.0), pytest.approx(-1.018427, abs=1e-5),
                                                      pytest.approx(1.018427, abs=1e-5))
    assert (f["better"], f["worse"], f["equal"], f["p"]) == (1, 1, 1, pytest.approx(1.0))
    # swapping the files flips the sign, not the width
    back = compare_files([b, a])["comparisons"][0]["slices"]["all"]
    assert (back["diff"], back["ci_low"], back["better"], back["worse"]) == (pytest.approx(-1.9 / 6),
                                                                             pytest.approx(-0.918468, abs=1e-5), 1, 3)


def test_command_prints_sign_and_writes_json(tmp_path, capsys):
    a, b = eval_file(tmp_path / "a.json", A_SCORES, A_CUT), eval_file(tmp_path / "b.json", B_SCORES, B_CUT)
    out = tmp_path / "cmp.json"
    main(["eval", "compare", a, b, "--json", str(out)])
    text = capsys.readouterr().out
    assert "B - A" in text and "+0.317  [-0.285, +0.918]" in text and "3/1/2" in text
    assert json.loads(out.read_text())["comparisons"][0]["slices"]["all"]["better"] == 3
    with pytest.raises(SystemExit) as e:  # an existing --json, without --overwrite
        main(["eval", "compare", a, b, "--json", str(out)])
    assert e.value.code == 2 and "already exists" in capsys.readouterr().err
    main(["eval", "compare", a, b, "--json", str(out), "--overwrite"])
    with pytest.raises(SystemExit) as e:  # an input, even with --overwrite
        main(["eval", "compare", a, b, "--json", b, "--overwrite"])
    assert e.value.code == 2 and f"--json {b} is the input {b}" in capsys.readouterr().err


def refused(capsys, *args) -> str:
    with pytest.raises(SystemExit) as e:
        main(["eval", "compare", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_refuses_other_tasks_of_the_same_count(tmp_path, capsys):
    a = eval_file(tmp_path / "a.json", A_SCORES)
    other = [*TASKS[:4], {"nums": [2, 3, 4, 5], "target": 15}, TASKS[5]]
    b = eval_file(tmp_path / "b.json", A_SCORES, tasks=other)  # same scores: a count check alone would print +0.000
    err = refused(capsys, a, b)
    assert "different tasks" in err and a in err and b in err and "task 4" in err and "1 of 6 differ" in err
    short = eval_file(tmp_path / "short.json", A_SCORES[:5], tasks=TASKS[:5])
    assert "has 6 tasks" in refused(capsys, a, short)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({**json.loads((tmp_path / "a.json").read_text()), "tasks": []}))
    assert "--allow-unrecorded-tasks" in refused(capsys, a, str(bare))
    report = compare_files([a, str(bare)], unrecorded_tasks=True)
    assert not report["comparisons"][0]["tasks_checked"] and list(report["comparisons"][0]["slices"]) == ["all"]


def test_refuses_bad_files_and_other_settings(tmp_path, capsys):
    a = eval_file(tmp_path / "a.json", A_SCORES)
    assert "no such file" in refused(capsys, a, str(tmp_path / "missing.json"))
    assert "two models or more are needed, as A.json B.json (B minus A): got 1 file" in refused(capsys, a)
    assert "named twice" in refused(capsys, a, a)
    (tmp_path / "junk.json").write_text("{not json")
    assert "junk.json: not an `rlft eval countdown` JSON" in refused(capsys, a, str(tmp_path / "junk.json"))
    long = eval_file(tmp_path / "long.json", B_SCORES, max_new_tokens=1024)
    assert "different max_new_tokens (256 and 1024)" in refused(capsys, a, long)
    chat = eval_file(tmp_path / "chat.json", B_SCORES, prompt_template="chat")
    assert "--allow-setting prompt_template" in refused(capsys, a, chat)
    notes = compare_files([a, chat], allow_setting=("prompt_template",))["comparisons"][0]["notes"]
    assert notes == [f"prompt_template differs (allowed): 'base' in {a}, 'chat' in {chat}"]
    # the loop stop: a file that does not record it ran without it (off), so it pairs with an explicit None
    stopped = eval_file(tmp_path / "stopped.json", B_SCORES, stop_repeats=5)
    assert "--allow-setting stop_repeats" in refused(capsys, a, stopped)
    notes = compare_files([a, stopped], allow_setting=("stop_repeats",))["comparisons"][0]["notes"]
    assert notes == [f"stop_repeats differs (allowed): 'off' in {a}, 5 in {stopped}"]
    assert compare_files([a, eval_file(tmp_path / "off.json", B_SCORES,
                                       stop_repeats=None)])["comparisons"][0]["notes"] == []


def test_turn_budgets_are_checked_between_files_of_one_environment(tmp_path, capsys):
    """Two calculator evaluations at 4 and 8 turns are refused (the tools study's first validation file scored at 4);
    a file without tools records the defaults, which bound nothing, so a tools-vs-plain comparison passes."""
    four = eval_file(tmp_path / "four.json", A_SCORES, env="countdown-calc", max_turns=4, max_observation_tokens=32)
    eight = eval_file(tmp_path / "eight.json", B_SCORES, env="countdown-calc", max_turns=8, max_observation_tokens=32)
    assert "different max_turns (4 and 8)" in refused(capsys, four, eight)
    notes = compare_files([four, eight], allow_setting=("max_turns",))["comparisons"][0]["notes"]
    assert notes == [f"max_turns differs (allowed): 4 in {four}, 8 in {eight}"]
    plain = eval_file(tmp_path / "plain.json", B_SCORES, env=None, max_turns=8, max_observation_tokens=32)
    assert compare_files([four, plain])["comparisons"][0]["notes"] == []
    obs = eval_file(tmp_path / "obs.json", B_SCORES, env="countdown-calc", max_turns=4, max_observation_tokens=64)
    assert "different max_observation_tokens (32 and 64)" in refused(capsys, four, obs)
    # sampled files without tools: nothing to say of turn budgets they do not record
    from types import SimpleNamespace

    from rlft.eval.compare import check_settings

    sampled = SimpleNamespace(mode="sampled", k=4)
    config = {"max_new_tokens": 256, "prompt_template": "base", "temperature": 1.0, "top_p": 1.0}
    assert check_settings((sampled, config), (sampled, dict(config)), "a", "b") == []


def test_unset_max_new_tokens_is_read_from_a_cut_answer(tmp_path, capsys):
    a = eval_file(tmp_path / "a.json", A_SCORES, A_CUT, max_new_tokens=None)  # cut samples have 256 tokens
    b = eval_file(tmp_path / "b.json", B_SCORES, B_CUT, max_new_tokens=512)
    assert "different max_new_tokens (256 and 512)" in refused(capsys, a, b)


def test_holm_by_hand():
    # p sorted: 0.01 (rank 1, tested at 0.05/3 = 0.0167: rejected), 0.03 (rank 2, at 0.05/2 = 0.025: not rejected, the
    # procedure stops), 0.04 (rank 3: held at the stopping level 0.025). Adjusted: 3 * 0.01 = 0.03, max(0.03, 2 * 0.03)
    # = 0.06, max(0.06, 1 * 0.04) = 0.06.
    out = holm([0.04, 0.01, 0.03])
    assert [h["rank"] for h in out] == [3, 1, 2]
    assert [h["level"] for h in out] == [pytest.approx(0.025), pytest.approx(0.05 / 3), pytest.approx(0.025)]
    assert [h["p_adjusted"] for h in out] == [pytest.approx(0.06), pytest.approx(0.03), pytest.approx(0.06)]
    assert [h["rejected"] for h in out] == [False, True, False]
    # stop at rank 1: 0.04 >= 0.05 / 2; both held at 0.025; adjusted 0.08 and max(0.08, 0.30)
    out = holm([0.30, 0.04])
    assert [h["level"] for h in out] == [pytest.approx(0.025)] * 2
    assert [h["p_adjusted"] for h in out] == [pytest.approx(0.30), pytest.approx(0.08)]
    assert holm([0.2]) == [{"rank": 1, "level": 0.05, "p_adjusted": 0.2, "rejected": False}]
    assert z_for_level(0.05) == pytest.approx(Z_95) and z_for_level(0.025) == pytest.approx(2.241403, abs=1e-6)
    assert normal_p_value(1.0, 1.0) == pytest.approx(0.05)  # the interval [0, 2] touches 0: p = alpha
    assert normal_p_value(0.0, 0.0) == 1.0 and normal_p_value(0.5, 0.0) == 0.0
    with pytest.raises(ValueError):
        holm([])


def test_format_difference_by_hand():
    d = {"diff": 0.025, "ci_low": 0.0019, "ci_high": 0.0486, "n": 500}
    assert format_difference(d) == "+0.025 [+0.002, +0.049]"
    assert format_difference({"diff": -0.00004, "ci_low": -0.0231, "ci_high": 0.02301},
                             4) == "-0.0000 [-0.0231, +0.0230]"
    with pytest.raises(KeyError):
        format_difference({"diff": 0.1})


def test_holm_intervals_of_a_batch(tmp_path, capsys):
    base = eval_file(tmp_path / "base.json", A_SCORES)
    x = eval_file(tmp_path / "x.json", B_SCORES)
    y = eval_file(tmp_path / "y.json", Y_SCORES)
    report = compare_files([base, x, y])
    assert report["holm"] == 2
    sx, sy = (c["slices"]["all"] for c in report["comparisons"])
    # y - base = [0, 1, 0.9, 0, 1, 0.9]: mean 3.8 / 6 = 0.633333; squares of deviations 2 * (0.401111 + 0.134444 +
    # 0.071111) = 1.213333, / 5 = 0.242667, sd 0.492612, se 0.201108; z = 0.633333 / 0.201108 = 3.1492
    se_y = math.sqrt(1.213333 / 5) / math.sqrt(6)
    p_y = 2 * (1 - NormalDist().cdf(0.633333 / se_y))  # 0.00164
    assert sy["p"] == pytest.approx(p_y, rel=1e-4) and sx["p"] == pytest.approx(0.302386, abs=1e-5)
    # Holm, m = 2: y has rank 1 (level 0.05 / 2 = 0.025, rejected: 0.0016 < 0.025); x rank 2 at 0.05 / 1 (0.30: not)
    assert (sy["holm"]["rank"], sy["holm"]["level"], sy["holm"]["rejected"]) == (1, pytest.approx(0.025), True)
    assert (sx["holm"]["rank"], sx["holm"]["level"], sx["holm"]["rejected"]) == (2, pytest.approx(0.05), False)
    # y's adjusted interval: 0.633333 +- 2.241403 * 0.201108 = +- 0.450763 -> [0.182570, 1.084097] (raw +- 0.394164)
    assert (sy["holm"]["ci_low"], sy["holm"]["ci_high"]) == (pytest.approx(0.182570, abs=1e-5),
                                                             pytest.approx(1.084097, abs=1e-5))
    assert sy["ci_low"] == pytest.approx(0.633333 - 0.394164, abs=1e-5)
    assert (sx["holm"]["ci_low"], sx["holm"]["ci_high"]) == (pytest.approx(sx["ci_low"]), pytest.approx(sx["ci_high"]))
    assert sy["holm"]["p_adjusted"] == pytest.approx(2 * p_y, rel=1e-4) and sx["holm"]["p_adjusted"] == pytest.approx(
        sx["p"])
    main(["eval", "compare", base, x, y])
    assert "Holm-adjusted across the batch of 2 comparisons" in capsys.readouterr().out
    assert compare_files([base, x, y], holm_adjust=False)["holm"] is None


def test_a_different_file_in_the_batch_is_refused_before_printing(tmp_path, capsys):
    base, x = eval_file(tmp_path / "base.json", A_SCORES), eval_file(tmp_path / "x.json", B_SCORES)
    bad = eval_file(tmp_path / "bad.json", B_SCORES, tasks=[*TASKS[:5], {"nums": [1, 1, 1, 1], "target": 4}])
    err = refused(capsys, base, x, bad)
    assert "bad.json" in err
    with pytest.raises(UsageError):
        compare_files([base, x, bad])


def test_allow_setting_choices_are_the_checked_settings():
    import typing

    from rlft.eval.compare import SETTINGS, Setting

    assert set(typing.get_args(Setting)) == set(SETTINGS)


A1_SCORES = [0.1, 0.0, 1.0, 1.0, 0.1, 0.0]  # model A's second seed


def test_seeds_pool_each_model_by_task(tmp_path, capsys):
    a0, a1 = eval_file(tmp_path / "a0.json", A_SCORES, A_CUT), eval_file(tmp_path / "a1.json", A1_SCORES)
    b0, b1 = eval_file(tmp_path / "b0.json", B_SCORES, B_CUT), eval_file(tmp_path / "b1.json", Y_SCORES)
    report = compare_files([a0, a1, b0, b1], seeds=2)
    (c,) = report["comparisons"]
    assert (c["a"], c["b"], report["seeds"]) == (f"{a0} + {a1}", f"{b0} + {b1}", 2)
    # seed means A = [0.55, 0, 0.55, 1, 0.05, 0.05], B = [1, 1, 1, 0.55, 0.5, 1]; d = [0.45, 1, 0.45, -0.45, 0.45, 0.95]
    # mean 2.85 / 6 = 0.475; squared deviations sum 1.35875, / 5 = 0.27175, sd 0.521296, se 0.212818,
    # half = 1.959964 * 0.212818 = 0.417115 -> [+0.057885, +0.892115]
    m = c["slices"]["all"]
    assert (m["mean_a"], m["mean_b"], m["diff"]) == (pytest.approx(2.2 / 6), pytest.approx(5.05 / 6),
                                                     pytest.approx(0.475))
    assert (m["ci_low"], m["ci_high"]) == (pytest.approx(0.057885, abs=1e-5), pytest.approx(0.892115, abs=1e-5))
    assert (m["better"], m["worse"], m["equal"]) == (5, 1, 0)
    assert (m["cut_a"], m["cut_b"]) == (pytest.approx(2 / 12), pytest.approx(1 / 12))
    assert c["slices"]["3"]["diff"] == pytest.approx(1.9 / 3) and c["slices"]["4"]["diff"] == pytest.approx(0.95 / 3)
    # one seed a model is the plain comparison
    assert compare_files([a0, b0],
                         seeds=1)["comparisons"][0]["slices"] == compare_files([a0, b0])["comparisons"][0]["slices"]
    main(["eval", "compare", "--seeds", "2", a0, a1, b0, b1])
    text = capsys.readouterr().out
    assert "mean over its 2 seed files" in text and f"B = {b0} + {b1}" in text and "+0.475  [+0.058, +0.892]" in text


def test_seeds_refuses_files_that_are_not_one_model(tmp_path, capsys):
    a0, a1 = eval_file(tmp_path / "a0.json", A_SCORES), eval_file(tmp_path / "a1.json", A1_SCORES)
    b0 = eval_file(tmp_path / "b0.json", B_SCORES)
    assert "3 files a model (--seeds 3; BASE one or 3)" in refused(capsys, "--seeds", "3", a0, a1, b0, a0 + ".x",
                                                                   b0 + ".y")
    assert "got 2 files" in refused(capsys, "--seeds", "2", a0, a1)
    other = eval_file(tmp_path / "other.json", A1_SCORES, tasks=[*TASKS[:5], {"nums": [3, 4, 5, 6], "target": 17}])
    err = refused(capsys, "--seeds", "2", a0, other, b0, eval_file(tmp_path / "b1.json", B_SCORES))
    assert "different tasks" in err and a0 in err and other in err
    long = eval_file(tmp_path / "long.json", A1_SCORES, max_new_tokens=1024)  # a model's seeds share every setting
    err = refused(capsys, a0, long, b0, str(tmp_path / "b1.json"), "--seeds", "2", "--allow-setting", "max_new_tokens")
    assert "different max_new_tokens (256 and 1024)" in err


def test_seeds_a_one_file_base_stands_for_each_seed(tmp_path, capsys):
    a0 = eval_file(tmp_path / "a0.json", A_SCORES, A_CUT)
    b0, b1 = eval_file(tmp_path / "b0.json", B_SCORES, B_CUT), eval_file(tmp_path / "b1.json", Y_SCORES)
    report = compare_files([a0, b0, b1], seeds=2)
    (c,) = report["comparisons"]
    assert (c["a"], c["b"]) == (a0, f"{b0} + {b1}")
    # B's seed means [1, 1, 1, 0.55, 0.5, 1] minus A's one run [1, 0, 0.1, 1, 0, 0.1]: d = [0, 1, 0.9, -0.45, 0.5, 0.9],
    # mean 2.85 / 6 = 0.475, better / worse / equal 4 / 1 / 1
    m = c["slices"]["all"]
    assert (m["mean_a"], m["diff"]) == (pytest.approx(2.2 / 6), pytest.approx(0.475))
    assert (m["better"], m["worse"], m["equal"]) == (4, 1, 1)
    assert m["cut_a"] == pytest.approx(2 / 6)
    copy = tmp_path / "a0_copy.json"  # the same as giving BASE's file once per seed
    copy.write_text((tmp_path / "a0.json").read_text())
    assert compare_files([a0, str(copy), b0, b1], seeds=2)["comparisons"][0]["slices"] == c["slices"]
    main(["eval", "compare", "--seeds", "2", a0, b0, b1])
    assert f"A = {a0}\n" in capsys.readouterr().out
