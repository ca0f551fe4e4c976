"""scripts/rm_pair_accuracy.py with a tiny random reward model: accuracy against a naive loop over the same scorer,
swapped pairs giving 1 - accuracy, ties and over-long prompts skipped and counted, the error on a missing field; the
--json output that never replaces the pairs or an existing file, a causal LM refused as --model, one-line errors."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from rlft.rewards.reward_model import RewardModelScorer
from rlft.run_folder import OutputPathError
from rlft.validation import UsageError
from tests.conftest import load_script, make_tiny_rm, save_model_dir, write_jsonl_rows

pytestmark = pytest.mark.usefixtures("one_thread")


def script():
    return load_script("rm_pair_accuracy")


def run(monkeypatch, *args) -> dict:
    monkeypatch.setattr(sys, "argv", ["rm_pair_accuracy.py", *map(str, args)])
    script().main()
    return json.loads(Path(args[args.index("--json") + 1]).read_text())


ROWS = [{"prompt": f"question {i}", "chosen": f"answer {i} " * (i + 1), "rejected": f"no {i}",
         "metadata": {"score_chosen": 8.0, "score_rejected": 3.0}} for i in range(12)]
TIE = {"prompt": "tie", "chosen": "x", "rejected": "y", "metadata": {"score_chosen": 5.0, "score_rejected": 5.0}}
LONG = {"prompt": "word " * 400, "chosen": "x", "rejected": "y"}


def test_accuracy_matches_a_naive_loop_and_swaps(tmp_path, monkeypatch, smol_tokenizer):
    model_dir = save_model_dir(tmp_path / "rm", make_tiny_rm(smol_tokenizer, seed=3), smol_tokenizer)
    pairs = write_jsonl_rows(tmp_path / "pairs.jsonl", [*ROWS, TIE, LONG])
    out = run(monkeypatch, "--model", model_dir, "--pairs", pairs, "--max-length", 128, "--dtype", "float32",
              "--json", tmp_path / "a.json")
    scorer = RewardModelScorer(str(model_dir), dtype="float32", max_length=128)
    naive = sum(
        scorer.score([r["prompt"]], [r["chosen"]])[0] > scorer.score([r["prompt"]], [r["rejected"]])[0] for r in ROWS)
    assert out["n"] == 12 and out["skipped_ties"] == 1 and out["skipped_prompt_too_long"] == 1
    assert out["accuracy"] == pytest.approx(naive / 12)
    assert out["ci95"][0] <= out["accuracy"] <= out["ci95"][1]
    swapped = write_jsonl_rows(tmp_path / "swapped.jsonl",
                               [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in ROWS])
    back = run(monkeypatch, "--model", model_dir, "--pairs", swapped, "--max-length", 128, "--dtype", "float32",
               "--json", tmp_path / "b.json")
    assert back["accuracy"] == pytest.approx(1 - out["accuracy"])


def test_invalid_row_names_the_row_or_is_skipped_and_counted(tmp_path, monkeypatch, smol_tokenizer):
    """A row with no ``rejected`` (and one with an empty reply) stops the run naming file, row and field; with
    --skip-invalid they are skipped, counted, and the rest scored as if they were not there."""
    model_dir = save_model_dir(tmp_path / "rm", make_tiny_rm(smol_tokenizer), smol_tokenizer)
    bad = [{"prompt": "p", "chosen": "c"}, {"prompt": "q", "chosen": "", "rejected": "r"}]
    pairs = write_jsonl_rows(tmp_path / "pairs.jsonl", [ROWS[0], *bad, *ROWS[1:4]])
    with pytest.raises(ValueError, match=r"pairs.jsonl: row 1: field 'rejected'"):
        run(monkeypatch, "--model", model_dir, "--pairs", pairs, "--json", tmp_path / "c.json")
    out = run(monkeypatch, "--model", model_dir, "--pairs", pairs, "--skip-invalid", "--max-length", 128, "--dtype",
              "float32", "--json", tmp_path / "d.json")
    clean = run(monkeypatch, "--model", model_dir, "--pairs", write_jsonl_rows(tmp_path / "clean.jsonl", ROWS[:4]),
                "--max-length", 128, "--dtype", "float32", "--json", tmp_path / "e.json")
    assert out["skipped_invalid"] == 2 and out["n"] == clean["n"] == 4 and out["accuracy"] == clean["accuracy"]


def test_interval_is_wilsons(tmp_path, monkeypatch, smol_tokenizer):
    """The interval is Wilson's: inside [0, 1] and not a point when every pair is won (the normal one collapses)."""
    model_dir = save_model_dir(tmp_path / "rm", make_tiny_rm(smol_tokenizer, seed=3), smol_tokenizer)
    out = run(monkeypatch, "--model", model_dir, "--pairs", write_jsonl_rows(tmp_path / "p.jsonl", ROWS),
              "--max-length", 128, "--dtype", "float32", "--json", tmp_path / "f.json")
    n, p, z = out["n"], out["accuracy"], 1.959963984540054
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    assert out["interval"] == "wilson" and out["ci95"] == pytest.approx([center - half, center + half])


