"""Countdown evaluation with a fake engine (hand-computed metrics) and one tiny-model end-to-end run."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.eval.countdown import (CountdownEvalResult, evaluate_countdown, mean_interval, paired_difference,
                                 pass_at_k_sizes)
from rlft.eval.countdown_command import EvalCountdownConfig, run_eval_countdown
from rlft.lab.test_looks import run_eval_countdown_counted
from rlft.rollout import GenerationEngine, Sample, SamplingParams
from rlft.types import CountdownTask
from tests.conftest import make_tiny_model

TASK = CountdownTask(nums=(3, 5, 2), target=16)
PROMPT = ("User: Using the numbers [3, 5, 2], create an equation that equals 16.\n"
          "Assistant: Let me solve this step by step.\n<think>")
# completion text -> (score, number of tokens, finish reason)
CORRECT = " 3 + 5 = 8, 8 * 2 = 16 </think>\n<answer>(3 + 5) * 2</answer>"
WRONG = " 3 + 5 + 2 = 10 </think>\n<answer>3 + 5 + 2</answer>"
NONE = " I am still thinking"
KIND = {CORRECT: (1.0, 10, "stop"), WRONG: (0.1, 20, "stop"), NONE: (0.0, 30, "length")}


class FakeEngine:
    """Returns the first ``params.k`` of the fixed completions listed for each prompt."""

    def __init__(self, completions: dict[str, list[str]]):
        self.completions = completions

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        out = []
        for prompt in prompts:
            row = []
            for text in self.completions[prompt][: params.k]:
                _, n_tokens, reason = KIND[text]
                row.append(Sample(list(range(n_tokens)), text, reason))
            out.append(row)
        return out


def three_tasks(samples: list[list[str]]):
    """Three copies of TASK, told apart by a suffix on the prompt's first line."""
    prompts = [PROMPT.replace("16.", f"16. (#{i})", 1) for i in range(3)]
    return [TASK] * 3, prompts, FakeEngine(dict(zip(prompts, samples)))


def test_fake_engine_is_an_engine():
    assert isinstance(FakeEngine({}), GenerationEngine)


def test_sampled_metrics():
    """Scores per task: A [1, .1, 0, 1], B [.1, .1, 0, 0], C [1, 1, 1, 1] (12 samples).

    mean = (2.1 + 0.2 + 4) / 12 = 0.525; accuracy = 6/12; format = 9/12;
    pass@1 = (2/4 + 0 + 1) / 3 = 0.5; pass@2 = (1 - C(2,2)/C(4,2) + 0 + 1) / 3 = (5/6 + 1) / 3 = 11/18;
    pass@4 = (1 + 0 + 1) / 3; tokens = (6*10 + 3*20 + 3*30) / 12 = 17.5; truncated = 3/12.
    """
    tasks, prompts, engine = three_tasks(
        [[CORRECT, WRONG, NONE, CORRECT], [WRONG, WRONG, NONE, NONE], [CORRECT] * 4]
    )
    r = evaluate_countdown(engine, tasks, prompts, SamplingParams(k=4, temperature=1.0), num_examples=2)
    assert (r.num_tasks, r.k, r.mode) == (3, 4, "sampled")
    assert r.mean_score == pytest.approx(0.525, abs=1e-9)
    assert r.accuracy == pytest.approx(0.5, abs=1e-9)
    assert r.format_rate == pytest.approx(0.75, abs=1e-9)
    assert list(r.pass_at_k) == [1, 2, 4]
    assert r.pass_at_k[1] == pytest.approx(0.5, abs=1e-9)
    assert r.pass_at_k[2] == pytest.approx(11 / 18, abs=1e-9)
    assert r.pass_at_k[4] == pytest.approx(2 / 3, abs=1e-9)
    assert r.mean_completion_tokens == pytest.approx(17.5, abs=1e-9)
    assert r.truncated_rate == pytest.approx(0.25, abs=1e-9)
    assert len(r.examples) == 2
    assert r.examples[0] == {
        "prompt_tail": prompts[0][-200:],
        "completion": CORRECT,
        "score": 1.0,
        "target": 16,
        "nums": [3, 5, 2],
    }
    assert r.examples[1]["score"] == pytest.approx(0.1)
    assert r.task_scores == [[1.0, 0.1, 0.0, 1.0], [0.1, 0.1, 0.0, 0.0], [1.0] * 4]


def test_greedy_metrics():
    """Scores [1, 0.1, 0]: mean 1.1/3, accuracy 1/3, format 2/3, pass@1 = accuracy."""
    tasks, prompts, engine = three_tasks([[CORRECT], [WRONG], [NONE]])
    r = evaluate_countdown(engine, tasks, prompts, SamplingParams(k=1, temperature=0.0))
    assert (r.k, r.mode) == (1, "greedy")
    assert r.mean_score == pytest.approx(1.1 / 3, abs=1e-9)
    assert r.accuracy == pytest.approx(1 / 3, abs=1e-9)
    assert r.format_rate == pytest.approx(2 / 3, abs=1e-9)
    assert r.pass_at_k == {1: r.accuracy}
    assert r.mean_completion_tokens == pytest.approx(20.0, abs=1e-9)
    assert r.truncated_rate == pytest.approx(1 / 3, abs=1e-9)
    assert len(r.examples) == 3


