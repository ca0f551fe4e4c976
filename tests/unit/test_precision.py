"""Mixed precision (rlft.precision, --dtype auto) and the sampler/trainer mismatch: detection, autocast placement,
the bf16 sampling copy, the mismatch metric, and the importance-sampling correction (by hand)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from rlft.checkpoint import read_metrics
from rlft.losses.importance import importance_weights
from rlft.losses.pg import PolicyObjective, policy_gradient_loss
from rlft.models import DeviceSpec, load_model, pick_device
from rlft.ops import sequence_logprobs
from rlft.precision import compute_context, compute_dtype_of, cpu_bf16_native, mark
from rlft.recipes.rl import train_rl
from rlft.rl.batch import rollout_batch, sampler_logprobs
from rlft.rollout.base import SamplingParams
from rlft.rollout.hf import HFEngine
from tests.unit.test_rl_loop import make_cfg

pytestmark = pytest.mark.usefixtures("one_thread")


def test_detection_follows_the_override(monkeypatch):
    monkeypatch.setenv("RLFT_CPU_BF16", "1")
    assert cpu_bf16_native() and pick_device("cpu", "auto") == DeviceSpec(torch.device("cpu"), torch.float32,
                                                                          torch.bfloat16)
    monkeypatch.setenv("RLFT_CPU_BF16", "0")
    assert not cpu_bf16_native() and pick_device("cpu", "auto") == DeviceSpec(torch.device("cpu"), torch.float32)
    monkeypatch.setenv("RLFT_CPU_BF16", "1")
    assert pick_device("cpu", "float32").compute_dtype is None  # --dtype float32 forces float32
    spec = pick_device("cpu", "auto")
    assert spec.for_inference() == DeviceSpec(torch.device("cpu"), torch.bfloat16) and "bfloat16 compute" in spec.label


def test_logprob_forward_runs_under_autocast_and_gradients_stay_float32(tiny_model_dir):
    spec = DeviceSpec(torch.device("cpu"), torch.float32, torch.bfloat16)
    model = load_model(str(tiny_model_dir), spec)
    assert compute_dtype_of(model) == torch.bfloat16
    seen = []
    handle = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    ids = torch.randint(0, 100, (2, 6))
    mask = torch.ones_like(ids)
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1]] * 2, dtype=torch.float32)
    logprobs = sequence_logprobs(model, ids, mask, loss_mask)
    handle.remove()
    assert seen == [torch.bfloat16] and logprobs.dtype == torch.float32
    logprobs.sum().backward()
    assert all(
        p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
    # the same forward in float32 agrees to bf16 precision
    ref = sequence_logprobs(mark(model, None), ids, mask, loss_mask)
    assert torch.allclose(logprobs, ref, atol=0.05)
    with compute_context(model):  # unmarked now: no autocast
        assert not torch.is_autocast_enabled("cpu")


def test_sampler_logprobs_line_up_with_the_trainer_in_float32(tiny_model_dir, smol_tokenizer):
    """No copy, float32: the decoder's own log-probs of the tokens it chose equal the teacher-forced ones."""
    model = load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32))
    engine = HFEngine(model, smol_tokenizer, decoder="drop")
    prompts = ["Hello there", "Count to"]
    samples = engine.generate(prompts, SamplingParams(k=2, temperature=1.0, max_new_tokens=5, seed=3))
    batch = rollout_batch(smol_tokenizer, prompts, samples)
    sampled = sampler_logprobs(batch, samples)
    trained = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask).detach()
    assert sampled is not None and torch.allclose(sampled, trained, atol=1e-4)
    assert (sampled != 0).sum() == batch.loss_mask.sum()


def test_bf16_copy_follows_sync_and_never_the_stale_weights(tiny_model_dir, smol_tokenizer):
    model = load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32, torch.bfloat16))
    engine = HFEngine(model, smol_tokenizer, copy_weights=True, copy_dtype=torch.bfloat16)
    copy = engine.sampler()
    assert copy is not model and next(copy.parameters()).dtype == torch.bfloat16 and engine.sampler() is copy
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    engine.sync_weights(model)
    fresh = engine.sampler()
    assert fresh is not copy and torch.equal(fresh.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))


