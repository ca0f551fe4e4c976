"""Answers that run past max_new_tokens or loop: DAPO's soft overlong punishment (rlft.rl.shaping, hand-checked values
at the boundaries), the repetition-aware reward (hand-made completions, the refused options, the loop's metrics) and
--mask-truncated (a masked sample adds exactly what an absent one adds: nothing; the loop leaves truncated samples out
of the update)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlft.checkpoint import read_metrics
from rlft.losses.advantages import rloo_advantages
from rlft.losses.pg import PolicyObjective
from rlft.recipes.rl import train_rl
from rlft.rl.batch import (LossContext, PassPlan, batch_logprobs, gradient_rows, policy_loss_backward, rollout_batch,
                           take_rows, without_rows)
from rlft.rl.config import RLConfig
from rlft.rl.shaping import (overlong_penalty, repeated_samples, repeats_a_line, repetition_term, shaped_rewards,
                             shaping_metrics)
from rlft.rollout.base import Sample

from tests.conftest import make_tiny_model

torch.set_num_threads(1)


# --------------------------------------------------------------------------- the overlong punishment


def test_overlong_penalty_hand_values_at_the_boundaries():
    # L_max = 10, L_cache = 4: no penalty up to 6 tokens; then (6 - |y|) / 4: 7 -> -1/4, 8 -> -1/2, 9 -> -3/4,
    # 10 (= L_max) -> -1; beyond L_max -> -1 (impossible under a hard cap, kept by the formula).
    lengths = torch.tensor([0, 1, 5, 6, 7, 8, 9, 10, 11, 50])
    expected = torch.tensor([0.0, 0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
    assert torch.equal(overlong_penalty(lengths, 10, 4), expected)
    assert torch.equal(overlong_penalty(lengths, 10, 4, penalty=0.5), expected * 0.5)  # the scale
    assert overlong_penalty(lengths, 10, 4).dtype == torch.float32
    # L_cache = L_max: a pure length penalty, |y| / L_max; L_cache = 1: only a completion of exactly L_max tokens
    assert torch.equal(overlong_penalty(torch.tensor([0, 5, 10]), 10, 10), torch.tensor([0.0, -0.5, -1.0]))
    assert torch.equal(overlong_penalty(torch.tensor([[8, 9], [10, 3]]), 10, 1), torch.tensor([[0.0, 0.0], [-1.0,
                                                                                                            0.0]]))
    with pytest.raises(ValueError, match="overlong buffer must lie in 1..10"):
        overlong_penalty(lengths, 10, 0)
    with pytest.raises(ValueError, match="overlong buffer must lie in 1..10"):
        overlong_penalty(lengths, 10, 11)
    with pytest.raises(ValueError, match="must be >= 0"):
        overlong_penalty(lengths, 10, 4, penalty=-1.0)


def test_shaped_rewards_add_both_penalties_to_the_raw_reward():
    raw = torch.tensor([[1.0, 0.1], [0.0, 1.0]])
    truncated = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    lengths = torch.tensor([[3.0, 8.0], [7.0, 5.0]])  # L_max 8, L_cache 2: 7 -> -0.5 * 2, 8 -> -1 * 2
    cfg = RLConfig(max_new_tokens=8)
    assert torch.equal(shaped_rewards(cfg.shaping, 8, raw, truncated, lengths), raw)
    on = replace(cfg, overlong_buffer=2, overlong_penalty=2.0)
    assert torch.allclose(shaped_rewards(on.shaping, 8, raw, truncated, lengths),
                          torch.tensor([[1.0, 0.1 - 2.0], [0.0 - 1.0, 1.0]]), atol=1e-7, rtol=0)
    both = replace(on, truncation_penalty=-0.5)
    assert torch.allclose(shaped_rewards(both.shaping, 8, raw, truncated, lengths),
                          torch.tensor([[1.0, 0.1 - 0.5 - 2.0], [-1.0, 1.0]]), atol=1e-7, rtol=0)
    off = replace(cfg, overlong_buffer=0).shaping  # 0: off
    assert torch.equal(shaped_rewards(off, 8, raw, truncated, lengths), raw)


def test_overlong_options_are_validated():
    with pytest.raises(ValueError, match=r"--overlong-buffer \(300\) must be <= --max-new-tokens \(256\)"):
        RLConfig(overlong_buffer=300)
    with pytest.raises(ValueError, match="--overlong-buffer must be >= 0"):
        RLConfig(overlong_buffer=-1)
    with pytest.raises(ValueError, match="--overlong-penalty must be >= 0"):
        RLConfig(overlong_buffer=4, overlong_penalty=-1.0)


# --------------------------------------------------------------------- --mask-truncated: a masked row is an absent row

PROMPTS = ["User: Using the numbers [3, 5], make 8.\nAssistant: <think>", "Hi"]


def fixed_samples(tok) -> list[list[Sample]]:
    """B=2 prompts x k=3 samples; those without EOS are "length" (truncated): rows 1, 2 and 4."""
    eos = tok.eos_token_id
    ids = [[[510, 77, 3021, eos], [12, 999], [4000, 41, 7, 8, 9]], [[6, eos], [3021, 3021, 3021], [88, eos]]]
    return [[Sample(c, tok.decode(c), "stop" if c[-1] == eos else "length") for c in row] for row in ids]


def grads(model) -> dict[str, torch.Tensor]:
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "objective",
    [
        PolicyObjective(loss_mode="seq_sum"),
        PolicyObjective(loss_mode="seq_mean"),
        PolicyObjective(loss_mode="token_mean", clip_low=0.2, clip_high=0.28),
        PolicyObjective(loss_mode="token_mean", kl_placement="loss", beta=0.3, kl_estimator="k3",
                        entropy_coef=0.05),  # every row kept
    ],
    ids=["seq_sum", "seq_mean", "token_mean-ppo", "kl-loss-entropy"])
def test_masked_truncated_rows_give_the_gradient_of_the_batch_without_them(smol_tokenizer, objective):
    tok = smol_tokenizer
    model, reference = make_tiny_model(len(tok), seed=6), make_tiny_model(len(tok), seed=7)
    plan = PassPlan(temperature=0.9, micro_batch_size=2)
    samples = fixed_samples(tok)
    rewards = torch.tensor([[1.0, 0.0, 0.1], [0.0, 0.5, 1.0]])
    advantages = rloo_advantages(rewards).flatten()  # over the whole groups: the truncated samples are in the baseline
    truncated = torch.tensor([s.finish_reason == "length" for row in samples for s in row])
    assert truncated.tolist() == [False, True, True, False, True, False]

    batch = rollout_batch(tok, PROMPTS, samples)
    train, weights = without_rows(batch, advantages, truncated)
    assert torch.equal(train.loss_mask[truncated], torch.zeros_like(train.loss_mask[truncated]))
    assert torch.equal(train.loss_mask[~truncated], batch.loss_mask[~truncated]) and torch.equal(
        weights[~truncated], advantages[~truncated])
    rows = gradient_rows(weights, objective, train.loss_mask)
    assert rows.tolist() == [0, 3, 5]  # with the KL and entropy in the loss too: a masked row has nothing to train
    ref = batch_logprobs(reference, batch, plan)
    model.zero_grad()
    masked_metrics, _ = policy_loss_backward(model, take_rows(train, rows), weights[rows], objective, plan,
                                             LossContext(ref_logprobs=ref[rows], num_sequences=6 - int(truncated.sum()),
                                                         num_tokens=float(train.loss_mask.sum())))
    masked = grads(model)

    kept = [[s for s in row if s.finish_reason != "length"] for row in samples]
    absent_batch = rollout_batch(tok, PROMPTS, kept)  # the same step without the truncated rows, its own normalisers
    model.zero_grad()
    absent_metrics, _ = policy_loss_backward(model, absent_batch, advantages[~truncated], objective, plan,
                                             LossContext(ref_logprobs=batch_logprobs(reference, absent_batch, plan)))
    absent = grads(model)
    assert masked_metrics["loss/policy"] == pytest.approx(absent_metrics["loss/policy"], abs=1e-6)
    for name in absent:
        scale = float(absent[name].abs().max())
        assert scale > 0, name
        assert torch.allclose(masked[name], absent[name], atol=1e-6 * max(1.0, scale), rtol=0), name

    model.zero_grad()  # ... and with the truncated rows in, the gradient differs (the check above can fail)
    policy_loss_backward(model, batch, advantages, objective, plan, LossContext(ref_logprobs=ref))
    assert any(not torch.allclose(g, absent[n], atol=1e-6) for n, g in grads(model).items())


# --------------------------------------------------------------------------- the loop with both options


def make_cfg(model_dir: Path, output_dir: Path, **overrides) -> RLConfig:
    cfg = RLConfig(model=str(model_dir), reward="uppercase_start", preset="tiny", num_train=32, heldout_size=8,
                   prompt_template="short", output_dir=str(output_dir), advantage="rloo", k=4, prompts_per_step=4,
                   max_steps=3, lr=5e-2, beta=0.0, max_new_tokens=2, micro_batch_size=8, save_every=0, device="cpu",
                   dtype="float32")
    return replace(cfg, **overrides)


def test_loop_with_mask_truncated_trains_on_untruncated_samples_only(tiny_model_dir, tmp_path):
    train_rl(make_cfg(tiny_model_dir, tmp_path / "m", mask_truncated=True))
    records = read_metrics(tmp_path / "m" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert any(0 < r["completion/truncated_frac"] for r in records)  # a random model rarely stops within 2 tokens
    for r in records:  # beta 0: the update's rows are the untruncated samples with a non-zero advantage
        assert r["update/rows_frac"] <= 1.0 - r["completion/truncated_frac"] + 1e-9, r
        assert "reward/overlong_penalty_mean" not in r


def test_loop_with_the_overlong_punishment_logs_and_applies_it(tiny_model_dir, tmp_path):
    # max_new_tokens 2, L_cache 1: a 1-token answer (EOS) gets 0, a 2-token one -0.5 (penalty 0.5)
    train_rl(make_cfg(tiny_model_dir, tmp_path / "o", overlong_buffer=1, overlong_penalty=0.5))
    records = read_metrics(tmp_path / "o" / "metrics.jsonl")
    for r in records:  # every group kept, beta 0: shaped = raw + penalty
        assert -0.5 <= r["reward/overlong_penalty_mean"] < 0
        assert r["reward/shaped_mean"] == pytest.approx(r["reward/mean"] + r["reward/overlong_penalty_mean"], abs=1e-6)
        # every 2-token sample is punished: the mean penalty is -0.5 x the share of 2-token samples
        assert r["reward/overlong_penalty_mean"] == pytest.approx(-0.5 * (r["completion/mean_tokens"] - 1.0), abs=1e-6)


# --------------------------------------------------------------------------- the repetition-aware reward

LOOP = "93-24=79, 79+2=81, no.\n"
"""The line issue 48's greedy Countdown answers repeat until max_new_tokens."""


