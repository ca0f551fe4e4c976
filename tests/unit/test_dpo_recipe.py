"""The DPO recipe on a tiny random Llama with the SmolLM2 tokenizer (pad == eos): per-pair log-probs
do not depend on batching, reference log-probs are computed once and the reference model is gone
before training, a synthetic preference is learned, malformed rows are reported, an interrupted run
resumes to the same weights, micro-batching is exact."""

from __future__ import annotations

import gc
import math
import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import rlft.recipes.common as common_recipe
import rlft.recipes.dpo as dpo_recipe
from rlft.checkpoint import latest_checkpoint, read_metrics
from rlft.data.files import DataError
from rlft.recipes.dpo import DPOConfig, pair_logprobs, reference_logprobs, train_dpo
from rlft.recipes.dpo_data import TextPair, load_text_pairs, tokenize_preference_pairs, tokenize_text_pair

from tests.conftest import (interrupt_after_checkpoints, load_weights, make_scaled_tiny_model, make_tiny_model,
                            write_jsonl_rows)

torch.set_num_threads(1)

STEPS = 8
GOOD_RESPONSE = " yes, that is right."
BAD_RESPONSE = " no idea, go away!!"


# --------------------------------------------------------------------------- helpers and fixtures


def synthetic_rows(n: int = 8) -> list[dict]:
    return [{"prompt": f"Q{i}: is {i} + {i} = {2 * i}?\nA:", "chosen": GOOD_RESPONSE, "rejected": BAD_RESPONSE}
            for i in range(n)]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> Path:
    return write_jsonl_rows(tmp_path_factory.mktemp("data") / "prefs.jsonl", synthetic_rows())


def make_cfg(model_dir: Path, data: Path, output_dir: Path, **overrides) -> DPOConfig:
    cfg = DPOConfig(
        model=str(model_dir),
        data=str(data),
        data_format="text",  # the synthetic "Q: ...\nA:" prompts would auto-detect as chat
        output_dir=str(output_dir),
        max_length=64,
        batch_size=4,
        micro_batch_size=2,
        max_steps=STEPS,
        lr=3e-3,
        warmup_ratio=0.0,
        schedule="constant",
        save_every=2,
        device="cpu",
        dtype="float32",
    )
    return replace(cfg, **overrides)


# --------------------------------------------------------------------------- tokenization


def test_pair_tokenization_trains_the_eos_even_when_pad_is_eos(smol_tokenizer):
    tok = smol_tokenizer
    assert tok.pad_token_id == tok.eos_token_id
    pair = tokenize_text_pair(tok, TextPair("Q: 1+1?\nA:", " 2", " 3, I think"), max_length=64)
    prompt_len = len(tok("Q: 1+1?\nA:").input_ids)
    for example, text in ((pair.chosen, " 2"), (pair.rejected, " 3, I think")):
        assert example.input_ids[:prompt_len] == tok("Q: 1+1?\nA:").input_ids
        assert example.input_ids[prompt_len:] == tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
        assert example.loss_mask == [0] * prompt_len + [1] * (len(example.input_ids) - prompt_len)
        assert not example.truncated


def test_truncation_and_drops_are_counted(smol_tokenizer, rlft_log):
    pairs = [
        TextPair("Q: a?\nA:", " fine", " also fine"),  # fits
        TextPair("Q: b?\nA:", " one two three four five six seven eight nine ten", " short"),  # chosen cut
        TextPair("Q: c?\nA:", " ok", " a b c d e f g h i j k l m n o p q"),  # rejected cut
        TextPair("word " * 30, " x", " y"),  # prompt alone too long: dropped
    ]
    out = tokenize_preference_pairs(pairs, smol_tokenizer, max_length=12)
    assert len(out) == 3
    assert [p.chosen.truncated for p in out] == [False, True, False]
    assert [p.rejected.truncated for p in out] == [False, False, True]
    assert all(len(e.input_ids) <= 12 for p in out for e in (p.chosen, p.rejected))
    assert out[1].chosen.input_ids[-1] != smol_tokenizer.eos_token_id  # cut at the end: EOS goes first
    assert "3 pairs; 1 chosen and 1 rejected responses truncated to 12 tokens; 1 dropped" in rlft_log.text


