"""rlft.losses.pg: asymmetric clipping (clip-higher), RAFT / RAFT++, the entropy bonus, seq_mean
aggregation -- hand-derived values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.losses.pg import CLIPPED_LOSSES, POLICY_LOSSES, entropy_bonus, policy_gradient_loss, raft_loss
from rlft.ops import sequence_logprobs

ATOL = 1e-6


def _grad(fn, logp, *args, **kwargs):
    logp = logp.clone().requires_grad_(True)
    loss, metrics = fn(logp, *args, **kwargs)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def test_clip_higher_hand_values():
    # One token each, ratio r = exp(logp - old). Sequence 0: A = +1, r = 1.25; sequence 1: A = -1, r = 0.75.
    # clip_low 0.2, clip_high 0.28 -> range [0.8, 1.28].
    #   seq 0: -min(1.25 * 1, clip(1.25) * 1) = -1.25 (inside: not clipped, gradient -A * r = -1.25)
    #   seq 1: -min(0.75 * -1, clip(0.75) * -1) = -min(-0.75, -0.8) = 0.8 (clipped: gradient 0)
    # seq_sum over 2 sequences: (-1.25 + 0.8) / 2 = -0.225
    old = torch.zeros(2, 1)
    logp = torch.tensor([[math.log(1.25)], [math.log(0.75)]])
    adv = torch.tensor([1.0, -1.0])
    loss, grad, m = _grad(policy_gradient_loss, logp, old, adv, torch.ones(2, 1), clip_low=0.2, clip_high=0.28,
                          mode="seq_sum")
    assert loss.item() == pytest.approx(-0.225, abs=ATOL)
    # d/dlogp of -A * r / 2 = -A * r / 2: seq 0 -> -0.625; seq 1 clipped -> 0
    assert torch.allclose(grad, torch.tensor([[-0.625], [0.0]]), atol=ATOL)
    assert m["pg/clipfrac"] == pytest.approx(0.5)
    # Symmetric 0.2 clips sequence 0 too (1.25 > 1.2): both gradients 0.
    _, grad_sym, m_sym = _grad(policy_gradient_loss, logp, old, adv, torch.ones(2, 1), clip_eps=0.2, mode="seq_sum")
    assert torch.equal(grad_sym, torch.zeros(2, 1)) and m_sym["pg/clipfrac"] == 1.0


def test_clip_low_only_leaves_the_upper_side_open():
    old = torch.zeros(1, 1)
    logp = torch.tensor([[math.log(3.0)]])
    loss, grad, _ = _grad(policy_gradient_loss, logp, old, torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2,
                          mode="sum")
    assert loss.item() == pytest.approx(-3.0) and grad.item() == pytest.approx(-3.0)


def test_seq_mean_aggregation_hand_value():
    # Two sequences, lengths 2 and 1, ratio 1, A = (1, 2): per-token -A; seq means -1 and -2; mean -1.5
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[0.0, 1, 1], [0.0, 1, 0]])
    loss, grad, _ = _grad(policy_gradient_loss, logp, logp, torch.tensor([1.0, 2.0]), mask, mode="seq_mean")
    assert loss.item() == pytest.approx(-1.5)
    # gradient: -A / len / B -> seq 0 tokens -0.25 each, seq 1 token -1.0
    assert torch.allclose(grad, torch.tensor([[0.0, -0.25, -0.25], [0.0, -1.0, 0.0]]), atol=ATOL)


def test_raft_is_nll_on_selected_samples():
    # Advantages (0.7, 0, -1.3): only sequence 0 is selected, with weight 1 whatever its size.
    # token_mean over all 5 target tokens: loss = -(sum of seq 0's ratios) / 5 = -2/5 at ratio 1;
    # grad -1/5 on seq 0's tokens.
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1], [-3.0, -0.2]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    loss, grad, _ = _grad(raft_loss, logp, logp, torch.tensor([0.7, 0.0, -1.3]), mask)
    assert loss.item() == pytest.approx(-0.4)
    assert torch.allclose(grad, torch.tensor([[-0.2, -0.2], [0.0, 0.0], [0.0, 0.0]]), atol=ATOL)


def test_raft_plus_plus_clips_the_ratio():
    # Selected sample with ratio 1.5 > 1 + 0.2: clipped, zero gradient; the unclipped RAFT gradient is -1.5.
    old = torch.zeros(1, 1)
    logp = torch.tensor([[math.log(1.5)]])
    _, g_pp, m = _grad(raft_loss, logp, old, torch.tensor([2.0]), torch.ones(1, 1), clip_low=0.2, clip_high=0.2,
                       mode="sum")
    _, g_raft, _ = _grad(raft_loss, logp, old, torch.tensor([2.0]), torch.ones(1, 1), mode="sum")
    assert g_pp.item() == 0.0 and m["pg/clipfrac"] == 1.0
    assert g_raft.item() == pytest.approx(-1.5)


def test_entropy_bonus_hand_value_and_gradient_raises_entropy():
    # The entropy from sequence_logprobs equals -sum p log p of the full softmax (naive), position by position.
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[0, 1, 1, 1]])
    logprobs, entropy = sequence_logprobs(model, ids, torch.ones_like(ids), mask, 1.0, return_entropy=True)
    # naive: full logits, softmax entropy at positions 0..2 (predicting tokens 1..3)
    logits = model(input_ids=ids).logits[0, :-1].float()
    p = torch.softmax(logits, -1)
    naive = -(p * torch.log(p)).sum(-1)
    assert torch.allclose(entropy[0, 1:], naive, atol=1e-5) and entropy[0, 0] == 0
    assert torch.allclose(logprobs[0, 1:], torch.log(p[torch.arange(3), ids[0, 1:]]), atol=1e-5)
    value, m = entropy_bonus(entropy, mask.float())
    assert value.item() == pytest.approx(naive.mean().item(), abs=1e-5) and m["loss/entropy"] == pytest.approx(
        value.item())
    # A gradient step on -value raises the entropy.
    (-value).backward()
    with torch.no_grad():
        for param in model.parameters():
            param -= 1.0 * param.grad
    _, after = sequence_logprobs(model, ids, torch.ones_like(ids), mask, 1.0, return_entropy=True)
    assert after[0, 1:].mean() > entropy[0, 1:].mean()


def test_loss_registry():
    assert set(POLICY_LOSSES) == {"reinforce", "ppo", "raft", "raft++", "topr"}
    assert CLIPPED_LOSSES == {"ppo", "raft++"}
    with pytest.raises(ValueError, match="clip ranges"):
        policy_gradient_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), clip_low=-0.1)
