"""The curriculum prompt sampler (rlft.rl.curriculum, --curriculum sec): SEC's bandit by hand (softmax, TD(0)
update), a bucket with high |advantage| is drawn more, draws are seeded, buckets are emptied without
replacement, the state resumes from metrics.jsonl; the loop runs and resumes with it, and --curriculum none is
today's seeded order."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import rlft.rollout.hf as rollout_hf
from rlft.checkpoint import latest_checkpoint, read_metrics
from rlft.models import load_tokenizer
from rlft.recipes.common import batch_indices
from rlft.recipes.rl import train_rl
from rlft.rl.config import RLConfig
from rlft.rl.curriculum import CurriculumSampler, SECBandit, count_target_buckets, group_abs_advantages
from rlft.rl.prompts import RLPrompt, load_prompts
from rlft.rollout.hf import HFEngine

from tests.conftest import interrupt_after_checkpoints

torch.set_num_threads(1)


# --------------------------------------------------------------------------- the bandit by hand


def test_softmax_by_hand():
    assert SECBandit.fresh(4).probabilities() == [0.25] * 4  # all values 0: uniform
    # q = (0, ln 2): weights (1, 2) -> (1/3, 2/3); at tau 0.5 the weights are (1, 4) -> (1/5, 4/5)
    p = SECBandit((0.0, math.log(2.0)), tau=1.0).probabilities()
    assert p == pytest.approx([1 / 3, 2 / 3], abs=1e-12)
    assert SECBandit((0.0, math.log(2.0)), tau=0.5).probabilities() == pytest.approx([0.2, 0.8], abs=1e-12)
    # large values do not overflow (the softmax is shifted by the max)
    assert SECBandit((1000.0, 1000.0 + math.log(3.0))).probabilities() == pytest.approx([0.25, 0.75], abs=1e-12)


def test_td0_update_by_hand():
    bandit = SECBandit.fresh(3, alpha=0.5)
    # bucket 0 gets two groups (|A| 0.4 and 0.8: r = 0.6), bucket 2 one (1.0), bucket 1 none
    after = bandit.update([0, 0, 2], [0.4, 0.8, 1.0])
    assert after.q == pytest.approx((0.5 * 0.6, 0.0, 0.5 * 1.0), abs=1e-15)
    assert bandit.q == (0.0, 0.0, 0.0)  # immutable: the old bandit is unchanged
    again = after.update([0], [0.0])  # Q <- 0.5 * 0 + 0.5 * 0.3
    assert again.q == pytest.approx((0.15, 0.0, 0.5), abs=1e-15)
    assert SECBandit((1.0, 2.0), alpha=0.25).update([1], [0.0]).q == pytest.approx((1.0, 1.5), abs=1e-15)
    with pytest.raises(ValueError, match="2 bucket ids for 1 advantage means"):
        bandit.update([0, 1], [0.5])
    with pytest.raises(ValueError, match="bucket id 3 out of range"):
        bandit.update([3], [0.5])
    with pytest.raises(ValueError, match="tau must be > 0"):
        SECBandit.fresh(2, tau=0.0)
    with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\]"):
        SECBandit.fresh(2, alpha=1.5)


def test_a_bucket_with_high_advantage_is_drawn_more():
    bandit = SECBandit.fresh(3, tau=0.5, alpha=0.5)
    for _ in range(5):  # bucket 2 keeps giving |A| = 1, the others 0.1
        bandit = bandit.update([0, 1, 2], [0.1, 0.1, 1.0])
    p = bandit.probabilities()
    assert p[2] > 0.7 and p[0] == pytest.approx(p[1])
    draws = bandit.draw(3000, torch.Generator().manual_seed(0))
    shares = [draws.count(b) / 3000 for b in range(3)]
    assert shares[2] > 0.65 and shares[2] == pytest.approx(p[2], abs=0.03)


def test_draws_are_seeded():
    bandit = SECBandit((0.0, 0.5, 1.0))
    a = bandit.draw(50, torch.Generator().manual_seed(3))
    assert a == bandit.draw(50,
                            torch.Generator().manual_seed(3)) and a != bandit.draw(50,
                                                                                   torch.Generator().manual_seed(4))
    assert bandit.draw(0, torch.Generator()) == []


# --------------------------------------------------------------------------- buckets and the sampler


def countdown_prompt(nums: list[int], target: int) -> RLPrompt:
    return RLPrompt(f"{nums}->{target}", None, {"target": target, "numbers": nums})


def test_count_target_buckets():
    prompts = [countdown_prompt([1, 2, 3], 12), countdown_prompt([1, 2, 3, 4], 50), countdown_prompt([5, 6, 7], 39),
               countdown_prompt([5, 6, 7], 40), countdown_prompt([1, 2, 3], 100), countdown_prompt([1, 2], 5),
               countdown_prompt([1, 2, 3], 120)]
    bucket_of, names = count_target_buckets(prompts)
    assert names == ["n2_t10-39", "n3_t10-39", "n3_t40-69", "n3_t70-100", "n4_t40-69"]
    assert [names[b] for b in bucket_of
            ] == ["n3_t10-39", "n4_t40-69", "n3_t10-39", "n3_t40-69", "n3_t70-100", "n2_t10-39", "n3_t70-100"]
    with pytest.raises(ValueError, match="count_target needs Countdown prompts.*prompt 1 has none"):
        count_target_buckets([prompts[0], RLPrompt("hi", [{"role": "user", "content": "hi"}], {"messages": []})])


def sampler(batch_size: int = 4, seed: int = 0, **kwargs) -> CurriculumSampler:
    # 3 buckets of 5, 3 and 8 prompts
    bucket_of = [0] * 5 + [1] * 3 + [2] * 8
    return CurriculumSampler(bucket_of, ["a", "b", "c"], batch_size, seed, **kwargs)


def test_a_bucket_gives_its_prompts_without_replacement_in_a_seeded_order():
    s = CurriculumSampler([0] * 6, ["only"], batch_size=4, seed=2)
    first, second, third = s(0), s(1), s(2)
    assert sorted(first + second[:2]) == list(range(6))  # one pass: every prompt once
    assert sorted(second[2:] + third) == list(range(6))  # the next pass: a new permutation
    again = CurriculumSampler([0] * 6, ["only"], batch_size=4, seed=2)
    assert again(0) == first and again(1) == second  # seeded
    other = CurriculumSampler([0] * 6, ["only"], batch_size=4, seed=3)
    assert [other(v) for v in range(3)] != [first, second, third]


def test_the_sampler_follows_advantage_and_is_deterministic():
    def run(seed: int) -> tuple[list[list[int]], list[dict]]:
        s = sampler(batch_size=6, seed=seed, tau=0.5)
        batches, records = [], []
        for step in range(12):
            batch = s(step)
            batches.append(batch)
            # bucket c (prompts 8..15) gives |A| = 1, the others 0.05
            records.append(s.update(batch, [1.0 if i >= 8 else 0.05 for i in batch]))
        return batches, records

    batches, records = run(0)
    assert run(0) == (batches, records)  # deterministic under a seed
    assert run(1)[0] != batches
    late = [i for batch in batches[6:] for i in batch]
    assert sum(i >= 8 for i in late) / len(late) > 0.7  # bucket c is drawn more once its value grew
    assert records[0]["curriculum/p_a"] == pytest.approx(1 / 3) and records[-1]["curriculum/p_c"] > 0.7
    for r in records:
        assert sum(r[f"curriculum/p_{n}"] for n in "abc") == pytest.approx(1.0)
        assert sum(r[f"curriculum/n_{n}"] for n in "abc") == 6
    assert records[-1]["curriculum/q_c"] > records[-1]["curriculum/q_a"]


def test_the_sampler_resumes_from_its_logged_steps():
    full = sampler(seed=5)
    history, batches = [{"step": 0, "eval/score": 0.1}], []  # a step-0 evaluation record has no curriculum metrics
    for step in range(6):
        batch = full(step)
        batches.append(batch)
        history.append({"step": step + 1, **full.update(batch, [0.1 * (i % 4) for i in batch])})
    resumed = sampler(seed=5)
    resumed.restore(history[:4])  # steps 0..3 logged: continue at step 3
    for step in range(3, 6):
        batch = resumed(step)
        assert batch == batches[step]
        assert {"step": step + 1, **resumed.update(batch, [0.1 * (i % 4) for i in batch])} == history[step + 1]
    with pytest.raises(ValueError, match="logged curriculum buckets"):
        CurriculumSampler([0, 1], ["x", "y"], 2, 5).restore(history)


def test_group_abs_advantages_count_dropped_groups_as_zero():
    advantages = torch.tensor([[1.0, -1.0, 0.5, -0.5], [0.0, 0.0, 2.0, -2.0]])
    assert group_abs_advantages(advantages, [1, 3], 4) == [0.0, 0.75, 0.0, 1.0]
    assert group_abs_advantages(torch.zeros(0, 4), [], 3) == [0.0, 0.0, 0.0]


def test_curriculum_options_are_validated():
    with pytest.raises(ValueError, match="--curriculum-tau must be > 0"):
        RLConfig(curriculum="sec", curriculum_tau=0.0)
    with pytest.raises(ValueError, match=r"--curriculum-alpha must lie in \(0, 1\]"):
        RLConfig(curriculum="sec", curriculum_alpha=0.0)
    with pytest.raises(ValueError, match="chat prompts"):
        RLConfig(curriculum="sec", prompts_data="x.jsonl", reward="uppercase_start")
    with pytest.raises(ValueError, match="--curriculum: expected one of 'none', 'sec'"):
        RLConfig(curriculum="spl")


# --------------------------------------------------------------------------- the loop


def make_cfg(model_dir: Path, output_dir: Path, **overrides) -> RLConfig:
    cfg = RLConfig(model=str(model_dir), reward="uppercase_start", preset="medium3", num_train=60, heldout_size=8,
                   prompt_template="short", output_dir=str(output_dir), advantage="grpo", k=4, prompts_per_step=4,
                   max_steps=4, lr=5e-2, beta=0.0, max_new_tokens=1, micro_batch_size=8, save_every=0, device="cpu",
                   dtype="float32")
    return replace(cfg, **overrides)


class RecordingEngine(HFEngine):
    """The HF engine, recording the prompts of every sampling call (temperature > 0)."""

    calls: list[list[str]] = []

    def generate(self, prompts, params):
        if params.temperature > 0:
            RecordingEngine.calls.append(list(prompts))
        return super().generate(prompts, params)


def test_no_curriculum_is_the_seeded_order(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(rollout_hf, "HFEngine", RecordingEngine)  # what make_engine builds
    RecordingEngine.calls = []
    cfg = make_cfg(tiny_model_dir, tmp_path / "u", max_steps=3)
    train_rl(cfg)
    prompts, _, _ = load_prompts(cfg, load_tokenizer(str(tiny_model_dir)))
    assert RecordingEngine.calls == [
        [prompts[i].text for i in batch_indices(s, len(prompts), 4, cfg.seed)] for s in range(3)
    ]
    assert not any(key.startswith("curriculum/") for r in read_metrics(tmp_path / "u" / "metrics.jsonl") for key in r)


def test_sec_runs_with_group_filtering_and_resumes_to_the_same_run(tiny_model_dir, tmp_path, monkeypatch):
    cfg = make_cfg(tiny_model_dir, tmp_path / "a", curriculum="sec", filter_groups=True, max_prompt_batches=2,
                   save_every=2)
    train_rl(cfg)
    records = read_metrics(tmp_path / "a" / "metrics.jsonl")
    names = sorted(key.removeprefix("curriculum/q_") for key in records[0] if key.startswith("curriculum/q_"))
    assert names and all(n.startswith("n3_t") for n in names)  # medium3: three numbers, targets 10-75
    for r in records:
        assert sum(r[f"curriculum/p_{n}"] for n in names) == pytest.approx(1.0)
        assert sum(r[f"curriculum/n_{n}"] for n in names) == r["groups/tried"]  # every batch drawn from the bandit
    assert records[0]["curriculum/p_" + names[0]] == pytest.approx(1 / len(names))  # values start at 0
    assert any(r[f"curriculum/q_{n}"] > 0 for r in records for n in names)

    assert_resumes_to_the_same_run(cfg, records, tmp_path / "b", monkeypatch)


def assert_resumes_to_the_same_run(cfg: RLConfig, records: list[dict], output_dir: Path, monkeypatch) -> None:
    """``cfg`` (4 steps, a checkpoint every 2) run again in ``output_dir``, interrupted after its step-2 checkpoint,
    then resumed, logs the curriculum, reward, group and loss metrics of ``records`` (the uninterrupted run's)."""
    with monkeypatch.context() as mp:
        interrupt_after_checkpoints(mp, 1)
        with pytest.raises(KeyboardInterrupt):
            train_rl(replace(cfg, output_dir=str(output_dir)))
    assert latest_checkpoint(output_dir).name == "step-00000002"
    train_rl(replace(cfg, output_dir=str(output_dir), resume=True))
    resumed = read_metrics(output_dir / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for ra, rb in zip(records, resumed):
        for key in ra:
            if key.startswith(("curriculum/", "reward/", "groups/", "loss/")):
                assert rb[key] == pytest.approx(ra[key], abs=1e-6), (ra["step"], key)
