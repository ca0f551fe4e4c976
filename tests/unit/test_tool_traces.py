"""Countdown ``calc`` traces (SFT data with tool calls), completions cut at their observations, and their loss masks:
every observation is the tool's real output as a rollout appends it, the search is ``bounded``'s, the observation
tokens are never trained (tokenize_segments, and ``rlft sft --trace-style calc`` end to end on a tiny model)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import rlft.recipes.sft as sft_recipe
from rlft.data.tokenize import tokenize_prompt_completion, tokenize_segments
from rlft.rewards.countdown import compute_score
from rlft.rewards.countdown_calc import CALC_TOOLS
from rlft.rollout import tools
from rlft.tasks.countdown import calc as calc_text
from rlft.tasks.countdown.calc import call_text, has_observations, observation_text, trace_segments
from rlft.tasks.countdown.generator import PRESETS, generate_tasks
from rlft.tasks.countdown.prompts import calc_prompt, short_prompt
from rlft.tasks.countdown.traces import TRACE_STYLES, write_trace
from rlft.types import CountdownTask, PromptCompletion
from rlft.validation import OptionError

torch.set_num_threads(1)

TASK = CountdownTask(nums=(3, 5, 7), target=22)
CALL_26 = '<tool_call>{"name":"calc","arguments":{"expression":"3*7+5"}}</tool_call>'
CALL_22 = '<tool_call>{"name":"calc","arguments":{"expression":"3*5+7"}}</tool_call>'
OBS_26 = "\n<tool_response>26</tool_response>\n"
OBS_22 = "\n<tool_response>22</tool_response>\n"


# --------------------------------------------------------------------------- the protocol's text


def test_the_text_written_is_the_rollout_protocol():
    assert (calc_text.TOOL_CALL_OPEN, calc_text.TOOL_CALL_CLOSE) == (tools.TOOL_CALL_OPEN, tools.TOOL_CALL_CLOSE)
    assert (calc_text.RESPONSE_OPEN, calc_text.RESPONSE_CLOSE) == (tools.RESPONSE_OPEN, tools.RESPONSE_CLOSE)
    for result in ("26", "4.4", "error: division by zero", "a\nb", ""):
        assert observation_text(result) == tools.format_observation(result)
    assert call_text("3*7+5") == CALL_26
    assert tools.ends_with_call(" x" + CALL_26)
    assert tools.parse_tool_call(tools.last_call(CALL_26)) == tools.ToolCall("calc", {"expression": "3*7+5"})


# --------------------------------------------------------------------------- cutting a completion


def test_trace_segments_by_hand():
    text = " " + CALL_26 + OBS_26 + CALL_22 + OBS_22 + "</think>\n<answer>3 * 5 + 7</answer>"
    assert trace_segments(text) == [(" " + CALL_26, True), (OBS_26, False), (CALL_22, True), (OBS_22, False),
                                    ("</think>\n<answer>3 * 5 + 7</answer>", True)]
    assert trace_segments("") == [] and trace_segments("no tools") == [("no tools", True)]
    assert not has_observations("no tools") and has_observations(text)
    # whitespace between the call and its observation stays the model's; a result may span lines
    assert trace_segments("a</tool_call> " + observation_text("x\ny") + "b") == [
        ("a</tool_call> ", True), ("\n<tool_response>x\ny</tool_response>\n", False), ("b", True)]
    # an observation ending the completion, and one right at its start after a call
    assert trace_segments(CALL_26 + OBS_26) == [(CALL_26, True), (OBS_26, False)]


@pytest.mark.parametrize("text", [
    "I guess\n<tool_response>26</tool_response>\nthen",  # written by the model, not after a call
    CALL_26 + "\n<tool_response>26",  # never closes
    CALL_26 + "<tool_response>26</tool_response>\n",  # no newline before it: not what format_observation writes
    CALL_26 + " so\n<tool_response>26</tool_response>\n",  # text between the call and it
])
def test_tool_responses_the_model_wrote_are_trained(text):
    assert trace_segments(text) == [(text, True)]


def test_segments_join_back_and_alternate():
    tasks = generate_tasks(PRESETS["medium3"], 40, seed=3)
    for i, task in enumerate(tasks):
        for style in TRACE_STYLES:
            trace = write_trace(task, style, seed=i, give_up=0.3)
            segments = trace_segments(trace)
            assert "".join(text for text, _ in segments) == trace
            assert all(a[1] != b[1] for a, b in zip(segments, segments[1:]))  # no two trained pieces in a row
            assert (style == "calc") == any(not trained for _, trained in segments)


# --------------------------------------------------------------------------- calc traces


def test_calc_trace_examples():
    """(3, 5, 7) -> 22, as ``bounded`` searches it: 3*7+5 = 26 first (the first-ranked try 3*7 = 21 finished
    greedily), then 3*5+7 = 22."""
    answer = "</think>\n<answer>3 * 5 + 7</answer>"
    assert write_trace(TASK, "calc", give_up=0.0) == " " + CALL_26 + OBS_26 + CALL_22 + OBS_22 + answer
    assert write_trace(TASK, "calc", give_up=1.0) == (
        " " + CALL_26 + OBS_26 + "Closest: 3*7+5=26.</think>\n<answer>3 * 7 + 5</answer>")
    assert write_trace(TASK, "calc", give_up=0.0, max_tries=1) == write_trace(TASK, "calc", give_up=1.0)
    first = CountdownTask(nums=(3, 5, 7), target=26)  # the first-ranked try is the solution
    assert write_trace(first, "calc", give_up=1.0) == " " + CALL_26 + OBS_26 + "</think>\n<answer>3 * 7 + 5</answer>"
    for give_up, score in ((0.0, 1.0), (1.0, 0.1)):
        assert compute_score(calc_prompt(TASK) + write_trace(TASK, "calc", give_up=give_up),
                             TASK.ground_truth()) == score


def _calls_and_observations(trace: str) -> list[tuple[str, str]]:
    """``(call payload, observation)`` pairs of a trace, read with the rollout's own parser."""
    pairs, written = [], ""
    for text, trained in trace_segments(trace):
        if not trained:
            assert tools.ends_with_call(written), written
            pairs.append((tools.last_call(written), text))
        written += text
    return pairs


