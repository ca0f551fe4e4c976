"""rlft.data.preferences: preference-pair and chat loaders on the real shared files and hand-made fixtures.

Counts on the real files were checked by reading the raw JSON independently (see the tests below):
train_clean.jsonl has 1000 rows, rows 478 (empty rejected) and 833 (empty chosen) are invalid, and
111 of the 998 valid rows are score ties. HH test.jsonl.gz has 2312 rows, 4 with an empty final chosen
reply (rows 86, 516, 925, 1103). test_prefs.jsonl has 1000 rows: row 761 has an empty rejected reply and
rows 739 and 796 hide their last "Human:" turn inside the assistant text (no blank line before it).
"""

from __future__ import annotations

import gzip
import json
import logging
import sys
import types

import pytest

from rlft.data.files import DataError, read_rows
from rlft.data.preferences import (
    ChatExample,
    PreferencePair,
    load_chat_examples,
    load_preference_pairs,
    parse_hh_transcript,
)
from tests.conftest import ASSETS, SHARED_DATA

CHAT = ASSETS / "chat"
UF = SHARED_DATA / "ultrafeedback" / "train_clean.jsonl"
HH = SHARED_DATA / "hh_rlhf" / "test.jsonl.gz"
HH_PREFS = SHARED_DATA / "hh_rlhf" / "test_prefs.jsonl"


def need(path):
    if not path.is_file():
        pytest.skip(f"shared data file {path} is missing (see ../shared/data/SOURCES.md)")
    return str(path)


def warnings_of(log) -> str:
    return "\n".join(r.getMessage() for r in log.records if r.levelno == logging.WARNING)


# ---------------------------------------------------------------------------------------------
# Real files


def test_ultrafeedback_train_clean_counts(rlft_log):
    path = need(UF)
    raw = [json.loads(line) for line in open(path)]
    invalid = [i for i, r in enumerate(raw) if not r["chosen"].strip() or not r["rejected"].strip()]
    ties = [
        i for i, r in enumerate(raw)
        if i not in invalid and r["metadata"]["score_chosen"] == r["metadata"]["score_rejected"]
    ]
    assert (len(raw), invalid, len(ties)) == (1000, [478, 833], 111)

    pairs, counts = load_preference_pairs(path, skip_invalid=True)
    assert counts == {"rows": 1000, "kept": 998, "skipped_invalid": 2, "ties": 111, "dropped_ties": 0}
    assert len(pairs) == 998
    text = warnings_of(rlft_log)
    assert "skipped 2 invalid rows" in text
    assert "row 478: field 'rejected'" in text and "row 833: field 'chosen'" in text
    first = pairs[0]
    assert first == PreferencePair(
        [{"role": "user", "content": raw[0]["prompt"]}], raw[0]["chosen"], raw[0]["rejected"],
        raw[0]["metadata"]["score_chosen"], raw[0]["metadata"]["score_rejected"],
    )
    assert pairs[478].chosen == raw[479]["chosen"]  # row 478 skipped, nothing else shifted wrongly
    assert sum(p.score_chosen == p.score_rejected for p in pairs) == 111

    pairs, counts = load_preference_pairs(path, skip_invalid=True, drop_ties=True)
    assert counts == {"rows": 1000, "kept": 887, "skipped_invalid": 2, "ties": 111, "dropped_ties": 111}
    assert all(p.score_chosen > p.score_rejected for p in pairs)


def test_ultrafeedback_invalid_row_raises_naming_file_row_field():
    path = need(UF)
    with pytest.raises(DataError) as info:
        load_preference_pairs(path)
    err = info.value
    assert (err.source, err.row, err.field) == (path, 478, "rejected")
    assert path in str(err) and "row 478" in str(err) and "empty" in str(err)
    _, counts = load_preference_pairs(path, limit=478)  # the rows before it are fine
    assert counts["kept"] == 478


def test_ultrafeedback_chosen_replies_as_sft_data():
    examples, counts = load_chat_examples(need(UF), skip_invalid=True)
    assert counts == {"rows": 1000, "kept": 999, "skipped_invalid": 1}  # only row 833 (empty chosen)
    assert [m["role"] for m in examples[0].messages] == ["user", "assistant"]


