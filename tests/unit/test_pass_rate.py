"""Prompts the model half-solves (rlft.rl.pass_rate, --curriculum pass-rate): the signal probability, the groups'
pass rates (hinted groups count 0), the bandit's draw weights and estimates by hand, the saving's metrics by hand,
a bucket the model always solves is drawn less, the solver's rank buckets, the options' checks, and the loop runs
and resumes to the same run with it."""

from __future__ import annotations


import pytest
import torch

from rlft.checkpoint import read_metrics
from rlft.compute import model_parameter_count
from rlft.recipes.rl import train_rl
from rlft.rl.config import RLConfig
from rlft.rl.curriculum import count_rank_buckets
from rlft.rl.pass_rate import FLOOR, PassRateBandit, PassRateSampler, group_pass_rates, signal_probability
from rlft.rl.prompts import RLPrompt
from rlft.rl.records import StepSamples
from rlft.tasks.countdown.traces import solution_rank

from tests.unit.test_curriculum import assert_resumes_to_the_same_run, make_cfg

torch.set_num_threads(1)


def test_signal_probability_by_hand():
    assert signal_probability(0.5, 2) == pytest.approx(0.5)  # HT, TH of HH, HT, TH, TT
    assert signal_probability(0.1, 8) == pytest.approx(1 - 0.1**8 - 0.9**8)  # 0.5695...
    assert signal_probability(0.0, 8) == 0.0 and signal_probability(1.0, 8) == 0.0
    assert signal_probability(0.3, 1) == pytest.approx(0.0)  # one sample never varies
    with pytest.raises(ValueError, match="0 <= p <= 1 and k >= 1"):
        signal_probability(1.5, 4)


