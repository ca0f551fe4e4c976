"""SFT on chat data: smol-smoltalk-style conversations (loss on every assistant turn + end-of-turn),
Pref-FT on the real flattened UltraFeedback file, the chat template requirement, auto-detection.
Tiny random Llama with the SmolLM2 tokenizer (ChatML, pad == eos)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import rlft.recipes.sft as sft_recipe
from rlft.checkpoint import read_metrics
from rlft.data.chat import CHAT_TEMPLATES, render_chat
from rlft.data.files import DataError
from rlft.recipes.sft import SFTConfig, data_kind, load_sft_examples, train_sft

from tests.conftest import ASSETS, SHARED_DATA, make_tiny_model, save_model_dir, write_jsonl_rows

torch.set_num_threads(1)

UF_FILE = SHARED_DATA / "ultrafeedback" / "train_clean.jsonl"
CHAT = ASSETS / "chat"


def conversation(i: int) -> list[dict]:
    """A hand-made multi-turn chat in the smol-smoltalk schema; every 3rd has a system message."""
    turns = [
        {"role": "user", "content": f"Name colour number {i}."},
        {"role": "assistant", "content": f"Colour number {i} is blue."},
        {"role": "user", "content": "And its opposite?"},
        {"role": "assistant", "content": "Its opposite is orange."},
    ]
    return ([{"role": "system", "content": "Answer in one sentence."}] if i % 3 == 0 else []) + turns


@pytest.fixture(scope="module")
def smoltalk_file(tmp_path_factory) -> Path:
    return write_jsonl_rows(
        tmp_path_factory.mktemp("data") / "smoltalk.jsonl", [{"messages": conversation(i)} for i in range(8)])


@pytest.fixture(scope="module")
def no_template_folder(tmp_path_factory, smol_tokenizer) -> Path:
    """A model folder whose tokenizer has no chat template."""
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = None
    return save_model_dir(tmp_path_factory.mktemp("tiny-no-template"), make_tiny_model(len(smol_tokenizer), seed=0),
                          tok)


def make_cfg(model: Path, data: Path, output_dir: Path, **overrides) -> SFTConfig:
    cfg = SFTConfig(
        model=str(model), data=str(data), output_dir=str(output_dir), max_length=96, batch_size=4,
        micro_batch_size=2, max_steps=8, lr=3e-3, warmup_ratio=0.0, save_every=0, device="cpu", dtype="float32",
    )
    return replace(cfg, **overrides)


def masked_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    spans, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


# --------------------------------------------------------------------------- a chat SFT run


@pytest.fixture(scope="module")
def chat_run(tiny_model_dir, smoltalk_file, tmp_path_factory):
    """8 steps on the hand-made conversations (format auto-detected); records every micro-batch."""
    out = tmp_path_factory.mktemp("chat-run")
    batches = []
    real = sft_recipe.sequence_logprobs

    def spy(model, input_ids, attention_mask, loss_mask):
        batches.append((input_ids.clone(), attention_mask.clone(), loss_mask.clone()))
        return real(model, input_ids, attention_mask, loss_mask)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sft_recipe, "sequence_logprobs", spy)
        final = train_sft(make_cfg(tiny_model_dir, smoltalk_file, out))
    return {"dir": out, "final": final, "batches": batches}


def test_chat_run_learns(chat_run):
    records = read_metrics(chat_run["dir"] / "metrics.jsonl")
    losses = [r["loss/sft"] for r in records]
    assert len(losses) == 8 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < losses[0] - 0.5, losses
    stats = json.loads((chat_run["dir"] / "data_stats.json").read_text())
    assert stats["data_kind"] == "chat"
    assert (stats["rows"], stats["kept"], stats["skipped_invalid"], stats["examples"], stats["truncated"]) == (8, 8, 0,
                                                                                                               8, 0)


def test_batch_masks_are_render_chat_masks(chat_run, smol_tokenizer):
    tok = smol_tokenizer
    expected = {}
    for i in range(8):
        e = render_chat(tok, conversation(i), train_on="all_assistant", max_length=96)
        expected[tuple(e.input_ids)] = (e.loss_mask, conversation(i))
        # render_chat's mask: exactly the assistant turns, each with its <|im_end|>.
        replies = [m["content"] for m in conversation(i) if m["role"] == "assistant"]
        assert [tok.decode(s) for s in masked_spans(e.input_ids, e.loss_mask)] == [r + "<|im_end|>" for r in replies]
    seen = set()
    assert len(chat_run["batches"]) == 16  # 8 steps x 2 micro-batches
    for input_ids, attention_mask, loss_mask in chat_run["batches"]:
        for row in range(input_ids.shape[0]):
            n = int(attention_mask[row].sum())
            assert attention_mask[row, :n].all() and not attention_mask[row, n:].any()  # right padding
            ids = tuple(input_ids[row, :n].tolist())
            assert ids in expected
            assert loss_mask[row, :n].tolist() == expected[ids][0]
            assert not loss_mask[row, n:].any()
            seen.add(ids)
    assert len(seen) == 8


def test_saved_model_keeps_chat_template(chat_run, smol_tokenizer):
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(chat_run["final"]).chat_template == smol_tokenizer.chat_template


# --------------------------------------------------------------------------- Pref-FT on real UltraFeedback


@pytest.mark.skipif(not UF_FILE.is_file(), reason="../shared/data/ultrafeedback/train_clean.jsonl is missing")
def test_pref_ft_on_real_ultrafeedback(tiny_model_dir, tmp_path, smol_tokenizer, rlft_log):
    cfg = make_cfg(tiny_model_dir, UF_FILE, tmp_path / "prefft", data_format="chat", skip_invalid=True, limit=16,
                   max_length=128, max_steps=2, batch_size=8, micro_batch_size=8)
    rows = [json.loads(line) for line in UF_FILE.read_text().splitlines()]
    invalid = sum(not r["chosen"].strip() or not r["prompt"].strip() for r in rows)  # row 833: empty chosen
    assert invalid >= 1
    train_sft(cfg)
    stats = json.loads((tmp_path / "prefft" / "data_stats.json").read_text())
    assert (stats["rows"], stats["skipped_invalid"], stats["used"]) == (len(rows), invalid, 16)
    assert stats["truncated"] > 0 and stats["examples"] + stats["dropped_too_long"] == 16
    assert f"{stats['examples']} examples; {stats['truncated']} truncated to 128 tokens" in rlft_log.text
    assert f"skipped {invalid} invalid rows" in rlft_log.text
    assert len(read_metrics(tmp_path / "prefft" / "metrics.jsonl")) == 2

    # The examples are prompt (one user turn) + chosen reply, the reply masked from its first token.
    examples, _ = load_sft_examples(replace(cfg, max_length=4096, limit=3), smol_tokenizer)
    for example, row in zip(examples, rows[:3]):
        [span] = masked_spans(example.input_ids, example.loss_mask)
        assert smol_tokenizer.decode(span) == row["chosen"] + "<|im_end|>"
        assert row["prompt"] in smol_tokenizer.decode(example.input_ids)


def test_pref_ft_without_chat_format_hints_at_it(tmp_path, smol_tokenizer):
    path = write_jsonl_rows(tmp_path / "uf.jsonl", [{"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go."}])
    assert data_kind(SFTConfig(data=str(path))) == "prompt_completion"
    with pytest.raises(DataError, match="completion.*missing.*--data-format chat"):
        load_sft_examples(SFTConfig(data=str(path)), smol_tokenizer)
    examples, stats = load_sft_examples(SFTConfig(data=str(path), data_format="chat"), smol_tokenizer)
    assert stats["data_kind"] == "chat" and len(examples) == 1


# --------------------------------------------------------------------------- chat template


def test_no_chat_template_is_a_clear_error(no_template_folder, smoltalk_file, tmp_path):
    with pytest.raises(ValueError, match="no chat template.*--chat-template"):
        train_sft(make_cfg(no_template_folder, smoltalk_file, tmp_path / "run", max_steps=1))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_chat_template_option_supplies_one(no_template_folder, smoltalk_file, tmp_path, smol_tokenizer):
    from transformers import AutoTokenizer

    final = train_sft(make_cfg(no_template_folder, smoltalk_file, tmp_path / "run", max_steps=1,
                               chat_template="chatml"))
    assert AutoTokenizer.from_pretrained(final).chat_template == CHAT_TEMPLATES["chatml"]
    # The option replaces a tokenizer's own template too: chatml injects no default system prompt.
    tok = copy.deepcopy(smol_tokenizer)
    cfg = make_cfg(no_template_folder, smoltalk_file, tmp_path / "x", chat_template="chatml")
    examples, _ = load_sft_examples(cfg, tok)
    assert tok.chat_template == CHAT_TEMPLATES["chatml"]
    assert tok.decode(examples[1].input_ids).startswith("<|im_start|>user\nName colour number 1.<|im_end|>")
    assert "SmolLM" in smol_tokenizer.apply_chat_template(conversation(1), tokenize=False)


# --------------------------------------------------------------------------- detection and fixtures


@pytest.mark.parametrize("name, kind", [
    ("smoltalk.jsonl", "chat"),
    ("h4_train_sft.jsonl", "chat"),
    ("h4_train_prefs.jsonl", "chat"),  # H4 rows carry `messages` (the chosen conversation) too
    ("malformed_text.jsonl", "prompt_completion"),  # preference strings: Pref-FT only when asked
])
def test_auto_detection(name, kind):
    assert data_kind(SFTConfig(data=str(CHAT / name))) == kind


def test_fixture_files_all_assistant_turns(smol_tokenizer):
    examples, stats = load_sft_examples(SFTConfig(data=str(CHAT / "smoltalk.jsonl"), max_length=512), smol_tokenizer)
    rows = [json.loads(line)["messages"] for line in (CHAT / "smoltalk.jsonl").read_text().splitlines()]
    assert stats["examples"] == len(rows) == 4
    for example, messages in zip(examples, rows):
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [smol_tokenizer.decode(s) for s in masked_spans(example.input_ids, example.loss_mask)
                ] == [r + "<|im_end|>" for r in replies]


def test_skip_invalid_chat_rows_are_counted(smol_tokenizer):
    cfg = SFTConfig(data=str(CHAT / "malformed_chat.jsonl"), skip_invalid=True)
    _, stats = load_sft_examples(cfg, smol_tokenizer)
    assert (stats["rows"], stats["kept"], stats["skipped_invalid"]) == (8, 2, 6)
    with pytest.raises(DataError, match="row 1"):
        load_sft_examples(replace(cfg, skip_invalid=False), smol_tokenizer)
