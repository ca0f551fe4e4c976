"""rlft.ops: masked reductions, the one aggregation rule, and log-probs (hand-derived values, naive
loops, and invariances of ``sequence_logprobs`` on a tiny random Llama)."""

from __future__ import annotations

import pytest
import torch

from rlft.ops import aggregate, logprobs_from_logits, masked_mean, masked_sum, sequence_logprobs

from tests.conftest import make_tiny_model

torch.set_num_threads(1)

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
ATOL = 1e-6


# --------------------------------------------------------------------------- masked reductions


def test_masked_sum_hand_values():
    # all dims: 1 + 5 + 6 = 12; per row: [1, 5 + 6] = [1, 11]
    assert torch.allclose(masked_sum(VALUES, MASK), torch.tensor(12.0), atol=ATOL)
    assert torch.allclose(masked_sum(VALUES, MASK, dim=-1), torch.tensor([1.0, 11.0]), atol=ATOL)


def test_masked_mean_hand_values():
    # all dims: (1 + 5 + 6) / 3 = 4; per row: [1/1, (5 + 6)/2] = [1, 5.5]; per column: [1/1, 5/1, 6/1]
    assert torch.allclose(masked_mean(VALUES, MASK), torch.tensor(4.0), atol=ATOL)
    assert torch.allclose(masked_mean(VALUES, MASK, dim=-1), torch.tensor([1.0, 5.5]), atol=ATOL)
    assert torch.allclose(masked_mean(VALUES, MASK, dim=0), torch.tensor([1.0, 5.0, 6.0]), atol=ATOL)


def test_masked_mean_of_empty_row_is_zero_not_nan():
    # row 0 has no masked token -> 0; row 1: 4 / 1 = 4
    mask = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    out = masked_mean(VALUES, mask, dim=-1)
    assert torch.allclose(out, torch.tensor([0.0, 4.0]), atol=ATOL)
    assert torch.allclose(masked_mean(VALUES, torch.zeros_like(MASK)), torch.tensor(0.0))


def test_masked_positions_are_ignored_even_when_not_finite():
    # -inf / nan where mask == 0 (e.g. log-probs of filtered tokens) must not leak: (1 + 5 + 6) / 3 = 4
    values = VALUES.clone()
    values[0, 1] = float("-inf")
    values[0, 2] = float("nan")
    assert torch.allclose(masked_sum(values, MASK), torch.tensor(12.0), atol=ATOL)
    assert torch.allclose(masked_mean(values, MASK, dim=-1), torch.tensor([1.0, 5.5]), atol=ATOL)
    assert torch.allclose(aggregate(values, MASK, "token_mean"), torch.tensor(4.0), atol=ATOL)


# --------------------------------------------------------------------------- aggregate


def test_aggregate_token_mean_hand_value():
    # (1 + 5 + 6) / 3 masked tokens = 4
    assert torch.allclose(aggregate(VALUES, MASK, "token_mean"), torch.tensor(4.0), atol=ATOL)


def test_aggregate_token_mean_with_num_tokens_uses_that_denominator():
    # (1 + 5 + 6) / 10 = 1.2 (the whole optimisation batch has 10 target tokens)
    assert torch.allclose(aggregate(VALUES, MASK, "token_mean", num_tokens=10), torch.tensor(1.2), atol=ATOL)


def test_aggregate_seq_mean_hand_value():
    # per sequence: [1/1, (5 + 6)/2] = [1, 5.5]; mean over 2 sequences = 3.25 (token_mean would be 4)
    assert torch.allclose(aggregate(VALUES, MASK, "seq_mean"), torch.tensor(3.25), atol=ATOL)
    # with num_sequences=4 (micro-batch of a batch of 4): (1 + 5.5) / 4 = 1.625
    assert torch.allclose(aggregate(VALUES, MASK, "seq_mean", num_sequences=4), torch.tensor(1.625), atol=ATOL)


def test_aggregate_sum_hand_value():
    # 1 + 5 + 6 = 12
    assert torch.allclose(aggregate(VALUES, MASK, "sum"), torch.tensor(12.0), atol=ATOL)


def test_aggregate_unknown_mode_raises():
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(VALUES, MASK, "mean")  # type: ignore[arg-type]


