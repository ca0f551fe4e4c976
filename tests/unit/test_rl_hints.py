"""Solver-guided rollouts (rlft.rl.hints, --hint solver): the solver's prefix by hand, its schedule, a hinted group's
prompt, mask and advantages, no hint on a group with a success, and the options that cannot act."""

from __future__ import annotations

import pytest

from rlft.losses.advantages import ADVANTAGES
from rlft.recipes.common import batch_indices
from rlft.rl.batch import rollout_batch
from rlft.rl.config import RLConfig
from rlft.rl.hints import failed_groups, hint_prefix, hinted_prompt, step_fraction
from rlft.rl.records import Reward, RLPrompt
from rlft.rl.sampling import sample_step
from rlft.rollout.base import Sample
from rlft.tasks.countdown.traces import write_trace
from rlft.types import CountdownTask
from rlft.validation import OptionError

TASK = CountdownTask((3, 5, 7), 22)


def test_prefix_is_the_solvers_search_cut_at_a_step_boundary():
    trace = write_trace(TASK, "bounded", give_up=0.0, max_tries=10_000)
    reasoning = trace[: trace.index("</think>")]
    whole = hint_prefix(TASK, 1.0)
    assert whole == reasoning and "<answer>" not in whole  # the whole search, never the answer line
    first = hint_prefix(TASK, 1e-6)  # at least the first step
    assert reasoning.startswith(first) and first.endswith((", ", "\n")) and 0 < len(first) < len(reasoning)
    half = hint_prefix(TASK, 0.5)
    assert reasoning.startswith(half) and len(half) <= 0.5 * len(reasoning) and half.endswith((", ", "\n"))
    # the largest boundary within half: no later ", " or newline fits
    assert all(reasoning.find(sep, len(half)) + len(sep) > 0.5 * len(reasoning) or reasoning.find(sep, len(half)) < 0
               for sep in (", ", "\n"))
    calc = hint_prefix(TASK, 1.0, "calc")
    assert "<tool_call>" in calc and "<answer>" not in calc
    with pytest.raises(ValueError, match="fraction"):
        hint_prefix(TASK, 0.0)


def test_solution_prefix_is_the_solutions_steps_without_dead_ends():
    task = CountdownTask((19, 36, 55, 7), 65)  # the patient search tries 3 dead ends before its solution line
    reasoning = write_trace(task, "bounded", give_up=0.0, max_tries=10_000)
    assert reasoning.count("no.\n") == 3 and hint_prefix(task, 0.5).endswith("no.\n")  # half: dead ends only
    assert hint_prefix(task, 1e-6, solution=True) == " 55-7=48, "  # at least the first step
    assert hint_prefix(task, 0.5, solution=True) == " 55-7=48, 48+36=84, "  # 20 of the line's 51 characters fit
    assert hint_prefix(task, 1.0, solution=True) == " 55-7=48, 48+36=84, 84-19=65. Check: 55-7+36-19=65."
    assert hint_prefix(TASK, 0.5, solution=True) == " 3*5=15, "  # no dead end: the line is the whole search
    with pytest.raises(ValueError, match="plain text"):
        hint_prefix(task, 0.5, "calc", solution=True)
    prompt, chars = hinted_prompt(RLPrompt("Task:", None, task.ground_truth()), 0.5, solution=True)
    assert (prompt.text, chars) == ("Task: 55-7=48, 48+36=84, ", 20)


def test_schedule_and_failed_groups():
    assert [step_fraction(0.5, s, 10) for s in (0, 5, 9)] == [0.5, 0.25, pytest.approx(0.05)]
    assert failed_groups([[0.0, 0.1], [1.0, 0.0], [0.1, 0.1]]) == [0, 2]


class Engine:
    """Scripted completions: a prompt with the solver's prefix gets ``hinted``, another ``plain`` (k texts each)."""

    def __init__(self, plain: dict[str, list[str]], hinted: list[str]):
        self.plain, self.hinted, self.calls = plain, hinted, []
        self.add_special_tokens = True

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        return [[Sample([1, 2], t, "stop") for t in (self.plain[p] if p in self.plain else self.hinted)]
                for p in prompts]