def test_hh_rlhf_full_transcripts(rlft_log):
    path = need(HH)
    pairs, counts = load_preference_pairs(path, skip_invalid=True)
    assert counts == {"rows": 2312, "kept": 2308, "skipped_invalid": 4, "ties": 0, "dropped_ties": 0}
    assert all(f"row {i}: field 'chosen'" in warnings_of(rlft_log) for i in (86, 516, 925))
    first = pairs[0]
    assert [m["role"] for m in first.prompt] == ["user", "assistant", "user", "assistant", "user"]
    assert first.prompt[0] == {"role": "user", "content": "what are some pranks with a pen i can do?"}
    assert first.prompt[-1]["content"] == "okay some of these do not have anything to do with pens"
    assert first.chosen.startswith("No, sorry!  All of these involve a pen") and first.score_chosen is None
    for p in pairs:
        assert p.prompt[-1]["role"] == "user" and p.prompt[0]["role"] == "user"
        assert all(a["role"] != b["role"] for a, b in zip(p.prompt, p.prompt[1:]))  # same-speaker turns joined
        assert p.chosen.strip() and p.rejected.strip() and "\n\nAssistant:" not in p.chosen + p.rejected
    with pytest.raises(DataError) as info:
        load_preference_pairs(path)
    assert (info.value.row, info.value.field) == (86, "chosen")


def test_hh_rlhf_test_prefs_prompt_variant():
    path = need(HH_PREFS)
    raw = [json.loads(line) for line in open(path)]
    pairs, counts = load_preference_pairs(path, skip_invalid=True)
    assert counts == {"rows": 1000, "kept": 997, "skipped_invalid": 3, "ties": 0, "dropped_ties": 0}
    first = pairs[0]
    assert [m["role"] for m in first.prompt] == ["user", "assistant", "user"]
    assert first.prompt[0]["content"] == "Can you give me facts about jumping spiders?"
    assert first.prompt[-1]["content"] == "How far can they jump?"
    assert first.chosen == raw[0]["chosen"].strip() and first.rejected == raw[0]["rejected"].strip()
    with pytest.raises(DataError) as info:
        load_preference_pairs(path)
    assert (info.value.row, info.value.field) == (739, "prompt") and "user turn" in str(info.value)


# ---------------------------------------------------------------------------------------------
# gzip in read_rows


@pytest.mark.parametrize("name", ["rows.jsonl.gz", "rows.json.gz"])
def test_read_rows_reads_gzip(tmp_path, name):
    rows = [{"a": 1}, {"a": "caf\u00e9"}]
    path = tmp_path / name
    text = json.dumps(rows) if name.endswith(".json.gz") else "".join(json.dumps(r) + "\n" for r in rows)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    assert list(read_rows(str(path))) == list(enumerate(rows))
    assert list(read_rows(str(path), start=1)) == [(1, rows[1])]
    with pytest.raises(FileNotFoundError, match="missing"):
        list(read_rows(str(tmp_path / ("missing-" + name))))


def test_read_rows_refuses_other_gzip(tmp_path):
    path = tmp_path / "rows.csv.gz"
    path.write_bytes(gzip.compress(b"a,b\n"))
    with pytest.raises(ValueError, match="unsupported file type"):
        list(read_rows(str(path)))


# ---------------------------------------------------------------------------------------------
# Hand-made fixtures in the exact schemas


def test_h4_train_prefs_fixture():
    pairs, counts = load_preference_pairs(str(CHAT / "h4_train_prefs.jsonl"))
    assert counts == {"rows": 5, "kept": 5, "skipped_invalid": 0, "ties": 1, "dropped_ties": 0}
    assert pairs[0] == PreferencePair(
        [{"role": "user", "content": "What is the capital of France?"}],
        "The capital of France is Paris.", "France's capital is Lyon.", 9.0, 3.0,
    )
    assert [m["role"] for m in pairs[2].prompt] == ["user", "assistant", "user"]
    assert pairs[2].chosen.startswith("Then try soda bread")
    assert pairs[3].prompt[0] == {"role": "system", "content": "You are a terse assistant."}
    assert pairs[4].chosen.startswith("\nLeaves")  # kept verbatim
    pairs, counts = load_preference_pairs(str(CHAT / "h4_train_prefs.jsonl"), drop_ties=True)
    assert counts["kept"] == 4 and counts["dropped_ties"] == 1 and all(
        p.score_chosen != p.score_rejected for p in pairs)


