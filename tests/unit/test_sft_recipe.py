"""The SFT recipe end to end on a tiny random Llama with the SmolLM2 tokenizer (pad == eos):
loss falls, parameters change, the saved folder reloads exactly, an interrupted run resumes to the
same weights and metrics, malformed rows are reported or skipped, truncation is counted."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

import rlft.recipes.sft as sft_recipe
from rlft.checkpoint import latest_checkpoint, read_metrics
from rlft.data.files import DataError
from rlft.recipes.common import batch_indices, length_grouped
from rlft.recipes.sft import SFTConfig, load_sft_pairs, tokenize_pairs, train_sft
from rlft.types import PromptCompletion
from rlft.validation import OptionError

from tests.conftest import interrupt_after_checkpoints, load_weights, write_jsonl_rows

torch.set_num_threads(1)

STEPS = 8


# --------------------------------------------------------------------------- helpers and fixtures


def make_cfg(model_dir: Path, output_dir: Path, **overrides) -> SFTConfig:
    cfg = SFTConfig(
        model=str(model_dir),
        data="countdown",
        preset="tiny",
        num_train=32,
        prompt_template="short",
        output_dir=str(output_dir),
        max_length=96,
        batch_size=8,
        micro_batch_size=4,
        max_steps=STEPS,
        lr=3e-3,
        warmup_ratio=0.0,
        save_every=2,
        device="cpu",
        dtype="float32",
    )
    return replace(cfg, **overrides)


def probe_ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(99))


@pytest.fixture(scope="module")
def run_a(tiny_model_dir, tmp_path_factory, smol_tokenizer):
    """An uninterrupted run; captures the in-memory model's weights and logits when it is saved."""
    out = tmp_path_factory.mktemp("run-a")
    captured: dict = {}
    import rlft.checkpoint as checkpoint_module

    real_save = checkpoint_module.save_model_folder

    def capture(folder, model, tokenizer, extra=None, **kwargs):
        if Path(folder).name != "model":  # checkpoints go through the same function
            return real_save(folder, model, tokenizer, extra, **kwargs)
        with torch.no_grad():
            captured["logits"] = model(input_ids=probe_ids(len(smol_tokenizer))).logits.detach().clone()
        captured["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return real_save(folder, model, tokenizer, extra, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint_module, "save_model_folder", capture)  # save_final_model looks it up at call time
        final = train_sft(make_cfg(tiny_model_dir, out))
    return {"dir": out, "final": final, **captured}


# --------------------------------------------------------------------------- a full run


def test_run_writes_expected_layout(run_a):
    out = run_a["dir"]
    assert run_a["final"] == out / "model"
    assert (out / "model" / "config.json").is_file()
    assert (out / "model" / "tokenizer_config.json").is_file()
    assert yaml.safe_load((out / "config.yaml").read_text())["max_steps"] == STEPS
    # save_every=2 over 8 steps: checkpoints at 2, 4, 6 and 8 (the last step, beside the final model), 2 kept.
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-00000006", "step-00000008"]
    assert latest_checkpoint(out).name == "step-00000008"


def test_loss_falls(run_a):
    records = read_metrics(run_a["dir"] / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    losses = [r["loss/sft"] for r in records]
    assert all(torch.isfinite(torch.tensor(losses)))
    last3 = sum(losses[-3:]) / 3
    assert last3 < losses[0] - 0.3, losses


def test_every_parameter_changes(run_a, tiny_model_dir):
    before, after = load_weights(tiny_model_dir), load_weights(run_a["final"])
    assert before.keys() == after.keys()
    for name in before:
        assert after[name].dtype == torch.float32
        assert not torch.equal(before[name], after[name]), f"{name} did not change"


def test_saved_model_reloads_to_identical_logits(run_a, smol_tokenizer):
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(run_a["final"], dtype=torch.float32)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, run_a["state"][name]), name
    with torch.no_grad():
        logits = reloaded(input_ids=probe_ids(len(smol_tokenizer))).logits
    assert torch.allclose(logits, run_a["logits"], atol=1e-6, rtol=0)


def test_metrics_count_trained_tokens_and_flops_by_hand(run_a, tiny_model_dir, smol_tokenizer):
    """Each step's batch (batch_indices of the seed) is re-tokenized here: tokens = its prompt + completion tokens,
    tokens/trained = its loss tokens (completion + EOS), flops/estimated = 6 N x the tokens so far."""
    from rlft.compute import parameter_count
    from rlft.models import DeviceSpec, load_model
    from rlft.recipes.sft import load_sft_examples

    cfg = make_cfg(tiny_model_dir, run_a["dir"])
    examples, _ = load_sft_examples(cfg, smol_tokenizer)
    n = parameter_count(load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32)))
    flops = trained = 0
    for step, r in enumerate(read_metrics(run_a["dir"] / "metrics.jsonl")):
        batch = [examples[i] for i in batch_indices(step, len(examples), cfg.batch_size, cfg.seed)]
        assert r["tokens"] == sum(len(e.input_ids) for e in batch)
        assert r["tokens/trained"] == sum(sum(e.loss_mask) for e in batch) < r["tokens"]
        flops, trained = flops + 6 * n * r["tokens"], trained + r["tokens/trained"]
        assert r["flops/estimated"] == flops and r["tokens/trained_total"] == trained


