"""The log-probs the RLOO loss assigns to sampled tokens are the sampler's own (DESIGN pitfall 6).

transformers ``generate`` samples from ``softmax(logits / T)`` (top_k=0, top_p=1: no truncation) and
returns the raw logits and the processed scores of every step. Teacher-forcing the prompt + the
sampled completion through :func:`rlft.rl.batch.rollout_batch` and
:func:`rlft.ops.sequence_logprobs` at the same T must reproduce ``log_softmax(logits / T)`` of the
chosen tokens; at T = 1 it must not.
"""

from __future__ import annotations

import pytest
import torch

from rlft.ops import sequence_logprobs
from rlft.rl.batch import rollout_batch
from rlft.rollout.base import Sample

from tests.conftest import make_tiny_model

torch.set_num_threads(1)

TEMPERATURE = 0.6
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def sampled(smol_tokenizer):
    """A tiny random Llama, one prompt, 3 sampled completions, and generate's per-step log-probs."""
    tok = smol_tokenizer
    model = make_tiny_model(len(tok), seed=1)
    model.eval()
    prompt = "User: Using the numbers [3, 5], create an equation that equals 8.\nAssistant: <think>"
    prompt_ids = torch.tensor([tok(prompt)["input_ids"]])
    torch.manual_seed(0)
    out = model.generate(
        input_ids=prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        num_return_sequences=3,
        max_new_tokens=NEW_TOKENS,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
    )
    completions = out.sequences[:, prompt_ids.shape[1] :]  # (3, NEW_TOKENS)
    logits = torch.stack(out.logits, dim=1).float()  # (3, NEW_TOKENS, V) raw
    scores = torch.stack(out.scores, dim=1).float()  # (3, NEW_TOKENS, V) after the temperature warper
    chosen = completions[..., None]
    sampler_lp = torch.log_softmax(logits / TEMPERATURE, dim=-1).gather(-1, chosen).squeeze(-1)
    scores_lp = torch.log_softmax(scores, dim=-1).gather(-1, chosen).squeeze(-1)
    # Cut each completion after its first EOS (kept, as HFEngine does); later steps are padding.
    samples, lengths = [], []
    for row in completions.tolist():
        n = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        samples.append(Sample(row[:n], tok.decode(row[:n]), "stop" if tok.eos_token_id in row else "length"))
        lengths.append(n)
    valid = torch.arange(NEW_TOKENS)[None, :] < torch.tensor(lengths)[:, None]  # (3, NEW_TOKENS)
    return {"model": model, "prompt": prompt, "samples": [samples], "sampler_lp": sampler_lp, "scores_lp": scores_lp,
            "prompt_len": prompt_ids.shape[1], "valid": valid}


def _teacher_forced(sampled, tok, temperature):
    batch = rollout_batch(tok, [sampled["prompt"]], sampled["samples"])
    with torch.no_grad():
        lp = sequence_logprobs(sampled["model"], batch.input_ids, batch.attention_mask, batch.loss_mask, temperature)
    p, valid = sampled["prompt_len"], sampled["valid"]
    assert torch.all(batch.loss_mask[:, :p] == 0)
    assert torch.equal(batch.loss_mask[:, p:].bool(), valid[:, : batch.loss_mask.shape[1] - p])
    out = torch.zeros(valid.shape)
    out[:, : lp.shape[1] - p] = lp[:, p:]
    return out


def test_generate_scores_are_logits_over_temperature(sampled):
    # sanity of the reference itself: the processed scores are logits / T (no truncation with top_k=0, top_p=1)
    valid = sampled["valid"]
    assert torch.allclose(sampled["scores_lp"][valid], sampled["sampler_lp"][valid], atol=1e-5)


def test_sequence_logprobs_at_sampling_temperature_equal_sampler_logprobs(sampled, smol_tokenizer):
    ours = _teacher_forced(sampled, smol_tokenizer, TEMPERATURE)
    valid = sampled["valid"]
    assert valid.sum() >= 12  # enough sampled tokens compared
    assert torch.allclose(ours[valid], sampled["sampler_lp"][valid], atol=1e-5)


def test_logprobs_at_temperature_one_differ_from_sampler(sampled, smol_tokenizer):
    wrong = _teacher_forced(sampled, smol_tokenizer, 1.0)
    valid = sampled["valid"]
    assert (wrong[valid] - sampled["sampler_lp"][valid]).abs().max() > 1e-2


# --------------------------------------------------------------------------- the optional vLLM engine


def test_vllm_engine_module_imports_without_vllm_and_explains_how_to_install(monkeypatch):
    import importlib.util
    import sys

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    import rlft.rollout.vllm as vllm_engine

    assert "vllm" not in sys.modules
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING",
                       "1")  # restored afterwards; the constructor must not override it
    with pytest.raises(ImportError, match=r"pip install rlft\[vllm\]"):
        vllm_engine.VLLMEngine("no-such-model")
    assert "vllm" not in sys.modules
