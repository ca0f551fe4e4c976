"""Best-of-N curves (rlft.eval.best_of_n) and `rlft eval countdown --select`: hand-worked selections of a k=4 fake
evaluation, the reward-model selector end to end with a stub scorer and a fake engine, option and baseline errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlft.eval.best_of_n import check_same_tasks, selection_rows, selection_sizes, tokens_per_task
from rlft.eval.countdown import CountdownEvalResult
from rlft.eval.countdown_command import EvalCountdownConfig, run_eval_countdown
from rlft.rollout import Sample, SamplingParams
from rlft.validation import OptionError

Z = 1.959963984540054


def fake_result(**overrides) -> CountdownEvalResult:
    """Three tasks x 4 samples (see test_selection_rows_by_hand)."""
    data = dict(
        num_tasks=3, k=4, mode="sampled", mean_score=0.0, accuracy=0.0, format_rate=0.0, pass_at_k={1: 0.0},
        mean_completion_tokens=0.0, truncated_rate=0.0,
        task_scores=[[0.1, 1.0, 1.0, 0.1], [0.0, 0.1, 1.0, 1.0], [1.0, 0.1, 0.1, 0.1]],
        task_values=[[5.0, 9.0, 9.0, 5.0], [None, 2.0, 9.0, 9.0], [16.0, 3.0, 3.0, 3.0]],
        task_certainty=[[0.1, 0.2, 0.3, 0.4]] * 3,
        task_tokens=[[10, 20, 30, 40], [10, 10, 10, 10], [5, 5, 5, 5]],
        tasks=[{"nums": [1, 2, 3], "target": t} for t in (6, 7, 8)],
    )
    data.update(overrides)
    return CountdownEvalResult(**data)


GREEDY = [[1.0], [0.1], [0.0]]


def test_selection_sizes():
    assert selection_sizes(16) == [1, 2, 4, 8, 16]
    assert selection_sizes(6) == [1, 2, 4, 6]
    assert selection_sizes(8, (8, 2, 2)) == [2, 8]
    with pytest.raises(ValueError, match="--select-n 9"):
        selection_sizes(8, (9,))


def test_selection_rows_by_hand():
    """majority@1 = sample 0: (.1 + 0 + 1) / 3; @2: task 0 (5 vs 9 tie: 5 first) .1, task 1 (None does not vote) .1,
    task 2 (16 vs 3 tie: 16) 1 -> 1.2/3; @4: task 0 still .1, task 1 (9 twice) 1, task 2 (3 three times) .1 -> 1.2/3.
    oracle@2 = (1 + .1 + 1) / 3, oracle@4 = 1. Tokens per task: n=1 (10+10+5)/3, n=2 (30+20+10)/3, n=4 (100+40+20)/3.
    majority@4 minus greedy (1, .1, 0): d = (-.9, .9, .1), mean 1/30, sd from the sum of squared deviations
    1.62667/2."""
    rows = selection_rows(fake_result(), GREEDY, ["majority", "oracle"], [1, 2, 4])
    table = {(r["selector"], r["n"]): r for r in rows}
    assert [(r["selector"], r["n"]) for r in rows] == [("majority", 1), ("majority", 2), ("majority", 4),
                                                       ("oracle", 1), ("oracle", 2), ("oracle", 4)]
    assert [table["majority", n]["score"] for n in (1, 2, 4)] == pytest.approx([1.1 / 3, 1.2 / 3, 1.2 / 3])
    assert [table["oracle", n]["score"] for n in (1, 2, 4)] == pytest.approx([1.1 / 3, 2.1 / 3, 1.0])
    assert [table["oracle", n]["accuracy"] for n in (1, 2, 4)] == pytest.approx([1 / 3, 2 / 3, 1.0])  # pass@n
    assert table["majority", 4]["accuracy"] == pytest.approx(1 / 3)
    assert [table["majority", n]["tokens_per_task"] for n in (1, 2, 4)] == pytest.approx([25 / 3, 20.0, 160 / 3])
    m4 = table["majority", 4]
    half = Z * math.sqrt((0.9 + 1 / 30) ** 2 / 2 + (0.9 - 1 / 30) ** 2 / 2 + (0.1 - 1 / 30) ** 2 / 2) / math.sqrt(3)
    assert m4["diff"] == pytest.approx(1 / 30)
    assert (m4["ci_low"], m4["ci_high"]) == (pytest.approx(1 / 30 - half), pytest.approx(1 / 30 + half))
    assert (m4["better"], m4["worse"]) == (2, 1)
    assert table["oracle", 4]["upper_bound"] and "upper bound" in table["oracle", 4]["label"]
    assert not m4["upper_bound"]
    assert table["oracle", 4]["diff"] == pytest.approx(1.9 / 3)


def test_reward_model_rows_read_task_rm_scores():
    """rm scores: task 0 (0, 1, 0, 2) -> sample 0, 1, 3 at n = 1, 2, 4 (.1, 1, .1); task 1 (5, 0, 0, 0) -> sample 0
    (0.0); task 2 (3, 2, 1, 0) -> sample 0 (1.0), whatever the rule scores say."""
    result = fake_result(task_rm_scores=[[0.0, 1.0, 0.0, 2.0], [5.0, 0.0, 0.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    rows = selection_rows(result, GREEDY, ["reward-model"], [1, 2, 4])
    assert [r["score"] for r in rows] == pytest.approx([1.1 / 3, 2 / 3, 1.1 / 3])


def test_tokens_and_task_checks():
    assert tokens_per_task([], 2) != tokens_per_task([], 2)  # NaN without counts
    greedy = fake_result(k=1, mode="greedy", task_scores=GREEDY)
    check_same_tasks(fake_result().tasks, greedy, "g.json")
    with pytest.raises(ValueError, match="g.json: task 1 is nums \\[1, 2, 3\\] target 7"):
        check_same_tasks([{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3], "target": 70},
                          {"nums": [1, 2, 3], "target": 8}], greedy, "g.json")
    with pytest.raises(ValueError, match="has 3 tasks, the sampled evaluation 2"):
        check_same_tasks(fake_result().tasks[:2], greedy, "g.json")
    with pytest.raises(ValueError, match="baseline must be greedy"):
        check_same_tasks(fake_result().tasks, fake_result(), "s.json")


def test_option_errors(tmp_path):
    import typing

    from rlft.eval.countdown_command import Selector
    from rlft.eval.select import SELECTORS

    assert typing.get_args(Selector) == SELECTORS  # the CLI's choices are the selectors
    with pytest.raises(OptionError, match="--select needs --mode sampled"):
        EvalCountdownConfig(select=("majority",))
    with pytest.raises(OptionError, match="needs --select-reward-model"):
        EvalCountdownConfig(mode="sampled", k=4, select=("reward-model",))
    with pytest.raises(OptionError, match="--select-n 5 is outside"):
        EvalCountdownConfig(mode="sampled", k=4, select=("oracle",), select_n=(1, 5))
    with pytest.raises(OptionError, match="--greedy-from needs --select"):
        EvalCountdownConfig(mode="sampled", k=4, greedy_from="g.json")
    with pytest.raises(OptionError, match="needs --rollout-engine hf"):
        EvalCountdownConfig(mode="sampled", k=4, select=("self-certainty",), rollout_engine="server")


def test_cli_refuses_select_in_greedy_mode(capsys):
    from rlft.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "countdown", "--select", "majority", "oracle", "--dry-run"])
    assert exit_info.value.code == 2
    assert "--select needs --mode sampled" in capsys.readouterr().err


# --------------------------------------------------------------------------- the command, with a fake engine

A, B = (3, 5, 2, 16), (4, 6, 1, 24)  # nums..., target
SAMPLED = {
    16: ["3 + 5 + 2", "(3 + 5) * 2", "2 * (5 + 3)", "3 * 5 + 2"], 24: ["4 + 6 + 1", "4 + 6 - 1", None, "4 * 6 * 1"]
}
GREEDY_ANSWER = {16: "3 * 5 + 2", 24: "4 * 6 * 1"}
CERTAINTY = {16: [0.1, 0.2, 0.3, 0.9], 24: [0.5, 0.1, 0.2, 0.3]}
RM = {"3 + 5 + 2": 3.0, "(3 + 5) * 2": 1.0, "2 * (5 + 3)": 2.0, "3 * 5 + 2": 0.0,
      "4 + 6 + 1": 0.0, "4 + 6 - 1": 1.0, None: -1.0, "4 * 6 * 1": 2.0}


def text(expr: str | None) -> str:
    return " thinking" if expr is None else f" ok </think>\n<answer>{expr}</answer>"


class FakeEngine:
    """Sampled: the four SAMPLED answers of a task (10, 20, 30, 40 tokens); greedy: GREEDY_ANSWER (7 tokens)."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params: SamplingParams):
        from rlft.tasks.countdown.prompts import parse_query

        self.calls.append(params)
        out = []
        for prompt in prompts:
            target = parse_query(prompt)[1]
            if params.temperature == 0:
                out.append([Sample(list(range(7)), text(GREEDY_ANSWER[target]), "stop")])
            else:
                out.append([Sample(list(range(10 * (j + 1))), text(e), "stop", self_certainty=CERTAINTY[target][j])
                            for j, e in enumerate(SAMPLED[target][: params.k])])
        return out


