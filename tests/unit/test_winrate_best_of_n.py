"""`rlft eval winrate --best-of-n N --selector-model RM`: the selector's pick is what the judge sees (stub generator,
stub selector, stub judge), the files and summary name both models, and a judge that is the selector is refused."""

from __future__ import annotations

import json

import pytest

import rlft.eval.winrate as winrate_module
from rlft.eval.winrate import WinrateConfig, run_winrate
from rlft.validation import OptionError
from tests.conftest import write_jsonl_rows

PROMPTS = ["Name a fruit.", "What colour is the sky?", "Count to three."]


class Stub:
    """A generator (3 candidates per prompt from the policy, one greedy reference), a selector that likes "mid", a
    judge that likes length."""

    def __init__(self):
        self.calls = []

    def generate(self, model_name, prompts, cfg, *, k=1, temperature=None):
        self.calls.append((model_name, k, temperature))
        if k > 1:
            return [[f"no {i}", f"a much longer answer {i}", f"mid answer {i}"][:k] for i in range(len(prompts))]
        return [[f"reference answer {i}"] for i in range(len(prompts))]

    def score(self, prompts, responses):  # the selector
        assert len(prompts) == len(responses)
        return [1.0 if r.startswith("mid") else 0.0 for r in responses]


class LengthJudge:
    def score(self, prompts, responses):
        return [float(len(r)) for r in responses]


@pytest.fixture
def stubbed(tmp_path, monkeypatch):
    stub = Stub()
    monkeypatch.setattr(winrate_module, "generate_responses", stub.generate)
    monkeypatch.setattr(winrate_module, "make_selector", lambda cfg: stub)
    monkeypatch.setattr(winrate_module, "make_judge", lambda cfg, run_dir: LengthJudge())
    data = write_jsonl_rows(tmp_path / "prompts.jsonl", [{"prompt": p} for p in PROMPTS])
    return stub, data


def test_best_of_n_judges_the_selectors_pick_against_a_greedy_reference(stubbed, tmp_path):
    """The selector keeps "mid answer i" (12 chars) over "a much longer answer i" (22), which the length judge would
    have preferred; against "reference answer i" (18 chars) every pick loses: win-rate 0, not 1."""
    stub, data = stubbed
    out = tmp_path / "out"
    cfg = WinrateConfig(policy="runs/sft/model", reference="runs/sft/model", judge="judge-rm",
                        selector_model="selector-rm", best_of_n=3, temperature=0.8, reference_temperature=0.0,
                        data=str(data), output_dir=str(out))
    summary = run_winrate(cfg)
    assert stub.calls == [("runs/sft/model", 3, None), ("runs/sft/model", 1, 0.0)]  # N samples; the greedy reference
    rows = [json.loads(line) for line in (out / "winrate.jsonl").read_text().splitlines()]
    assert [r["policy_response"] for r in rows] == [f"mid answer {i}" for i in range(3)]
    assert [r["label"] for r in rows] == [0.0, 0.0, 0.0] and summary["win_rate"] == 0.0
    candidates = [json.loads(line) for line in (out / "policy_candidates.jsonl").read_text().splitlines()]
    assert candidates[1]["responses"] == ["no 1", "a much longer answer 1", "mid answer 1"]
    assert candidates[1]["selector_scores"] == [0.0, 0.0, 1.0] and candidates[1]["chosen"] == 2
    chosen = [json.loads(line)["response"] for line in (out / "policy_responses.jsonl").read_text().splitlines()]
    assert chosen == [f"mid answer {i}" for i in range(3)]  # re-judge them with --policy this file
    assert (summary["best_of_n"], summary["selector"], summary["judge"]) == (3, "selector-rm", "judge-rm")
    assert (summary["temperature"], summary["reference_temperature"]) == (0.8, 0.0)
    report = (out / "report.md").read_text()
    assert "best of 3 samples at temperature 0.8, picked by the selector `selector-rm`" in report
    assert "judged by `judge-rm`" in report


def test_without_best_of_n_the_reference_follows_temperature(stubbed, tmp_path):
    stub, data = stubbed
    summary = run_winrate(WinrateConfig(policy="p", reference="r", judge="j", temperature=0.5, data=str(data),
                                        output_dir=str(tmp_path / "out")))
    assert stub.calls == [("p", 1, None), ("r", 1, None)]  # None: --temperature, as before
    assert (summary["best_of_n"], summary["selector"], summary["reference_temperature"]) == (1, None, 0.5)
    assert not (tmp_path / "out" / "policy_candidates.jsonl").exists()


def test_a_judge_that_is_the_selector_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "rm").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptionError, match="--judge rm is the --selector-model.*--judge remote.*disjoint split"):
        WinrateConfig(policy="p", judge="rm", selector_model=str(tmp_path / "rm") + "/", best_of_n=4, temperature=1.0)
    WinrateConfig(policy="p", judge="remote", selector_model="remote", best_of_n=4, temperature=1.0)  # the remote API
    from rlft.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([
            "eval", "winrate", "--best-of-n", "4", "--temperature", "0.7", "--judge", "rm", "--selector-model", "./rm",
            "--dry-run"
        ])
    assert exit_info.value.code == 2
    assert "--judge rm is the --selector-model" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, message", [
    (dict(best_of_n=4, temperature=1.0), "--best-of-n needs --selector-model"),
    (dict(best_of_n=4, selector_model="s"), "needs --temperature > 0"),
    (dict(best_of_n=4, temperature=1.0, selector_model="s", policy="answers.jsonl"), "must be a model"),
    (dict(selector_model="s"), "only read with --best-of-n"),
    (dict(best_of_n=0), "--best-of-n must be >= 1"),
])
def test_best_of_n_option_errors(kwargs, message):
    with pytest.raises(OptionError, match=message):
        WinrateConfig(**kwargs)
