"""Run folders and resume, through the SFT recipe on a tiny model: a damaged newest checkpoint resumes
from the previous one (same final weights as an uninterrupted run), a finished run is never overwritten
without --overwrite, metrics survive every resume, --resume refuses changed options unless overridden,
a run that fails on bad data writes nothing, partial saves are cleaned up."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from rlft.checkpoint import checkpoint_folders, checkpoint_problem, read_metrics
from rlft.data.files import DataError
from rlft.recipes.sft import train_sft
from rlft.run_folder import RunFolderError, claim_run_dir, write_run_config
from rlft.validation import OptionError

from tests.conftest import interrupt_after_checkpoints, load_weights, write_jsonl_rows
from tests.unit.test_sft_recipe import make_cfg

torch.set_num_threads(1)


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    """An uninterrupted 8-step run with checkpoints at steps 2, 4, 6 and 8 (kept: 3)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    cfg = make_cfg(tiny_model_dir, out, keep_checkpoints=3)
    train_sft(cfg)
    return {
        "cfg": cfg, "dir": out, "weights": load_weights(out / "model"), "metrics": read_metrics(out / "metrics.jsonl")
    }


def interrupted_run(finished, tmp_path, monkeypatch) -> Path:
    """The finished run's config in a new folder, killed right after its 3rd checkpoint (step 6)."""
    cfg = replace(finished["cfg"], output_dir=str(tmp_path / "run"))
    with monkeypatch.context() as mp:
        interrupt_after_checkpoints(mp, 3)
        with pytest.raises(KeyboardInterrupt):
            train_sft(cfg)
    assert [c.name for c in checkpoint_folders(cfg.output_dir)] == ["step-00000006", "step-00000004", "step-00000002"]
    return Path(cfg.output_dir)


def _delete_state(folder: Path) -> str:
    (folder / "trainer_state.pt").unlink()
    return "trainer_state.pt is missing"


def _truncate_weights(folder: Path) -> str:
    path = folder / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    return f"model.safetensors has {size // 2} bytes, expected {size} (cut short?)"


def _corrupt_state(folder: Path) -> str:
    path = folder / "trainer_state.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return "trainer_state.pt does not match its SHA-256 in manifest.json (damaged)"


@pytest.mark.parametrize("damage", [_delete_state, _truncate_weights, _corrupt_state])
def test_damaged_newest_checkpoint_resumes_from_the_previous_one(finished, tmp_path, monkeypatch, rlft_log, damage):
    run = interrupted_run(finished, tmp_path, monkeypatch)
    problem = damage(run / "checkpoints" / "step-00000006")
    assert checkpoint_problem(run / "checkpoints" / "step-00000006") == problem

    train_sft(replace(finished["cfg"], output_dir=str(run), resume=True))

    assert (f"--resume: skipped damaged checkpoint(s) step-00000006: {problem}; resuming from step-00000004 instead"
            in rlft_log.text)
    weights = load_weights(run / "model")
    for name, tensor in finished["weights"].items():
        assert torch.allclose(weights[name], tensor, atol=1e-6, rtol=0), name
    metrics = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in metrics] == list(range(1, 9))  # steps 5-6 were dropped and redone, not duplicated
    for a, b in zip(metrics, finished["metrics"]):
        assert a["loss/sft"] == pytest.approx(b["loss/sft"], abs=1e-6)


def test_no_usable_checkpoint_and_metrics_refuses_to_restart(finished, tmp_path, monkeypatch):
    run = interrupted_run(finished, tmp_path, monkeypatch)
    for folder in checkpoint_folders(run):
        (folder / "trainer_state.pt").unlink()
    metrics_before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(RunFolderError) as info:
        train_sft(replace(finished["cfg"], output_dir=str(run), resume=True))
    assert str(info.value) == (
        f"--resume: no usable checkpoint in {run / 'checkpoints'} (step-00000006: trainer_state.pt is missing; "
        "step-00000004: trainer_state.pt is missing; step-00000002: trainer_state.pt is missing), "
        "but metrics.jsonl holds 6 records of a run; refusing to restart it. Pass --overwrite to start over")
    assert (run / "metrics.jsonl").read_bytes() == metrics_before  # never wiped


