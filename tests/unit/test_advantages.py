"""rlft.losses.advantages: hand-derived values (maths in the comments), naive loops, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.losses.advantages import ADVANTAGES, grpo_advantages, raft_advantages, reinforce_advantages, rloo_advantages

ATOL = 1e-6
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.1, 0.0, 0.1], [0.1, 0.1, 0.1, 0.1]])


def test_grpo_group_scale_hand_values():
    # Row [1, 0, 0, 0]: mean 0.25; unbiased std = sqrt((0.75^2 + 3 * 0.25^2) / 3) = sqrt(0.75 / 3) = 0.5.
    #   A = (0.75, -0.25, -0.25, -0.25) / 0.5 = (1.5, -0.5, -0.5, -0.5)   (eps 0 here)
    # Row [1, .1, 0, .1]: mean 0.3; deviations (0.7, -0.2, -0.3, -0.2); sum of squares 0.49 + 0.04 + 0.09 + 0.04 = 0.66;
    #   std = sqrt(0.66 / 3) = sqrt(0.22)
    # Row of equal rewards: numerator 0 -> exactly 0.
    out = grpo_advantages(REWARDS, "group", eps=0.0 + 1e-12)
    s = math.sqrt(0.22)
    expected = torch.tensor([[1.5, -0.5, -0.5, -0.5], [0.7 / s, -0.2 / s, -0.3 / s, -0.2 / s], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.equal(out[2], torch.zeros(4))


def test_grpo_eps_is_added_to_the_std():
    out = grpo_advantages(torch.tensor([[1.0, 0.0]]), "group", eps=0.5)
    # mean 0.5, unbiased std of (1, 0) = sqrt(0.5); A = +-0.5 / (sqrt(0.5) + 0.5)
    assert torch.allclose(out, torch.tensor([[0.5, -0.5]]) / (math.sqrt(0.5) + 0.5), atol=ATOL)


def test_grpo_batch_scale_uses_one_std_for_the_whole_batch():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    # centred: (0.5, -0.5), (0, 0); std of all four rewards (1, 0, 0, 0), unbiased: 0.5
    out = grpo_advantages(rewards, "batch", eps=0.0)
    assert torch.allclose(out, torch.tensor([[1.0, -1.0], [0.0, 0.0]]), atol=ATOL)


def test_dr_grpo_is_the_centred_reward():
    out = grpo_advantages(REWARDS, None)
    assert torch.allclose(out, REWARDS - REWARDS.mean(dim=1, keepdim=True), atol=ATOL)
    assert torch.allclose(out[0], torch.tensor([0.75, -0.25, -0.25, -0.25]), atol=ATOL)


def test_grpo_matches_a_naive_loop():
    rewards = torch.rand(5, 6, generator=torch.Generator().manual_seed(3))
    out = grpo_advantages(rewards, "group", eps=1e-6)
    for b in range(5):
        row = [float(x) for x in rewards[b]]
        mean = sum(row) / len(row)
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (len(row) - 1))
        for i, x in enumerate(row):
            assert float(out[b, i]) == pytest.approx((x - mean) / (std + 1e-6), abs=1e-5)


def test_rloo_is_a_rescaled_dr_grpo():
    # A_rloo = k / (k - 1) * (R - mean)
    k = REWARDS.shape[1]
    assert torch.allclose(rloo_advantages(REWARDS), k / (k - 1) * grpo_advantages(REWARDS, None), atol=ATOL)


def test_raft_selects_each_groups_best_unless_all_equal():
    out = raft_advantages(REWARDS)
    assert torch.equal(out, torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [0.0, 0, 0, 0]]))
    ties = raft_advantages(torch.tensor([[0.1, 0.1, 0.0]]))
    assert torch.equal(ties, torch.tensor([[1.0, 1.0, 0.0]]))  # both best samples are kept


def test_raft_threshold_selects_correct_samples():
    out = raft_advantages(torch.tensor([[1.0, 0.1, 1.0], [0.0, 0.1, 0.1]]), threshold=1.0)
    assert torch.equal(out, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))


def test_reinforce_is_the_reward_and_a_copy():
    out = reinforce_advantages(REWARDS)
    assert torch.equal(out, REWARDS) and out.data_ptr() != REWARDS.data_ptr()


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_registry_entries_keep_the_shape_and_zero_out_constant_groups(name):
    out = ADVANTAGES[name](REWARDS)
    assert out.shape == REWARDS.shape
    if name != "reinforce":  # every baseline estimator gives an all-equal group exactly 0
        assert torch.equal(out[2], torch.zeros(4))


@pytest.mark.parametrize("scale", ["group", "batch", None])
@pytest.mark.parametrize("value", [0.1, 0.7, 1 / 3])
@pytest.mark.parametrize("k", [4, 8, 16])
def test_all_equal_group_gets_exactly_zero_whatever_the_reward(k, value, scale):
    # The float mean of k equal values can be off by one rounding (8 x 0.1 -> 0.10000001); divided by a
    # near-zero std, that residual used to become a visible advantage (-0.0074 for k=8 at 0.1, +0.056 at 0.7).
    equal = torch.full((1, k), value)
    assert torch.equal(grpo_advantages(equal, scale), torch.zeros(1, k))
    assert torch.equal(rloo_advantages(equal), torch.zeros(1, k))
    # beside a varied group: the equal row is exactly 0, the varied row is the formula's value, bit for bit
    varied = torch.linspace(0.0, 1.0, k) ** 2
    mixed = torch.stack([torch.full((k,), value), varied, torch.full((k,), value)])
    out = grpo_advantages(mixed, scale)
    assert torch.equal(out[0], torch.zeros(k)) and torch.equal(out[2], torch.zeros(k))
    centred = varied - varied.mean()
    std = {"group": varied.std(), "batch": mixed.std(), None: None}[scale]
    assert torch.equal(out[1], centred if scale is None else centred / (std + 1e-6))
    assert not torch.equal(out[1], torch.zeros(k))


def test_varied_groups_are_unchanged_by_the_all_equal_rule():
    rewards = torch.rand(6, 8, generator=torch.Generator().manual_seed(1))
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    assert torch.equal(grpo_advantages(rewards, None), centred)
    assert torch.equal(grpo_advantages(rewards, "group"), centred / (rewards.std(dim=1, keepdim=True) + 1e-6))
    assert torch.equal(grpo_advantages(rewards, "batch"), centred / (rewards.std() + 1e-6))


def test_errors():
    with pytest.raises(ValueError, match=r"shape \(B, k\)"):
        grpo_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="k >= 2"):
        grpo_advantages(torch.zeros(3, 1), "group")
    with pytest.raises(ValueError, match="unknown GRPO scale"):
        grpo_advantages(torch.zeros(2, 2), "sequence")
    with pytest.raises(ValueError, match="k >= 2"):
        rloo_advantages(torch.zeros(2, 1))
