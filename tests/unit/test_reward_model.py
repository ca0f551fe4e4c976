"""Reward models: the reward is read at the last real token whatever the padding (side, amount, batch
size; pad == eos with SmolLM2), scoring renders exactly like training, and `rlft rm` learns a
synthetic preference on a tiny model and saves a folder that reloads to identical scores."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlft.checkpoint import latest_checkpoint, read_metrics
from rlft.data.chat import tokenize_preference_pair
from rlft.rewards.reward_model import (
    RewardModelScorer,
    freeze_lower_layers,
    is_reward_model_checkpoint,
    last_token_index,
    load_reward_model,
    pad_sequences,
    sequence_rewards,
    tokenize_scored,
)

from tests.conftest import interrupt_after_checkpoints, make_tiny_model, make_tiny_rm, save_model_dir, write_jsonl_rows

torch.set_num_threads(1)

PROMPTS = [
    "Hi",
    [{"role": "user", "content": "What is the capital of France? Answer in one word, please."}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
    "Write a haiku about the sea, with a title and no rhymes at all.",
    "ok",
]
RESPONSES = ["Hello! How can I help?", "Paris.", "6", "Waves / fold on / grey stones, and the gulls cry over them", ""]


@pytest.fixture(scope="module")
def tiny_rm(smol_tokenizer):
    return make_tiny_rm(smol_tokenizer)


@pytest.fixture
def padding_side(smol_tokenizer):
    """Set the (shared) tokenizer's padding side for one test, then restore it."""
    saved = smol_tokenizer.padding_side

    def set_side(side: str):
        smol_tokenizer.padding_side = side

    yield set_side
    smol_tokenizer.padding_side = saved


def unpadded_rewards(model, sequences) -> list[float]:
    """Each sequence alone (batch of 1, no padding), read at its final position."""
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq])
            out.append(float(sequence_rewards(model, ids, torch.ones_like(ids))[0]))
    return out


# --------------------------------------------------------------------------- reading position


def test_last_token_index():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [2, 4, 4, 2, 0]


def test_pad_sequences_sides():
    ids, mask = pad_sequences([[5, 6, 7], [8]], pad_token_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad_sequences([[5, 6, 7], [8]], pad_token_id=0, side="right")
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    with pytest.raises(ValueError, match="padding side"):
        pad_sequences([[1]], 0, side="middle")


def test_left_and_right_padding_give_identical_rewards(tiny_rm, smol_tokenizer):
    sequences = [tokenize_scored(smol_tokenizer, p, r) for p, r in zip(PROMPTS, RESPONSES)]
    assert len({len(s) for s in sequences}) > 2  # really different lengths, so really padded
    pad = smol_tokenizer.pad_token_id
    with torch.no_grad():
        left = sequence_rewards(tiny_rm, *pad_sequences(sequences, pad, "left"))
        right = sequence_rewards(tiny_rm, *pad_sequences(sequences, pad, "right"))
    alone = torch.tensor(unpadded_rewards(tiny_rm, sequences))
    torch.testing.assert_close(left, right, atol=1e-5, rtol=0)
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=0)
    assert alone.std() > 1e-2  # the rewards differ between pairs: the test can tell positions apart


def test_scorer_invariant_to_batch_size_and_padding_side(tiny_rm, smol_tokenizer, padding_side):
    results = {}
    for side in ("left", "right"):
        padding_side(side)
        for batch_size in (1, 4):
            results[side, batch_size] = RewardModelScorer(tiny_rm, smol_tokenizer,
                                                          batch_size=batch_size).score(PROMPTS, RESPONSES)
    reference = results["right", 1]
    assert len(reference) == len(PROMPTS)
    for key, scores in results.items():
        assert scores == pytest.approx(reference, abs=1e-5), key


