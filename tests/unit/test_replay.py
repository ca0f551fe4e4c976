"""rlft.rl.replay: the replay buffer of whole groups -- add, capacity, staleness, seeded draws, exact state round trips,
metrics."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import pytest
import torch

from rlft.rl.replay import ReplayBuffer, ReplayGroup
from rlft.rollout.base import Sample


@dataclass(frozen=True)
class Prompt:
    """A stand-in for the loop's prompt records (the buffer never looks inside)."""

    text: str
    ground_truth: dict | None = None


def _sample(seed: int, n: int = 3, finish: str = "stop") -> Sample:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (n,), generator=g).tolist()
    lps = (-torch.rand(n, generator=g, dtype=torch.float64) * 5).tolist()  # float64: checks floats survive exactly
    return Sample(completion_ids=ids, text=f"completion {seed}", finish_reason=finish, logprobs=lps,
                  self_certainty=0.1 * seed)


def _groups(step: int, count: int, k: int = 2, prompt=None) -> list[tuple]:
    out = []
    for b in range(count):
        samples = [_sample(1000 * step + 10 * b + j, n=2 + j, finish="length" if j else "stop") for j in range(k)]
        p = prompt(step, b) if prompt else Prompt(f"prompt {step}.{b}", {"target": step * 10 + b})
        out.append((p, samples, [0.1 * (j + b) for j in range(k)]))
    return out


def _names(buffer: ReplayBuffer) -> list[str]:
    return [g.prompt.text for g in buffer.groups]


def test_bounds_are_checked():
    for bad in ((0, 1), (1, 0), (-1, 2), (2.5, 1)):
        with pytest.raises(ValueError):
            ReplayBuffer(*bad)


def test_add_keeps_every_field_and_raw_rewards():
    buf = ReplayBuffer(capacity_groups=4, max_staleness=2)
    groups = _groups(3, 2)
    assert buf.add(groups, step=3) == 0 and len(buf) == 2
    for stored, (prompt, samples, rewards) in zip(buf.groups, groups):
        assert stored == ReplayGroup(prompt, tuple(samples), tuple(rewards), 3)
    buf.add([(Prompt("t"), [_sample(1), _sample(2)], torch.tensor([1.0, 0.1]))], step=3)  # a tensor row of rewards
    assert buf.groups[-1].rewards == (1.0, pytest.approx(0.1)) and isinstance(buf.groups[-1].rewards[0], float)


def test_capacity_drops_the_oldest_first():
    buf = ReplayBuffer(capacity_groups=3, max_staleness=5)
    buf.add(_groups(0, 2), step=0)
    assert buf.add(_groups(1, 2), step=1) == 1
    assert _names(buf) == ["prompt 0.1", "prompt 1.0", "prompt 1.1"]
    assert buf.add(_groups(2, 2), step=2) == 2
    assert _names(buf) == ["prompt 1.1", "prompt 2.0", "prompt 2.1"]
    # more than the capacity at once: the first added of them go first too
    small = ReplayBuffer(capacity_groups=2, max_staleness=1)
    assert small.add(_groups(0, 3), step=0) == 1 and _names(small) == ["prompt 0.1", "prompt 0.2"]


@pytest.mark.parametrize(
    "case", ["no logprobs", "logprob count", "reward count", "no samples", "nan reward", "other k", "step back"])
def test_add_refuses_bad_groups_and_stores_nothing(case):
    buf = ReplayBuffer(capacity_groups=8, max_staleness=2)
    buf.add(_groups(1, 1), step=1)
    before = buf.state_dict()
    good = [_sample(5), _sample(6)]
    groups, step = [(Prompt("x"), good, [0.0, 1.0])], 2
    if case == "no logprobs":
        groups = [(Prompt("x"), [good[0], Sample([1, 2], "t", "stop")], [0.0, 1.0])]
    elif case == "logprob count":
        groups = [(Prompt("x"), [good[0], Sample([1, 2], "t", "stop", logprobs=[-1.0])], [0.0, 1.0])]
    elif case == "reward count":
        groups = [(Prompt("x"), good, [0.0])]
    elif case == "no samples":
        groups = [(Prompt("x"), [], [])]
    elif case == "nan reward":
        groups = [(Prompt("x"), good, [0.0, float("nan")])]
    elif case == "other k":
        groups = [(Prompt("x"), good + [_sample(7)], [0.0, 1.0, 0.0])]
    else:
        step = 0
    with pytest.raises(ValueError):
        buf.add(groups + _groups(2, 1), step=step)  # one bad group: none of the call's groups is stored
    assert buf.state_dict() == before