# --------------------------------------------------------------------------- per-pair log-probs


def test_pair_logprobs_independent_of_padding_and_order(smol_tokenizer):
    tok = smol_tokenizer
    model = make_scaled_tiny_model(len(tok))
    short = TextPair("Hi", " a", " b")
    target = TextPair("Q: what is two plus two?\nA:", " four, since 2 + 2 = 4.", " five")
    long = TextPair("A much longer prompt " * 6 + "\nA:", " and a long answer " * 5, " and a different long one " * 4)
    tokenized = {name: tokenize_text_pair(tok, p, max_length=256) for name, p in
                 {"short": short, "target": target, "long": long}.items()}

    def values(batch: list[str], name: str = "target"):
        with torch.no_grad():
            lp = pair_logprobs(model, [tokenized[n] for n in batch], tok.pad_token_id, "cpu")
        i = batch.index(name)
        return torch.stack([lp.chosen_sum[i], lp.rejected_sum[i], lp.chosen_mean[i], lp.rejected_mean[i]])

    alone = values(["target"])
    for batch in (["short", "target"], ["target", "short", "short"], ["long", "target"], ["target", "long", "short"]):
        assert torch.allclose(values(batch), alone, atol=1e-5, rtol=0), batch
    # The check is not vacuous: the pairs differ, and padding the target with extra tokens that are
    # attended to (a wrong mask) would change it.
    assert not torch.allclose(values(["short"], "short"), alone, atol=1e-2)
    # Sums and means agree with a direct per-token computation.
    e = tokenized["target"].chosen
    ids = torch.tensor([e.input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1]
    direct = torch.log_softmax(logits.float(), -1).gather(1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(e.loss_mask[1:], dtype=torch.bool)
    assert alone[0].item() == pytest.approx(direct[mask].sum().item(), abs=1e-4)
    assert alone[2].item() == pytest.approx(direct[mask].mean().item(), abs=1e-5)


def test_one_forward_pass_per_micro_batch(monkeypatch, smol_tokenizer):
    tok = smol_tokenizer
    calls = []
    real = dpo_recipe.sequence_logprobs

    def spy(model, input_ids, *args, **kwargs):
        calls.append(tuple(input_ids.shape))
        return real(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(dpo_recipe, "sequence_logprobs", spy)
    pairs = [tokenize_text_pair(tok, TextPair(f"Q{i}", " yes", " no no no"), max_length=32) for i in range(3)]
    pair_logprobs(make_tiny_model(len(tok)), pairs, tok.pad_token_id, "cpu")
    assert len(calls) == 1 and calls[0][0] == 6


# --------------------------------------------------------------------------- a full run


@pytest.fixture(scope="module")
def run_a(tiny_model_dir, pairs_file, tmp_path_factory):
    """An uninterrupted run that also records the models alive at every optimizer step and the
    shapes of the forward passes."""
    out = tmp_path_factory.mktemp("run-a")
    loaded: list[weakref.ref] = []
    alive_per_step: list[int] = []
    forward_rows: list[int] = []
    ref_loads = []

    def tracking(loader, tag):
        def wrapper(*args, **kwargs):
            model = loader(*args, **kwargs)
            loaded.append(weakref.ref(model))
            if tag == "ref":
                ref_loads.append(args[0])
            return model
        return wrapper

    real_step = dpo_recipe.optimizer_step

    def counting_step(setup, max_grad_norm, **kwargs):
        gc.collect()
        alive_per_step.append(sum(r() is not None for r in loaded))
        return real_step(setup, max_grad_norm, **kwargs)

    real_seq = dpo_recipe.sequence_logprobs

    def seq_spy(model, input_ids, *args, **kwargs):
        forward_rows.append(input_ids.shape[0])
        return real_seq(model, input_ids, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpo_recipe, "load_model", tracking(dpo_recipe.load_model, "ref"))
        mp.setattr(common_recipe, "load_model", tracking(common_recipe.load_model, "policy"))
        mp.setattr(dpo_recipe, "optimizer_step", counting_step)
        mp.setattr(dpo_recipe, "sequence_logprobs", seq_spy)
        final = train_dpo(make_cfg(tiny_model_dir, pairs_file, out, max_steps=24, save_every=8))
    return {"dir": out, "final": final, "alive": alive_per_step, "loaded": len(loaded), "ref_loads": ref_loads,
            "forward_rows": forward_rows}


def test_run_layout_and_metrics_keys(run_a):
    out = run_a["dir"]
    assert run_a["final"] == out / "model" and (out / "model" / "config.json").is_file()
    assert (out / "ref_logps.pt").is_file() and (out / "config.yaml").is_file()
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 25))
    for key in ("loss", "loss/dpo", "rewards/accuracy", "rewards/margin", "rewards/chosen", "rewards/rejected",
                "logps/chosen", "logps/rejected", "lr", "grad_norm", "tokens_per_s"):
        assert all(math.isfinite(r[key]) for r in records), key


def test_reference_model_is_freed_before_training(run_a):
    # One reference load, one policy load; during every optimizer step only the policy is alive.
    assert run_a["loaded"] == 2 and len(run_a["ref_loads"]) == 1
    assert run_a["alive"] == [1] * 24


def test_chosen_and_rejected_share_one_forward_pass(run_a):
    # Reference pass: 8 pairs in micro-batches of 2 -> 4 passes of 4 rows; training: 24 steps x 2 passes of 4 rows.
    assert run_a["forward_rows"] == [4] * (4 + 24 * 2)


def test_first_step_starts_at_log_2_and_preference_is_learned(run_a):
    records = read_metrics(run_a["dir"] / "metrics.jsonl")
    # Step 1: the policy is the reference, so h = 0 for every pair.
    assert records[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert records[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-4)
    last = records[-3:]
    assert sum(r["loss"] for r in last) / 3 < math.log(2) - 0.2, [r["loss"] for r in records]
    assert all(r["rewards/accuracy"] == 1.0 for r in last)
    assert min(r["rewards/margin"] for r in last) > 0.5
    assert last[-1]["rewards/margin"] > records[5]["rewards/margin"] > records[0]["rewards/margin"]
    # The rejected response loses probability, relative to the reference.
    assert last[-1]["rewards/rejected"] < 0


def test_cached_reference_logprobs_equal_a_fresh_computation(run_a, tiny_model_dir, pairs_file, smol_tokenizer):
    cached = torch.load(run_a["dir"] / "ref_logps.pt", weights_only=True)
    pairs = tokenize_preference_pairs(load_text_pairs(DPOConfig(data=str(pairs_file))), smol_tokenizer, 64)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # one pair at a time: different batching from the recipe's
        fresh = [pair_logprobs(model, [p], smol_tokenizer.pad_token_id, "cpu") for p in pairs]
    for key in ("chosen_sum", "rejected_sum", "chosen_mean", "rejected_mean"):
        expected = torch.cat([getattr(f, key) for f in fresh])
        assert cached[key].shape == (len(pairs),)
        assert torch.allclose(cached[key], expected, atol=1e-5, rtol=0), key


def test_separate_reference_model_is_used(tiny_model_dir, pairs_file, smol_tokenizer, tmp_path):
    other = tmp_path / "other-ref"
    make_scaled_tiny_model(len(smol_tokenizer), seed=5).save_pretrained(other)
    cfg = make_cfg(tiny_model_dir, pairs_file, tmp_path / "run", ref_model=str(other))
    pairs = tokenize_preference_pairs(load_text_pairs(cfg), smol_tokenizer, cfg.max_length)
    from rlft.models import pick_device

    (tmp_path / "run").mkdir()
    ref = reference_logprobs(cfg, pairs, smol_tokenizer.pad_token_id, pick_device("cpu", "float32"), tmp_path / "run")
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        expected = pair_logprobs(
            AutoModelForCausalLM.from_pretrained(other).eval(), pairs, smol_tokenizer.pad_token_id, "cpu")
        policy = pair_logprobs(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), pairs, smol_tokenizer.pad_token_id, "cpu")
    assert torch.allclose(ref["chosen_sum"], expected.chosen_sum, atol=1e-5, rtol=0)
    assert not torch.allclose(ref["chosen_sum"], policy.chosen_sum, atol=1e-2)


# --------------------------------------------------------------------------- resume


def test_resume_reproduces_uninterrupted_run(tiny_model_dir, pairs_file, tmp_path, monkeypatch):
    cfg_a = make_cfg(tiny_model_dir, pairs_file, tmp_path / "run-a")
    final_a = train_dpo(cfg_a)

    cfg_b = make_cfg(tiny_model_dir, pairs_file, tmp_path / "run-b")
    with pytest.MonkeyPatch.context() as mp:
        interrupt_after_checkpoints(mp, 2)
        with pytest.raises(KeyboardInterrupt):
            train_dpo(cfg_b)
    assert latest_checkpoint(cfg_b.output_dir).name == "step-00000004"
    assert not (tmp_path / "run-b" / "model").exists()

    ref_loads = []
    real_load = dpo_recipe.load_model
    monkeypatch.setattr(dpo_recipe, "load_model", lambda *a, **k: ref_loads.append(a) or real_load(*a, **k))
    final_b = train_dpo(replace(cfg_b, resume=True))
    assert ref_loads == []  # the reference log-probs came from the run's cache

    a_weights, b_weights = load_weights(final_a), load_weights(final_b)
    assert a_weights.keys() == b_weights.keys()
    for name in a_weights:
        assert torch.allclose(a_weights[name], b_weights[name], atol=1e-6, rtol=0), name
    a_metrics = read_metrics(tmp_path / "run-a" / "metrics.jsonl")
    b_metrics = read_metrics(tmp_path / "run-b" / "metrics.jsonl")
    assert [r["step"] for r in b_metrics] == list(range(1, STEPS + 1))
    for ra, rb in zip(a_metrics, b_metrics):
        for key in ("loss", "rewards/margin", "rewards/accuracy", "lr", "grad_norm"):
            assert rb[key] == pytest.approx(ra[key], abs=1e-6), (ra["step"], key)


def test_stale_reference_cache_is_recomputed(tiny_model_dir, pairs_file, tmp_path, rlft_log):
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"fingerprint": "something else", "chosen_sum": torch.zeros(1)}, out / "ref_logps.pt")
    train_dpo(make_cfg(tiny_model_dir, pairs_file, out, max_steps=1, save_every=0, resume=True))
    assert "recomputing" in rlft_log.text
    assert torch.load(out / "ref_logps.pt", weights_only=True)["chosen_sum"].shape == (8,)


