"""Replay in the RL loop (rlft.recipes.rl with --replay-size, rlft.rl.sampling.with_replayed): replayed groups are
shaped, filtered and weighted as fresh ones; TOPR with replay learns a toy reward with the share of replayed samples the
reuse factor gives; a run killed and resumed keeps the same buffer and draws; the behaviour policy is the sampler's;
a non-finite loss stops the RL loop before the update."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlft.checkpoint import latest_checkpoint, read_metrics, read_trainer_state
from rlft.losses.advantages import advantage_function
from rlft.losses.pg import make_objective
from rlft.precision import NonFiniteError
from rlft.recipes import rl as rl_recipe
from rlft.recipes.rl import RLConfig, train_rl
from rlft.rl.batch import gradient_rows, rollout_batch, sampler_logprobs, with_logprobs
from rlft.rl.metrics import replay_log_ratios
from rlft.rl.prompts import RLPrompt
from rlft.rl.records import StepSamples
from rlft.rl.replay import ReplayBuffer, ReplayGroup
from rlft.rl.sampling import fresh_groups, with_replayed
from rlft.rollout.base import Sample
from rlft.rollout.hf import HFEngine
from rlft.types import TokenBatch
from rlft.validation import UsageError

from tests.conftest import interrupt_after_checkpoints

torch.set_num_threads(1)


def make_cfg(model_dir: Path, output_dir: Path, **overrides) -> RLConfig:
    cfg = RLConfig(model=str(model_dir), reward="uppercase_start", preset="tiny", num_train=32, heldout_size=8,
                   prompt_template="short", output_dir=str(output_dir), k=4, prompts_per_step=8, max_steps=20, lr=5e-2,
                   beta=0.0, max_new_tokens=1, micro_batch_size=8, save_every=0, device="cpu", dtype="float32",
                   advantage="rloo", loss="topr", loss_mode="seq_mean")
    return replace(cfg, **overrides)


# --------------------------------------------------------------------------- replayed groups, by hand


def sample(text: str, finish: str = "stop", ids=(5, 6)) -> Sample:
    return Sample(list(ids), text, finish, logprobs=[-1.0] * len(ids))


def fresh_step(raw: list[list[float]], k: int = 2) -> StepSamples:
    B = len(raw)
    samples = [[sample("A") for _ in range(k)] for _ in range(B)]
    raw_t = torch.tensor(raw)
    zeros = torch.zeros(B, k)
    return StepSamples([RLPrompt(f"p{b}") for b in range(B)], samples, list(range(B)), raw_t, raw_t.clone(), zeros,
                       torch.full((B, k), 2.0), raw_t.clone(), list(range(10, 10 + B)), list(range(B)), 0.5, 4 * B,
                       None, repeated=zeros)


def test_replayed_groups_are_shaped_filtered_and_appended_after_the_fresh_ones():
    prompts = [RLPrompt(f"q{i}") for i in range(4)]
    got = fresh_step([[1.0, 0.0]])
    varied = ReplayGroup(2, (sample("A", "length", (5, 6, 7)), sample("b")), (1.0, 1.0), 0)  # a truncated sample
    equal = ReplayGroup(3, (sample("A"), sample("A")), (1.0, 1.0), 0)
    cfg = RLConfig(k=2, truncation_penalty=-0.5)
    both, kept = with_replayed(cfg, got, [varied, equal], prompts)
    assert kept == [varied, equal] and both.groups == 3 and both.local == [0, 1, 2]
    assert [p.text for p in both.prompts] == ["p0", "q2", "q3"]
    # raw rewards kept; shaping recomputed: the truncated sample gets the penalty, 1 - 0.5
    assert both.raw.tolist() == [[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    assert both.shaped.tolist() == [[1.0, 0.0], [0.5, 1.0], [1.0, 1.0]]
    assert both.truncated.tolist() == [[0, 0], [1, 0], [0, 0]] and both.lengths.tolist() == [[2, 2], [3, 2], [2, 2]]
    # what the step sampled is unchanged: the reward metrics, groups and samples/total count fresh samples only
    assert both.all_raw is got.all_raw and both.tried == got.tried and both.kept == got.kept and both.samples_tried == 2
    # --filter-groups: the group whose shaped rewards are all equal is dropped, as a fresh one would be
    filtered, kept = with_replayed(replace(cfg, filter_groups=True), got, [varied, equal], prompts)
    assert kept == [varied] and filtered.groups == 2
    # nothing drawn: the step as it was
    assert with_replayed(cfg, got, [], prompts) == (got, [])


def test_a_replayed_all_equal_group_gets_no_rows_and_the_batch_rows_follow_the_groups(smol_tokenizer):
    prompts = [RLPrompt("Say hi"), RLPrompt("Say yo")]
    got = fresh_step([[1.0, 0.0]])
    got = replace(got, prompts=[RLPrompt("Say ok")])
    equal = ReplayGroup(1, (sample("A", ids=(7,)), sample("A", ids=(8, 9))), (1.0, 1.0), 0)
    cfg = RLConfig(k=2, advantage="rloo", loss="topr", replay_size=4)
    both, _ = with_replayed(cfg, got, [equal], prompts, smol_tokenizer)
    assert both.batch.input_ids.shape[0] == 4  # (B + R) * k rows, b * k + j
    expected = rollout_batch(smol_tokenizer, ["Say ok", "Say yo"], both.samples)
    assert torch.equal(both.batch.input_ids, expected.input_ids) and torch.equal(both.batch.loss_mask,
                                                                                 expected.loss_mask)
    objective = make_objective(cfg.policy, cfg.kl, cfg.importance, replay=True)
    weights = objective.weights(advantage_function(cfg.policy)(both.shaped).flatten())  # rloo: [1, -1] and [0, 0]
    assert weights.tolist() == [1.0, -1.0, 0.0, 0.0]
    assert gradient_rows(weights, objective, both.batch.loss_mask).tolist() == [0, 1]
    # the behaviour log-probs of the replayed rows are those stored with the samples
    behaviour = sampler_logprobs(both.batch, both.samples)
    assert behaviour[2][both.batch.loss_mask[2].bool()].tolist() == [-1.0]
    assert behaviour[3][both.batch.loss_mask[3].bool()].tolist() == [-1.0, -1.0]
    # what the buffer keeps of the step: the fresh groups' training-prompt index, samples and raw rewards
    [(index, samples, raw)] = fresh_groups(both, 1)
    assert index == 10 and samples == got.samples[0] and raw.tolist() == [1.0, 0.0]


def test_an_engine_without_log_probs_stores_the_trainers(smol_tokenizer):
    samples = [[Sample([5, 6], "a", "stop"), Sample([7], "b", "stop", logprobs=[-0.25])]]
    batch = rollout_batch(smol_tokenizer, ["Say ok"], samples)
    trainer = torch.arange(batch.loss_mask.numel(), dtype=torch.float32).view(batch.loss_mask.shape) * batch.loss_mask
    filled = with_logprobs(samples, batch, trainer)
    width = int(batch.attention_mask[0].sum())
    assert filled[0][0].logprobs == trainer[0, width - 2 : width].tolist()  # the row's completion positions
    assert filled[0][1] is samples[0][1]  # a sample with log-probs keeps them
    assert torch.equal(sampler_logprobs(batch, filled)[0], trainer[0])


def test_replay_log_ratios_are_sums_over_the_replayed_rows_by_hand():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    batch = TokenBatch(torch.zeros(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long), mask)
    behaviour = torch.full((4, 3), -1.0)
    old = torch.tensor([[-1.0, -1.0, 0.0], [-0.5, 9.0, 9.0], [-2.0, -1.0, -0.5], [-3.0, -3.0, -3.0]])
    # every row's pre-update log-probs: rows 2 and 3 are replayed (fresh_rows 2); row 3 has no target token
    assert replay_log_ratios(batch, torch.tensor([0, 2]), old, None, behaviour, 2).tolist() == [-1.0 + 0.0 + 0.5]
    # only the updated rows' first-epoch log-probs: row 2 (rows 0 and 2 updated)
    update = old[[0, 2]]
    assert replay_log_ratios(batch, torch.tensor([0, 2]), None, update, behaviour, 2).tolist() == [-0.5]
    assert replay_log_ratios(batch, torch.tensor([0]), None, update[:1], behaviour, 2).numel() == 0


# --------------------------------------------------------------------------- the loop


def expected_share(step: int, staleness: int) -> float:
    """Buffer and draw of prompts_per_step x staleness groups, nothing filtered: at step s (1-based) the groups of the
    min(s - 1, staleness) previous steps are replayed beside the step's own."""
    old = min(step - 1, staleness)
    return old / (old + 1)


