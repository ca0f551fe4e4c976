"""Padding-free packing: the packed layout token by token, and packed log-probs, DPO sums, rewards, losses and
gradients against the right-padded computation (fp32, tiny Llama and Qwen2, sdpa and eager attention)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from rlft.data.packing import pack_examples, plan_rows, sequence_sums
from rlft.data.tokenize import TokenizedExample, collate
from rlft.losses.dpo import rpo_loss
from rlft.losses.reward import bradley_terry_loss
from rlft.losses.sft import sft_loss
from rlft.ops import aggregate, masked_sum, sequence_logprobs

from tests.conftest import make_tiny_rm, write_jsonl_rows

torch.set_num_threads(1)

ATOL = 1e-5
VOCAB = 97


def example(prompt: list[int], completion: list[int]) -> TokenizedExample:
    return TokenizedExample(prompt + completion, [0] * len(prompt) + [1] * len(completion), False)


def random_examples(seed: int, lengths=((5, 3), (11, 6), (2, 1), (17, 9), (4, 4), (8, 2))) -> list[TokenizedExample]:
    g = torch.Generator().manual_seed(seed)
    return [
        example(
            torch.randint(0, VOCAB, (p, ), generator=g).tolist(),
            torch.randint(0, VOCAB, (c, ), generator=g).tolist()) for p, c in lengths
    ]


def tiny_lm(arch: str, attn: str, seed: int = 0):
    """A random 2-layer Llama or Qwen2 LM whose blocks are scaled so outputs depend on the whole context."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    config = config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        tie_word_embeddings=False)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_same_grads(a: dict, b: dict, atol: float = ATOL) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-4, msg=name)


# --------------------------------------------------------------------------- layout


def test_plan_rows_first_fit_decreasing_within_bounds():
    assert plan_rows([3, 4, 2], None) == [[0, 1, 2]]
    assert plan_rows([3, 4, 2, 5, 1], 7) == [[3, 2], [1, 0], [4]]
    assert plan_rows([7, 7], 7) == [[0], [1]]
    assert plan_rows([3, 9, 2], 7) == [[1], [0, 2]]  # too long for a row: a row of its own
    for lengths in ([5, 1, 4, 2, 3, 3], [8, 8, 1, 1], [2] * 7):
        rows = plan_rows(lengths, max(lengths))
        assert len(rows) <= len(lengths) and sorted(i for r in rows for i in r) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in r) <= max(lengths) for r in rows)
    assert len(plan_rows([5, 1, 4, 2, 3, 3], 5)) == 4  # padded: 6 rows of 5


def test_default_pack_length_one_row_for_flash_longest_sequence_otherwise():
    from types import SimpleNamespace

    from rlft.data.packing import default_pack_length

    def model(implementation):
        return SimpleNamespace(config=SimpleNamespace(_attn_implementation=implementation))

    assert default_pack_length(model("flash_attention_2"), [3, 9]) is None
    assert default_pack_length(model("sdpa"), [3, 9]) == 9 == default_pack_length(model("eager"), [9, 3])
    with pytest.raises(ValueError, match="pack_length"):
        plan_rows([3], 0)


def test_pack_examples_layout_token_by_token():
    a = example([10, 11], [12, 13, 14])
    b = example([20], [21])
    c = example([30, 31, 32], [33])
    batch = pack_examples([a, b, c], pad_token_id=0, pack_length=7)  # rows: [a, b] (7 tokens), [c] (4) + 3 pads
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 14, 20, 21], [30, 31, 32, 33, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1], [0, 1, 2, 3, 0, 1, 2]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 1, 0, 1], [0, 0, 0, 1, 0, 0, 0]]
    assert batch.sequence_index.tolist() == [[0, 0, 0, 0, 0, 1, 1], [2, 2, 2, 2, -1, -1, -1]]
    assert batch.last_index.tolist() == [4, 6, 7 + 3]
    assert batch.num_sequences == 3 and batch.num_tokens == 11
    one_row = pack_examples([a, b, c], pad_token_id=0)
    assert one_row.input_ids.tolist() == [[10, 11, 12, 13, 14, 20, 21, 30, 31, 32, 33]]
    assert one_row.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3]]
    values = torch.arange(11, dtype=torch.float32).view(1, 11)
    # sums over loss-mask tokens: a -> 2+3+4, b -> 6, c -> 10
    assert sequence_sums(values, one_row).tolist() == [9.0, 6.0, 10.0]
    assert sequence_sums(values, one_row, torch.ones_like(values)).tolist() == [10.0, 11.0, 34.0]


