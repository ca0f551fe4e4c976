"""One RL step as the loop reads it: the step record (rlft.rl.records, rlft.rl.sampling: rewards shaped once, this
rank's batch, the totals), compute accounting (rlft.compute.RunTotals: tokens and FLOPs, by hand and in the loop),
the engines' ``sync_weights(model)`` and ``make_engine`` (rlft.rollout), --mask-truncated's warning and --compile in
``rlft rl``."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import rlft.recipes.rl as rl_recipe
import rlft.rl.sampling as rl_sampling
import rlft.rollout.hf as rollout_hf
from rlft.checkpoint import read_metrics
from rlft.lora import LoRASettings, apply_lora, merged_copy
from rlft.models import DeviceSpec, load_model, load_tokenizer
from rlft.recipes.common import batch_indices
from rlft.recipes.memory import COMPILE_BACKEND_ENV, compile_layers, eager_layers
from rlft.recipes.rl import train_rl
from rlft.rl.batch import rollout_batch
from rlft.rl.config import RLConfig
from rlft.compute import RunTotals, parameter_count
from rlft.rl.metrics import step_counts
from rlft.rl.prompts import load_prompts
from rlft.rl.records import Reward, RLPrompt
from rlft.rl.sampling import sample_step
from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.engines import check_training_engine, make_engine
from rlft.rollout.hf import HFEngine, encode_prompts
from rlft.tasks.countdown.prompts import adds_special_tokens
from rlft.validation import UsageError

from tests.conftest import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- the step record


class ScriptedEngine:
    """Sample j of every prompt: j + 1 copies of the token 'A'; the last sample of each prompt is cut at
    max_new_tokens."""

    add_special_tokens = True

    def __init__(self, tokenizer, k: int, max_new_tokens: int):
        self.tokenizer, self.k, self.max_new_tokens = tokenizer, k, max_new_tokens
        self.a = tokenizer.convert_tokens_to_ids("A")

    def generate(self, prompts, params):
        lengths = [1] * (self.k - 1) + [self.max_new_tokens]
        return [[Sample([self.a] * n, "A" * n, "length" if n == self.max_new_tokens else "stop") for n in lengths]
                for _ in prompts]


def test_sample_step_shapes_once_filters_on_shaped_rewards_and_carries_the_batch(smol_tokenizer, monkeypatch):
    # raw rewards all 1: unshaped, every group would be dropped as all-equal. Shaped (max_new_tokens 4, buffer 2,
    # penalty 0.5, truncation -1): the 1-token sample keeps 1 + 0 = 1; the 4-token truncated one gets
    # 1 - 1 + (2 - 4) / 2 * 0.5 = -0.5. Every group varies, so both prompts are kept.
    cfg = RLConfig(k=2, prompts_per_step=2, max_new_tokens=4, truncation_penalty=-1.0, overlong_buffer=2,
                   overlong_penalty=0.5, filter_groups=True, max_prompt_batches=2, seed=3)
    calls = []
    real = rl_sampling.shaped_rewards
    monkeypatch.setattr(rl_sampling, "shaped_rewards", lambda *a: calls.append(1) or real(*a))
    prompts = [RLPrompt(f"Prompt number {i}", None, {}) for i in range(4)]
    reward = Reward(lambda ps, cs: [1.0] * len(cs), "rule")
    order = lambda virtual: batch_indices(virtual, len(prompts), cfg.prompts_per_step, cfg.seed)  # noqa: E731
    got = sample_step(cfg, 0, prompts, order, ScriptedEngine(smol_tokenizer, 2, 4), reward, smol_tokenizer)
    assert len(calls) == 1  # one tried batch: shaped once, by sampling; the loop reads got.shaped
    assert not hasattr(rl_recipe, "shaped_rewards")
    assert torch.equal(got.raw, torch.ones(2, 2))
    assert torch.allclose(got.shaped, torch.tensor([[1.0, -0.5], [1.0, -0.5]]), atol=1e-7, rtol=0)
    assert got.truncated.tolist() == [[0.0, 1.0], [0.0, 1.0]] and got.lengths.tolist() == [[1.0, 4.0], [1.0, 4.0]]
    assert (got.groups, got.samples_tried, got.generated_tokens, got.local) == (2, 4, 10, [0, 1])
    assert [p.text for p in got.prompts] == [prompts[i].text for i in order(0)]
    # the batch: row b * k + j = prompt b's ids, then sample j's ids, the loss on the sample's tokens only
    assert got.batch.input_ids.shape[0] == 4 and got.batch.loss_mask.sum(dim=1).tolist() == [1.0, 4.0, 1.0, 4.0]
    ids = encode_prompts(smol_tokenizer, [p.text for p in got.prompts])
    for row in range(4):
        n = int(got.batch.attention_mask[row].sum())
        assert got.batch.input_ids[row, :n].tolist() == ids[row // 2] + got.samples[row // 2][row % 2].completion_ids
    # without a tokenizer: the same groups, no batch
    assert sample_step(cfg, 0, prompts, order, ScriptedEngine(smol_tokenizer, 2, 4), reward).batch is None


# --------------------------------------------------------------------------- compute accounting by hand


def test_step_counts_count_trained_and_scored_tokens_by_hand(smol_tokenizer):
    prompts = ["Hi", "Count to ten"]
    samples = [[Sample([5, 6], "", "stop")], [Sample([7, 8, 9], "", "length")]]
    batch = rollout_batch(smol_tokenizer, prompts, samples)
    p0, p1 = (len(ids) for ids in encode_prompts(smol_tokenizer, prompts))
    counts = step_counts(batch, torch.tensor([1]), None, None, None, "k1", 5, epochs=2, no_grad_passes=2)
    assert counts["generated_tokens"] == 5
    assert counts["trained_tokens"] == 2 * 3  # row 1's completion, two epochs
    assert counts["trained_seq_tokens"] == 2 * (p1 + 3)  # its prompt and completion, two epochs
    assert counts["scored_tokens"] == 2 * (p0 + 2 + p1 + 3)  # every row, two no-grad passes
    none = step_counts(batch, torch.tensor([], dtype=torch.long), None, None, None, "k1", 5)
    assert none["trained_tokens"] == none["trained_seq_tokens"] == none["scored_tokens"] == 0


def test_run_totals_by_hand_and_across_a_resume():
    totals = RunTotals(params=10)
    first = totals.add(
        8, {"generated_tokens": 8.0, "trained_tokens": 6.0, "trained_seq_tokens": 20.0, "scored_tokens": 0.0})
    # 6 * 10 * 20 + 2 * 10 * (0 + 8) = 1200 + 160
    assert first == {"tokens/generated": 8.0, "tokens/trained": 6.0, "samples/total": 8, "tokens/generated_total": 8.0,
                     "tokens/trained_total": 6.0, "flops/estimated": 1360.0}
    second = totals.add(
        4, {"generated_tokens": 4.0, "trained_tokens": 0.0, "trained_seq_tokens": 0.0, "scored_tokens": 30.0})
    assert second["flops/estimated"] == 1360.0 + 2 * 10 * (30 + 4) and second["tokens/trained_total"] == 6.0
    assert second["samples/total"] == 12 and second["tokens/generated_total"] == 12.0
    # a resumed run continues from the last logged values (a later record without them, e.g. an evaluation, is skipped)
    history = [{"step": 0, **RunTotals(10).current()}, {"step": 1, **first}, {"step": 2, **second},
               {"step": 2, "eval/score": 0.5}]
    again = RunTotals.restored(10, history)
    assert again.current() == {key: second[key] for key in RunTotals.KEYS.values()}
    assert isinstance(again.samples, int)
    assert RunTotals.restored(10, [{"step": 1, "samples/total": 16}]).current() == {
        "samples/total": 16, "tokens/generated_total": 0, "tokens/trained_total": 0, "flops/estimated": 0
    }  # an older run


# --------------------------------------------------------------------------- the loop's metrics


def make_cfg(model_dir: Path, output_dir: Path, **overrides) -> RLConfig:
    cfg = RLConfig(model=str(model_dir), reward="uppercase_start", preset="tiny", num_train=16, heldout_size=4,
                   prompt_template="short", output_dir=str(output_dir), advantage="rloo", k=2, prompts_per_step=2,
                   max_steps=2, lr=5e-2, beta=0.0, max_new_tokens=3, micro_batch_size=8, save_every=0, device="cpu",
                   dtype="float32")
    return replace(cfg, **overrides)


def test_loop_logs_generated_and_trained_tokens_and_the_flops_estimate(tiny_model_dir, tmp_path):
    # entropy bonus: every row is trained (none skipped); 2 PPO epochs: each row's tokens go through 2 backwards, and
    # the pre-update log-probs take one no-grad pass. So per step, with P prompt and G generated tokens of the B * k
    # rows: tokens/trained = 2 G, and FLOPs = 6 N * 2 (P + G) + 2 N (P + G) + 2 N G.
    cfg = make_cfg(tiny_model_dir, tmp_path / "run", loss="ppo", ppo_epochs=2, entropy_coef=0.001)
    train_rl(cfg)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    prompts, _, _ = load_prompts(cfg, tokenizer)
    n = parameter_count(load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32)))
    flops = generated = 0.0
    for step, r in enumerate(records):
        assert r["update/rows_frac"] == 1.0 and r["update/masked_frac"] == 0.0
        g = r["tokens/generated"]
        assert g == r["completion/mean_tokens"] * r["samples/step"]  # every sample is in the batch (no filtering)
        assert r["tokens/trained"] == 2 * g
        texts = [prompts[i].text for i in batch_indices(step, len(prompts), cfg.prompts_per_step, cfg.seed)]
        p = cfg.k * sum(
            len(ids)
            for ids in encode_prompts(tokenizer, texts, add_special_tokens=adds_special_tokens(cfg.prompt_template)))
        flops += 6 * n * 2 * (p + g) + 2 * n * (p + g) + 2 * n * g
        generated += g
        assert r["flops/estimated"] == pytest.approx(flops, rel=1e-12)
        assert r["tokens/generated_total"] == generated and r["tokens/trained_total"] == 2 * generated


class AllTruncatedEngine(HFEngine):
    """The HF engine whose training samples all count as cut at max_new_tokens."""

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        if params.temperature == 0:
            return out
        return [[Sample(s.completion_ids, s.text, "length") for s in row] for row in out]


def test_mask_truncated_warns_once_per_step_that_trains_nothing(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(rollout_hf, "HFEngine", AllTruncatedEngine)  # what make_engine builds
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    handler = Collect()
    logging.getLogger("rlft").addHandler(handler)
    try:
        # rewards 0, 1 in every group: every sample has an advantage, and the mask alone leaves nothing to train on
        train_rl(make_cfg(tiny_model_dir, tmp_path / "m", mask_truncated=True),
                 reward_fn=lambda p, c, g: [float(i % 2) for i in range(len(c))])
    finally:
        logging.getLogger("rlft").removeHandler(handler)
    nothing = [w for w in warnings if "trains nothing" in w]
    assert [w.split(":")[0] for w in nothing] == ["step 1", "step 2"], warnings
    assert "--mask-truncated" in nothing[0] and "all 4 samples" in nothing[0]
    for r in read_metrics(tmp_path / "m" / "metrics.jsonl"):
        assert r["update/masked_frac"] == 1.0 and r["update/rows_frac"] == 0.0 and r["tokens/trained"] == 0.0
        assert r["adv/std"] > 0  # the advantages were there: only the mask left nothing to train on


# --------------------------------------------------------------------------- engines


def test_make_engine_builds_the_loops_hf_engine_on_the_live_model_and_sync_follows_it(smol_tokenizer, monkeypatch):
    import rlft.models

    monkeypatch.setattr(rlft.models, "load_model", lambda *a, **k: pytest.fail("a live model must not be loaded again"))
    spec = DeviceSpec(torch.device("cpu"), torch.float32, torch.bfloat16)
    model = make_tiny_model(len(smol_tokenizer))
    engine = make_engine("hf", "unused", smol_tokenizer, spec, model=model, batch_size=3, add_special_tokens=False,
                         copy_weights=True, copy_dtype=torch.bfloat16)
    assert isinstance(engine,
                      HFEngine) and engine.model is model and engine.batch_size == 3 and not engine.add_special_tokens
    copy = engine.sampler()
    assert copy is not model and next(copy.parameters()).dtype == torch.bfloat16
    other = make_tiny_model(len(smol_tokenizer), seed=5)
    engine.sync_weights(other)
    assert engine.model is other and torch.equal(engine.sampler().lm_head.weight, other.lm_head.weight.to(
        torch.bfloat16))


def test_vllm_sync_weights_pushes_the_merged_policy(smol_tokenizer):
    from rlft.rollout.vllm import VLLMEngine

    model = apply_lora(make_tiny_model(len(smol_tokenizer), seed=1),
                       LoRASettings(r=4, alpha=8.0, dropout=0.0, target_modules="q_proj,v_proj"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(0.1)
    pushed: dict[str, torch.Tensor] = {}
    resets = []

    class Runner:
        def load_weights(self, weights):
            pushed.update(weights)

    engine = object.__new__(VLLMEngine)  # no vLLM here: the engine's own method, with its model stubbed
    engine._runner_model = lambda: Runner()
    engine.llm = type("LLM", (), {"reset_prefix_cache": lambda self: resets.append(1)})()
    engine.sync_weights(model)
    merged = merged_copy(model).state_dict()
    assert pushed.keys() == merged.keys() and not any("lora" in name for name in pushed)
    assert all(torch.equal(pushed[name], merged[name]) for name in merged) and resets == [1]
    assert any("lora_" in name for name, _ in model.named_parameters())  # the policy itself keeps its adapters


def test_server_engine_refuses_to_follow_a_policy():
    from rlft.rollout.server import OpenAICompletionsEngine

    engine = object.__new__(OpenAICompletionsEngine)
    engine.base_url = "http://127.0.0.1:8000/v1"
    with pytest.raises(UsageError, match="cannot follow a policy being trained"):
        engine.sync_weights(torch.nn.Linear(1, 1))


def test_only_the_hf_engine_trains_under_torchrun(monkeypatch):
    import rlft.distributed

    check_training_engine("vllm")  # one process: any engine
    monkeypatch.setattr(rlft.distributed, "active", lambda: True)
    check_training_engine("hf")
    with pytest.raises(UsageError, match="under torchrun samples with --rollout-engine hf only, not vllm"):
        check_training_engine("vllm")


# --------------------------------------------------------------------------- --compile


@pytest.fixture
def aot_eager(monkeypatch):
    """The aot_eager backend (no inductor C++ build on a CPU); dynamo's caches and counters emptied around the test."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def test_generation_under_eager_layers_compiles_nothing_and_matches_eager(smol_tokenizer, aot_eager):
    model = make_tiny_model(len(smol_tokenizer), seed=2)
    params = SamplingParams(k=2, temperature=1.0, max_new_tokens=4, seed=7)
    expected = HFEngine(model, smol_tokenizer, decoder="drop").generate(["Hello", "Count to"], params)
    compile_layers(model)
    compiled = {layer: layer.forward for layer in model.model.layers}
    with eager_layers(model):
        assert all("forward" not in vars(layer) for layer in model.model.layers)
        got = HFEngine(model, smol_tokenizer, decoder="drop").generate(["Hello", "Count to"], params)
    assert not aot_eager["stats"]["unique_graphs"]  # decoding with a KV cache never entered the compiled forward
    assert all(layer.forward == compiled[layer] for layer in model.model.layers)  # the compiled forward is back
    assert [[s.completion_ids for s in row] for row in got] == [[s.completion_ids for s in row] for row in expected]


@pytest.mark.skipif(not hasattr(RLConfig(), "compile"), reason="RLConfig has no compile field yet")
def test_rl_with_compile_trains_as_the_eager_loop(tiny_model_dir, tmp_path, aot_eager):
    train_rl(make_cfg(tiny_model_dir, tmp_path / "eager"))
    train_rl(make_cfg(tiny_model_dir, tmp_path / "compiled", compile=True))
    assert aot_eager["stats"]["unique_graphs"] >= 1  # the loss passes ran compiled layers
    eager, compiled = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("eager", "compiled"))
    assert [r["step"] for r in compiled] == [1, 2]
    for a, b in zip(eager, compiled):
        for key in ("reward/mean", "loss/policy", "grad_norm", "tokens/generated"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), key