class StubScorer:
    def __init__(self):
        self.prompts = []

    def score(self, prompts, responses):
        self.prompts += list(prompts)
        return [RM[next((e for e in RM if e is not None and f"<answer>{e}</answer>" in r), None)] for r in responses]


@pytest.fixture
def setup(tmp_path, smol_tokenizer, monkeypatch):
    import rlft.models as models
    import rlft.rewards.reward_model as rm_module
    import rlft.rollout.engines as engines

    engine, scorer = FakeEngine(), StubScorer()
    monkeypatch.setattr(engines, "make_engine", lambda *a, **k: engine)
    monkeypatch.setattr(rm_module, "RewardModelScorer", lambda *a, **k: scorer)
    monkeypatch.setattr(rm_module, "check_reward_model", lambda *a: None)  # the stub scorer has no folder
    monkeypatch.setattr(models, "load_tokenizer", lambda name: smol_tokenizer)
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"nums": list(t[:3]), "target": t[3]}) + "\n" for t in (A, B)))
    base = dict(model="policy", data=str(data), split="all", device="cpu", max_new_tokens=64)
    return engine, scorer, base


def test_command_reward_model_selection_end_to_end(setup, tmp_path):
    """Scores: task A sampled (.1, 1, 1, .1), greedy .1; task B sampled (.1, .1, 0, 1), greedy 1.
    reward model (A: 3, 1, 2, 0 -> sample 0 always; B: 0, 1, -1, 2 -> 0, 1, 3 at n = 1, 2, 4): (.1+.1)/2, (.1+.1)/2,
    (.1+1)/2. majority@4: A's 16 twice -> 1, B all different -> sample 0 .1: .55; @2: both ties -> sample 0: .1.
    self-certainty@4: A sample 3 (.1), B sample 0 (.1). oracle: .1, .55, 1. Greedy (.1, 1): mean .55, 7 tokens."""
    engine, scorer, base = setup
    out = tmp_path / "eval.json"
    cfg = EvalCountdownConfig(**base, mode="sampled", k=4, output=str(out), select_reward_model="rm-folder",
                              select=("majority", "self-certainty", "reward-model", "oracle"))
    result = run_eval_countdown(cfg)
    assert [p.temperature for p in engine.calls] == [1.0, 0.0]  # the sampled run, then the greedy baseline
    assert engine.calls[1].max_new_tokens == 64
    assert result.task_scores == [[0.1, 1.0, 1.0, 0.1], [0.1, 0.1, 0.0, 1.0]]
    assert result.task_rm_scores == [[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, -1.0, 2.0]]
    # the reward model saw the rendered prompt (the policy's input) as the user turn, once per sample
    assert len(scorer.prompts) == 8 and scorer.prompts[0].startswith("A conversation between User and Assistant")
    assert "[3, 5, 2]" in scorer.prompts[3] and "[4, 6, 1]" in scorer.prompts[4]
    saved = json.loads(out.read_text())
    sel = saved["selection"]
    assert sel["sizes"] == [1, 2, 4
                            ] and sel["reward_model"] == "rm-folder" and "rendered prompt" in sel["reward_model_input"]
    assert sel["greedy"]["source"] == "this run" and sel["greedy"]["mean_score"] == pytest.approx(0.55)
    assert sel["greedy"]["tokens_per_task"] == 7
    table = {(r["selector"], r["n"]): r for r in sel["rows"]}
    expected = {"reward-model": [0.1, 0.1, 0.55], "majority": [0.1, 0.1, 0.55], "self-certainty": [0.1, 0.55, 0.1],
                "oracle": [0.1, 0.55, 1.0]}
    # self-certainty@2: A (.1, .2) -> sample 1 (1.0), B (.5, .1) -> sample 0 (.1)
    for name, scores in expected.items():
        assert [table[name, n]["score"] for n in (1, 2, 4)] == pytest.approx(scores), name
    assert [table["oracle", n]["tokens_per_task"] for n in (1, 2, 4)] == [10, 30, 100]
    assert table["reward-model", 2]["diff"] == pytest.approx(-0.45)  # d = (0, -.9)
    assert table["oracle", 4]["label"].startswith("oracle") and table["oracle", 4]["upper_bound"]
    assert CountdownEvalResult.from_dict(saved) == result  # the selection can be read back (and recomputed)
    again = selection_rows(CountdownEvalResult.from_dict(saved), sel["greedy"]["task_scores"], ["reward-model"],
                           [1, 2, 4])
    assert [r["score"] for r in again] == pytest.approx(expected["reward-model"])


