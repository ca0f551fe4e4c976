"""rlft.lab.pipeline: stages skipped when done, timed, checkpoints dropped; evaluations cached under a key that a
rebuilt model, other sampling or other tasks do not match; a study's settings and variants read from YAML."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from unittest import mock

import pytest

from rlft.eval.countdown import CountdownEvalResult
import rlft.models
from rlft.lab.pipeline import (EvalJob, StageTimes, Timer, done, drop_checkpoints, evaluate_cached, finished,
                                   heldout_tasks, load_settings, load_variants, run_stage)
from rlft.rollout.base import Sample, SamplingParams
from rlft.types import CountdownTask
from rlft.validation import OptionError


def _model_folder(folder: Path, weights: bytes = b"0123") -> Path:
    """A finished model folder: config.json and one weights file, its checkpoints/ beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)
    (folder.parent / "checkpoints" / "step-1").mkdir(parents=True, exist_ok=True)
    return folder


def test_timer_records_seconds_also_when_the_block_raises(tmp_path):
    timings = StageTimes(tmp_path / "timings.json", resume=False)
    with mock.patch("time.perf_counter", side_effect=[10.0, 12.5, 20.0, 21.0]):
        with Timer(timings, "a"):
            pass
        with pytest.raises(RuntimeError), Timer(timings, "b"):
            raise RuntimeError("x")
    assert timings == {"a": 2.5, "b": 1.0}


def test_stage_times_add_a_resumed_runs_seconds_to_the_earlier_ones(tmp_path):
    """A demo killed after SFT and resumed: its report shows SFT's real seconds plus those of skipping it."""
    journal = tmp_path / "timings.json"
    first = StageTimes(journal, resume=False)
    with mock.patch("time.perf_counter", side_effect=[0.0, 600.0]):
        with Timer(first, "SFT"):
            pass
    assert json.loads(journal.read_text()) == {"SFT": 600.0}  # written after the stage, before any report
    resumed = StageTimes(journal, resume=True)
    with mock.patch("time.perf_counter", side_effect=[0.0, 0.5, 1.0, 31.0]):
        with Timer(resumed, "SFT"):  # skipped: its model is there
            pass
        with Timer(resumed, "RL"):
            pass
    assert resumed.with_total() == {"SFT": 600.5, "RL": 30.0, "total": 630.5}
    assert StageTimes(journal, resume=True) == {"SFT": 600.5, "RL": 30.0}  # the total is not journaled
    assert StageTimes(journal, resume=False) == {}  # a fresh run starts from nothing
    journal.write_text("[1, 2]")
    with pytest.raises(ValueError, match="timings.json: not {stage: seconds}"):
        StageTimes(journal, resume=True)


def test_done_needs_resume_and_every_output(tmp_path):
    model, data = tmp_path / "model", tmp_path / "split.json"
    assert not finished(model) and not finished(data)
    model.mkdir()
    assert not finished(model)  # a folder without config.json: a save cut short
    (model / "config.json").write_text("{}")
    assert finished(model)
    assert not done(True, model, data)
    data.write_text("{}")
    assert done(True, model, data) and not done(False, model, data)


def test_drop_checkpoints_only_beside_a_finished_model(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "model").mkdir()
    drop_checkpoints(run / "model")  # no config.json yet: kept
    drop_checkpoints(None)
    assert (run / "checkpoints").is_dir()
    _model_folder(run / "model")
    drop_checkpoints(run / "model", keep=True)
    assert (run / "checkpoints").is_dir()
    drop_checkpoints(run / "model")
    assert not (run / "checkpoints").exists()


def test_run_stage_builds_unless_done_and_returns_the_first_output(tmp_path):
    timings, calls = StageTimes(tmp_path / "timings.json", resume=False), []
    model = tmp_path / "sft" / "model"

    def build():
        calls.append("built")
        _model_folder(model)
        return "ignored"

    assert run_stage("SFT", model, build, timings=timings, resume=True) == model
    assert calls == ["built"] and "SFT" in timings
    assert (tmp_path / "sft" / "checkpoints").is_dir()  # keep_checkpoints defaults to True
    assert run_stage("SFT", [model], build, timings=timings, resume=True, keep_checkpoints=False) == model
    assert calls == ["built"] and not (tmp_path / "sft" / "checkpoints").exists()  # done: skipped, checkpoints dropped
    run_stage("SFT", model, build, timings=timings, resume=False)  # without resume a stage always runs
    assert calls == ["built", "built"]
    extra = tmp_path / "sft" / "eval.json"  # a second output missing: not done
    run_stage("SFT", [model, extra], build, timings=timings, resume=True)
    assert calls == ["built"] * 3