# --------------------------------------------------------------------------- micro-batching and loss types


@pytest.mark.parametrize("loss_type", ["dpo", "ipo", "rpo"])
def test_micro_batching_is_exact(tiny_model_dir, pairs_file, tmp_path, monkeypatch, loss_type):
    """Batch of 4 pairs as 1 x 4 or 4 x 1: the same accumulated gradients and metrics.

    (One step, and gradients, not weights after AdamW: its first update is ~lr * sign(g), which turns
    float noise in near-zero gradients into visible weight differences.)
    """
    real_step = dpo_recipe.optimizer_step
    grads: list[dict[str, torch.Tensor]] = []

    def capture(setup, max_grad_norm, **kwargs):
        grads.append({n: p.grad.clone() for n, p in setup.model.named_parameters()})
        return real_step(setup, max_grad_norm, **kwargs)

    monkeypatch.setattr(dpo_recipe, "optimizer_step", capture)
    runs = {}
    for micro in (4, 1):
        grads = []
        cfg = make_cfg(tiny_model_dir, pairs_file, tmp_path / f"m{micro}", loss_type=loss_type, micro_batch_size=micro,
                       max_steps=1, save_every=0, label_smoothing=0.1 if loss_type != "ipo" else 0.0, rpo_alpha=0.5)
        train_dpo(cfg)
        runs[micro] = (grads, read_metrics(tmp_path / f"m{micro}" / "metrics.jsonl"))
    (ga, ma), (gb, mb) = runs[4], runs[1]
    assert len(ga) == len(gb) == 1
    for step_a, step_b in zip(ga, gb):
        for name in step_a:
            scale = step_a[name].abs().max().item()
            assert torch.allclose(step_a[name], step_b[name], atol=1e-5 * max(scale, 1e-3), rtol=0), name
    assert f"loss/{loss_type}" in ma[0]
    for ra, rb in zip(ma, mb):
        for key in ra:
            if key != "tokens_per_s":
                assert rb[key] == pytest.approx(ra[key], abs=1e-5, rel=1e-5), key
    if loss_type == "rpo":
        assert ma[0]["loss"] == pytest.approx(ma[0]["loss/dpo"] + 0.5 * ma[0]["loss/nll"], abs=1e-6)
        assert ma[0]["loss/nll"] > 0