def test_h4_train_sft_fixture():
    path = str(CHAT / "h4_train_sft.jsonl")
    examples, counts = load_chat_examples(path)
    assert counts == {"rows": 3, "kept": 3, "skipped_invalid": 0}
    assert examples[1] == ChatExample([
        {"role": "user", "content": "Give me a number."}, {"role": "assistant", "content": "7."},
        {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "12."},
    ])
    pairs, _ = load_preference_pairs(path)  # the same rows carry chosen/rejected lists too
    assert [p.chosen for p in pairs] == ["Hola.", "12.", "Katze."]


def test_smoltalk_fixture():
    path = CHAT / "smoltalk.jsonl"
    raw = [json.loads(line) for line in open(path)]
    examples, counts = load_chat_examples(str(path))
    assert counts == {"rows": 4, "kept": 4, "skipped_invalid": 0}
    assert [e.messages for e in examples] == [r["messages"] for r in raw]
    assert sum(m["role"] == "assistant" for m in examples[2].messages) == 3


def test_hh_fixtures():
    pairs, counts = load_preference_pairs(str(CHAT / "hh.jsonl"), skip_invalid=True)
    assert counts["kept"] == 3 and counts["skipped_invalid"] == 1
    assert pairs[1].prompt == [
        {"role": "user", "content": "Recommend a book."}, {"role": "assistant", "content": "What genres do you like?"},
        {"role": "user", "content": "Science fiction."},
    ]
    assert (pairs[1].chosen, pairs[1].rejected) == ("Try Dune by Frank Herbert.", "Books are made of paper.")
    assert pairs[2].chosen == "Why did the scarecrow win an award?\n\nBecause he was outstanding in his field."
    prompt_pairs, counts = load_preference_pairs(str(CHAT / "hh_prompt.jsonl"), skip_invalid=True)
    assert counts["kept"] == 2 and counts["skipped_invalid"] == 1
    assert [(p.prompt, p.chosen, p.rejected) for p in prompt_pairs] == [
        (pairs[0].prompt, pairs[0].chosen, pairs[0].rejected), (pairs[1].prompt, pairs[1].chosen, pairs[1].rejected)
    ]


def test_parse_hh_transcript():
    assert parse_hh_transcript("Human: hi\n\nAssistant:  hello \n\nHuman: bye") == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}
    ]
    assert parse_hh_transcript("\n\nHuman: a\n\nHuman: b\n\nAssistant:") == [
        {"role": "user", "content": "a\n\nb"}, {"role": "assistant", "content": ""}
    ]
    with pytest.raises(ValueError, match="not a HH transcript"):
        parse_hh_transcript("User: hi")


# ---------------------------------------------------------------------------------------------
# Malformed rows: each bad row alone after a good one -> DataError naming row 1 and the field

MALFORMED = [
    ("malformed_prefs.jsonl", load_preference_pairs, {
        1: "rejected[1].content", 2: "chosen", 3: "chosen[0].role", 4: "rejected[0].content", 5: "chosen",
        6: "rejected", 7: "<line>", 8: "score_chosen", 9: "chosen",
    }),
    ("malformed_chat.jsonl", load_chat_examples, {
        1: "messages", 2: "messages", 3: "messages[1].role", 4: "messages[1].content", 5: "messages[0].role",
        7: "messages[0].role",
    }),
    ("malformed_text.jsonl", load_preference_pairs, {1: "prompt", 2: "rejected", 3: "rejected"}),
]


