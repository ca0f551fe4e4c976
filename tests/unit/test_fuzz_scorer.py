"""Fuzzed Countdown scorer: for any text (random, expression-like, or carrying code that would run
if evaluated), the exact and lenient scorers return 0, the format score or the full score, never
raise, take under 50 ms of CPU each, and never execute anything (eval/exec/__import__/os.system are
trapped, and a payload that would create a file leaves none)."""

from __future__ import annotations

import builtins
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlft.rewards.countdown import compute_score, compute_score_lenient, score_completions

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], derandomize=True)
LIMIT_S = 0.05


def payloads(sentinel: str) -> list[str]:
    return [
        f"__import__('os').system('touch {sentinel}')",
        f"open('{sentinel}', 'w').write('x')",
        f"exec(\"open('{sentinel}','w')\")",
        "9**9**9**9",
        "(lambda: 1)()",
        "().__class__.__base__.__subclasses__()",
        "1 if True else 2",
        "[x for x in range(10**9)]",
        "'a' * 10**9",
        "2**99999999",
        "1e308*10",
        "(1+2)*3",
    ]


expression_text = st.text(alphabet="0123456789+-*/(). eE_jx", max_size=80)
ground_truth = st.fixed_dictionaries({
    "target": st.integers(-10**6, 10**6) | st.floats(allow_nan=True, allow_infinity=True),
    "numbers": st.lists(st.integers(-50, 10**6), max_size=6),
})


@pytest.fixture
def trapped(monkeypatch, tmp_path):
    """While ``armed["on"]`` (only around a scorer call: hypothesis itself uses exec), eval, exec,
    __import__ and os.system fail loudly. Returns the sentinel path a payload would create, and the switch."""
    armed = {"on": False}

    def guard(real, name):
        def guarded(*args, **kwargs):
            if armed["on"]:
                raise AssertionError(f"the scorer called {name}")
            return real(*args, **kwargs)

        return guarded

    for name in ("eval", "exec", "__import__"):
        monkeypatch.setattr(builtins, name, guard(getattr(builtins, name), name))
    monkeypatch.setattr(os, "system", guard(os.system, "os.system"))
    return tmp_path / "executed", armed


def score_both(text: str, gt: dict, armed: dict) -> None:
    for scorer in (compute_score, compute_score_lenient):
        armed["on"] = True
        start = time.thread_time()
        try:
            result = scorer(text, gt)
        finally:
            armed["on"] = False
        elapsed = time.thread_time() - start
        assert result in (0.0, 0.1, 1.0), (scorer.__name__, text[:80], result)
        assert elapsed < LIMIT_S, (scorer.__name__, text[:80], elapsed)


@FUZZ
@given(
    prefix=st.sampled_from(["", "Assistant: ", "<|im_start|>assistant\n", "Assistant:\n<think>x</think>"]),
    body=st.text(max_size=300) | expression_text, payload=st.integers(0, 11), gt=ground_truth, wrap=st.sampled_from([
        "<answer>{}</answer>", "{}", "<answer>{}", "<answer>{}</answer>\ntrailing",
        "<answer><answer>{}</answer></answer>"
    ]))
def test_scorers_never_raise_are_fast_and_never_execute(trapped, prefix, body, payload, gt, wrap):
    sentinel, armed = trapped
    hostile = payloads(str(sentinel))[payload]
    for inner in (body, hostile, f"{body}{hostile}", f"({hostile})+{body}"):
        score_both(prefix + wrap.format(inner), gt, armed)
    assert not sentinel.exists()


@FUZZ
@given(completions=st.lists(st.text(max_size=120), min_size=1, max_size=4))
def test_score_completions_never_raises(completions):
    gts = [{"target": 3, "numbers": [1, 2]}] * len(completions)
    assert all(s in (0.0, 0.1, 1.0) for s in score_completions(["Assistant:"] * len(completions), completions, gts))
