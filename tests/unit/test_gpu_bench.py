"""scripts/gpu_bench.py --quick on the CPU: every decoder and every training mode runs rlft's code on a tiny
random model, rows decode to full length, the JSON holds what the table shows, and --time-budget skips."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_quick_bench

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.py"


def test_quick_run_covers_every_decoder_and_mode(tmp_path):
    report = run_quick_bench(SCRIPT, tmp_path, "--decode-rows", "4", "--sizes", "4x32")
    meta, results = report["meta"], report["results"]
    assert meta["shape"] == "tiny" and meta["compile_backend"] == "aot_eager" and meta["peak_tflops"] == 790
    decode = [r for r in results if r["kind"] == "decode"]
    assert sorted(r["decoder"] for r in decode) == ["hf generate (dynamic)", "rlft drop", "rlft static"]
    assert all(r["full_length"] and r["tokens"] == 4 * 8 and r["tokens_per_s"] > 0 for r in decode)
    train = [r for r in results if r["kind"] == "train"]
    assert sorted((r["task"], r["mode"]) for r in train) == sorted(
        (t, m) for t in ("sft", "dpo") for m in ("eager", "compile", "compile+packing"))
    for r in train:
        assert r["size"] == "4x32" and 4 * 16 <= r["tokens"] <= 4 * 32 and r["micro_batches"] >= 1
        assert r["mfu"] == pytest.approx(6 * meta["params"] * r["tokens"] / r["step_s"] / 790e12)
    assert "decode rlft static" in report["stdout"] and "dpo compile+packing" in report["stdout"]


def test_variants_run_each_training_step_with_todays_and_the_old_kernels(tmp_path):
    report = run_quick_bench(SCRIPT, tmp_path, "--decode-rows", "4", "--decoders", "drop", "--sizes", "4x32",
                             "--tasks", "sft", "--modes", "eager", "--variants", "new,old")
    assert [r["mode"] for r in report["results"] if r["kind"] == "train"] == ["eager", "eager (old)"]
    assert "sft eager (old)" in report["stdout"]


def test_time_budget_skips_what_is_left(tmp_path):
    report = run_quick_bench(SCRIPT, tmp_path, "--time-budget", "0", "--decode-rows", "4", "--sizes", "4x32",
                             "--tasks", "sft", "--modes", "eager")
    assert [r["kind"] for r in report["results"]] == ["skipped"] * 4


def test_output_and_modes_are_checked_before_the_model_is_built(tmp_path, capsys):
    """An existing --output (minutes of GPU time would be lost at the end) and an unknown --modes entry (found after
    the decoding runs, before) are one-line errors with exit code 2, before anything is built."""
    from tests.conftest import load_script

    bench = load_script("gpu_bench")
    (tmp_path / "old.json").write_text("{}")
    for argv, message in ((["--quick", "--output",
                            str(tmp_path / "old.json")], "old.json already exists; pass --overwrite"),
                          (["--quick", "--modes", "eager,warp"], "--modes: unknown mode(s) warp")):
        with pytest.raises(SystemExit) as exit_info:
            bench.run_script(bench.main, argv, prog="gpu_bench.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert (tmp_path / "old.json").read_text() == "{}"