def test_micro_batches_group_pairs_of_similar_length(tiny_model_dir, tmp_path, monkeypatch):
    """A step of 4 pairs of two very different lengths, in micro-batches of 2: each micro-batch holds two pairs
    of one length (so it pads to its own), and the step's gradient is the one-pass gradient."""
    rows = [{"prompt": "Q:" + " word" * n + "?\nA:", "chosen": " yes", "rejected": " no"} for n in (1, 20, 2, 21)]
    data = write_jsonl_rows(tmp_path / "varied.jsonl", rows)
    real_logprobs, real_step = dpo_recipe.pair_logprobs, dpo_recipe.optimizer_step
    lengths: list[list[int]] = []
    grads: list[dict[str, torch.Tensor]] = []

    def spy(model, pairs, *args, **kwargs):
        if torch.is_grad_enabled():  # a training forward (reference log-probs run under no_grad)
            lengths.append(sorted(len(p.chosen.input_ids) for p in pairs))
        return real_logprobs(model, pairs, *args, **kwargs)

    def capture(setup, max_grad_norm, **kwargs):
        grads.append({n: p.grad.clone() for n, p in setup.model.named_parameters()})
        return real_step(setup, max_grad_norm, **kwargs)

    monkeypatch.setattr(dpo_recipe, "pair_logprobs", spy)
    monkeypatch.setattr(dpo_recipe, "optimizer_step", capture)
    for micro in (2, 4):
        train_dpo(
            make_cfg(tiny_model_dir, data, tmp_path / f"m{micro}", micro_batch_size=micro, max_steps=1, save_every=0))
    short, long_, whole = lengths
    assert len(short) == len(long_) == 2 and max(short) + 15 < min(long_), lengths
    assert sorted(short + long_) == whole
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-5 * max(g.abs().max().item(), 1e-3), rtol=0), name


