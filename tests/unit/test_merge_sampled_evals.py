"""rlft.eval.countdown.merge_samples and scripts/merge_sampled_evals.py: splitting a k=4 evaluation into two k=2 halves
and merging them gives the k=4 evaluation back, rates and pass@k by hand, and every refusal names what is wrong."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlft.eval.countdown import CountdownEvalResult, merge_samples, read_eval_file, summarize
from rlft.lab.script_io import ScriptError
from tests.conftest import load_script

TASKS = [{"nums": [1, 2, 3], "target": 6}, {"nums": [4, 5, 6, 7], "target": 22}]
LISTS = dict(task_scores=[[1.0, 0.1, 0.0, 1.0], [0.1, 0.1, 0.1, 1.0]],
             task_truncated=[[False, False, True, False], [False, False, False, False]],
             task_tokens=[[10, 20, 64, 30], [40, 41, 42, 43]],
             task_values=[[6.0, 5.0, None, 6.0], [21.0, 20.0, 19.0, 22.0]],
             task_certainty=[[1.5, 1.0, 0.2, 1.4], [0.9, 0.8, 0.7, 1.1]],
             task_rm_scores=[[2.0, -1.0, -3.0, 1.0], [0.0, 0.5, -0.5, 2.5]])


def half(j: slice, **drop) -> CountdownEvalResult:
    """The evaluation with only samples ``j`` of each task (as if sampled with k=2 at another seed)."""
    lists = {name: [row[j] for row in rows] for name, rows in LISTS.items() if name not in drop}
    return summarize("sampled", tasks=TASKS, **lists)


def test_merging_two_halves_gives_the_whole_back_with_rates_by_hand():
    merged = merge_samples([half(slice(0, 2)), half(slice(2, 4))])
    whole = summarize("sampled", tasks=TASKS, **LISTS)
    assert merged.to_dict() == whole.to_dict()
    assert merged.k == 4 and merged.task_scores == LISTS["task_scores"]
    assert merged.mean_score == pytest.approx((2.1 + 1.3) / 8)
    assert merged.accuracy == pytest.approx(3 / 8) and merged.format_rate == pytest.approx(7 / 8)
    assert merged.truncated_rate == pytest.approx(1 / 8) and merged.mean_completion_tokens == pytest.approx(290 / 8)
    # pass@2, unbiased: task 0 has 2 of 4 right: 1 - C(2,2)/C(4,2) = 5/6; task 1 has 1 of 4: 1 - C(3,2)/C(4,2) = 1/2
    assert merged.pass_at_k[2] == pytest.approx((5 / 6 + 1 / 2) / 2) and merged.pass_at_k[4] == 1.0
    assert merged.by_size["4"]["score"] == pytest.approx(1.3 / 4)
    assert half(slice(0, 2)).pass_at_k == {1: pytest.approx((1 / 2 + 0) / 2), 2: pytest.approx(1 / 2)}


def test_merge_refuses_greedy_other_tasks_one_file_and_partial_reward_model_scores():
    a = half(slice(0, 2))
    with pytest.raises(ValueError, match="at least two"):
        merge_samples([a])
    greedy = summarize("greedy", tasks=TASKS, **{n: [row[:1] for row in rows] for n, rows in LISTS.items()})
    with pytest.raises(ValueError, match="only sampled"):
        merge_samples([a, greedy])
    other = summarize("sampled", tasks=[TASKS[1], TASKS[0]],
                      **{n: [row[2:] for row in rows]
                         for n, rows in LISTS.items()})
    with pytest.raises(ValueError, match="evaluation 1 is of other tasks"):
        merge_samples([a, other])
    with pytest.raises(ValueError, match=r"reward-model scores in evaluations \[0\] only"):
        merge_samples([a, half(slice(2, 4), task_rm_scores=True)])
    neither = merge_samples([half(slice(0, 2), task_rm_scores=True), half(slice(2, 4), task_rm_scores=True)])
    assert neither.task_rm_scores == [] and neither.k == 4


def write(path: Path, result: CountdownEvalResult, **config) -> Path:
    cfg = {"model": "runs/sft/model", "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 256,
           "prompt_template": "short", "select_reward_model": None, "k": result.k, **config}
    path.write_text(json.dumps({**result.to_dict(), "config": cfg}))
    return path


def test_script_writes_the_merged_file_that_test_time_study_reads(tmp_path, capsys):
    a = write(tmp_path / "a.json", half(slice(0, 2)), seed=0)
    b = write(tmp_path / "b.json", half(slice(2, 4)), seed=7)
    out = tmp_path / "merged" / "k4.json"
    load_script("merge_sampled_evals").main([str(a), str(b), "--output", str(out)])
    data = json.loads(out.read_text())
    assert data["config"]["k"] == 4 and data["config"]["seeds"] == [0, 7] and data["config"]["seed"] is None
    assert data["config"]["merged_from"] == [str(a), str(b)] and "4 samples (seeds [0, 7])" in capsys.readouterr().out
    assert read_eval_file(out)[0].task_scores == LISTS["task_scores"]
    with pytest.raises(Exception, match="exists"):  # the output is never replaced without --overwrite
        load_script("merge_sampled_evals").main([str(a), str(b), "--output", str(out)])


@pytest.mark.parametrize(("config", "message"), [
    ({"seed": 0}, "seed 0, as .*a.json"),
    ({"seed": None}, "no seed"),
    ({"seed": 1, "temperature": 1.0}, "temperature is 1.0, but .*a.json has 0.6"),
    ({"seed": 1, "model": "runs/rl/model"}, "model is 'runs/rl/model'"),
    # the same path, retrained: another weights file
    ({"seed": 1, "model_sha256": "ab" * 32}, "model_sha256 is 'abab"),
])
def test_script_refuses_a_repeated_seed_or_another_setting(tmp_path, config, message):
    a = write(tmp_path / "a.json", half(slice(0, 2)), seed=0)
    b = write(tmp_path / "b.json", half(slice(2, 4)), **config)
    with pytest.raises(ScriptError, match=message):
        load_script("merge_sampled_evals").main([str(a), str(b), "--output", str(tmp_path / "m.json")])


def test_script_names_a_file_that_is_not_an_evaluation(tmp_path):
    a = write(tmp_path / "a.json", half(slice(0, 2)), seed=0)
    (tmp_path / "b.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="b.json: not an `rlft eval countdown"):
        load_script("merge_sampled_evals").main([
            str(a), str(tmp_path / "b.json"), "--output",
            str(tmp_path / "m.json")
        ])


def test_summarize_names_the_list_of_the_wrong_shape():
    """An older file without per-sample values (task_values empty) cannot be merged: the error names the list."""
    lists = {**LISTS, "task_values": []}
    with pytest.raises(ValueError, match="task_values: every per-task list needs 2 tasks of 4 samples each"):
        summarize("sampled", tasks=TASKS, **lists)
    with pytest.raises(ValueError, match=r"task_tokens: .* got 2 tasks of \[3, 4\] samples"):
        summarize("sampled", tasks=TASKS, **{**LISTS, "task_tokens": [[1, 2, 3], [1, 2, 3, 4]]})
    with pytest.raises(ValueError, match="tasks: .* got 1 tasks"):
        summarize("sampled", tasks=TASKS[:1], **LISTS)


def test_read_eval_file_returns_result_and_config_and_names_a_bad_file(tmp_path):
    from rlft.eval.countdown import read_eval_file

    path = write(tmp_path / "a.json", half(slice(0, 2)), seed=5)
    result, config = read_eval_file(path)
    assert result.task_scores == [row[:2] for row in LISTS["task_scores"]] and config["seed"] == 5
    (tmp_path / "bare.json").write_text(json.dumps(half(slice(0, 2)).to_dict()))
    assert read_eval_file(tmp_path / "bare.json")[1] == {}
    with pytest.raises(ValueError, match="missing.json does not exist"):
        read_eval_file(tmp_path / "missing.json")
    (tmp_path / "k.json").write_text("{}")
    for bad, why in ((tmp_path, "IsADirectoryError"), (tmp_path / "b.txt", "JSONDecodeError"),
                     (tmp_path / "l.json", "a list"), (tmp_path / "k.json", "KeyError"), (tmp_path / "n.json.gz",
                                                                                          "BadGzipFile")):
        if bad not in (tmp_path, tmp_path / "k.json"):
            bad.write_text("[1, 2]" if bad.suffix == ".json" else "not json")
        with pytest.raises(ValueError, match=f"{bad.name}: not an `rlft eval countdown` JSON \\({why}"):
            read_eval_file(bad)


def test_an_archived_evaluation_is_read_the_same_gzip_compressed(tmp_path):
    """docs/results/*/data/ keeps evaluations as .json.gz (about 9x smaller); read_eval_file gives the same result and
    config from either; the plain name does not find the compressed file."""
    import gzip

    from rlft.eval.countdown import read_eval_json

    plain = write(tmp_path / "a.json", half(slice(0, 2)), seed=5)
    packed = tmp_path / "a_archived.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_eval_file(packed)[0].to_dict() == read_eval_file(plain)[0].to_dict()
    assert read_eval_file(packed)[1] == read_eval_file(plain)[1] == read_eval_json(plain)["config"]
    assert read_eval_json(packed) == read_eval_json(plain)
    with pytest.raises(ValueError, match="a_archived.json does not exist"):
        read_eval_file(tmp_path / "a_archived.json")


def test_output_that_is_an_input_a_folder_or_exists_is_one_line_exit_2(tmp_path, capsys):
    """Before any file is read: --output naming an input (even with --overwrite: the samples would be lost), a folder,
    or an existing file without --overwrite; an input named twice. One line on stderr, exit code 2, nothing written."""
    m = load_script("merge_sampled_evals")
    a = write(tmp_path / "a.json", half(slice(0, 2)), seed=0)
    b = write(tmp_path / "b.json", half(slice(2, 4)), seed=7)
    before = a.read_bytes()
    (tmp_path / "old.json").write_text("{}")
    cases = [([str(a), str(b), "--output", str(a)], "--output .*a.json is the input"),
             ([str(a), str(b), "--output", str(a), "--overwrite"], "--output .*a.json is the input"),
             ([str(a), str(b), "--output", str(tmp_path)], "is a folder"),
             ([str(a), str(b), "--output", str(tmp_path / "old.json")], "old.json already exists; pass --overwrite"),
             ([str(a), str(a), "--output", str(tmp_path / "m.json")], "a.json named twice"),
             ([str(a), "--output"], "argument --output: expected one argument")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            m.run_script(m.main, argv, prog="merge_sampled_evals.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith(
            "merge_sampled_evals.py: error: "), err
        assert re.search(message, err), (message, err)
    assert a.read_bytes() == before and (tmp_path /
                                         "old.json").read_text() == "{}" and not (tmp_path / "m.json").exists()