def test_topr_with_replay_learns_the_toy_reward_with_the_expected_share(tiny_model_dir, tmp_path):
    cfg = make_cfg(tiny_model_dir, tmp_path / "run", replay_size=8, max_staleness=1)  # reuse factor 2
    train_rl(cfg)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 21))
    rewards = [r["reward/mean"] for r in records]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.3, [round(r, 2) for r in rewards]
    for r in records:
        assert r["replay/share"] == pytest.approx(expected_share(r["step"], 1))
        assert r["replay/staleness_mean"] == (0.0 if r["step"] == 1 else 1.0)
        assert r["samples/step"] == 32 and r["groups/kept"] == 8  # fresh samples only
    assert records[-1]["samples/total"] == 20 * 32
    # the replayed samples were generated by the policy before the last update: their log-ratio moved off 0 (0 is
    # logged when no replayed row was updated: once every group's rewards are equal, nothing is)
    assert all(r["replay/abs_log_ratio_p99"] >= r["replay/abs_log_ratio_mean"] >= 0 for r in records)
    assert records[1]["update/rows_frac"] > 0 and records[1]["replay/abs_log_ratio_mean"] > 0
    # the engine reports log-probs: the fresh samples' mismatch is float rounding only (float32 sampler and trainer)
    # (logged when fresh rows were updated)
    assert "mismatch/abs_logp_mean" in records[0] and all(r.get("mismatch/abs_logp_mean", 0.0) < 1e-4 for r in records)
    assert any("pg/topr_weight_mean" in r for r in records)


