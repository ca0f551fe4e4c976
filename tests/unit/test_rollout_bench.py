"""bench/rollout.py's candidate names: ``name[@rows][+stop]``, parsed to the decoder, its rows and the loop stop."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/rollout")


@pytest.mark.parametrize("text, expected", [
    ("drop", ("drop", 64, False)),
    ("drop@32", ("drop", 32, False)),
    ("refill+stop", ("refill", 64, True)),
    ("refill@128+stop", ("refill", 128, True)),
    ("cb@16", ("cb", 16, False)),
])
def test_a_candidate_carries_its_rows_and_loop_stop(bench, text, expected):
    assert bench.parse_candidate(text, batch_size=64) == expected


@pytest.mark.parametrize("text, message", [
    ("fast", "unknown candidate 'fast'"),
    ("refill@0", "rows after @ must be a positive integer"),
    ("refill@x", "rows after @ must be a positive integer"),
    ("cb+stop", "has no loop stop"),
    ("refill+stop@64", "unknown candidate"),
])
def test_a_bad_candidate_is_named(bench, text, message):
    with pytest.raises(ValueError, match=message):
        bench.parse_candidate(text, batch_size=64)
