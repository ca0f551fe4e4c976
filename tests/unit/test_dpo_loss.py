"""dpo_loss / ipo_loss / rpo_loss: hand-derived values, the log 2 identity, gradient directions, metrics.

Hand-made batch of two pairs (beta = 0.5):

    pair 0: pi_c = -1.0, pi_r = -2.0, ref_c = -1.5, ref_r = -1.8
            h = (-1.0 + 1.5) - (-2.0 + 1.8) = 0.5 + 0.2 = 0.7,   beta*h = 0.35
    pair 1: pi_c = -3.0, pi_r = -1.5, ref_c = -2.0, ref_r = -2.5
            h = (-3.0 + 2.0) - (-1.5 + 2.5) = -1.0 - 1.0 = -2.0, beta*h = -1.0

    -log sigmoid(x) = log(1 + exp(-x)):
      -log sig(0.35) = log(1.7046881) = 0.5333822    -log sig(-0.35) = log(2.4190675) = 0.8833822
      -log sig(-1.0) = log(3.7182818) = 1.3132617    -log sig(1.0)   = log(1.3678794) = 0.3132617

    DPO, eps = 0:   (0.5333822 + 1.3132617) / 2                                   = 0.9233219
    DPO, eps = 0.2: (0.8*0.5333822 + 0.2*0.8833822 + 0.8*1.3132617 + 0.2*0.3132617) / 2
                  = (0.6033822 + 1.1132617) / 2                                    = 0.8583219
    IPO: target 1/(2 beta) = 1;  ((0.7 - 1)^2 + (-2 - 1)^2) / 2 = (0.09 + 9) / 2    = 4.545

    implicit rewards beta*(pi - ref): chosen [0.25, -0.5] (mean -0.125), rejected [-0.1, 0.5] (mean 0.2)
    accuracy: 0.25 > -0.1 yes, -0.5 > 0.5 no -> 0.5;  margin mean(0.35, -1.0) = -0.325
    logps/chosen mean(-1, -3) = -2.0;  logps/rejected mean(-2, -1.5) = -1.75
"""

from __future__ import annotations

import math

import pytest
import torch

from rlft.losses import PREFERENCE_LOSSES, dpo_loss, ipo_loss, rpo_loss

torch.set_num_threads(1)

BETA = 0.5


def inputs(requires_grad: bool = False):
    pc = torch.tensor([-1.0, -3.0], requires_grad=requires_grad)
    pr = torch.tensor([-2.0, -1.5], requires_grad=requires_grad)
    rc = torch.tensor([-1.5, -2.0])
    rr = torch.tensor([-1.8, -2.5])
    return pc, pr, rc, rr


def test_dpo_closed_form_without_label_smoothing():
    loss, metrics = dpo_loss(*inputs(), beta=BETA)
    assert loss.item() == pytest.approx(0.9233219, abs=1e-6)
    assert metrics["loss/dpo"] == pytest.approx(0.9233219, abs=1e-6)


def test_dpo_closed_form_with_label_smoothing():
    loss, metrics = dpo_loss(*inputs(), beta=BETA, label_smoothing=0.2)
    assert loss.item() == pytest.approx(0.8583219, abs=1e-6)
    assert metrics["loss/dpo"] == pytest.approx(0.8583219, abs=1e-6)


def test_dpo_matches_formula_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-10 * torch.rand(16, generator=g) for _ in range(4))
    beta, eps = 0.3, 0.1
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=beta, label_smoothing=eps)
    expected = 0.0
    for i in range(16):  # naive per-pair loop in float64
        x = beta * ((pc[i].item() - rc[i].item()) - (pr[i].item() - rr[i].item()))
        expected += (1 - eps) * math.log1p(math.exp(-x)) + eps * math.log1p(math.exp(x))
    assert loss.item() == pytest.approx(expected / 16, abs=1e-6)


def test_metrics_hand_checked():
    _, metrics = dpo_loss(*inputs(), beta=BETA)
    assert metrics["rewards/chosen"] == pytest.approx(-0.125, abs=1e-6)
    assert metrics["rewards/rejected"] == pytest.approx(0.2, abs=1e-6)
    assert metrics["rewards/accuracy"] == 0.5
    assert metrics["rewards/margin"] == pytest.approx(-0.325, abs=1e-6)
    assert metrics["logps/chosen"] == pytest.approx(-2.0, abs=1e-6)
    assert metrics["logps/rejected"] == pytest.approx(-1.75, abs=1e-6)
    assert all(type(v) is float for v in metrics.values())


def test_accuracy_is_strict():
    # h = 0: chosen reward equals rejected reward, which is not "chosen preferred".
    z = torch.zeros(3)
    _, metrics = dpo_loss(z, z, z, z)
    assert metrics["rewards/accuracy"] == 0.0


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.5])
def test_policy_equal_to_reference_gives_log_2(label_smoothing):
    logps = torch.tensor([-12.5, -3.25, -40.0])
    other = torch.tensor([-7.0, -1.0, -90.5])
    loss, metrics = dpo_loss(logps, other, logps.clone(), other.clone(), beta=0.1, label_smoothing=label_smoothing)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
    assert metrics["rewards/margin"] == 0.0 and metrics["rewards/chosen"] == 0.0