def test_a_longer_staleness_with_ppo_replays_the_last_two_steps(tiny_model_dir, tmp_path):
    cfg = make_cfg(tiny_model_dir, tmp_path / "ppo", loss="ppo", replay_size=8, max_staleness=2, prompts_per_step=4,
                   max_steps=4)  # reuse factor 3
    train_rl(cfg)
    records = read_metrics(tmp_path / "ppo" / "metrics.jsonl")
    assert [r["replay/share"] for r in records] == pytest.approx([expected_share(s, 2) for s in (1, 2, 3, 4)])
    assert [r["replay/staleness_mean"] for r in records] == [0.0, 1.0, 1.5, 1.5]
    # the ratio divides by the sampler's log-probs from the first epoch on: replayed rows are off 1
    assert records[0]["pg/ratio_mean"] == pytest.approx(
        1.0, abs=1e-4) and records[-1]["pg/ratio_mean"] != pytest.approx(1.0, abs=1e-4)


def test_without_engine_log_probs_the_buffer_keeps_the_trainers(tiny_model_dir, tmp_path, monkeypatch):
    real = HFEngine.generate

    def no_logprobs(self, prompts, params):
        return [[replace(s, logprobs=None) for s in row] for row in real(self, prompts, params)]

    monkeypatch.setattr(HFEngine, "generate", no_logprobs)
    cfg = make_cfg(tiny_model_dir, tmp_path / "nolp", replay_size=4, prompts_per_step=4, max_steps=3, save_every=2)
    train_rl(cfg)
    records = read_metrics(tmp_path / "nolp" / "metrics.jsonl")
    assert not any("mismatch/abs_logp_mean" in r for r in records)  # nothing to compare with
    assert [r["replay/share"] for r in records] == pytest.approx([0.0, 0.5, 0.5])
    assert all(r["replay/abs_log_ratio_mean"] > 0 for r in records[1:])
    state = read_trainer_state(tmp_path / "nolp" / "checkpoints" / "step-00000002")["replay"]  # after step 2
    assert [g["step"] for g in state["groups"]] == [1] * 4
    assert all(s["logprobs"] is not None and len(s["logprobs"]) == len(s["completion_ids"])
               for g in state["groups"] for s in g["samples"])