def test_steps_for_tokens_by_hand():
    # 5 examples of lengths 10..14, batches of 2: an epoch is 3 steps (2, 2, 1 examples) in the seed's order
    lengths = [10, 11, 12, 13, 14]
    batches = [sum(lengths[i] for i in batch_indices(step, 5, 2, 0)) for step in range(4)]
    assert sft_recipe.steps_for_tokens(lengths, 2, 0, 1) == 1
    assert sft_recipe.steps_for_tokens(lengths, 2, 0, batches[0]) == 1
    assert sft_recipe.steps_for_tokens(lengths, 2, 0, batches[0] + 1) == 2
    assert sft_recipe.steps_for_tokens(lengths, 2, 0, sum(batches[:3]) + 1) == 4  # into the 2nd epoch


def test_max_tokens_sets_the_steps(tiny_model_dir, tmp_path, smol_tokenizer):
    """--max-tokens B trains the fewest steps whose batches hold B tokens: here 3 (B one token over 2 steps')."""
    from rlft.recipes.sft import load_sft_examples

    cfg = make_cfg(tiny_model_dir, tmp_path / "run", max_steps=None, save_every=0)
    examples, _ = load_sft_examples(cfg, smol_tokenizer)
    two = sum(len(examples[i].input_ids) for step in range(2) for i in batch_indices(step, len(examples), 8, cfg.seed))
    train_sft(replace(cfg, max_tokens=two + 1))
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert sum(r["tokens"] for r in records[:2]) == two


def test_max_tokens_is_checked():
    with pytest.raises(OptionError, match="--max-tokens must be >= 1 \\(or unset\\), got 0"):
        SFTConfig(max_tokens=0, max_steps=None)
    with pytest.raises(OptionError, match="pass it or --max-steps, not both"):
        SFTConfig(max_tokens=100, max_steps=5)


# --------------------------------------------------------------------------- resume


def _interrupt_after_second_checkpoint(monkeypatch):
    """KeyboardInterrupt right after the 2nd checkpoint (step 4) has been written."""
    interrupt_after_checkpoints(monkeypatch, 2)
    return 4, 4  # last checkpoint step, last logged step at the interruption


def _interrupt_mid_step_6(monkeypatch):
    """KeyboardInterrupt in step 6's first forward: step 5 is logged but not checkpointed."""
    real = sft_recipe.sequence_logprobs
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5 * 2 + 1:  # 2 micro-batches per step
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sft_recipe, "sequence_logprobs", wrapper)
    return 4, 5


