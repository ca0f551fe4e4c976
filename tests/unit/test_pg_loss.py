"""rlft.losses.pg (and rlft.losses.advantages): leave-one-out advantages, KL estimators, the REINFORCE / PPO-clip
policy loss, and the ``seq_sum`` reduction of rlft.ops.aggregate. Hand-derived values (maths in the comments), a naive
loop, and gradient properties."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.losses.advantages import rloo_advantages
from rlft.losses.pg import kl_loss, kl_penalty, policy_gradient_loss
from rlft.ops import aggregate

torch.set_num_threads(1)

ATOL = 1e-6


# --------------------------------------------------------------------------- rloo_advantages


def _naive_rloo(rewards: torch.Tensor) -> torch.Tensor:
    B, k = rewards.shape
    out = torch.empty(B, k, dtype=torch.float64)
    for b in range(B):
        for i in range(k):
            others = [float(rewards[b, j]) for j in range(k) if j != i]
            out[b, i] = float(rewards[b, i]) - sum(others) / len(others)
    return out


@pytest.mark.parametrize("shape", [(1, 2), (3, 4), (5, 7)])
def test_rloo_advantages_match_naive_double_loop(shape):
    rewards = torch.rand(shape, generator=torch.Generator().manual_seed(sum(shape)))
    out = rloo_advantages(rewards)
    assert out.shape == shape and out.dtype == rewards.dtype
    assert torch.allclose(out.double(), _naive_rloo(rewards), atol=ATOL)


def test_rloo_advantages_hand_values():
    # [1, 0, 0, 0]: A_0 = 1 - (0+0+0)/3 = 1; A_j = 0 - (1+0+0)/3 = -1/3.
    # [1, 0.1, 0, 0.1]: A_0 = 1 - 0.2/3 = 0.93333; A_1 = 0.1 - 1.1/3 = -0.26667; A_2 = 0 - 1.2/3 = -0.4; A_3 = A_1.
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.1, 0.0, 0.1]])
    expected = torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3], [1 - 0.2 / 3, 0.1 - 1.1 / 3, -0.4, 0.1 - 1.1 / 3]])
    assert torch.allclose(rloo_advantages(rewards), expected, atol=ATOL)
    # k = 2: A = (R_0 - R_1, R_1 - R_0)
    assert torch.allclose(rloo_advantages(torch.tensor([[0.1, 1.0]])), torch.tensor([[-0.9, 0.9]]), atol=ATOL)


def test_rloo_advantages_rows_sum_to_zero():
    rewards = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(rloo_advantages(rewards).sum(dim=1), torch.zeros(4), atol=1e-5)


@pytest.mark.parametrize("value", [0.0, 0.1, 1.0, 0.7123])
def test_equal_rewards_give_exactly_zero_advantages(value):
    rewards = torch.full((3, 5), value)
    assert torch.equal(rloo_advantages(rewards), torch.zeros(3, 5))


def test_rloo_advantages_reject_k_below_two_and_wrong_rank():
    with pytest.raises(ValueError, match="k >= 2"):
        rloo_advantages(torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError, match=r"shape \(B, k\)"):
        rloo_advantages(torch.tensor([1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match=r"shape \(B, k\)"):
        rloo_advantages(torch.zeros(2, 3, 4))


# --------------------------------------------------------------------------- kl_penalty


def test_kl_k1_and_k3_hand_values():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    # k1 = logp - ref = [0.5, -1.0]
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([[0.5, -1.0]]), atol=ATOL)
    # log_r = ref - logp = [-0.5, 1.0]; k3 = exp(log_r) - log_r - 1 = [e^-0.5 - 0.5, e - 2] = [0.106531, 0.718282]
    expected = torch.tensor([[math.exp(-0.5) + 0.5 - 1.0, math.e - 2.0]])
    assert torch.allclose(kl_penalty(logp, ref, "k3"), expected, atol=ATOL)


def test_kl_k3_is_nonnegative_and_zero_when_equal():
    g = torch.Generator().manual_seed(0)
    logp, ref = -3 * torch.rand(4, 9, generator=g), -3 * torch.rand(4, 9, generator=g)
    assert torch.all(kl_penalty(logp, ref, "k3") >= 0)
    assert torch.equal(kl_penalty(logp, logp.clone(), "k3"), torch.zeros(4, 9))
    assert torch.equal(kl_penalty(logp, logp.clone(), "k1"), torch.zeros(4, 9))


def test_kl_unknown_estimator_raises():
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k2")  # type: ignore[arg-type]


def test_kl_loss_hand_value():
    # k1 per token [[0.5, -1.0, (masked) 7.0]]; seq_sum over 2 sequences (second empty): (0.5 - 1.0) / 2 = -0.25
    logp = torch.tensor([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -7.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    loss, metrics = kl_loss(logp, ref, mask, estimator="k1", mode="seq_sum")
    assert loss.item() == pytest.approx(-0.25, abs=ATOL) and metrics == {"loss/kl": pytest.approx(-0.25, abs=ATOL)}


# --------------------------------------------------------------------------- aggregate: seq_sum

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])


def test_aggregate_seq_sum_hand_value():
    # per sequence sums [1, 5 + 6] = [1, 11]; / 2 sequences = 6 (token_mean: 4, seq_mean: 3.25)
    assert torch.allclose(aggregate(VALUES, MASK, "seq_sum"), torch.tensor(6.0), atol=ATOL)
    # with num_sequences=4: 12 / 4 = 3
    assert torch.allclose(aggregate(VALUES, MASK, "seq_sum", num_sequences=4), torch.tensor(3.0), atol=ATOL)


def test_aggregate_seq_sum_over_micro_batches_sums_to_full_batch():
    g = torch.Generator().manual_seed(1)
    values, mask = torch.randn(6, 7, generator=g), (torch.rand(6, 7, generator=g) < 0.6).float()
    full = aggregate(values, mask, "seq_sum")
    parts = [aggregate(values[i : i + 4], mask[i : i + 4], "seq_sum", num_sequences=6) for i in range(0, 6, 4)]
    assert torch.allclose(torch.stack(parts).sum(), full, atol=1e-5)


# --------------------------------------------------------------------------- policy_gradient_loss

# Two sequences: row 0 has 2 target tokens (third is padding), row 1 has 3; advantages A = [2, -1].
LOGP = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -1.0]])
LOSS_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV = torch.tensor([2.0, -1.0])
RATIOS = torch.tensor([[1.5, 0.9, 1.0], [0.7, 1.0, 1.3]])
OLD_LOGP = LOGP - RATIOS.log()  # so that exp(logp - old) == RATIOS


def test_pg_loss_at_ratio_one_hand_values():
    # l_t = -A * 1: row 0 -> [-2, -2] (sum -4), row 1 -> [1, 1, 1] (sum 3)
    # seq_sum = (-4 + 3) / 2 = -0.5; token_mean = (-4 + 3) / 5 = -0.2
    for mode, expected in [("seq_sum", -0.5), ("token_mean", -0.2)]:
        for clip in (None, 0.2):
            loss, metrics = policy_gradient_loss(LOGP, LOGP.clone(), ADV, LOSS_MASK, clip_eps=clip, mode=mode)
            assert loss.item() == pytest.approx(expected, abs=ATOL)
            assert metrics["loss/policy"] == pytest.approx(expected, abs=ATOL)
            assert metrics["pg/clipfrac"] == 0.0
            assert metrics["pg/ratio_mean"] == pytest.approx(1.0, abs=ATOL)


def test_pg_loss_unclipped_hand_values():
    # l_t = -A * r: row 0 -> [-3.0, -1.8] (sum -4.8); row 1 -> [0.7, 1.0, 1.3] (sum 3.0)
    # seq_sum = -1.8 / 2 = -0.9; token_mean = -1.8 / 5 = -0.36
    for mode, expected in [("seq_sum", -0.9), ("token_mean", -0.36)]:
        loss, metrics = policy_gradient_loss(LOGP, OLD_LOGP, ADV, LOSS_MASK, mode=mode)
        assert loss.item() == pytest.approx(expected, abs=1e-5)
        assert metrics["pg/clipfrac"] == 0.0
        # ratio mean over the 5 target tokens: (1.5 + 0.9 + 0.7 + 1.0 + 1.3) / 5 = 1.08
        assert metrics["pg/ratio_mean"] == pytest.approx(1.08, abs=1e-5)


def test_pg_loss_clipped_hand_values():
    # eps = 0.2, l_t = -min(r A, clip(r, 0.8, 1.2) A)
    # row 0 (A = 2):  r=1.5 -> -min(3.0, 2.4) = -2.4 (clipped); r=0.9 -> -min(1.8, 1.8) = -1.8   sum -4.2
    # row 1 (A = -1): r=0.7 -> -min(-0.7, -0.8) = 0.8 (clipped); r=1.0 -> 1.0; r=1.3 -> -min(-1.3, -1.2) = 1.3   sum 3.1
    # seq_sum = (-4.2 + 3.1) / 2 = -0.55; token_mean = -1.1 / 5 = -0.22; clipfrac = 2 / 5 = 0.4
    for mode, expected in [("seq_sum", -0.55), ("token_mean", -0.22)]:
        loss, metrics = policy_gradient_loss(LOGP, OLD_LOGP, ADV, LOSS_MASK, clip_eps=0.2, mode=mode)
        assert loss.item() == pytest.approx(expected, abs=1e-5)
        assert metrics["pg/clipfrac"] == pytest.approx(0.4, abs=ATOL)
        assert metrics["pg/ratio_mean"] == pytest.approx(1.08, abs=1e-5)


def _grad(logp, old, adv, mask, **kwargs) -> torch.Tensor:
    logp = logp.clone().requires_grad_(True)
    loss, _ = policy_gradient_loss(logp, old, adv, mask, **kwargs)
    loss.backward()
    return logp.grad


def test_clipped_gradient_at_ratio_one_equals_reinforce():
    # REINFORCE: d/dlogp_t of -(1/B) sum_b A_b sum_t logp_bt = -A_b / B on target tokens, 0 elsewhere.
    g = torch.Generator().manual_seed(0)
    logp = -2 * torch.rand(3, 5, generator=g)
    mask = (torch.rand(3, 5, generator=g) < 0.7).float()
    adv = torch.tensor([0.9, -0.4, 0.3])
    reinforce = -adv[:, None] * mask / 3
    unclipped = _grad(logp, logp.detach(), adv, mask, mode="seq_sum")
    clipped = _grad(logp, logp.detach(), adv, mask, clip_eps=0.2, mode="seq_sum")
    assert torch.allclose(unclipped, reinforce, atol=ATOL)
    assert torch.allclose(clipped, reinforce, atol=ATOL)


def test_clipping_zeroes_gradient_outside_band_in_advantage_direction():
    grad = _grad(LOGP, OLD_LOGP, ADV, LOSS_MASK, clip_eps=0.2, mode="seq_sum")
    # d l_t / d logp_t = -A r_t / B where unclipped (dr/dlogp = r), 0 where the clipped branch is active:
    # row 0: r=1.5 > 1.2 with A > 0 -> 0; r=0.9 -> -2 * 0.9 / 2 = -0.9
    # row 1: r=0.7 < 0.8 with A < 0 -> 0; r=1.0 -> 1.0 / 2 = 0.5; r=1.3 > 1.2 but A < 0 (not clipped) -> 0.65
    expected = torch.tensor([[0.0, -0.9, 0.0], [0.0, 0.5, 0.65]])
    assert torch.allclose(grad, expected, atol=1e-5)
    # A ratio outside the band *against* the advantage is not clipped: A > 0, r = 0.5 -> gradient -A r / B = -1.0
    logp = torch.tensor([[-1.0]])
    g = _grad(logp, logp - math.log(0.5), torch.tensor([2.0]), torch.ones(1, 1), clip_eps=0.2, mode="seq_sum")
    assert torch.allclose(g, torch.tensor([[-1.0]]), atol=1e-5)


@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("mode", ["seq_sum", "token_mean"])
def test_masked_tokens_get_zero_gradient(clip, mode):
    logp = LOGP.clone()
    logp[0, 2] = -50.0  # a padding position with an extreme value: must not matter
    grad = _grad(logp, OLD_LOGP, ADV, LOSS_MASK, clip_eps=clip, mode=mode)
    assert grad[0, 2] == 0.0
    assert torch.all(grad[LOSS_MASK == 1][[1, 3, 4]] != 0)  # the unclipped target tokens do get gradient


def test_pg_loss_micro_batches_sum_to_full_batch():
    g = torch.Generator().manual_seed(3)
    logp, old = -2 * torch.rand(6, 5, generator=g), -2 * torch.rand(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) < 0.7).float()
    adv = torch.randn(6, generator=g)
    for mode in ("seq_sum", "token_mean"):
        full, _ = policy_gradient_loss(logp, old, adv, mask, clip_eps=0.2, mode=mode)
        parts = [
            policy_gradient_loss(logp[i:i + 4], old[i:i + 4], adv[i:i + 4], mask[i:i + 4], clip_eps=0.2, mode=mode,
                                 num_sequences=6, num_tokens=float(mask.sum()))[0] for i in range(0, 6, 4)
        ]
        assert torch.allclose(sum(parts), full, atol=1e-5)


def test_pg_loss_rejects_misshapen_advantages():
    with pytest.raises(ValueError, match="advantages"):
        policy_gradient_loss(LOGP, LOGP, ADV[:, None], LOSS_MASK)