def test_command_greedy_from_file_and_its_mismatch(setup, tmp_path):
    engine, _, base = setup
    greedy_file = tmp_path / "greedy.json"
    run_eval_countdown(EvalCountdownConfig(**base, output=str(greedy_file)))
    engine.calls.clear()
    result = run_eval_countdown(EvalCountdownConfig(**base, mode="sampled", k=4, select=("oracle",), select_n=(4,),
                                                    greedy_from=str(greedy_file)))
    assert [p.temperature for p in engine.calls] == [1.0]  # no greedy pass: the file is the baseline
    assert result.selection["greedy"]["source"] == str(greedy_file)
    assert [(r["n"], r["diff"]) for r in result.selection["rows"]] == [(4, pytest.approx(0.45))]  # (1, 1) - (.1, 1)
    # other tasks (the file's rows reversed): refused before sampling, naming the option and the task
    saved = json.loads(greedy_file.read_text())
    saved["tasks"] = saved["tasks"][::-1]
    greedy_file.write_text(json.dumps(saved))
    engine.calls.clear()
    with pytest.raises(OptionError, match="--greedy-from .*task 0 is nums \\[4, 6, 1\\] target 24"):
        run_eval_countdown(
            EvalCountdownConfig(**base, mode="sampled", k=4, select=("oracle", ), greedy_from=str(greedy_file)))
    assert engine.calls == []


