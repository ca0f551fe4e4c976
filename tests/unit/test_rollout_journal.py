"""rlft.rollout.journal: chunked sampling on disk; a killed run resumes to exactly what an uninterrupted one gives."""

from __future__ import annotations

import json

import pytest

from rlft.data.files import DataError
from rlft.rollout import HFEngine, SamplingParams
from rlft.rollout.journal import (CHUNK_PROMPTS, chunk_params, journal_differences, read_journal, recorded_meta,
                                  sample_with_journal)
from tests.conftest import make_scaled_tiny_model

PROMPTS = [f"prompt number {i} with {'words ' * (i % 4)}" for i in range(7)]
PARAMS = SamplingParams(k=2, temperature=1.0, max_new_tokens=5, seed=3)
META = {"model": "tiny", "seed": 3}


pytestmark = pytest.mark.usefixtures("one_thread")


class Killed(RuntimeError):
    pass


class CountingEngine:
    """Wraps an engine: records the prompts of every call; raises :class:`Killed` on call number ``kill_at``."""

    def __init__(self, engine, kill_at: int | None = None):
        self.engine, self.kill_at, self.calls = engine, kill_at, []

    def generate(self, prompts, params):
        if self.kill_at is not None and len(self.calls) == self.kill_at:
            raise Killed
        self.calls.append((list(prompts), params.seed))
        return self.engine.generate(prompts, params)


@pytest.fixture
def engine(smol_tokenizer):
    model = make_scaled_tiny_model(len(smol_tokenizer), seed=0)
    return HFEngine(model, smol_tokenizer, batch_size=4)


def flat(samples):
    return [[(s.completion_ids, s.text, s.finish_reason) for s in row] for row in samples]


def test_killed_run_resumes_to_the_uninterrupted_result(engine, tmp_path):
    whole, _ = sample_with_journal(engine, PROMPTS, PARAMS, tmp_path / "a.jsonl", META, chunk_prompts=3)
    assert flat(whole) == flat(
        sample_with_journal(engine, PROMPTS, PARAMS, tmp_path / "b.jsonl", META, chunk_prompts=3)[0])

    path = tmp_path / "killed.jsonl"
    first = CountingEngine(engine, kill_at=2)  # chunks [0:3] and [3:6] written, killed before [6:7]
    with pytest.raises(Killed):
        sample_with_journal(first, PROMPTS, PARAMS, path, META, chunk_prompts=3)
    assert len(path.read_text().splitlines()) == 1 + 6
    second = CountingEngine(engine)
    resumed, seconds = sample_with_journal(second, PROMPTS, PARAMS, path, META, chunk_prompts=3)
    assert second.calls == [(PROMPTS[6:], PARAMS.seed + 2 * 1_000_003)]  # only the missing chunk, with its own seed
    assert flat(resumed) == flat(whole)
    assert seconds > 0
    # finished: a third run samples nothing and reads everything back
    third = CountingEngine(engine)
    assert flat(sample_with_journal(third, PROMPTS, PARAMS, path, META, chunk_prompts=3)[0]) == flat(whole)
    assert third.calls == []


def test_cut_line_and_cut_chunk_are_sampled_again(engine, tmp_path):
    path = tmp_path / "j.jsonl"
    whole, _ = sample_with_journal(engine, PROMPTS, PARAMS, path, META, chunk_prompts=3)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:6]) + "\n" + lines[6][:20])  # rows 0-4 whole, row 5 cut mid-line
    again = CountingEngine(engine)
    resumed, _ = sample_with_journal(again, PROMPTS, PARAMS, path, META, chunk_prompts=3)
    assert [prompts for prompts, _ in again.calls] == [PROMPTS[3:6], PROMPTS[6:]]  # chunk [3:6] again, whole
    assert flat(resumed) == flat(whole)
    assert [json.loads(line).get("index") for line in path.read_text().splitlines()[1:]] == list(range(7))


def test_journal_of_another_run_is_refused(engine, tmp_path):
    path = tmp_path / "j.jsonl"
    sample_with_journal(engine, PROMPTS[:3], PARAMS, path, META, chunk_prompts=3)
    with pytest.raises(ValueError, match="differs in seed"):
        sample_with_journal(engine, PROMPTS, PARAMS, path, {**META, "seed": 4}, chunk_prompts=3)
    with pytest.raises(ValueError, match="chunk_prompts"):
        sample_with_journal(engine, PROMPTS, PARAMS, path, META, chunk_prompts=2)
    with pytest.raises(ValueError, match="row 1: its prompt is not prompt 0"):
        sample_with_journal(engine, ["another"] + PROMPTS[1:], PARAMS, path, META, chunk_prompts=3)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{broken", *lines[1:]]) + "\n")
    with pytest.raises(DataError, match="row 1"):
        read_journal(path, {**META, "chunk_prompts": 3}, PROMPTS, 2)
    with pytest.raises(ValueError, match="chunk_prompts must be >= 1"):
        sample_with_journal(engine, PROMPTS, PARAMS, tmp_path / "x.jsonl", META, chunk_prompts=0)


def test_chunk_seeds():
    assert chunk_params(PARAMS, 0) == PARAMS
    assert chunk_params(PARAMS, 2).seed == 3 + 2 * 1_000_003
    unseeded = SamplingParams(k=2)
    assert chunk_params(unseeded, 5) is unseeded


def test_a_looped_sample_is_read_back_looped(tmp_path):
    """The loop stop's mark survives the journal: a resumed run's looped rows still count as looped."""
    from rlft.rollout.base import Sample

    class Fixed:
        def generate(self, prompts, params):
            return [[Sample([5, 6], "a\na\n", "length", looped=True), Sample([7, 2], "b", "stop")] for _ in prompts]

    path = tmp_path / "j.jsonl"
    written, _ = sample_with_journal(Fixed(), PROMPTS[:2], PARAMS, path, META, chunk_prompts=2)
    read, _ = sample_with_journal(Fixed(), PROMPTS[:2], PARAMS, path, META, chunk_prompts=2)
    assert [[s.looped for s in row] for row in read
            ] == [[True, False]] * 2 == [[s.looped for s in row] for row in written]
    assert '"looped": true' in path.read_text() and path.read_text().count("looped") == 2  # only where it is set


def test_journal_differences_and_recorded_meta_read_the_first_line(tmp_path):
    """No journal or an empty one: None (nothing to continue); a first line that is no meta: ["meta"]; else the keys
    that differ from this run's meta (its chunk size included), [] when none does."""
    path = tmp_path / "j.samples.jsonl"
    assert journal_differences(path, META) is None and recorded_meta(path) is None
    path.write_text("\n")
    assert journal_differences(path, META) is None and recorded_meta(path) is None
    for first in ("not json", json.dumps([1, 2]), json.dumps({"meta": "x"}), json.dumps({"index": 0})):
        path.write_text(first + "\n")
        assert journal_differences(path, META) == ["meta"] and recorded_meta(path) is None
    path.write_text(
        json.dumps({"meta": {**META, "chunk_prompts": CHUNK_PROMPTS}}) + "\n" + json.dumps({"index": 0}) + "\n")
    assert recorded_meta(path) == {**META, "chunk_prompts": CHUNK_PROMPTS}
    assert journal_differences(path, META) == []
    assert journal_differences(path, {**META, "seed": 4, "dtype": "bf16"}) == ["dtype", "seed"]
    assert journal_differences(path, META, chunk_prompts=CHUNK_PROMPTS + 1) == ["chunk_prompts"]