def test_repeats_a_line_on_hand_made_completions():
    looping = "Let me try 93 and 24.\n" + LOOP * 11 + "93-24=7"  # cut mid-line at max_new_tokens
    assert repeats_a_line(looping, 3) and repeats_a_line(looping, 11) and not repeats_a_line(looping, 12)
    answer = "93-24=69\n69+2=71\n71+29=100\n<answer>(93-24)+2+29</answer>"
    assert not repeats_a_line(answer, 2)  # every line once
    assert repeats_a_line(LOOP * 2, 2) and not repeats_a_line(LOOP * 2, 3)  # N - 1 times: no
    # blank and whitespace-only lines never count, however many; surrounding whitespace is stripped
    assert not repeats_a_line("a\n\n\n   \n\t\nb\n\n", 2)
    assert repeats_a_line("  93-24=79, 79+2=81, no.\n\n93-24=79, 79+2=81, no.   \n", 2)
    # the last line counts (the completion is finished): twice with no newline after the second; a cut fragment
    # that is not a whole line does not
    assert repeats_a_line("x=1\nx=1", 2) and not repeats_a_line("x=1\nx=", 2)
    # a line that contains the repeated one is another line
    assert not repeats_a_line("no.\nno. no.\n", 2)
    with pytest.raises(ValueError, match="must be >= 2"):
        repeats_a_line(LOOP * 5, 1)


