"""``--max-tokens-per-micro-batch``: the cut (consecutive, within the budget, fewest pieces; against a brute-force
reference), and SFT, DPO and the reward model giving the one-pass gradient whatever the cut, padded and packed."""

from __future__ import annotations

import random
from dataclasses import replace
from functools import lru_cache

import pytest
import torch

import rlft.recipes.common as common_recipe
import rlft.recipes.dpo as dpo_recipe
import rlft.recipes.reward_model as rm_recipe
import rlft.recipes.sft as sft_recipe
from rlft.recipes.dpo import DPOConfig, compute_reference_logprobs, load_tokenized_pairs
from rlft.recipes.memory import cut_by_tokens, packed_tokens, padded_tokens
from rlft.recipes.sft import SFTConfig
from rlft.validation import OptionError

from tests.conftest import write_jsonl_rows

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the a cat dog sun rain tree house blue green runs sleeps quickly under over happy small big river stone".split(
)


# --------------------------------------------------------------------------- the cut


def test_sizes_by_hand():
    assert padded_tokens([3, 7, 5]) == 21
    assert padded_tokens([3, 7], rows_per_item=2) == 28
    assert padded_tokens([]) == 0
    assert packed_tokens([3, 7, 5]) == 15


def test_cut_by_hand():
    lengths = [2, 3, 3, 5, 9, 20, 21]
    size = padded_tokens
    assert cut_by_tokens(lengths, size, 10) == [[2, 3, 3], [5], [9], [20], [21]]  # 3 x 3 = 9; 4 x 5 = 20 > 10
    assert cut_by_tokens(lengths, size, 40) == [[2, 3, 3, 5], [9, 20], [21]]  # 5 x 9 = 45 > 40; 2 x 20 = 40 <= 40
    assert cut_by_tokens(lengths, packed_tokens, 13) == [[2, 3, 3, 5], [9], [20], [21]]
    assert cut_by_tokens([], size, 5) == []
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch must be >= 1"):
        cut_by_tokens([1], size, 0)


def fewest_pieces(lengths: list[int], size, budget: int) -> int:
    """Brute force: the fewest consecutive pieces whose sizes fit (or that hold one item)."""

    @lru_cache(maxsize=None)
    def best(start: int) -> int:
        if start == len(lengths):
            return 0
        return min(1 + best(end) for end in range(start + 1, len(lengths) + 1)
                   if end == start + 1 or size(lengths[start:end]) <= budget)

    return best(0)


@pytest.mark.parametrize("packed", [False, True])
def test_cut_properties_against_brute_force(packed):
    rng = random.Random(0)
    size = packed_tokens if packed else (lambda chunk: padded_tokens(chunk, rows_per_item=2))
    for _ in range(300):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 10))]
        if rng.random() < 0.7:
            lengths.sort()
        budget = rng.randint(1, 200)
        chunks = cut_by_tokens(lengths, size, budget)
        assert [x for c in chunks for x in c] == lengths  # every item once, in order
        assert all(c and (len(c) == 1 or size(c) <= budget) for c in chunks)
        assert len(chunks) == fewest_pieces(lengths, size, budget), (lengths, budget)


# ------------------------------------------------------------------- recipes: gradients equal the one-pass gradient


@pytest.fixture
def float64(monkeypatch):
    """Train in float64 (the recipes' device pick patched), where a different cut changes the gradient by ~1e-15
    of its size, not float32's ~1e-5: a tolerance of 1e-10 then catches any real difference."""
    from rlft.models import DeviceSpec

    monkeypatch.setattr(common_recipe, "pick_device",
                        lambda device, dtype: DeviceSpec(torch.device("cpu"), torch.float64))


def capture_grads(monkeypatch, module) -> list[dict[str, torch.Tensor]]:
    """Patch ``module.optimizer_step`` to record every step's accumulated gradients first."""
    real_step = module.optimizer_step
    grads: list[dict[str, torch.Tensor]] = []

    def capture(setup, max_grad_norm, **kwargs):
        grads.append({n: p.grad.clone() for n, p in setup.model.named_parameters() if p.grad is not None})
        return real_step(setup, max_grad_norm, **kwargs)

    monkeypatch.setattr(module, "optimizer_step", capture)
    return grads


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tolerance: float = 1e-10) -> None:
    """Equal within ``tolerance`` of each tensor's largest entry."""
    assert a.keys() == b.keys()
    for name, g in a.items():
        assert g.dtype == b[name].dtype
        worst = (g - b[name]).abs().max().item() / max(g.abs().max().item(), 1e-2)
        assert worst < tolerance, (name, worst)


