"""scripts/countdown_ablation.py (the runner) and scripts/ablation_report.py: the continued-SFT baseline's budget is the
matching RL run's step time; variants and settings come from configs/countdown/ablation and reach every stage; the
archived countdown-bounded report is rebuilt byte for byte."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
import torch

from rlft.compute import final_flops, model_parameter_count, parameter_count, summed_step_seconds
from rlft.models import DeviceSpec, load_model
from rlft.lab.pipeline import heldout_tasks, load_settings, load_variants
from rlft.validation import OptionError, UsageError
from rlft.lab.script_io import run_script
from tests.conftest import load_script, load_weights

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets" / "ablation"


@pytest.fixture(scope="module")
def ablation():
    return load_script("countdown_ablation")


@pytest.fixture(scope="module")
def report():
    return load_script("ablation_report")


def make(ablation, out: Path, setting: str = "direct", **kwargs):
    """The runner's choices for these tests: every variant of configs/countdown/ablation, SFT start "sft", 500 tasks."""
    settings = load_settings(ablation.CONFIGS)
    return ablation.Ablation(kwargs.pop("variants", load_variants(ablation.CONFIGS)), settings[setting], out=out,
                             sft=Path("sft"), **{"tasks": 500, "sft_step_s": 6.5, **kwargs})


def _finished_rl_run(folder: Path, step_seconds: list[float | None]) -> None:
    """A finished RL run folder: model/ and a metrics.jsonl whose records carry the given time/step_s."""
    (folder / "run" / "model").mkdir(parents=True)
    records = [{"step": i + 1, **({"time/step_s": s} if s is not None else {})} for i, s in enumerate(step_seconds)]
    (folder / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summed_step_seconds_sums_every_logged_step(tmp_path):
    _finished_rl_run(tmp_path / "run_a", [50.0, 61.5, None, 70.25])  # a record without a step time counts 0
    assert summed_step_seconds(tmp_path / "run_a" / "run" / "metrics.jsonl") == pytest.approx(181.75)


def test_a_budget_needs_a_finished_rl_run(ablation, tmp_path):
    (tmp_path / "grpo_filter_lora_1e4_60" / "s0" / "run").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no finished RL run"):
        ablation.sft_budget(make(ablation, tmp_path), "sft_continued_60", 0, Path("sft"))


def test_a_flops_budget_is_the_rl_runs_flops_over_6n(ablation, tmp_path, tiny_model_dir):
    """budget: flops, start_from: the SFT run starts from that variant's model and trains ceil(F / 6 N) tokens, F the
    RL run's last flops/estimated and N the start's parameter count (the meta-device count equals the loaded one's)."""
    variants = {"rl": {"kind": "rl"}, "first": {"kind": "sft"},
                "more": {"kind": "sft", "start_from": "first", "budget_of": "rl", "budget": "flops", "lr": 2e-5}}
    _finished_rl_run(tmp_path / "rl" / "s1", [60.0, 60.0])
    records = [{"step": 1, "flops/estimated": 1.0e12}, {"step": 2, "flops/estimated": 2.5e12},
               {"step": 2, "eval/score": 0.3}]
    (tmp_path / "rl" / "s1" / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    start = tmp_path / "first" / "s1" / "run" / "model"
    start.parent.mkdir(parents=True)
    start.symlink_to(tiny_model_dir)
    n = parameter_count(load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32)))
    assert model_parameter_count(start) == n
    seen = {}

    def fake_train_sft(cfg):
        seen.update(model=cfg.model, max_tokens=cfg.max_tokens, max_steps=cfg.max_steps, lr=cfg.lr)
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    with mock.patch("rlft.recipes.sft.train_sft", fake_train_sft), mock.patch.object(ablation, "evaluate"):
        ablation.run_variant(make(ablation, tmp_path, variants=variants), "more", 1)
    assert seen == {"model": str(start), "max_tokens": math.ceil(2.5e12 / (6 * n)), "max_steps": None, "lr": 2e-5}
    with pytest.raises(UsageError, match="no flops/estimated records"):
        final_flops(_metrics_file(tmp_path / "old.jsonl", [{"step": 1, "time/step_s": 3.0}]))
    with pytest.raises(SystemExit, match="budget 'tokens': must be wall or flops"):
        ablation.sft_budget(make(ablation, tmp_path, variants={"x": {"kind": "sft", "budget": "tokens"}}), "x", 0,
                            start)


