"""Chunked LM head (``rlft.ops.lm_head_logprobs``, ``--logits-chunk-size``): values and gradients equal the
unchunked computation; the SFT and DPO recipes accept it; gradient checkpointing leaves gradients unchanged."""

from __future__ import annotations

import pytest
import torch

from rlft.data.tokenize import collate
from rlft.losses.sft import sft_loss
from rlft.ops import lm_head_logprobs, logprobs_from_logits, sequence_logprobs

from tests.unit.test_packing import assert_same_grads, grads, random_examples, tiny_lm

torch.set_num_threads(1)

ATOL = 1e-5


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
@pytest.mark.parametrize("softcap,temperature", [(None, 1.0), (5.0, 0.7)])
def test_lm_head_logprobs_matches_naive_log_softmax(chunk_size, softcap, temperature):
    torch.manual_seed(0)
    hidden = torch.randn(50, 16, requires_grad=True)
    head = torch.nn.Linear(16, 1000, bias=True)
    targets = torch.randint(0, 1000, (50,))
    weights = torch.randn(50)

    out = lm_head_logprobs(hidden, targets, head, temperature=temperature, softcap=softcap, chunk_size=chunk_size)
    (out * weights).sum().backward()
    got = (hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
    hidden.grad = head.weight.grad = head.bias.grad = None

    logits = head(hidden)  # naive reference: full logits, explicit log-softmax and gather
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    ref = torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    (ref * weights).sum().backward()
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    for a, b in zip(got, (hidden.grad, head.weight.grad, head.bias.grad)):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-5)
    assert out.dtype == torch.float32 and out.shape == (50,)


def test_lm_head_logprobs_without_grad_and_bad_chunk():
    hidden, head, targets = torch.randn(9, 4), torch.nn.Linear(4, 11), torch.randint(0, 11, (9,))
    with torch.no_grad():
        torch.testing.assert_close(lm_head_logprobs(hidden, targets, head, chunk_size=2),
                                   logprobs_from_logits(head(hidden), targets), atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="chunk_size"):
        lm_head_logprobs(hidden, targets, head, chunk_size=-1)


def test_chunked_lm_head_never_builds_the_full_logits():
    """The head sees at most chunk_size rows at a time, forward and recompute alike."""
    seen: list[int] = []
    head = torch.nn.Linear(8, 30)
    head.register_forward_hook(lambda mod, inp, out: seen.append(out.shape[0]))
    hidden = torch.randn(40, 8, requires_grad=True)
    lm_head_logprobs(hidden, torch.randint(0, 30, (40,)), head, chunk_size=16).sum().backward()
    assert max(seen) == 16 and sum(seen) == 2 * 40  # each chunk once forward, once recomputed in backward


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sequence_logprobs_chunked_equals_unchunked_with_gradients(arch):
    model = tiny_lm(arch, "sdpa", seed=1)
    batch = collate(random_examples(seed=2), pad_token_id=0)
    results = []
    for chunk in (0, 5):
        lp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, logits_chunk_size=chunk)
        loss, _ = sft_loss(lp, batch.loss_mask)
        loss.backward()
        results.append((lp, grads(model)))
    torch.testing.assert_close(results[1][0], results[0][0], atol=ATOL, rtol=0)
    assert_same_grads(results[1][1], results[0][1])


def test_gradient_checkpointing_keeps_gradients():
    from rlft.recipes.memory import enable_gradient_checkpointing

    batch = collate(random_examples(seed=3), pad_token_id=0)
    out = []
    for checkpointing in (False, True):
        model = tiny_lm("qwen2", "sdpa", seed=4).train()
        if checkpointing:
            enable_gradient_checkpointing(model)
            assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
        lp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
        sft_loss(lp, batch.loss_mask)[0].backward()
        out.append(grads(model))
    assert_same_grads(out[1], out[0])


def test_sft_and_dpo_recipes_accept_chunking_and_checkpointing(tiny_model_dir, tmp_path):
    import json

    from tests.unit.test_dpo_recipe import make_cfg as dpo_cfg
    from tests.unit.test_dpo_recipe import synthetic_rows
    from tests.unit.test_sft_recipe import make_cfg as sft_cfg

    from rlft.recipes.dpo import train_dpo
    from rlft.recipes.sft import train_sft
    from tests.conftest import write_jsonl_rows

    def losses(run, key):
        return [json.loads(line)[key] for line in (run / "metrics.jsonl").read_text().splitlines()]

    for name, extra in {"plain": {}, "mem": {"logits_chunk_size": 16, "gradient_checkpointing": True}}.items():
        train_sft(sft_cfg(tiny_model_dir, tmp_path / f"sft-{name}", max_steps=2, save_every=0, **extra))
    assert losses(tmp_path / "sft-mem", "loss/sft") == pytest.approx(losses(tmp_path / "sft-plain", "loss/sft"),
                                                                     abs=1e-4)
    data = write_jsonl_rows(tmp_path / "prefs.jsonl", synthetic_rows())
    for name, extra in {"plain": {}, "mem": {"logits_chunk_size": 4, "gradient_checkpointing": True,
                                             "packing": True}}.items():
        train_dpo(dpo_cfg(tiny_model_dir, data, tmp_path / f"dpo-{name}", max_steps=2, save_every=0, **extra))
    assert losses(tmp_path / "dpo-mem", "loss") == pytest.approx(losses(tmp_path / "dpo-plain", "loss"), abs=1e-4)


@pytest.mark.parametrize("field,value", [("pack_length", 0), ("logits_chunk_size", -1)])
def test_recipes_reject_bad_scale_options_up_front(tmp_path, field, value):
    from rlft.recipes.dpo import DPOConfig, train_dpo
    from rlft.recipes.reward_model import RMConfig, train_rm
    from rlft.recipes.sft import SFTConfig, train_sft

    for cls, train in ((SFTConfig, train_sft), (DPOConfig, train_dpo), (RMConfig, train_rm)):
        if field not in cls.__dataclass_fields__:
            continue
        with pytest.raises(ValueError, match="--" + field.replace("_", "-")):
            train(cls(output_dir=str(tmp_path / cls.__name__), **{field: value}))
        assert not (tmp_path / cls.__name__).exists()  # rejected before the run folder is made


def test_rm_recipe_with_checkpointing_frozen_blocks_and_packing_matches_plain(tiny_model_dir, tmp_path):
    """Non-reentrant checkpointing needs no input that requires grad: frozen lower blocks (--train-layers) work."""
    import json
    from dataclasses import replace

    from rlft.recipes.reward_model import RMConfig, train_rm
    from tests.conftest import write_jsonl_rows

    chat = write_jsonl_rows(tmp_path / "chat.jsonl", [
        {"prompt": f"What is {i} + {i}?", "chosen": f"It is {2 * i}.", "rejected": "No idea, sorry."} for i in range(8)
    ])
    base = RMConfig(model=str(tiny_model_dir), data=str(chat), chat_template="chatml", max_length=64, batch_size=4,
                    micro_batch_size=2, max_steps=2, lr=1e-3, warmup_ratio=0.0, schedule="constant", eval_fraction=0.0,
                    save_every=0, device="cpu", dtype="float32", seed=0, train_layers=1)
    for name, extra in {"plain": {}, "mem": {"gradient_checkpointing": True, "packing": True}}.items():
        train_rm(replace(base, output_dir=str(tmp_path / name), **extra))
    losses = {name: [json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
              for name in ("plain", "mem")}
    assert losses["mem"] == pytest.approx(losses["plain"], abs=1e-4)
