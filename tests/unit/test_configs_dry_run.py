"""configs/: every GPU recipe names its command on its first line and passes `--dry-run` offline;
--dry-run parses, validates and prints the plan without loading or writing anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlft.cli import main

CONFIGS = sorted(
    p for p in (Path(__file__).resolve().parents[2] / "configs").rglob("*.yaml")
    if "ablation" not in p.parts)  # configs/countdown/ablation: a study's variants (tests/unit/test_ablation_budget.py)


def test_there_are_recipes_for_both_tracks():
    names = {p.parent.name for p in CONFIGS}
    assert {"countdown", "ultrafeedback"} <= names and len(CONFIGS) >= 9


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_names_its_command_and_passes_dry_run(path, capsys, tmp_path, monkeypatch):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# rlft "), first
    command = first.removeprefix("# rlft ").split()
    monkeypatch.chdir(tmp_path)  # nothing may be written: the folder must stay empty
    main([*command, "--config", str(path), "--dry-run"])
    out = capsys.readouterr().out
    assert out.startswith(f"rlft {' '.join(command)}: dry run"), out[:200]
    assert "options:" in out
    assert list(tmp_path.iterdir()) == []


def test_dry_run_still_validates(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["rl", "--lr", "-1", "--dry-run"])
    assert exit_info.value.code == 2
    assert "rlft rl: error: --lr must be > 0" in capsys.readouterr().err


def test_dry_run_describes_models_and_data(capsys, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("{}\n")
    main([
        "dpo", "--model", "smollm2-135m", "--data",
        str(data), "--output-dir",
        str(tmp_path / "out"), "--lora-r", "4", "--dry-run"
    ])
    out = capsys.readouterr().out
    assert "model: built-in smollm2-135m" in out
    assert f"data: local file {data}" in out
    assert "LoRA: r=4" in out
    assert not (tmp_path / "out").exists()


def test_dry_run_names_the_distributed_strategy_and_refuses_what_fsdp2_cannot_shard(capsys, tmp_path):
    main(["sft", "--distributed", "fsdp2", "--output-dir", str(tmp_path / "out"), "--dry-run"])
    assert ("under torchrun: --distributed fsdp2 (FSDP2: parameters, gradients and optimizer state sharded"
            in capsys.readouterr().out)
    main(["rl", "--output-dir", str(tmp_path / "out"), "--dry-run"])  # the default, auto: FSDP2 on many ranks
    assert "under torchrun: --distributed auto = fsdp2 (FSDP2: parameters" in capsys.readouterr().out
    main(["sft", "--lora-r", "4", "--output-dir", str(tmp_path / "out"), "--dry-run"])  # auto with LoRA: DDP
    assert "under torchrun: --distributed auto = ddp (a full replica per rank" in capsys.readouterr().out
    for argv, why in ((["sft", "--distributed", "fsdp2", "--lora-r", "4"], "--distributed fsdp2 does not take LoRA"),
                      (["rl", "--distributed", "fsdp2", "--lora-r", "4"], "--distributed fsdp2 does not take LoRA")):
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--output-dir", str(tmp_path / "out"), "--dry-run"])
        assert exit_info.value.code == 2
        assert why in capsys.readouterr().err