def _metrics_file(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_budget_of_sizes_continued_sft_to_the_named_run(ablation, tmp_path):
    """sft_continued_60 trains round(summed step time / seconds per SFT step) steps, from the same seed's run."""
    _finished_rl_run(tmp_path / "grpo_filter_lora_1e4_60" / "s1", [60.0] * 10)  # 600 s
    _finished_rl_run(tmp_path / "grpo_filter_lora_1e4_60" / "s0", [10.0])  # another seed: not used
    seen = {}

    def fake_train_sft(cfg):
        seen["max_steps"], seen["seed"], seen["lr"] = cfg.max_steps, cfg.seed, cfg.lr
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    with mock.patch("rlft.recipes.sft.train_sft", fake_train_sft), mock.patch.object(ablation, "evaluate") as evaluate:
        ablation.run_variant(make(ablation, tmp_path), "sft_continued_60", 1)
    assert seen == {"max_steps": round(600 / 6.5), "seed": 1, "lr": 2e-5}
    assert evaluate.call_count == 1
    assert json.loads((tmp_path / "sft_continued_60" / "s1" / "train_time.json").read_text())["seconds"] >= 0


def test_budget_from_an_archived_metrics_file_overrides_budget_of(ablation, tmp_path):
    """--budget-from: the budget is that file's summed step time, even when the named run's folder is absent."""
    archived = tmp_path / "archived_metrics.jsonl"
    archived.write_text("".join(json.dumps({"step": i + 1, "time/step_s": 13.0}) + "\n" for i in range(10)))  # 130 s
    seen = {}

    def fake_train_sft(cfg):
        seen["max_steps"] = cfg.max_steps
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    with mock.patch("rlft.recipes.sft.train_sft", fake_train_sft), mock.patch.object(ablation, "evaluate"):
        ablation.run_variant(make(ablation, tmp_path, budget_from=archived), "sft_continued_60", 0)
    assert seen == {"max_steps": 20}
    with pytest.raises(UsageError, match="no time/step_s"):
        summed_step_seconds(_metrics_file(tmp_path / "eval_only.jsonl", [{"step": 1, "eval/score": 0.4}]))


def test_a_run_resumes_from_its_checkpoint_and_one_killed_before_any_restarts(ablation, tmp_path):
    """The runner resumes a run with a checkpoint; a run holding only metrics (killed before its first checkpoint)
    is restarted with overwrite (moved aside by rlft, not deleted); a fresh folder starts with neither."""
    seen = []

    def fake_train_sft(cfg):
        seen.append((cfg.resume, cfg.overwrite))
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    for seed in (0, 1, 2):  # the RL runs that size the budget
        _finished_rl_run(tmp_path / "grpo_filter_lora_1e4_60" / f"s{seed}", [60.0])
    folder = tmp_path / "sft_continued_60"
    (folder / "s1" / "run" / "checkpoints" / "step-5").mkdir(parents=True)
    (folder / "s2" / "run").mkdir(parents=True)
    (folder / "s2" / "run" / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    with mock.patch("rlft.recipes.sft.train_sft", fake_train_sft), mock.patch.object(ablation, "evaluate"):
        for seed in (0, 1, 2):
            ablation.run_variant(make(ablation, tmp_path), "sft_continued_60", seed)
    assert seen == [(False, False), (True, False), (False, True)]


TASKS3 = [{"nums": [1, 2, 3], "target": 6}, {"nums": [2, 3, 4], "target": 9}, {"nums": [1, 2, 3, 4], "target": 10}]


def eval_json(path: Path, scores: list[float], tasks: list[dict] | None = TASKS3) -> Path:
    """A greedy evaluation file (rlft eval countdown's fields) of ``scores``, one per task, on ``tasks`` (None: an
    older file without a task list)."""
    from rlft.eval.countdown import CountdownEvalResult

    n = len(scores)
    r = CountdownEvalResult(num_tasks=n, k=1, mode="greedy", mean_score=sum(scores) / n, accuracy=0.0, format_rate=0.0,
                            pass_at_k={1: 0.0}, mean_completion_tokens=0.0, truncated_rate=0.0,
                            task_scores=[[x] for x in scores], tasks=(tasks or [])[:n])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(r.to_dict()))
    return path


def test_compare_prints_the_paired_difference(report, tmp_path, capsys):
    """compare --pair A B: A minus B per task (3 tasks: +1, 0, -0.5), mean +0.167, better/worse 1/1."""
    a = eval_json(tmp_path / "a.json", [1.0, 0.5, 0.0])
    b = eval_json(tmp_path / "b.json", [0.0, 0.5, 0.5])
    report.main(["compare", "--pair", str(a), str(b)])
    out = capsys.readouterr().out
    assert "+0.167 [" in out and "better/worse 1/1" in out and "on 3 tasks" in out and "(0.500) minus" in out


def test_compare_and_report_refuse_evaluations_of_other_tasks(report, tmp_path, capsys):
    """Two files of 3 tasks each, but not the same 3: refused in one line, exit 2 (it printed +1.000 [+1.000,
    +1.000])."""
    other = [{"nums": [5, 6, 7], "target": 18}, *TASKS3[1:]]
    a, b = eval_json(tmp_path / "a.json", [1.0, 1.0, 1.0]), eval_json(tmp_path / "b.json", [0.0, 0.0, 0.0], other)
    with pytest.raises(SystemExit) as e:
        run_script(report.main, ["compare", "--pair", str(a), str(b)], prog="ablation_report.py")
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "different tasks" in err and str(a) in err
    eval_json(tmp_path / "sft_start" / "eval_greedy_3.json", [0.0, 0.0, 0.0], other)
    eval_json(tmp_path / "grpo_filter_lora_2e4" / "s0" / "eval_greedy_3.json", [1.0, 1.0, 1.0])
    for command in ("report", "churn"):
        with pytest.raises(SystemExit) as e:
            run_script(report.main, [command, "--out", str(tmp_path), "--tasks", "3"], prog="ablation_report.py")
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("ablation_report.py: error: ") and "different tasks" in err
    # files without task lists (the generated-preset archives) are paired by position, with a note
    eval_json(tmp_path / "old" / "a.json", [1.0, 0.5, 0.0], None), eval_json(tmp_path / "old" / "b.json",
                                                                             [0.0, 0.5, 0.5], None)
    report.main(["compare", "--pair", str(tmp_path / "old" / "a.json"), str(tmp_path / "old" / "b.json")])
    captured = capsys.readouterr()
    assert "+0.167 [" in captured.out and "paired by position" in captured.err


def test_churn_bad_input_is_one_line_and_exit_2(report, tmp_path, capsys):
    """churn on a missing or damaged SFT start, no finished run, or a run of another size: one line, exit 2 (tracebacks
    before: StatisticsError on no run or one run, JSONDecodeError); one run, or a run that changed nothing, is
    reported."""
    def churn() -> tuple[int, str, str]:
        try:
            run_script(report.main, ["churn", "--out", str(tmp_path), "--tasks", "3"], prog="ablation_report.py")
            code = 0
        except SystemExit as e:
            code = e.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, _, err = churn()
    assert code == 2 and "eval_greedy_3.json does not exist" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "sft_start").mkdir()
    (tmp_path / "sft_start" / "eval_greedy_3.json").write_text('{"task_scores": [[1.0]')
    code, _, err = churn()
    assert code == 2 and "not an `rlft eval countdown` JSON" in err and len(err.strip().splitlines()) == 1
    eval_json(tmp_path / "sft_start" / "eval_greedy_3.json", [0.0, 1.0, 0.1])
    code, _, err = churn()
    assert code == 2 and "no finished run" in err
    eval_json(tmp_path / "grpo_filter_lora_2e4" / "s0" / "eval_greedy_3.json", [1.0, 1.0, 0.1])
    code, out, _ = churn()
    assert code == 0 and "grpo_filter_lora_2e4 s0: 1 changed (1 up, 0 down)" in out and "no pairwise correlation" in out
    eval_json(tmp_path / "grpo_filter_lora_2e4" / "s1" / "eval_greedy_3.json", [0.0, 1.0, 0.1])  # changed nothing
    code, out, _ = churn()
    assert code == 0 and "(1 pairs with a run that changed no task left out)" in out
    eval_json(tmp_path / "grpo_filter_lora_2e4" / "s2" / "eval_greedy_3.json", [0.0, 1.0])
    code, _, err = churn()
    assert code == 2 and "has 3 tasks" in err and "s2" in err


