"""rlft.rollout.decode: rows leave the batch when they finish, and tokens are those ``generate`` picks."""

from __future__ import annotations

import pytest
import torch

from rlft.rollout import HFEngine, SamplingParams
from rlft.rollout.decode import decode, logits_warpers, next_tokens
from tests.unit.test_rollout_hf import PROMPTS, tiny_model


pytestmark = pytest.mark.usefixtures("one_thread")


def ids_of(out):
    return [[(s.completion_ids, s.finish_reason) for s in samples] for samples in out]


def stop_tokens_at_varied_steps(model, tokenizer, params) -> list[int]:
    """Stop tokens taken from the greedy completions of PROMPTS (no early stop): completion r's token at step r + 2,
    for every completion but the last. Made EOS ids, they end rows at different steps (a token may also end
    another row sooner) and leave the last row running unless one of them ends it too."""
    out = HFEngine(model, tokenizer, decoder="generate").generate(PROMPTS, params)
    rows = [s.completion_ids for samples in out for s in samples]
    return [row[r + 1] for r, row in enumerate(rows[:-1])]


@pytest.mark.parametrize("tok_name", ["smol_tokenizer", "qwen_tokenizer"])
def test_greedy_equals_generate_while_rows_stop_at_different_steps(tok_name, request):
    tokenizer = request.getfixturevalue(tok_name)
    model = tiny_model(tokenizer)
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=12)
    stops = stop_tokens_at_varied_steps(model, tokenizer, params)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stops]
    expected = HFEngine(model, tokenizer, batch_size=8, decoder="generate").generate(PROMPTS, params)
    got = HFEngine(model, tokenizer, batch_size=8).generate(PROMPTS, params)
    assert ids_of(got) == ids_of(expected)
    lengths = {len(s.completion_ids) for samples in got for s in samples if s.finish_reason == "stop"}
    assert len(lengths) >= 2 and any(s.finish_reason == "length" for samples in got for s in samples)


def test_finished_rows_leave_the_batch(smol_tokenizer):
    """Every forward after the prefill carries exactly the rows still running: the lm_head sees N rows once, then
    sum(len(completion) - 1) rows over the decoding steps (a row's last token is never fed back)."""
    model = tiny_model(smol_tokenizer)
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=12)
    stops = stop_tokens_at_varied_steps(model, smol_tokenizer, params)
    engine = HFEngine(model, smol_tokenizer)
    batch = engine.encode_prompts(PROMPTS)
    width = max(map(len, batch))
    input_ids = torch.tensor([[0] * (width - len(ids)) + ids for ids in batch])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
    sizes = []
    handle = model.lm_head.register_forward_hook(lambda module, inputs, output: sizes.append(inputs[0].shape[0]))
    try:
        rows = [
            d.token_ids for d in decode(model, input_ids, attention_mask, params, [smol_tokenizer.eos_token_id, *stops])
        ]
    finally:
        handle.remove()
    assert sizes[0] == len(PROMPTS)
    assert sum(sizes[1:]) == sum(len(row) - 1 for row in rows)
    assert sizes[1:] == sorted(sizes[1:], reverse=True) and sizes[-1] < len(PROMPTS)  # rows only ever leave
    for row in rows:
        assert len(row) == 12 or row[-1] in (smol_tokenizer.eos_token_id, *stops)
    assert len({len(row) for row in rows}) >= 3


def test_sampling_equals_generate_draw_for_draw_while_no_row_stops(smol_tokenizer):
    """Same seed, no row stopping early: every step draws from the same warped distribution with the same random
    numbers as ``generate`` (temperature, top-k, top-p in generate's order), so the samples are identical."""
    model = tiny_model(smol_tokenizer)
    params = SamplingParams(k=3, temperature=0.7, top_p=0.9, top_k=40, max_new_tokens=6, seed=3)
    expected = HFEngine(model, smol_tokenizer, batch_size=16, decoder="generate").generate(PROMPTS, params)
    assert all(s.finish_reason == "length" for samples in expected for s in samples)  # no row stopped
    got = HFEngine(model, smol_tokenizer, batch_size=16, decoder="drop").generate(PROMPTS, params)
    assert ids_of(got) == ids_of(expected)
    assert len({tuple(s.completion_ids) for samples in got for s in samples}) > 5