@pytest.mark.parametrize("interrupt", [_interrupt_after_second_checkpoint, _interrupt_mid_step_6])
def test_resume_reproduces_uninterrupted_run(run_a, tiny_model_dir, tmp_path, interrupt):
    cfg = make_cfg(tiny_model_dir, tmp_path / "run-b")
    with pytest.MonkeyPatch.context() as mp:
        ckpt_step, logged_step = interrupt(mp)
        with pytest.raises(KeyboardInterrupt):
            train_sft(cfg)
    assert latest_checkpoint(cfg.output_dir).name == f"step-{ckpt_step:08d}"
    assert [r["step"] for r in read_metrics(tmp_path / "run-b" / "metrics.jsonl")] == list(range(1, logged_step + 1))
    assert not (tmp_path / "run-b" / "model").exists()

    train_sft(replace(cfg, resume=True))

    a_weights, b_weights = load_weights(run_a["final"]), load_weights(tmp_path / "run-b" / "model")
    assert a_weights.keys() == b_weights.keys()
    for name in a_weights:
        assert torch.allclose(a_weights[name], b_weights[name], atol=1e-6, rtol=0), name
    a_metrics = read_metrics(run_a["dir"] / "metrics.jsonl")
    b_metrics = read_metrics(tmp_path / "run-b" / "metrics.jsonl")
    assert [r["step"] for r in b_metrics] == list(range(1, STEPS + 1))
    for ra, rb in zip(a_metrics, b_metrics):
        for key in ("loss/sft", "lr", "grad_norm", "tokens", "epoch", "tokens/trained_total", "flops/estimated"):
            assert rb[key] == pytest.approx(ra[key], abs=1e-6), (ra["step"], key)


def test_resume_with_longer_max_steps_goes_on_from_the_last_step(tiny_model_dir, tmp_path, rlft_log):
    """A finished 8-step run (constant rate) resumed with --max-steps 11 starts at its step-8 checkpoint, not at step 6
    (the last multiple of save_every=2), and ends with the weights and metrics of an 11-step run from the start; its
    last step, 11, no multiple of save_every, is checkpointed all the same."""
    constant = {"schedule": "constant"}
    extended = tmp_path / "extended"
    train_sft(make_cfg(tiny_model_dir, extended, **constant))
    train_sft(make_cfg(tiny_model_dir, extended, max_steps=11, resume=True, **constant))
    assert f"resuming from {extended / 'checkpoints' / 'step-00000008'} at step 8" in rlft_log.text
    assert "schedule is redrawn" not in rlft_log.text  # a constant rate is the same over 8 steps or 11
    assert latest_checkpoint(extended).name == "step-00000011"
    straight = train_sft(make_cfg(tiny_model_dir, tmp_path / "straight", max_steps=11, **constant))
    a_weights, b_weights = load_weights(straight), load_weights(extended / "model")
    for name in a_weights:
        assert torch.allclose(a_weights[name], b_weights[name], atol=1e-6, rtol=0), name
    a_metrics = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    b_metrics = read_metrics(extended / "metrics.jsonl")
    assert [r["step"] for r in b_metrics] == list(range(1, 12))
    for ra, rb in zip(a_metrics, b_metrics):
        assert rb["loss/sft"] == pytest.approx(ra["loss/sft"], abs=1e-6), ra["step"]
        assert rb["lr"] == ra["lr"] == 3e-3


