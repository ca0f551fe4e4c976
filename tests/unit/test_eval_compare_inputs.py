"""`rlft eval compare`'s input checks (rlft.eval.compare_inputs) and its small slices: with --seeds N the files group
into whole models by count, and a grouping a missing file shifted is refused by name; one model's weights are not two
seeds; one file under two paths is refused; scores must be finite numbers in [0, 1]; a slice of too few tasks gets no
interval (MIN_SLICE_TASKS), the mixed slice and the Holm batches of the others unchanged."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from statistics import NormalDist

import pytest

from rlft.cli import main
from rlft.eval.compare import MIN_SLICE_TASKS, compare_files
from rlft.eval.compare_inputs import seed_stem
from rlft.validation import UsageError
from tests.unit.test_eval_compare import A1_SCORES, A_SCORES, B_SCORES, TASKS, Y_SCORES, eval_file, refused


def test_the_count_of_files_must_make_whole_models(tmp_path, capsys):
    files = [eval_file(tmp_path / f"m{i}.json", A_SCORES) for i in range(5)]
    err = refused(capsys, "--seeds", "3", *files)
    assert "got 5 files (--seeds 3 takes 6, 9, ... files, or 4, 7, ... with a one-file BASE)" in err
    with pytest.raises(UsageError, match="got 5 files"):
        compare_files(files, seeds=3)
    one = refused(capsys, files[0])  # --seeds 1: as before
    assert "got 1 file" in one and "takes" not in one


def test_a_missing_seed_file_is_refused_not_regrouped(tmp_path, capsys):
    def files(*names, scores=A_SCORES):
        return [eval_file(tmp_path / f"{n}.json", scores, model=f"runs/{n}/model") for n in names]

    # B's seed 1 forgotten: 3 files fit BASE A_s0 + model (A_s1, B_s0); before, this exited 0 with a pooled number
    err = refused(capsys, "--seeds", "2", *files("A_s0", "A_s1", "B_s0"))
    assert "A_s1.json would be a seed of" in err and "B_s0.json" in err and "likely missing or out of order" in err
    assert "missing" in refused(capsys, "--seeds", "2", *files("A", "A_s1", "B_s0"))  # the probe's names
    assert "missing" in refused(capsys, "--seeds", "2", *files("A_s0", "A_s1", "B_s0", "B_s1", "C_s0"))
    assert "missing" in refused(capsys, "--seeds", "3", *files("A_s0", "A_s1", "A_s2", "B_s0"))
    # the same shift seen only in the models evaluated (file names without a seed)
    shifted = [eval_file(tmp_path / f"e{i}.json", A_SCORES, model=m)
               for i, m in enumerate(["runs/A/seed0/model", "runs/A/seed1/model", "runs/B/seed0/model"])]
    assert "model (runs/A/seed1/model) matches that of" in refused(capsys, "--seeds", "2", *shifted)
    # groupings that agree are read as before: two models of two seeds, a shared start, one model under two templates
    assert len(compare_files(files("A_s0", "A_s1", "B_s0", "B_s1"), seeds=2)["comparisons"]) == 1
    start = eval_file(tmp_path / "start.json", A_SCORES, model="runs/sft/model")
    assert compare_files([start, *files("B_s0", "B_s1")], seeds=2)["base"] == start
    chat = [eval_file(tmp_path / f"A_s{i}_chat.json", B_SCORES, model=f"runs/A_s{i}/model", prompt_template="chat")
            for i in (0, 1)]
    assert compare_files([*files("A_s0", "A_s1"), *chat], seeds=2, allow_setting=("prompt_template",))["seeds"] == 2
    assert seed_stem("runs/A_s1.json") == "runs/A.json" and seed_stem("grpo/seed-0/model") == "grpo/model"
    assert seed_stem("runs/lr1e4/eval_500.json") == "runs/lr1e4/eval_500.json"  # no seed in it: kept whole


def test_one_model_file_is_not_two_seeds(tmp_path, capsys):
    a0 = eval_file(tmp_path / "a0.json", A_SCORES, model_sha256="ab" * 32)
    a1 = eval_file(tmp_path / "a1.json", A1_SCORES, model_sha256="ab" * 32)
    b0, b1 = eval_file(tmp_path / "b0.json", B_SCORES), eval_file(tmp_path / "b1.json", Y_SCORES)
    err = refused(capsys, "--seeds", "2", a0, a1, b0, b1)
    assert f"{a0} and {a1} record the same weights (model_sha256 abababababababab...)" in err
    other = eval_file(tmp_path / "a1_other.json", A1_SCORES, model_sha256="cd" * 32)
    assert compare_files([a0, other, b0, b1], seeds=2)["comparisons"][0]["a"] == f"{a0} + {other}"
    # the same weights in two models (here under two prompt templates) are a comparison, not refused
    chat = eval_file(tmp_path / "chat.json", B_SCORES, model_sha256="ab" * 32, prompt_template="chat")
    assert compare_files([a0, chat], allow_setting=("prompt_template",))["comparisons"][0]["b"] == chat


def test_one_file_under_two_paths_is_refused(tmp_path, capsys):
    a = eval_file(tmp_path / "a.json", A_SCORES)
    b = eval_file(tmp_path / "b.json", B_SCORES)
    os.link(a, tmp_path / "hard.json")  # another name of the same inode: before, compared with itself
    (tmp_path / "sub").mkdir()
    (tmp_path / "soft.json").symlink_to(a)
    for other in (str(tmp_path / "hard.json"), str(tmp_path / "soft.json"), str(tmp_path / "sub" / ".." / "a.json")):
        err = refused(capsys, a, b, other)
        assert f"{other} is named twice (as {a} too: the same file under another path)" in err
    with pytest.raises(UsageError, match="named twice"):
        compare_files([a, str(tmp_path / "hard.json")])
    copy = tmp_path / "copy.json"  # a copy is another file (other weights are told apart by model_sha256)
    copy.write_text((tmp_path / "a.json").read_text())
    assert compare_files([a, str(copy)])["comparisons"][0]["slices"]["all"]["diff"] == 0.0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1", None, 1.5, -0.1, True, [1.0]])
def test_a_bad_score_is_refused_naming_file_task_and_field(tmp_path, capsys, value):
    a = eval_file(tmp_path / "a.json", A_SCORES)
    bad = tmp_path / "bad.json"
    data = json.loads(Path(eval_file(tmp_path / "b.json", B_SCORES)).read_text())
    data["task_scores"][2][0] = value  # json writes NaN / Infinity literals, which Python's reader accepts
    bad.write_text(json.dumps(data))
    err = refused(capsys, a, str(bad))
    assert f"{bad}: task_scores[2][0] (task 2, sample 0) is " in err and "finite number in [0, 1]" in err
    with pytest.raises(UsageError, match=r"task_scores\[2\]\[0\]"):
        compare_files([a, str(bad)])


def test_bad_per_task_rows_are_refused(tmp_path, capsys):
    a = eval_file(tmp_path / "a.json", A_SCORES)
    data = json.loads(Path(eval_file(tmp_path / "b.json", B_SCORES)).read_text())
    for field, row, expected in (("task_scores", 0.5, "task_scores[1] is 0.5, not a list"),
                                 ("task_truncated", ["yes"], "task_truncated[1] is ['yes']: task 1 needs one"),
                                 ("tasks", {"target": 9}, "tasks[1] is {'target': 9}, not a task")):
        bad = tmp_path / f"bad_{field}.json"
        bad.write_text(json.dumps({**data, field: [*data[field][:1], row, *data[field][2:]]}))
        assert f"{bad}: {expected}" in refused(capsys, a, str(bad))


# 10 tasks of 3 numbers and 1 of 4: A scores 0 everywhere; B 1 on the first five 3-number tasks and the 4-number one
SMALL_TASKS = [{"nums": [1, 2, t], "target": t + 3} for t in range(10)] + [{"nums": [1, 2, 3, 4], "target": 10}]
ZEROS = [0.0] * 11
B_SMALL = [1.0] * 5 + [0.0] * 5 + [1.0]


def test_a_slice_of_too_few_tasks_gets_no_interval(tmp_path, capsys):
    a = eval_file(tmp_path / "a.json", ZEROS, tasks=SMALL_TASKS)
    b = eval_file(tmp_path / "b.json", B_SMALL, tasks=SMALL_TASKS)
    s = compare_files([a, b])["comparisons"][0]["slices"]
    assert MIN_SLICE_TASKS == 10
    # 4 numbers: one task, d = [1]: before, a zero-width interval [1, 1] with p = 0; now none, the means still given
    four = s["4"]
    assert (four["n"], four["diff"], four["ci_low"], four["ci_high"], four["p"]) == (1, 1.0, None, None, None)
    assert (four["mean_a"], four["mean_b"], four["better"]) == (0.0, 1.0, 1)
    # 3 numbers: 10 tasks, d = five 1s and five 0s: mean 0.5, var 10 * 0.25 / 9 = 0.277778, se sqrt(0.277778 / 10) =
    # 1/6, half 1.959964 / 6 = 0.326661 -> [0.173339, 0.826661]; z = 3, p = 2 (1 - Phi(3)) = 0.0026998
    three = s["3"]
    assert (three["ci_low"], three["ci_high"]) == (pytest.approx(0.173339, rel=1e-5), pytest.approx(0.826661, rel=1e-5))
    assert three["p"] == pytest.approx(0.0026998, rel=1e-4)
    # mixed, unaffected: 11 tasks, d = six 1s and five 0s, mean 6/11; var (6 (5/11)^2 + 5 (6/11)^2) / 10 = 3/11,
    # se sqrt(3/11 / 11) = sqrt(3)/11 = 0.157459, half 0.308614 -> [0.236840, 0.854069]
    mixed = s["all"]
    assert mixed["diff"] == pytest.approx(6 / 11)
    assert (mixed["ci_low"], mixed["ci_high"]) == (pytest.approx(0.236840, rel=1e-5), pytest.approx(0.854069, rel=1e-5))
    # one task fewer of 3 numbers (9): under the minimum too
    a9 = eval_file(tmp_path / "a9.json", ZEROS[1:], tasks=SMALL_TASKS[1:])
    b9 = eval_file(tmp_path / "b9.json", B_SMALL[1:], tasks=SMALL_TASKS[1:])
    assert compare_files([a9, b9])["comparisons"][0]["slices"]["3"]["ci_low"] is None
    # a one-task evaluation: its mixed slice has no interval either (before: zero width, p = 0)
    one = [eval_file(tmp_path / f"one_{x}.json", [x], tasks=TASKS[:1]) for x in (0.0, 1.0)]
    assert compare_files(one)["comparisons"][0]["slices"]["all"]["p"] is None
    out = tmp_path / "cmp.json"
    main(["eval", "compare", a, b, "--json", str(out)])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("4 numbers"))
    assert "n too small" in row and "+1.000" in row
    assert json.loads(out.read_text())["comparisons"][0]["slices"]["4"]["ci_low"] is None


def test_holm_batches_leave_out_small_slices(tmp_path, capsys):
    base = eval_file(tmp_path / "base.json", ZEROS, tasks=SMALL_TASKS)
    x = eval_file(tmp_path / "x.json", B_SMALL, tasks=SMALL_TASKS)
    y = eval_file(tmp_path / "y.json", [1.0] * 11, tasks=SMALL_TASKS)  # d = 1 on every task: zero width, p = 0
    report = compare_files([base, x, y])
    sx, sy = (c["slices"] for c in report["comparisons"])
    assert sx["4"]["holm"] is None and sy["4"]["holm"] is None
    # 3 numbers, m = 2: y (p = 0) rank 1 at 0.05 / 2; x (p = 0.0027) rank 2 at 0.05 / 1, p_adjusted max(2 * 0, 0.0027)
    assert (sy["3"]["holm"]["rank"], sy["3"]["holm"]["level"]) == (1, pytest.approx(0.025))
    assert (sx["3"]["holm"]["rank"], sx["3"]["holm"]["level"]) == (2, pytest.approx(0.05))
    assert sx["3"]["holm"]["p_adjusted"] == pytest.approx(2 * (1 - NormalDist().cdf(3.0)), rel=1e-4)
    # the mixed slice's batch is as without the small slice: x's Holm interval at level 0.05 is its raw interval
    assert (sx["all"]["holm"]["ci_low"], sx["all"]["holm"]["ci_high"]) == (
        pytest.approx(sx["all"]["ci_low"]), pytest.approx(sx["all"]["ci_high"]))
    assert not math.isnan(sx["all"]["holm"]["p_adjusted"])
    main(["eval", "compare", base, x, y])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("4 numbers")]
    assert len(rows) == 2 and all(row.count("n too small") == 2 for row in rows)