def test_dpo_variants_sample_their_own_pairs_and_epochs(ablation, tmp_path):
    """dpo_wide_lora_1e4: 1,920 prompts x 4 samples from the seed's own prompt offset, one epoch; dpo_4x_lora_1e4:
    3,840 x 2, two epochs; dpo_lora_1e4 keeps 960 x 2 and two epochs; pairs_of variants train on dpo_lora_1e4's pairs
    of the same seed, sampling them when absent; the pair options never reach DPOConfig (it would raise on an unknown
    field); every DPO run checkpoints every 5 steps and resumes when its folder has checkpoints."""
    pairs, dpo, resumes = [], [], []
    (tmp_path / "dpo_4x_lora_1e4" / "s0" / "run" / "checkpoints" / "step-5").mkdir(parents=True)  # a killed run's

    def fake_pairs(cfg):
        pairs.append((cfg.num_prompts, cfg.start, cfg.num_samples, cfg.seed))
        Path(cfg.output).write_text("")

    def fake_train_dpo(cfg):
        dpo.append((cfg.epochs, cfg.lr, cfg.lora_r, cfg.loss_type, Path(cfg.data).parent.parent.name))
        resumes.append((cfg.save_every, cfg.resume))
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    with (mock.patch("rlft.recipes.pairs.make_countdown_pairs", fake_pairs),
          mock.patch("rlft.recipes.dpo.train_dpo", fake_train_dpo), mock.patch.object(ablation, "evaluate")):
        ablation.run_variant(make(ablation, tmp_path), "dpo_wide_lora_1e4", 1)
        ablation.run_variant(make(ablation, tmp_path), "dpo_lora_1e4", 1)
        ablation.run_variant(make(ablation, tmp_path), "dpo_lora_2e4", 1)  # pairs_of: reuses them
        ablation.run_variant(make(ablation, tmp_path), "rpo_lora_1e4", 0)  # samples them, for seed 0
        ablation.run_variant(make(ablation, tmp_path), "dpo_4x_lora_1e4", 0)
    assert pairs == [(1920, 1920, 4, 1), (960, 960, 2, 1), (960, 0, 2, 0), (3840, 0, 2, 0)]
    assert dpo == [(1.0, 1e-4, 16, "dpo", "dpo_wide_lora_1e4"), (2.0, 1e-4, 16, "dpo", "dpo_lora_1e4"),
                   (2.0, 2e-4, 16, "dpo", "dpo_lora_1e4"), (2.0, 1e-4, 16, "rpo", "dpo_lora_1e4"),
                   (2.0, 1e-4, 16, "dpo", "dpo_4x_lora_1e4")]
    assert resumes == [(5, False)] * 4 + [(5, True)]
    assert (tmp_path / "dpo_lora_2e4" / "s1" / "run" / "model").is_dir()


