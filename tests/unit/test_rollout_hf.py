"""HFEngine on tiny random Llamas with real tokenizers (SmolLM2: pad == EOS; Qwen2.5: pad != EOS)."""

from __future__ import annotations

import pytest
import torch

from rlft.rollout import GenerationEngine, HFEngine, Sample, SamplingParams
from tests.conftest import make_scaled_tiny_model

PROMPTS = [
    "Hello there",
    "A much longer prompt with many words in it, to force left padding of the others",
    "x y",
    "Assistant: Let me solve this step by step.\n<think>",
    "The quick brown fox",
]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(tokenizer, seed: int = 0):
    """A tiny Llama whose layers are scaled up so greedy outputs depend on the whole context.

    (With the default 0.02 init a tied-embedding model just repeats the last prompt token, which would
    make the padding-invariance test vacuous.) EOS comes from the tokenizer only.
    """
    model = make_scaled_tiny_model(len(tokenizer), seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


class ForceToken:
    """An lm_head forward hook that makes ``token`` the argmax at generation step ``step`` (1-based),
    for the batch rows in ``rows`` (None: all). Call :meth:`reset` before each ``generate`` call."""

    def __init__(self, model, token: int, step: int, rows: list[int] | None = None):
        self.token, self.step, self.rows, self.calls = token, step, rows, 0
        self.handle = model.lm_head.register_forward_hook(self)

    def reset(self):
        self.calls = 0

    def __call__(self, module, inputs, logits):
        self.calls += 1  # one lm_head call per generated token (prefill produces the first)
        if self.calls == self.step:
            logits = logits.clone()
            rows = slice(None) if self.rows is None else self.rows
            logits[rows, -1, self.token] = logits.abs().max() * 10 + 100
        return logits


def test_satisfies_protocol(smol_tokenizer):
    assert isinstance(HFEngine(tiny_model(smol_tokenizer), smol_tokenizer), GenerationEngine)


def test_shapes_and_length_finish(smol_tokenizer):
    engine = HFEngine(tiny_model(smol_tokenizer), smol_tokenizer, batch_size=3)
    out = engine.generate(PROMPTS, SamplingParams(k=2, temperature=1.0, max_new_tokens=5, seed=0))
    assert len(out) == len(PROMPTS) and all(len(samples) == 2 for samples in out)
    eos = smol_tokenizer.eos_token_id
    for samples in out:
        for s in samples:
            assert isinstance(s, Sample)
            if s.finish_reason == "length":
                assert len(s.completion_ids) == 5 and eos not in s.completion_ids
            else:  # a random model may sample EOS by chance
                assert s.completion_ids[-1] == eos and eos not in s.completion_ids[:-1]
            assert s.text == smol_tokenizer.decode(s.completion_ids, skip_special_tokens=True)
    assert engine.generate([], SamplingParams()) == []


@pytest.mark.parametrize("tok_name", ["smol_tokenizer", "qwen_tokenizer"])
def test_stop_on_eos_and_truncate(tok_name, request):
    """Row 0 of the batch (the longest prompt, sorted first) emits EOS at step 3; the others run to
    max_new_tokens, so row 0 is padded after its EOS in generate's output and must be cut there."""
    tokenizer = request.getfixturevalue(tok_name)
    model = tiny_model(tokenizer)
    eos = tokenizer.eos_token_id
    ForceToken(model, eos, step=3, rows=[0])
    engine = HFEngine(model, tokenizer, batch_size=8)
    out = engine.generate(PROMPTS, SamplingParams(k=1, temperature=0.0, max_new_tokens=6))
    stopped = out[1][0]  # the longest prompt
    assert stopped.finish_reason == "stop"
    assert len(stopped.completion_ids) == 3 and stopped.completion_ids[-1] == eos
    assert eos not in stopped.completion_ids[:-1]
    for b in (0, 2, 3, 4):
        assert out[b][0].finish_reason == "length" and len(out[b][0].completion_ids) == 6


def test_eos_union_with_generation_config(qwen_tokenizer):
    """An id listed only in model.generation_config.eos_token_id (Qwen base: <|endoftext|>) also stops."""
    model = tiny_model(qwen_tokenizer)
    extra = qwen_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert extra != qwen_tokenizer.eos_token_id
    model.generation_config.eos_token_id = [extra]
    ForceToken(model, extra, step=2)
    out = HFEngine(model, qwen_tokenizer).generate(PROMPTS[:3], SamplingParams(temperature=0.0, max_new_tokens=6))
    for (s,) in out:
        assert s.finish_reason == "stop" and len(s.completion_ids) == 2 and s.completion_ids[-1] == extra
        assert "<|endoftext|>" not in s.text


@pytest.mark.parametrize("tok_name", ["smol_tokenizer", "qwen_tokenizer"])
def test_greedy_batching_invariant(tok_name, request):
    """Greedy: batch_size 1 (no padding) == batch_size 2/4 (left padding) == a plain no-cache argmax loop."""
    tokenizer = request.getfixturevalue(tok_name)
    model = tiny_model(tokenizer)
    params = SamplingParams(k=2, temperature=0.0, max_new_tokens=8)
    results = {bs: HFEngine(model, tokenizer, batch_size=bs).generate(PROMPTS, params) for bs in (1, 2, 4)}
    ids = {bs: [[s.completion_ids for s in samples] for samples in out] for bs, out in results.items()}
    assert ids[1] == ids[2] == ids[4]
    assert all(a == b for a, b in ids[1])  # greedy: the k samples agree
    assert HFEngine(model, tokenizer, batch_size=4).generate(PROMPTS, params) == results[4]  # deterministic
    eos = {tokenizer.eos_token_id}
    with torch.no_grad():
        for prompt, (expected, _) in zip(PROMPTS, ids[1]):
            x = tokenizer(prompt, return_tensors="pt").input_ids
            generated = []
            while len(generated) < 8 and not (generated and generated[-1] in eos):
                generated.append(int(model(x).logits[0, -1].argmax()))
                x = torch.cat([x, torch.tensor([[generated[-1]]])], dim=1)
            assert generated == expected


def test_seeded_sampling_reproducible(smol_tokenizer):
    model = tiny_model(smol_tokenizer)
    engine = HFEngine(model, smol_tokenizer, batch_size=4)
    params = SamplingParams(k=3, temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=6, seed=7)
    rng_before = torch.get_rng_state()
    a = engine.generate(PROMPTS, params)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global RNG is left alone
    assert engine.generate(PROMPTS, params) == a
    other = engine.generate(PROMPTS, SamplingParams(k=3, temperature=1.0, max_new_tokens=6, seed=8))
    assert other != a
    assert len({tuple(s.completion_ids) for samples in a for s in samples}) > 1  # samples differ


def test_state_restored(smol_tokenizer):
    """Caller's padding side and the model's training mode and generation config are unchanged."""
    model = tiny_model(smol_tokenizer)
    gen_config = model.generation_config
    original_side = smol_tokenizer.padding_side
    for side, training in (("right", True), ("left", False)):
        smol_tokenizer.padding_side = side
        model.train(training)
        try:
            HFEngine(model, smol_tokenizer).generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_new_tokens=2))
            assert smol_tokenizer.padding_side == side
            assert model.training is training and all(m.training is training for m in model.modules())
            assert model.generation_config is gen_config
        finally:
            smol_tokenizer.padding_side = original_side


def test_invalid_params(smol_tokenizer):
    engine = HFEngine(tiny_model(smol_tokenizer), smol_tokenizer)
    for bad in (dict(k=0), dict(max_new_tokens=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=-1)):
        with pytest.raises(ValueError):
            engine.generate(["hi"], SamplingParams(**bad))
    with pytest.raises(ValueError):
        HFEngine(engine.model, smol_tokenizer, batch_size=0)
