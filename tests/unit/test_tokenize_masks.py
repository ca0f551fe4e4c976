"""Loss masks token by token, per tokenizer and per Countdown prompt template (docs/design.md pitfalls 1-2),
collation, truncation."""

from __future__ import annotations

import pytest
import torch

from rlft.data.tokenize import TokenizedExample, collate, tokenize_prompt_completion
from rlft.tasks.countdown.generator import PRESETS, generate_tasks
from rlft.tasks.countdown.prompts import render_prompt
from rlft.tasks.countdown.traces import write_trace

torch.set_num_threads(1)

TOKENIZERS = ["qwen_tokenizer", "smol_tokenizer"]
TEMPLATES = ["base", "short", "chat"]


@pytest.fixture(params=TOKENIZERS)
def tokenizer(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(PRESETS["easy3"], 4, seed=5) + generate_tasks(PRESETS["standard"], 4, seed=6)


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _check_example(tokenizer, prompt: str, completion: str, ex: TokenizedExample) -> None:
    prompt_ids = tokenizer(prompt).input_ids
    n = len(prompt_ids)
    assert len(ex.input_ids) == len(ex.loss_mask)
    # Prompt part: exactly what generation sees, never a target.
    assert ex.input_ids[:n] == prompt_ids
    assert ex.loss_mask[:n] == [0] * n
    # Completion part: every token a target, the last one the real EOS.
    assert ex.loss_mask[n:] == [1] * (len(ex.input_ids) - n)
    assert ex.input_ids[-1] == tokenizer.eos_token_id and ex.loss_mask[-1] == 1
    targets = [t for t, m in zip(ex.input_ids, ex.loss_mask) if m == 1]
    assert _decode(tokenizer, targets) == completion + tokenizer.eos_token
    assert _decode(tokenizer, ex.input_ids) == prompt + completion + tokenizer.eos_token
    assert not ex.truncated


@pytest.mark.parametrize("template", TEMPLATES)
def test_countdown_template_masks_cover_exactly_completion_and_eos(tokenizer, template, tasks):
    for i, task in enumerate(tasks):
        prompt = render_prompt(template, task, tokenizer)
        completion = write_trace(task, "search", seed=i)
        ex = tokenize_prompt_completion(tokenizer, prompt, completion, max_length=1024)
        assert ex is not None
        _check_example(tokenizer, prompt, completion, ex)


def test_chat_template_prompt_tokens_hold_the_assistant_header(tokenizer, tasks):
    """The chat prompt's special tokens are real special tokens (not text), and all are unmasked."""
    prompt = render_prompt("chat", tasks[0], tokenizer)
    ex = tokenize_prompt_completion(tokenizer, prompt, write_trace(tasks[0]), max_length=1024)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    prompt_part = [t for t, m in zip(ex.input_ids, ex.loss_mask) if m == 0]
    assert prompt_part.count(start) == 3  # system, user, assistant
    assert start not in [t for t, m in zip(ex.input_ids, ex.loss_mask) if m == 1]


@pytest.mark.parametrize(
    "prompt, completion",
    [
        ("Question: what is 2 + 2?\nAnswer:", " 4"),
        ("Say hello.\n", "Hello, world! Ça va? 你好"),
        ("User: x\nAssistant: <think>", " a\n\nb</think>\n<answer>1 + 2</answer>"),
    ],
)
def test_plain_text_masks_cover_exactly_completion_and_eos(tokenizer, prompt, completion):
    ex = tokenize_prompt_completion(tokenizer, prompt, completion, max_length=256)
    _check_example(tokenizer, prompt, completion, ex)


def test_final_eos_is_a_target_when_pad_equals_eos(smol_tokenizer):
    """Pitfall 1: with pad == eos the real EOS must stay in the loss mask."""
    tok = smol_tokenizer
    assert tok.pad_token_id == tok.eos_token_id  # the precondition this test is about
    ex = tokenize_prompt_completion(tok, "User: hi\nAssistant:", " hello", max_length=64)
    assert ex.input_ids[-1] == tok.eos_token_id
    assert ex.loss_mask[-1] == 1


def test_qwen_pad_differs_from_eos_and_eos_is_im_end(qwen_tokenizer):
    tok = qwen_tokenizer
    assert tok.pad_token_id != tok.eos_token_id
    ex = tokenize_prompt_completion(tok, "User: hi\nAssistant:", " hello", max_length=64)
    assert ex.input_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and ex.loss_mask[-1] == 1


def test_add_eos_false_leaves_no_eos(smol_tokenizer):
    ex = tokenize_prompt_completion(smol_tokenizer, "Q:", " yes", max_length=64, add_eos=False)
    assert ex.input_ids[-1] != smol_tokenizer.eos_token_id
    assert _decode(smol_tokenizer, [t for t, m in zip(ex.input_ids, ex.loss_mask) if m]) == " yes"


# --------------------------------------------------------------------------- collate


def test_collate_pads_right_and_keeps_real_eos_as_target_when_pad_equals_eos(smol_tokenizer):
    tok = smol_tokenizer
    pairs = [("User: hi\nAssistant:", " hello there, how are you"), ("Q:", " ok"), ("Question: 1+1?\nA:", " 2")]
    examples = [tokenize_prompt_completion(tok, p, c, max_length=64) for p, c in pairs]
    batch = collate(examples, tok.pad_token_id)
    width = max(len(e.input_ids) for e in examples)
    assert batch.input_ids.shape == batch.attention_mask.shape == batch.loss_mask.shape == (3, width)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        assert batch.input_ids[i, :n].tolist() == e.input_ids
        assert batch.loss_mask[i, :n].tolist() == e.loss_mask
        assert batch.attention_mask[i, :n].tolist() == [1] * n
        # Padding: pad id (== eos id here) but never attended to or trained on.
        assert batch.input_ids[i, n:].tolist() == [tok.pad_token_id] * (width - n)
        assert batch.attention_mask[i, n:].sum() == 0 and batch.loss_mask[i, n:].sum() == 0
        # The real EOS (same id as the padding) keeps loss 1.
        assert batch.input_ids[i, n - 1] == tok.eos_token_id and batch.loss_mask[i, n - 1] == 1
    assert batch.num_loss_tokens == sum(sum(e.loss_mask) for e in examples)
    assert batch.input_ids.dtype == torch.long and batch.loss_mask.dtype == torch.float32


def test_collate_empty_list_raises():
    with pytest.raises(ValueError):
        collate([], 0)


# --------------------------------------------------------------------------- truncation


def test_truncation_keeps_prompt_and_cuts_completion_end(tokenizer):
    prompt, completion = "User: count to ten.\nAssistant:", " one two three four five six seven eight nine ten"
    prompt_ids = tokenizer(prompt).input_ids
    completion_ids = tokenizer(completion, add_special_tokens=False).input_ids
    full = len(prompt_ids) + len(completion_ids) + 1

    fits = tokenize_prompt_completion(tokenizer, prompt, completion, max_length=full)
    assert not fits.truncated and len(fits.input_ids) == full

    # One token short: the EOS goes first.
    cut1 = tokenize_prompt_completion(tokenizer, prompt, completion, max_length=full - 1)
    assert cut1.truncated and cut1.input_ids == prompt_ids + completion_ids
    assert cut1.loss_mask == [0] * len(prompt_ids) + [1] * len(completion_ids)

    # Room for three completion tokens: the prompt is whole, the completion's start is kept.
    cut3 = tokenize_prompt_completion(tokenizer, prompt, completion, max_length=len(prompt_ids) + 3)
    assert cut3.truncated
    assert cut3.input_ids == prompt_ids + completion_ids[:3]
    assert cut3.loss_mask == [0] * len(prompt_ids) + [1, 1, 1]
    assert tokenizer.eos_token_id not in cut3.input_ids[len(prompt_ids) :]


def test_prompt_too_long_returns_none(tokenizer):
    prompt = "word " * 40
    n = len(tokenizer(prompt).input_ids)
    assert tokenize_prompt_completion(tokenizer, prompt, " x", max_length=n - 1) is None
    assert tokenize_prompt_completion(tokenizer, prompt, " x", max_length=n) is None  # no room left
    one = tokenize_prompt_completion(tokenizer, prompt, " x", max_length=n + 1)
    assert one is not None and sum(one.loss_mask) == 1 and one.truncated