def test_the_bounded_setting_reaches_every_stage(ablation, tmp_path):
    """--setting bounded: continued SFT writes bounded traces with the setting's give-up rate, and RL rollouts, pair
    sampling and evaluation generate the setting's 144 tokens (the direct setting keeps 64 and direct traces)."""
    seen = {}

    def fake_train_sft(cfg):
        seen["sft"] = (cfg.trace_style, cfg.give_up)
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    def fake_train_rl(cfg, **_):  # on_test_look: rlft.lab.test_looks.train_rl_counted's recorder
        seen["rl"] = (cfg.max_new_tokens, cfg.eval_max_new_tokens)
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    def fake_pairs(cfg):
        seen["pairs"] = cfg.max_new_tokens
        Path(cfg.output).write_text("")

    def fake_train_dpo(cfg):
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    _finished_rl_run(tmp_path / "grpo_filter_lora_1e4_60" / "s0", [60.0])
    with (mock.patch("rlft.recipes.sft.train_sft", fake_train_sft), mock.patch("rlft.recipes.rl.train_rl",
                                                                               fake_train_rl),
          mock.patch("rlft.recipes.pairs.make_countdown_pairs", fake_pairs),
          mock.patch("rlft.recipes.dpo.train_dpo", fake_train_dpo), mock.patch.object(ablation, "evaluate") as
          evaluate):
        for name in ("sft_continued_60", "grpo_filter_lora_2e4", "dpo_lora_1e4"):
            ablation.run_variant(make(ablation, tmp_path, "bounded"), name, 0)
    assert seen == {"sft": ("bounded", 0.6), "rl": (144, 144), "pairs": 144}
    assert all(
        call.args[0].setting.name == "bounded" and call.args[0].split == "test" for call in evaluate.call_args_list)
    assert evaluate.call_count == 3
    direct = load_settings(ablation.CONFIGS)["direct"]
    assert (direct.max_new_tokens, direct.trace_style, direct.micro_batch_size) == (64, "direct", 32)


def test_a_continued_sft_variant_may_set_its_own_traces(ablation, tmp_path):
    """A variant's give_up / max_tries / trace_style win over the setting's (the setting's when it sets none)."""
    seen = []
    variants = {"mine": {"kind": "sft", "give_up": 0.0, "max_tries": 10, "budget_of": "rl"},
                "theirs": {"kind": "sft", "budget_of": "rl"}, "rl": {"kind": "rl"}}
    _finished_rl_run(tmp_path / "rl" / "s0", [65.0])

    def fake_train_sft(cfg):
        seen.append((cfg.trace_style, cfg.give_up, cfg.max_tries))
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    with mock.patch("rlft.recipes.sft.train_sft", fake_train_sft), mock.patch.object(ablation, "evaluate"):
        for name in ("mine", "theirs"):
            ablation.run_variant(make(ablation, tmp_path, "real", variants=variants), name, 0)
    assert seen == [("bounded", 0.0, 10), ("bounded", 0.6, 6)]


def test_samples_generated_per_kind_and_the_paired_plot_draws_every_run(report, tmp_path):
    """x of the paired plot: RL its last samples/total, DPO its pairs' prompts x samples (the pairs_of variant's file,
    same seed), continued SFT 0, None when the record is missing; the plot is drawn from the runs that have both."""
    out = tmp_path
    (out / "grpo_filter_lora_2e4" / "s0" / "run").mkdir(parents=True)
    (out / "grpo_filter_lora_2e4" / "s0" / "run" / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "samples/total": 64}) + "\n" + json.dumps({"step": 2, "samples/total": 136}) + "\n")
    (out / "dpo_lora_1e4" / "s1").mkdir(parents=True)
    (out / "dpo_lora_1e4" / "s1" / "pairs.stats.json").write_text(json.dumps({"prompts": 960, "samples_per_prompt": 2}))
    for name, seed in [("rpo_lora_1e4", 1), ("rpo_lora_1e4", 0), ("sft_continued", 0)]:
        (out / name / f"s{seed}").mkdir(parents=True)
    variants = load_variants(report.CONFIGS)
    got = {(name, folder.name): report.samples_generated(variants, out, name, folder)
           for name, folder in report.seed_folders(variants, out)}
    assert got == {("grpo_filter_lora_2e4", "s0"): 136, ("dpo_lora_1e4", "s1"): 1920, ("rpo_lora_1e4", "s0"): None,
                   ("rpo_lora_1e4", "s1"): 1920, ("sft_continued", "s0"): 0}

    assert report.plot_paired(variants, out, 3) is None  # no SFT start evaluation yet
    scores = {"sft_start": [[0.1], [1.0], [0.0]], "grpo_filter_lora_2e4/s0": [[1.0], [1.0], [0.0]],
              "rpo_lora_1e4/s1": [[0.1], [1.0], [0.1]]}
    for folder, task_scores in scores.items():
        eval_json(out / folder / "eval_greedy_3.json", [row[0] for row in task_scores])
    drawn = []
    with mock.patch("matplotlib.axes.Axes.errorbar", side_effect=lambda xs, ys, **kw: drawn.append(
        (kw["label"], list(ys)))):
        assert report.plot_paired(variants, out, 3) == out / "paired_vs_samples.png"
    assert drawn == [("grpo_filter_lora_2e4 (1 seed)", [pytest.approx(0.3)]),
                     ("rpo_lora_1e4 (1 seed)", [pytest.approx(1 / 30)])]


