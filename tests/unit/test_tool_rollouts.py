"""Rollouts with tool calls (rlft.rollout.turns, rlft.rollout.tools): the trajectory's ids and loss mask built by hand,
error observations for tools that fail, hang or return junk, bounds, and, on a tiny model that learned to call a tool,
the same samples at any batch size, the same greedy rollouts on every decoder, and sampler log-probs equal to teacher
forcing on the model's tokens only."""

from __future__ import annotations

import time

import pytest
import torch

from rlft.rl.batch import PassPlan, batch_logprobs, rollout_batch, sampler_logprobs
from rlft.rollout.base import SamplingParams
from rlft.rollout.decode import Decoded
from rlft.rollout.hf import HFEngine
from rlft.rollout.tools import ends_with_call, format_observation, parse_tool_call, run_tool_call
from rlft.rollout.refill import decode_jobs
from rlft.rollout.turns import ToolUse, generate_turns, generate_turns_inline
from tests.tool_model import PROMPTS, add

pytestmark = pytest.mark.usefixtures("one_thread")

CALL = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'


def ids_of(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def scripted(tok, turns_text: list[str], eos: bool = True):
    """A DecodeTurn that writes ``turns_text[t]`` in turn t (EOS after the last), recording what it was asked."""
    asked = []

    def decode_turn(prompts, jobs, seeds, budgets, stop):
        turn = len(asked)
        asked.append((prompts, jobs, seeds, budgets))
        ids = ids_of(tok, turns_text[turn])
        if turn == len(turns_text) - 1 and eos:
            ids = ids + [tok.eos_token_id]
        return [Decoded(ids[: budgets[n]], [-0.5] * len(ids[: budgets[n]])) for n in range(len(jobs))]

    return decode_turn, asked


def test_hand_built_trajectory_ids_mask_logprobs(smol_tokenizer):
    tok = smol_tokenizer
    decode_turn, asked = scripted(tok, [CALL, "Answer: 7"])
    prompt = ids_of(tok, "Add 3 and 4.\n")
    [[sample]] = generate_turns(decode_turn, tok, [prompt], SamplingParams(k=1, max_new_tokens=100, seed=1),
                                ToolUse({"add": add}), [tok.eos_token_id])
    call, obs, answer = ids_of(tok, CALL), ids_of(tok, format_observation("7")), ids_of(tok, "Answer: 7")
    assert sample.completion_ids == call + obs + answer + [tok.eos_token_id]
    assert sample.loss_mask == [1] * len(call) + [0] * len(obs) + [1] * (len(answer) + 1)
    assert sample.logprobs == [-0.5] * len(call) + [0.0] * len(obs) + [-0.5] * (len(answer) + 1)
    assert (sample.tool_calls, sample.tool_errors, sample.finish_reason) == (1, 0, "stop")
    assert sample.model_tokens == len(call) + len(answer) + 1
    assert sample.text.endswith("<tool_response>7</tool_response>\nAnswer: 7")
    # turn 1 continues from the whole context, with the model's budget less its own tokens (not the observation's)
    assert asked[1][0] == [prompt + call + obs] and asked[1][3] == [100 - len(call)]
    # the training batch: prompt 0, the model's tokens 1, the observation 0
    batch = rollout_batch(tok, ["Add 3 and 4.\n"], [[sample]])
    n = len(tok("Add 3 and 4.\n")["input_ids"])
    assert batch.loss_mask[0, :n].sum() == 0
    assert batch.loss_mask[0, n:].tolist() == [float(m) for m in sample.loss_mask]
    placed = sampler_logprobs(batch, [[sample]])
    assert torch.equal(placed[0, n:], torch.tensor([-0.5 * m for m in sample.loss_mask]))


def test_turn_and_observation_bounds(smol_tokenizer):
    tok = smol_tokenizer
    decode_turn, asked = scripted(tok, [CALL, CALL, CALL], eos=False)
    [[sample]] = generate_turns(decode_turn, tok, [ids_of(tok, "x")], SamplingParams(k=1, max_new_tokens=500),
                                ToolUse({"add": lambda a, b: "9" * 500}, max_turns=2, max_observation_tokens=5),
                                [tok.eos_token_id])
    assert len(asked) == 2  # the second turn's call gets no observation: the turn budget ends the rollout
    assert sample.tool_calls == 2 and sample.finish_reason == "length"
    assert sample.loss_mask.count(0) == 5  # one observation, cut to 5 tokens


@pytest.mark.parametrize("tool,expect", [
    (lambda a, b: 1 / 0, "error: division by zero"),
    (lambda a, b: object(), "error: the tool returned object, not text or a number"),
    (lambda a, b: time.sleep(30), "error: the tool 'add' took longer than 0.2 s"),
])
def test_failing_hanging_junk_tools_give_error_observations(smol_tokenizer, tool, expect):
    tok = smol_tokenizer
    decode_turn, asked = scripted(tok, [CALL, "Answer: 7"])
    t0 = time.perf_counter()
    [[sample]] = generate_turns(decode_turn, tok, [ids_of(tok, "x")], SamplingParams(k=1, max_new_tokens=100),
                                ToolUse({"add": tool}, timeout_s=0.2), [tok.eos_token_id])
    assert time.perf_counter() - t0 < 5
    assert f"<tool_response>{expect}</tool_response>" in sample.text
    assert (sample.tool_calls, sample.tool_errors, sample.finish_reason) == (1, 1, "stop")  # the rollout went on


def test_call_protocol():
    assert ends_with_call("try " + CALL + " \n") and not ends_with_call("</tool_call>")
    assert not ends_with_call(CALL + "</tool_call>")
    assert parse_tool_call('{"name": "add", "arguments": {"a": 1}}').arguments == {"a": 1}
    for junk in ("[1]", '{"arguments": {}}', '{"name": "add", "arguments": 3}', "{", "[" * 5000):
        result, ok = run_tool_call(junk, {"add": add})
        assert not ok and result.startswith("error: ")
    assert run_tool_call('{"name": "sub", "arguments": {}}', {"add": add}) == ("error: unknown tool 'sub'; tools: add",
                                                                                  False)
    assert run_tool_call('{"name": "add", "arguments": {"a": 1}}', {"add": add})[1] is False  # missing argument
    seen = {}

    def with_context(x, context):
        seen.update(context)
        return x * 2.5

    assert run_tool_call('{"name": "f", "arguments": {"x": 2}}', {"f": with_context}, {"target": 5}) == ("5", True)
    assert seen == {"target": 5}


def rollouts(model, tok, batch_size, params, decoder="auto"):
    engine = HFEngine(model, tok, batch_size=batch_size, decoder=decoder)
    return engine.generate(PROMPTS, params, tool_use=ToolUse({"add": add}))


def test_same_samples_at_any_batch_size_with_tools(tool_model, smol_tokenizer):
    # A row's draws come from its own generator (turn t: job_seed(seed, prompt, sample, t)), so its samples do not
    # depend on the batch. Exactly so at T = 0.7; at T = 0.9 a sample that goes off the rails draws from a near-flat
    # distribution, where another batch shape's float rounding can flip a draw to a neighbouring token
    # (rlft.rollout.refill's docstring): nearly all samples are equal there, and they differ among themselves.
    for temperature, least_equal in ((0.7, 16), (0.9, 14)):
        params = SamplingParams(k=4, temperature=temperature, max_new_tokens=48, seed=11)
        runs = [rollouts(tool_model, smol_tokenizer, size, params) for size in (1, 5, 16)]
        flat = [[(s.completion_ids, s.loss_mask) for row in run for s in row] for run in runs]
        for other in flat[1:]:
            assert sum(a == b for a, b in zip(flat[0], other)) >= least_equal
        samples = [s for row in runs[0] for s in row]
        assert sum(s.tool_calls for s in samples) >= 4  # the model does call: the test exercises turns
    assert len({tuple(s.completion_ids) for s in samples}) >= 5  # at T = 0.9 the samples differ


def test_greedy_rollouts_equal_on_every_decoder(tool_model, smol_tokenizer):
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=48)
    runs = [rollouts(tool_model, smol_tokenizer, 3, params, decoder) for decoder in ("drop", "refill", "generate")]
    flat = [[(s.completion_ids, s.loss_mask, s.finish_reason) for row in run for s in row] for run in runs]
    assert flat[0] == flat[1] == flat[2]
    assert any(s.tool_calls for row in runs[0] for s in row)


