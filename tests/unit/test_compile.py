"""``--compile``: every decoder layer runs one compiled forward (one graph for all layers and batch shapes), with
the eager values and gradients, through gradient checkpointing and deep copies, and in the SFT, DPO and RM recipes.

The tests compile with the ``aot_eager`` backend (``$RLFT_COMPILE_BACKEND``): the same dynamo capture and AOT
autograd graphs as inductor, without inductor's C++ compilation, which takes ~40 s per graph on this 2-core CPU;
one slow test runs inductor itself."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest
import torch

import rlft.recipes.dpo as dpo_recipe
import rlft.recipes.reward_model as rm_recipe
import rlft.recipes.sft as sft_recipe
from rlft.data.tokenize import TokenizedExample, collate
from rlft.ops import sequence_logprobs
from rlft.recipes.memory import COMPILE_BACKEND_ENV, compile_layers, enable_gradient_checkpointing

from tests.conftest import make_scaled_tiny_model, make_tiny_model, write_jsonl_rows
from tests.unit.test_token_micro_batches import (assert_same_grads, capture_grads, dpo_cfg, dpo_rows, rm_rows, sft_cfg,
                                                 varied_sft_rows)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    """aot_eager unless a test says otherwise; dynamo's caches and counters emptied before and after."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def random_batch(vocab: int, rows: int, length: int, seed: int):
    rng = random.Random(seed)
    examples = []
    for _ in range(rows):
        n = rng.randint(length // 2, length)
        prompt = rng.randint(1, n - 1)
        examples.append(
            TokenizedExample([rng.randrange(vocab) for _ in range(n)], [0] * prompt + [1] * (n - prompt), False))
    return collate(examples, pad_token_id=0)


def logprobs_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    (out.sum() / batch.loss_mask.sum()).backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_one_graph_for_every_layer_and_shape_with_eager_values(fresh_dynamo, checkpointing):
    eager = make_tiny_model(64, seed=3, layers=3)
    with torch.no_grad():  # weights large enough that every layer matters
        for p in eager.model.layers.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5)
    compiled = copy.deepcopy(eager)
    for model in (eager, compiled):
        model.train()
        if checkpointing:
            enable_gradient_checkpointing(model)
    assert compile_layers(compiled) == len(compiled.model.layers) == 3
    for layer in compiled.model.layers:
        assert layer.forward.__self__ is layer
    for i, (rows, length) in enumerate([(3, 12), (4, 20), (2, 7)]):
        batch = random_batch(64, rows, length, seed=i)
        value_e, grads_e = logprobs_and_grads(eager, batch)
        value_c, grads_c = logprobs_and_grads(compiled, batch)
        assert torch.allclose(value_c, value_e, atol=1e-5, rtol=0)
        assert_same_grads(grads_e, grads_c, 1e-5)
    # what compiled, counted the same on every CPU and backend: no graph break (a break falls back to eager without a
    # word: transformers 5's checkpointing wrapper did so until compile_layers allowed its side effect), one capture
    # for three layers and three shapes (dynamic=True)
    assert dict(fresh_dynamo["graph_break"]) == {}
    assert fresh_dynamo["stats"]["unique_graphs"] == 1


def test_a_deep_copy_runs_its_own_layers(fresh_dynamo):
    model = make_scaled_tiny_model(64, seed=4).eval()
    compile_layers(model)
    twin = copy.deepcopy(model)
    for layer, twin_layer in zip(model.model.layers, twin.model.layers):
        assert twin_layer.forward.__self__ is twin_layer
    with torch.no_grad():
        for p in twin.model.layers.parameters():
            p.mul_(0.5)
    batch = random_batch(64, 2, 10, seed=0)
    with torch.no_grad():
        a = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
        b = sequence_logprobs(twin, batch.input_ids, batch.attention_mask, batch.loss_mask)
    assert not torch.allclose(a, b, atol=1e-3)  # the copy's changed weights are used, not the original's


def test_compile_needs_decoder_layers():
    with pytest.raises(ValueError, match="no decoder layers"):
        compile_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


# --------------------------------------------------------------------------- the recipes


@pytest.mark.parametrize("packing, lora_r", [(False, 0), (True, 0), (False, 4)])
def test_sft_compile_gives_the_eager_gradient(tiny_model_dir, tmp_path, monkeypatch, fresh_dynamo, packing, lora_r):
    data = write_jsonl_rows(tmp_path / "sft.jsonl", varied_sft_rows())
    grads = capture_grads(monkeypatch, sft_recipe)
    for name, compile_ in (("eager", False), ("compiled", True)):
        sft_recipe.train_sft(
            sft_cfg(tiny_model_dir, data, tmp_path / name, packing=packing, micro_batch_size=4, compile=compile_,
                    lora_r=lora_r))
        assert (tmp_path / name / "model" / "model.safetensors").is_file()  # LoRA: merged through a deep copy
    assert fresh_dynamo["stats"]["unique_graphs"] >= 1
    assert_same_grads(grads[0], grads[1], 1e-5)


def test_dpo_compile_gives_the_eager_gradient(tiny_model_dir, tmp_path, monkeypatch, fresh_dynamo):
    data = write_jsonl_rows(tmp_path / "pairs.jsonl", dpo_rows())
    grads = capture_grads(monkeypatch, dpo_recipe)
    for name, compile_ in (("eager", False), ("compiled", True)):
        dpo_recipe.train_dpo(dpo_cfg(tiny_model_dir, data, tmp_path / name, micro_batch_size=4, compile=compile_))
    assert fresh_dynamo["stats"]["unique_graphs"] >= 1
    assert_same_grads(grads[0], grads[1], 1e-5)


def test_rm_compile_gives_the_eager_gradient_and_saves_plain_weights(tiny_model_dir, tmp_path, monkeypatch,
                                                                     fresh_dynamo):
    from rlft.recipes.reward_model import RMConfig

    data = write_jsonl_rows(tmp_path / "rm.jsonl", rm_rows())
    grads = capture_grads(monkeypatch, rm_recipe)
    cfg = RMConfig(model=str(tiny_model_dir), data=str(data), output_dir=str(tmp_path / "eager"), max_length=128,
                   batch_size=8, micro_batch_size=4, max_steps=1, lr=1e-3, warmup_ratio=0.0, eval_fraction=0.0,
                   save_every=0, device="cpu", dtype="float32")
    rm_recipe.train_rm(cfg)
    final = rm_recipe.train_rm(replace(cfg, output_dir=str(tmp_path / "compiled"), compile=True))
    assert fresh_dynamo["stats"]["unique_graphs"] >= 1
    assert_same_grads(grads[0], grads[1], 1e-5)
    from safetensors.torch import load_file

    assert not any("_orig_mod" in k for k in load_file(str(final / "model.safetensors")))


@pytest.mark.slow
def test_inductor_matches_eager(fresh_dynamo, monkeypatch):
    """The default backend itself (about a minute on a 2-core CPU with a cold inductor cache: C++ compilation)."""
    monkeypatch.delenv(COMPILE_BACKEND_ENV)
    eager = make_scaled_tiny_model(64, seed=5).train()
    compiled = copy.deepcopy(eager)
    compile_layers(compiled)
    batch = random_batch(64, 3, 16, seed=1)
    value_e, grads_e = logprobs_and_grads(eager, batch)
    value_c, grads_c = logprobs_and_grads(compiled, batch)
    assert torch.allclose(value_c, value_e, atol=1e-4, rtol=0)
    assert_same_grads(grads_e, grads_c, 1e-4)