def test_validation_tasks_are_held_out_500_on_and_disjoint_from_the_test_tasks(ablation):
    from rlft.tasks.countdown.generator import task_key

    setting = load_settings(ablation.CONFIGS)["bounded"]
    test, val = heldout_tasks(setting, 500), heldout_tasks(setting, 40, "validation")
    assert val == heldout_tasks(setting, 540)[500:]
    assert not {task_key(t) for t in val} & {task_key(t) for t in test}
    with pytest.raises(OptionError, match="has 500 tasks"):
        heldout_tasks(setting, 501, "validation")
    assert ablation.eval_name("greedy", 500) == "eval_greedy_500.json"
    assert ablation.eval_name("sampled", 300, "validation") == "eval_val_sampled_300.json"


def test_run_on_the_validation_split_evaluates_there_and_pairs_only_samples(ablation, tmp_path):
    """run --split validation: the variant's evaluation goes to the validation tasks (a test-split evaluation on disk
    does not count as done); pairs: only the DPO variants' pairs are sampled, nothing trained or evaluated."""
    sampled, evaluated = [], []

    def fake_pairs(cfg):
        sampled.append((cfg.num_prompts, cfg.start))
        Path(cfg.output).write_text("")

    folder = tmp_path / "dpo_4x_lora_1e4" / "s0"
    (folder / "run" / "model").mkdir(parents=True)
    (folder / "eval_greedy_500.json").write_text("{}")
    with (mock.patch("rlft.recipes.pairs.make_countdown_pairs", fake_pairs), mock.patch("rlft.recipes.dpo.train_dpo") as
          train, mock.patch.object(ablation, "evaluate", lambda ab, *args: evaluated.append(ab.split))):
        ablation.run_variant(make(ablation, tmp_path, split="test"), "dpo_4x_lora_1e4", 0)
        ablation.run_variant(make(ablation, tmp_path, split="validation"), "dpo_4x_lora_1e4", 0)
        ablation.main([
            "pairs", "--out",
            str(tmp_path), "--variants", "rpo_4x_lora_1e4", "--seeds", "1", "--setting", "bounded"
        ])
        with pytest.raises(SystemExit, match="not a DPO variant"):
            ablation.main(["pairs", "--out", str(tmp_path), "--variants", "grpo_filter_lora_2e4"])
    assert evaluated == ["validation"] and train.call_count == 0
    assert sampled == [(3840, 3840)]  # rpo_4x's pairs are dpo_4x's: 3,840 prompts from seed 1's offset
    assert (tmp_path / "dpo_4x_lora_1e4" / "s1" / "pairs.jsonl").exists()


def test_a_second_round_starts_samples_and_references_from_the_first_rounds_model(ablation, report, tmp_path):
    """rpo_4x_round2: its pairs come from rpo_4x_lora_1e4's model of the same seed, on 960 prompts from 7,680 +
    seed x 960 (after both seeds' round-1 prompts, 0 .. 7,679), and DPO starts from (and references) that model;
    without a finished round 1 it stops with the missing folder named, before sampling anything; its samples count
    both rounds'."""
    from rlft.recipes.pairs import stats_path

    pairs, dpo = [], []

    def fake_pairs(cfg):
        pairs.append((cfg.model, cfg.num_prompts, cfg.start, cfg.num_samples))
        Path(cfg.output).write_text("")
        stats_path(Path(cfg.output)).write_text(json.dumps({"prompts": cfg.num_prompts, "samples_per_prompt": 2}))

    def fake_train_dpo(cfg):
        dpo.append((cfg.model, cfg.loss_type, cfg.lr, Path(cfg.data).parent.parent.name))
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    with (mock.patch("rlft.recipes.pairs.make_countdown_pairs", fake_pairs),
          mock.patch("rlft.recipes.dpo.train_dpo", fake_train_dpo), mock.patch.object(ablation, "evaluate")):
        with pytest.raises(SystemExit, match="rpo_4x_lora_1e4/s1/run/model"):
            ablation.run_variant(make(ablation, tmp_path), "rpo_4x_round2", 1)
        assert pairs == []
        ablation.run_variant(make(ablation, tmp_path), "rpo_4x_lora_1e4", 1)
        ablation.run_variant(make(ablation, tmp_path), "rpo_4x_round2", 1)
    round1 = str(tmp_path / "rpo_4x_lora_1e4" / "s1" / "run" / "model")
    assert pairs == [("sft", 3840, 3840, 2), (round1, 960, 7680 + 960, 2)]
    assert dpo == [("sft", "rpo", 1e-4, "dpo_4x_lora_1e4"), (round1, "rpo", 1e-4, "rpo_4x_round2")]
    variants = load_variants(ablation.CONFIGS)
    assert report.samples_generated(variants, tmp_path, "rpo_4x_round2",
                                    tmp_path / "rpo_4x_round2" / "s1") == 3840 * 2 + 960 * 2