# --------------------------------------------------------------------------- resume


def recording_draws(monkeypatch) -> list:
    """Patch ReplayBuffer.draw to record ``(step, [(group step, prompt index), ...])`` of every draw."""
    draws = []
    real = ReplayBuffer.draw

    def draw(self, n, step, generator):
        groups, staleness = real(self, n, step, generator)
        draws.append((step, [(g.step, g.prompt) for g in groups]))
        return groups, staleness

    monkeypatch.setattr(ReplayBuffer, "draw", draw)
    return draws


def same_buffer(a: dict, b: dict) -> None:
    assert [(g["step"], g["prompt"], g["rewards"]) for g in a["groups"]
            ] == [(g["step"], g["prompt"], g["rewards"]) for g in b["groups"]]
    for ga, gb in zip(a["groups"], b["groups"]):
        for sa, sb in zip(ga["samples"], gb["samples"]):
            assert sa["completion_ids"] == sb["completion_ids"] and sa["finish_reason"] == sb["finish_reason"]
            assert sa["logprobs"] == pytest.approx(sb["logprobs"], abs=1e-6)


def test_a_killed_and_resumed_replay_run_keeps_the_buffer_and_draws(tiny_model_dir, tmp_path, monkeypatch):
    # draws sample from 12 stored groups, 6 at a time; the KL in the reward makes replayed rows need the pre-update pass
    cfg = make_cfg(tiny_model_dir, tmp_path / "a", replay_size=6, max_staleness=3, prompts_per_step=4, max_steps=6,
                   save_every=2, keep_checkpoints=3, beta=0.05, max_new_tokens=3)  # kept: steps 2, 4 and 6
    draws_a = recording_draws(monkeypatch)
    train_rl(cfg)
    a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    draws_a = list(draws_a)

    with monkeypatch.context() as mp:  # the same run killed after its step-2 checkpoint
        draws_b = recording_draws(mp)
        interrupt_after_checkpoints(mp, 1)
        with pytest.raises(KeyboardInterrupt):
            train_rl(replace(cfg, output_dir=str(tmp_path / "b")))
        assert latest_checkpoint(tmp_path / "b").name == "step-00000002"
        killed = read_trainer_state(tmp_path / "b" / "checkpoints" / "step-00000002")["replay"]
        same_buffer(killed, read_trainer_state(tmp_path / "a" / "checkpoints" / "step-00000002")["replay"])
        assert [g["step"] for g in killed["groups"]] == [0] * 4 + [1] * 4
        train_rl(replace(cfg, output_dir=str(tmp_path / "b"), resume=True))
    b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert draws_b[2:] == draws_a[2:]  # the resumed run (steps 2..5) draws the groups the uninterrupted run drew
    assert any(len(groups) == 6 and len({s for s, _ in groups}) > 1 for _, groups in draws_a)  # draws from full buffers
    same_buffer(read_trainer_state(tmp_path / "b" / "checkpoints" / "step-00000004")["replay"],
                read_trainer_state(tmp_path / "a" / "checkpoints" / "step-00000004")["replay"])
    assert [r["step"] for r in b] == list(range(1, 7))
    for ra, rb in zip(a, b):
        for key in ra:
            if key.startswith(("replay/", "reward/", "loss/", "adv/", "kl/", "pg/")):
                assert rb[key] == pytest.approx(ra[key], abs=1e-5), (ra["step"], key)