def test_gradient_raises_chosen_and_lowers_rejected():
    pc, pr, rc, rr = inputs(requires_grad=True)
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=BETA)
    loss.backward()
    assert torch.all(pc.grad < 0), pc.grad  # descending the loss raises log pi(chosen)
    assert torch.all(pr.grad > 0), pr.grad  # ... and lowers log pi(rejected)
    # d loss / d pi_c = -beta * sigmoid(-beta h) / B, hand values for h = 0.7 and -2.0
    expected = torch.tensor([-BETA * (1 / (1 + math.exp(0.35))) / 2, -BETA * (1 / (1 + math.exp(-1.0))) / 2])
    assert torch.allclose(pc.grad, expected, atol=1e-6)
    assert torch.allclose(pr.grad, -expected, atol=1e-6)
    # one gradient step increases the margin
    _, before = dpo_loss(pc.detach(), pr.detach(), rc, rr, beta=BETA)
    _, after = dpo_loss(pc.detach() - 0.1 * pc.grad, pr.detach() - 0.1 * pr.grad, rc, rr, beta=BETA)
    assert after["rewards/margin"] > before["rewards/margin"]


def test_conservative_dpo_has_finite_optimum():
    # With eps > 0 the loss is minimised where sigmoid(beta h) = 1 - eps, i.e. beta h = log((1-eps)/eps).
    eps, beta = 0.2, 0.5
    h_star = math.log((1 - eps) / eps) / beta
    pc = torch.tensor([h_star], requires_grad=True)
    zero = torch.zeros(1)
    dpo_loss(pc, zero, zero, zero, beta=beta, label_smoothing=eps)[0].backward()
    assert abs(pc.grad.item()) < 1e-6
    pc_far = torch.tensor([2 * h_star], requires_grad=True)
    dpo_loss(pc_far, zero, zero, zero, beta=beta, label_smoothing=eps)[0].backward()
    assert pc_far.grad.item() > 0  # beyond the optimum it pushes the margin back down


def test_ipo_closed_form_and_optimum():
    loss, metrics = ipo_loss(*inputs(), beta=BETA)
    assert loss.item() == pytest.approx(4.545, abs=1e-5)
    assert metrics["loss/ipo"] == pytest.approx(4.545, abs=1e-5)
    assert metrics["rewards/accuracy"] == 0.5
    # zero gradient at h = 1 / (2 beta)
    pc = torch.tensor([1 / (2 * BETA)], requires_grad=True)
    zero = torch.zeros(1)
    ipo_loss(pc, zero, zero, zero, beta=BETA)[0].backward()
    assert pc.grad.item() == pytest.approx(0.0, abs=1e-7)


def test_rpo_is_dpo_plus_alpha_nll():
    nll = torch.tensor(0.8)
    loss, metrics = rpo_loss(*inputs(), beta=BETA, alpha=0.5, chosen_nll=nll)
    assert loss.item() == pytest.approx(0.9233219 + 0.5 * 0.8, abs=1e-6)
    assert metrics["loss/rpo"] == pytest.approx(1.3233219, abs=1e-6)
    assert metrics["loss/dpo"] == pytest.approx(0.9233219, abs=1e-6)
    assert metrics["loss/nll"] == pytest.approx(0.8, abs=1e-7)
    smoothed, _ = rpo_loss(*inputs(), beta=BETA, alpha=2.0, chosen_nll=nll, label_smoothing=0.2)
    assert smoothed.item() == pytest.approx(0.8583219 + 1.6, abs=1e-6)


def test_rpo_gradient_reaches_the_nll():
    nll = torch.tensor(1.3, requires_grad=True)
    loss, _ = rpo_loss(*inputs(), beta=BETA, alpha=0.7, chosen_nll=nll)
    loss.backward()
    assert nll.grad.item() == pytest.approx(0.7)


def test_dispatch_table():
    assert PREFERENCE_LOSSES == {"dpo": dpo_loss, "ipo": ipo_loss, "rpo": rpo_loss}


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dpo_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2)), "policy_rejected_logps"),
        (lambda: dpo_loss(torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1)), r"shape \(B,\)"),
        (lambda: dpo_loss(*inputs(), beta=0.0), "beta"),
        (lambda: dpo_loss(*inputs(), label_smoothing=0.7), "label_smoothing"),
        (lambda: ipo_loss(*inputs(), beta=-1.0), "beta"),
        (lambda: rpo_loss(*inputs(), chosen_nll=torch.zeros(2)), "scalar"),
    ],
)
def test_invalid_inputs_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()