def test_resume_with_longer_max_steps_redraws_a_cosine_schedule(run_a, tiny_model_dir, tmp_path, rlft_log):
    """run_a's cosine rate reaches 0 after its 8 steps; resumed to 11, steps 9-11 apply the cosine over 11 steps
    (3e-3 x (1 + cos(pi x s / 11)) / 2 at s = 8, 9, 10: by hand), not the checkpoint's 0, with a warning saying so."""
    import math
    import shutil

    extended = tmp_path / "extended"
    shutil.copytree(run_a["dir"], extended)  # a moved run folder resumes
    train_sft(make_cfg(tiny_model_dir, extended, max_steps=11, resume=True))
    rates = [r["lr"] for r in read_metrics(extended / "metrics.jsonl")]
    assert rates[7] == pytest.approx(3e-3 * (1 + math.cos(math.pi * 7 / 8)) / 2, rel=1e-9)  # the 8-step cosine
    assert rates[8:] == pytest.approx([3e-3 * (1 + math.cos(math.pi * s / 11)) / 2 for s in (8, 9, 10)], rel=1e-9)
    assert "--resume: the learning-rate schedule is redrawn over 11 steps; step 9 applies 0.0005177, not the " \
           "checkpoint's 0" in rlft_log.text


def test_resume_without_checkpoint_starts_from_scratch(tiny_model_dir, tmp_path, rlft_log):
    cfg = make_cfg(tiny_model_dir, tmp_path / "fresh", max_steps=1, save_every=0, resume=True)
    train_sft(cfg)
    assert "no checkpoint" in rlft_log.text
    assert [r["step"] for r in read_metrics(tmp_path / "fresh" / "metrics.jsonl")] == [1]


# --------------------------------------------------------------------------- data files


GOOD = {"prompt": "Q: 1+1?\nA:", "completion": " 2"}


@pytest.mark.parametrize(
    "bad_row, field, problem",
    [
        ({"prompt": "Q: 2+2?\nA:"}, "completion", "missing"),
        ({"completion": " 4"}, "prompt", "missing"),
        ({"prompt": "Q: 2+2?\nA:", "completion": 4}, "completion", "expected a string, got int"),
        ({"prompt": ["Q"], "completion": " 4"}, "prompt", "expected a string, got list"),
        ({"prompt": "Q: 2+2?\nA:", "completion": "  \n"}, "completion", "empty completion"),
    ],
)
def test_malformed_row_raises_data_error_naming_file_row_and_field(tmp_path, smol_tokenizer, bad_row, field, problem):
    path = write_jsonl_rows(tmp_path / "pairs.jsonl", [GOOD, GOOD, bad_row, GOOD])
    cfg = SFTConfig(data=str(path))
    with pytest.raises(DataError) as info:
        load_sft_pairs(cfg, smol_tokenizer)
    err = info.value
    assert (err.source, err.row, err.field) == (str(path), 2, field)
    assert str(path) in str(err) and "row 2" in str(err) and repr(field) in str(err) and problem in str(err)


def test_train_sft_stops_on_malformed_row(tmp_path, tiny_model_dir):
    path = write_jsonl_rows(tmp_path / "pairs.jsonl", [GOOD, {"prompt": "x", "completion": None}])
    with pytest.raises(DataError, match="row 1"):
        train_sft(make_cfg(tiny_model_dir, tmp_path / "run", data=str(path)))


def test_skip_invalid_skips_and_reports_count(tmp_path, smol_tokenizer, rlft_log):
    rows = [
        GOOD, {"prompt": "a"}, {"prompt": "b", "completion": 3}, {"prompt": "c", "completion": ""},
        {"prompt": "d", "completion": " e"}
    ]
    path = write_jsonl_rows(tmp_path / "pairs.jsonl", rows)
    pairs = load_sft_pairs(SFTConfig(data=str(path), skip_invalid=True), smol_tokenizer)
    assert pairs == [PromptCompletion(GOOD["prompt"], GOOD["completion"]), PromptCompletion("d", " e")]
    warnings = [r for r in rlft_log.records if r.levelno == logging.WARNING and r.name == "rlft"]
    assert len(warnings) == 1
    assert "skipped 3 invalid rows" in warnings[0].getMessage() and str(path) in warnings[0].getMessage()


def test_all_rows_invalid_is_an_error_even_when_skipping(tmp_path, smol_tokenizer):
    path = write_jsonl_rows(tmp_path / "pairs.jsonl", [{"prompt": "a"}])
    with pytest.raises(ValueError, match="no training examples"):
        load_sft_pairs(SFTConfig(data=str(path), skip_invalid=True), smol_tokenizer)