def test_pack_examples_rejects_a_target_at_a_sequence_start_and_empty_input():
    with pytest.raises(ValueError, match="first token is a loss target"):
        pack_examples([example([1], [2]), TokenizedExample([3, 4], [1, 1], False)], pad_token_id=0)
    with pytest.raises(ValueError, match="empty"):
        pack_examples([], pad_token_id=0)
    batch = pack_examples([example([1, 2], [3])], pad_token_id=0)
    bad = batch.loss_mask.clone()
    bad[0, 0] = 0
    bad_positions = batch.position_ids.clone()
    bad_positions[0, 2] = 0  # claims token 2 starts a sequence, yet it is a target
    with pytest.raises(ValueError, match="position_ids == 0"):
        sequence_logprobs(tiny_lm("llama", "sdpa"), batch.input_ids, None, batch.loss_mask, position_ids=bad_positions)


# --------------------------------------------------------------------------- log-probs and SFT


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("pack_length", [None, 24])
def test_packed_logprobs_and_sft_gradients_equal_padded(arch, attn, pack_length):
    model = tiny_lm(arch, attn)
    examples = random_examples(seed=1)
    padded = collate(examples, pad_token_id=0)
    packed = pack_examples(examples, pad_token_id=0, pack_length=pack_length)
    if pack_length is not None:
        assert packed.input_ids.shape[0] > 1  # several rows, one with trailing padding

    lp_pad = sequence_logprobs(model, padded.input_ids, padded.attention_mask, padded.loss_mask)
    loss_pad, _ = sft_loss(lp_pad, padded.loss_mask)
    loss_pad.backward()
    g_pad = grads(model)
    lp_pack = sequence_logprobs(model, packed.input_ids, None, packed.loss_mask, position_ids=packed.position_ids)
    loss_pack, _ = sft_loss(lp_pack, packed.loss_mask)
    loss_pack.backward()
    g_pack = grads(model)

    # token by token: the targets of sequence i, in order, on both layouts
    for i, e in enumerate(examples):
        row_pad = lp_pad[i][padded.loss_mask[i].bool()]
        row_pack = lp_pack[(packed.sequence_index == i) & packed.loss_mask.bool()]
        assert row_pad.shape[0] == sum(e.loss_mask)
        torch.testing.assert_close(row_pack, row_pad, atol=ATOL, rtol=0)
    assert (lp_pack[packed.loss_mask == 0] == 0).all()
    torch.testing.assert_close(sequence_sums(lp_pack, packed), masked_sum(lp_pad, padded.loss_mask, dim=-1), atol=ATOL,
                               rtol=0)
    torch.testing.assert_close(loss_pack, loss_pad, atol=ATOL, rtol=0)
    assert_same_grads(g_pack, g_pad)


def test_packing_changes_the_result_without_position_ids():
    """The test above can fail: one packed row scored as ONE sequence (no position restarts) differs."""
    model = tiny_lm("llama", "sdpa")
    examples = random_examples(seed=1)
    padded = collate(examples, pad_token_id=0)
    packed = pack_examples(examples, pad_token_id=0)
    lp_pad = sequence_logprobs(model, padded.input_ids, padded.attention_mask, padded.loss_mask)
    lp_flat = sequence_logprobs(model, packed.input_ids, torch.ones_like(packed.input_ids), packed.loss_mask)
    diff = (sequence_sums(lp_flat, packed) - masked_sum(lp_pad, padded.loss_mask, dim=-1)).abs()
    assert diff[1:].max() > 1e-2