def _random_batch(seed: int, batch: int = 6, width: int = 7):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch, width, generator=g)
    mask = (torch.rand(batch, width, generator=g) < 0.6).float()
    mask[:, 0] = 1.0  # every sequence has at least one target
    return values, mask


@pytest.mark.parametrize("micro", [1, 2, 3])
def test_aggregate_token_mean_over_micro_batches_sums_to_full_batch(micro):
    values, mask = _random_batch(0)
    full = aggregate(values, mask, "token_mean")
    total_tokens = float(mask.sum())
    parts = [
        aggregate(values[i : i + micro], mask[i : i + micro], "token_mean", num_tokens=total_tokens)
        for i in range(0, values.shape[0], micro)
    ]
    assert torch.allclose(torch.stack(parts).sum(), full, atol=ATOL)
    # Sanity: the micro-batches have unequal token counts, so naive per-micro means would not match.
    naive = torch.stack(
        [aggregate(values[i : i + micro], mask[i : i + micro], "token_mean") for i in range(0, values.shape[0], micro)]
    ).mean()
    assert not torch.allclose(naive, full, atol=1e-4)


def test_aggregate_seq_mean_over_micro_batches_sums_to_full_batch():
    values, mask = _random_batch(1)
    full = aggregate(values, mask, "seq_mean")
    parts = [aggregate(values[i : i + 2], mask[i : i + 2], "seq_mean", num_sequences=6) for i in range(0, 6, 2)]
    assert torch.allclose(torch.stack(parts).sum(), full, atol=ATOL)


# --------------------------------------------------------------------------- logprobs_from_logits


def _naive_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    out = torch.empty(labels.shape, dtype=torch.float64)
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            lp = torch.log_softmax(logits[b, t].double() / temperature, dim=-1)
            out[b, t] = lp[labels[b, t]]
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_logprobs_from_logits_matches_naive_loop(temperature):
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 5, 11, generator=g)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    out = logprobs_from_logits(logits, labels, temperature)
    assert out.shape == (2, 5) and out.dtype == torch.float32
    assert torch.allclose(out.double(), _naive_logprobs(logits, labels, temperature), atol=1e-5)


def test_logprobs_temperature_changes_values_like_scaled_logits():
    g = torch.Generator().manual_seed(1)
    logits = 2 * torch.randn(3, 4, 9, generator=g)
    labels = torch.randint(0, 9, (3, 4), generator=g)
    hot = logprobs_from_logits(logits, labels, temperature=0.5)
    assert torch.allclose(hot, logprobs_from_logits(logits / 0.5, labels), atol=1e-5)
    assert not torch.allclose(hot, logprobs_from_logits(logits, labels), atol=1e-3)


def test_logprobs_from_bfloat16_logits_are_float32():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 7, generator=g).to(torch.bfloat16)
    labels = torch.randint(0, 7, (2, 3), generator=g)
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), _naive_logprobs(logits.float(), labels), atol=1e-5)


# --------------------------------------------------------------------------- sequence_logprobs

VOCAB = 97


@pytest.fixture(scope="module")
def tiny_model():
    model = make_tiny_model(VOCAB, seed=0)
    model.eval()
    return model


def _reference_logprobs(model, input_ids, attention_mask, loss_mask, temperature=1.0):
    """Full forward: log-softmax of all logits, token t scored from position t - 1, zero off-mask."""
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float() / temperature
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    out = torch.zeros(input_ids.shape)
    out[:, 1:] = lp * loss_mask[:, 1:]
    return out


