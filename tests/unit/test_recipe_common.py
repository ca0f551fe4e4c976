"""The shared training set-up: optimizer choice and the optimizer step."""

from __future__ import annotations

import pytest
import torch

from rlft.models import pick_device
from rlft.options import OptimizerOptions
from rlft.recipes.common import optimizer_step, prepare_training


def _setup(tiny_model_dir, tmp_path, optimizer):
    return prepare_training(str(tiny_model_dir), tmp_path, pick_device("cpu", "float32"),
                            OptimizerOptions(lr=0.5, optimizer=optimizer, schedule="constant"), resume=False,
                            total_steps=3)


def test_sgd_step_is_lr_times_the_clipped_gradient(tiny_model_dir, tmp_path):
    setup = _setup(tiny_model_dir, tmp_path, "sgd")
    assert isinstance(setup.optimizer, torch.optim.SGD)
    params = [p for p in setup.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    ids = torch.tensor([[1, 5, 9, 3]])
    setup.model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad.detach().clone() for p in params]
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    assert norm > 0.01
    info = optimizer_step(setup, max_grad_norm=0.01)  # clipping active: the step is 0.5 * g * 0.01 / |g|
    assert info["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    for p, b, g in zip(params, before, grads):
        torch.testing.assert_close(p.detach(), b - 0.5 * g * (0.01 / norm), atol=1e-6, rtol=1e-5)


def test_adamw_is_the_default_and_unknown_optimizers_fail(tiny_model_dir, tmp_path):
    assert isinstance(_setup(tiny_model_dir, tmp_path / "a", "adamw").optimizer, torch.optim.AdamW)
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        _setup(tiny_model_dir, tmp_path / "b", "adam")


def test_fused_adamw_only_for_adamw_on_listed_devices_unsharded(monkeypatch):
    import rlft.recipes.optim as optim

    cpu = [torch.nn.Parameter(torch.zeros(2))]
    assert optim.optimizer_kernels("adamw", cpu, sharded=False) == {}  # CPU keeps torch's default kernels
    monkeypatch.setattr(optim, "FUSED_ADAMW_DEVICES", ("cpu",))
    assert optim.optimizer_kernels("adamw", cpu, sharded=False) == {"fused": True}
    assert optim.optimizer_kernels("adamw", [{"params": cpu, "lr": 1.0}], sharded=False) == {"fused": True}
    assert optim.optimizer_kernels("adamw", cpu, sharded=True) == {}
    assert optim.optimizer_kernels("sgd", cpu, sharded=False) == {}
    assert optim.optimizer_kernels("adamw", [], sharded=False) == {}
    torch.optim.AdamW(cpu, lr=1e-3, **optim.optimizer_kernels("adamw", cpu, sharded=False))  # torch accepts it