def test_pairs_of_a_second_round_are_sampled_from_that_rounds_start(ablation, tmp_path):
    """A variant trained on rpo_4x_round2's pairs (pairs_of) samples them, when absent, from rpo_4x_round2's start
    (round 1's model), not from its own start (the SFT model)."""
    models = []

    def fake_pairs(cfg):
        models.append(cfg.model)
        Path(cfg.output).write_text("")

    (tmp_path / "rpo_4x_lora_1e4" / "s0" / "run" / "model").mkdir(parents=True)
    sibling = dict(kind="dpo", loss_type="dpo", lr=1e-4, pairs_of="rpo_4x_round2")
    ab = make(ablation, tmp_path, "bounded",
              variants={**load_variants(ablation.CONFIGS), "dpo_on_round2_pairs": sibling})
    with mock.patch("rlft.recipes.pairs.make_countdown_pairs", fake_pairs):
        ablation.ensure_pairs(ab, "dpo_on_round2_pairs", 0)
    assert models == [str(tmp_path / "rpo_4x_lora_1e4" / "s0" / "run" / "model")]


def test_a_variant_sets_beta_and_the_others_keep_0_1(ablation, tmp_path):
    """rpo_4x_beta05 trains RPO at beta 0.5 on dpo_4x_lora_1e4's pairs; a variant that names no beta keeps 0.1."""
    runs = []

    def fake_train_dpo(cfg):
        runs.append((cfg.beta, cfg.loss_type, Path(cfg.data).parent.parent.name))
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    (tmp_path / "dpo_4x_lora_1e4" / "s0").mkdir(parents=True)
    (tmp_path / "dpo_4x_lora_1e4" / "s0" / "pairs.jsonl").write_text("")
    with (mock.patch("rlft.recipes.dpo.train_dpo", fake_train_dpo), mock.patch.object(ablation, "evaluate")):
        ablation.run_variant(make(ablation, tmp_path), "rpo_4x_beta05", 0)
        ablation.run_variant(make(ablation, tmp_path), "rpo_4x_lora_1e4", 0)
    assert runs == [(0.5, "rpo", "dpo_4x_lora_1e4"), (0.1, "rpo", "dpo_4x_lora_1e4")]
    assert "beta" not in load_variants(
        ablation.CONFIGS)["rpo_4x_lora_1e4"]  # the variant file names none: the setting's 0.1


def test_steps_override_the_setting_and_a_variants_own_max_steps_overrides_steps(ablation, tmp_path):
    """--steps 20 gives grpo_filter_lora_1e4 20 steps (the setting says 30); grpo_filter_lora_1e4_60 keeps its 60."""
    runs = []

    def fake_train_rl(cfg, **_):  # on_test_look: rlft.lab.test_looks.train_rl_counted's recorder
        runs.append(cfg.max_steps)
        (Path(cfg.output_dir) / "model").mkdir(parents=True)

    with (mock.patch("rlft.recipes.rl.train_rl", fake_train_rl), mock.patch.object(ablation, "evaluate")):
        for name in ("grpo_filter_lora_1e4", "grpo_filter_lora_1e4_60"):
            ablation.run_variant(make(ablation, tmp_path, steps=20), name, 0)
        ablation.run_variant(make(ablation, tmp_path / "default"), "grpo_filter_lora_1e4", 0)
    assert runs == [20, 60, 30]


def test_unpack_lays_archived_run_files_out_for_the_report(report, tmp_path):
    """Archived <variant>_s<seed>_<file> files land where report and the plots read them; unknown variants, pairs files
    and files already unpacked are left alone."""
    archive, out = tmp_path / "data", tmp_path / "out"
    archive.mkdir()
    for name in ("rpo_4x_beta05_s1_eval_greedy_500.json", "dpo_4x_lora_1e4_1ep_s0_metrics.jsonl",
                 "dpo_4x_lora_1e4_s0_pairs_stats.json", "grpo_filter_lora_2e4_s0_train_time.json",
                 "sft_start_eval_val_greedy_500.json", "nosuchvariant_s0_eval_greedy_500.json", "pairs_4x_s0.jsonl"):
        (archive / name).write_text(name)
    (out / "rpo_4x_beta05" / "s1").mkdir(parents=True)
    (out / "rpo_4x_beta05" / "s1" / "eval_greedy_500.json").write_text("newer")
    assert report.unpack_archive(load_variants(report.CONFIGS), archive, out) == 4
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "dpo_4x_lora_1e4/s0/pairs.stats.json", "dpo_4x_lora_1e4_1ep/s0/run/metrics.jsonl",
        "grpo_filter_lora_2e4/s0/train_time.json", "rpo_4x_beta05/s1/eval_greedy_500.json",
        "sft_start/eval_val_greedy_500.json"]
    assert (out / "dpo_4x_lora_1e4_1ep" / "s0" / "run" /
            "metrics.jsonl").read_text() == "dpo_4x_lora_1e4_1ep_s0_metrics.jsonl"
    assert (out / "rpo_4x_beta05" / "s1" / "eval_greedy_500.json").read_text() == "newer"