def test_scores_invariant_to_padding_amount(tiny_rm, smol_tokenizer):
    scorer = RewardModelScorer(tiny_rm, smol_tokenizer, batch_size=8)
    alone = scorer.score(PROMPTS[:1], RESPONSES[:1])
    long_neighbour = scorer.score([PROMPTS[0], "x " * 200], [RESPONSES[0], "y " * 200])
    assert long_neighbour[0] == pytest.approx(alone[0], abs=1e-5)
    # and the same as reading the unpadded sequence's final position
    assert alone[0] == pytest.approx(
        unpadded_rewards(tiny_rm, [scorer.tokenize(PROMPTS[0], RESPONSES[0])])[0], abs=1e-5)


def test_pad_equal_to_eos_reads_the_end_of_turn_token(tiny_rm, smol_tokenizer):
    """SmolLM2: pad == eos == <|im_end|>, which also ends every response. transformers' own pooling
    ("rightmost token that is not pad") then reads the token *before* <|im_end|>; ours reads <|im_end|>."""
    tok = smol_tokenizer
    assert tok.pad_token_id == tok.eos_token_id
    seq = tokenize_scored(tok, PROMPTS[1], RESPONSES[1])
    assert seq[-1] == tok.eos_token_id  # the scored sequence ends with the end-of-turn token
    ours = RewardModelScorer(tiny_rm, tok).score([PROMPTS[1]], [RESPONSES[1]])[0]
    at_end, before_end = unpadded_rewards(tiny_rm, [seq, seq[:-1]])
    assert ours == pytest.approx(at_end, abs=1e-5)
    with torch.no_grad():
        hf_pooled = float(tiny_rm(input_ids=torch.tensor([seq])).logits[0, 0])
    assert hf_pooled == pytest.approx(before_end, abs=1e-5)
    assert abs(hf_pooled - ours) > 1e-3


def test_scoring_renders_like_training(smol_tokenizer):
    """The scorer's tokens for (prompt, response) are the training tokens of that side of a pair."""
    for prompt, response in zip(PROMPTS, RESPONSES):
        if not response:
            continue  # training pairs never have empty responses
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        chosen, rejected = tokenize_preference_pair(smol_tokenizer, messages, response, "something else entirely",
                                                    max_length=4096)
        assert tokenize_scored(smol_tokenizer, prompt, response) == chosen.input_ids
        assert tokenize_scored(smol_tokenizer, messages, response) == chosen.input_ids


def test_scorer_edge_cases(tiny_rm, smol_tokenizer):
    scorer = RewardModelScorer(tiny_rm, smol_tokenizer)
    assert scorer.score([], []) == []
    with pytest.raises(ValueError, match="prompts"):
        scorer.score(["a"], [])
    with pytest.raises(ValueError, match="tokenizer"):
        RewardModelScorer(tiny_rm)
    short = RewardModelScorer(tiny_rm, smol_tokenizer, max_length=8)
    with pytest.raises(ValueError, match="max_length"):
        short.score(["a long prompt " * 20], ["x"])
    assert tiny_rm.training is False


def test_load_reward_model_from_causal_lm_and_reward_model(tmp_path, smol_tokenizer):
    lm_dir = tmp_path / "lm"
    make_tiny_model(len(smol_tokenizer), seed=3).save_pretrained(lm_dir)
    assert not is_reward_model_checkpoint(str(lm_dir))
    torch.manual_seed(0)
    rm = load_reward_model(str(lm_dir), pad_token_id=smol_tokenizer.pad_token_id)
    weight = rm.score.weight
    assert weight.shape == (1, 32)
    assert 0.05 < float(weight.detach().std()) < 0.4  # N(0, 1/(d+1)): std ~0.17, not the default 0.02
    assert rm.config.pad_token_id == smol_tokenizer.pad_token_id and rm.config.num_labels == 1
    rm_dir = tmp_path / "rm"
    rm.save_pretrained(rm_dir)
    assert is_reward_model_checkpoint(str(rm_dir))
    again = load_reward_model(str(rm_dir))
    torch.testing.assert_close(again.score.weight, weight)  # a trained head is kept, not re-initialised
    # The saved config carries pad_token_id (== eos here); its embedding row must still be trainable.
    assert again.get_input_embeddings().padding_idx is None
    ids = torch.tensor([[5, smol_tokenizer.pad_token_id]])
    sequence_rewards(again, ids, torch.ones_like(ids)).sum().backward()
    assert again.get_input_embeddings().weight.grad[smol_tokenizer.pad_token_id].abs().sum() > 0


