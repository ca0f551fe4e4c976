"""Win-rate: the label and interval arithmetic on hand cases, prompt/response loading, and
run_winrate end to end (precomputed responses + a tiny local reward-model judge; generation with a
tiny policy).

Wilson score interval, z = 1.959964 (z^2 = 3.841459), for p = mean label over n prompts:

    center = (p + z^2/(2n)) / (1 + z^2/n),  half = z/(1 + z^2/n) * sqrt(p(1-p)/n + z^2/(4n^2))

- all wins, n = 10 (p = 1): half = (z^2/(2n)) / (1 + z^2/n), so low = 1/(1 + z^2/n) = n/(n + z^2)
  = 10/13.841459 = 0.7224672, high = 1.
- all losses, n = 10: by symmetry low = 0, high = z^2/(n + z^2) = 3.841459/13.841459 = 0.2775328.
- all ties, n = 4 (p = 0.5, ties count half): center 0.5; half = 1.959964/1.960365 * sqrt(1/16 + 3.841459/64)
  = 0.999796 * 0.350033 = 0.349961 -> [0.150039, 0.849961].
- 60 wins, 40 losses (p = 0.6, n = 100): z^2/n = 0.0384146; center = 0.6192073/1.0384146 = 0.596301;
  half = 1.887459 * sqrt(0.0024 + 0.0000960) = 1.887459 * 0.0499604 = 0.094298 -> [0.502003, 0.690599].
- labels [1, 1, 1, 0, 0.5]: 3 wins, 1 tie, 1 loss, p = 3.5/5 = 0.7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import rlft.eval.winrate as winrate_module
from rlft.data.files import DataError
from rlft.eval.winrate import (
    WinrateConfig,
    load_prompts,
    load_responses,
    prompt_key,
    run_winrate,
    winrate_label,
    winrate_summary,
)
from rlft.rewards.reward_model import RewardModelScorer

from tests.conftest import make_tiny_model, make_tiny_rm, save_model_dir, write_jsonl_rows

torch.set_num_threads(1)


# --------------------------------------------------------------------------- arithmetic


def test_labels():
    assert winrate_label(2.0, 1.0) == 1.0
    assert winrate_label(1.0, 1.0) == 0.5
    assert winrate_label(-3.0, 1.0) == 0.0


def test_all_wins():
    s = winrate_summary([1.0] * 10)
    assert (s["win_rate"], s["n"], s["wins"], s["ties"], s["losses"]) == (1.0, 10, 10, 0, 0)
    assert s["ci_low"] == pytest.approx(0.7224672, abs=1e-6)
    assert s["ci_high"] == 1.0


def test_all_losses():
    s = winrate_summary([0] * 10)
    assert (s["win_rate"], s["wins"], s["losses"]) == (0.0, 0, 10)
    assert s["ci_low"] == 0.0
    assert s["ci_high"] == pytest.approx(0.2775328, abs=1e-6)


def test_all_ties_is_one_half():
    s = winrate_summary([0.5] * 4)
    assert (s["win_rate"], s["ties"], s["wins"], s["losses"]) == (0.5, 4, 0, 0)
    assert s["ci_low"] == pytest.approx(0.150039, abs=1e-6)
    assert s["ci_high"] == pytest.approx(0.849961, abs=1e-6)


def test_mixed_without_ties():
    s = winrate_summary([1] * 60 + [0] * 40)
    assert s["win_rate"] == pytest.approx(0.6)
    assert s["ci_low"] == pytest.approx(0.502003, abs=1e-6)
    assert s["ci_high"] == pytest.approx(0.690599, abs=1e-6)


def test_mixed_with_ties_counts_half():
    s = winrate_summary([1, 1, 1, 0, 0.5])
    assert (s["n"], s["wins"], s["ties"], s["losses"]) == (5, 3, 1, 1)
    assert s["win_rate"] == pytest.approx(0.7)
    assert 0.0 < s["ci_low"] < 0.7 < s["ci_high"] < 1.0
    # order does not matter; a tie sits exactly between a win and a loss
    assert winrate_summary([0.5, 0, 1, 1, 1]) == s
    assert winrate_summary([1, 0.5])["win_rate"] == pytest.approx(0.75)


def test_interval_narrows_with_n():
    widths = [winrate_summary([1, 0] * k)["ci_high"] - winrate_summary([1, 0] * k)["ci_low"] for k in (5, 50, 500)]
    assert widths[0] > widths[1] > widths[2]


def test_invalid_labels():
    with pytest.raises(ValueError, match="no labels"):
        winrate_summary([])
    with pytest.raises(ValueError, match="0, 0.5 or 1"):
        winrate_summary([1, 0.3])


# --------------------------------------------------------------------------- prompts and responses


PROMPTS = [
    "Name a fruit.",
    "What colour is the sky?",
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
    "Count to three.",
    "Is water wet?",
]


def as_msgs(p):
    return [{"role": "user", "content": p}] if isinstance(p, str) else p


def test_load_prompts_from_plain_and_preference_files(tmp_path):
    plain = write_jsonl_rows(tmp_path / "prompts.jsonl", [{"prompt": p} for p in PROMPTS] + [{"prompt": PROMPTS[0]}])
    assert load_prompts(str(plain)) == [as_msgs(p) for p in PROMPTS]  # duplicate removed, order kept
    assert load_prompts(str(plain), limit=2) == [as_msgs(p) for p in PROMPTS[:2]]
    prefs = write_jsonl_rows(tmp_path / "prefs.jsonl", [
        {
            "prompt": "Q1", "chosen": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "x"}],
            "rejected": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "y"}
                         ], "score_chosen": 1.0, "score_rejected": 1.0
        },
        {
            "prompt": "Q2", "chosen": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "x"}],
            "rejected": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "y"}]
        },
        {
            "prompt": "Q1", "chosen": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "z"}],
            "rejected": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "w"}]
        },
    ])
    # UltraFeedback layout: a score tie is kept (only prompts matter), a repeated prompt counted once
    assert load_prompts(str(prefs)) == [as_msgs("Q1"), as_msgs("Q2")]
    bad = write_jsonl_rows(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"text": "no prompt"}])
    with pytest.raises(DataError, match="row 1"):
        load_prompts(str(bad))


def test_load_responses_keys_by_prompt(tmp_path):
    path = write_jsonl_rows(tmp_path / "r.jsonl",
                            [{"prompt": "A", "response": "1"}, {"prompt": as_msgs("A"), "response": "2"},
                             {"prompt": as_msgs(PROMPTS[2]), "response": "3"}])
    table = load_responses(str(path))
    assert list(table) == [prompt_key(as_msgs("A")), prompt_key(as_msgs(PROMPTS[2]))]
    assert table[prompt_key(as_msgs("A"))][1] == "1"  # a string prompt is one user message; first wins
    bad = write_jsonl_rows(tmp_path / "bad.jsonl", [{"prompt": "A"}])
    with pytest.raises(DataError, match="response"):
        load_responses(str(bad))


# --------------------------------------------------------------------------- run_winrate


@pytest.fixture(scope="module")
def judge_folder(tmp_path_factory, smol_tokenizer) -> Path:
    return save_model_dir(tmp_path_factory.mktemp("tiny-rm-judge"), make_tiny_rm(smol_tokenizer, seed=1),
                          smol_tokenizer)


@pytest.fixture
def precomputed(tmp_path) -> tuple[Path, Path]:
    policy = [
        {"prompt": p, "response": f"Here is a careful answer number {i}, with detail."} for i, p in enumerate(PROMPTS)
    ]
    reference = [{"prompt": p, "response": f"meh {i}"} for i, p in enumerate(PROMPTS)]
    reference[3]["response"] = policy[3]["response"]  # an identical pair: must be an exact tie
    return write_jsonl_rows(tmp_path / "policy.jsonl", policy), write_jsonl_rows(tmp_path / "reference.jsonl",
                                                                                 reference[::-1])


def test_run_winrate_with_precomputed_responses_and_local_judge(precomputed, judge_folder, tmp_path):
    policy, reference = precomputed
    cfg = WinrateConfig(policy=str(policy), reference=str(reference), judge=str(judge_folder), data=None,
                        output_dir=str(tmp_path / "out"), device="cpu", dtype="float32", batch_size=2)
    summary = run_winrate(cfg)

    rows = [json.loads(line) for line in (tmp_path / "out" / "winrate.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [as_msgs(p) for p in PROMPTS]  # the policy file's order
    assert rows[0]["policy_response"].startswith("Here is") and rows[0]["reference_response"] == "meh 0"
    # the rewards are the judge's scores, the labels follow from them, the identical pair ties exactly
    judge = RewardModelScorer(str(judge_folder), device="cpu", dtype="float32", batch_size=3)
    expected_policy = judge.score([r["prompt"] for r in rows], [r["policy_response"] for r in rows])
    expected_ref = judge.score([r["prompt"] for r in rows], [r["reference_response"] for r in rows])
    assert [r["policy_reward"] for r in rows] == pytest.approx(expected_policy, abs=1e-5)
    assert [r["reference_reward"] for r in rows] == pytest.approx(expected_ref, abs=1e-5)
    assert rows[3]["policy_reward"] == rows[3]["reference_reward"] and rows[3]["label"] == 0.5
    assert [r["label"] for r in rows] == [winrate_label(r["policy_reward"], r["reference_reward"]) for r in rows]

    on_disk = json.loads((tmp_path / "out" / "winrate.json").read_text())
    assert on_disk == summary
    assert {k: summary[k]
            for k in ("win_rate", "ci_low", "ci_high", "n", "wins", "ties", "losses")
            } == winrate_summary([r["label"] for r in rows])
    assert summary["n"] == 5 and summary["ties"] >= 1 and summary["judge"] == str(judge_folder)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Win-rate" in report and "Example 3" in report and "Example 4" not in report
    assert "Here is a careful answer number 0" in report


def test_run_winrate_label_direction_with_a_stub_judge(precomputed, tmp_path, monkeypatch):
    """A judge that prefers longer responses: the policy's long answers win, the identical pair ties."""

    class LengthJudge:
        def score(self, prompts, responses):
            assert len(prompts) == len(responses)
            return [float(len(r)) for r in responses]

    monkeypatch.setattr(winrate_module, "make_judge", lambda cfg, run_dir: LengthJudge())
    policy, reference = precomputed
    plain = write_jsonl_rows(tmp_path / "prompts.jsonl", [{"prompt": p} for p in PROMPTS[::-1]])
    cfg = WinrateConfig(policy=str(policy), reference=str(reference), judge="stub", data=str(plain), limit=4,
                        output_dir=str(tmp_path / "out"))
    summary = run_winrate(cfg)
    # --data decides the prompts and their order (reversed here), --limit keeps the first 4
    rows = [json.loads(line) for line in (tmp_path / "out" / "winrate.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [as_msgs(p) for p in PROMPTS[::-1][:4]]
    assert [r["label"] for r in rows] == [1.0, 0.5, 1.0, 1.0]
    assert (summary["wins"], summary["ties"], summary["losses"]) == (3, 1, 0)
    assert summary["win_rate"] == pytest.approx(3.5 / 4)


def test_run_winrate_missing_precomputed_prompt(precomputed, tmp_path, monkeypatch):
    monkeypatch.setattr(winrate_module, "make_judge", lambda cfg, run_dir: None)
    policy, reference = precomputed
    extra = write_jsonl_rows(tmp_path / "prompts.jsonl", [{"prompt": "never answered"}])
    cfg = WinrateConfig(policy=str(policy), reference=str(reference), data=str(extra), output_dir=str(tmp_path / "out"))
    with pytest.raises(ValueError, match="no policy response for 1 of 1"):
        run_winrate(cfg)


def test_run_winrate_generates_with_a_tiny_policy(precomputed, judge_folder, tmp_path, smol_tokenizer):
    """A model as --policy: responses come from HFEngine on the chat generation prompt (greedy) and
    are saved as a reusable precomputed file."""
    policy_dir = save_model_dir(tmp_path / "tiny-policy", make_tiny_model(len(smol_tokenizer), seed=5), smol_tokenizer)
    _, reference = precomputed
    cfg = WinrateConfig(policy=str(policy_dir), reference=str(reference), judge=str(judge_folder), data=None,
                        max_new_tokens=4, output_dir=str(tmp_path / "out"), device="cpu", dtype="float32", batch_size=4)
    summary = run_winrate(cfg)
    assert summary["n"] == 5
    generated = [json.loads(line) for line in (tmp_path / "out" / "policy_responses.jsonl").read_text().splitlines()]
    assert len(generated) == 5 and all(isinstance(g["response"], str) for g in generated)
    # the saved responses are a valid precomputed --policy: judging them again gives the same summary
    again = run_winrate(
        WinrateConfig(policy=str(tmp_path / "out" / "policy_responses.jsonl"), reference=str(reference),
                      judge=str(judge_folder), data=None, output_dir=str(tmp_path / "out2"), device="cpu",
                      dtype="float32"))
    assert {k: again[k]
            for k in ("win_rate", "wins", "ties", "losses")
            } == {k: summary[k]
                  for k in ("win_rate", "wins", "ties", "losses")}