# --------------------------------------------------------------------------- DPO


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_dpo_pair_logprobs_and_rpo_gradients_equal_padded(arch):
    from rlft.recipes.dpo import TokenizedPair, pair_logprobs

    model = tiny_lm(arch, "sdpa", seed=3)
    chosen = random_examples(seed=4)[:4]
    rejected = random_examples(seed=5, lengths=((5, 7), (11, 2), (2, 5), (17, 1)))
    pairs = [TokenizedPair(c, r) for c, r in zip(chosen, rejected)]
    ref = {k: torch.zeros(4) for k in ("chosen_sum", "rejected_sum")}
    out = {}
    for packing, pack_length in ((False, None), (True, None), (True, 30)):
        lp = pair_logprobs(model, pairs, 0, "cpu", packing=packing, pack_length=pack_length)
        nll = -aggregate(lp.chosen_token_logps, lp.chosen_mask)
        loss, _ = rpo_loss(lp.chosen_sum, lp.rejected_sum, ref["chosen_sum"], ref["rejected_sum"], chosen_nll=nll)
        loss.backward()
        out[(packing, pack_length)] = (lp, nll, loss, grads(model))
    base_lp, base_nll, base_loss, base_grads = out[(False, None)]
    for key in ((True, None), (True, 30)):
        lp, nll, loss, g = out[key]
        for name in ("chosen_sum", "rejected_sum", "chosen_mean", "rejected_mean"):
            torch.testing.assert_close(getattr(lp, name), getattr(base_lp, name), atol=ATOL, rtol=0, msg=name)
        assert lp.chosen_mask.sum() == base_lp.chosen_mask.sum() == sum(sum(c.loss_mask) for c in chosen)
        torch.testing.assert_close(nll, base_nll, atol=ATOL, rtol=0)
        torch.testing.assert_close(loss, base_loss, atol=ATOL, rtol=0)
        assert_same_grads(g, base_grads)


# --------------------------------------------------------------------------- reward model


def test_rm_pair_rewards_and_gradients_equal_padded(smol_tokenizer):
    from rlft.recipes.reward_model import RMExample, pair_rewards

    model = make_tiny_rm(smol_tokenizer, seed=2).train()
    g = torch.Generator().manual_seed(7)
    v = len(smol_tokenizer)

    def ex(n):
        return TokenizedExample(torch.randint(0, v, (n,), generator=g).tolist(), [0] * n, False)

    examples = [RMExample(ex(a), ex(b), 0.0) for a, b in ((6, 9), (13, 4), (3, 3), (20, 11))]
    results = {}
    for packing, pack_length in ((False, None), (True, None), (True, 25)):
        c, r = pair_rewards(model, examples, smol_tokenizer.pad_token_id, "cpu", packing=packing,
                            pack_length=pack_length)
        loss, _ = bradley_terry_loss(c, r, center_coef=0.1)
        loss.backward()
        results[(packing, pack_length)] = (c, r, grads(model))
    c0, r0, g0 = results[(False, None)]
    for key in ((True, None), (True, 25)):
        c, r, gk = results[key]
        torch.testing.assert_close(c, c0, atol=ATOL, rtol=0)
        torch.testing.assert_close(r, r0, atol=ATOL, rtol=0)
        assert_same_grads(gk, g0)


# --------------------------------------------------------------------------- recipes


def _losses(run_dir, key):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [r[key] for r in records if key in r]
    assert values, key
    return values