# --------------------------------------------------------------------------- the `rlft rm` recipe

MARKER = "banana"
WORDS = "the a cat dog sun rain tree house blue green runs sleeps quickly under over happy small big river stone".split(
)


def synthetic_rows(n: int, seed: int) -> list[dict]:
    """UltraFeedback-shaped rows: chosen contains the marker word somewhere, rejected does not."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = f"Tell me something about {rng.choice(WORDS)} number {i}."
        chosen_words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
        chosen_words.insert(rng.randint(0, len(chosen_words)), MARKER)
        rejected_words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
        rows.append({
            "prompt": prompt,
            "chosen": [{"role": "user", "content": prompt}, {"role": "assistant", "content": " ".join(chosen_words)}],
            "rejected": [{"role": "user", "content": prompt},
                         {"role": "assistant", "content": " ".join(rejected_words)}],
            "score_chosen": 8.0,
            "score_rejected": float(rng.choice([2, 4, 6])),
        })
    return rows


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("rm-data")
    ties = [{**row, "score_chosen": 5.0, "score_rejected": 5.0} for row in synthetic_rows(4, seed=3)]
    return write_jsonl_rows(folder / "train.jsonl",
                            synthetic_rows(64, seed=1) + ties), write_jsonl_rows(folder / "test.jsonl",
                                                                                 synthetic_rows(32, seed=2))


def rm_config(model_dir: Path, train: Path, output_dir: Path, **overrides):
    from rlft.recipes.reward_model import RMConfig

    cfg = RMConfig(
        model=str(model_dir), data=str(train), output_dir=str(output_dir), max_length=128,
        batch_size=8, micro_batch_size=4, eval_batch_size=16, max_steps=40, lr=3e-3, warmup_ratio=0.0,
        schedule="constant", eval_every=20, save_every=20, device="cpu", dtype="float32", seed=0,
    )
    return replace(cfg, **overrides)


def test_rm_recipe_learns_marker_and_reloads(tiny_model_dir, data_files, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlft.recipes.reward_model import train_rm

    train, test = data_files
    cfg = rm_config(tiny_model_dir, train, tmp_path / "run", eval_data=str(test), center_coef=0.01, margin_scale=0.1)
    final = train_rm(cfg)

    summary = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert summary["n"] == 32 and summary["step"] == 40
    assert summary["accuracy"] >= 0.8, summary  # chance is 0.5
    assert summary["data"]["train"]["pairs"] == 64  # the 4 score ties are dropped (drop_ties defaults to True)
    assert summary["data"]["loaded"][f"{train}:train_prefs"]["dropped_ties"] == 4
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in metrics] == list(range(1, 41))
    evals = [r for r in metrics if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [20, 40]
    assert evals[-1]["eval/accuracy"] == pytest.approx(summary["accuracy"])
    assert {"loss", "loss/bt", "loss/center", "rm/accuracy", "rm/margin", "lr", "grad_norm"} <= metrics[0].keys()
    assert sum(r["loss/bt"] for r in metrics[-5:]) < sum(r["loss/bt"] for r in metrics[:5])

    # The folder is a standard HF reward model; reloaded, it reproduces the recipe's held-out numbers.
    model = AutoModelForSequenceClassification.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.config.num_labels == 1 and model.config.pad_token_id == tokenizer.pad_token_id
    assert any(a.endswith("ForSequenceClassification") for a in model.config.architectures)
    rows = [json.loads(line) for line in test.read_text().splitlines()]
    scorer = RewardModelScorer(model, tokenizer, batch_size=8)
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in rows]
    chosen = scorer.score(prompts, [r["chosen"][-1]["content"] for r in rows])
    rejected = scorer.score(prompts, [r["rejected"][-1]["content"] for r in rows])
    assert sum(c > r for c, r in zip(chosen, rejected)) / len(rows) == pytest.approx(summary["accuracy"])
    assert sum(c - r for c, r in zip(chosen, rejected)) / len(rows) == pytest.approx(summary["margin"], abs=1e-4)
    from_folder = RewardModelScorer(str(final), device="cpu",
                                    dtype="float32").score(prompts[:4], [r["chosen"][-1]["content"] for r in rows[:4]])
    assert from_folder == pytest.approx(chosen[:4], abs=1e-5)


def test_rm_recipe_resume_matches_uninterrupted_run(tiny_model_dir, data_files, tmp_path):
    from rlft.recipes.reward_model import train_rm

    train, _ = data_files
    short = dict(max_steps=6, save_every=2, eval_every=3, eval_fraction=0.25, limit=32)
    final_a = train_rm(rm_config(tiny_model_dir, train, tmp_path / "a", **short))

    cfg_b = rm_config(tiny_model_dir, train, tmp_path / "b", **short)
    with pytest.MonkeyPatch.context() as mp:
        interrupt_after_checkpoints(mp, 2)
        with pytest.raises(KeyboardInterrupt):
            train_rm(cfg_b)
    assert latest_checkpoint(tmp_path / "b").name == "step-00000004"
    final_b = train_rm(replace(cfg_b, resume=True))

    from safetensors.torch import load_file

    wa, wb = load_file(final_a / "model.safetensors"), load_file(final_b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
    ma, mb = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in mb] == list(range(1, 7))
    for ra, rb in zip(ma, mb):
        assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-6)
        assert rb.get("eval/accuracy") == ra.get("eval/accuracy")
    assert json.loads((tmp_path / "a" / "eval.json").read_text())["n"] == 8  # 25% of 32 held out


def test_freeze_lower_layers_keeps_top_blocks_norm_and_head_trainable(tmp_path, smol_tokenizer):
    lm_dir = tmp_path / "lm"
    make_tiny_model(len(smol_tokenizer), seed=3).save_pretrained(lm_dir)
    rm = load_reward_model(str(lm_dir), pad_token_id=smol_tokenizer.pad_token_id)
    blocks = rm.base_model.layers
    assert len(blocks) >= 2
    frozen = freeze_lower_layers(rm, 1)
    trainable = {n for n, p in rm.named_parameters() if p.requires_grad}
    top = {f"model.layers.{len(blocks) - 1}.{n}" for n, _ in blocks[-1].named_parameters()}
    assert trainable == top | {"model.norm.weight", "score.weight"}
    assert frozen == sum(p.numel() for n, p in rm.named_parameters() if n not in trainable)
    # gradients reach exactly the trainable parameters
    ids = torch.tensor([[5, 6, 7]])
    sequence_rewards(rm, ids, torch.ones_like(ids)).sum().backward()
    assert {n for n, p in rm.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0} == trainable
    rm0 = load_reward_model(str(lm_dir), pad_token_id=smol_tokenizer.pad_token_id)
    freeze_lower_layers(rm0, 0)
    assert {n for n, p in rm0.named_parameters() if p.requires_grad} == {"model.norm.weight", "score.weight"}
    with pytest.raises(ValueError, match="train_layers must be >= 0"):
        freeze_lower_layers(rm0, -1)


def test_rm_recipe_head_lr_and_train_layers(tiny_model_dir, data_files, tmp_path):
    from safetensors.torch import load_file

    from rlft.recipes.reward_model import train_rm

    train, test = data_files
    cfg = rm_config(tiny_model_dir, train, tmp_path / "run", eval_data=str(test), lr=1e-3, head_lr=1e-2, train_layers=1)
    final = train_rm(cfg)
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["accuracy"] >= 0.8  # chance is 0.5
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(final / "model.safetensors")
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])  # frozen
    assert torch.equal(after["model.layers.0.mlp.up_proj.weight"], before["model.layers.0.mlp.up_proj.weight"])
    assert not torch.equal(after["model.norm.weight"], before["model.norm.weight"])  # trained


def test_zero_head_init_gives_zero_rewards(tmp_path, smol_tokenizer):
    lm_dir = tmp_path / "lm"
    make_tiny_model(len(smol_tokenizer), seed=3).save_pretrained(lm_dir)
    rm = load_reward_model(str(lm_dir), pad_token_id=smol_tokenizer.pad_token_id, head_init="zero")
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    assert torch.equal(sequence_rewards(rm, ids, torch.ones_like(ids)), torch.zeros(2))
    with pytest.raises(ValueError, match="unknown score-head init"):
        load_reward_model(str(lm_dir), head_init="uniform")


def test_tokenize_pairs_cuts_long_prompts_at_their_start(smol_tokenizer):
    """With max_prompt_length a pair whose prompt alone overflows max_length is kept: the prompt keeps its
    last max_prompt_length tokens, each reply its start; without it the pair is dropped and counted."""
    from types import SimpleNamespace

    from rlft.recipes.reward_model import tokenize_pairs

    words = " ".join(f"w{i}" for i in range(200))
    pair = SimpleNamespace(prompt=[{"role": "user", "content": words}], chosen="yes " * 40, rejected="no " * 40,
                           score_chosen=None, score_rejected=None)
    full = tokenize_preference_pair(smol_tokenizer, pair.prompt, pair.chosen, pair.rejected, max_length=10_000)
    prompt_len = full[0].loss_mask.index(1)
    assert prompt_len > 64

    dropped, counts = tokenize_pairs([pair], smol_tokenizer, max_length=64)
    assert dropped == [] and counts["dropped_prompt_too_long"] == 1

    [kept], counts = tokenize_pairs([pair], smol_tokenizer, max_length=64, max_prompt_length=32)
    assert counts["pairs"] == 1 and counts["dropped_prompt_too_long"] == 0
    for cut, whole in ((kept.chosen, full[0]), (kept.rejected, full[1])):
        assert len(cut.input_ids) == 64 and cut.truncated
        assert cut.input_ids[:32] == whole.input_ids[prompt_len - 32:prompt_len]  # the prompt's end
        assert cut.input_ids[32:] == whole.input_ids[prompt_len:prompt_len + 32]  # the reply's start
        assert cut.loss_mask == [0] * 32 + [1] * 32


@pytest.mark.parametrize("changes, message", [
    ({"batch_size": 6, "micro_batch_size": 4}, "--batch-size 6 must be a multiple of --micro-batch-size 4"),
    ({"max_prompt_length": 64, "max_length": 64}, "--max-prompt-length must be < --max-length (64), got 64"),
    ({"eval_batch_size": 0}, "--eval-batch-size must be >= 1, got 0"),
    ({"head_lr": 0.0}, "--head-lr must be > 0 (or unset), got 0.0"),
    ({"center_coef": -0.1}, "--center-coef must be >= 0, got -0.1"),
    ({"eval_fraction": 1.0}, "--eval-fraction must lie in [0, 1), got 1.0"),
])
def test_rm_options_are_checked_with_the_option_named(changes, message):
    from rlft.recipes.reward_model import RMConfig
    from rlft.validation import OptionError

    with pytest.raises(OptionError) as info:
        RMConfig(**changes)
    assert str(info.value) == message


def test_a_scorer_refuses_a_causal_lm_folder(tiny_model_dir):
    """A causal LM folder would be scored through a new, random head (rl --reward-model, eval winrate --judge, the
    selectors): refused with the folder named, before any weight is loaded."""
    with pytest.raises(ValueError, match=f"{tiny_model_dir} is not a reward model"):
        RewardModelScorer(str(tiny_model_dir), device="cpu", dtype="float32")


def test_check_reward_model_names_the_option(tiny_model_dir, tmp_path, smol_tokenizer):
    from rlft.rewards.reward_model import check_reward_model
    from rlft.validation import OptionError

    with pytest.raises(OptionError, match=f"--judge {tiny_model_dir} is not a reward model"):
        check_reward_model(str(tiny_model_dir), "--judge")
    with pytest.raises(OptionError, match="--judge .*nowhere: no such folder"):
        check_reward_model(str(tmp_path / "nowhere"), "--judge")
    check_reward_model(str(save_model_dir(tmp_path / "rm", make_tiny_rm(smol_tokenizer), smol_tokenizer)), "--judge")