@pytest.mark.parametrize("preset", ["easy3", "medium3", "standard", "cog_behav", "tiny"])
def test_every_observation_is_what_the_tool_returns_in_a_rollout(preset):
    """Each call run by :func:`rlft.rollout.tools.run_tool_call` with the task as context gives exactly the
    observation the trace holds; every call uses the task's numbers (no error), and the trace ends after its last
    observation with ``</think>`` (solved) or a ``Closest:`` line."""
    tasks = generate_tasks(PRESETS[preset], 150, seed=17)
    for i, task in enumerate(tasks):
        for give_up in (0.0, 0.6):
            trace = write_trace(task, "calc", seed=i, give_up=give_up)
            pairs = _calls_and_observations(trace)
            assert pairs, trace
            for payload, observation in pairs:
                result, ok = tools.run_tool_call(payload, CALC_TOOLS, task.ground_truth())
                assert ok and tools.format_observation(result) == observation, (task, payload, observation)
                assert int(result) >= 0  # Countdown values: whole and non-negative
            tail = trace_segments(trace)[-1][0]
            assert tail.startswith("</think>\n<answer>") or tail.startswith("Closest: "), tail


def test_calc_traces_search_as_bounded_does():
    """Same seed and patience: as many calls as ``bounded`` writes tries, each call's value the try's, and the same
    answer (solved or closest)."""
    tasks = generate_tasks(PRESETS["standard"], 150, seed=23)
    for i, task in enumerate(tasks):
        for give_up in (0.0, 0.3, 1.0):
            bounded = write_trace(task, "bounded", seed=i, give_up=give_up)
            calc = write_trace(task, "calc", seed=i, give_up=give_up)
            tries = bounded.split("</think>")[0].strip().split("\n")
            tries = [line for line in tries if not line.startswith("Closest")]
            observations = [obs for _, obs in _calls_and_observations(calc)]
            assert len(observations) == len(tries)
            for line, observation in zip(tries, observations):
                value = line.partition(" Check:")[0].rstrip(".,no ").rsplit("=", 1)[1]
                assert observation == observation_text(value), (line, observation)
            assert bounded.rsplit("\n", 1)[1] == calc.rsplit("\n", 1)[1]  # the answer line