def test_custom_field_names(tmp_path, smol_tokenizer):
    path = write_jsonl_rows(tmp_path / "pairs.jsonl", [{"question": "Q?", "answer": " A"}])
    cfg = SFTConfig(data=str(path), prompt_field="question", completion_field="answer")
    assert load_sft_pairs(cfg, smol_tokenizer) == [PromptCompletion("Q?", " A")]


QUERY = "A conversation ... User: Using the numbers [1, 2, 3], ...\nAssistant: Let me solve this step by step."


def test_cog_behav_layout_detected_and_joined_with_newline(tmp_path, smol_tokenizer):
    rows = [
        {"query": QUERY, "completion": "<think> 1+2=3, 3*3=9.</think>\n<answer>(1 + 2) * 3</answer>", "extra": 1},
        {"query": QUERY + "\n", "completion": "<think>x</think>"},  # already separated: unchanged
        {"query": QUERY, "completion": " <think>y</think>"},  # already separated: unchanged
    ]
    path = write_jsonl_rows(tmp_path / "cog.jsonl", rows)
    pairs = load_sft_pairs(SFTConfig(data=str(path)), smol_tokenizer)
    assert pairs == [
        PromptCompletion(QUERY + "\n", rows[0]["completion"]),
        PromptCompletion(QUERY + "\n", "<think>x</think>"),
        PromptCompletion(QUERY, " <think>y</think>"),
    ]


def test_cog_behav_detected_when_first_row_is_invalid(tmp_path, smol_tokenizer, rlft_log):
    rows = [{"query": QUERY}, {"query": QUERY, "completion": "<think>x</think>"}]
    path = write_jsonl_rows(tmp_path / "cog.jsonl", rows)
    pairs = load_sft_pairs(SFTConfig(data=str(path), skip_invalid=True), smol_tokenizer)
    assert pairs == [PromptCompletion(QUERY + "\n", "<think>x</think>")]
    assert "skipped 1 invalid rows" in rlft_log.text
    with pytest.raises(DataError) as info:
        load_sft_pairs(SFTConfig(data=str(path)), smol_tokenizer)
    assert (info.value.row, info.value.field) == (0, "completion")


def test_limit_caps_examples(tmp_path, smol_tokenizer):
    path = write_jsonl_rows(tmp_path / "pairs.jsonl", [GOOD] * 5)
    assert len(load_sft_pairs(SFTConfig(data=str(path), limit=3), smol_tokenizer)) == 3


def test_countdown_traces_correct_only(smol_tokenizer):
    from rlft.rewards.countdown import score_completions

    base = SFTConfig(data="countdown", preset="standard", num_train=60, trace_style="bounded", give_up=0.6,
                     prompt_template="short")
    every = load_sft_pairs(base, smol_tokenizer)
    correct = load_sft_pairs(replace(base, correct_only=True), smol_tokenizer)
    ok = [
        s == 1.0 for s in score_completions([p.prompt for p in every], [p.completion for p in every
                                                                        ], [_truth(p.prompt) for p in every])
    ]
    assert 0 < len(correct) < len(every) and correct == [p for p, good in zip(every, ok) if good]


def test_countdown_traces_skip_the_heldout_rows_of_a_dataset(smol_tokenizer, tmp_path):
    from rlft.tasks.countdown.generator import PRESETS, generate_tasks, make_splits, task_key
    from rlft.tasks.countdown.splits import load_split

    base = SFTConfig(data="countdown", preset="standard", num_train=300, heldout_size=10, trace_style="direct",
                     prompt_template="short")
    train, _ = make_splits(PRESETS["standard"], 300, 10, base.split_seed)
    # a dataset whose rows are those very tasks and 1,500 others: some of the 300 land in its held-out block
    others = generate_tasks(PRESETS["standard"], 1500, seed=5)
    data = write_jsonl_rows(tmp_path / "rows.jsonl",
                            [{"target": t.target, "nums": list(t.nums)} for t in train + others])
    held = load_split(str(data)).heldout_keys()
    overlap = sum(task_key(t) in held for t in train)
    assert overlap > 0
    pairs = load_sft_pairs(replace(base, heldout_data=str(data)), smol_tokenizer)
    assert len(pairs) == 300 - overlap
    assert not {(tuple(sorted(t["numbers"])), t["target"]) for t in map(_truth, (p.prompt for p in pairs))} & held


