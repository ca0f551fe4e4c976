"""rlft.losses.topr: TOPR (Roux et al. 2025) -- a hand-derived gradient, REINFORCE when on-policy, the mask,
micro-batches, and its POLICY_LOSSES entry."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlft.losses.pg import CLIPPED_LOSSES, POLICY_LOSSES, make_objective, policy_gradient_loss
from rlft.losses.topr import topr_loss, topr_sequence_weights
from rlft.ops import aggregate

ATOL = 1e-6


def _grad(fn, logp, *args, **kwargs):
    logp = logp.clone().requires_grad_(True)
    loss, metrics = fn(logp, *args, **kwargs)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def _hand_case():
    # 2 sequences x 3 tokens, behaviour log-probs 'old' and current 'logp' = old + per-token log-ratios:
    #   seq 0: A = +0.5, log-ratios (0.2, -0.1, 0.3): sequence ratio e^0.4 = 1.49 -- positive: no ratio, w = 1
    #   seq 1: A = -1.5, log-ratios (-0.4, 0.1, -0.2): sequence ratio e^-0.5 = 0.60653066 < 1 -> w = 0.60653066
    # (per token, seq 1's ratios are 0.670, 1.105, 0.819: a per-token taper would give each token another weight)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
    log_ratio = torch.tensor([[0.2, -0.1, 0.3], [-0.4, 0.1, -0.2]])
    return old + log_ratio, old, torch.tensor([0.5, -1.5]), torch.ones(2, 3)


def test_hand_derived_gradient_seq_sum():
    logp, old, adv, mask = _hand_case()
    w1 = math.exp(-0.5)  # 0.6065306597
    # l_t = -w * A per token (value), gradient -w * A * dlogp_t; seq_sum divides the sum by N = 2:
    #   d loss / d logp[0, t] = -(1 * 0.5) / 2            = -0.25        (each of seq 0's tokens)
    #   d loss / d logp[1, t] = -(0.60653066 * -1.5) / 2  = +0.45489799  (each of seq 1's tokens)
    #   loss = (3 * -0.5 + 3 * 0.90979599) / 2 = 0.61469398
    loss, grad, m = _grad(topr_loss, logp, old, adv, mask, mode="seq_sum")
    expected = torch.tensor([[-0.25] * 3, [w1 * 1.5 / 2] * 3])
    assert torch.allclose(grad, expected, atol=ATOL)
    assert loss.item() == pytest.approx((3 * -0.5 + 3 * w1 * 1.5) / 2, abs=ATOL)
    assert m["pg/topr_truncated_frac"] == 1.0  # the one negative sample is truncated
    assert m["pg/topr_weight_mean"] == pytest.approx(w1, abs=ATOL)
    assert m["pg/clipfrac"] == pytest.approx(0.5)  # its 3 of the 6 target tokens
    assert m["pg/ratio_mean"] == pytest.approx(torch.exp(logp - old).mean().item(), abs=ATOL)


def test_hand_derived_gradient_token_mean():
    logp, old, adv, mask = _hand_case()
    w1 = math.exp(-0.5)
    # token_mean over the 6 target tokens: -0.5 / 6 = -0.0833333 on seq 0, 0.90979599 / 6 = 0.15163266 on seq 1
    _, grad, _ = _grad(topr_loss, logp, old, adv, mask, mode="token_mean")
    assert torch.allclose(grad, torch.tensor([[-0.5 / 6] * 3, [w1 * 1.5 / 6] * 3]), atol=ATOL)


def test_negative_sample_more_likely_than_under_the_sampler_has_weight_one():
    # A < 0 with sequence ratio e^0.3 > 1: truncated to 1, the REINFORCE gradient -A / N = +2 / 1 on each token
    old = torch.tensor([[-1.0, -1.0]])
    logp = old + torch.tensor([[0.1, 0.2]])
    _, grad, m = _grad(topr_loss, logp, old, torch.tensor([-2.0]), torch.ones(1, 2), mode="seq_sum")
    assert torch.allclose(grad, torch.tensor([[2.0, 2.0]]), atol=ATOL)
    assert m["pg/topr_truncated_frac"] == 0.0 and m["pg/topr_weight_mean"] == 1.0 and m["pg/clipfrac"] == 0.0


def test_sequence_weights_far_off_policy_do_not_overflow():
    # log-ratio +200 (exp overflows to inf) and -200 (underflows to 0); -inf off the mask is never read
    logp = torch.tensor([[100.0, 100.0, float("-inf")], [-100.0, -100.0, float("-inf")]])
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    w, log_ratio = topr_sequence_weights(logp, old, torch.tensor([-1.0, -1.0]), mask)
    assert torch.equal(w, torch.tensor([1.0, 0.0])) and torch.equal(log_ratio, torch.tensor([200.0, -200.0]))
    _, grad, _ = _grad(topr_loss, logp, old, torch.tensor([-1.0, -1.0]), mask, mode="seq_sum")
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("mode", ["seq_sum", "seq_mean", "token_mean"])
def test_equals_reinforce_on_policy(mode):
    torch.manual_seed(0)
    logp = -torch.rand(4, 5) * 3
    mask = torch.tensor([[1.0] * 5, [1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    adv = torch.tensor([1.3, -0.4, 0.0, -2.1])
    loss_t, grad_t, m = _grad(topr_loss, logp, logp, adv, mask, mode=mode)
    loss_r, grad_r, _ = _grad(policy_gradient_loss, logp, logp, adv, mask, mode=mode)
    assert loss_t.item() == pytest.approx(loss_r.item(), abs=ATOL)
    assert torch.allclose(grad_t, grad_r, atol=ATOL)
    assert m["pg/topr_truncated_frac"] == 0.0 and m["pg/topr_weight_mean"] == 1.0 and m["pg/ratio_mean"] == 1.0


@pytest.mark.parametrize("mode", ["seq_sum", "seq_mean", "token_mean"])
def test_zero_gradient_where_mask_is_zero(mode):
    logp, old, adv, _ = _hand_case()
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    garbage = logp.clone()
    garbage[0, 2] += 50.0
    garbage[1, 0] -= 50.0  # off the mask: must change neither the weights nor the loss
    loss_a, grad_a, _ = _grad(topr_loss, logp, old, adv, mask, mode=mode)
    loss_b, grad_b, _ = _grad(topr_loss, garbage, old, adv, mask, mode=mode)
    assert grad_b[0, 2] == 0.0 and grad_b[1, 0] == 0.0
    assert loss_a.item() == pytest.approx(loss_b.item(), abs=ATOL) and torch.allclose(grad_a, grad_b, atol=ATOL)


@pytest.mark.parametrize("mode", ["seq_sum", "seq_mean", "token_mean"])
def test_micro_batches_sum_to_the_whole_batch(mode):
    torch.manual_seed(1)
    old = -torch.rand(6, 4) * 2
    logp = old + 0.3 * torch.randn(6, 4)
    mask = (torch.rand(6, 4) > 0.3).float()
    mask[:, 0] = 1.0
    adv = torch.tensor([0.7, -1.1, -0.2, 0.0, 1.5, -0.9])
    loss_all, grad_all, _ = _grad(topr_loss, logp, old, adv, mask, mode=mode)
    n_seq, n_tok = 6, float(mask.sum())
    leaf = logp.clone().requires_grad_(True)
    total = sum(
        topr_loss(leaf[rows], old[rows], adv[rows], mask[rows], mode=mode, num_sequences=n_seq, num_tokens=n_tok)[0]
        for rows in (slice(0, 3), slice(3, 6)))
    total.backward()
    assert total.item() == pytest.approx(loss_all.item(), abs=ATOL)
    assert torch.allclose(leaf.grad, grad_all, atol=ATOL)


def test_token_weights_multiply_each_token():
    logp, old, adv, mask = _hand_case()
    tw = torch.tensor([[1.0, 0.5, 2.0], [0.0, 1.0, 3.0]])
    _, grad, _ = _grad(topr_loss, logp, old, adv, mask, mode="sum", token_weights=tw)
    _, grad_plain, _ = _grad(topr_loss, logp, old, adv, mask, mode="sum")
    assert torch.allclose(grad, grad_plain * tw, atol=ATOL)


def test_rejects_a_clip_range_and_misshapen_advantages():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="no clip range"):
        topr_loss(z, z, torch.ones(2), torch.ones(2, 3), clip_low=0.2)
    with pytest.raises(ValueError, match=r"shape \(B,\)"):
        topr_loss(z, z, torch.ones(2, 1), torch.ones(2, 3))


def test_registry_entry_and_objective():
    assert POLICY_LOSSES[
        "topr"].fn is topr_loss and not POLICY_LOSSES["topr"].clips and not POLICY_LOSSES["topr"].selects
    assert "topr" not in CLIPPED_LOSSES
    cfg = SimpleNamespace(loss="topr", loss_mode="seq_mean", clip_low=0.2, clip_high=0.28, beta=0.0, kl_mode="reward",
                          kl_estimator="k1", entropy_coef=0.0, is_correction="none", is_cap=3.0, positive_weight=1.0)
    objective = make_objective(cfg, cfg, cfg)  # the policy-loss, KL and importance blocks' fields
    assert objective.loss_fn is topr_loss and objective.clip_low is None and objective.clip_high is None
    logp, old, adv, mask = _hand_case()
    loss, metrics = objective.loss(logp, old, objective.weights(adv), mask, num_sequences=2, num_tokens=6)
    # seq_mean: per-sequence mean of -w * A, summed over sequences / 2
    expected = aggregate(torch.tensor([[-0.5] * 3, [math.exp(-0.5) * 1.5] * 3]), mask, "seq_mean", num_sequences=2)
    assert loss.item() == pytest.approx(expected.item(), abs=ATOL) and "pg/topr_weight_mean" in metrics