def test_a_patient_search_ends_in_the_right_answer():
    """give_up 0: every trace whose solution is within max_tries + 1 tries scores 1.0 on prompt + trace (the exact
    score); the others answer their closest attempt (0.1). With room for every try all score 1.0."""
    tasks = generate_tasks(PRESETS["standard"], 200, seed=29)
    scores = [compute_score(calc_prompt(t) + write_trace(t, "calc", seed=i, give_up=0.0, max_tries=6),
                            t.ground_truth()) for i, t in enumerate(tasks)]
    assert set(scores) <= {1.0, 0.1} and scores.count(1.0) > 0.6 * len(tasks)
    for i, task in enumerate(tasks):
        trace = write_trace(task, "calc", seed=i, give_up=0.0, max_tries=99)
        assert compute_score(calc_prompt(task) + trace, task.ground_truth()) == 1.0, trace
        assert compute_score(short_prompt(task) + trace, task.ground_truth()) == 1.0


# --------------------------------------------------------------------------- loss masks


SEGMENTS = [(" <tool_call>", True), ("\n<tool_response>7</tool_response>\n", False), ("</think> 7", True)]


def test_tokenize_segments_mask_by_hand(smol_tokenizer):
    """SmolLM2 (no BOS, EOS id 2): 'Q: 3+4?' is 7 tokens; ' <tool_call>' 5 (' <' 'tool' '_' 'call' '>'); the
    observation 13 ('\\n' '<' 'tool' '_' 'response' '>' '7' '</' 'tool' '_' 'response' '>' '\\n'); '</think> 7' 5
    ('</' 'think' '>' ' ' '7'); then the EOS."""
    example = tokenize_segments(smol_tokenizer, "Q: 3+4?", SEGMENTS, max_length=64)
    assert example.input_ids == [65, 42, 216, 35, 27, 36, 47, 2067, 19324, 79, 4350, 46, 198, 44, 19324, 79, 7639, 46,
                                 39, 9617, 19324, 79, 7639, 46, 198, 9617, 17400, 46, 216, 39, 2]
    assert example.loss_mask == [0] * 7 + [1] * 5 + [0] * 13 + [1] * 5 + [1]
    assert not example.truncated
    cut = tokenize_segments(smol_tokenizer, "Q: 3+4?", SEGMENTS, max_length=20)  # room for 13 completion tokens
    assert cut.input_ids == example.input_ids[:20] and cut.loss_mask == [0] * 7 + [1] * 5 + [0] * 8 and cut.truncated
    assert tokenize_segments(smol_tokenizer, "Q: 3+4?", SEGMENTS, max_length=7) is None
    no_eos = tokenize_segments(smol_tokenizer, "Q: 3+4?", SEGMENTS, max_length=64, add_eos=False)
    assert no_eos.input_ids == example.input_ids[:-1] and no_eos.loss_mask == example.loss_mask[:-1]
    with pytest.raises(ValueError, match="segment 1: expected a"):
        tokenize_segments(smol_tokenizer, "Q", [("a", True), ("b", 0)], max_length=64)