def test_the_archived_bounded_report_is_rebuilt_byte_for_byte(report, tmp_path):
    """docs/results/countdown-bounded/data, unpacked, gives the report table and the churn lines the archive was
    published with (tests/assets/ablation: the output of the script before its variants moved to YAML)."""
    variants, out = load_variants(report.CONFIGS), tmp_path / "archive"
    assert report.unpack_archive(variants, ROOT / "docs" / "results" / "countdown-bounded" / "data", out) == 79
    assert report.report(variants, out, 500) + "\n" == (ASSETS / "countdown_bounded_report.md").read_text()
    assert report.churn(variants, out, 500) + "\n" == (ASSETS / "countdown_bounded_churn.txt").read_text()
    with pytest.raises(UsageError, match="eval_greedy_200.json does not exist"):
        report.report(variants, out, 200)


def test_variant_options_are_checked_against_the_recipe_config(ablation, tmp_path):
    """A key that is neither the runner's nor an option of the kind's recipe config stops the run, naming it."""
    from rlft.recipes.dpo import DPOConfig

    spec = {"kind": "dpo", "loss_type": "rpo", "lr": 1e-4, "pairs_of": "dpo_lora_1e4", "betta": 0.5}
    with pytest.raises(SystemExit, match="variant 'typo': betta: not an option of DPOConfig"):
        ablation.recipe_options(DPOConfig, "typo", spec)
    ok = {k: v for k, v in spec.items() if k != "betta"}
    assert ablation.recipe_options(DPOConfig, "ok", ok) == {"loss_type": "rpo",
                                                            "lr": 1e-4}  # kind, pairs_of: the runner's


def test_every_variant_file_loads_with_every_option_known(ablation):
    """configs/countdown/ablation: every variant's options are fields of its recipe config, every setting names the
    same keys, and a setting's mappings are common's with its own values on top."""
    from rlft.recipes.dpo import DPOConfig
    from rlft.rl.config import RLConfig
    from rlft.recipes.sft import SFTConfig

    configs = {"rl": RLConfig, "dpo": DPOConfig, "sft": SFTConfig}
    for name, spec in load_variants(ablation.CONFIGS).items():
        ablation.recipe_options(configs[spec["kind"]], name, spec)
    settings = load_settings(ablation.CONFIGS)
    assert list(settings) == ["direct", "bounded", "real"]
    assert settings["bounded"].rl == settings["direct"].rl and settings["bounded"].max_new_tokens == 144
    real = settings["real"]
    assert real.tasks["data"].endswith(
        "countdown/train.parquet") and real.dtype == "auto" and real.max_new_tokens == 256
    assert real.sft_continued[
        "data"] == "countdown" and real.sft_continued["batch_size"] == 16  # common's, merged key by key
    assert replace(settings["bounded"], name="direct", sft="runs/exp/sft/model", trace_style="direct",
                   max_new_tokens=64, micro_batch_size=32) == settings["direct"]


def test_sizes_pairs_each_run_by_count_of_numbers(report, tmp_path):
    """`ablation_report.py sizes`: per variant/seed, the paired difference against the SFT start on mixed, 3- and
    4-number rows, computed from the evaluation files (by hand: 4 rows, two of each size)."""
    from rlft.eval.countdown import CountdownEvalResult, size_summary

    tasks = [{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3, 4], "target": 10}] * 2

    def write(folder: Path, scores: list[float]) -> None:
        r = CountdownEvalResult(num_tasks=4, k=1, mode="greedy", mean_score=sum(scores) / 4, accuracy=0.0,
                                format_rate=0.0, pass_at_k={1: 0.0}, mean_completion_tokens=0.0, truncated_rate=0.25,
                                tasks=tasks, task_scores=[[x] for x in scores], task_truncated=[[False], [True],
                                                                                                [False], [False]])
        r.by_size = size_summary(r)
        folder.mkdir(parents=True)
        (folder / "eval_val_greedy_4.json").write_text(json.dumps(r.to_dict()))

    write(tmp_path / "sft_start", [0.1, 0.0, 1.0, 0.1])
    write(tmp_path / "real_grpo" / "s0", [1.0, 0.1, 1.0, 0.1])
    from rlft.lab.pipeline import load_variants

    text = report.sizes(load_variants(report.CONFIGS), tmp_path, 4, "validation")
    assert "| SFT start | - | 0.300 / 0.550 / 0.050 | 0.250 |" in text
    # mixed +0.25 (0.9 + 0.1 over 4 rows), 3 numbers +0.45, 4 numbers +0.05
    row = next(line for line in text.splitlines() if line.startswith("| real_grpo | 0 |"))
    assert "| 0.550 / 1.000 / 0.100 | 0.250 | +0.250 [" in row and "| +0.450 [" in row and "| +0.050 [" in row