def test_repeated_samples_flags_each_completion_and_is_off_by_default():
    texts = [LOOP * 3, LOOP * 2 + "<answer>1+2</answer>", "one\ntwo\n", ""]
    assert repeated_samples(RLConfig().shaping, texts).tolist() == [0.0, 0.0, 0.0, 0.0]  # off
    assert repeated_samples(RLConfig(repetition_limit=3).shaping, texts).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert repeated_samples(RLConfig(repetition_limit=2).shaping, texts).tolist() == [1.0, 1.0, 0.0, 0.0]
    assert repeated_samples(RLConfig(repetition_limit=2).shaping, []).shape == (0,)


def test_shaped_rewards_score_a_repeating_sample_as_no_answer_or_add_the_penalty():
    raw = torch.tensor([[1.0, 0.1], [0.0, 1.0]])
    repeated = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    truncated = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    lengths = torch.tensor([[3.0, 8.0], [8.0, 5.0]])
    cfg = RLConfig(max_new_tokens=8)
    # off: the flags are not read
    assert torch.equal(shaped_rewards(cfg.shaping, 8, raw, truncated, lengths, repeated), raw)
    none = replace(cfg, repetition_limit=3)  # no answer: the raw reward of a repeating sample is 0
    assert torch.equal(shaped_rewards(none.shaping, 8, raw, truncated, lengths, repeated),
                       torch.tensor([[0.0, 0.0], [0.0, 1.0]]))
    assert torch.equal(shaped_rewards(none.shaping, 8, raw, truncated, lengths), raw)  # no flags given: nothing repeats
    penalty = replace(cfg, repetition_limit=3, repetition_penalty=-0.5)  # added to the raw reward
    assert torch.allclose(shaped_rewards(penalty.shaping, 8, raw, truncated, lengths, repeated),
                          torch.tensor([[0.5, -0.4], [-0.5, 1.0]]), atol=1e-7, rtol=0)
    # then the truncation and overlong penalties are added (L_max 8, L_cache 2: 8 tokens -> -1)
    both = replace(none, truncation_penalty=-0.25, overlong_buffer=2)
    assert torch.allclose(shaped_rewards(both.shaping, 8, raw, truncated, lengths, repeated),
                          torch.tensor([[0.0, 0.0 - 0.25 - 1.0], [0.0 - 0.25 - 1.0, 1.0]]), atol=1e-7, rtol=0)
    assert torch.equal(repetition_term(none.shaping, raw, repeated), torch.tensor([[-1.0, -0.1], [-0.0, 0.0]]))
    assert torch.equal(raw, torch.tensor([[1.0, 0.1], [0.0, 1.0]]))  # the input is not changed