def varied_sft_rows(n: int = 8) -> list[dict]:
    rng = random.Random(1)
    return [{"prompt": "Q: " + " ".join(rng.choices(WORDS, k=rng.randint(1, 12))) + "\nA:",
             "completion": " " + " ".join(rng.choices(WORDS, k=rng.randint(1, 25)))} for _ in range(n)]


def sft_cfg(model_dir, data, out, **overrides) -> SFTConfig:
    cfg = SFTConfig(model=str(model_dir), data=str(data), data_format="prompt_completion", output_dir=str(out),
                    max_length=64, batch_size=8, micro_batch_size=8, max_steps=1, lr=1e-3, warmup_ratio=0.0,
                    save_every=0, device="cpu", dtype="float32")
    return replace(cfg, **overrides)


@pytest.mark.parametrize("packing, dtype", [(False, "float64"), (True, "float64"), (False, "float32")])
def test_sft_token_budget_gives_the_one_pass_gradient(tiny_model_dir, tmp_path, monkeypatch, packing, dtype, request):
    """In float64 the gradients agree to 1e-10 of their size; in float32 to 1e-6 x 50 (measured worst ~9e-6:
    rounding, since float64 agrees)."""
    if dtype == "float64":
        request.getfixturevalue("float64")
    data = write_jsonl_rows(tmp_path / "sft.jsonl", varied_sft_rows())
    grads = capture_grads(monkeypatch, sft_recipe)
    real, passes = sft_recipe.micro_batch_logprobs, []

    def spy(model, examples, *args, **kwargs):
        passes.append([len(e.input_ids) for e in examples])
        return real(model, examples, *args, **kwargs)

    monkeypatch.setattr(sft_recipe, "micro_batch_logprobs", spy)
    budget = 90
    sft_recipe.train_sft(sft_cfg(tiny_model_dir, data, tmp_path / "one", packing=packing))
    assert len(passes) == 1
    whole = passes.pop()
    # batch_size 8 is no multiple of --micro-batch-size 5: fine, the budget replaces it
    sft_recipe.train_sft(sft_cfg(tiny_model_dir, data, tmp_path / "cut", packing=packing, micro_batch_size=5,
                                 max_tokens_per_micro_batch=budget))
    size = packed_tokens if packing else padded_tokens
    assert len(passes) >= 3, passes
    assert all(len(p) == 1 or size(p) <= budget for p in passes), passes
    assert sorted(x for p in passes for x in p) == sorted(whole)
    assert [max(p) for p in passes] == sorted(max(p) for p in passes)  # length-sorted before the cut
    assert grads[0]["lm_head.weight" if "lm_head.weight" in grads[0] else "model.embed_tokens.weight"].dtype == getattr(
        torch, dtype)
    assert_same_grads(grads[0], grads[1], 1e-10 if dtype == "float64" else 5e-5)


def dpo_rows(n: int = 8) -> list[dict]:
    rng = random.Random(2)
    return [{
        "prompt": f"Q{i}:" + " word" * rng.randint(1, 15) + "?\nA:",
        "chosen": " " + " ".join(rng.choices(WORDS, k=rng.randint(1, 10))),
        "rejected": " no " + " ".join(rng.choices(WORDS, k=rng.randint(1, 10)))
    } for i in range(n)]


def dpo_cfg(model_dir, data, out, **overrides) -> DPOConfig:
    cfg = DPOConfig(model=str(model_dir), data=str(data), data_format="text", output_dir=str(out), max_length=64,
                    batch_size=8, micro_batch_size=8, max_steps=1, lr=1e-3, warmup_ratio=0.0, save_every=0,
                    device="cpu", dtype="float32", loss_type="rpo", rpo_alpha=0.5)
    return replace(cfg, **overrides)


@pytest.mark.parametrize("packing", [False, True])
def test_dpo_token_budget_gives_the_one_pass_gradient(tiny_model_dir, tmp_path, monkeypatch, packing, float64):
    data = write_jsonl_rows(tmp_path / "pairs.jsonl", dpo_rows())
    grads = capture_grads(monkeypatch, dpo_recipe)
    real, passes = dpo_recipe.pair_logprobs, []

    def spy(model, pairs, *args, **kwargs):
        if torch.is_grad_enabled():  # training passes (the reference pass runs without gradients)
            passes.append([(len(p.chosen.input_ids), len(p.rejected.input_ids)) for p in pairs])
        return real(model, pairs, *args, **kwargs)

    monkeypatch.setattr(dpo_recipe, "pair_logprobs", spy)
    dpo_recipe.train_dpo(dpo_cfg(tiny_model_dir, data, tmp_path / "one", packing=packing))
    whole = passes.pop()
    budget = 150
    dpo_recipe.train_dpo(
        dpo_cfg(tiny_model_dir, data, tmp_path / "cut", packing=packing, max_tokens_per_micro_batch=budget))
    size = (lambda p: packed_tokens([c + r for c, r in p])) if packing else (
        lambda p: padded_tokens([max(s) for s in p], 2))
    assert len(passes) >= 3, passes
    assert all(len(p) == 1 or size(p) <= budget for p in passes), passes
    assert sorted(x for p in passes for x in p) == sorted(whole)
    assert_same_grads(grads[0], grads[1])