def test_evict_keeps_the_staleness_bound_exactly():
    buf = ReplayBuffer(capacity_groups=10, max_staleness=2)
    for step in range(3):
        buf.add(_groups(step, 1), step=step)
    assert buf.evict(2) == 0 and len(buf) == 3
    assert buf.evict(3) == 1 and _names(buf) == ["prompt 1.0", "prompt 2.0"]  # step 0: staleness 3 > 2
    assert buf.evict(4) == 1 and _names(buf) == ["prompt 2.0"]  # step 2: staleness 2, kept at the limit
    assert buf.evict(5) == 1 and len(buf) == 0
    assert ReplayBuffer(1, 1).evict(0) == 0  # empty
    buf.add(_groups(7, 1), step=7)
    with pytest.raises(ValueError, match="before"):
        buf.evict(6)


def test_draw_from_an_empty_buffer_and_zero_draws():
    buf = ReplayBuffer(4, 2)
    assert buf.draw(3, 5, torch.Generator().manual_seed(0)) == ([], [])
    buf.add(_groups(4, 2), step=4)
    assert buf.draw(0, 5, torch.Generator().manual_seed(0)) == ([], [])
    with pytest.raises(ValueError):
        buf.draw(-1, 5, torch.Generator())


def test_draw_takes_only_groups_within_the_bound_and_never_the_current_step():
    buf = ReplayBuffer(capacity_groups=10, max_staleness=2)
    for step in range(5):
        buf.add(_groups(step, 1), step=step)
    # at step 4 (no evict): staleness 4, 3 too old; 2 and 1 eligible; step 4's own group (staleness 0) not
    groups, staleness = buf.draw(10, 4, torch.Generator().manual_seed(0))
    assert [g.prompt.text for g in groups] == ["prompt 2.0", "prompt 3.0"] and staleness == [2, 1]
    assert len(buf) == 5  # drawing keeps the groups
    with pytest.raises(ValueError, match="before"):
        buf.draw(1, 3, torch.Generator())


def test_draw_more_than_stored_returns_each_eligible_group_once():
    buf = ReplayBuffer(capacity_groups=10, max_staleness=3)
    buf.add(_groups(0, 3), step=0)
    groups, staleness = buf.draw(7, 1, torch.Generator().manual_seed(3))
    assert [g.prompt.text for g in groups] == ["prompt 0.0", "prompt 0.1", "prompt 0.2"] and staleness == [1, 1, 1]


def test_draw_is_seeded_without_replacement_and_uniform_over_seeds():
    buf = ReplayBuffer(capacity_groups=10, max_staleness=3)
    buf.add(_groups(0, 6), step=0)
    a, _ = buf.draw(3, 2, torch.Generator().manual_seed(11))
    b, _ = buf.draw(3, 2, torch.Generator().manual_seed(11))
    assert a == b and len({g.prompt.text for g in a}) == 3
    # the naive reference: the first 3 of a seeded permutation of the 6 eligible groups, in buffer order
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(11))[:3].tolist()
    assert [g.prompt.text for g in a] == [f"prompt 0.{i}" for i in sorted(perm)]
    counts = {i: 0 for i in range(6)}
    for seed in range(600):
        for g in buf.draw(2, 1, torch.Generator().manual_seed(seed))[0]:
            counts[int(g.prompt.text[-1])] += 1
    assert all(150 < c < 250 for c in counts.values()), counts  # 200 each expected


def _filled() -> ReplayBuffer:
    buf = ReplayBuffer(capacity_groups=5, max_staleness=2)
    for step in range(4):
        buf.add(_groups(step, 2, k=3), step=step)
    buf.evict(4)
    return buf


