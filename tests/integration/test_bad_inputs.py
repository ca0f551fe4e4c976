"""The bad-input corpus (``tests/assets/bad/``) and the option / run-folder cases of issue #11 through
the command line: each gives exactly one line on stderr, ``rlft <command>: error: <message>``, with exit
code 2 (option, YAML value, run folder) or 1 (data), or is skipped and counted; ``--debug`` and
``RLFT_DEBUG=1`` show the traceback."""

from __future__ import annotations

import json

import pytest

from rlft.cli import main

from tests.conftest import ASSETS

BAD = ASSETS / "bad"


def run_cli(capsys, *args) -> tuple[int, str, list[str]]:
    """``rlft args...`` in-process: (exit code, the last stderr line, all stderr lines)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, (err[-1] if err else ""), err


def assert_error(capsys, args, code: int, message: str) -> list[str]:
    got_code, last, err = run_cli(capsys, *args)
    assert (got_code, last) == (code, message)
    assert not any("Traceback" in line for line in err)
    assert sum(line.startswith("rlft ") and ": error: " in line for line in err) == 1
    return err


OPTION_CASES = [
    (["sft", "--max-steps", "0"], "rlft sft: error: --max-steps must be >= 1 (or unset), got 0"),
    (["sft", "--max-steps", "-3"], "rlft sft: error: --max-steps must be >= 1 (or unset), got -3"),
    (["sft", "--limit", "-2"], "rlft sft: error: --limit must be >= 1 (or unset), got -2"),
    (["dpo", "--limit", "-2"], "rlft dpo: error: --limit must be >= 1 (or unset), got -2"),
    (["eval", "countdown", "--limit", "-2"], "rlft eval countdown: error: --limit must be >= 1 (or unset), got -2"),
    (["sft", "--batch-size", "0"], "rlft sft: error: --batch-size must be >= 1, got 0"),
    (["rm", "--micro-batch-size", "0"], "rlft rm: error: --micro-batch-size must be >= 1, got 0"),
    (["sft", "--lr", "-1"], "rlft sft: error: --lr must be > 0, got -1.0"),
    (["sft", "--lr", "nan"], "rlft sft: error: --lr must be a finite number, got nan"),
    (["sft", "--lr", "fast"], "rlft sft: error: Error parsing --lr: could not convert string to float: 'fast'"),
    (["sft", "--warmup-ratio", "1.5"], "rlft sft: error: --warmup-ratio must lie in [0, 1], got 1.5"),
    (["sft", "--batch-size", "6"], "rlft sft: error: --batch-size 6 must be a multiple of --micro-batch-size 8"),
    (["sft", "--keep-checkpoints", "0"], "rlft sft: error: --keep-checkpoints must be >= 1, got 0"),
    (["sft", "--resume",
      "--overwrite"], "rlft sft: error: --resume and --overwrite contradict each other: pass one of them"),
    (["rloo", "--top-p", "1.5"], "rlft rloo: error: --top-p must lie in (0, 1], got 1.5"),
    (["eval", "winrate", "--max-retries", "-1"], "rlft eval winrate: error: --max-retries must be >= 0, got -1"),
    (["eval", "winrate", "--timeout", "0"], "rlft eval winrate: error: --timeout must be > 0, got 0.0"),
    (["pairs", "countdown", "--num-samples",
      "1"], "rlft pairs countdown: error: num_samples must be >= 2 to form a pair, got 1"),
    (["dpo", "--loss-type", "kto"],
     "rlft dpo: error: invalid choice 'kto' for argument '--loss-type'. Expected one of ('dpo', 'ipo', 'rpo')."),
    (["sft", "--preset", "hard"],
     "rlft sft: error: --preset: expected one of 'cog_behav', 'easy3', 'medium3', 'standard', 'tiny', got 'hard'"),
    (["eval", "countdown", "--dtype", "float64"],
     "rlft eval countdown: error: --dtype: expected one of 'auto', 'float32', 'bfloat16', 'float16', got 'float64'"),
    (["sft", "--no-such-option", "1"], "rlft sft: error: Unrecognized options: --no-such-option, 1"),
    (["sft", "--lr"], "rlft sft: error: --lr: expected a value"),
    (["sft", "--batch-size",
      "1.5"], "rlft sft: error: Error parsing --batch-size: invalid literal for int() with base 10: '1.5'"),
]


@pytest.mark.parametrize("args, message", OPTION_CASES, ids=[" ".join(a) for a, _ in OPTION_CASES])
def test_bad_options_exit_2_with_one_line(capsys, args, message):
    assert_error(capsys, args, 2, message)


@pytest.mark.parametrize("columns", ["20", "4000"])
def test_tyro_errors_are_read_from_its_events_not_its_panel(capsys, monkeypatch, columns):
    """The message comes from tyro's parse-error event, so a narrow terminal (whose panel wraps every message)
    gives the same whole line."""
    monkeypatch.setenv("COLUMNS", columns)
    for args, message in OPTION_CASES[-5:]:
        assert_error(capsys, args, 2, message)


YAML_CASES = [
    ("lr_fast.yaml", "--lr: expected a number, got 'fast'"),
    ("max_steps_zero.yaml", "--max-steps must be >= 1 (or unset), got 0"),
    ("not_a_mapping.yaml", "expected a mapping of option names to values"),
    ("broken.yaml", "not valid YAML (line 2)"),
    ("no_such_file.yaml", "no such file"),
]


@pytest.mark.parametrize("name, message", YAML_CASES)
def test_bad_yaml_exits_2_with_one_line(capsys, name, message):
    assert_error(capsys, ["sft", "--config", BAD / name], 2, f"rlft sft: error: --config {BAD / name}: {message}")


def test_yaml_unknown_key(capsys):
    _, last, _ = run_cli(capsys, "sft", "--config", BAD / "unknown_key.yaml")
    assert last.startswith(
        f"rlft sft: error: --config {BAD / 'unknown_key.yaml'}: unknown option(s) learning_rate; known: batch_size, ")


def test_yaml_numbers_in_exponent_form_are_numbers(tmp_path):
    from rlft.cli import load_config_defaults
    from rlft.recipes.sft import SFTConfig

    (tmp_path / "c.yaml").write_text("lr: 1e-4\nmax_steps: '7'\nresume_override: [lr]\n")
    cfg = load_config_defaults(SFTConfig, str(tmp_path / "c.yaml"))
    assert (cfg.lr, cfg.max_steps, cfg.resume_override) == (1e-4, 7, ("lr",))


def data_args(model, data, out, *extra):
    return ["sft", "--model", model, "--data", data, "--output-dir", out, "--max-steps", "1", "--device", "cpu", *extra]


@pytest.mark.parametrize("name, message", [
    ("non_utf8.jsonl", "row 1: field '<line>': line 2: not valid UTF-8 (byte 0xe9 at column 16)"),
    ("missing_field.jsonl", "row 1: field 'completion': missing"),
    ("not_a_list.json", "row 0: field '<file>': a .json file must hold a list of objects (or JSON Lines)"),
])
def test_bad_data_exits_1_naming_file_row_and_field(capsys, tiny_model_dir, tmp_path, name, message):
    assert_error(capsys, data_args(tiny_model_dir, BAD / name, tmp_path / "run"), 1,
                 f"rlft sft: error: {BAD / name}: {message}")
    assert not (tmp_path / "run").exists()  # nothing written: the data was refused first


def test_a_directory_is_called_a_directory(capsys, tiny_model_dir, tmp_path):
    assert_error(capsys, data_args(tiny_model_dir, BAD, tmp_path / "run"), 1,
                 f"rlft sft: error: {BAD}: row 0: field '<file>': is a directory, not a data file")
    assert_error(capsys, data_args(tiny_model_dir, BAD / "missing.jsonl", tmp_path / "run"), 1,
                 f"rlft sft: error: data file {BAD / 'missing.jsonl'} is missing")


def test_unknown_parquet_layout_lists_its_columns(capsys, tiny_model_dir, tmp_path):
    path = BAD / "unknown_columns.parquet"
    args = [
        "dpo", "--model", tiny_model_dir, "--data", path, "--data-format", "chat", "--output-dir", tmp_path / "run",
        "--device", "cpu"
    ]
    assert_error(
        capsys, args, 1,
        f"rlft dpo: error: {path}: row 0: field '<columns>': none of the columns prompt, chosen, rejected, "
        "score_chosen, score_rejected, metadata, messages; the file has question, answer")


def test_bad_countdown_row(capsys, tiny_model_dir):
    path = BAD / "countdown_bad_nums.jsonl"
    assert_error(capsys, ["eval", "countdown", "--model", tiny_model_dir, "--data", path, "--device", "cpu"], 1,
                 f"rlft eval countdown: error: {path}: row 0: field 'nums': expected an integer, got 'x'")


def test_offline_hub_dataset_is_one_line(capsys, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    code, last, err = run_cli(capsys, *data_args(tiny_model_dir, "nobody/no-such-dataset", tmp_path / "run"))
    assert code == 1 and not any("Traceback" in line for line in err)
    assert last.startswith("rlft sft: error: could not load Hub dataset 'nobody/no-such-dataset' (split 'train'): ")
    assert last.endswith("pass a local .jsonl/.json/.parquet file instead.")


def test_skip_invalid_skips_and_counts_a_non_utf8_line(capsys, tiny_model_dir, tmp_path):
    code, _, err = run_cli(
        capsys,
        *data_args(tiny_model_dir, BAD / "non_utf8.jsonl", tmp_path / "run", "--skip-invalid", "--batch-size", "2",
                   "--micro-batch-size", "2"))
    assert code == 0, err
    stats = json.loads((tmp_path / "run" / "data_stats.json").read_text())
    assert (stats["rows"], stats["skipped_invalid"], stats["kept"]) == (3, 1, 2)


def test_a_folder_holding_a_run_is_refused(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("lr: 0.001\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert_error(capsys, ["sft", "--output-dir", run], 2,
                 f"rlft sft: error: output folder {run} already holds a run (config.yaml, metrics.jsonl); "
                 "pass --resume to continue it or --overwrite to replace it (or choose another --output-dir)")
    assert_error(capsys, ["sft", "--output-dir", run, "--resume", "--lr", "0.01"], 2,
                 f"rlft sft: error: --resume: options differ from the run in {run} (--lr 0.001 -> 0.01); "
                 "pass --resume-override lr to resume with the new values anyway")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(capsys, monkeypatch, how):
    args = ["sft", "--data", BAD / "missing_field.jsonl", "--model", "/nonexistent/model"]
    if how == "flag":
        args.append("--debug")
    else:
        monkeypatch.setenv("RLFT_DEBUG", "1")
    code, last, err = run_cli(capsys, *args)
    assert code == 1 and any("Traceback" in line for line in err)
    assert last.startswith("rlft sft: error: ")