def test_dpo_reference_pass_cut_by_tokens_keeps_pair_order(tiny_model_dir, tmp_path, smol_tokenizer):
    from rlft.models import DeviceSpec, load_model

    data = write_jsonl_rows(tmp_path / "pairs.jsonl", dpo_rows(12))
    pairs, _ = load_tokenized_pairs(dpo_cfg(tiny_model_dir, data, tmp_path / "x"), smol_tokenizer)
    model = load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32))
    pad = smol_tokenizer.pad_token_id
    one_by_one = compute_reference_logprobs(model, pairs, pad, "cpu", 1)
    for packing in (False, True):
        cut = compute_reference_logprobs(model, pairs, pad, "cpu", 1, max_tokens=120, packing=packing)
        for key, values in one_by_one.items():
            # sums of up to ~100 token log-probs near -100: float32 resolves ~1e-5 there, and the cut's other padding
            # (another GEMM blocking) moves the last bits on some CPUs, so the bound is relative to the magnitude;
            # a pair out of order differs by whole units
            torch.testing.assert_close(cut[key], values, rtol=1e-5, atol=1e-6, msg=f"{packing=}, {key=}")


def rm_rows(n: int = 8) -> list[dict]:
    rng = random.Random(3)
    rows = []
    for i in range(n):
        prompt = "Tell me about " + " ".join(rng.choices(WORDS, k=rng.randint(1, 10)))
        rows.append({
            "prompt": prompt, "chosen": [{"role": "user", "content": prompt}, {
                "role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 12)))
            }], "rejected": [{"role": "user", "content": prompt},
                             {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 12)))}]
        })
    return rows


@pytest.mark.parametrize("packing", [False, True])
def test_rm_token_budget_gives_the_one_pass_gradient(tiny_model_dir, tmp_path, monkeypatch, packing, float64):
    from rlft.recipes.reward_model import RMConfig

    data = write_jsonl_rows(tmp_path / "rm.jsonl", rm_rows())
    grads = capture_grads(monkeypatch, rm_recipe)
    real, passes = rm_recipe.pair_rewards, []

    def spy(model, examples, *args, **kwargs):
        if torch.is_grad_enabled():
            passes.append([(len(e.chosen.input_ids), len(e.rejected.input_ids)) for e in examples])
        return real(model, examples, *args, **kwargs)

    monkeypatch.setattr(rm_recipe, "pair_rewards", spy)
    base = RMConfig(model=str(tiny_model_dir), data=str(data), output_dir=str(tmp_path / "one"), max_length=128,
                    batch_size=8, micro_batch_size=8, max_steps=1, lr=1e-3, warmup_ratio=0.0, eval_fraction=0.0,
                    save_every=0, device="cpu", dtype="float32", center_coef=0.01, packing=packing)
    rm_recipe.train_rm(base)
    whole = passes.pop()
    budget = 200
    rm_recipe.train_rm(replace(base, output_dir=str(tmp_path / "cut"), max_tokens_per_micro_batch=budget))
    size = (lambda p: packed_tokens([c + r for c, r in p])) if packing else (
        lambda p: padded_tokens([max(s) for s in p], 2))
    assert len(passes) >= 2, passes
    assert all(len(p) == 1 or size(p) <= budget for p in passes), passes
    assert sorted(x for p in passes for x in p) == sorted(whole)
    assert_same_grads(grads[0], grads[1])


def test_budget_option_is_checked_and_replaces_the_micro_batch_multiple(tmp_path):
    with pytest.raises(OptionError, match="--max-tokens-per-micro-batch must be >= 1"):
        SFTConfig(max_tokens_per_micro_batch=0)
    with pytest.raises(OptionError, match="--micro-batch-size"):
        SFTConfig(batch_size=12, micro_batch_size=8)
    assert SFTConfig(batch_size=12, micro_batch_size=8,
                     max_tokens_per_micro_batch=4096).max_tokens_per_micro_batch == 4096
    assert DPOConfig(batch_size=6, micro_batch_size=4, max_tokens_per_micro_batch=512).batch_size == 6
