"""rlft.data.chat: assistant loss masks built by diffing chat-template renders, checked token by token.

Templates: ChatML with the SmolLM2 tokenizer (pad == eos == <|im_end|>, injects a default system
prompt), ChatML with the Qwen2.5 tokenizer (injects "You are Qwen..."), our named "chatml" template
(no default system prompt) and our "llama3" template on the Qwen tokenizer with the Llama-3 markers
added as special tokens (no Llama-3 tokenizer offline; the point is a non-ChatML layout; Qwen's
pre-tokenizer, like Llama-3's, keeps "\n\n" one token whether or not text follows it).

The reference mask in these tests is derived independently of the implementation: it scans the
token ids for the assistant header (``<|im_start|>assistant\\n`` / ``<|start_header_id|>assistant
<|end_header_id|>\\n\\n``) and marks everything after it up to and including the next end-of-turn
token. Convention under test: content + end-of-turn token trained; header, ChatML's "\\n" after
<|im_end|>, system and user turns not trained.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlft.data.chat import (
    CHAT_TEMPLATES,
    ensure_chat_template,
    render_chat,
    render_generation_prompt,
    tokenize_preference_pair,
)
from rlft.data.tokenize import collate

torch.set_num_threads(1)

LLAMA3_MARKERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
EOT = {"smol": "<|im_end|>", "qwen": "<|im_end|>", "chatml": "<|im_end|>", "llama3": "<|eot_id|>"}
HEADER = {
    "smol": "<|im_start|>assistant\n",
    "qwen": "<|im_start|>assistant\n",
    "chatml": "<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
}
TEMPLATES = list(EOT)

SINGLE = [{"role": "user", "content": "What is the capital of France?"},
          {"role": "assistant", "content": "Paris is the capital."}]
MULTI = [
    {"role": "system", "content": "You are a concise travel guide."},
    {"role": "user", "content": "Plan a day in Rome."},
    {"role": "assistant", "content": "Morning: the Colosseum. Afternoon: the Vatican."},
    {"role": "user", "content": "And in the evening?"},
    {"role": "assistant", "content": "Dinner in Trastevere, then gelato by the Trevi fountain."},
    {"role": "user", "content": "Any tips for the metro?"},
    {"role": "assistant", "content": "Buy a 24-hour pass; line A stops near the Spanish Steps."},
]
MULTI_NO_SYSTEM = MULTI[1:5]


@pytest.fixture(scope="module")
def chatml_tokenizer(smol_tokenizer):
    """SmolLM2 tokenizer with our named ChatML template (no default system prompt)."""
    return ensure_chat_template(copy.deepcopy(smol_tokenizer), "chatml")


def with_llama3_markers(tokenizer):
    """A copy with the Llama-3 markers as special tokens and our llama3 template; like Llama-3,
    bos = <|begin_of_text|> and (as our recipes set it) pad == eos == <|eot_id|>."""
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": LLAMA3_MARKERS})
    tok.bos_token = "<|begin_of_text|>"
    tok.eos_token = "<|eot_id|>"
    tok.pad_token = "<|eot_id|>"
    return ensure_chat_template(tok, "llama3")


@pytest.fixture(scope="module")
def llama3_tokenizer(qwen_tokenizer):
    return with_llama3_markers(qwen_tokenizer)


@pytest.fixture
def tokenizer(request):
    name = {
        "smol": "smol_tokenizer", "qwen": "qwen_tokenizer", "chatml": "chatml_tokenizer", "llama3": "llama3_tokenizer"
    }
    return request.getfixturevalue(name[request.param])


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def masked_runs(ex) -> list[list[int]]:
    """Maximal runs of consecutive masked tokens."""
    runs, current = [], []
    for token, m in zip(ex.input_ids, ex.loss_mask):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def reference_mask(tok, ids: list[int], template: str) -> list[int]:
    """1 after every assistant header up to and including the next end-of-turn token (independent of chat.py)."""
    header = encode(tok, HEADER[template])
    eot = tok.convert_tokens_to_ids(EOT[template])
    mask = [0] * len(ids)
    j = 0
    while j < len(ids):
        if ids[j : j + len(header)] == header:
            j += len(header)
            while j < len(ids):
                mask[j] = 1
                j += 1
                if ids[j - 1] == eot:
                    break
        else:
            j += 1
    return mask


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------
# render_chat


@pytest.mark.parametrize("tokenizer", TEMPLATES, indirect=True, ids=TEMPLATES)
@pytest.mark.parametrize("messages", [SINGLE, MULTI, MULTI_NO_SYSTEM], ids=["single", "multi3", "multi2-nosys"])
def test_masks_token_by_token(tokenizer, messages, request):
    template = request.node.callspec.params["tokenizer"]
    ex = render_chat(tokenizer, messages, max_length=4096)
    assert not ex.truncated and len(ex.input_ids) == len(ex.loss_mask)
    assert ex.loss_mask == reference_mask(tokenizer, ex.input_ids, template)
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [decode(tokenizer, run) for run in masked_runs(ex)] == [r + EOT[template] for r in replies]
    # The sequence ends with the final end-of-turn token (ChatML's trailing "\n" is not part of it).
    assert ex.input_ids[-1] == tokenizer.convert_tokens_to_ids(EOT[template]) and ex.loss_mask[-1] == 1
    # User and system text only ever appears in unmasked tokens.
    unmasked = decode(tokenizer, [t for t, m in zip(ex.input_ids, ex.loss_mask) if not m])
    for m in messages:
        if m["role"] != "assistant":
            assert m["content"] in unmasked


@pytest.mark.parametrize("tokenizer", TEMPLATES, indirect=True, ids=TEMPLATES)
def test_last_assistant_masks_only_the_final_reply(tokenizer, request):
    template = request.node.callspec.params["tokenizer"]
    every = render_chat(tokenizer, MULTI, max_length=4096)
    last = render_chat(tokenizer, MULTI, train_on="last_assistant", max_length=4096)
    assert last.input_ids == every.input_ids
    assert [decode(tokenizer, run) for run in masked_runs(last)] == [MULTI[-1]["content"] + EOT[template]]
    assert all(m == 0 for m in last.loss_mask[: len(last.loss_mask) - len(masked_runs(last)[0])])


@pytest.mark.parametrize("tokenizer", TEMPLATES, indirect=True, ids=TEMPLATES)
def test_generation_prompt_plus_reply_equals_training_tokens(tokenizer, request):
    """For each assistant turn: encode(render_generation_prompt(before)) + reply + end-of-turn == training ids."""
    template = request.node.callspec.params["tokenizer"]
    ex = render_chat(tokenizer, MULTI, max_length=4096)
    starts = [i for i in range(len(ex.loss_mask)) if ex.loss_mask[i] and (i == 0 or not ex.loss_mask[i - 1])]
    turns = [i for i, m in enumerate(MULTI) if m["role"] == "assistant"]
    for start, turn in zip(starts, turns, strict=True):
        prompt_ids = encode(tokenizer, render_generation_prompt(tokenizer, MULTI[:turn]))
        assert ex.input_ids[:start] == prompt_ids
    # The final turn: prompt, then exactly the reply's tokens and the end-of-turn token.
    prompt_ids = encode(tokenizer, render_generation_prompt(tokenizer, MULTI[:-1]))
    reply_ids = encode(tokenizer, MULTI[-1]["content"]) + [tokenizer.convert_tokens_to_ids(EOT[template])]
    assert ex.input_ids == prompt_ids + reply_ids


def test_default_system_prompt_is_injected_but_never_masked(qwen_tokenizer, smol_tokenizer):
    for tok, text in ((qwen_tokenizer, "You are Qwen, created by Alibaba Cloud."), (smol_tokenizer, "named SmolLM")):
        ex = render_chat(tok, SINGLE, max_length=4096)
        first_masked = ex.loss_mask.index(1)
        assert text in decode(tok, ex.input_ids[:first_masked])
        assert text not in decode(tok, [t for t, m in zip(ex.input_ids, ex.loss_mask) if m])


def test_final_eos_is_trained_when_pad_equals_eos(smol_tokenizer):
    tok = smol_tokenizer
    assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    long = render_chat(tok, MULTI, max_length=4096)
    short = render_chat(tok, SINGLE, max_length=4096)
    batch = collate([long, short], pad_token_id=tok.pad_token_id)
    n = len(short.input_ids)
    assert batch.input_ids[1, n - 1] == tok.eos_token_id and batch.loss_mask[1, n - 1] == 1
    assert (batch.input_ids[1, n:] == tok.pad_token_id).all() and (batch.loss_mask[1, n:] == 0).all()
    # Every <|im_end|> closing an assistant turn is trained; those closing system/user turns are not.
    ids, mask = long.input_ids, long.loss_mask
    closing = [mask[i] for i, t in enumerate(ids) if t == tok.eos_token_id]
    assert closing == [0, 0, 1, 0, 1, 0, 1]  # system, user, assistant, user, assistant, user, assistant


def test_reply_starting_with_newline_is_tokenized_as_generated(qwen_tokenizer):
    """Qwen merges "\\n\\n" into one token; the reply is encoded after the prompt, as generation would."""
    tok = qwen_tokenizer
    messages = [{"role": "user", "content": "Write a haiku."},
                {"role": "assistant", "content": "\nLeaves drift\nslowly down"}]
    whole = encode(tok, tok.apply_chat_template(messages, tokenize=False))
    prompt_ids = encode(tok, render_generation_prompt(tok, messages[:1]))
    assert whole[: len(prompt_ids)] != prompt_ids  # the boundary merge this guards against
    ex = render_chat(tok, messages, max_length=4096)
    assert ex.input_ids[: len(prompt_ids)] == prompt_ids
    assert [decode(tok, run) for run in masked_runs(ex)] == ["\nLeaves drift\nslowly down<|im_end|>"]


def test_llama3_template_writes_one_bos(llama3_tokenizer):
    tok = llama3_tokenizer
    ex = render_chat(tok, MULTI, max_length=4096)
    bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
    assert ex.input_ids[0] == bos and ex.input_ids.count(bos) == 1
    # Llama-3 trims message content, as the original template does.
    padded = [{"role": "user", "content": "  hi  "}, {"role": "assistant", "content": " hello \n"}]
    assert [decode(tok, r) for r in masked_runs(render_chat(tok, padded, max_length=64))] == ["hello<|eot_id|>"]


def test_sft_conversation_ending_with_a_user_turn_stops_after_the_last_reply(smol_tokenizer):
    ex = render_chat(smol_tokenizer, MULTI[:4], max_length=4096)
    assert ex == render_chat(smol_tokenizer, MULTI[:3], max_length=4096)


def test_sft_truncation_cuts_the_end(smol_tokenizer):
    tok = smol_tokenizer
    full = render_chat(tok, MULTI, max_length=4096)
    cut = render_chat(tok, MULTI, max_length=len(full.input_ids) - 5)
    assert cut.truncated and cut.input_ids == full.input_ids[:-5] and cut.loss_mask == full.loss_mask[:-5]
    first = full.loss_mask.index(1)
    assert render_chat(tok, MULTI, max_length=first) is None  # no assistant token survives
    one = render_chat(tok, MULTI, max_length=first + 1)
    assert one.truncated and sum(one.loss_mask) == 1


def test_bad_inputs(smol_tokenizer):
    with pytest.raises(ValueError, match="no assistant turn"):
        render_chat(smol_tokenizer, SINGLE[:1], max_length=64)
    with pytest.raises(ValueError, match="role"):
        render_chat(smol_tokenizer, [{"role": "bot", "content": "x"}], max_length=64)
    with pytest.raises(ValueError, match="starts with an assistant turn"):
        render_chat(smol_tokenizer, [SINGLE[1], SINGLE[0]], max_length=64)
    with pytest.raises(ValueError, match="train_on"):
        render_chat(smol_tokenizer, SINGLE, train_on="everything", max_length=64)


# ---------------------------------------------------------------------------------------------
# Templates


def test_missing_template_names_the_flag_and_choices(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = None
    for call in (
        lambda: ensure_chat_template(tok, None),
        lambda: render_chat(tok, SINGLE, max_length=64),
        lambda: render_generation_prompt(tok, SINGLE[:1]),
        lambda: tokenize_preference_pair(tok, SINGLE[:1], "a", "b", max_length=64),
    ):
        with pytest.raises(ValueError, match="--chat-template") as info:
            call()
        assert "'chatml'" in str(info.value) and "'llama3'" in str(info.value) and ".jinja" in str(info.value)


def test_ensure_chat_template_by_name_and_file(smol_tokenizer, tmp_path):
    tok = copy.deepcopy(smol_tokenizer)
    assert ensure_chat_template(tok, None) is tok  # keeps its own
    assert ensure_chat_template(tok, "llama3").chat_template == CHAT_TEMPLATES["llama3"]
    path = tmp_path / "plain.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}<|im_end|>{% endfor %}"
                    "{% if add_generation_prompt %}[assistant] {% endif %}")
    ensure_chat_template(tok, str(path))
    ex = render_chat(tok, SINGLE, max_length=256)
    assert [decode(tok, r) for r in masked_runs(ex)] == ["Paris is the capital.<|im_end|>"]
    with pytest.raises(ValueError, match="unknown chat template 'vicuna'.*--chat-template"):
        ensure_chat_template(tok, "vicuna")


def test_template_without_prefix_property_is_refused(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    # Like Qwen3: the generation prompt opens an empty think block that the rendered reply does not have.
    tok.chat_template = CHAT_TEMPLATES["chatml"].replace("'<|im_start|>assistant\\n' -}}",
                                                         "'<|im_start|>assistant\\n<think>\\n' -}}")
    assert "<think>" in render_generation_prompt(tok, SINGLE[:1])
    with pytest.raises(ValueError, match="prefix property"):
        render_chat(tok, SINGLE, max_length=256)
    with pytest.raises(ValueError, match="prefix property"):
        tokenize_preference_pair(tok, SINGLE[:1], "a b c", "d e f", max_length=256)


# ---------------------------------------------------------------------------------------------
# Preference pairs

PROMPT = MULTI[:-1]
CHOSEN = "Buy a 24-hour pass; line A stops near the Spanish Steps."
REJECTED = "Walk everywhere."


@pytest.mark.parametrize("tokenizer", TEMPLATES, indirect=True, ids=TEMPLATES)
def test_preference_pair_masks_cover_only_the_response(tokenizer, request):
    template = request.node.callspec.params["tokenizer"]
    chosen, rejected = tokenize_preference_pair(tokenizer, PROMPT, CHOSEN, REJECTED, max_length=4096)
    prompt_ids = encode(tokenizer, render_generation_prompt(tokenizer, PROMPT))
    eot = tokenizer.convert_tokens_to_ids(EOT[template])
    for ex, reply in ((chosen, CHOSEN), (rejected, REJECTED)):
        assert not ex.truncated
        assert ex.input_ids == prompt_ids + encode(tokenizer, reply) + [eot]
        assert ex.loss_mask == [0] * len(prompt_ids) + [1] * (len(ex.input_ids) - len(prompt_ids))
        assert [decode(tokenizer, r) for r in masked_runs(ex)] == [reply + EOT[template]]
    # Same tokens as the last turn of an SFT render with train_on="last_assistant".
    last = render_chat(tokenizer, PROMPT + [{"role": "assistant", "content": CHOSEN}], train_on="last_assistant",
                       max_length=4096)
    assert (last.input_ids, last.loss_mask) == (chosen.input_ids, chosen.loss_mask)


def test_preference_truncation_keeps_prompt_end_and_response_start(smol_tokenizer):
    tok = smol_tokenizer
    long_reply = " ".join(f"step {i}." for i in range(60))
    full_c, full_r = tokenize_preference_pair(tok, PROMPT, long_reply, REJECTED, max_length=4096)
    prompt_ids = encode(tok, render_generation_prompt(tok, PROMPT))
    reply_ids = full_c.input_ids[len(prompt_ids):]
    # Prompt cut to 20 tokens from the left (its end kept, the system prompt lost), responses to 30 tokens.
    c, r = tokenize_preference_pair(tok, PROMPT, long_reply, REJECTED, max_length=50, max_prompt_length=20)
    assert c.input_ids == prompt_ids[-20:] + reply_ids[:30] and c.truncated
    assert c.loss_mask == [0] * 20 + [1] * 30
    assert decode(tok, c.input_ids[:20]).endswith("<|im_start|>assistant\n")
    assert "travel guide" not in decode(tok, c.input_ids)
    assert r.input_ids == prompt_ids[-20:] + full_r.input_ids[len(prompt_ids):] and r.truncated  # prompt was cut
    # Only the long response cut: the short one stays whole, end-of-turn included.
    room = len(reply_ids) - 10
    c, r = tokenize_preference_pair(tok, PROMPT, long_reply, REJECTED, max_length=len(prompt_ids) + room)
    assert c.truncated and c.input_ids == prompt_ids + reply_ids[:room] and c.input_ids[-1] != tok.eos_token_id
    assert not r.truncated and r == full_r


def test_preference_pairs_that_cannot_fit_are_dropped_and_counted(smol_tokenizer):
    tok = smol_tokenizer
    prompt_len = len(encode(tok, render_generation_prompt(tok, PROMPT)))
    pairs = [(PROMPT, CHOSEN, REJECTED), (PROMPT[-1:], CHOSEN, REJECTED), (PROMPT, "Yes.", "No.")]
    # Room for 7 response tokens after the long prompt: < min_response_tokens=8 -> dropped; but a
    # response shorter than 8 tokens only needs its own length.
    results = [tokenize_preference_pair(tok, p, c, r, max_length=prompt_len + 7) for p, c, r in pairs]
    assert results[0] is None and results[1] is not None and results[2] is not None
    assert sum(x is None for x in results) == 1
    kept = tokenize_preference_pair(tok, *pairs[0], max_length=prompt_len + 8)
    assert kept is not None and sum(kept[0].loss_mask) == 8
    # The same pair fits once the prompt may be cut.
    cut = tokenize_preference_pair(tok, *pairs[0], max_length=prompt_len + 7, max_prompt_length=prompt_len - 20)
    assert cut is not None and sum(cut[0].loss_mask) == min(27, len(encode(tok, CHOSEN)) + 1)
    assert cut[0].truncated and len(cut[0].input_ids) <= prompt_len + 7
    with pytest.raises(ValueError, match="rejected"):
        tokenize_preference_pair(tok, PROMPT, CHOSEN, "  ", max_length=4096)


def test_prompt_cut_keeps_a_single_llama3_bos(llama3_tokenizer):
    tok = llama3_tokenizer
    bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
    prompt_ids = encode(tok, render_generation_prompt(tok, PROMPT))
    c, _ = tokenize_preference_pair(tok, PROMPT, CHOSEN, REJECTED, max_length=4096, max_prompt_length=16)
    assert c.input_ids[:16] == [bos] + prompt_ids[-15:]


def test_tokenizer_unstable_at_turn_boundaries(smol_tokenizer):
    """SmolLM2's GPT-2-style pre-tokenizer writes "\n\n" as one token alone but as two before a word, so
    the Llama-3 header's "\n\n" tokenizes differently in a generation prompt and inside a conversation.
    Each reply then follows its generation prompt's own tokens (what generation sees); masks stay exact."""
    tok = with_llama3_markers(smol_tokenizer)
    header = "<|end_header_id|>\n\n"
    assert encode(tok, header)[-1:] != encode(tok, header + "Morning")[-3:-2]
    every = render_chat(tok, MULTI, max_length=4096)
    last = render_chat(tok, MULTI, train_on="last_assistant", max_length=4096)
    replies = [m["content"] + "<|eot_id|>" for m in MULTI if m["role"] == "assistant"]
    assert [decode(tok, r) for r in masked_runs(every)] == replies
    assert [decode(tok, r) for r in masked_runs(last)] == replies[-1:]
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    # last_assistant (and preference pairs): the whole generation prompt, then the reply.
    prompt_ids = encode(tok, render_generation_prompt(tok, MULTI[:-1]))
    assert last.input_ids == prompt_ids + encode(tok, MULTI[-1]["content"]) + [eot]
    assert tokenize_preference_pair(tok, MULTI[:-1], MULTI[-1]["content"], "No.", max_length=4096)[0] == last
    # all_assistant: the first reply follows its own generation prompt's tokens; later turns are appended
    # incrementally (the token stream of a chat that generated every reply), so here they differ from `last`.
    first = encode(tok, render_generation_prompt(tok, MULTI[:2]))
    assert every.input_ids[: len(first)] == first and every.loss_mask.index(1) == len(first)
    assert every.input_ids != last.input_ids