def test_group_pass_rates_count_successes_and_hinted_groups_as_zero():
    raw = torch.tensor([[1.0, 0.0, 0.1, 1.0], [0.0, 0.1, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert group_pass_rates(raw) == [0.5, 0.0, 1.0]
    assert group_pass_rates(raw, hinted=[2]) == [0.5, 0.0, 0.0]  # its own samples all failed before the hint


def test_bandit_weights_and_estimates_by_hand():
    fresh = PassRateBandit.fresh([10, 30], k=2)
    assert fresh.probabilities() == pytest.approx([0.25, 0.75])  # alike: the uniform order's share of prompts
    # p = (0, 0.5): weights 10 * FLOOR = 0.5 and 30 * 0.5 = 15
    b = PassRateBandit((0.0, 0.5), (10, 30), k=2)
    assert FLOOR == 0.05
    assert b.probabilities() == pytest.approx([0.5 / 15.5, 15 / 15.5])
    # no signal expected: uniform 0.25 * 1 + 0.75 * 0.5 = 0.625; drawn 0.5/15.5 * 1 + 15/15.5 * 0.5
    assert b.no_signal_share(b.uniform()) == pytest.approx(0.625)
    assert b.no_signal_share(b.probabilities()) == pytest.approx(0.5 / 15.5 + 7.5 / 15.5)
    # estimates: a bucket's first measurement replaces the prior: bucket 0 gets (1.0, 0.5) -> 0.75, bucket 1 none;
    # later ones p <- 0.5 * mean + 0.5 * p: bucket 0 gets 0.25 -> 0.5, bucket 1 its first, 0.1
    after = fresh.update([0, 0], [1.0, 0.5])
    assert after.q == pytest.approx((0.75, 0.5)) and fresh.q == (0.5, 0.5) and after.seen == (True, False)
    assert after.update([0, 1], [0.25, 0.1]).q == pytest.approx((0.5, 0.1))
    measured = PassRateBandit((0.2, 0.4), (1, 1), k=4, alpha=0.25, seen=(True, True))
    assert measured.update([1], [0.0]).q == pytest.approx((0.2, 0.3))
    with pytest.raises(ValueError, match="2 bucket ids for 1 pass rates"):
        fresh.update([0, 1], [0.5])
    with pytest.raises(ValueError, match="estimates must lie in"):
        PassRateBandit((1.5,), (3,), k=2)
    with pytest.raises(ValueError, match="sizes must be > 0"):
        PassRateBandit((0.5,), (0,), k=2)


def step(tried: list[int], raw: list[list[float]], tokens: int, hinted: list[int] | None = None) -> StepSamples:
    """A step's record with what the sampler reads: tried prompts, every group's raw rewards, generated tokens."""
    all_raw = torch.tensor(raw)
    empty = torch.zeros(0, all_raw.shape[1])
    return StepSamples([], [], [], empty, empty, empty, empty, all_raw, tried, [], 0.0, tokens,
                       hinted=hinted or [])


def test_the_saving_by_hand():
    # 2 buckets of 3 prompts, k 2, estimates at the prior 0.5: uniform no-signal share 0.5
    s = PassRateSampler([0, 0, 0, 1, 1, 1], ["a", "b"], batch_size=4, seed=0, k=2, params=10)
    batch = s(0)
    # rates 0.5, 0.5, 0.5, 0: 3 groups with signal; uniform needs 3 / 0.5 = 6 groups: 2 saved
    record = s.learn(step(batch, [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]], tokens=40), torch.zeros(0, 2))
    assert record["curriculum/no_signal_uniform"] == pytest.approx(0.5)
    assert record["curriculum/no_signal_drawn"] == pytest.approx(0.5)
    assert record["curriculum/signal_groups"] == 3.0
    assert record["curriculum/groups_saved"] == pytest.approx(2.0)
    assert record["curriculum/flops_saved"] == pytest.approx(2.0 * 2 * 10 * (40 / 4))  # 2N per token, 10 per group
    assert record["curriculum/p_a"] == pytest.approx(0.5)  # the probabilities the draws used
    rates = [0.5, 0.5, 0.5, 0.0]
    for name, bucket in (("a", 0), ("b", 1)):
        mine = [r for i, r in zip(batch, rates) if (i >= 3) == bucket]
        expected = sum(mine) / len(mine) if mine else 0.5  # a first measurement replaces the prior
        assert record[f"curriculum/q_{name}"] == pytest.approx(expected)


def test_a_bucket_always_solved_is_drawn_less_and_the_draws_are_seeded():
    def run(seed: int) -> tuple[list[list[int]], list[dict]]:
        s = PassRateSampler([0] * 8 + [1] * 8, ["easy", "edge"], batch_size=8, seed=seed, k=4)
        batches, records = [], []
        for v in range(10):
            batch = s(v)
            batches.append(batch)
            raw = [[1.0] * 4 if i < 8 else [1.0, 0.0, 0.0, 1.0] for i in batch]  # easy: always solved; edge: half
            records.append(s.learn(step(batch, raw, tokens=0), torch.zeros(0, 4)))
        return batches, records

    batches, records = run(0)
    assert run(0) == (batches, records) and run(1)[0] != batches
    late = [i for batch in batches[5:] for i in batch]
    assert sum(i >= 8 for i in late) / len(late) > 0.85  # the easy bucket keeps about FLOOR of its weight
    assert records[-1]["curriculum/q_easy"] > 0.95 and records[-1]["curriculum/q_edge"] == pytest.approx(0.5)
    assert records[-1]["curriculum/p_edge"] > 0.9
    assert records[-1]["curriculum/groups_saved"] > 0  # the uniform order would have needed more groups
    assert "curriculum/flops_saved" not in records[-1]  # no parameter count given


def test_solution_rank_and_rank_buckets_by_hand():
    assert solution_rank((3, 5, 7), 22) == 1  # 3*7=21 (closest) is tried first, then 3*5=15, 15+7=22
    assert solution_rank((3, 5, 7), 26) == 0  # 3*7=21, 21+5=26
    assert solution_rank((1, 2), 100) is None
    prompts = [RLPrompt("p", None, {"target": t, "numbers": n}) for t, n in
               [(22, [3, 5, 7]), (26, [3, 5, 7]), (100, [1, 2, 3]), (22, [3, 5, 7])]]
    bucket_of, names = count_rank_buckets(prompts)
    assert names == ["n3_r0", "n3_r1-2", "n3_unsolvable"]
    assert bucket_of == [1, 0, 2, 1]
    with pytest.raises(ValueError, match="count_rank needs Countdown prompts.*prompt 0 has none"):
        count_rank_buckets([RLPrompt("hi", [{"role": "user", "content": "hi"}], {"messages": []})])


def test_options_are_checked():
    RLConfig(curriculum="pass-rate", curriculum_buckets="count_rank", curriculum_alpha=0.3)
    with pytest.raises(ValueError, match="--curriculum-tau is only read with --curriculum sec"):
        RLConfig(curriculum="pass-rate", curriculum_tau=0.5)
    with pytest.raises(ValueError, match="--curriculum-buckets is only read with --curriculum sec or pass-rate"):
        RLConfig(curriculum_buckets="count_rank")
    with pytest.raises(ValueError, match="--curriculum pass-rate buckets Countdown tasks"):
        RLConfig(curriculum="pass-rate", prompts_data="x.jsonl", reward="uppercase_start")


def test_the_loop_runs_with_it_and_resumes_to_the_same_run(tiny_model_dir, tmp_path, monkeypatch):
    cfg = make_cfg(tiny_model_dir, tmp_path / "a", curriculum="pass-rate", curriculum_buckets="count_rank",
                   filter_groups=True, max_prompt_batches=2, save_every=2)
    train_rl(cfg)
    records = read_metrics(tmp_path / "a" / "metrics.jsonl")
    names = sorted(key.removeprefix("curriculum/q_") for key in records[0] if key.startswith("curriculum/q_"))
    assert names and all(n.startswith("n3_") for n in names)
    for r in records:
        assert sum(r[f"curriculum/n_{n}"] for n in names) == r["groups/tried"]  # every batch drawn from it
        per_group = 2 * model_parameter_count(tiny_model_dir) * r["tokens/generated"] / r["groups/tried"]  # 2N/token
        assert r["curriculum/flops_saved"] == pytest.approx(r["curriculum/groups_saved"] * per_group)
        assert 0 <= r["curriculum/signal_groups"] <= r["groups/tried"]
    assert_resumes_to_the_same_run(cfg, records, tmp_path / "b", monkeypatch)
