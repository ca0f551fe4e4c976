"""Issue "Hardening II", row by row: each bad call is refused with one line (exit 2) before any model loads where the
problem is knowable at parse time, and leaves what is on disk as it was; or it now behaves correctly.

| row | test |
| 1 existing --output replaced            | test_row1_* |
| 2 FSDP2 RL step with all-equal rewards  | test_row2_rl_survives_a_step_with_equal_rewards (torchrun, gloo) |
| 3 sampling commands under torchrun      | test_row3_* |
| 4 eval beyond the held-out tasks        | test_row4_* |
| 5 config header, several files, dups    | test_row5_* |
| 6 --dry-run skipped the run-folder rules| test_row6_* |
| 7 LoRA target matching nothing          | test_row7_* |
| 8 --prompts-per-step above the tasks    | test_row8_* |
| 9 unbounded --config read               | test_row9_* |
| 10 --output-dir . / ..                  | test_row10_* |
| 11 --output naming a folder             | test_row11_* |
| 12 --k in greedy evaluation             | test_row12_* |
| 13 tracker package missing              | test_row13_* |
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from rlft.cli import main

from tests.conftest import load_weights, make_tiny_model
from tests.integration.test_bad_inputs import assert_error

ROOT = Path(__file__).resolve().parents[2]
RLOO_CONFIG = ROOT / "configs" / "countdown" / "2_rloo.yaml"


def cli(capsys, *args) -> tuple[int, str, str]:
    """``rlft args...`` in-process: (exit code, stdout, stderr)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def stray_temps(folder: Path) -> list[str]:
    return [p.name for p in Path(folder).rglob("*.tmp")]


@pytest.fixture
def data_file(tmp_path) -> Path:
    """A 12-row data file someone cares about."""
    path = tmp_path / "mydata.jsonl"
    path.write_text("".join(json.dumps({"target": 10 + i, "nums": [i, 2, 3]}) + "\n" for i in range(12)))
    return path


# --------------------------------------------------------------------------- row 1: existing outputs


def test_row1_pairs_and_eval_refuse_an_existing_output(capsys, tmp_path, data_file, tiny_model_dir):
    before = tree(tmp_path)
    model = ["--model", tiny_model_dir, "--device", "cpu"]
    assert_error(capsys, ["pairs", "countdown", *model, "--output", data_file], 2,
                 f"rlft pairs countdown: error: --output {data_file}: {data_file} already exists; pass --overwrite to "
                 "replace it, or choose another --output")
    assert_error(capsys, ["eval", "countdown", *model, "--output", data_file], 2,
                 f"rlft eval countdown: error: --output {data_file}: {data_file} already exists; pass --overwrite to "
                 "replace it, or choose another --output")
    stats = tmp_path / "fresh.stats.json"  # someone else's file where the stats would go
    stats.write_text('{"mine": 1}\n')
    before = tree(tmp_path)
    assert_error(capsys, ["pairs", "countdown", *model, "--output", tmp_path / "fresh.jsonl"], 2,
                 f"rlft pairs countdown: error: --output {tmp_path / 'fresh.jsonl'}: {stats} already exists; pass "
                 "--overwrite to replace it, or choose another --output")
    assert tree(tmp_path) == before


def test_row1_a_model_folder_is_never_written_into(capsys, tmp_path, tiny_model_dir):
    before = tree(tiny_model_dir)
    config = Path(tiny_model_dir) / "config.json"
    for command in (["pairs", "countdown"], ["eval", "countdown"]):
        for extra in ([], ["--overwrite"]):
            assert_error(capsys, [*command, "--model", tiny_model_dir, "--output", config, *extra], 2,
                         f"rlft {' '.join(command)}: error: --output {config} would write into the model folder "
                         f"{tiny_model_dir} (it holds config.json); choose another --output")
    assert_error(capsys, ["eval", "winrate", "--output-dir", tiny_model_dir], 2,
                 f"rlft eval winrate: error: --output-dir {tiny_model_dir} is a model folder (it holds config.json); "
                 "choose another --output-dir")
    assert tree(tiny_model_dir) == before


