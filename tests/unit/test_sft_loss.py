"""sft_loss: hand-derived value, zero gradient off-mask, exact gradient accumulation on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.data.tokenize import TokenizedExample, collate
from rlft.losses.sft import sft_loss
from rlft.ops import logprobs_from_logits, sequence_logprobs

from tests.conftest import make_tiny_model

torch.set_num_threads(1)

LOGPROBS = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -0.5, -1.5, -9.0]])
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])


def test_sft_loss_token_mean_hand_value():
    # NLL of the 4 targets: 1, 2, 3 (row 0) and 1.5 (row 1) -> (1 + 2 + 3 + 1.5) / 4 = 1.875
    loss, metrics = sft_loss(LOGPROBS, MASK)
    assert torch.allclose(loss, torch.tensor(1.875), atol=1e-6)
    assert metrics == {"loss/sft": pytest.approx(1.875, abs=1e-6), "tokens": 4.0}


def test_sft_loss_seq_mean_hand_value():
    # per sequence: (1 + 2 + 3) / 3 = 2 and 1.5 / 1 = 1.5 -> (2 + 1.5) / 2 = 1.75
    loss, _ = sft_loss(LOGPROBS, MASK, mode="seq_mean")
    assert torch.allclose(loss, torch.tensor(1.75), atol=1e-6)


def test_sft_loss_with_num_tokens_of_whole_batch():
    # sum of NLL = 7.5, divided by the 10 target tokens of the optimisation batch = 0.75
    loss, metrics = sft_loss(LOGPROBS, MASK, num_tokens=10)
    assert torch.allclose(loss, torch.tensor(0.75), atol=1e-6)
    assert metrics["tokens"] == 4.0  # this micro-batch's own count


def test_sft_loss_ignores_non_finite_logprobs_off_mask():
    logprobs = LOGPROBS.clone()
    logprobs[1, 3] = float("-inf")  # e.g. a padding position scored as impossible
    loss, _ = sft_loss(logprobs, MASK)
    assert torch.allclose(loss, torch.tensor(1.875), atol=1e-6)


def test_sft_loss_gradient_is_zero_where_loss_mask_is_zero():
    g = torch.Generator().manual_seed(0)
    vocab = 13
    logits = torch.randn(2, 5, vocab, generator=g, requires_grad=True)
    labels = torch.randint(0, vocab, (2, 5), generator=g)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0, 0.0]])
    loss, _ = sft_loss(logprobs_from_logits(logits, labels), mask)
    loss.backward()
    grad = logits.grad
    assert torch.all(grad[mask == 0] == 0)
    # Where mask == 1 the gradient of mean NLL is (softmax - onehot) / N, N = 5 targets.
    expected = (torch.softmax(logits.detach(), -1) - torch.nn.functional.one_hot(labels, vocab)) / 5
    on = mask == 1
    assert torch.allclose(grad[on], expected[on], atol=1e-6)
    assert grad[on].abs().sum() > 0


def test_sft_loss_of_uniform_logits_is_log_vocab():
    vocab = 50
    logits = torch.zeros(2, 4, vocab)
    labels = torch.randint(0, vocab, (2, 4))
    loss, _ = sft_loss(logprobs_from_logits(logits, labels), torch.ones(2, 4))
    assert math.isclose(loss.item(), math.log(vocab), abs_tol=1e-5)


# --------------------------------------------------------------------------- gradient accumulation

VOCAB = 89


def _examples() -> list[TokenizedExample]:
    """8 sequences of different lengths and completion sizes (so micro-batch token counts differ)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for length, prompt in [(5, 2), (12, 3), (7, 6), (9, 1), (16, 4), (6, 3), (11, 9), (8, 2)]:
        ids = torch.randint(1, VOCAB, (length,), generator=g).tolist()
        out.append(TokenizedExample(ids, [0] * prompt + [1] * (length - prompt), False))
    return out


def _grads(model, examples, micro: int | None, pad_id: int = 0) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    num_tokens = sum(sum(e.loss_mask) for e in examples) if micro is not None else None
    step = micro or len(examples)
    for start in range(0, len(examples), step):
        batch = collate(examples[start : start + step], pad_id)
        lp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
        loss, _ = sft_loss(lp, batch.loss_mask, num_tokens=num_tokens)
        loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(VOCAB, seed=1)


@pytest.mark.parametrize("micro", [1, 4, 2])
def test_grad_accumulation_matches_full_batch(model, micro):
    examples = _examples()
    full = _grads(model, examples, None)
    accumulated = _grads(model, examples, micro)
    assert full.keys() == accumulated.keys()
    for name in full:
        assert full[name].abs().sum() > 0, name
        assert torch.allclose(accumulated[name], full[name], atol=1e-6, rtol=0), name


def test_grad_accumulation_without_num_tokens_would_differ(model):
    """Guards the test above: per-micro-batch means are not the full-batch mean here."""
    examples = _examples()
    full = _grads(model, examples, None)
    model.zero_grad(set_to_none=True)
    for e in examples:
        batch = collate([e], 0)
        lp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
        (sft_loss(lp, batch.loss_mask)[0] / len(examples)).backward()
    naive = {n: p.grad for n, p in model.named_parameters()}
    assert not all(torch.allclose(naive[n], full[n], atol=1e-5) for n in full)