def test_an_exact_score_tie_counts_zero_as_in_rlft_rm(tmp_path, monkeypatch, smol_tokenizer):
    """Identical answers score identically: the pair counts 0 (strict chosen > rejected) and is counted in
    score_ties."""
    model_dir = save_model_dir(tmp_path / "rm", make_tiny_rm(smol_tokenizer, seed=3), smol_tokenizer)
    same = {"prompt": "same", "chosen": "an answer", "rejected": "an answer"}
    out = run(monkeypatch, "--model", model_dir, "--pairs", write_jsonl_rows(tmp_path / "p.jsonl", [same] * 3),
              "--max-length", 128, "--dtype", "float32", "--json", tmp_path / "a.json")
    assert out["n"] == 3 and out["score_ties"] == 3 and out["accuracy"] == 0.0


def test_json_never_replaces_the_pairs_or_an_existing_file(tmp_path, monkeypatch, smol_tokenizer):
    """--json naming the --pairs file is refused even with --overwrite (the preference data stays); an existing --json
    needs --overwrite; both before the model loads."""
    model_dir = save_model_dir(tmp_path / "rm", make_tiny_rm(smol_tokenizer, seed=3), smol_tokenizer)
    pairs = write_jsonl_rows(tmp_path / "pairs.jsonl", ROWS[:3])
    data = pairs.read_bytes()
    for extra in ([], ["--overwrite"]):
        with pytest.raises(OutputPathError, match="--json .*pairs.jsonl is the input"):
            script().main(["--model", str(tmp_path / "no-model"), "--pairs", str(pairs), "--json", str(pairs), *extra])
    assert pairs.read_bytes() == data
    old = tmp_path / "old.json"
    old.write_text("an earlier result")
    with pytest.raises(OutputPathError, match="old.json already exists; pass --overwrite"):
        script().main(["--model", str(tmp_path / "no-model"), "--pairs", str(pairs), "--json", str(old)])
    assert old.read_text() == "an earlier result"
    out = script().main(["--model", str(model_dir), "--pairs", str(pairs), "--max-length", "128", "--dtype", "float32",
                         "--json", str(old), "--overwrite"])
    assert json.loads(old.read_text()) == out and out["n"] == 3


def test_a_causal_lm_is_not_taken_for_a_reward_model(tmp_path, tiny_model_dir, monkeypatch):
    """A plain causal LM would get a new, random score head: refused, naming --model, before any pair is read."""
    pairs = write_jsonl_rows(tmp_path / "pairs.jsonl", ROWS[:3])
    with pytest.raises(UsageError, match=f"--model {tiny_model_dir} is not a reward model"):
        script().main(["--model", str(tiny_model_dir), "--pairs", str(pairs)])
    with pytest.raises(UsageError, match="--model .*nowhere: no such folder"):
        script().main(["--model", str(tmp_path / "nowhere"), "--pairs", str(pairs)])


def test_every_error_is_one_line_with_exit_code_2(tmp_path, capsys, smol_tokenizer, caplog):
    """As a program: a missing --pairs, a bad row, nothing left to score, a bad --max-length, --dtype or --model.
    (Progress logging is turned down: an earlier test may have left rlft's logger at INFO, whose lines are not errors;
    caplog.set_level clears the logger's level cache and restores it afterwards.)"""
    import logging

    caplog.set_level(logging.WARNING, logger="rlft")
    s = script()
    model_dir = save_model_dir(tmp_path / "rm", make_tiny_rm(smol_tokenizer), smol_tokenizer)
    pairs = write_jsonl_rows(tmp_path / "pairs.jsonl", ROWS[:2])
    bad = write_jsonl_rows(tmp_path / "bad.jsonl", [{"prompt": "p", "chosen": "c"}])
    ties = write_jsonl_rows(tmp_path / "ties.jsonl", [TIE])
    model = ["--model", str(model_dir)]
    capsys.readouterr()  # the save's progress bar
    cases = [([*model, "--pairs", str(tmp_path / "none.jsonl")], "--pairs .*none.jsonl: no such file"),
             ([*model, "--pairs", str(bad)], "bad.jsonl: row 0: field 'rejected'"),
             ([*model, "--pairs", str(ties), "--max-length",
               "64"], "ties.jsonl: no pair to score \\(1 ties, 0 invalid rows\\)"),
             ([*model, "--pairs", str(pairs), "--max-length", "0"], "--max-length must be >= 1, got 0"),
             ([*model, "--pairs", str(pairs), "--dtype", "float8"], "argument --dtype: invalid choice"),
             (["--model", str(tmp_path), "--pairs", str(pairs)], "not a loadable model folder"),
             (["--pairs", str(pairs)], "the following arguments are required: --model")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            s.run_script(s.main, argv, prog="rm_pair_accuracy.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith(
            "rm_pair_accuracy.py: error: "), err
        assert re.search(message, err), (message, err)