def test_finished_run_is_never_overwritten_without_overwrite(finished, tmp_path, rlft_log):
    run = tmp_path / "run"
    cfg = replace(finished["cfg"], output_dir=str(run), max_steps=2, save_every=0)
    train_sft(cfg)
    before = tree(run)
    assert {"config.yaml", "metrics.jsonl", "model/model.safetensors"} <= set(before)

    with pytest.raises(RunFolderError) as info:
        train_sft(replace(cfg, lr=1e-2))
    assert str(
        info.value) == (f"output folder {run} already holds a run (config.yaml, metrics.jsonl, model/); "
                        "pass --resume to continue it or --overwrite to replace it (or choose another --output-dir)")
    assert tree(run) == before  # not a byte changed

    train_sft(replace(cfg, lr=1e-2, overwrite=True))
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(aside) == 1 and tree(aside[0]) == before  # the old run, moved aside intact
    assert f"--overwrite: moved the previous contents of {run} to {aside[0]}" in rlft_log.text
    assert yaml.safe_load((run / "config.yaml").read_text())["lr"] == 1e-2


def test_resume_refuses_changed_options_unless_overridden(finished, tmp_path, rlft_log):
    run = tmp_path / "run"
    cfg = replace(finished["cfg"], output_dir=str(run), max_steps=4, save_every=2)
    train_sft(cfg)
    before = tree(run)
    with pytest.raises(RunFolderError) as info:
        train_sft(replace(cfg, resume=True, lr=1e-2, batch_size=4))
    # listed in the config's field order (OptimizerOptions' --lr comes before SFTConfig's own --batch-size)
    assert str(
        info.value) == (f"--resume: options differ from the run in {run} (--lr 0.003 -> 0.01; --batch-size 8 -> 4); "
                        "pass --resume-override lr batch-size to resume with the new values anyway")
    assert tree(run) == before
    with pytest.raises(RunFolderError, match=r"\(--max-steps 4 -> 3\)"):  # shorter: a difference
        train_sft(replace(cfg, resume=True, max_steps=3))

    # a longer --max-steps needs no override; metrics continue from the resumed checkpoint (step 2)
    train_sft(replace(cfg, resume=True, max_steps=6))
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 7))
    assert yaml.safe_load((run / "config.yaml").read_text())["max_steps"] == 6
    # an override named: accepted, and said in the log
    train_sft(replace(cfg, resume=True, max_steps=6, lr=1e-2, resume_override=("lr",)))
    assert "--resume: resuming with changed options: lr 0.003 -> 0.01" in rlft_log.text
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 7))


def test_bad_data_writes_nothing(finished, tmp_path):
    bad = write_jsonl_rows(tmp_path / "bad.jsonl", [{"prompt": "p", "completion": "c"}, {"prompt": "p"}])
    new = tmp_path / "new"
    with pytest.raises(DataError):
        train_sft(replace(finished["cfg"], data=str(bad), output_dir=str(new)))
    assert not new.exists()
    # into a finished run with --overwrite: the old run stays where it is, untouched
    run = tmp_path / "run"
    train_sft(replace(finished["cfg"], output_dir=str(run), max_steps=1, save_every=0))
    before = tree(run)
    with pytest.raises(DataError):
        train_sft(replace(finished["cfg"], data=str(bad), output_dir=str(run), overwrite=True))
    assert tree(run) == before and not list(tmp_path.glob("run.replaced-*"))