def test_pass_at_k_sizes():
    assert pass_at_k_sizes(1) == [1]
    assert pass_at_k_sizes(6) == [1, 2, 4, 6]
    assert pass_at_k_sizes(8) == [1, 2, 4, 8]


def test_errors():
    tasks, prompts, engine = three_tasks([[CORRECT], [WRONG], [NONE]])
    with pytest.raises(ValueError):
        evaluate_countdown(engine, tasks[:2], prompts, SamplingParams(temperature=0.0))
    with pytest.raises(ValueError):
        evaluate_countdown(engine, [], [], SamplingParams(temperature=0.0))
    with pytest.raises(ValueError):  # the engine returns 1 sample where 2 were asked for
        evaluate_countdown(engine, tasks, prompts, SamplingParams(k=2))


def test_mean_interval_hand_computed():
    """Per-task means [0.5, 0.1, 0.1, 0] (k=2): mean 0.7/4 = 0.175; squared deviations .105625 + .005625 + .005625 +
    .030625 = 0.1475, / 3 sample variance; half width 1.96 * sqrt(0.1475/3) / 2."""
    mean, half = mean_interval([[1.0, 0.0], [0.1, 0.1], [0.1, 0.1], [0.0, 0.0]])
    assert mean == pytest.approx(0.175, abs=1e-12)
    assert half == pytest.approx(1.959963984540054 * (0.1475 / 3) ** 0.5 / 2, abs=1e-12)
    assert mean_interval([[0.1]]) == (pytest.approx(0.1), 0.0)


def test_paired_difference_hand_computed():
    """A = [1, .1, 0, 1] (k=1), B per task means [(1+0)/2, .1, .1, 0] (k=2).

    d = [0.5, 0, -0.1, 1]; mean 1.4/4 = 0.35; sample variance = sum((d - .35)^2) / 3
    = (.0225 + .1225 + .2025 + .4225) / 3 = 0.77 / 3; half width = 1.96 * sqrt(0.77/3) / 2.
    """
    a = [[1.0], [0.1], [0.0], [1.0]]
    b = [[1.0, 0.0], [0.1, 0.1], [0.1, 0.1], [0.0, 0.0]]
    r = paired_difference(a, b)
    half = 1.959963984540054 * (0.77 / 3) ** 0.5 / 2
    assert r["n"] == 4 and (r["better"], r["worse"]) == (2, 1)
    assert r["diff"] == pytest.approx(0.35, abs=1e-12)
    assert (r["ci_low"], r["ci_high"]) == (pytest.approx(0.35 - half, abs=1e-12), pytest.approx(0.35 + half, abs=1e-12))
    same = paired_difference(a, a)  # a model against itself: zero difference, zero width
    assert (same["diff"], same["ci_low"], same["ci_high"], same["better"], same["worse"]) == (0, 0, 0, 0, 0)
    one = paired_difference([[1.0]], [[0.1]])
    assert one["diff"] == pytest.approx(0.9) and one["ci_low"] == one["ci_high"] == pytest.approx(0.9)
    with pytest.raises(ValueError, match="same non-zero number"):
        paired_difference(a, b[:3])
    with pytest.raises(ValueError, match="same non-zero number"):
        paired_difference([], [])
    with pytest.raises(ValueError, match="at least one score"):
        paired_difference([[1.0], []], [[0.0], [0.0]])


def test_json_round_trip(tmp_path):
    tasks, prompts, engine = three_tasks([[CORRECT, WRONG], [WRONG, NONE], [NONE, CORRECT]])
    r = evaluate_countdown(engine, tasks, prompts, SamplingParams(k=2, temperature=1.0))
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(r.to_dict()))
    assert CountdownEvalResult.from_dict(json.loads(path.read_text())) == r


@pytest.mark.parametrize("template", ["base", "chat"])
def test_run_eval_countdown_tiny_model(tmp_path, smol_tokenizer, template):
    """End to end on a tiny random model saved to disk: generated held-out tasks, JSON output."""
    pytest.importorskip("rlft.tasks.countdown.generator")
    pytest.importorskip("rlft.tasks.countdown.prompts")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: threads only add contention on a shared box
    try:
        model_dir = tmp_path / "tiny"
        make_tiny_model(len(smol_tokenizer)).save_pretrained(model_dir)
        smol_tokenizer.save_pretrained(model_dir)
        out = tmp_path / "out" / "eval.json"
        cfg = EvalCountdownConfig(
            model=str(model_dir), limit=3, mode="sampled", k=2, max_new_tokens=4, batch_size=4,
            device="cpu", output=str(out), prompt_template=template,
        )
        result = run_eval_countdown_counted(cfg)  # `rlft eval countdown`: the evaluation, its look counted
    finally:
        torch.set_num_threads(threads)
    assert (result.num_tasks, result.k, result.mode) == (3, 2, "sampled")
    from rlft.tasks.countdown.generator import PRESETS, make_splits

    held_out = make_splits(PRESETS["easy3"], n_train=10, n_test=3, seed=1234)[1]
    assert [(e["nums"], e["target"]) for e in result.examples] == [(list(t.nums), t.target) for t in held_out]
    assert set(result.pass_at_k) == {1, 2}
    assert result.mean_completion_tokens <= 4
    saved = json.loads(out.read_text())
    assert saved["config"]["model"] == str(model_dir)
    assert CountdownEvalResult.from_dict(saved) == result
    # a look at the test tasks is counted: one ledger line beside the output, naming the weights
    from rlft.lab.ledger import count_test_looks, read_looks

    looks = read_looks(out.parent / "test_looks.jsonl")
    assert len(looks) == 1 and looks[0]["model_sha256"] == saved["config"]["model_sha256"] is not None
    assert looks[0]["num_tasks"] == 3 and looks[0]["split"] == "test"
    assert count_test_looks(out.parent / "test_looks.jsonl", saved["config"]["model_sha256"]) == 1


