"""scripts/rm_pair_accuracy.py with a tiny random reward model: accuracy against a naive loop over the same scorer,
swapped pairs giving 1 - accuracy, ties and over-long prompts skipped and counted, and the error on a missing field."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlft.rewards.reward_model import RewardModelScorer
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
    naive = sum(scorer.score([r["prompt"]], [r["chosen"]])[0] > scorer.score([r["prompt"]], [r["rejected"]])[0] for r in ROWS)
    assert out["n"] == 12 and out["skipped_ties"] == 1 and out["skipped_prompt_too_long"] == 1
    assert out["accuracy"] == pytest.approx(naive / 12)
    assert out["ci95"][0] <= out["accuracy"] <= out["ci95"][1]
    swapped = write_jsonl_rows(tmp_path / "swapped.jsonl", [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in ROWS])
    back = run(monkeypatch, "--model", model_dir, "--pairs", swapped, "--max-length", 128, "--dtype", "float32",
               "--json", tmp_path / "b.json")
    assert back["accuracy"] == pytest.approx(1 - out["accuracy"])


def test_missing_field_names_the_row(tmp_path, monkeypatch, smol_tokenizer):
    model_dir = save_model_dir(tmp_path / "rm", make_tiny_rm(smol_tokenizer), smol_tokenizer)
    pairs = write_jsonl_rows(tmp_path / "pairs.jsonl", [ROWS[0], {"prompt": "p", "chosen": "c"}])
    with pytest.raises(ValueError, match=r"row 1: no field 'rejected'"):
        run(monkeypatch, "--model", model_dir, "--pairs", pairs, "--json", tmp_path / "c.json")