def test_warpers_restrict_and_follow_the_distribution():
    """Draws follow softmax(warped logits): never outside top-k / the nucleus; frequencies within 5 standard errors."""
    torch.manual_seed(0)
    logits = torch.randn(1, 50) * 3
    params = SamplingParams(temperature=0.7, top_k=8, top_p=0.8)
    probs = torch.softmax(logits_warpers(params)(torch.empty(1, 0, dtype=torch.long), logits.clone()), dim=-1)[0]
    allowed = set(torch.topk(logits[0], 8).indices.tolist())
    assert set(probs.nonzero().squeeze(1).tolist()) <= allowed
    n = 20000
    draws = next_tokens(logits.expand(n, -1), params)
    freq = torch.bincount(draws, minlength=50).double() / n
    assert set(draws.unique().tolist()) <= set(probs.nonzero().squeeze(1).tolist())
    se = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert torch.all((freq - probs.double()).abs() <= 5 * se + 1e-9)
    assert torch.equal(next_tokens(logits, SamplingParams(temperature=0.0)), logits.argmax(-1))


def test_lora_model_greedy_equals_generate(smol_tokenizer):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model(smol_tokenizer),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=8)
    expected = HFEngine(model, smol_tokenizer, decoder="generate").generate(PROMPTS, params)
    assert ids_of(HFEngine(model, smol_tokenizer).generate(PROMPTS, params)) == ids_of(expected)


def test_shape_errors():
    with pytest.raises(ValueError, match="same"):
        decode(None, torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), SamplingParams(), [0])
    with pytest.raises(ValueError, match="N >= 1"):
        decode(None, torch.zeros(0, 3, dtype=torch.long), torch.ones(0, 3, dtype=torch.long), SamplingParams(), [0])


@pytest.mark.parametrize("tok_name", ["smol_tokenizer", "qwen_tokenizer"])
def test_static_cache_greedy_equals_the_eager_paths(tok_name, request):
    """decoder='static' (CUDA's default: transformers' static-cache generate, compiled there; uncompiled here) picks
    the tokens of the dynamic-cache ``generate`` and of rlft's own loop, with rows of different prompt lengths."""
    tokenizer = request.getfixturevalue(tok_name)
    model = tiny_model(tokenizer)
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=10)
    static = HFEngine(model, tokenizer, batch_size=8, decoder="static").generate(PROMPTS, params)
    assert ids_of(static) == ids_of(
        HFEngine(model, tokenizer, batch_size=8, decoder="generate").generate(PROMPTS, params))
    assert ids_of(static) == ids_of(HFEngine(model, tokenizer, batch_size=8, decoder="drop").generate(PROMPTS, params))
    assert len({tuple(s.completion_ids) for samples in static for s in samples}) > 1


def transformers_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    from transformers import TopPLogitsWarper

    return TopPLogitsWarper(top_p)(torch.empty(scores.shape[0], 0, dtype=torch.long), scores.clone())


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("spread", [0.05, 1.0, 4.0, 12.0])  # near-uniform rows (the whole-row sort) to peaked ones
def test_top_p_keeps_transformers_tokens(top_p, spread):
    """TopPWarper returns what transformers' TopPLogitsWarper returns, bit for bit, on rows whose nucleus lies among
    the candidates and on rows where it reaches past them (spread 0.05: ~95% of a 2,000-token vocabulary), both kinds
    in one batch; the input is untouched."""
    from rlft.rollout.decode import TopPWarper

    torch.manual_seed(int(top_p * 100) + int(spread * 10))
    scores = torch.cat([torch.randn(16, 2000) * spread, torch.randn(4, 2000) * 12.0])  # a batch of both kinds
    before = scores.clone()
    got = TopPWarper(top_p, candidates=64)(torch.empty(20, 0, dtype=torch.long), scores)
    assert torch.equal(scores, before)
    assert torch.equal(got, transformers_top_p(scores, top_p))
    assert torch.isfinite(got).sum(dim=-1).min() >= 1
    assert torch.equal(TopPWarper(1.0)(None, scores), scores)  # 1: no filter


def test_top_p_by_hand():
    """probs (0.5, 0.3, 0.15, 0.05): p 0.5 keeps 1 token (the mass above the second is 0.5, not below 0.5), 0.51
    keeps 2, 0.8 keeps 2, 0.81 keeps 3; a candidate list of 2 is sorted whole when the nucleus may reach past it."""
    from rlft.rollout.decode import TopPWarper

    scores = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    for top_p, n in ((0.3, 1), (0.5, 1), (0.51, 2), (0.8, 2), (0.81, 3), (0.96, 4)):
        for m in (2, 256):
            got = TopPWarper(top_p, candidates=m)(None, scores)
            assert int(torch.isfinite(got).sum()) == n, (top_p, m)
            assert torch.isfinite(got[0, 1])  # the most likely always stays
    with pytest.raises(ValueError, match="top_p"):
        TopPWarper(0.0)
    with pytest.raises(ValueError, match="candidates"):
        TopPWarper(0.9, candidates=0)