def test_hinted_group_prompt_mask_and_advantages(smol_tokenizer):
    prompts = [RLPrompt("Task A:", None, TASK.ground_truth()), RLPrompt("Task B:", None, TASK.ground_truth())]
    # prompt A all fails (0, 0.1): hinted; prompt B has a success: never hinted
    engine = Engine({"Task A:": ["x", "wrong"], "Task B:": ["ok", "x"]}, hinted=["ok", "wrong"])
    reward = Reward(lambda ps, cs: [{"ok": 1.0, "wrong": 0.1}.get(c, 0.0) for c in cs], "rule")
    cfg = RLConfig(k=2, prompts_per_step=2, hint="solver", hint_fraction=0.5, max_steps=4, max_new_tokens=8)
    got = sample_step(cfg, 1, prompts, lambda v: [0, 1], engine, reward, smol_tokenizer)
    prefix = hint_prefix(TASK, step_fraction(0.5, 1, 4))
    assert engine.calls == [["Task A:", "Task B:"], ["Task A:" + prefix]]
    assert [p.text for p in got.prompts] == ["Task A:" + prefix, "Task B:"]
    assert got.raw.tolist() == [[1.0, pytest.approx(0.1)], [1.0, 0.0]]
    assert got.all_raw.tolist() == got.raw.tolist()  # the step's groups as trained (the hinted one replaced)
    assert got.hints == {"hint/groups": 1.0, "hint/solved": 1.0, "hint/fraction": 0.375, "hint/chars": len(prefix)}
    assert got.generated_tokens == 2 * 2 * 2 + 2 * 2  # the failed samples were generated too
    assert got.hinted == [0]  # its position in tried: --curriculum pass-rate counts its own pass rate, 0
    # the prefix is prompt: loss mask 0 on it, 1 on the sample's two tokens (and its EOS)
    batch = rollout_batch(smol_tokenizer, [p.text for p in got.prompts], got.samples)
    n = len(smol_tokenizer("Task A:" + prefix)["input_ids"])
    assert batch.loss_mask[0, :n].sum() == 0 and batch.loss_mask[0, n : n + 2].tolist() == [1.0, 1.0]
    # the advantages are the hinted group's own: GRPO of [1, 0.1] is (r - 0.55) / 0.6364 (the unbiased std of two
    # values 0.9 apart: 0.9 / sqrt(2)) = [+0.7071, -0.7071]; the unhinted [0, 0.1] would give the reverse signs
    adv = ADVANTAGES["grpo"](got.raw)
    assert adv[0].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-3)


def test_no_hint_when_every_group_has_a_success():
    prompts = [RLPrompt("Task A:", None, TASK.ground_truth())]
    engine = Engine({"Task A:": ["ok", "x"]}, hinted=["ok", "ok"])
    reward = Reward(lambda ps, cs: [1.0 if c == "ok" else 0.0 for c in cs], "rule")
    cfg = RLConfig(k=2, prompts_per_step=1, hint="solver", max_steps=4)
    got = sample_step(cfg, 0, prompts, lambda v: batch_indices(v, 1, 1, 0), engine, reward)
    assert len(engine.calls) == 1 and got.prompts[0].text == "Task A:" and got.hints["hint/groups"] == 0.0
    assert got.hinted == []


@pytest.mark.parametrize("options,error", [
    ({"hint": "solver", "prompts_data": "x.jsonl", "reward": "uppercase_start"}, "needs Countdown prompts"),
    ({"hint": "solver", "replay_size": 2}, "--replay-size"),
    ({"hint_fraction": 0.3}, "only read with --hint solver"),
    ({"hint": "solver", "hint_fraction": 1.5}, "(0, 1]"),
    ({"hint": "solution", "env": "countdown-calc"}, "one call"),
    ({"hint": "solution", "replay_size": 2, "loss": "ppo"}, "--hint solution with --replay-size"),
])
def test_hint_options_that_cannot_act_are_refused(options, error):
    with pytest.raises(OptionError, match=error.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        RLConfig(**options)


def test_hinted_prompt_needs_a_countdown_truth():
    with pytest.raises(ValueError, match="ground truth"):
        hinted_prompt(RLPrompt("x", None, {"messages": []}), 0.5)


@pytest.mark.parametrize("hint", ["solver", "solution"])
def test_a_run_with_hints_logs_them_and_trains(tiny_model_dir, tmp_path, hint):
    from rlft.checkpoint import read_metrics
    from rlft.recipes.rl import train_rl

    cfg = RLConfig(model=str(tiny_model_dir), preset="tiny", num_train=16, heldout_size=4, prompt_template="short",
                   output_dir=str(tmp_path / "rl"), k=2, prompts_per_step=4, max_steps=2, max_new_tokens=4,
                   micro_batch_size=8, save_every=0, device="cpu", dtype="float32", hint=hint, beta=0.0)
    train_rl(cfg)
    records = [r for r in read_metrics(tmp_path / "rl" / "metrics.jsonl") if "reward/mean" in r]
    # a random model fails every task: every group is hinted, at the step's shrinking fraction
    assert [r["hint/groups"] for r in records] == [4.0, 4.0]
    assert [r["hint/fraction"] for r in records] == [0.5, 0.25] and all(r["hint/chars"] > 0 for r in records)
    assert (tmp_path / "rl" / "model").is_dir()