def test_command_records_the_weights_hash_and_refuses_a_greedy_file_of_other_weights(setup, tmp_path):
    """A model folder saved twice at one path (a rebuilt run) is two models: the output's config records
    ``model_sha256``, and a --greedy-from of other weights is refused before sampling."""
    import hashlib

    engine, _, base = setup
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"first training")
    base = {**base, "model": str(folder)}
    greedy_file = tmp_path / "greedy.json"
    run_eval_countdown(EvalCountdownConfig(**base, output=str(greedy_file)))
    recorded = json.loads(greedy_file.read_text())["config"]["model_sha256"]
    assert recorded == hashlib.sha256(b"first training").hexdigest()
    assert json.loads(
        greedy_file.read_text())["environment"]["torch"] == torch.__version__  # which code and machine ran
    run_eval_countdown(
        EvalCountdownConfig(**base, mode="sampled", k=4, select=("oracle", ), greedy_from=str(greedy_file)))
    (folder / "model.safetensors").write_bytes(b"the rebuild")
    engine.calls.clear()
    with pytest.raises(OptionError, match="--greedy-from .*greedy.json evaluated weights with SHA-256 "
                                          + recorded[:16]):
        run_eval_countdown(
            EvalCountdownConfig(**base, mode="sampled", k=4, select=("oracle", ), greedy_from=str(greedy_file)))
    assert engine.calls == []


def test_weights_sha256_of_one_file_a_sharded_folder_and_a_name(tmp_path):
    import hashlib

    from rlft.checkpoint import weights_sha256

    (tmp_path / "a.safetensors").write_bytes(b"A")
    assert weights_sha256(tmp_path) == hashlib.sha256(b"A").hexdigest()  # what sha256sum prints
    (tmp_path / "b.safetensors").write_bytes(b"B")
    lines = f"a.safetensors {hashlib.sha256(b'A').hexdigest()}\nb.safetensors {hashlib.sha256(b'B').hexdigest()}\n"
    assert weights_sha256(tmp_path) == hashlib.sha256(lines.encode()).hexdigest()
    assert weights_sha256("smollm2-135m") is None and weights_sha256(tmp_path / "missing") is None


def test_command_with_a_tiny_model(tmp_path, smol_tokenizer, one_thread):
    """The real hf engine: its decoder reports self-certainty, so the certainty selectors run; costs add up."""
    from tests.conftest import make_tiny_model

    model_dir = tmp_path / "tiny"
    make_tiny_model(len(smol_tokenizer)).save_pretrained(model_dir)
    smol_tokenizer.save_pretrained(model_dir)
    cfg = EvalCountdownConfig(model=str(model_dir), limit=2, mode="sampled", k=2, max_new_tokens=4, batch_size=4,
                              device="cpu", select=("majority", "self-certainty-vote", "oracle"))
    result = run_eval_countdown(cfg)
    sel = result.selection
    assert sel["skipped"] == {} and all(c is not None for row in result.task_certainty for c in row)
    assert [(r["selector"], r["n"]) for r in sel["rows"]] == [(s, n) for s in cfg.select for n in (1, 2)]
    for r in sel["rows"]:
        assert r["tokens_per_task"] == sum(sum(row[: r["n"]]) for row in result.task_tokens) / 2 <= 4 * r["n"]
    oracle = {r["n"]: r["score"] for r in sel["rows"] if r["selector"] == "oracle"}
    assert oracle[2] == pytest.approx(sum(max(row) for row in result.task_scores) / 2)
    assert len(sel["greedy"]["task_scores"]) == 2 and sel["greedy"]["tokens_per_task"] <= 4