def _same(a: ReplayBuffer, b: ReplayBuffer) -> None:
    assert (a.capacity_groups, a.max_staleness, len(a)) == (b.capacity_groups, b.max_staleness, len(b))
    for x, y in zip(a.groups, b.groups):
        assert x.prompt == y.prompt and x.step == y.step and x.rewards == y.rewards and type(x.prompt) is type(y.prompt)
        for s, t in zip(x.samples, y.samples):
            for field in ("completion_ids", "text", "finish_reason", "logprobs", "self_certainty", "looped"):
                assert getattr(s, field) == getattr(t, field), field  # exact, floats included
    assert a.groups == b.groups
    assert a.draw(3, 5, torch.Generator().manual_seed(2)) == b.draw(3, 5, torch.Generator().manual_seed(2))


def test_state_round_trips_exactly_through_a_torch_file(tmp_path):
    buf = _filled()
    torch.save({"replay": buf.state_dict()}, tmp_path / "trainer_state.pt")
    restored = ReplayBuffer(5, 2)
    restored.load_state_dict(torch.load(tmp_path / "trainer_state.pt", weights_only=False)["replay"])
    _same(buf, restored)


def test_state_round_trips_exactly_through_a_json_file(tmp_path):
    buf = ReplayBuffer(capacity_groups=4, max_staleness=3)
    for step in range(3):
        buf.add(_groups(step, 2, prompt=lambda s, b: {"text": f"prompt {s}.{b}", "index": 7 * s + b}), step=step)
    (tmp_path / "replay.json").write_text(json.dumps(buf.state_dict()))
    restored = ReplayBuffer(4, 3)
    restored.load_state_dict(json.loads((tmp_path / "replay.json").read_text()))
    _same(buf, restored)


def test_load_into_a_smaller_capacity_keeps_the_newest():
    buf = _filled()
    small = ReplayBuffer(capacity_groups=2, max_staleness=2)
    small.load_state_dict(buf.state_dict())
    assert small.groups == buf.groups[-2:]


def test_load_refuses_damaged_states_and_keeps_the_buffer():
    buf = _filled()
    state = buf.state_dict()
    target = ReplayBuffer(5, 2)
    target.add(_groups(9, 1, k=3), step=9)
    before = target.groups
    bad_sample = copy.deepcopy(state)
    bad_sample["groups"][0]["samples"][0]["colour"] = "red"
    missing = copy.deepcopy(state)
    del missing["groups"][1]["rewards"]
    no_logprobs = copy.deepcopy(state)
    no_logprobs["groups"][0]["samples"][1]["logprobs"] = None
    for damaged in ({**state, "format": 99}, bad_sample, missing, no_logprobs, ["not", "a", "dict"]):
        with pytest.raises(ValueError):
            target.load_state_dict(damaged)
        assert target.groups == before


def test_metrics_hand_values():
    # step 5: two replayed groups of k = 2 from steps 4 and 2 (staleness 1 and 3), 4 fresh samples
    #   share 4 / 8 = 0.5; staleness (2 * 1 + 2 * 3) / 4 = 2.0
    #   |log ratio| = 0.1, 0.3, 0.2, 0.4: mean 0.25; p99 (linear): sorted[2] + 0.97 * (sorted[3] - sorted[2]) = 0.397
    buf = ReplayBuffer(4, 3)
    buf.add(_groups(2, 1), step=2)
    buf.add(_groups(4, 1), step=4)
    m = ReplayBuffer.metrics(buf.groups, 4, 5, torch.tensor([0.1, -0.3, 0.2, -0.4]))
    assert m["replay/share"] == 0.5 and m["replay/staleness_mean"] == 2.0
    assert m["replay/abs_log_ratio_mean"] == pytest.approx(0.25) and m["replay/abs_log_ratio_p99"] == pytest.approx(
        0.397)


def test_metrics_with_nothing_replayed():
    zeros = {
        "replay/share": 0.0, "replay/staleness_mean": 0.0, "replay/abs_log_ratio_mean": 0.0,
        "replay/abs_log_ratio_p99": 0.0
    }
    assert ReplayBuffer.metrics([], 16, 3, None) == zeros
    assert ReplayBuffer.metrics([], 0, 3, torch.zeros(0)) == zeros