def test_partial_saves_are_removed_and_torn_metrics_lines_dropped(finished, tmp_path, monkeypatch, rlft_log):
    run = interrupted_run(finished, tmp_path, monkeypatch)
    (run / "checkpoints" / ".step-00000008.k2j3").mkdir()
    (run / "checkpoints" / ".step-00000008.k2j3" / "model.safetensors").write_bytes(b"half")
    (run / ".model.x9").mkdir()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "loss/s')  # killed mid-write
    train_sft(replace(finished["cfg"], output_dir=str(run), resume=True))
    assert not (run / "checkpoints" / ".step-00000008.k2j3").exists() and not (run / ".model.x9").exists()
    assert ("removed 2 partial save(s) left by an interrupted run: .model.x9, checkpoints/.step-00000008.k2j3"
            in rlft_log.text)
    assert "metrics.jsonl: dropped 1 unreadable line(s)" in rlft_log.text
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 9))


def test_keep_checkpoints_and_manifest(finished):
    folders = checkpoint_folders(finished["dir"])
    assert [f.name for f in folders] == ["step-00000008", "step-00000006", "step-00000004"]
    manifest = json.loads((folders[0] / "manifest.json").read_text())["files"]
    assert {"model.safetensors", "trainer_state.pt", "config.json"} <= set(manifest)
    assert all(checkpoint_problem(f) is None for f in folders)


def test_claim_checks(tmp_path, tiny_model_dir):
    cfg = make_cfg(tiny_model_dir, tmp_path / "x")
    (tmp_path / "x").write_text("a file")
    with pytest.raises(RunFolderError, match="is a file, not a folder"):
        claim_run_dir(cfg)
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError) as info:
        claim_run_dir(replace(cfg, output_dir=str(tmp_path / "y")))
    assert str(info.value) == (f"output folder {tmp_path / 'y'} is not empty and holds no rlft run (notes.txt); "
                               "choose another --output-dir, or pass --overwrite to move its contents aside")
    with pytest.raises(OptionError, match="--resume-override: unknown option"):
        claim_run_dir(replace(cfg, output_dir=str(tmp_path / "z"), resume=True, resume_override=("learning_rate",)))
    with pytest.raises(OptionError, match="--resume and --overwrite contradict"):
        replace(cfg, resume=True, overwrite=True)


def test_demo_folder_holding_an_earlier_demo_is_refused(tmp_path):
    from rlft.lab.demo import DemoConfig
    from rlft.lab.demo import run_demo

    folder = tmp_path / "runs" / "countdown"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("name: countdown\n")
    with pytest.raises(RunFolderError) as info:
        run_demo(DemoConfig(output_dir=str(folder)))
    assert str(info.value).startswith(f"output folder {folder} already holds a run (config.yaml); pass --resume")
    assert (folder / "config.yaml").read_text() == "name: countdown\n"


def test_checkpoint_without_manifest_that_does_not_load_falls_back(finished, tmp_path, monkeypatch, rlft_log):
    """An older checkpoint (no manifest.json) whose trainer_state.pt is cut short: caught when loading."""
    run = interrupted_run(finished, tmp_path, monkeypatch)
    newest = run / "checkpoints" / "step-00000006"
    (newest / "manifest.json").unlink()
    state = newest / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    assert checkpoint_problem(newest) is None  # nothing to check it against: only loading tells
    train_sft(replace(finished["cfg"], output_dir=str(run), resume=True))
    assert "--resume: skipped damaged checkpoint(s) step-00000006: does not load (" in rlft_log.text
    assert "resuming from step-00000004 instead" in rlft_log.text
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 9))


def test_resume_does_not_compare_the_distributed_strategy():
    # The result does not depend on it, and a run saved under the old default (ddp) resumes under the new one (auto).
    from rlft.recipes.sft import SFTConfig
    from rlft.run_folder import config_differences

    assert config_differences({"distributed": "ddp", "lr": 0.003}, SFTConfig(lr=0.003)) == {}
    assert config_differences({"distributed": "ddp", "lr": 0.003}, SFTConfig(lr=0.01)) == {"lr": (0.003, 0.01)}


