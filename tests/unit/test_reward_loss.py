"""bradley_terry_loss: hand-derived values (plain, margin, centering), gradient signs, metrics.

Hand-made batch of two pairs:

    r_c = [2.0, 0.5],  r_r = [1.0, 1.5]   ->   d = r_c - r_r = [1.0, -1.0]

    -log sigmoid(x) = log(1 + exp(-x)):
      -log sig(1.0)  = 0.3132617     -log sig(-1.0) = 1.3132617
      -log sig(0.5)  = 0.4740770     -log sig(-1.5) = 1.7014133
      -log sig(0.0)  = 0.6931472

    plain:                 (0.3132617 + 1.3132617) / 2               = 0.8132617
    margin 0.5 (float):    d - m = [0.5, -1.5]; (0.4740770 + 1.7014133) / 2 = 1.0877451
    margin [1.0, 0.0]:     d - m = [0.0, -1.0]; (0.6931472 + 1.3132617) / 2 = 1.0032044
    centering, coef 0.01:  (r_c + r_r)^2 = [9, 4], mean 6.5;  0.8132617 + 0.01 * 6.5 = 0.8782617

    metrics: accuracy: 2 > 1 yes, 0.5 > 1.5 no -> 0.5; margin mean(1, -1) = 0;
             chosen mean 1.25; rejected mean 1.25

    gradients of the plain loss (B = 2): d loss / d r_c,b = -sigmoid(-d_b) / 2 = -d loss / d r_r,b
      pair 0: -sigmoid(-1) / 2 = -0.1344707;   pair 1: -sigmoid(1) / 2 = -0.3655293
    centering adds 2 * coef * (r_c + r_r) / B = [0.03, 0.02] to both gradients.
"""

from __future__ import annotations

import pytest
import torch

from rlft.losses import bradley_terry_loss

torch.set_num_threads(1)


def rewards(requires_grad: bool = False):
    return torch.tensor([2.0, 0.5], requires_grad=requires_grad), torch.tensor([1.0, 1.5], requires_grad=requires_grad)


def test_plain_closed_form_and_metrics():
    loss, metrics = bradley_terry_loss(*rewards())
    assert loss.item() == pytest.approx(0.8132617, abs=1e-6)
    assert metrics["loss/bt"] == pytest.approx(0.8132617, abs=1e-6)
    assert metrics["rm/accuracy"] == pytest.approx(0.5)
    assert metrics["rm/margin"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["rm/chosen"] == pytest.approx(1.25)
    assert metrics["rm/rejected"] == pytest.approx(1.25)
    assert "loss/center" not in metrics
    assert all(isinstance(v, float) for v in metrics.values())


def test_float_margin():
    loss, metrics = bradley_terry_loss(*rewards(), margin=0.5)
    assert loss.item() == pytest.approx(1.0877451, abs=1e-6)
    # accuracy and the reported margin are about the rewards, not the required margin
    assert metrics["rm/accuracy"] == pytest.approx(0.5)
    assert metrics["rm/margin"] == pytest.approx(0.0, abs=1e-7)


def test_per_pair_margin_tensor():
    loss, _ = bradley_terry_loss(*rewards(), margin=torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx(1.0032044, abs=1e-6)


def test_zero_margin_equals_no_margin():
    a, _ = bradley_terry_loss(*rewards(), margin=0.0)
    b, _ = bradley_terry_loss(*rewards(), margin=None)
    assert a.item() == b.item()


def test_centering():
    loss, metrics = bradley_terry_loss(*rewards(), center_coef=0.01)
    assert loss.item() == pytest.approx(0.8782617, abs=1e-6)
    assert metrics["loss/bt"] == pytest.approx(0.8132617, abs=1e-6)
    assert metrics["loss/center"] == pytest.approx(6.5, abs=1e-6)


def test_margin_and_centering_together():
    loss, _ = bradley_terry_loss(*rewards(), margin=0.5, center_coef=0.01)
    assert loss.item() == pytest.approx(1.0877451 + 0.065, abs=1e-6)


def test_gradient_values_and_signs():
    rc, rr = rewards(requires_grad=True)
    loss, _ = bradley_terry_loss(rc, rr)
    loss.backward()
    expected = torch.tensor([-0.1344707, -0.3655293])
    torch.testing.assert_close(rc.grad, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(rr.grad, -expected, atol=1e-6, rtol=0)
    assert (rc.grad < 0).all() and (rr.grad > 0).all()  # descent raises chosen, lowers rejected


def test_centering_gradient():
    rc, rr = rewards(requires_grad=True)
    loss, _ = bradley_terry_loss(rc, rr, center_coef=0.01)
    loss.backward()
    extra = torch.tensor([0.03, 0.02])
    torch.testing.assert_close(rc.grad, torch.tensor([-0.1344707, -0.3655293]) + extra, atol=1e-6, rtol=0)
    torch.testing.assert_close(rr.grad, torch.tensor([0.1344707, 0.3655293]) + extra, atol=1e-6, rtol=0)


def test_centering_pulls_shared_offset_to_zero():
    """Adding the same constant to both rewards leaves the BT term unchanged; centering penalises it."""
    rc, rr = rewards()
    base, _ = bradley_terry_loss(rc, rr)
    shifted, _ = bradley_terry_loss(rc + 10, rr + 10)
    assert shifted.item() == pytest.approx(base.item(), abs=1e-6)
    c_base, _ = bradley_terry_loss(rc, rr, center_coef=0.1)
    c_shift, _ = bradley_terry_loss(rc + 10, rr + 10, center_coef=0.1)
    assert c_shift.item() > c_base.item()


def test_accuracy_metric_strict():
    rc = torch.tensor([1.0, 2.0, 3.0, 0.0])
    rr = torch.tensor([0.0, 2.0, 4.0, -1.0])  # win, tie (not counted), loss, win
    _, metrics = bradley_terry_loss(rc, rr)
    assert metrics["rm/accuracy"] == pytest.approx(0.5)


def test_preferring_chosen_lowers_loss():
    rr = torch.zeros(3)
    losses = [bradley_terry_loss(torch.full((3,), v), rr)[0].item() for v in (-2.0, 0.0, 2.0)]
    assert losses[0] > losses[1] > losses[2]
    assert losses[1] == pytest.approx(0.6931472, abs=1e-6)


def test_stable_for_large_gaps():
    rc = torch.tensor([1000.0, -1000.0], requires_grad=True)
    rr = torch.tensor([-1000.0, 1000.0])
    loss, _ = bradley_terry_loss(rc, rr)
    assert torch.isfinite(loss)
    assert loss.item() == pytest.approx(1000.0, abs=1e-3)  # (0 + 2000) / 2
    loss.backward()
    assert torch.isfinite(rc.grad).all()


def test_shape_errors():
    with pytest.raises(ValueError, match=r"\(B,\)"):
        bradley_terry_loss(torch.zeros(2, 1), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="rejected_rewards"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="margin"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), margin=torch.zeros(3))
    with pytest.raises(ValueError, match="center_coef"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), center_coef=-1.0)