def _ragged_batch(lengths, prompt_lengths, seed=0, pad_id=0):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(lengths), width, dtype=torch.long)
    loss_mask = torch.zeros(len(lengths), width)
    for i, (n, p) in enumerate(zip(lengths, prompt_lengths)):
        input_ids[i, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        attention_mask[i, :n] = 1
        loss_mask[i, p:n] = 1
    return input_ids, attention_mask, loss_mask


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sequence_logprobs_equals_full_forward_on_masked_positions(tiny_model, temperature):
    input_ids, attention_mask, loss_mask = _ragged_batch([9, 6, 11], [3, 2, 5])
    with torch.no_grad():
        out = sequence_logprobs(tiny_model, input_ids, attention_mask, loss_mask, temperature)
    expected = _reference_logprobs(tiny_model, input_ids, attention_mask, loss_mask, temperature)
    assert out.shape == input_ids.shape and out.dtype == torch.float32
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.all(out[loss_mask == 0] == 0)
    assert torch.all(out[loss_mask == 1] < 0)  # real log-probs, not zeros


def test_sequence_logprobs_padding_amount_does_not_change_values(tiny_model):
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(1, VOCAB, (6,), generator=g)
    other = torch.randint(1, VOCAB, (14,), generator=g)
    results = []
    for width, pad_id in [(6, 0), (10, 0), (14, 5), (14, VOCAB - 1)]:
        input_ids = torch.full((2, width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros(2, width, dtype=torch.long)
        loss_mask = torch.zeros(2, width)
        input_ids[0, :6], attention_mask[0, :6], loss_mask[0, 3:6] = seq, 1, 1
        input_ids[1, :width], attention_mask[1, :width], loss_mask[1, 2:width] = other[:width], 1, 1
        with torch.no_grad():
            out = sequence_logprobs(tiny_model, input_ids, attention_mask, loss_mask)
        assert torch.all(out[0, 6:] == 0)
        results.append(out[0, :6])
    for r in results[1:]:
        assert torch.allclose(r, results[0], atol=1e-5)


def test_sequence_logprobs_rejects_target_at_position_zero(tiny_model):
    input_ids, attention_mask, loss_mask = _ragged_batch([5, 5], [0, 2])
    with pytest.raises(ValueError, match=r"loss_mask\[:, 0\]"):
        sequence_logprobs(tiny_model, input_ids, attention_mask, loss_mask)


def test_pad_width_by_hand_and_logprobs_unchanged(tiny_model_dir):
    from rlft.models import DeviceSpec, load_model
    from rlft.ops import pad_width, sequence_logprobs

    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    got = pad_width(4, ids, mask, loss)
    assert got[0].tolist() == [[5, 6, 7, 0], [8, 9, 0, 0]] and got[1].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert got[2].tolist() == [[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    assert pad_width(3, ids, mask, loss)[0] is ids  # already a multiple
    assert pad_width(4, ids, None)[1].tolist() == [[1, 1, 1, 0], [1, 1, 1, 0]]
    # the widened forward gives the same per-token log-probs, cut back to the batch's width
    model = load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32))
    out = sequence_logprobs(model, ids, mask, loss)
    assert out.shape == (2, 3)
    ref = model(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)
    assert torch.allclose(out[0, 1:], ref[0, :2].gather(-1, ids[0, 1:, None]).squeeze(-1), atol=1e-5)


# --------------------------------------------------------------------------- right padding as plain causal attention


def test_causal_attention_mask_by_hand(monkeypatch):
    import rlft.ops as ops

    right = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    left = torch.tensor([[1, 1, 1], [0, 1, 1]])
    holed = torch.tensor([[1, 0, 1]])
    assert ops.causal_attention_mask(right) is right  # CPU is not in the default device types: unchanged
    monkeypatch.setattr(ops, "CAUSAL_RIGHT_PADDING_DEVICES", ("cpu",))
    assert ops.causal_attention_mask(right) is None
    assert ops.causal_attention_mask(right.bool()) is None
    assert ops.causal_attention_mask(left) is left and ops.causal_attention_mask(holed) is holed
    assert ops.causal_attention_mask(None) is None


def test_right_padding_without_mask_gives_the_masked_logprobs_and_gradients(monkeypatch):
    import rlft.ops as ops

    input_ids, attention_mask, loss_mask = _ragged_batch([9, 6, 11, 4], [3, 2, 5, 1], seed=4)
    results = []
    for devices in [(), ("cpu",)]:  # masked (the CPU default), then plain causal attention
        monkeypatch.setattr(ops, "CAUSAL_RIGHT_PADDING_DEVICES", devices)
        model = make_tiny_model(VOCAB, seed=1)
        out = sequence_logprobs(model, input_ids, attention_mask, loss_mask)
        out.sum().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (masked, masked_grads), (causal, causal_grads) = results
    assert torch.allclose(causal, masked, atol=1e-5) and torch.all(causal[loss_mask == 0] == 0)
    for name, grad in masked_grads.items():
        assert torch.allclose(causal_grads[name], grad, atol=1e-5), name