def test_shaping_metrics_repetition_frac_and_mean_penalty():
    raw = torch.tensor([[1.0, 0.1], [0.0, 1.0]])
    repeated = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    lengths = torch.tensor([[3.0, 8.0], [8.0, 5.0]])
    assert shaping_metrics(RLConfig(max_new_tokens=8).shaping, 8, lengths, raw, repeated) == {}
    none = shaping_metrics(RLConfig(max_new_tokens=8, repetition_limit=4).shaping, 8, lengths, raw, repeated)
    assert none == pytest.approx({"reward/repetition_frac": 0.75, "reward/repetition_penalty_mean": -(1.0 + 0.1) / 4},
                                 abs=1e-7)
    penalty = shaping_metrics(
        RLConfig(max_new_tokens=8, repetition_limit=4, repetition_penalty=-0.5, overlong_buffer=2).shaping, 8, lengths,
        raw, repeated)
    assert penalty == pytest.approx({"reward/repetition_frac": 0.75, "reward/repetition_penalty_mean": -0.5 * 3 / 4,
                                     "reward/overlong_penalty_mean": -2.0 / 4}, abs=1e-7)
    empty = torch.zeros(0, 2)
    assert shaping_metrics(RLConfig(repetition_limit=4).shaping, 256, empty, empty, empty) == {}


@pytest.mark.parametrize(("options", "message"), [
    ({"repetition_penalty": -0.5}, r"--repetition-penalty is only read with --repetition-limit"),
    ({"repetition_limit": 1}, r"--repetition-limit must be >= 2"),
    ({"repetition_limit": 0}, r"--repetition-limit must be >= 2"),
    ({"repetition_limit": 3, "repetition_penalty": 0.5
      }, r"--repetition-penalty must be <= 0 \(it is added to the reward\), got 0.5"),
    ({"repetition_limit": 3, "prompts_data": "prefs.jsonl", "reward_model": "rm"
      }, r"a reward model or judge has no such score"),
    ({"repetition_limit": 3, "prompts_data": "prefs.jsonl", "reward": "remote"}, r"set --repetition-penalty"),
], ids=["penalty-without-limit", "limit-1", "limit-0", "positive-penalty", "reward-model-no-answer", "judge-no-answer"])
def test_repetition_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**options)