class FakeEngine:
    """Every sample answers ``1 + 2``; counts its generate calls."""

    calls = 0

    def __init__(self, model, tokenizer, **kwargs):
        self.kwargs = kwargs

    def generate(self, prompts, params):
        FakeEngine.calls += 1
        return [[Sample([1], "</think><answer>1 + 2</answer>", "stop")] * params.k for _ in prompts]


@pytest.fixture
def fake_loading():
    FakeEngine.calls = 0
    with (mock.patch("rlft.models.load_tokenizer", return_value=None), mock.patch("rlft.models.load_model"),
          mock.patch("rlft.models.pick_device"), mock.patch("rlft.rollout.hf.HFEngine", FakeEngine)):
        yield


TASKS = [CountdownTask((1, 2), 3), CountdownTask((1, 2), 4), CountdownTask((2, 1), 5)]


def _evaluate(model, path, tasks=TASKS, params=SamplingParams(k=1, temperature=0.0, max_new_tokens=8), reuse=True):
    return evaluate_cached(model, {"held-out": EvalJob(path, tasks, params)}, prompt_template="short", batch_size=4,
                           reuse=reuse)["held-out"]


def test_evaluate_cached_writes_the_eval_countdown_format_and_reuses_it(tmp_path, fake_loading):
    """"1 + 2" is correct for target 3 only (score 1.0) and a wrong answer elsewhere (0.1): mean (1 + 0.1 + 0.1) / 3."""
    model, path = _model_folder(tmp_path / "run" / "model"), tmp_path / "eval" / "greedy.json"
    result = _evaluate(model, path)
    assert result.task_scores == [[1.0], [0.1], [0.1]] and result.mean_score == pytest.approx(0.4)
    data = json.loads(path.read_text())
    assert CountdownEvalResult.from_dict(data) == result
    assert data["model"] == str(model) and data["eval_s"] >= 0
    assert data["cache_key"]["weights"] == hashlib.sha256(b"0123").hexdigest()  # sha256sum model.safetensors
    assert data["cache_key"]["sampling"]["max_new_tokens"] == 8 and data["cache_key"]["prompt_template"] == "short"
    assert _evaluate(model, path) == result and FakeEngine.calls == 1  # reused: no generation
    _evaluate(model, path, reuse=False)
    assert FakeEngine.calls == 2


def test_the_evaluation_records_its_weights_so_greedy_from_refuses_another_model_file(tmp_path, fake_loading):
    """A study's greedy file is a ``--greedy-from`` baseline: it records ``sha256sum model.safetensors``, and the
    baseline loader takes it for those weights and refuses it for a model rebuilt with other weights."""
    from rlft.eval.countdown_command import load_greedy_baseline

    model, path = _model_folder(tmp_path / "model"), tmp_path / "greedy.json"
    _evaluate(model, path)
    config = json.loads(path.read_text())["config"]
    assert config == {
        "model_sha256": hashlib.sha256(b"0123").hexdigest(), "max_new_tokens": 8, "prompt_template": "short",
        "stop_repeats": None
    }
    assert load_greedy_baseline(str(path), TASKS, 8,
                                hashlib.sha256(b"0123").hexdigest()).task_scores == [[1.0], [0.1], [0.1]]
    with pytest.raises(OptionError, match="pair an evaluation of the same model file"):
        load_greedy_baseline(str(path), TASKS, 8, hashlib.sha256(b"01234").hexdigest())
    sha = hashlib.sha256(b"0123").hexdigest()
    assert load_greedy_baseline(str(path), TASKS, 8, sha, "short").task_scores == [[1.0], [0.1], [0.1]]
    with pytest.raises(OptionError,
                       match="--prompt-template short, these samples with base: pair answers to the same prompts"):
        load_greedy_baseline(str(path), TASKS, 8, sha, "base")  # another prompt: not a baseline of these samples