def _truth(prompt: str) -> dict:
    from rlft.tasks.countdown.prompts import parse_query

    nums, target = parse_query(prompt)
    return {"target": target, "numbers": list(nums)}


# --------------------------------------------------------------------------- tokenization report


def test_truncation_and_drops_are_counted_and_logged(smol_tokenizer, rlft_log):
    tok = smol_tokenizer
    max_length = 16
    pairs = [
        PromptCompletion("Q: 1+1?\nA:", " 2"),  # fits
        PromptCompletion("Q: count\nA:", " one two three four five six seven eight nine ten eleven"),  # cut
        PromptCompletion("Q: spell\nA:", " a b c d e f g h i j k l m n o p"),  # cut
        PromptCompletion("word " * 30, " x"),  # prompt alone too long: dropped
    ]
    expected_truncated = sum(
        len(tok(p.prompt).input_ids) < max_length
        and len(tok(p.prompt).input_ids) + len(tok(p.completion, add_special_tokens=False).input_ids) + 1 > max_length
        for p in pairs
    )
    assert expected_truncated == 2
    examples = tokenize_pairs(pairs, tok, max_length)
    assert len(examples) == 3 and sum(e.truncated for e in examples) == 2
    assert all(len(e.input_ids) <= max_length for e in examples)
    assert "3 examples; 2 truncated to 16 tokens; 1 dropped" in rlft_log.text


def test_train_sft_reports_truncation_with_small_max_length(tiny_model_dir, tmp_path, rlft_log):
    train_sft(make_cfg(tiny_model_dir, tmp_path / "short", max_length=40, max_steps=1, save_every=0))
    line = next(r.getMessage() for r in rlft_log.records if "truncated to 40 tokens" in r.getMessage())
    truncated = int(line.split("; ")[1].split()[0])
    assert truncated > 0, line


# --------------------------------------------------------------------------- data order


def test_length_grouped_sorts_only_a_step_that_spans_micro_batches():
    length = {5: 3, 2: 7, 9: 1, 1: 7}.__getitem__
    assert length_grouped([5, 2, 9, 1], length, micro_batch_size=2) == [9, 5, 2, 1]  # stable: 2 before 1 (both 7)
    assert length_grouped([5, 2, 9, 1], length, micro_batch_size=4) == [5, 2, 9, 1]  # one micro-batch: as drawn
    assert length_grouped([], length, micro_batch_size=1) == []


def test_batch_indices_cover_each_epoch_once_and_are_pure():
    n, bs = 21, 4  # 6 steps per epoch, the last one a partial batch of 1
    for epoch in range(3):
        batches = [batch_indices(epoch * 6 + s, n, bs, seed=3) for s in range(6)]
        assert [len(b) for b in batches] == [4, 4, 4, 4, 4, 1]
        assert sorted(i for b in batches for i in b) == list(range(n))
    assert batch_indices(7, n, bs, seed=3) == batch_indices(7, n, bs, seed=3)
    assert batch_indices(0, n, bs, seed=3) != batch_indices(6, n, bs, seed=3)  # reshuffled per epoch
    assert batch_indices(0, n, bs, seed=3) != batch_indices(0, n, bs, seed=4)


def test_batch_size_must_be_multiple_of_micro_batch(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="multiple"):
        train_sft(make_cfg(tiny_model_dir, tmp_path / "x", batch_size=6, micro_batch_size=4))