# --------------------------------------------------------------------------- data files


GOOD = {"prompt": "Q: 1+1?\nA:", "chosen": " 2", "rejected": " 3"}


@pytest.mark.parametrize(
    "bad_row, field, problem",
    [
        ({"prompt": "Q", "rejected": " 4"}, "chosen", "missing"),
        ({"chosen": " 4", "rejected": " 5"}, "prompt", "missing"),
        ({"prompt": "Q", "chosen": " 4", "rejected": 5}, "rejected", "expected a string, got int"),
        ({"prompt": "Q", "chosen": [{"role": "assistant", "content": "4"}], "rejected": " 5"}, "chosen", "got list"),
        ({"prompt": "Q", "chosen": "  ", "rejected": " 5"}, "chosen", "empty"),
        ({"prompt": "", "chosen": " 4", "rejected": " 5"}, "prompt", "empty"),
        ({"prompt": "Q", "chosen": " 4", "rejected": " 4"}, "rejected", "identical"),
    ],
)
def test_malformed_row_raises_data_error_naming_file_row_and_field(tmp_path, bad_row, field, problem):
    path = write_jsonl_rows(tmp_path / "prefs.jsonl", [GOOD, GOOD, bad_row, GOOD])
    with pytest.raises(DataError) as info:
        load_text_pairs(DPOConfig(data=str(path)))
    err = info.value
    assert (err.source, err.row, err.field) == (str(path), 2, field)
    assert str(path) in str(err) and "row 2" in str(err) and problem in str(err)