def test_demo_resume_with_changed_options_gives_advice_that_works(tmp_path):
    """`rlft demo` has no --resume-override: the refusal names the saved values as flags, and rerunning with them
    (appended to the same command line) resumes."""
    from rlft.cli import parse_config
    from rlft.lab.demo import DemoConfig

    folder = tmp_path / "demo"
    folder.mkdir()
    write_run_config(folder, DemoConfig(output_dir=str(folder), seed=0, rl_filter_groups=True))
    argv = ["--output-dir", str(folder), "--resume", "--model", "other-model", "--seed", "3", "--no-rl-filter-groups"]
    with pytest.raises(RunFolderError) as info:
        claim_run_dir(parse_config(DemoConfig, argv, "demo", ""))
    message = str(info.value)
    assert message == (
        f"--resume: options differ from the run in {folder} (--rl-filter-groups True -> False; --model "
        "'smollm2-135m' -> 'other-model'; --seed 0 -> 3); rerun with the saved values (--rl-filter-groups "
        "--model smollm2-135m --seed 0), or pass --overwrite to start over (the folder is moved aside), or "
        "choose another --output-dir")
    assert "--resume-override" not in message
    saved = message.split("rerun with the saved values (")[1].split(")")[0].split()
    claim_run_dir(parse_config(DemoConfig, argv + saved, "demo", ""))  # the advice, followed: accepted


def test_a_moved_run_folder_resumes_and_its_inner_paths_follow(tmp_path, monkeypatch):
    """The demo's folder moved (and renamed): its own path is not an option, and a stage's paths into the old folder
    (RL's --model is the SFT stage's model, --data the generated rows) name the same places in the new one. A path
    elsewhere that changed is still a difference; so is one inside the folder that names another place."""
    from rlft.lab.demo import DemoConfig
    from rlft.rl.config import RLConfig
    from rlft.run_folder import config_differences, moved_root

    old, new = tmp_path / "runs" / "demo", tmp_path / "archive" / "demo-1"
    old.mkdir(parents=True)
    write_run_config(old, DemoConfig(output_dir=str(old)))
    (old / "rl").mkdir()

    def rl(root, **kw):
        return RLConfig(model=str(root / "sft" / "model"), data=str(root / "data" / "rows.jsonl"),
                        output_dir=str(root / "rl"), **kw)

    write_run_config(old / "rl", rl(old))
    (old / "rl" / "metrics.jsonl").write_text('{"step": 1}\n')
    new.parent.mkdir()
    old.rename(new)
    claim_run_dir(DemoConfig(output_dir=str(new), resume=True))
    claim_run_dir(rl(new, resume=True))
    assert moved_root(str(old / "rl"), str(new / "rl")) == (old, new)
    with pytest.raises(RunFolderError, match=r"\(--model '.*runs/demo/sft/model' -> '/elsewhere/model'\)"):
        claim_run_dir(replace(rl(new, resume=True), model="/elsewhere/model"))
    with pytest.raises(RunFolderError,
                       match=r"--data '.*runs/demo/data/rows.jsonl' -> '.*archive/demo-1/data/other.jsonl'"):
        claim_run_dir(replace(rl(new, resume=True), data=str(new / "data" / "other.jsonl")))
    # relative paths, as `--output-dir runs/demo` records them, relative to where the command runs
    monkeypatch.chdir(tmp_path)
    saved = {"output_dir": "runs/demo/rl", "model": "runs/demo/sft/model", "lr": 1e-6}
    moved = RLConfig(output_dir="archive/demo-1/rl", model="archive/demo-1/sft/model", lr=1e-6)
    assert config_differences(saved, moved) == {}
    assert config_differences(saved, replace(moved, model="archive/demo-2/sft/model")) == {
        "model": ("runs/demo/sft/model", "archive/demo-2/sft/model")}
    assert moved_root("/demo/rl", "/home/u/demo/rl") is None  # from the file system's root: too wide to map
    assert moved_root("/a/demo/rl", "/a/demo/rl") is None and moved_root(None, "/a") is None