@pytest.mark.parametrize("tokenizer_name", ["smol_tokenizer", "qwen_tokenizer"])
def test_one_trained_segment_is_the_plain_tokenization(tokenizer_name, request):
    """A completion with no observation gives exactly tokenize_prompt_completion's example, truncation included."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    for i, task in enumerate(generate_tasks(PRESETS["standard"], 6, seed=2)):
        prompt, trace = short_prompt(task), write_trace(task, "search", seed=i)
        for max_length in (512, 60, 10):
            assert tokenize_segments(tokenizer, prompt, trace_segments(trace), max_length=max_length) == \
                tokenize_prompt_completion(tokenizer, prompt, trace, max_length=max_length)


def test_calc_trace_masks_cover_exactly_the_models_text(smol_tokenizer):
    tok = smol_tokenizer
    for i, task in enumerate(generate_tasks(PRESETS["medium3"], 10, seed=4)):
        prompt, trace = calc_prompt(task), write_trace(task, "calc", seed=i, give_up=0.3)
        example = tokenize_segments(tok, prompt, trace_segments(trace), max_length=1024)
        n = len(tok(prompt).input_ids)
        trained = [t for t, m in zip(example.input_ids[n:], example.loss_mask[n:]) if m]
        untrained = [t for t, m in zip(example.input_ids[n:], example.loss_mask[n:]) if not m]
        own = "".join(text for text, keep in trace_segments(trace) if keep)
        observed = "".join(text for text, keep in trace_segments(trace) if not keep)
        assert tok.decode(trained) == own + tok.eos_token and tok.decode(untrained) == observed
        assert example.loss_mask[:n] == [0] * n


# --------------------------------------------------------------------------- rlft sft --trace-style calc


def test_calc_traces_need_the_calc_prompt():
    with pytest.raises(OptionError, match="--trace-style calc needs --prompt-template calc"):
        sft_recipe.SFTConfig(trace_style="calc")
    with pytest.raises(OptionError, match="--trace-style calc needs --prompt-template calc"):
        sft_recipe.SFTConfig(trace_style="calc", prompt_template="base")
    assert sft_recipe.SFTConfig(trace_style="calc", prompt_template="calc").trace_style == "calc"
    assert sft_recipe.SFTConfig(prompt_template="calc").trace_style == "search"  # the prompt alone is fine


def test_sft_pairs_of_any_source_mask_their_observations(smol_tokenizer):
    """A file's prompt/completion pairs go through the same tokenization: observations after a call untrained."""
    pairs = [PromptCompletion("Q:", " " + CALL_26 + OBS_26 + "done"), PromptCompletion("Q:", " plain")]
    with_calls, plain = sft_recipe.tokenize_pairs(pairs, smol_tokenizer, 256)
    obs_ids = smol_tokenizer(OBS_26, add_special_tokens=False).input_ids
    n = len(smol_tokenizer("Q:").input_ids) + len(smol_tokenizer(" " + CALL_26, add_special_tokens=False).input_ids)
    assert with_calls.input_ids[n : n + len(obs_ids)] == obs_ids
    assert with_calls.loss_mask[n : n + len(obs_ids)] == [0] * len(obs_ids)
    assert sum(with_calls.loss_mask) == len(with_calls.input_ids) - len(smol_tokenizer("Q:").input_ids) - len(obs_ids)
    assert plain == tokenize_prompt_completion(smol_tokenizer, "Q:", " plain", max_length=256)


def test_sft_run_with_calc_traces_trains_no_observation_token(tiny_model_dir, tmp_path, monkeypatch, smol_tokenizer):
    """``rlft sft --trace-style calc --prompt-template calc`` on a tiny model: the micro-batches' loss masks are 0
    on every token of every observation (and the prompt), 1 on the rest of the completion and its EOS."""
    tok = smol_tokenizer
    cfg = sft_recipe.SFTConfig(model=str(tiny_model_dir), data="countdown", preset="tiny", num_train=8,
                               trace_style="calc", prompt_template="calc", give_up=0.0, output_dir=str(tmp_path / "r"),
                               max_length=512, batch_size=8, micro_batch_size=8, max_steps=1, lr=1e-3,
                               warmup_ratio=0.0, save_every=0, device="cpu", dtype="float32")
    pairs = sft_recipe.load_sft_pairs(cfg, tok)
    assert all(has_observations(p.completion) for p in pairs)
    expected = {}
    for p in pairs:
        ids, mask = tok(p.prompt).input_ids, [0] * len(tok(p.prompt).input_ids)
        for text, trained in trace_segments(p.completion):
            piece = tok(text, add_special_tokens=False).input_ids
            ids, mask = ids + piece, mask + [int(trained)] * len(piece)
        expected[tuple(ids + [tok.eos_token_id])] = mask + [1]
    seen = []
    real = sft_recipe.micro_batch_logprobs

    def spy(model, examples, pad_token_id, device, config):
        logprobs, loss_mask, n = real(model, examples, pad_token_id, device, config)
        for row, example in enumerate(examples):
            width = len(example.input_ids)
            assert loss_mask[row, :width].tolist() == expected[tuple(example.input_ids)]
            assert loss_mask[row, width:].sum() == 0
            response = [i for i, _ in enumerate(example.input_ids)
                        if "response" in tok.decode(example.input_ids[i : i + 1])]
            assert response and all(loss_mask[row, i] == 0 for i in response)
        seen.extend(examples)
        return logprobs, loss_mask, n

    monkeypatch.setattr(sft_recipe, "micro_batch_logprobs", spy)
    final = sft_recipe.train_sft(cfg)
    assert len(seen) == 8 and (final / "config.json").is_file()
    with pytest.raises(OptionError):
        replace(cfg, prompt_template="short")