@pytest.mark.parametrize(
    "name,loader,row,field",
    [(name, loader, row, field) for name, loader, bad in MALFORMED for row, field in bad.items()],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_each_malformed_row_raises_naming_row_and_field(tmp_path, name, loader, row, field):
    lines = (CHAT / name).read_text().splitlines()
    path = tmp_path / name
    path.write_text(lines[0] + "\n" + lines[row] + "\n")
    with pytest.raises(DataError) as info:
        loader(str(path))
    assert (info.value.source, info.value.row, info.value.field) == (str(path), 1, field)
    assert f"row 1: field {field!r}" in str(info.value)


@pytest.mark.parametrize("name,loader,bad", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_files_skip_invalid_counts_and_warns(rlft_log, name, loader, bad):
    path = str(CHAT / name)
    with pytest.raises(DataError) as info:
        loader(path)
    assert info.value.row == min(bad)
    records, counts = loader(path, skip_invalid=True)
    assert counts["skipped_invalid"] == len(bad) and counts["kept"] == counts["rows"] - len(bad) == len(records)
    assert f"skipped {len(bad)} invalid rows" in warnings_of(rlft_log) and path in warnings_of(rlft_log)


def test_malformed_text_tie_kept_and_counted():
    pairs, counts = load_preference_pairs(str(CHAT / "malformed_text.jsonl"), skip_invalid=True)
    assert counts == {"rows": 5, "kept": 2, "skipped_invalid": 3, "ties": 1, "dropped_ties": 0}
    assert pairs[1].score_chosen == pairs[1].score_rejected == 5.0


def test_unknown_layout_and_layout_override(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    with pytest.raises(DataError, match="unknown layout") as info:
        load_preference_pairs(str(path))
    assert info.value.field == "<row>"
    with pytest.raises(ValueError, match="unknown layout 'zephyr'"):
        load_preference_pairs(str(path), layout="zephyr")
    # Forcing "text" on an HH prompt file keeps the transcript as one user message.
    pairs, _ = load_preference_pairs(str(CHAT / "hh_prompt.jsonl"), layout="text")
    assert pairs[0].prompt == [{"role": "user", "content": "Human: How do I boil an egg?"}]
    assert pairs[0].chosen == " Put it in boiling water for about nine minutes."


def test_hub_split_names_go_through(monkeypatch):
    datasets = types.ModuleType("datasets")
    calls = []
    rows = {
        name: [json.loads(line) for line in open(CHAT / f"h4_{name}.jsonl")]
        for name in ("train_prefs", "train_sft")
    }

    def load_dataset(source, split):
        calls.append((source, split))
        return rows[split.replace("test", "train")]

    datasets.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", datasets)
    pairs, counts = load_preference_pairs("HuggingFaceH4/ultrafeedback_binarized", split="test_prefs", limit=2)
    assert counts["rows"] == 2 and len(pairs) == 2
    examples, _ = load_chat_examples("HuggingFaceH4/ultrafeedback_binarized", split="train_sft")
    assert len(examples) == 3
    pairs, _ = load_preference_pairs("HuggingFaceH4/ultrafeedback_binarized")
    assert calls == [
        ("HuggingFaceH4/ultrafeedback_binarized", "test_prefs"),
        ("HuggingFaceH4/ultrafeedback_binarized", "train_sft"),
        ("HuggingFaceH4/ultrafeedback_binarized", "train_prefs"),
    ]


def test_loaded_pairs_tokenize_with_masks_on_replies(smol_tokenizer):
    """End to end: fixture pairs -> tokenize_preference_pair; every kept pair masks exactly its replies."""
    from rlft.data.chat import tokenize_preference_pair

    pairs, _ = load_preference_pairs(str(CHAT / "h4_train_prefs.jsonl"))
    for p in pairs:
        chosen, rejected = tokenize_preference_pair(smol_tokenizer, p.prompt, p.chosen, p.rejected, max_length=512)
        for ex, reply in ((chosen, p.chosen), (rejected, p.rejected)):
            masked = [t for t, m in zip(ex.input_ids, ex.loss_mask) if m]
            assert smol_tokenizer.decode(masked) == reply + "<|im_end|>"