def test_resuming_with_replay_from_a_checkpoint_without_a_buffer_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    cfg = make_cfg(tiny_model_dir, tmp_path / "r", prompts_per_step=4, max_steps=3, save_every=1)
    with monkeypatch.context() as mp:
        interrupt_after_checkpoints(mp, 1)
        with pytest.raises(KeyboardInterrupt):
            train_rl(cfg)
    with pytest.raises(UsageError,
                       match="^--resume with --replay-size: checkpoint .*step-00000001 holds no replay buffer"):
        train_rl(replace(cfg, resume=True, replay_size=4, resume_override=("replay_size",)))


def test_resuming_with_replay_and_another_k_is_refused_in_one_line(tiny_model_dir, tmp_path, monkeypatch):
    # the buffer holds groups of k=4 samples; resumed with --resume-override k and k=2, the step's draw would stack
    # them as (groups, 2) rewards: a shape error in the loop. It is refused before the first step instead.
    cfg = make_cfg(tiny_model_dir, tmp_path / "k", replay_size=4, prompts_per_step=4, max_steps=3, save_every=1)
    with monkeypatch.context() as mp:
        interrupt_after_checkpoints(mp, 1)
        with pytest.raises(KeyboardInterrupt):
            train_rl(cfg)
    assert [g["step"] for g in read_trainer_state(latest_checkpoint(tmp_path / "k"))["replay"]["groups"]] == [0] * 4
    refusal = (r"^--resume with --replay-size: checkpoint .*step-00000001's replay buffer holds groups of k=4 samples, "
               r"this run samples k=2; resume with --k 4")
    with pytest.raises(UsageError, match=refusal):
        train_rl(replace(cfg, k=2, resume=True, resume_override=("k",)))
    assert len(read_metrics(tmp_path / "k" / "metrics.jsonl")) == 1  # nothing trained or logged after the refusal
    train_rl(replace(cfg, resume=True))  # the same k resumes
    assert [r["step"] for r in read_metrics(tmp_path / "k" / "metrics.jsonl")] == [1, 2, 3]


# --------------------------------------------------------------------------- the non-finite guard


def test_a_nan_loss_stops_the_rl_loop_before_the_update(tiny_model_dir, tmp_path, monkeypatch):
    real = rl_recipe.policy_loss_backward
    calls = []

    def poisoned(*args, **kwargs):
        metrics, logprobs = real(*args, **kwargs)
        calls.append(1)
        return ({**metrics, "loss/policy": float("nan")} if len(calls) == 2 else metrics), logprobs

    monkeypatch.setattr(rl_recipe, "policy_loss_backward", poisoned)
    cfg = make_cfg(tiny_model_dir, tmp_path / "nan", loss="reinforce", prompts_per_step=4, max_steps=3)
    with pytest.raises(NonFiniteError,
                       match="^step 2: loss is nan; there is no checkpoint; no final model was written$"):
        train_rl(cfg)
    assert len(read_metrics(tmp_path / "nan" / "metrics.jsonl")) == 1 and not (tmp_path / "nan" / "model").exists()


def test_replay_under_torchrun_is_refused_before_anything_loads(tmp_path, monkeypatch):
    from rlft import distributed

    monkeypatch.setattr(distributed, "init", lambda device: None)
    monkeypatch.setattr(distributed, "active", lambda: True)
    cfg = make_cfg(Path("no-such-model"), tmp_path / "ddp", replay_size=8)
    with pytest.raises(UsageError, match="^--replay-size runs in one process"):
        train_rl(cfg)
    assert not (tmp_path / "ddp").exists()