def test_repetition_options_accepted():
    assert RLConfig(repetition_limit=2).repetition_penalty is None
    assert RLConfig(repetition_limit=5, repetition_penalty=0.0).repetition_penalty == 0.0
    assert RLConfig(repetition_limit=3, repetition_penalty=-0.5, prompts_data="prefs.jsonl",
                    reward_model="rm").repetition_limit == 3


class LoopingEngine:
    """Sample j of every prompt: the loop line written j + 1 times (so with k = 3, --repetition-limit 2 flags samples
    1 and 2); every sample stops with EOS (no truncation)."""

    add_special_tokens = True

    def generate(self, prompts, params):
        return [[Sample([7] * (j + 1), LOOP * (j + 1), "stop") for j in range(params.k)] for _ in prompts]


def test_sample_step_flags_repeating_samples_and_shapes_them_once():
    # raw rewards all 1 (every group all-equal: --filter-groups would drop it); samples 1 and 2 of each group repeat
    # the line 2 and 3 times: no answer -> 0, so every group varies and is kept.
    from rlft.recipes.common import batch_indices
    from rlft.rl.records import Reward, RLPrompt
    from rlft.rl.sampling import sample_step

    cfg = RLConfig(k=3, prompts_per_step=2, repetition_limit=2, filter_groups=True, max_prompt_batches=2, seed=1)
    prompts = [RLPrompt(f"Prompt {i}", None, {}) for i in range(4)]
    reward = Reward(lambda ps, cs: [1.0] * len(cs), "rule")
    got = sample_step(cfg, 0, prompts, lambda v: batch_indices(v, len(prompts), 2, cfg.seed), LoopingEngine(), reward)
    assert got.repeated.tolist() == [[0.0, 1.0, 1.0]] * 2 and got.raw.tolist() == [[1.0, 1.0, 1.0]] * 2
    assert got.shaped.tolist() == [[1.0, 0.0, 0.0]] * 2 and got.groups == 2 and got.samples_tried == 6
    assert shaping_metrics(cfg.shaping, cfg.max_new_tokens, got.lengths, got.raw, got.repeated) == pytest.approx(
        {"reward/repetition_frac": 4 / 6, "reward/repetition_penalty_mean": -4 / 6}, abs=1e-7)
    # off: nothing is flagged, and the all-equal groups are dropped
    off = sample_step(replace(cfg, repetition_limit=None), 0, prompts,
                      lambda v: batch_indices(v, len(prompts), 2, cfg.seed), LoopingEngine(), reward)
    assert off.groups == 0 and off.repeated.shape == (0, 3)


def test_loop_with_the_repetition_limit_logs_and_applies_it(tiny_model_dir, tmp_path, monkeypatch):
    # A random tiny model writes no lines in 2 tokens, so the detector is replaced by one the toy reward can check: a
    # completion "repeats" when it starts with an uppercase letter, i.e. exactly when uppercase_start scores it 1.
    # No answer: every such sample scores 0, so the shaped rewards are all 0 and the share flagged is reward/mean.
    import rlft.rl.shaping as shaping

    limits = []
    monkeypatch.setattr(shaping, "repeats_a_line",
                        lambda text, limit: limits.append(limit) or text.lstrip()[:1].isupper())
    train_rl(make_cfg(tiny_model_dir, tmp_path / "r", repetition_limit=3))
    records = read_metrics(tmp_path / "r" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3] and set(limits) == {3} and len(limits) == 3 * 16
    assert any(r["reward/mean"] > 0 for r in records)  # a random model's first token is uppercase ~25% of the time
    for r in records:  # every group kept, beta 0: the trained samples are the step's samples
        assert r["reward/repetition_frac"] == pytest.approx(r["reward/mean"], abs=1e-6)
        assert r["reward/repetition_penalty_mean"] == pytest.approx(-r["reward/mean"], abs=1e-6)
        assert r["reward/shaped_mean"] == pytest.approx(0.0, abs=1e-6)
        assert "reward/overlong_penalty_mean" not in r
    # with a penalty: added to the raw reward of the flagged samples
    train_rl(make_cfg(tiny_model_dir, tmp_path / "p", repetition_limit=3, repetition_penalty=-0.5, max_steps=1))
    (r,) = read_metrics(tmp_path / "p" / "metrics.jsonl")
    assert r["reward/repetition_penalty_mean"] == pytest.approx(-0.5 * r["reward/repetition_frac"], abs=1e-6)
    assert r["reward/shaped_mean"] == pytest.approx(r["reward/mean"] * 0.5, abs=1e-6)
