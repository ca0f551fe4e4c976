"""`rlft pairs countdown`: best-vs-worst selection, ties dropped and counted, the JSONL schema, prompts
from the training split, temperature 0 refused; with a fake engine, and once with a tiny model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import rlft.recipes.pairs as pairs_recipe
from rlft.checkpoint import weights_fingerprint
from rlft.data.files import read_jsonl
from rlft.recipes.dpo import DPOConfig
from rlft.recipes.dpo_data import TextPair, load_text_pairs
from rlft.recipes.pairs import PairsConfig, best_and_worst, load_pair_tasks, make_countdown_pairs, stats_path
from rlft.rewards.countdown import score_completions
from rlft.rollout.base import Sample, SamplingParams
from rlft.tasks.countdown.generator import PRESETS, make_splits, task_key

from tests.conftest import ASSETS, make_tiny_model, save_model_dir, write_jsonl_rows

torch.set_num_threads(1)

SCHEMA = {"prompt", "chosen", "rejected", "score_chosen", "score_rejected", "nums", "target",
          "chosen_finish_reason", "rejected_finish_reason"}


class FakeEngine:
    """Returns ``texts[b]`` (one list of k strings per prompt) and records the calls."""

    tokenizer = None

    def __init__(self, texts_for):
        self.texts_for = texts_for  # (prompt index, k) -> list of k texts
        self.calls: list[tuple[list[str], SamplingParams]] = []

    def generate(self, prompts, params):
        self.calls.append((list(prompts), params))
        return [[Sample([1, 2], text, "stop") for text in self.texts_for(b, params.k)] for b in range(len(prompts))]


def cfg_for(tmp_path: Path, **overrides) -> PairsConfig:
    base = PairsConfig(model=str(tmp_path / "no-model-needed"), preset="tiny", num_prompts=4, device="cpu",
                       output=str(tmp_path / "pairs" / "countdown.jsonl"))
    return replace(base, **overrides)


def save_tiny_model(folder: Path, tokenizer, seed: int = 0) -> Path:
    """A tiny random model of ``seed`` (its end-of-sequence token the tokenizer's) saved with ``tokenizer`` in
    ``folder`` (:func:`tests.conftest.save_model_dir`)."""
    model = make_tiny_model(len(tokenizer), seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return save_model_dir(folder, model, tokenizer)


def correct(task) -> str:
    return f" reasoning</think>\n<answer>{task.solution}</answer>"


WRONG = " hmm</think>\n<answer>1 + 1 + 1 + 1 + 1</answer>"  # an answer, wrong numbers: 0.1
NONE = " I give up"  # no answer: 0.0


# --------------------------------------------------------------------------- selection


@pytest.mark.parametrize("scores, expected", [
    ([1.0, 0.0], (0, 1)),
    ([0.0, 1.0], (1, 0)),
    ([0.1, 1.0, 0.0, 1.0], (1, 2)),  # first best, first worst
    ([0.1, 0.1, 0.1], None),
    ([0.0, 0.0], None),
    ([1.0, 1.0], None),
])
def test_best_and_worst(scores, expected):
    assert best_and_worst(scores) == expected


def test_ties_dropped_counted_and_chosen_scores_higher(tmp_path):
    cfg = cfg_for(tmp_path)
    tasks = load_pair_tasks(cfg)
    plan = [  # per prompt: the two responses (with the real scorer: 1.0 / 0.1 / 0.0)
        [WRONG, correct(tasks[0])],  # kept: chosen = correct (1.0), rejected = wrong (0.1)
        [NONE, NONE],  # tie at 0
        [NONE, WRONG],  # kept: 0.1 vs 0
        [correct(tasks[3]), correct(tasks[3])],  # tie at 1
    ]
    engine = FakeEngine(lambda b, k: plan[b])
    stats = make_countdown_pairs(cfg, engine=engine)

    assert (stats["prompts"], stats["kept"], stats["dropped_ties"]) == (4, 2, 2)
    assert stats["ties_by_score"] == {"0": 1, "1": 1}
    rows = read_jsonl(cfg.output)
    assert [set(r) for r in rows] == [SCHEMA, SCHEMA]
    assert [r["chosen"] for r in rows] == [correct(tasks[0]), WRONG]
    assert [r["rejected"] for r in rows] == [WRONG, NONE]
    assert [(r["score_chosen"], r["score_rejected"]) for r in rows] == [(1.0, 0.1), (0.1, 0.0)]
    assert all(r["score_chosen"] > r["score_rejected"] for r in rows)
    assert [(r["nums"], r["target"]) for r in rows] == [(list(tasks[i].nums), tasks[i].target) for i in (0, 2)]
    assert all(isinstance(n, int) for r in rows for n in r["nums"]) and all(isinstance(r["target"], int) for r in rows)
    # The prompt is the rendered template, and the stored scores are what the scorer gives it.
    prompts = engine.calls[0][0]
    assert rows[0]["prompt"] == prompts[0] and rows[1]["prompt"] == prompts[2]
    for r in rows:
        gt = {"target": r["target"], "numbers": r["nums"]}
        assert score_completions([r["prompt"]] * 2, [r["chosen"], r["rejected"]],
                                 [gt, gt]) == [r["score_chosen"], r["score_rejected"]]
    # Stats file next to the output, same counts.
    on_disk = json.loads(stats_path(cfg.output).read_text())
    assert stats_path(cfg.output) == tmp_path / "pairs" / "countdown.stats.json"
    assert (on_disk["prompts"], on_disk["kept"], on_disk["dropped_ties"]) == (4, 2, 2)


def test_more_samples_pick_best_versus_worst(tmp_path, monkeypatch):
    table = {  # per prompt: scores of its 4 samples (stubbed scorer)
        0: [0.1, 1.0, 0.0, 1.0],
        1: [0.1, 0.1, 0.1, 0.1],
        2: [0.0, 0.1, 0.1, 0.0],
    }
    calls = []

    def fake_scorer(prompts, completions, ground_truths):
        b = int(completions[0].split(":")[0])  # texts are "b:j"
        calls.append(b)
        return table[b]

    monkeypatch.setattr(pairs_recipe, "score_completions", fake_scorer)
    cfg = cfg_for(tmp_path, num_prompts=3, num_samples=4)
    engine = FakeEngine(lambda b, k: [f"{b}:{j}" for j in range(k)])
    stats = make_countdown_pairs(cfg, engine=engine)
    assert engine.calls[0][1].k == 4 and sorted(calls) == [0, 1, 2]
    rows = read_jsonl(cfg.output)
    assert [(r["chosen"], r["rejected"]) for r in rows] == [("0:1", "0:2"), ("2:1", "2:0")]
    assert [(r["score_chosen"], r["score_rejected"]) for r in rows] == [(1.0, 0.0), (0.1, 0.0)]
    assert (stats["kept"], stats["dropped_ties"], stats["ties_by_score"]) == (2, 1, {"0.1": 1})


def test_sampling_parameters_passed_to_engine(tmp_path):
    cfg = cfg_for(tmp_path, num_samples=3, temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=17, seed=11)
    engine = FakeEngine(lambda b, k: [NONE] * k)
    stats = make_countdown_pairs(cfg, engine=engine)
    params = engine.calls[0][1]
    assert (params.k, params.temperature, params.top_p, params.top_k, params.max_new_tokens,
            params.seed) == (3, 0.7, 0.9, 5, 17, 11)
    assert stats["kept"] == 0 and read_jsonl(cfg.output) == []  # all tied: an empty file, still written


@pytest.mark.parametrize("overrides, match", [
    ({"temperature": 0.0}, "temperature must be > 0"),
    ({"temperature": -1.0}, "--temperature must be >= 0, got -1.0"),
    ({"num_samples": 1}, "num_samples must be >= 2"),
])
def test_invalid_settings_raise_before_any_work(tmp_path, overrides, match):
    # The model path does not exist: the error must come before any attempt to load it.
    with pytest.raises(ValueError, match=match):
        make_countdown_pairs(cfg_for(tmp_path, **overrides))
    assert not Path(cfg_for(tmp_path).output).exists()


# --------------------------------------------------------------------------- prompts


def test_prompts_are_training_tasks_never_heldout(tmp_path):
    cfg = cfg_for(tmp_path, num_prompts=6, start=2, heldout_size=50, split_seed=7)
    tasks = load_pair_tasks(cfg)
    train, test = make_splits(PRESETS["tiny"], 8, 50, 7)
    assert tasks == train[2:8]
    assert not {task_key(t) for t in tasks} & {task_key(t) for t in test}


def test_tasks_from_a_countdown_file(tmp_path):
    from rlft.tasks.countdown.loaders import load_countdown

    source = ASSETS / "countdown" / "tasks_3to4.jsonl"
    cfg = cfg_for(tmp_path, data=str(source), num_prompts=2, start=1, data_heldout=False)
    assert load_pair_tasks(cfg) == load_countdown(source)[1:3]
    with pytest.raises(ValueError,
                       match="too few distinct .* --no-data-heldout"):  # a 12-row file holds no held-out block
        load_pair_tasks(cfg_for(tmp_path, data=str(source), num_prompts=2))


def test_tasks_from_a_dataset_never_include_its_heldout_rows(tmp_path):
    from rlft.tasks.countdown.generator import PRESETS, generate_tasks, task_key
    from rlft.tasks.countdown.splits import load_split

    rows = generate_tasks(PRESETS["standard"], 1600, seed=9)
    source = write_jsonl_rows(tmp_path / "rows.jsonl", [{"target": t.target, "nums": list(t.nums)} for t in rows])
    split = load_split(str(source))
    tasks = load_pair_tasks(cfg_for(tmp_path, data=str(source), num_prompts=50, start=10))
    assert tasks == split.train[10:60] and not {task_key(t) for t in tasks} & split.heldout_keys()


# --------------------------------------------------------------------------- with a real (tiny) model


def test_end_to_end_with_tiny_model_and_stubbed_scorer(tmp_path, smol_tokenizer, monkeypatch):
    folder = save_tiny_model(tmp_path / "tiny", smol_tokenizer)
    calls = []

    def alternating(prompts, completions, ground_truths):
        calls.append(list(completions))
        return [0.0, 1.0] if len(calls) % 2 else [0.1, 0.1]

    monkeypatch.setattr(pairs_recipe, "score_completions", alternating)
    cfg = cfg_for(tmp_path, model=str(folder), num_prompts=3, prompt_template="short", max_new_tokens=6,
                  dtype="float32")
    stats = make_countdown_pairs(cfg)
    assert (stats["prompts"], stats["kept"], stats["dropped_ties"]) == (3, 2, 1)
    rows = read_jsonl(cfg.output)
    assert [set(r) for r in rows] == [SCHEMA, SCHEMA]
    assert [r["chosen"] for r in rows] == [calls[0][1], calls[2][1]]  # the sample scored 1.0
    assert [r["rejected"] for r in rows] == [calls[0][0], calls[2][0]]
    assert all(r["prompt"].endswith("Assistant: <think>") for r in rows)
    # The DPO recipe reads the file as it is.
    pairs = load_text_pairs(DPOConfig(data=cfg.output, skip_invalid=True))
    assert all(isinstance(p, TextPair) for p in pairs)


# --------------------------------------------------------------------------- killed and resumed


def test_killed_pair_sampling_resumes_from_its_journal(tmp_path):
    """Sampling goes in chunks of 64 prompts, each journalled; a run killed after its first chunk, started again with
    the same options, samples only the rest and writes the same pairs as an uninterrupted run."""
    cfg = cfg_for(tmp_path, preset="easy3", num_prompts=70)
    tasks = load_pair_tasks(cfg)
    plan = {}

    class KeyedEngine(FakeEngine):  # texts by prompt, not by position in the call; killed on call `kill_at`
        def __init__(self, kill_at=None):
            super().__init__(None)
            self.kill_at = kill_at

        def generate(self, prompts, params):
            if self.kill_at is not None and len(self.calls) == self.kill_at:
                raise KeyboardInterrupt
            self.calls.append((list(prompts), params))
            return [[Sample([1, 2], text, "stop") for text in plan[p]] for p in prompts]

    from rlft.tasks.countdown.prompts import render_prompt

    for i, task in enumerate(tasks):
        plan[render_prompt(cfg.prompt_template, task, None)] = [WRONG, correct(task)] if i % 3 else [NONE, NONE]
    whole = make_countdown_pairs(replace(cfg, output=str(tmp_path / "whole" / "p.jsonl")), engine=KeyedEngine())

    killed = KeyedEngine(kill_at=1)
    with pytest.raises(KeyboardInterrupt):
        make_countdown_pairs(cfg, engine=killed)
    assert not Path(cfg.output).exists() and len(pairs_recipe.journal_path(
        cfg.output).read_text().splitlines()) == 1 + 64
    resumed_engine = KeyedEngine()
    resumed = make_countdown_pairs(cfg, engine=resumed_engine)
    assert [len(p) for p, _ in resumed_engine.calls] == [6]
    assert resumed_engine.calls[0][1].seed == cfg.seed + 1_000_003  # chunk 1's seed, as in the uninterrupted run
    assert read_jsonl(cfg.output) == read_jsonl(tmp_path / "whole" / "p.jsonl")
    assert (resumed["kept"], resumed["dropped_ties"]) == (whole["kept"], whole["dropped_ties"]) == (46, 24)
    with pytest.raises(ValueError, match="differs in temperature"):  # the journal is not mixed with other options
        make_countdown_pairs(replace(cfg, temperature=0.7), engine=KeyedEngine())


def test_a_journal_from_other_weights_at_the_same_path_is_refused(tmp_path, smol_tokenizer):
    """The journal's meta names the model's weights by their SHA-256: the same weights, copied (a new mtime), continue
    it; an earlier model's samples are never mixed into a run of other weights saved at the same path."""
    import hashlib
    import os

    folder = save_tiny_model(tmp_path / "tiny", smol_tokenizer)
    weights = folder / "model.safetensors"
    assert [name for name, *_ in weights_fingerprint(str(folder))] == ["model.safetensors"]
    assert weights_fingerprint("smollm2-135m") == []
    cfg = cfg_for(tmp_path, model=str(folder), num_prompts=2, prompt_template="short", max_new_tokens=4,
                  dtype="float32")
    make_countdown_pairs(cfg)
    meta = json.loads(pairs_recipe.journal_path(cfg.output).read_text().splitlines()[0])["meta"]
    assert meta["model_weights"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    Path(cfg.output).unlink()
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # copied: a new mtime
    make_countdown_pairs(cfg)  # the same weights: everything read back from the journal
    Path(cfg.output).unlink()
    save_tiny_model(folder, smol_tokenizer, seed=1)  # "rebuilt": other weights at the same path
    with pytest.raises(ValueError, match="differs in model_weights"):
        make_countdown_pairs(cfg)


def test_a_journal_that_names_the_weights_by_mtime_is_continued_while_they_match(tmp_path, smol_tokenizer):
    """A journal written before 2026-12-02 names the weights files by [name, bytes, mtime_ns]: it is continued while
    those files are untouched, and refused (another run's) once they change."""
    import os

    folder = save_tiny_model(tmp_path / "tiny", smol_tokenizer)
    cfg = cfg_for(tmp_path, model=str(folder), num_prompts=2, prompt_template="short", max_new_tokens=4,
                  dtype="float32")
    make_countdown_pairs(cfg)
    journal = pairs_recipe.journal_path(cfg.output)
    lines = journal.read_text().splitlines()
    first = json.loads(lines[0])
    first["meta"]["model_weights"] = weights_fingerprint(str(folder))  # as written before 2026-12-02
    journal.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    Path(cfg.output).unlink()
    assert pairs_recipe.journal_meta(cfg, 4)["model_weights"] == first["meta"]["model_weights"]
    make_countdown_pairs(cfg)  # continued: its samples read back
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    Path(cfg.output).unlink()
    with pytest.raises(ValueError, match="differs in model_weights"):
        make_countdown_pairs(cfg)