def test_the_library_evaluation_tells_its_caller_of_a_test_look_and_counts_none(tmp_path, smol_tokenizer):
    """run_eval_countdown (the library) writes no ledger: it calls on_test_look once, on --split test only, with the
    config record a ledger line reads (the weights' SHA-256, the held-out block); counting is the lab's
    (rlft.lab.test_looks.run_eval_countdown_counted)."""
    model_dir = tmp_path / "tiny"
    make_tiny_model(len(smol_tokenizer)).save_pretrained(model_dir)
    smol_tokenizer.save_pretrained(model_dir)
    told = []
    base = dict(model=str(model_dir), limit=2, max_new_tokens=2, batch_size=4, device="cpu")
    out = tmp_path / "out" / "eval.json"
    result = run_eval_countdown(EvalCountdownConfig(**base, output=str(out)),
                                on_test_look=lambda r, config: told.append((r, config)))
    saved = json.loads(out.read_text())
    assert len(told) == 1 and told[0][0] is result
    assert told[0][1]["model_sha256"] == saved["config"]["model_sha256"] is not None
    assert (told[0][1]["split"], told[0][1]["model"]) == ("test", str(model_dir))
    assert not (out.parent / "test_looks.jsonl").exists()
    run_eval_countdown(EvalCountdownConfig(**base, split="train"), on_test_look=lambda r, config: told.append(r))
    assert len(told) == 1  # training tasks are no look at the test rows


def test_run_eval_countdown_from_file(tmp_path, smol_tokenizer):
    """``data`` names a local JSONL file of target + nums rows; greedy mode."""
    pytest.importorskip("rlft.tasks.countdown.loaders")
    pytest.importorskip("rlft.tasks.countdown.prompts")
    model_dir = tmp_path / "tiny"
    make_tiny_model(len(smol_tokenizer)).save_pretrained(model_dir)
    smol_tokenizer.save_pretrained(model_dir)
    data = tmp_path / "tasks.jsonl"
    rows = [{"target": 16, "nums": [3, 5, 2]}, {"target": 24, "nums": [4, 6, 1]}, {"target": 7, "nums": [1, 2, 4]}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = EvalCountdownConfig(model=str(model_dir), data=str(data), split="all", limit=2, max_new_tokens=3,
                                  device="cpu")
        result = run_eval_countdown(cfg)
    finally:
        torch.set_num_threads(threads)
    assert (result.num_tasks, result.k, result.mode) == (2, 1, "greedy")
    assert [e["target"] for e in result.examples] == [16, 24]
    assert not list(tmp_path.rglob("test_looks.jsonl"))  # --split all is not a look at the test rows
    assert result.pass_at_k == {1: result.accuracy}


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_stop_repeats_reaches_the_sampling_and_the_file(tmp_path, smol_tokenizer, monkeypatch, mode):
    """--stop-repeats N: every generation of the evaluation runs with the loop stop, and the file records N (so
    `rlft eval compare` can refuse to pair it with an evaluation without it)."""
    import rlft.eval.countdown_command as command

    model_dir = tmp_path / "tiny"
    make_tiny_model(len(smol_tokenizer)).save_pretrained(model_dir)
    smol_tokenizer.save_pretrained(model_dir)
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"target": 16, "nums": [3, 5, 2]}) + "\n")
    seen = []
    real = command.evaluate_countdown
    monkeypatch.setattr(command, "evaluate_countdown", lambda engine, tasks, prompts, params: seen.append(params) or
                        real(engine, tasks, prompts, params))
    out = tmp_path / "eval.json"
    sampled = {"mode": "sampled", "k": 2, "temperature": 1.0} if mode == "sampled" else {}
    run_eval_countdown(EvalCountdownConfig(model=str(model_dir), data=str(data), split="all", limit=1, max_new_tokens=3,
                                           device="cpu", stop_repeats=3, output=str(out), **sampled))
    assert [p.stop_repeats for p in seen] == [3] and seen[0].temperature == (1.0 if sampled else 0.0)
    assert json.loads(out.read_text())["config"]["stop_repeats"] == 3