def test_train_dpo_stops_on_malformed_row(tmp_path, tiny_model_dir):
    path = write_jsonl_rows(tmp_path / "prefs.jsonl", [GOOD, {"prompt": "x", "chosen": None, "rejected": "y"}])
    with pytest.raises(DataError, match="row 1"):
        train_dpo(make_cfg(tiny_model_dir, path, tmp_path / "run"))


def test_skip_invalid_counts_and_custom_fields(tmp_path, rlft_log):
    rows = [{"q": "a", "good": " b", "bad": " c"}, {"q": "a"}, {"q": "d", "good": " e", "bad": " e"},
            {"q": "f", "good": " g", "bad": " h"}]
    path = write_jsonl_rows(tmp_path / "prefs.jsonl", rows)
    cfg = DPOConfig(data=str(path), prompt_field="q", chosen_field="good", rejected_field="bad", skip_invalid=True)
    assert load_text_pairs(cfg) == [TextPair("a", " b", " c"), TextPair("f", " g", " h")]
    assert "skipped 2 invalid rows" in rlft_log.text
    with pytest.raises(ValueError, match="no preference pairs"):
        load_text_pairs(replace(cfg, data=str(write_jsonl_rows(tmp_path / "bad.jsonl", [{"q": "a"}]))))


def test_parquet_and_limit(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "prefs.parquet"
    pq.write_table(pa.Table.from_pylist(synthetic_rows(5)), path)
    assert len(load_text_pairs(DPOConfig(data=str(path), limit=3))) == 3


@pytest.mark.parametrize("overrides, match", [
    ({"batch_size": 6, "micro_batch_size": 4}, "^--batch-size 6 must be a multiple of --micro-batch-size 4$"),
    ({"beta": 0.0}, r"^--beta must be > 0 \(.*\), got 0.0$"),  # stricter than the generic --beta >= 0 (RL's KL)
    ({"max_prompt_length": 0}, r"^--max-prompt-length must be >= 1 \(or unset\), got 0$"),
    ({"label_smoothing": 0.6}, r"--label-smoothing must lie in \[0, 0.5\], got 0.6"),
])
def test_invalid_config_raises_before_loading(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        train_dpo(DPOConfig(model=str(tmp_path / "missing"), output_dir=str(tmp_path / "run"), **overrides))


def test_a_nan_dpo_loss_stops_the_run_naming_the_step(tiny_model_dir, pairs_file, tmp_path, monkeypatch):
    """The DPO step gives its loss to the guarded optimizer step: a NaN loss at step 2 stops the run there, naming the
    loss (not only the gradient norm it would poison), and no final model is written."""
    from rlft.precision import NonFiniteError
    from rlft.recipes import dpo as dpo_recipe

    real, calls = dpo_recipe.preference_backward, []

    def poisoned(*args, **kwargs):
        sums, seen = real(*args, **kwargs)
        calls.append(1)
        return ({**sums, "loss": float("nan")} if len(calls) == 2 else sums), seen

    monkeypatch.setattr(dpo_recipe, "preference_backward", poisoned)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError, match=r"^step 2: loss is nan"):
        train_dpo(make_cfg(tiny_model_dir, pairs_file, out, max_steps=3, save_every=0))
    assert not (out / "model").exists()