def test_a_rebuilt_model_other_sampling_or_other_tasks_evaluate_again(tmp_path, fake_loading, rlft_log):
    model, path = _model_folder(tmp_path / "model"), tmp_path / "greedy.json"
    _evaluate(model, path)
    _model_folder(model, weights=b"01234")  # a new run saved at the same path
    _evaluate(model, path)
    assert FakeEngine.calls == 2 and "(weights differ)" in rlft_log.text
    _evaluate(model, path, params=SamplingParams(k=1, temperature=0.0, max_new_tokens=16))
    assert FakeEngine.calls == 3 and "(sampling differ)" in rlft_log.text
    _evaluate(model, path, tasks=TASKS[::-1])
    assert FakeEngine.calls == 4 and "(sampling, tasks_sha256 differ)" in rlft_log.text  # back to 8 tokens, too
    _model_folder(model, weights=b"01243")  # same size, other bytes: another model
    _evaluate(model, path, tasks=TASKS[::-1])
    assert FakeEngine.calls == 5


def test_a_model_rebuilt_bit_for_bit_reuses_its_evaluation(tmp_path, fake_loading):
    """The key names the weights by their SHA-256, not their files' mtimes: a training run repeated at the same path
    that writes the same bytes (a bit-for-bit rebuild) is the same model, and its cached scores are its own."""
    model, path = _model_folder(tmp_path / "model"), tmp_path / "greedy.json"
    _evaluate(model, path)
    (model / "model.safetensors").unlink()
    _model_folder(model)  # written again, same bytes
    os.utime(model / "model.safetensors", ns=(1, 1))
    _evaluate(model, path)
    assert FakeEngine.calls == 1


def test_a_key_written_with_mtimes_is_reused_while_the_weights_files_are_untouched(tmp_path, fake_loading, rlft_log):
    """Keys written before 2026-12-02 name the weights files by ``[name, bytes, mtime_ns]``: such a file stays valid
    while those files are untouched, and is stale once one of them is rewritten."""
    model, path = _model_folder(tmp_path / "model"), tmp_path / "greedy.json"
    _evaluate(model, path)
    data = json.loads(path.read_text())
    weights = model / "model.safetensors"
    data["cache_key"].pop("weights")
    data["cache_key"]["model_weights"] = [["model.safetensors", 4, weights.stat().st_mtime_ns]]
    path.write_text(json.dumps(data))
    _evaluate(model, path)
    assert FakeEngine.calls == 1
    os.utime(weights, ns=(1, 1))  # the old key cannot tell a touched file from a rebuilt one
    _evaluate(model, path)
    assert FakeEngine.calls == 2 and "(weights differ)" in rlft_log.text
    assert json.loads(path.read_text())["cache_key"]["weights"] == hashlib.sha256(b"0123").hexdigest()


def test_a_file_without_a_cache_key_is_reused_when_its_size_fits(tmp_path, fake_loading):
    """Evaluations written before keys were recorded (or archived ones) are taken as they are, unless their samples
    per task or number of tasks differ from the job's."""
    path = tmp_path / "greedy.json"
    legacy = {
        "num_tasks": 3, "k": 1, "mode": "greedy", "mean_score": 0.5, "accuracy": 0.5, "format_rate": 1.0,
        "pass_at_k": {"1": 0.5}, "mean_completion_tokens": 3.0, "truncated_rate": 0.0, "task_scores": [[1.0], [0.1],
                                                                                                       [0.4]]
    }
    path.write_text(json.dumps(legacy))
    assert _evaluate("no-such-model", path).mean_score == 0.5 and FakeEngine.calls == 0
    path.write_text(json.dumps({**legacy, "task_scores": [[1.0], [0.1]]}))
    assert _evaluate("no-such-model", path).mean_score == pytest.approx(0.4) and FakeEngine.calls == 1