def test_row1_winrate_refuses_earlier_results(capsys, tmp_path):
    out = tmp_path / "wr"
    out.mkdir()
    (out / "winrate.json").write_text('{"win_rate": 0.5}\n')
    assert_error(
        capsys, ["eval", "winrate", "--output-dir", out, "--dry-run"], 2,
        f"rlft eval winrate: error: --output-dir {out / 'winrate.json'}: {out / 'winrate.json'} already exists; "
        "pass --overwrite to replace it, or choose another --output-dir")
    assert cli(capsys, "eval", "winrate", "--output-dir", out, "--overwrite", "--dry-run")[0] == 0


class _Engine:
    """Samples one fixed text per (prompt, sample): 'a' or 'b' (a and b score alike: every prompt ties)."""

    tokenizer = None

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        from rlft.rollout.base import Sample

        return [[Sample([1], "ab"[j % 2], "stop") for j in range(params.k)] for _ in prompts]


def test_row1_pairs_journal_of_another_run_is_refused_unless_overwrite(tmp_path):
    from dataclasses import replace

    from rlft.recipes.pairs import PairsConfig, journal_path, make_countdown_pairs, stats_path
    from rlft.run_folder import OutputPathError

    cfg = PairsConfig(model=str(tmp_path / "no-model"), preset="tiny", num_prompts=3, device="cpu",
                      output=str(tmp_path / "p.jsonl"))
    make_countdown_pairs(cfg, engine=_Engine())
    journal = journal_path(cfg.output)
    Path(cfg.output).unlink()  # the pairs file removed: its own stats file and journal are continued, not refused
    engine = _Engine()
    make_countdown_pairs(cfg, engine=engine)
    assert engine.calls == 0  # every sample read back from the journal
    other = replace(cfg, output=str(tmp_path / "q.jsonl"), seed=5)
    os.replace(journal, journal_path(other.output))  # a journal of seed 0 where a seed-5 run would write its own
    before = tree(tmp_path)
    with pytest.raises(OutputPathError,
                       match=r"was written by another sampling run \(differs in seed\); pass --overwrite"):
        make_countdown_pairs(other, engine=_Engine())
    with pytest.raises(OutputPathError, match="already exists; pass --overwrite"):
        make_countdown_pairs(cfg, engine=_Engine())  # its pairs file exists now
    assert tree(tmp_path) == before
    engine = _Engine()
    stats = make_countdown_pairs(replace(other, overwrite=True), engine=engine)
    assert engine.calls == 1 and stats["prompts"] == 3  # sampled again, the old journal replaced
    assert json.loads(journal_path(other.output).read_text().splitlines()[0])["meta"]["seed"] == 5
    assert json.loads(stats_path(other.output).read_text())["output"] == other.output
    assert not stray_temps(tmp_path)


# --------------------------------------------------------------------------- row 2: FSDP2 and equal rewards

EQUAL_STEP_SCRIPT = """
import json, sys
import torch
import rlft.recipes.rl as rl
from rlft.distributed import shutdown
from rlft.rl.config import RLConfig, rloo_config

torch.set_num_threads(1)
calls = []


def reward(prompts, completions, ground_truths):
    # step 1 (this rank's first call): every reward equal, so every advantage is 0; then rewards that vary
    calls.append(1)
    return [0.5] * len(prompts) if len(calls) == 1 else [float(len(c) % 3) for c in completions]


options = json.loads(sys.argv[1])
make = rloo_config if options.pop("command") == "rloo" else RLConfig
rl.train_rl(make(**options), reward_fn=reward)
shutdown()
"""


@pytest.mark.parametrize("strategy, command", [("fsdp2", "rloo"), ("ddp", "rl")])
def test_row2_rl_survives_a_step_with_equal_rewards(strategy, command, tiny_model_dir, tmp_path):
    from rlft.checkpoint import read_metrics
    from tests.unit.test_distributed import SRC, _launch

    script = tmp_path / "equal_step.py"
    script.write_text(EQUAL_STEP_SCRIPT)
    out = tmp_path / "run"
    options = {"command": command, "model": str(tiny_model_dir), "preset": "tiny", "num_train": 8, "heldout_size": 8,
               "prompt_template": "short", "k": 2, "prompts_per_step": 2, "max_steps": 2, "max_new_tokens": 4,
               "micro_batch_size": 4, "save_every": 1, "device": "cpu", "dtype": "float32", "beta": 0.0,
               "distributed": strategy, "output_dir": str(out)}
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    done = _launch(
        lambda port: [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
            "127.0.0.1", "--master-port", port,
            str(script),
            json.dumps(options)
        ], env, 300)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["adv/std"] == 0.0 and records[0]["update/rows_frac"] == 0.0 and records[0]["grad_norm"] == 0.0
    # the zero gradient moved nothing (AdamW from fresh moments, no weight decay): step 1's weights are the start's
    start, after = load_weights(tiny_model_dir), load_weights(out / "checkpoints" / "step-00000001")
    assert start.keys() == after.keys() and all(torch.equal(start[k], after[k]) for k in start)
    assert (out / "model" / "model.safetensors").is_file()