def test_sampler_logprobs_equal_teacher_forcing_on_model_tokens(tool_model, smol_tokenizer):
    tok = smol_tokenizer
    samples = rollouts(tool_model, tok, 8, SamplingParams(k=2, temperature=1.0, max_new_tokens=48, seed=5))
    assert any(s.loss_mask.count(0) for row in samples for s in row)
    batch = rollout_batch(tok, PROMPTS, samples)
    forced = batch_logprobs(tool_model, batch, PassPlan(temperature=1.0, micro_batch_size=4))
    sampled = sampler_logprobs(batch, samples)
    mask = batch.loss_mask.bool()
    # cached decoding and one full forward differ by float rounding (~1e-4 on this peaked model); a log-prob read one
    # position off, or an observation token counted as the model's, differs by far more
    assert torch.allclose(forced[mask], sampled[mask], atol=2e-3)
    assert (forced[mask] - sampled[mask]).abs().mean() < 2e-4
    assert (forced[~mask] == 0).all() and (sampled[~mask] == 0).all()  # observations: no log-prob, no loss term


def test_inline_turns_equal_turn_by_turn_and_prefill_each_prompt_once(tool_model, smol_tokenizer):
    # generate_turns_inline (one continuous batch, each row's cache kept across its calls, the observation fed one
    # decoding step per id) against generate_turns (each turn t > 0 prefills its rows' whole contexts again) on the
    # same decoder: the same samples, masks, calls and finish reasons (cached and prefilled contexts differ by float
    # rounding only), while only the inline rollouts never prefill a context twice
    tok, tools = smol_tokenizer, ToolUse({"add": add})
    params = SamplingParams(k=4, temperature=0.7, max_new_tokens=48, seed=3)
    prompt_ids = [ids_of(tok, p) for p in PROMPTS]
    eos = [tok.eos_token_id]
    widths = {"inline": [], "turns": []}

    def decode_all(prompts, jobs, stop, resume):
        return decode_jobs(tool_model, prompts, jobs, params, eos, batch_size=5, pad_id=eos[0], seed=params.seed,
                           loop_stop=stop, resume=resume, on_forward=lambda n, w: widths["inline"].append((n, w)))

    def decode_turn(prompts, jobs, seeds, budgets, stop):
        return decode_jobs(tool_model, prompts, jobs, params, eos, batch_size=5, pad_id=eos[0], seed=params.seed,
                           loop_stop=stop, seeds=seeds, budgets=budgets,
                           on_forward=lambda n, w: widths["turns"].append((n, w)))

    inline = generate_turns_inline(decode_all, tok, prompt_ids, params, tools, eos)
    turns = generate_turns(decode_turn, tok, prompt_ids, params, tools, eos)
    a = [(s.completion_ids, s.loss_mask, s.tool_calls, s.finish_reason) for row in inline for s in row]
    b = [(s.completion_ids, s.loss_mask, s.tool_calls, s.finish_reason) for row in turns for s in row]
    assert a == b
    assert sum(s.tool_calls for row in inline for s in row) >= 4  # turns were exercised
    for x, y in zip((s for row in inline for s in row), (s for row in turns for s in row)):
        assert x.logprobs == pytest.approx(y.logprobs, abs=2e-3)
    prefilled = {mode: sum(n for n, w in calls if w > 1) for mode, calls in widths.items()}  # rows prefilled
    assert prefilled["inline"] == len(prompt_ids)  # each prompt once, nothing else
    assert prefilled["turns"] >= len(prompt_ids) + 4  # and each call's context again