def test_a_damaged_cached_evaluation_is_an_error_naming_the_file(tmp_path, fake_loading):
    """A cached evaluation cut short (or edited by hand) was a bare "Unterminated string ..." with no file name: now one
    line naming the file and what to do, before any model loads; so is JSON that is not an evaluation."""
    model, path = _model_folder(tmp_path / "model"), tmp_path / "eval" / "sft--greedy.json"
    _evaluate(model, path)
    text = path.read_text()
    path.write_text(text[: text.index('"task_scores"') + 20])
    with pytest.raises(ValueError) as info:
        _evaluate(model, path)
    message = str(info.value)
    assert message.startswith(
        f"{path}: not JSON (") and "delete the file to evaluate again" in message and "\n" not in message
    for bad, why in (("[1, 2]", ""), (json.dumps({**json.loads(text), "pass_at_k": [1.0]}), "AttributeError")):
        path.write_text(bad)
        with pytest.raises(ValueError, match=f"^{path}: not an evaluation rlft cached .*{why}"):
            _evaluate(model, path)
    assert FakeEngine.calls == 1
    path.unlink()  # the advice, followed
    assert _evaluate(model, path).task_scores == [[1.0], [0.1], [0.1]]


def test_a_settings_file_that_is_not_yaml_is_named(tmp_path):
    from rlft.lab.pipeline import read_yaml

    (tmp_path / "settings.yaml").write_text("common: {rl: [1, 2\n")
    with pytest.raises(OptionError, match=f"^{tmp_path / 'settings.yaml'}: not YAML \\(while parsing"):
        read_yaml(tmp_path / "settings.yaml")


def test_damaged_pair_counts_and_a_torn_metrics_line_in_the_demo(tmp_path, capsys):
    """The demo's other cached files: the pairs' stats (named when damaged) and a stage's metrics, whose last line cut
    by a kill is left out of the report's curves (with a note) instead of stopping the report."""
    from rlft.lab.demo_countdown import pairs_stats
    from rlft.lab.demo_countdown_report import _metrics

    pairs = tmp_path / "pairs" / "countdown.jsonl"
    pairs.parent.mkdir()
    stats = pairs.with_suffix(".stats.json")
    stats.write_text('{"prompts": 8, "kept": 0, "dropp')
    with pytest.raises(ValueError, match=f"^{stats}: not JSON .*delete it and the pairs file to sample them again"):
        pairs_stats(pairs)
    stats.write_text('{"prompts": 8}')
    with pytest.raises(ValueError, match=f"^{stats}: not the pair counts"):
        pairs_stats(pairs)
    stats.write_text('{"prompts": 8, "kept": 2, "dropped_ties": 6}')
    assert pairs_stats(pairs)["kept"] == 2
    metrics = tmp_path / "sft" / "metrics.jsonl"
    assert _metrics(metrics) == []  # a stage that did not run
    metrics.parent.mkdir()
    metrics.write_text('{"step": 1, "loss/sft": 2.0}\n{"step": 2, "loss/s')
    assert _metrics(metrics) == [{"step": 1, "loss/sft": 2.0}] and "line 2 is cut short" in capsys.readouterr().err
    metrics.write_text('{"step": 1, "loss/s\n{"step": 2, "loss/sft": 2.0}\n')
    with pytest.raises(ValueError, match=f"^{metrics}: line 1 is not a JSON object"):
        _metrics(metrics)


def test_the_model_is_loaded_once_for_every_job_left(tmp_path, fake_loading):
    greedy, sampled = SamplingParams(k=1, temperature=0.0,
                                     max_new_tokens=8), SamplingParams(k=2, temperature=0.6, max_new_tokens=8)
    jobs = {
        "greedy": EvalJob(tmp_path / "g.json", TASKS, greedy), "sampled": EvalJob(tmp_path / "s.json", TASKS[:2],
                                                                                  sampled)
    }
    results = evaluate_cached("m", jobs, prompt_template="short", batch_size=4)
    assert rlft.models.load_model.call_count == 1
    assert list(results) == ["greedy", "sampled"] and results["sampled"].k == 2 and results["sampled"].num_tasks == 2
    assert FakeEngine.calls == 2


# --------------------------------------------------------------------------- studies


