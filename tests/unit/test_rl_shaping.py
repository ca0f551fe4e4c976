"""Answers that run past max_new_tokens: DAPO's soft overlong punishment (rlft.rl.shaping, hand-checked values at
the boundaries) and --mask-truncated (a masked sample adds exactly what an absent one adds: nothing; the loop
leaves truncated samples out of the update)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlft.checkpoint import read_metrics
from rlft.losses.advantages import rloo_advantages
from rlft.losses.pg import PolicyObjective
from rlft.recipes.rl import train_rl
from rlft.rl.batch import LossContext, PassPlan, batch_logprobs, gradient_rows, policy_loss_backward, rollout_batch, take_rows, without_rows
from rlft.rl.config import RLConfig
from rlft.rl.shaping import overlong_penalty, shaped_rewards
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
    assert torch.equal(overlong_penalty(torch.tensor([[8, 9], [10, 3]]), 10, 1), torch.tensor([[0.0, 0.0], [-1.0, 0.0]]))
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
    assert torch.equal(shaped_rewards(cfg, raw, truncated, lengths), raw)
    on = replace(cfg, overlong_buffer=2, overlong_penalty=2.0)
    assert torch.allclose(shaped_rewards(on, raw, truncated, lengths), torch.tensor([[1.0, 0.1 - 2.0], [0.0 - 1.0, 1.0]]), atol=1e-7, rtol=0)
    both = replace(on, truncation_penalty=-0.5)
    assert torch.allclose(shaped_rewards(both, raw, truncated, lengths), torch.tensor([[1.0, 0.1 - 0.5 - 2.0], [-1.0, 1.0]]), atol=1e-7, rtol=0)
    assert torch.equal(shaped_rewards(replace(cfg, overlong_buffer=0), raw, truncated, lengths), raw)  # 0: off


def test_overlong_options_are_validated():
    with pytest.raises(ValueError, match=r"--overlong-buffer \(300\) must be <= --max-new-tokens \(256\)"):
        RLConfig(overlong_buffer=300)
    with pytest.raises(ValueError, match="--overlong-buffer must be >= 0"):
        RLConfig(overlong_buffer=-1)
    with pytest.raises(ValueError, match="--overlong-penalty must be >= 0"):
        RLConfig(overlong_buffer=4, overlong_penalty=-1.0)


# --------------------------------------------------------------------------- --mask-truncated: a masked row is an absent row

PROMPTS = ["User: Using the numbers [3, 5], make 8.\nAssistant: <think>", "Hi"]


def fixed_samples(tok) -> list[list[Sample]]:
    """B=2 prompts x k=3 samples; those without EOS are "length" (truncated): rows 1, 2 and 4."""
    eos = tok.eos_token_id
    ids = [[[510, 77, 3021, eos], [12, 999], [4000, 41, 7, 8, 9]], [[6, eos], [3021, 3021, 3021], [88, eos]]]
    return [[Sample(c, tok.decode(c), "stop" if c[-1] == eos else "length") for c in row] for row in ids]


def grads(model) -> dict[str, torch.Tensor]:
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


@pytest.mark.parametrize("objective", [
    PolicyObjective(loss_mode="seq_sum"),
    PolicyObjective(loss_mode="seq_mean"),
    PolicyObjective(loss_mode="token_mean", clip_low=0.2, clip_high=0.28),
    PolicyObjective(loss_mode="token_mean", kl_placement="loss", beta=0.3, kl_estimator="k3", entropy_coef=0.05),  # every row kept
], ids=["seq_sum", "seq_mean", "token_mean-ppo", "kl-loss-entropy"])
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
    assert torch.equal(train.loss_mask[~truncated], batch.loss_mask[~truncated]) and torch.equal(weights[~truncated], advantages[~truncated])
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
    cfg = RLConfig(model=str(model_dir), reward="uppercase_start", preset="tiny", num_train=32, heldout_size=8, prompt_template="short",
                   output_dir=str(output_dir), advantage="rloo", k=4, prompts_per_step=4, max_steps=3, lr=5e-2, beta=0.0,
                   max_new_tokens=2, micro_batch_size=8, save_every=0, device="cpu", dtype="float32")
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
