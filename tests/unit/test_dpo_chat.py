"""DPO on chat preference data: H4 / flattened UltraFeedback / HH rows rendered with the chat template,
loss on the final reply + end-of-turn only; ties and too-long pairs dropped and counted; the format
auto-detection; a synthetic preference learned; the reference cache fingerprint. Tiny random Llama
with the SmolLM2 tokenizer (ChatML, pad == eos)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import rlft.recipes.dpo as dpo_recipe
from rlft.checkpoint import read_metrics
from rlft.data.chat import CHAT_TEMPLATES, render_generation_prompt
from rlft.models import pick_device
from rlft.recipes.dpo import DPOConfig, reference_logprobs, train_dpo
from rlft.recipes.dpo_data import data_format, load_tokenized_pairs, read_chat_pairs, tokenize_chat_pair
from rlft.tasks.countdown.prompts import render_prompt
from rlft.types import CountdownTask

from tests.conftest import ASSETS, SHARED_DATA, write_jsonl_rows

torch.set_num_threads(1)

CHAT = ASSETS / "chat"
H4 = CHAT / "h4_train_prefs.jsonl"
UF_FILE = SHARED_DATA / "ultrafeedback" / "train_clean.jsonl"
needs_uf = pytest.mark.skipif(not UF_FILE.is_file(), reason="../shared/data/ultrafeedback/train_clean.jsonl is missing")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def tok(smol_tokenizer):
    """A private copy: the recipe sets chat templates on the tokenizer it is given."""
    return copy.deepcopy(smol_tokenizer)


def assert_final_reply_masked(tok, example, prompt_messages, reply: str, *, whole: bool = True) -> None:
    """The unmasked part is exactly the generation prompt; the masked part is one run of tokens at the
    end: the reply and its <|im_end|> (``whole``) or, when truncated, the start of that text."""
    prompt_ids = tok(render_generation_prompt(tok, prompt_messages), add_special_tokens=False)["input_ids"]
    n = len(prompt_ids)
    assert example.input_ids[:n] == prompt_ids
    assert example.loss_mask == [0] * n + [1] * (len(example.input_ids) - n)
    text = tok.decode(example.input_ids[n:])
    if whole:
        assert text == reply + "<|im_end|>"
    else:
        assert text and (reply + "<|im_end|>").startswith(text)


# --------------------------------------------------------------------------- masks


def test_h4_fixture_masks_final_reply_and_drops_ties(tok):
    cfg = DPOConfig(data=str(H4), max_length=512)
    assert data_format(cfg) == "chat"
    pairs, stats = load_tokenized_pairs(cfg, tok)
    rows = _rows(H4)
    kept = [r for r in rows if r["score_chosen"] != r["score_rejected"]]
    assert len(kept) == 4  # row 1 is a 7.0/7.0 tie
    assert (stats["rows"], stats["ties"], stats["dropped_ties"], stats["pairs"]) == (5, 1, 1, 4)
    for pair, row in zip(pairs, kept):
        prompt = row["chosen"][:-1]
        assert_final_reply_masked(tok, pair.chosen, prompt, row["chosen"][-1]["content"])
        assert_final_reply_masked(tok, pair.rejected, prompt, row["rejected"][-1]["content"])
        assert not pair.chosen.truncated and not pair.rejected.truncated

    _, with_ties = load_tokenized_pairs(replace(cfg, drop_ties=False), tok)
    assert (with_ties["ties"], with_ties["dropped_ties"], with_ties["pairs"]) == (1, 0, 5)


def test_hh_rows_are_chat_pairs(tok):
    for name, n_valid in (("hh.jsonl", 3), ("hh_prompt.jsonl", 2)):
        cfg = DPOConfig(data=str(CHAT / name), skip_invalid=True, max_length=512)
        assert data_format(cfg) == "chat", name
        pairs, stats = load_tokenized_pairs(cfg, tok)
        assert (stats["pairs"], stats["skipped_invalid"]) == (n_valid, stats["rows"] - n_valid), name
        for pair in pairs:
            assert tok.decode([t for t, m in zip(pair.chosen.input_ids, pair.chosen.loss_mask) if m
                               ]).endswith("<|im_end|>")


@needs_uf
def test_real_flattened_ultrafeedback_rows(tok, rlft_log):
    rows = _rows(UF_FILE)
    cfg = DPOConfig(data=str(UF_FILE), skip_invalid=True, limit=6, max_length=4096)
    assert data_format(cfg) == "chat"
    pairs, stats = load_tokenized_pairs(cfg, tok)
    valid = [r for r in rows if r["prompt"].strip() and r["chosen"].strip() and r["rejected"].strip()]
    ties = [r for r in valid if r["metadata"]["score_chosen"] == r["metadata"]["score_rejected"]]
    identical = [r for r in valid if r not in ties and r["chosen"] == r["rejected"]]
    assert (stats["rows"], stats["skipped_invalid"]) == (1000, 1000 - len(valid))
    assert (stats["ties"], stats["dropped_ties"], stats["dropped_identical"]) == (len(ties), len(ties), len(identical))
    assert stats["kept"] == len(valid) - len(ties) - len(identical) and stats["used"] == stats["pairs"] == 6
    used = [r for r in valid if r not in ties and r["chosen"] != r["rejected"]][:6]
    for pair, row in zip(pairs, used):
        prompt = [{"role": "user", "content": row["prompt"]}]  # the flattened prompt is one user turn
        assert_final_reply_masked(tok, pair.chosen, prompt, row["chosen"])
        assert_final_reply_masked(tok, pair.rejected, prompt, row["rejected"])
    assert f"ties {len(ties)}" in rlft_log.text and "dropped_ties" in rlft_log.text


@needs_uf
@pytest.mark.parametrize("max_length, max_prompt_length, min_dropped", [(96, 40, 0), (64, None, 3)])
def test_truncation_keeps_prompt_end_and_response_start(tok, max_length, max_prompt_length, min_dropped):
    cfg = DPOConfig(data=str(UF_FILE), skip_invalid=True, limit=12, max_length=max_length,
                    max_prompt_length=max_prompt_length)
    _, stats = load_tokenized_pairs(cfg, tok)
    chat_pairs, _ = read_chat_pairs(cfg)
    dropped = prompts_cut = 0
    for pair in chat_pairs[:12]:
        cut, whole = tokenize_chat_pair(tok, pair, max_length, max_prompt_length), tokenize_chat_pair(tok, pair, 4096)
        if cut is None:
            dropped += 1
            continue
        for c, w in ((cut.chosen, whole.chosen), (cut.rejected, whole.rejected)):
            n, m = c.loss_mask.index(1), w.loss_mask.index(1)
            prompts_cut += n < m
            assert len(c.input_ids) <= max_length and n <= (max_prompt_length or max_length)
            assert c.loss_mask == [0] * n + [1] * (len(c.input_ids) - n)
            assert c.input_ids[n - 20 : n] == w.input_ids[m - 20 : m]  # the prompt keeps its end
            assert c.input_ids[n:] == w.input_ids[m : m + len(c.input_ids) - n]  # the response its start
            assert c.truncated == (len(c.input_ids) < len(w.input_ids))
    assert (stats["pairs"], stats["dropped_too_long"]) == (12 - dropped, dropped) and dropped >= min_dropped
    assert stats["chosen_truncated"] > 0 and stats["rejected_truncated"] > 0
    assert (prompts_cut > 0) == (max_prompt_length is not None)


def test_max_prompt_length_is_chat_only_and_checked(tmp_path, tok):
    countdown = write_jsonl_rows(tmp_path / "pairs.jsonl", countdown_rows(2))
    with pytest.raises(ValueError, match="--max-prompt-length applies to chat data"):
        load_tokenized_pairs(DPOConfig(data=str(countdown), max_prompt_length=16), tok)
    with pytest.raises(ValueError, match=r"--max-prompt-length must be < --max-length \(64\), got 64"):
        train_dpo(
            DPOConfig(model=str(tmp_path / "missing"), output_dir=str(tmp_path / "run"), max_length=64,
                      max_prompt_length=64))


def test_no_chat_template_names_the_option(tok):
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*--chat-template"):
        load_tokenized_pairs(DPOConfig(data=str(H4)), tok)
    pairs, _ = load_tokenized_pairs(DPOConfig(data=str(H4), chat_template="chatml"), tok)
    assert tok.chat_template == CHAT_TEMPLATES["chatml"]
    assert tok.decode(
        pairs[0].chosen.input_ids).startswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>")


# --------------------------------------------------------------------------- auto-detection


def countdown_rows(n: int, template: str = "base", tokenizer=None) -> list[dict]:
    """Rows in the layout `rlft pairs countdown` writes."""
    rows = []
    for i in range(n):
        task = CountdownTask(nums=(1, 2, 3 + i), target=6 + i)
        rows.append({
            "prompt": render_prompt(template, task,
                                    tokenizer), "chosen": f" 1+2=3.</think>\n<answer>1 + 2 + {3 + i}</answer>",
            "rejected": " hmm</think>\n<answer>1</answer>", "score_chosen": 1.0, "score_rejected": 0.1,
            "nums": list(task.nums), "target": task.target
        })
    return rows


def test_auto_picks_text_for_countdown_pairs_and_chat_for_ultrafeedback(tmp_path, tok):
    base = countdown_rows(3)
    assert base[0]["prompt"].rstrip().endswith("<think>") and "Assistant:" in base[0]["prompt"]
    cases = {
        "countdown.jsonl": (base, "text"),
        # no nums/target: the rendered prompt decides (the demo's hand-written pairs look like this)
        "countdown_bare.jsonl": ([{k: r[k]
                                   for k in ("prompt", "chosen", "rejected")} for r in base], "text"),
        "countdown_chatml.jsonl": ([{k: r[k]
                                     for k in ("prompt", "chosen", "rejected")}
                                    for r in countdown_rows(2, "chat", tok)], "text"),
        "uf_flat.jsonl": ([{
            "prompt": "Write a haiku.", "chosen": "Leaves fall.", "rejected": "No.",
            "metadata": {"score_chosen": 8.0, "score_rejected": 2.0}
        }], "chat"),
    }
    for name, (rows, expected) in cases.items():
        path = write_jsonl_rows(tmp_path / name, rows)
        assert data_format(DPOConfig(data=str(path))) == expected, name
    assert "<|im_start|>" in cases["countdown_chatml.jsonl"][0][0]["prompt"]
    for name in ("h4_train_prefs.jsonl", "malformed_text.jsonl", "hh.jsonl", "hh_prompt.jsonl"):
        assert data_format(DPOConfig(data=str(CHAT / name))) == "chat", name
    if UF_FILE.is_file():
        assert data_format(DPOConfig(data=str(UF_FILE))) == "chat"
    # Custom column names exist for text pairs only; an explicit format always wins.
    assert data_format(DPOConfig(data=str(CHAT / "h4_train_prefs.jsonl"), prompt_field="q")) == "text"
    assert data_format(DPOConfig(data=str(tmp_path / "countdown.jsonl"), data_format="chat")) == "chat"

    # The text path is today's: prompt exactly as tokenized for generation, then response + EOS.
    pairs, stats = load_tokenized_pairs(DPOConfig(data=str(tmp_path / "countdown.jsonl"), max_length=256), tok)
    assert stats["data_format"] == "text" and stats["pairs"] == 3
    prompt_ids = tok(base[0]["prompt"]).input_ids
    assert pairs[0].chosen.input_ids == prompt_ids + tok(base[0]["chosen"],
                                                         add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert pairs[0].chosen.loss_mask == [0] * len(prompt_ids) + [1] * (len(pairs[0].chosen.input_ids) - len(prompt_ids))


# --------------------------------------------------------------------------- training


MARKER = "banana"


def synthetic_h4_rows(n: int) -> list[dict]:
    """An easy preference: the chosen reply contains the marker word, the rejected one does not."""
    rows = []
    for i in range(n):
        prompt = [{"role": "user", "content": f"Question {i}: what fruit do you like?"}]
        rows.append({"prompt": prompt[0]["content"],
                     "chosen": [*prompt, {"role": "assistant", "content": f"I like {MARKER} {MARKER}."}],
                     "rejected": [*prompt, {"role": "assistant", "content": "I like nothing at all."}],
                     "score_chosen": 9.0, "score_rejected": 1.0 + (i == 0) * 8.0})  # row 0: a tie
    return rows


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("dpo-chat")
    data = write_jsonl_rows(root / "prefs.jsonl", synthetic_h4_rows(9))
    cfg = DPOConfig(model=str(tiny_model_dir), data=str(data), output_dir=str(root / "run"), max_length=64,
                    batch_size=4, micro_batch_size=4, max_steps=12, lr=3e-3, warmup_ratio=0.0, schedule="constant",
                    save_every=0, device="cpu", dtype="float32")
    final = train_dpo(cfg)
    return {"cfg": cfg, "final": final, "dir": root / "run"}


def test_synthetic_chat_preference_is_learned(chat_run):
    records = read_metrics(chat_run["dir"] / "metrics.jsonl")
    assert len(records) == 12
    assert records[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)  # the policy starts as the reference
    last = records[-3:]
    assert sum(r["loss"] for r in last) / 3 < math.log(2) - 0.15, [r["loss"] for r in records]
    assert all(r["rewards/accuracy"] == 1.0 for r in last)
    stats = json.loads((chat_run["dir"] / "data_stats.json").read_text())
    assert stats["data_format"] == "chat"
    assert (stats["rows"], stats["ties"], stats["dropped_ties"], stats["pairs"]) == (9, 1, 1, 8)


def test_reference_cache_fingerprint_on_chat_pairs(chat_run, smol_tokenizer, monkeypatch, rlft_log):
    cfg = replace(chat_run["cfg"], resume=True)
    spec = pick_device("cpu", "float32")
    pairs, _ = load_tokenized_pairs(cfg, copy.deepcopy(smol_tokenizer))
    cached = torch.load(chat_run["dir"] / "ref_logps.pt", weights_only=True)

    def no_load(*args, **kwargs):
        raise AssertionError("the reference model was loaded although the cache matches")

    with monkeypatch.context() as mp:
        mp.setattr(dpo_recipe, "load_model", no_load)
        ref = reference_logprobs(cfg, pairs, smol_tokenizer.pad_token_id, spec, chat_run["dir"])
    assert torch.equal(ref["chosen_sum"], cached["chosen_sum"]) and ref["chosen_sum"].shape == (8,)

    # Another chat template renders other tokens: the cache no longer matches and is recomputed.
    other, _ = load_tokenized_pairs(replace(cfg, chat_template="chatml"), copy.deepcopy(smol_tokenizer))
    assert other[0].chosen.input_ids != pairs[0].chosen.input_ids
    recomputed = reference_logprobs(cfg, other, smol_tokenizer.pad_token_id, spec, chat_run["dir"])
    assert "recomputing" in rlft_log.text and recomputed["chosen_sum"].shape == (8,)