def _study(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


SETTINGS = """
common: {sft: s, tasks: {preset: medium3, split_seed: 1, heldout_size: 10, prompt_template: short}, validation_start: 5,
         trace_style: direct, give_up: 0.6, max_new_tokens: 64, micro_batch_size: 32, device: cpu, dtype: float32,
         rl: {k: 8, max_steps: 30}, pairs: {}, dpo: {beta: 0.1}, sft_continued: {}, eval: {batch_size: 64}}
settings:
  a: {}
  b: {max_new_tokens: 144, rl: {k: 4}}
"""


def test_variants_load_in_file_then_row_order_with_scientific_floats(tmp_path):
    folder = _study(tmp_path, {"settings.yaml": SETTINGS, "2_dpo.yaml": "d: {kind: dpo, lr: 1e-4, pairs_of: z}\n",
                               "1_rl.yaml": "z: {kind: rl, lr: 2.0e-6}\ny: {kind: rl, clip_high: 0.28, loss: raft++}\n",
                               "notes.md": "not a variant file"})
    variants = load_variants(folder)
    assert list(variants) == ["z", "y", "d"]
    assert variants["d"] == {"kind": "dpo", "lr": 1e-4, "pairs_of": "z"} and isinstance(variants["d"]["lr"], float)
    assert variants["y"]["loss"] == "raft++"


@pytest.mark.parametrize("files, message", [
    ({"1.yaml": "a: {kind: rl}\n", "2.yaml": "a: {kind: dpo}\n"}, "2.yaml: variant 'a' is already defined in"),
    ({"1.yaml": "a: {kind: ppo}\n"}, "1.yaml: variant 'a': kind must be one of rl, dpo, sft"),
    ({"1.yaml": "a: {lr: 1.0}\n"}, "1.yaml: variant 'a': kind must be one of"),
    ({"1.yaml": "a: {kind: dpo, start_from: b}\n"}, "1.yaml: variant 'a': start_from 'b' is not a variant"),
    ({"1.yaml": "- a\n- b\n"}, "1.yaml: expected a mapping"),
])
def test_a_bad_variant_file_is_refused_naming_it(tmp_path, files, message):
    with pytest.raises(OptionError, match=message):
        load_variants(_study(tmp_path, files))


def test_a_setting_is_common_with_its_own_values_on_top(tmp_path):
    settings = load_settings(_study(tmp_path, {"settings.yaml": SETTINGS}))
    assert list(settings) == ["a", "b"]
    assert settings["a"].rl == {"k": 8, "max_steps": 30} and settings["b"].rl == {"k": 4, "max_steps": 30}
    assert (settings["a"].max_new_tokens, settings["b"].max_new_tokens, settings["b"].name) == (64, 144, "b")
    (tmp_path / "settings.yaml").write_text(SETTINGS.replace("  b: {max_new_tokens: 144", "  b: {max_new_token: 144"))
    with pytest.raises(OptionError, match="setting 'b': unknown or missing key\\(s\\) max_new_token$"):
        load_settings(tmp_path)
    with pytest.raises(OptionError, match="settings.yaml: no such file"):
        load_settings(tmp_path / "nowhere")


def test_validation_tasks_follow_the_test_tasks_in_the_held_out_set(tmp_path):
    setting = load_settings(_study(tmp_path, {"settings.yaml": SETTINGS}))["a"]  # 10 held-out tasks, validation 5 on
    assert heldout_tasks(setting, 3, "validation") == heldout_tasks(setting, 8)[5:]
    with pytest.raises(OptionError, match="the validation split has 5 tasks, not 6"):
        heldout_tasks(setting, 6, "validation")


def test_a_fresh_evaluation_of_test_tasks_is_counted_in_the_ledger_once(tmp_path, fake_loading):
    """The demo's and the ablation runner's test evaluations go through evaluate_cached: each fresh evaluation of a
    ``test_look`` job appends one ledger line naming the weights; a cached result read back is not a new look, and a
    validation job is not counted."""
    from rlft.lab.ledger import read_looks

    model, ledger = _model_folder(tmp_path / "model"), tmp_path / "test_looks.jsonl"
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=8)

    def run(**kw):
        jobs = {"test": EvalJob(tmp_path / "test.json", TASKS, params, test_look=True),
                "validation": EvalJob(tmp_path / "val.json", TASKS, params)}
        return evaluate_cached(model, jobs, prompt_template="short", batch_size=4, ledger=ledger, label="sft", **kw)

    run()
    looks = read_looks(ledger)
    assert len(looks) == 1 and looks[0]["model_sha256"] == hashlib.sha256(b"0123").hexdigest()
    assert looks[0]["label"] == "sft test" and looks[0]["score"] == pytest.approx(0.4) and looks[0]["num_tasks"] == 3
    run()  # both read back from their files
    assert len(read_looks(ledger)) == 1
    run(reuse=False)  # evaluated again: a second look
    assert len(read_looks(ledger)) == 2
