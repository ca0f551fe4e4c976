"""scripts/studies/uf_best_of_n_report.py on fake win-rate folders and a stub judge: the paired differences, the
rescoring of every candidate (pick vs random vs the judge's best), the selector-judge agreement, all worked by hand, and
the errors on runs that do not share their reference answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import load_script


def script():
    return load_script("uf_best_of_n_report")


class StubJudge:
    """Reward = a fixed number per response text."""

    def __init__(self, rewards: dict[str, float]):
        self.rewards = rewards

    def score(self, prompts, responses):
        assert len(prompts) == len(responses)
        return [self.rewards[r] for r in responses]


PROMPTS = ["p0", "p1"]
GREEDY = ["g0", "g1"]
# judge rewards: greedy 0 on both prompts; candidates a-d of prompt 0 and e-h of prompt 1
REWARDS = {"g0": 0.0, "g1": 0.0, "a": 1.0, "b": -1.0, "c": 2.0, "d": -2.0, "e": -1.0, "f": -1.0, "g": 1.0, "h": -3.0,
           "one0": 1.0, "one1": -1.0}


def run_folder(root: Path, name: str, policy: list[str], candidates=None, judge=StubJudge(REWARDS), reference=GREEDY):
    folder = root / name
    folder.mkdir()
    rows = []
    for p, pol, ref in zip(PROMPTS, policy, reference):
        pw, rw = judge.rewards[pol], judge.rewards[ref]
        rows.append({"prompt": p, "policy_response": pol, "reference_response": ref, "policy_reward": pw,
                     "reference_reward": rw, "label": 1.0 if pw > rw else 0.5 if pw == rw else 0.0})
    (folder / "winrate.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels = [r["label"] for r in rows]
    (folder / "winrate.json").write_text(
        json.dumps({"win_rate": sum(labels) / 2, "ci_low": 0.0, "ci_high": 1.0, "n": 2}))
    if candidates is not None:
        (folder / "policy_candidates.jsonl").write_text("".join(json.dumps(c) + "\n" for c in candidates))


# the selector picks "a" (judge 1: win) for prompt 0 and "f" (judge -1: loss) for prompt 1
CANDIDATES = [{"prompt": "p0", "responses": ["a", "b", "c", "d"], "selector_scores": [3.0, 1.0, 2.0, 0.0], "chosen": 0},
              {"prompt": "p1", "responses": ["e", "f", "g", "h"], "selector_scores": [0.0, 5.0, 1.0, 1.0], "chosen": 1}]


def test_seed_report_by_hand(tmp_path):
    m = script()
    run_folder(tmp_path, "bon4_s0", ["a", "f"], CANDIDATES)
    run_folder(tmp_path, "bon1_s0", ["one0", "one1"])
    r = m.seed_report(tmp_path, 4, 0, StubJudge(REWARDS))
    # labels: best-of-4 (1, 0), one sample (1, 0): difference 0 on both prompts
    assert r["bon4_minus_bon1"]["diff"] == 0 and r["bon4_minus_bon1"]["better"] == 0
    # random pick: prompt 0 wins with a, c (2 of 4) -> 0.5; prompt 1 wins with g (1 of 4) -> 0.25
    assert r["random_win_rate"] == pytest.approx((0.5 + 0.25) / 2)
    # selected minus random: (1 - 0.5, 0 - 0.25) -> mean 0.125
    assert r["selected_minus_random"]["diff"] == pytest.approx(0.125)
    assert (r["selected_minus_random"]["better"], r["selected_minus_random"]["worse"]) == (1, 1)
    assert r["judge_best_win_rate"] == 1.0  # c on prompt 0, g on prompt 1
    assert r["rescoring_mismatches"] == 0 and r["rescored_win_rate"] == 0.5
    # agreement: prompt 0, selector order a>c>b>d, judge c>a>b>d: 5 of 6 pairs agree (a-c does not);
    # prompt 1, selector f>g, f>e, f>h, g>e, g>h; e-g... ties (g-h, e?) skipped:
    # selector scores e0 f5 g1 h1, judge e-1 f-1 g1 h-3
    # counted pairs (neither tied): e-g (s -, j -) agree; e-h (s -, j +) disagree; f-g (s +, j -) disagree;
    # f-h (s +, j +) agree; e-f (judge tie) and g-h (selector tie) skipped -> 2 of 4
    assert r["agreement_pairs"] == 6 + 4
    assert r["agreement"] == pytest.approx((5 + 2) / 10)
    assert r["mean_words"] == {"picked": 1, "candidates": 1, "reference": 1}


def test_pairwise_agreement_skips_ties():
    m = script()
    assert m.pairwise_agreement([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == (3, 3)
    assert m.pairwise_agreement([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == (0, 3)
    assert m.pairwise_agreement([1.0, 1.0], [0.0, 5.0]) == (0, 0)


def test_pooled_over_seeds_and_table(tmp_path):
    m = script()
    run_folder(tmp_path, "bon4_s0", ["a", "f"], CANDIDATES)
    run_folder(tmp_path, "bon1_s0", ["one0", "one1"])
    run_folder(tmp_path, "bon4_s1", ["a", "g"], [CANDIDATES[0], {**CANDIDATES[1], "chosen": 2}])
    run_folder(tmp_path, "bon1_s1", ["b", "one1"])
    reports = [m.seed_report(tmp_path, 4, s, None) for s in (0, 1)]
    pooled = m.pool(reports, 4)
    # per prompt, mean over seeds: best-of-4 (1, 0.5), one sample (0.5, 0): differences (0.5, 0.5)
    assert pooled["bon_minus_bon1"]["diff"] == pytest.approx(0.5)
    assert pooled["bon4"] == pytest.approx(0.75) and pooled["bon1"] == pytest.approx(0.25)
    table = m.markdown(reports, 4, pooled)
    assert "| best of 4 minus one sample, paired" in table and "+0.500" in table


def test_runs_with_different_reference_answers_are_refused(tmp_path):
    m = script()
    run_folder(tmp_path, "bon4_s0", ["a", "f"], CANDIDATES)
    run_folder(tmp_path, "bon1_s0", ["one0", "one1"], reference=["g1", "g0"])
    with pytest.raises(ValueError, match="prompt 0.*reference"):
        m.seed_report(tmp_path, 4, 0, None)


def test_outputs_never_replace_a_read_file_or_an_existing_one(tmp_path, capsys):
    """--json naming a run's winrate.json (a file the report reads) is refused even with --overwrite; an existing
    --markdown needs --overwrite; one line, exit 2, before anything is read or scored."""
    m = script()
    run_folder(tmp_path, "bon4_s0", ["a", "f"], CANDIDATES)
    run_folder(tmp_path, "bon1_s0", ["one0", "one1"])
    winrate = tmp_path / "bon1_s0" / "winrate.json"
    before = winrate.read_bytes()
    (tmp_path / "old.md").write_text("an earlier report")
    base = ["--runs", str(tmp_path), "--seeds", "0"]
    for argv, message in (([*base, "--json", str(winrate), "--overwrite"], "--json .*winrate.json is the input"),
                          ([*base, "--markdown", str(tmp_path / "old.md")], "old.md already exists; pass --overwrite")):
        with pytest.raises(SystemExit) as exit_info:
            m.run_script(m.main, argv, prog="uf_best_of_n_report.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and re.search(message, err), err
    assert winrate.read_bytes() == before and (tmp_path / "old.md").read_text() == "an earlier report"
    m.main([*base, "--markdown", str(tmp_path / "old.md"), "--json", str(tmp_path / "r.json"), "--overwrite"])
    assert "best of 4 minus one sample" in (tmp_path / "old.md").read_text() and json.loads(
        (tmp_path / "r.json").read_text())["pooled"]
