"""examples/rloo_minimal.py, the one-file RLOO step, makes the update ``rlft rl --advantage rloo`` makes (the
``rlft rloo`` defaults: RLOO advantages, REINFORCE, seq_sum, the KL in the reward at beta 0.001, AdamW, the gradient
norm clipped to 1) on a tiny model from the same weights, with the same prompts, samples and lr.

The library samples with its own decoders (``rlft.rollout``) and the example with ``model.generate``, whose random
streams differ, so both are fed the same scripted completions: the HF engine's ``generate`` is patched for the
library's run, and the example is given a sampler that returns what the library was given. Everything after sampling
(scoring, log-probs, KL, advantages, loss, clipping, the AdamW step) is each one's own code."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from rlft.checkpoint import read_metrics
from rlft.models import load_model, load_tokenizer
from rlft.recipes.rl import train_rl
from rlft.rl.config import rloo_config
from rlft.rl.prompts import load_prompts
from rlft.rollout.base import Sample
from rlft.rollout.hf import HFEngine
from rlft.tasks.countdown.solver import solve

from tests.conftest import load_script, load_weights

pytestmark = pytest.mark.usefixtures("one_thread")


def scripted(tokenizer, ground_truth: dict) -> list[Sample]:
    """k = 4 completions of one prompt: a correct answer (reward 1), two answers (0.1 when wrong: with the tiny preset's
    two numbers their sum may be right) and no answer (0)."""
    nums, target = list(ground_truth["numbers"]), ground_truth["target"]
    texts = [f"<answer>{solve(nums, target)[0]}</answer>", f"<answer>{nums[0]} + {nums[1]}</answer>",
             "I am not sure.", f"First {nums[0]}.\n<answer>{nums[0]} * {nums[-1]}</answer>"]
    return [Sample(tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id], t, "stop")
            for t in texts]


def test_the_minimal_step_makes_the_librarys_rloo_update(tiny_model_dir, tmp_path, monkeypatch):
    example = load_script("examples/rloo_minimal")
    cfg = rloo_config(model=str(tiny_model_dir), preset="tiny", num_train=8, heldout_size=8, k=4, prompts_per_step=4,
                      max_steps=1, lr=1e-3, max_new_tokens=32, save_every=0, device="cpu", dtype="float32",
                      output_dir=str(tmp_path / "rloo"))
    tokenizer = load_tokenizer(cfg.model)
    truths = {p.text: p.ground_truth for p in load_prompts(cfg, tokenizer)[0]}
    given: list[tuple[list[str], list[list[Sample]]]] = []

    def generate(self, prompts, params):  # the library's sampler: scripted completions, recorded
        samples = [scripted(tokenizer, truths[p]) for p in prompts]
        given.append((list(prompts), samples))
        return samples

    monkeypatch.setattr(HFEngine, "generate", generate)
    train_rl(cfg)
    [(prompts, samples)] = given
    library = load_weights(tmp_path / "rloo" / "model")
    [record] = read_metrics(tmp_path / "rloo" / "metrics.jsonl")

    model = load_model(cfg.model)  # the same start weights, lr and options, the example's own step
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    metrics = example.rloo_step(model, copy.deepcopy(model).eval(), optimizer, tokenizer, prompts,
                                [truths[p] for p in prompts], k=cfg.k, beta=cfg.beta, temperature=cfg.temperature,
                                max_new_tokens=cfg.max_new_tokens, max_grad_norm=cfg.max_grad_norm,
                                sampler=lambda *args, **kwargs: [[(s.completion_ids, s.text) for s in row]
                                                                 for row in samples])
    # the same step: the rewards (varied: 1, 0.1 or 1, 0, 0.1 or 1 per prompt), the loss and the clipped gradient's norm
    assert metrics["reward/mean"] == pytest.approx(record["reward/mean"], rel=1e-6)
    assert 0.3 <= metrics["reward/mean"] < 1.0
    assert metrics["adv/std"] == pytest.approx(record["adv/std"], rel=1e-5)
    assert metrics["loss/policy"] == pytest.approx(record["loss/policy"], rel=1e-4)
    assert metrics["grad_norm"] == pytest.approx(record["grad_norm"], rel=1e-4)
    assert metrics["kl/mean"] == 0.0 and record["kl/mean"] == 0.0  # the reference is the start policy
    # the same update, parameter by parameter: within 1e-3 of the update's own size (float32 rounding of two forwards
    # batched differently; AdamW's first step is about lr x sign(gradient), so a sign flip would show)
    moved = 0.0
    for name, p in model.named_parameters():
        if name not in library:  # the tied LM head is saved once, as the embeddings
            continue
        ours, theirs = p.detach() - start[name], library[name] - start[name]
        scale = float(theirs.norm())
        assert float((ours - theirs).norm()) <= 1e-3 * scale + 1e-9, (name, float((ours - theirs).norm()), scale)
        moved += scale
    assert moved > 1e-3  # the step did move the weights (lr 1e-3 on every parameter with a gradient)


def test_the_minimal_step_samples_with_the_models_generate(tiny_model_dir):
    example = load_script("examples/rloo_minimal")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    samples = example.sample(model, tokenizer, ["Using the numbers", "Make 24"], k=3, temperature=1.0,
                             max_new_tokens=4, seed=0)
    assert [len(row) for row in samples] == [3, 3]
    assert all(1 <= len(ids) <= 4 and text == tokenizer.decode(ids, skip_special_tokens=True)
               for row in samples for ids, text in row)
    again = example.sample(model, tokenizer, ["Using the numbers", "Make 24"], k=3, temperature=1.0,
                           max_new_tokens=4, seed=0)
    assert again == samples  # seeded
    # a whole step with them: the reward is 0 for every sample (no answer tags), so nothing moves but it runs
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = example.rloo_step(model, copy.deepcopy(model).eval(), optimizer, tokenizer, ["Make 24 from 3 8 1"],
                                [{"target": 24, "numbers": [3, 8, 1]}], k=2, max_new_tokens=3)
    assert metrics["reward/mean"] == 0.0 and metrics["adv/std"] == 0.0 and metrics["loss/policy"] == 0.0


def test_the_example_is_one_short_file():
    path = Path(__file__).resolve().parents[2] / "examples" / "rloo_minimal.py"
    lines = path.read_text().splitlines()
    assert len(lines) <= 250 and max(map(len, lines)) <= 120