@pytest.mark.parametrize("config, expected", [
    ("data: ../shared/data/countdown/train.parquet\neval_rows: validation\n", 0.5),  # real rows: validation start
    ("data: ../shared/data/countdown/train.parquet\neval_rows: test\n", 0.2),
    ("preset: medium3\n", 0.2),  # a generated preset's held-out tasks are the test rows
    (None, 0.2),  # an archive without the run's config: a generated-preset study
])
def test_samples_vs_score_starts_from_the_sft_score_on_the_in_loop_rows(report, tmp_path, config, expected):
    """The dashed start line and each run's first point are the SFT start's score on the rows the RL loop evaluates:
    its validation evaluation for runs on a Countdown dataset, never the test evaluation of other rows."""
    variants = {"grpo": {"kind": "rl"}}
    run = tmp_path / "grpo" / "s0" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "samples/total": 640, "eval/score": 0.6}) + "\n")
    if config is not None:
        (run / "config.yaml").write_text(config)
    (tmp_path / "sft_start").mkdir()
    for name, first in (("eval_greedy_500.json", 0.2), ("eval_val_greedy_500.json", 0.5)):
        scores = [[first]] * 100 + [[1.0]] * 400  # only the first 100 rows (n_curve) count
        (tmp_path / "sft_start" / name).write_text(json.dumps({"task_scores": scores}))
    with mock.patch("rlft.eval.report.plot_samples_vs_score", return_value=None) as plot:
        report.plot_samples_vs_score(variants, tmp_path)
    assert plot.call_args.kwargs["start"] == pytest.approx(expected)


def test_samples_vs_score_draws_no_start_when_runs_evaluate_different_rows(report, tmp_path):
    variants = {"a": {"kind": "rl"}, "b": {"kind": "rl"}}
    for name, config in (("a", "data: x.parquet\neval_rows: validation\n"), ("b", "preset: medium3\n")):
        run = tmp_path / name / "s0" / "run"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(config)
        (run / "metrics.jsonl").write_text("")
    (tmp_path / "sft_start").mkdir()
    (tmp_path / "sft_start" / "eval_greedy_500.json").write_text(json.dumps({"task_scores": [[0.2]] * 500}))
    with mock.patch("rlft.eval.report.plot_samples_vs_score", return_value=None) as plot:
        report.plot_samples_vs_score(variants, tmp_path)
    assert plot.call_args.kwargs["start"] is None


def test_checkpoint_evaluates_the_kept_adapter_merged_into_the_variants_start(ablation, tmp_path, tiny_model_dir,
                                                                              smol_tokenizer):
    """checkpoint --step 10: reuse_topr_r2 (start_from real_sft_patient) gets its kept step-10 adapter merged into
    real_sft_patient's model of the same seed, evaluated from <variant>/s0/step10/; the run's own checkpoint when no
    copy was kept; no adapter at all: SystemExit naming the folder."""
    from transformers import AutoModelForCausalLM

    from rlft.checkpoint import save_model_folder
    from rlft.lora import LoRASettings, apply_lora

    start = tmp_path / "real_sft_patient" / "s0" / "run" / "model"
    start.parent.mkdir(parents=True)
    start.symlink_to(tiny_model_dir, target_is_directory=True)
    ab = make(ablation, tmp_path, setting="real", split="validation")
    with pytest.raises(SystemExit, match="reuse_topr_r2/s0: no LoRA checkpoint of step 10 kept"):
        ablation.checkpoint_eval(ab, "reuse_topr_r2", 0, 10)
    adapted = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoRASettings(4, 8.0, 0.0, "all-linear"))
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    save_model_folder(tmp_path / "reuse_topr_r2" / "s0" / "step10_checkpoint", adapted, smol_tokenizer)
    evaluated = []
    with mock.patch.object(ablation, "evaluate", lambda ab, model, out, seed: evaluated.append(
        (model, out, seed)) or {}):
        ablation.checkpoint_eval(ab, "reuse_topr_r2", 0, 10)
    folder = tmp_path / "reuse_topr_r2" / "s0" / "step10"
    assert evaluated == [(folder / "model", folder, 0)]
    merged, base = load_weights(folder / "model"), load_weights(tiny_model_dir)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])

    own = tmp_path / "reuse_ppo_r2" / "s0" / "run" / "checkpoints" / "step-00000010"
    save_model_folder(own, adapted, smol_tokenizer)
    with mock.patch.object(ablation, "evaluate", lambda ab, model, out, seed: evaluated.append(
        (model, out, seed)) or {}):
        ablation.checkpoint_eval(ab, "reuse_ppo_r2", 0, 10)
    assert evaluated[-1][1] == tmp_path / "reuse_ppo_r2" / "s0" / "step10"
    assert torch.equal(
        load_weights(evaluated[-1][0])["model.layers.0.self_attn.q_proj.weight"],
        merged["model.layers.0.self_attn.q_proj.weight"])