def test_sft_recipe_with_packing_logs_the_padded_losses(tiny_model_dir, tmp_path):
    from tests.unit.test_sft_recipe import make_cfg

    from rlft.recipes.sft import train_sft

    runs = {}
    for name, extra in {"pad": {}, "pack": {"packing": True, "pack_length": 200}}.items():
        cfg = make_cfg(tiny_model_dir, tmp_path / name, max_steps=2, save_every=0, **extra)
        train_sft(cfg)
        runs[name] = tmp_path / name
    assert _losses(runs["pack"], "loss/sft") == pytest.approx(_losses(runs["pad"], "loss/sft"), abs=1e-4)
    assert _losses(runs["pack"], "tokens") == _losses(runs["pad"], "tokens")


def test_dpo_and_rm_recipes_with_packing_log_the_padded_losses(tiny_model_dir, tmp_path):
    from tests.unit.test_dpo_recipe import make_cfg, synthetic_rows

    from rlft.recipes.dpo import train_dpo
    from rlft.recipes.reward_model import RMConfig, train_rm

    data = write_jsonl_rows(tmp_path / "prefs.jsonl", synthetic_rows())
    for name, extra in {"pad": {}, "pack": {"packing": True}}.items():
        train_dpo(make_cfg(tiny_model_dir, data, tmp_path / f"dpo-{name}", max_steps=2, save_every=0, **extra))
    assert _losses(tmp_path / "dpo-pack", "loss") == pytest.approx(_losses(tmp_path / "dpo-pad", "loss"), abs=1e-4)

    chat = write_jsonl_rows(
        tmp_path / "chat.jsonl",
        [{"prompt": f"What is {i} + {i}?", "chosen": f"It is {2 * i}.", "rejected": "No idea, sorry, really none."}
         for i in range(8)])
    base = RMConfig(model=str(tiny_model_dir), data=str(chat), chat_template="chatml", max_length=64, batch_size=4,
                    micro_batch_size=2, max_steps=2, lr=1e-3, warmup_ratio=0.0, schedule="constant", eval_fraction=0.25,
                    save_every=0, device="cpu", dtype="float32", seed=0)
    for name, extra in {"pad": {}, "pack": {"packing": True, "pack_length": 128}}.items():
        train_rm(replace(base, output_dir=str(tmp_path / f"rm-{name}"), **extra))
    for key in ("loss", "eval/accuracy", "eval/loss"):
        assert _losses(tmp_path / "rm-pack", key) == pytest.approx(_losses(tmp_path / "rm-pad", key), abs=1e-4), key


def test_flash_attention_gets_one_row_and_other_implementations_keep_rows():
    """transformers' flash-attention path detects packing only in a batch of one row: packed_hidden_states
    flattens R rows into one for flash_attention_*, keeps them for sdpa/eager, and reshapes back."""
    from types import SimpleNamespace

    from rlft.ops import packed_hidden_states

    calls = []

    class FakeDecoder(torch.nn.Module):
        def __init__(self, implementation):
            super().__init__()
            self.config = SimpleNamespace(_attn_implementation=implementation)

        def forward(self, input_ids, position_ids, use_cache):
            calls.append((tuple(input_ids.shape), position_ids.tolist(), use_cache))
            return SimpleNamespace(last_hidden_state=input_ids.float().unsqueeze(-1).repeat(1, 1, 3))

    batch = pack_examples([example([1, 2], [3]), example([4], [5, 6])], pad_token_id=0, pack_length=3)
    for implementation, shape in (("flash_attention_2", (1, 6)), ("sdpa", (2, 3)), ("eager", (2, 3))):
        calls.clear()
        hidden = packed_hidden_states(FakeDecoder(implementation), batch.input_ids, batch.position_ids)
        assert calls[0][0] == shape and calls[0][2] is False
        assert hidden.shape == (2, 3, 3) and (hidden[..., 0] == batch.input_ids.float()).all()
    assert calls[0][1] == [[0, 1, 2], [0, 1, 2]]
    with pytest.raises(ValueError, match="attention_mask=None"):
        sequence_logprobs(tiny_lm("llama", "sdpa"), batch.input_ids, torch.ones_like(batch.input_ids), batch.loss_mask,
                          position_ids=batch.position_ids)