# --------------------------------------------------------------------------- row 3: torchrun


def test_row3_sampling_commands_refuse_torchrun(capsys, tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for command in (["eval", "countdown"], ["eval", "winrate"], ["pairs", "countdown"]):
        name = " ".join(command)
        assert_error(capsys, [*command, "--dry-run"], 2,
                     f"rlft {name}: error: torchrun started 2 processes, but `rlft {name}` samples in one process "
                     "(every rank would sample and write the same): run it without torchrun")
    from rlft.eval.countdown_command import EvalCountdownConfig, run_eval_countdown
    from rlft.validation import UsageError

    with pytest.raises(UsageError, match="torchrun"):  # programmatic use too
        run_eval_countdown(EvalCountdownConfig(model=str(tiny_model_dir), limit=1, device="cpu"))


def test_row3_pairs_under_torchrun_exits_2_and_writes_nothing(tmp_path, tiny_model_dir):
    from tests.unit.test_distributed import SRC, _launch

    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "pairs" / "p.jsonl"
    done = _launch(
        lambda port: [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
            "127.0.0.1", "--master-port", port, "-m", "rlft.cli", "pairs", "countdown", "--model",
            str(tiny_model_dir), "--num-prompts", "8", "--device", "cpu", "--output",
            str(out)
        ], env, 120)
    assert done.returncode != 0
    line = ("rlft pairs countdown: error: torchrun started 2 processes, "
            "but `rlft pairs countdown` samples in one process")
    # each rank refuses before it samples; once one rank has exited, torchrun stops the others, so a slower rank may
    # be stopped before it prints (seen on 2026-11-28 on a busy CPU): at least one says it, and none writes
    assert (done.stdout + done.stderr).count(line) >= 1, done.stderr[-3000:]
    assert "exitcode  : 2" in done.stderr  # torchrun's report of the ranks' exit code
    assert not (tmp_path / "pairs").exists()


# --------------------------------------------------------------------------- row 4: held-out tasks


def test_row4_eval_beyond_the_heldout_tasks_names_the_overlap(capsys):
    assert_error(
        capsys, ["eval", "countdown", "--limit", "1000", "--dry-run"], 2,
        "rlft eval countdown: error: --limit 1000 is more than --heldout-size 200: 590 of the 1000 tasks are in "
        "the training set of `rlft rl --preset easy3 --split-seed 1234 --heldout-size 200` (its default --num-train "
        "2000); pass --limit 200 or less, a larger --heldout-size (as the training run used), or --split train")
    assert cli(capsys, "eval", "countdown", "--limit", "1000", "--split", "train", "--dry-run")[0] == 0
    assert cli(capsys, "eval", "countdown", "--limit", "1000", "--heldout-size", "1000", "--dry-run")[0] == 0


def test_row4_overlap_count_and_default_tasks_by_hand():
    from rlft.eval.countdown_command import EvalCountdownConfig, load_eval_tasks, training_overlap
    from rlft.rl.config import RLConfig
    from rlft.tasks.countdown.generator import PRESETS, make_splits, task_key

    # naive: the training tasks of a run holding out 8, against the first 40 test tasks
    train = make_splits(PRESETS["tiny"], RLConfig().num_train, 8, 7)[0]
    tasks = make_splits(PRESETS["tiny"], 0, 40, 7)[1]
    naive = sum(any(task_key(t) == task_key(u) for u in train) for t in tasks)
    assert naive > 0 and training_overlap("tiny", 7, 8,
                                          40).startswith(f"{naive} of the 40 tasks are in the training set")
    # --limit None: the held-out tasks themselves, none of them trained on; --split train: the run's first tasks
    held = load_eval_tasks(EvalCountdownConfig(preset="tiny", split_seed=7, heldout_size=8, limit=None))
    assert len(held) == 8 and not {task_key(t) for t in held} & {task_key(t) for t in train}
    first = load_eval_tasks(EvalCountdownConfig(preset="tiny", split_seed=7, heldout_size=8, limit=5, split="train"))
    assert [task_key(t) for t in first] == [task_key(t) for t in train[:5]]


# --------------------------------------------------------------------------- rows 5 and 9: config files


def test_row5_a_config_of_another_command_is_refused(capsys):
    assert_error(
        capsys, ["rl", "--config", RLOO_CONFIG, "--dry-run"], 2,
        f"rlft rl: error: --config {RLOO_CONFIG} is a config of `rlft rloo` (its first line), not of `rlft rl`: "
        f"run `rlft rloo --config {RLOO_CONFIG}`, or change its first line")
    assert cli(capsys, "rloo", "--config", RLOO_CONFIG, "--output-dir", "/nonexistent/fresh", "--dry-run")[0] == 0


def test_row5_header_command_is_the_longest_command_named():
    from rlft.cli import _commands
    from rlft.config_files import header_command

    commands = list(_commands())
    assert header_command("# rlft rloo\nk: 2\n", commands) == "rloo"
    assert header_command("# rlft rl\n", commands) == "rl"
    assert header_command("#rlft eval countdown (held-out)\n", commands) == "eval countdown"
    assert header_command("# Countdown ablation: rl variants\n", commands) is None
    assert header_command("lr: 1\n# rlft rl\n", commands) is None


def _plan_options(out: str) -> dict[str, tuple[str, str]]:
    """``{option: (value text, source)}`` from a dry-run plan's options block."""
    block = out.split("\noptions:\n", 1)[1]
    got = {}
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and ":" in line:
            key, rest = line[2:].split(":", 1)
            value, _, source = rest.partition("  # ")
            got[key] = (value.strip(), source)
    return got


def test_row5_several_configs_merge_in_order_and_the_plan_names_each_source(capsys, tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("# rlft rloo\nlr: 0.001\nmax_steps: 5\nk: 3\n")
    b.write_text("max-steps: 7\nk: 6\n")
    code, out, err = cli(capsys, "rloo", "--config", a, "--config", b, "--k", "5", "--output-dir", tmp_path / "out",
                         "--dry-run")
    assert code == 0, err
    options = _plan_options(out)
    assert options["lr"] == ("0.001", f"--config {a}")
    assert options["max_steps"] == ("7", f"--config {b}")  # the later file wins
    assert options["k"] == ("5", "flag")  # flags win over every file
    assert options["advantage"] == ("rloo", "rlft rloo default")
    assert options["beta"] == ("0.001", "default")
    assert not (tmp_path / "out").exists()


def test_row5_a_key_given_twice_is_an_error(capsys, tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("lr: 0.1\nmax_steps: 3\nlr: 0.5\n")
    assert_error(
        capsys, ["sft", "--config", path, "--dry-run"], 2,
        f"rlft sft: error: --config {path}: key 'lr' appears twice (lines 1 and 3); the last one would silently win")
    path.write_text("max-steps: 3\nmax_steps: 4\n")
    assert_error(
        capsys, ["sft", "--config", path, "--dry-run"], 2,
        f"rlft sft: error: --config {path}: an option is given twice, spelled with '-' and '_' (max-steps, max_steps)")


def test_row5_a_bad_value_names_its_file(capsys, tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("lr: 0.001\n")
    b.write_text("max_steps: 0\n")
    assert_error(capsys, ["sft", "--config", a, "--config", b, "--dry-run"], 2,
                 f"rlft sft: error: --config {b}: --max-steps must be >= 1 (or unset), got 0")


@pytest.mark.parametrize("source", ["/dev/zero", "big"])
def test_row9_config_reads_are_bounded(capsys, tmp_path, source):
    path = Path(source) if source.startswith("/") else tmp_path / "big.yaml"
    if source == "big":
        path.write_text("# rlft sft\n" + "x" * (1 << 21))
    elif not path.exists():
        pytest.skip("no /dev/zero here")
    assert_error(capsys, ["sft", "--config", path, "--dry-run"], 2,
                 f"rlft sft: error: --config {path}: more than 1 MiB; an options file is a short YAML mapping")


# -------------------------------------------------------------------------- row 6: --dry-run checks what the run checks


@pytest.fixture
def finished_run(tmp_path) -> Path:
    from rlft.recipes.sft import SFTConfig
    from rlft.run_folder import write_run_config

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    write_run_config(run, SFTConfig(lr=0.001, max_steps=5, output_dir=str(run)))
    (run / "metrics.jsonl").write_text('{"step": 5}\n')
    return run


def test_row6_dry_run_refuses_what_the_run_refuses(capsys, tmp_path, finished_run):
    before = tree(tmp_path)
    assert_error(
        capsys, ["sft", "--output-dir", finished_run, "--dry-run"], 2,
        f"rlft sft: error: output folder {finished_run} already holds a run (config.yaml, metrics.jsonl, model/); "
        "pass --resume to continue it or --overwrite to replace it (or choose another --output-dir)")
    assert_error(
        capsys, ["sft", "--output-dir", finished_run, "--resume", "--lr", "0.5", "--max-steps", "5", "--dry-run"], 2,
        f"rlft sft: error: --resume: options differ from the run in {finished_run} (--lr 0.001 -> 0.5); "
        "pass --resume-override lr to resume with the new values anyway")
    file = finished_run / "config.yaml"
    assert_error(capsys, ["dpo", "--output-dir", file, "--dry-run"], 2,
                 f"rlft dpo: error: output folder {file} is a file, not a folder")
    assert tree(tmp_path) == before
    # what the run accepts, the dry run accepts
    assert cli(capsys, "sft", "--output-dir", finished_run, "--resume", "--lr", "0.001", "--max-steps", "9",
               "--dry-run")[0] == 0
    assert cli(capsys, "sft", "--output-dir", finished_run, "--overwrite", "--dry-run")[0] == 0
    assert tree(tmp_path) == before


def test_row6_the_real_run_refuses_at_parse_time(capsys, tmp_path, finished_run, monkeypatch):
    import rlft.models

    def no_load(*args, **kwargs):
        raise AssertionError("nothing may load")

    monkeypatch.setattr(rlft.models, "load_tokenizer", no_load)
    monkeypatch.setattr(rlft.models, "load_model", no_load)
    assert cli(capsys, "sft", "--output-dir", finished_run, "--resume", "--lr", "0.5", "--max-steps", "5")[0] == 2


# --------------------------------------------------------------------------- row 7: LoRA targets


def test_row7_lora_target_that_matches_nothing(smol_tokenizer):
    from rlft.lora import check_targets
    from rlft.validation import OptionError

    model = make_tiny_model(len(smol_tokenizer))
    check_targets(model, "q_proj,v_proj")
    check_targets(model, "self_attn.q_proj, mlp.down_proj")
    check_targets(model, "all-linear")
    with pytest.raises(
            OptionError, match=r"^--lora-target-modules: 'typo_proj' matches no module of LlamaForCausalLM "
            r"\(its linear layers: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"):
        check_targets(model, "q_proj,typo_proj")
    with pytest.raises(OptionError, match="'proj', 'q' match no module"):
        check_targets(model, "proj,q")  # a part of a name is not a name


def test_row7_rl_with_a_typo_target_exits_2_before_training(capsys, tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    code, _, err = cli(capsys, "rl", "--model", tiny_model_dir, "--preset", "tiny", "--num-train", "8",
                       "--heldout-size", "8", "--prompt-template", "short", "--lora-r", "8", "--lora-target-modules",
                       "q_proj,typo_proj", "--device", "cpu", "--output-dir", out, "--max-steps", "1", "--k", "2",
                       "--prompts-per-step", "2")
    assert code == 2, err
    assert err.splitlines()[-1].startswith(
        "rlft rl: error: --lora-target-modules: 'typo_proj' matches no module of LlamaForCausalLM")
    assert not (out / "metrics.jsonl").exists()


# --------------------------------------------------------------------------- row 8: prompts per step


def test_row8_more_prompts_per_step_than_tasks(capsys, tmp_path, tiny_model_dir, monkeypatch):
    assert_error(capsys, ["rl", "--num-train", "8", "--prompts-per-step", "20", "--dry-run"], 2,
                 "rlft rl: error: --prompts-per-step (20) is more than the 8 training tasks (--num-train)")
    # chat prompts: counted once read, still before the model loads
    import rlft.recipes.rl as rl_recipe

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(rl_recipe, "start_training", no_load)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": "OK"}]}) +
        "\n" for i in range(5)))
    out = tmp_path / "run"
    code, _, err = cli(capsys, "rl", "--model", tiny_model_dir, "--prompts-data", prompts, "--reward",
                       "uppercase_start", "--prompts-per-step", "6", "--device", "cpu", "--output-dir", out)
    assert (code,
            err.splitlines()[-1]) == (2,
                                      "rlft rl: error: --prompts-per-step (6) is more than the 5 training prompts"), err


# --------------------------------------------------------------------------- row 10: . and ..


def test_row10_overwrite_of_the_current_folder_is_refused(capsys, tmp_path, monkeypatch):
    here = tmp_path / "work"
    here.mkdir()
    (here / "notes.txt").write_text("keep me")
    monkeypatch.chdir(here)
    before = tree(tmp_path)
    for where, folder in ((".", here), ("..", tmp_path)):
        assert_error(capsys, ["sft", "--output-dir", where, "--overwrite", "--device", "cpu"], 2,
                     f"rlft sft: error: --overwrite would move {folder} aside, and it holds the current folder {here}; "
                     "run from another folder, or name a new subfolder as --output-dir")
    assert tree(tmp_path) == before


def test_row10_dot_is_a_named_folder(tmp_path, monkeypatch, finished_run):
    from rlft.recipes.sft import SFTConfig
    from rlft.run_folder import check_run_dir, run_dir_path

    monkeypatch.chdir(finished_run)
    assert run_dir_path(".") == finished_run and run_dir_path("..") == finished_run.parent
    assert run_dir_path("runs/x") == Path("runs/x")
    folder = check_run_dir(SFTConfig(output_dir=".", resume=True, lr=0.001, max_steps=5))  # resuming where one stands
    assert folder.path == finished_run and folder.holds_run


# --------------------------------------------------------------------------- row 11: a folder as --output


def test_row11_a_folder_as_output_is_refused_before_sampling(capsys, tmp_path, tiny_model_dir):
    folder = tmp_path / "existing"
    folder.mkdir()
    before = tree(tmp_path)
    for command in (["pairs", "countdown"], ["eval", "countdown"]):
        for path in (str(folder), str(tmp_path / "new") + "/"):
            assert_error(
                capsys, [*command, "--model", tiny_model_dir, "--device", "cpu", "--output", path], 2,
                f"rlft {' '.join(command)}: error: --output {path} is a folder; "
                "name a file to write (in it, or elsewhere)"
            )
    assert tree(tmp_path) == before and not stray_temps(tmp_path) and not (tmp_path / "new").exists()


# --------------------------------------------------------------------------- row 12: --k in greedy mode


def test_row12_k_needs_sampled_mode(capsys):
    assert_error(
        capsys, ["eval", "countdown", "--k", "3", "--dry-run"], 2,
        "rlft eval countdown: error: --k 3 needs --mode sampled: greedy evaluation draws one completion per task")
    assert cli(capsys, "eval", "countdown", "--k", "3", "--mode", "sampled", "--dry-run")[0] == 0


# --------------------------------------------------------------------------- row 13: tracker packages


@pytest.mark.parametrize("tracker", ["wandb", "trackio", "tensorboard"])
def test_row13_a_missing_tracker_package_is_refused_at_parse_time(capsys, monkeypatch, tmp_path, tracker):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, tracker, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == tracker else real(name, *a))
    assert_error(capsys, ["sft", "--report-to", tracker, "--output-dir", tmp_path / "run"], 2,
                 f"rlft sft: error: --report-to {tracker} needs the {tracker} package, which is not installed: "
                 f"pip install 'rlft[{tracker}]' (or --report-to none)")
    assert not (tmp_path / "run").exists()
