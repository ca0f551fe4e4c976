"""Fuzzed loaders: random bytes, random JSON and random field types given to every loader (JSONL,
JSON, Parquet; the H4 / flattened / HH / HH-prompt / chat (SmolTalk) / Countdown layouts, SFT's and DPO's
plain-text rows) either
yield valid records or raise rlft's own :class:`~rlft.data.files.DataError` naming the file and a
row, never another exception type. Bounded: a few seconds in all."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlft.data.files import DataError, read_rows
from rlft.data.preferences import ChatExample, PreferencePair, load_chat_examples, load_preference_pairs
from rlft.recipes.dpo import DPOConfig
from rlft.recipes.dpo_data import TextPair, read_text_pairs
from rlft.recipes.sft import SOURCES as SFT_SOURCES
from rlft.recipes.sft import SFTConfig
from rlft.tasks.countdown.loaders import load_countdown
from rlft.types import CountdownTask, PromptCompletion

FUZZ = settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

json_scalars = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(
    allow_nan=True, allow_infinity=True) | st.text(max_size=30)
json_values = st.recursive(
    json_scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)

message = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "assistant", "system", "bot", 3, None]),
    "content": json_values | st.text(max_size=20)
})
messages = st.lists(message | json_values, max_size=4)
hh_text = st.lists(st.tuples(st.sampled_from(["Human", "Assistant", "Bot"]), st.text(max_size=15)), max_size=4).map(
    lambda turns: "".join(f"\n\n{who}: {text}" for who, text in turns))
field_values = json_values | messages | hh_text | st.text(max_size=30)

# Rows shaped like each layout, with random values in the layout's fields (and sometimes missing ones).
LAYOUT_KEYS = {
    "h4": ["prompt", "chosen", "rejected", "score_chosen", "score_rejected"],
    "text": ["prompt", "chosen", "rejected", "metadata"],
    "hh": ["chosen", "rejected"],
    "chat": ["messages"],
    "countdown": ["target", "nums", "numbers", "solution", "answer"],
    "verl": ["reward_model"],
    "cog_behav": ["query", "completion"],
}
LAYOUT_KEYS["text"] += ["completion"]  # SFT prompt/completion rows
rows = st.one_of(
    *(st.dictionaries(st.sampled_from(keys), field_values, max_size=len(keys)) for keys in LAYOUT_KEYS.values()),
    json_values,
)

LOADERS = {
    "pairs": lambda path: load_preference_pairs(path)[0],
    "pairs_skip": lambda path: load_preference_pairs(path, skip_invalid=True)[0],
    "chat": lambda path: load_chat_examples(path)[0],
    "chat_skip": lambda path: load_chat_examples(path, skip_invalid=True)[0],
    "countdown": lambda path: load_countdown(path),
    "countdown_skip": lambda path: load_countdown(path, skip_invalid=True),
    "rows": lambda path: [r for _, r in read_rows(path) if not isinstance(r, DataError)],
    "dpo_text": lambda path: read_text_pairs(DPOConfig(data=str(path)))[0],
    "dpo_text_skip": lambda path: read_text_pairs(DPOConfig(data=str(path), skip_invalid=True))[0],
    "sft_text": lambda path: SFT_SOURCES["prompt_completion"](SFTConfig(data=str(path)), None)[0],
    "sft_cog_behav_skip": lambda path: SFT_SOURCES["cog_behav"](SFTConfig(data=str(path), skip_invalid=True), None)[0],
}
RECORD = {"pairs": PreferencePair, "pairs_skip": PreferencePair, "chat": ChatExample, "chat_skip": ChatExample,
          "countdown": CountdownTask, "countdown_skip": CountdownTask, "rows": dict, "dpo_text": TextPair,
          "dpo_text_skip": TextPair, "sft_text": PromptCompletion, "sft_cog_behav_skip": PromptCompletion}


def check(loader: str, path: Path) -> None:
    """The loader yields records of its type, or raises a DataError naming ``path`` and a row."""
    try:
        records = LOADERS[loader](path)
    except DataError as e:
        assert str(e).startswith(f"{path}: row "), str(e)
        assert re.match(rf"{re.escape(str(path))}: row \d+: field '[^']*': \S.*", str(e),
                        re.DOTALL), str(e)  # a reason is given
        return
    assert all(isinstance(r, RECORD[loader]) for r in records)
    if loader.startswith("countdown"):
        assert all(isinstance(n, int) and not isinstance(n, bool) for t in records for n in t.nums)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".jsonl", ".json", ".parquet", ".jsonl.gz"]),
       loader=st.sampled_from(sorted(LOADERS)))
def test_random_bytes(workdir, data, suffix, loader):
    path = workdir / f"random{suffix}"
    path.write_bytes(data)
    check(loader, path)


@FUZZ
@given(lines=st.lists(rows, max_size=5), loader=st.sampled_from(sorted(LOADERS)), as_list=st.booleans())
def test_random_json_rows(workdir, lines, loader, as_list):
    if as_list:
        path = workdir / "rows.json"
        path.write_text(json.dumps(lines))
    else:
        path = workdir / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    check(loader, path)


parquet_rows = st.lists(
    st.fixed_dictionaries({
        "prompt": st.none() | st.text(max_size=10),
        "chosen": st.none() | st.text(max_size=10) | hh_text,
        "rejected": st.none() | st.text(max_size=10) | hh_text,
        "target": st.none() | st.integers(-5, 200),
        "nums": st.none() | st.lists(st.integers(-3, 100), max_size=4),
        "extra": st.none() | st.text(max_size=5),
    }),
    min_size=1, max_size=4,
)


@FUZZ
@given(table=parquet_rows, drop=st.sets(st.sampled_from(["prompt", "chosen", "rejected", "target", "nums"])),
       loader=st.sampled_from(sorted(LOADERS)))
def test_random_parquet(workdir, table, drop, loader):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = workdir / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k not in drop} for r in table]), path)
    check(loader, path)


def test_non_utf8_line_names_the_file_and_line_and_is_skippable(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant",
                                                                        "content": "yo"}]}).encode()
    path.write_bytes(good + b"\n" + b'{"messages": "caf\xe9"}\n' + good + b"\n")
    with pytest.raises(DataError) as info:
        load_chat_examples(path)
    assert str(info.value) == f"{path}: row 1: field '<line>': line 2: not valid UTF-8 (byte 0xe9 at column 18)"
    examples, counts = load_chat_examples(path, skip_invalid=True)
    assert (len(examples), counts["skipped_invalid"]) == (2, 1)


def test_parquet_with_unknown_columns_lists_them(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "odd.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "a"}]), path)
    with pytest.raises(DataError) as info:
        load_preference_pairs(path)
    assert str(info.value) == (
        f"{path}: row 0: field '<columns>': none of the columns prompt, chosen, rejected, score_chosen, "
        "score_rejected, metadata, messages; the file has question, answer")
    pq.write_table(pa.Table.from_pylist([{"prompt": "q", "answer": "a"}]), path)
    with pytest.raises(DataError, match=r"unknown layout with columns \['prompt', 'answer'\]"):
        load_preference_pairs(path)


def test_a_json_string_line_is_not_taken_for_a_parse_error(tmp_path):
    path = tmp_path / "strings.jsonl"
    path.write_text('""\n"hello"\n')
    rows = list(read_rows(path))
    assert [str(e) for _, e in rows] == [f"{path}: row 0: field '<line>': expected a JSON object, got str",
                                         f"{path}: row 1: field '<line>': expected a JSON object, got str"]


def test_directory_is_called_a_directory(tmp_path):
    with pytest.raises(DataError) as info:
        list(read_rows(tmp_path))
    assert str(info.value) == f"{tmp_path}: row 0: field '<file>': is a directory, not a data file"