def test_importance_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -2.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    r = torch.exp(trainer - sampler) * mask  # [[e^.5, e^-1, 1], [e^-.8, e^1.5, 0]]
    assert torch.allclose(importance_weights(trainer, sampler, mask, "token_truncate", 2.0),
                          torch.tensor([[math.exp(0.5), math.exp(-1), 1.0], [math.exp(-0.8), 2.0, 0.0]]))
    assert torch.allclose(importance_weights(trainer, sampler, mask, "token_mask", 2.0),
                          torch.tensor([[math.exp(0.5), math.exp(-1), 1.0], [math.exp(-0.8), 0.0, 0.0]]))
    # sequence ratios: row 0 exp(0.5 - 1 + 0) = e^-0.5; row 1 exp(-0.8 + 1.5) = e^0.7 (2.01 > 2)
    assert torch.allclose(importance_weights(trainer, sampler, mask, "sequence_truncate", 2.0),
                          torch.tensor([[math.exp(-0.5)] * 3, [2.0, 2.0, 0.0]]))
    assert torch.allclose(importance_weights(trainer, sampler, mask, "sequence_mask", 2.0),
                          torch.tensor([[math.exp(-0.5)] * 3, [0.0, 0.0, 0.0]]))
    assert torch.allclose(importance_weights(trainer, sampler, mask, "token_truncate", 100.0), r)
    with pytest.raises(ValueError, match="unknown importance-sampling mode"):
        importance_weights(trainer, sampler, mask, "none", 2.0)


def test_token_weights_scale_each_tokens_gradient():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    w = torch.tensor([[0.5, 2.0]])
    loss, _ = policy_gradient_loss(logprobs, logprobs.detach(), torch.tensor([3.0]), torch.ones(1, 2), token_weights=w)
    loss.backward()
    assert logprobs.grad.tolist() == [[-1.5, -6.0]]  # -A * w_t at ratio 1, seq_sum
    objective = PolicyObjective(is_mode="token_mask", is_cap=1.5)
    _, metrics = objective.loss(logprobs, logprobs.detach(), torch.tensor([1.0]), torch.ones(1, 2),
                                sampler_logprobs=torch.tensor([[-1.0, -3.0]]))  # ratios 1, e
    assert metrics["pg/is_weight_mean"] == pytest.approx(0.5) and metrics["pg/is_zero_frac"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="sampler's log-probs"):
        objective.loss(logprobs, logprobs.detach(), torch.tensor([1.0]), torch.ones(1, 2))


@pytest.mark.parametrize("correction", ["none", "token_truncate"])
def test_rl_loop_in_mixed_precision_logs_the_mismatch(tiny_model_dir, tmp_path, monkeypatch, correction):
    monkeypatch.setenv("RLFT_CPU_BF16", "1")
    cfg = make_cfg(tiny_model_dir, tmp_path / "run", dtype="auto", max_steps=3, max_new_tokens=3,
                   is_correction=correction)
    train_rl(cfg)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 3
    assert all(0.0 <= r["mismatch/abs_logp_mean"] < 1.0 and r["mismatch/abs_logp_p99"] >= 0 for r in records
               if "mismatch/abs_logp_mean" in r)
    assert any("mismatch/abs_logp_mean" in r for r in records)
    if correction != "none":
        assert any("pg/is_weight_mean" in r for r in records)


def test_float32_loop_has_zero_mismatch(tiny_model_dir, tmp_path):
    train_rl(replace(make_cfg(tiny_model_dir, tmp_path / "run"), max_steps=2, max_new_tokens=3))
    values = [
        r["mismatch/abs_logp_mean"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
        if "mismatch/abs_logp_mean" in r
    ]
    assert values and max(values) < 1e-4
