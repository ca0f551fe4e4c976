"""RLOO on chat prompts with a learned reward (the UltraFeedback track), on tiny random models.

- prompt ids: a chat-template prompt is encoded without the tokenizer's special tokens, by one
  function shared by the sampler and the training batch (a Llama-3-style tokenizer that adds BOS
  would otherwise give two);
- a run on the hand-made H4 fixture and on the first rows of the real UltraFeedback file: the
  policy sees exactly ``render_generation_prompt(...)``, the teacher-forced rows are exactly the
  sampled (prompt ids, completion ids), the rewards are the reward model's scores, the held-out
  prompt is only evaluated; metrics.jsonl has reward stats and ``eval/reward``;
- the truncation penalty is added to the raw reward of exactly the samples without an EOS;
- a stub "reward model" (1.0 for a response starting with an uppercase letter) is learned, and
  the reward is built once per run.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import rlft.losses.advantages as advantages_module
import rlft.rl.sampling as rl_sampling
import rlft.rollout.hf as rollout_hf
from rlft.checkpoint import read_metrics
from rlft.data.chat import CHAT_TEMPLATES, ensure_chat_template, render_generation_prompt
from rlft.data.preferences import load_preference_pairs
from rlft.models import load_tokenizer
from rlft.recipes.rl import train_rl
from rlft.rl.batch import rollout_batch
from rlft.rl.config import RLConfig, rloo_config
from rlft.rewards.reward_model import RewardModelScorer
from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.hf import HFEngine, encode_prompts

from tests.conftest import ASSETS, SHARED_DATA, make_tiny_model, make_tiny_rm, save_model_dir

torch.set_num_threads(1)

H4 = ASSETS / "chat" / "h4_train_prefs.jsonl"
UF = SHARED_DATA / "ultrafeedback" / "train_clean.jsonl"
LLAMA3_MARKERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


# --------------------------------------------------------------------------- fixtures and helpers


def llama3_style(qwen_tokenizer):
    """The Qwen tokenizer dressed as Llama-3: its markers as special tokens, the llama3 template (which
    writes <|begin_of_text|>), and, like Llama-3's tokenizer, BOS added by ``tokenizer(text)``."""
    from tokenizers import processors

    tok = copy.deepcopy(qwen_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": LLAMA3_MARKERS})
    tok.bos_token, tok.eos_token, tok.pad_token = "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>"
    tok._tokenizer.post_processor = processors.Sequence([
        tok._tokenizer.post_processor,
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", tok.bos_token_id)]),
    ])  # fmt: skip
    return ensure_chat_template(tok, "llama3")


def save_policy(folder: Path, tokenizer, *, stop_ids: list[int] | None = None) -> Path:
    """A tiny random Llama (seed 0) for ``tokenizer``, saved with it. With SmolLM2's own tokenizer and
    template the policy is the shared ``tiny_model_dir`` fixture (runs pass --chat-template chatml)."""
    model = make_tiny_model(len(tokenizer), seed=0)
    if stop_ids is not None:  # extra EOS ids, so that a random model stops early about half the time
        model.generation_config.eos_token_id = stop_ids
    return save_model_dir(folder, model, tokenizer)


@pytest.fixture(scope="module")
def chatml_tokenizer(smol_tokenizer):
    return ensure_chat_template(copy.deepcopy(smol_tokenizer), "chatml")


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory, chatml_tokenizer) -> Path:
    """A tiny random reward model (SmolLM2 vocabulary, ChatML), saved like `rlft rm` saves one."""
    return save_model_dir(tmp_path_factory.mktemp("tiny-rm"), make_tiny_rm(chatml_tokenizer, seed=1), chatml_tokenizer)


def make_cfg(policy: Path, output_dir: Path, **overrides) -> RLConfig:
    cfg = rloo_config(
        model=str(policy),
        prompts_data=str(H4),
        chat_template="chatml",
        output_dir=str(output_dir),
        k=2,
        prompts_per_step=4,
        max_steps=2,
        lr=1e-2,
        beta=0.0,
        max_new_tokens=4,
        eval_every=0,
        eval_max_new_tokens=3,
        micro_batch_size=8,
        save_every=0,
        device="cpu",
        dtype="float32",
    )
    return replace(cfg, **overrides)


class Recorder:
    """Records what the recipe's engine generated from and the teacher-forcing batches it built."""

    def __init__(self, monkeypatch):
        self.generate_calls: list[tuple[list[str], SamplingParams]] = []
        self.generated: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()  # (prompt ids, completion ids) rows
        self.batches: list[tuple[list[str], list[list[Sample]], object]] = []
        recorder = self

        class RecordingEngine(HFEngine):
            def generate(self, prompts, params):
                recorder.generate_calls.append((list(prompts), params))
                out = super().generate(prompts, params)
                ids = self.encode_prompts(prompts) if prompts else []  # what generate conditioned on
                recorder.generated.update((tuple(p), tuple(s.completion_ids)) for p, row in zip(ids, out) for s in row)
                return out

        real_rollout_batch = rl_sampling.rollout_batch

        def recording_rollout_batch(tokenizer, prompts, samples, **kwargs):
            batch = real_rollout_batch(tokenizer, prompts, samples, **kwargs)
            self.batches.append((list(prompts), samples, batch))
            return batch

        monkeypatch.setattr(rollout_hf, "HFEngine", RecordingEngine)  # what make_engine builds
        monkeypatch.setattr(rl_sampling, "rollout_batch", recording_rollout_batch)  # sample_step builds the batch

    def training_prompts(self) -> list[str]:
        return [p for prompts, params in self.generate_calls if params.temperature > 0 for p in prompts]

    def eval_prompts(self) -> list[str]:
        return [p for prompts, params in self.generate_calls if params.temperature == 0 for p in prompts]

    def check_rows_are_samples(self, tokenizer) -> None:
        """Every teacher-forced row is exactly a sampled (prompt ids, completion ids) pair, and its prompt
        ids are the chat-template encoding (no special tokens added)."""
        for prompts, samples, batch in self.batches:
            k = len(samples[0])
            for row in range(batch.input_ids.shape[0]):
                n = int(batch.attention_mask[row].sum())
                start = int(batch.loss_mask[row].nonzero()[0])
                ids = batch.input_ids[row, :n].tolist()
                assert (tuple(ids[:start]), tuple(ids[start:])) in self.generated
                assert ids[:start] == tokenizer(prompts[row // k], add_special_tokens=False)["input_ids"]


def chat_prompts(path: Path, limit: int | None = None) -> list[list[dict]]:
    pairs, _ = load_preference_pairs(path, limit=limit, skip_invalid=True)
    return [p.prompt for p in pairs]


# --------------------------------------------------------------------------- prompt ids


def test_chat_prompts_get_one_bos_in_generation_and_training(qwen_tokenizer, monkeypatch):
    tok = llama3_style(qwen_tokenizer)
    bos = tok.bos_token_id
    text = render_generation_prompt(tok, [{"role": "user", "content": "Hi there"}])
    assert text.startswith("<|begin_of_text|>")
    assert encode_prompts(tok, [text])[0][:2] == [bos, bos]  # the pitfall: the tokenizer's defaults add a second BOS
    engine = HFEngine(make_tiny_model(len(tok)), tok, add_special_tokens=False)
    ids = engine.encode_prompts([text])[0]
    assert ids == tok(text, add_special_tokens=False)["input_ids"] and ids[0] == bos and ids.count(bos) == 1

    fed = []  # the prompt ids of every job the (default, continuous-batching) sampler decoded
    from rlft.rollout import hf

    real = hf.decode_jobs
    monkeypatch.setattr(hf, "decode_jobs", lambda model, prompts, jobs, *a, **kw:
                        fed.extend(prompts[i] for i, _ in jobs) or real(model, prompts, jobs, *a, **kw))
    samples = engine.generate([text], SamplingParams(k=2, temperature=1.0, max_new_tokens=3, seed=0))
    assert fed == [ids, ids]  # what the model was conditioned on
    batch = rollout_batch(tok, [text], samples, add_special_tokens=engine.add_special_tokens)
    for j, sample in enumerate(samples[0]):
        assert batch.input_ids[j, : len(ids) + len(sample.completion_ids)].tolist() == ids + sample.completion_ids


# --------------------------------------------------------------------------- runs with a reward model


def test_h4_fixture_run_with_reward_model(tiny_model_dir, rm_folder, chatml_tokenizer, tmp_path, monkeypatch):
    recorder = Recorder(monkeypatch)
    out = tmp_path / "h4"
    final = train_rl(make_cfg(tiny_model_dir, out, reward_model=str(rm_folder), eval_every=2, eval_prompts=1))

    conversations = chat_prompts(H4)  # 5 prompts: the last one is held out for evaluation
    texts = [render_generation_prompt(chatml_tokenizer, m) for m in conversations]
    assert sorted(set(recorder.training_prompts())) == sorted(texts[:4])
    assert recorder.eval_prompts() == [texts[4]] * 2  # step 0 and the last step, never trained on
    recorder.check_rows_are_samples(chatml_tokenizer)

    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert [r["step"] for r in records if "eval/reward" in r] == [0, 2]
    for key in ("reward/mean", "reward/std", "reward/shaped_mean", "adv/std", "entropy", "completion/truncated_frac",
                "loss/policy"):
        assert key in records[1], key
    assert "reward/accuracy" not in records[1] and "reward/format_rate" not in records[
        1]  # meaningless for a reward model

    # the step's rewards are the reward model's scores of (prompt messages, completion)
    by_text = dict(zip(texts, conversations))
    prompts, samples, _ = recorder.batches[0]
    scorer = RewardModelScorer(str(rm_folder), device="cpu", dtype="float32")
    expected = scorer.score([by_text[p] for p in prompts for _ in samples[0]], [s.text for row in samples for s in row])
    assert records[1]["reward/mean"] == pytest.approx(sum(expected) / len(expected), abs=1e-5)
    assert load_tokenizer(str(final)).chat_template == CHAT_TEMPLATES["chatml"]  # saved with the model


def test_real_ultrafeedback_prompts_llama3_template(qwen_tokenizer, rm_folder, tmp_path, monkeypatch):
    """A Llama-3-style policy tokenizer (adds BOS itself) on the first UltraFeedback prompts; the reward
    model has its own tokenizer and template."""
    if not UF.is_file():
        pytest.skip(f"{UF} is missing")
    tok = llama3_style(qwen_tokenizer)
    policy = save_policy(tmp_path / "policy", tok)
    recorder = Recorder(monkeypatch)
    out = tmp_path / "uf"
    cfg = make_cfg(policy, out, prompts_data=str(UF), prompts_limit=8, chat_template=None, max_prompt_tokens=200,
                   reward_model=str(rm_folder), max_steps=1, eval_every=1, eval_prompts=2, max_new_tokens=3)
    train_rl(cfg)

    rendered = [render_generation_prompt(tok, m) for m in chat_prompts(UF, limit=8)]
    kept = [t for t in rendered if len(tok(t, add_special_tokens=False)["input_ids"]) <= 200]
    train_texts, eval_texts = kept[:-2], kept[-2:]
    assert set(recorder.training_prompts()) <= set(train_texts) and len(recorder.training_prompts()) == 4
    assert recorder.eval_prompts() == eval_texts * 2
    recorder.check_rows_are_samples(tok)
    bos = tok.bos_token_id
    for _, _, batch in recorder.batches:
        assert (batch.input_ids[:, 0] == bos).all() and (batch.input_ids[:, 1] != bos).all()  # one BOS, never two
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1]
    assert "eval/reward" in records[0] and "eval/reward" in records[1] and "reward/std" in records[1]


# --------------------------------------------------------------------------- truncation penalty, remote wiring


def test_truncation_penalty_lowers_exactly_the_length_limited_samples(smol_tokenizer, tmp_path, monkeypatch):
    """reward = raw + penalty for samples that hit max_new_tokens without an EOS, raw otherwise; checked on
    the rewards handed to the leave-one-out baseline. The reward comes from a stubbed remote judge."""
    # About half the vocabulary stops generation, so 2-token samples are a mix of "stop" and "length".
    stop = {smol_tokenizer.eos_token_id, *range(3, len(smol_tokenizer), 2)}
    policy = save_policy(tmp_path / "stoppy", smol_tokenizer, stop_ids=sorted(stop))
    judges = []

    class StubJudge:
        def __init__(self, base_url, model, *, api_key_env, timeout_s, max_retries):
            judges.append((base_url, model, api_key_env, timeout_s, max_retries))

        def score(self, prompts, responses):
            assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts)
            return [0.1 * (len(r) % 5) for r in responses]

    monkeypatch.setattr("rlft.rewards.remote.RemoteRewardJudge", StubJudge)
    seen = []
    real_advantages = advantages_module.rloo_advantages
    monkeypatch.setitem(advantages_module.ADVANTAGES, "rloo",
                        lambda rewards: seen.append(rewards.clone()) or real_advantages(rewards))
    recorder = Recorder(monkeypatch)
    cfg = make_cfg(policy, tmp_path / "trunc", reward="remote", base_url="http://judge.invalid/v1",
                   judge_model="stub-rm", api_key_env="STUB_KEY", k=4, max_new_tokens=2, truncation_penalty=-0.5)
    train_rl(cfg)

    assert judges == [("http://judge.invalid/v1", "stub-rm", "STUB_KEY", 60.0, 5)]  # the judge options reach it
    finishes = []
    for (_, samples, _), rewards in zip(recorder.batches, seen, strict=True):
        flat = [s for row in samples for s in row]
        raw = torch.tensor([0.1 * (len(s.text) % 5) for s in flat])
        truncated = torch.tensor([s.finish_reason == "length" for s in flat])
        for s in flat:  # "length": 2 tokens, none of them a stop id; "stop": ends with one
            assert (len(s.completion_ids) == 2 and
                    not stop & set(s.completion_ids)) if s.finish_reason == "length" else s.completion_ids[-1] in stop
        assert torch.equal(rewards.flatten(), torch.where(truncated, raw + (-0.5), raw))
        finishes += [s.finish_reason for s in flat]
    assert "stop" in finishes and "length" in finishes  # both cases were exercised
    records = read_metrics(tmp_path / "trunc" / "metrics.jsonl")
    for r in records:  # raw mean before the penalty; shaped mean after it (beta = 0)
        assert r["reward/shaped_mean"] == pytest.approx(r["reward/mean"] - 0.5 * r["completion/truncated_frac"],
                                                        abs=1e-6)


# --------------------------------------------------------------------------- learning, reward built once


def test_stub_reward_model_is_learned_and_built_once(tiny_model_dir, tmp_path, monkeypatch):
    """A stub "reward model" paying 1.0 for a response starting with an uppercase letter: mean reward rises
    within 40 steps on chat prompts, and the scorer is constructed once for the whole run."""
    built, calls = [], []

    class UppercaseScorer:
        def __init__(self, model_or_path, **kwargs):
            built.append(model_or_path)

        def score(self, prompts, responses):
            calls.append(len(responses))
            assert all(isinstance(p, list) for p in prompts)  # message lists, not rendered text
            return [1.0 if r.lstrip()[:1].isupper() else 0.0 for r in responses]

    monkeypatch.setattr("rlft.rewards.reward_model.RewardModelScorer", UppercaseScorer)
    out = tmp_path / "learn"
    cfg = make_cfg(tiny_model_dir, out, reward_model="stub-rm", max_steps=40, k=6, prompts_per_step=4, max_new_tokens=1,
                   lr=5e-2, eval_every=20, eval_prompts=1, eval_max_new_tokens=1)
    train_rl(cfg)
    assert built == ["stub-rm"]
    assert len(calls) == 40 + 3  # one scoring per step, plus evaluations at steps 0, 20 and 40
    records = [r for r in read_metrics(out / "metrics.jsonl") if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in records]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.3, [round(r, 2) for r in rewards]


# --------------------------------------------------------------------------- configuration errors


def test_chat_configuration_errors(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="set --prompts-data"):
        rloo_config(reward_model="runs/rm/model")
    with pytest.raises(ValueError, match="set --prompts-data"):
        rloo_config(reward="remote")
    with pytest.raises(ValueError, match="both name a reward"):
        rloo_config(prompts_data=str(H4), reward_model="runs/rm/model", reward="uppercase_start")
    with pytest.raises(ValueError, match="no Countdown answer"):
        train_rl(make_cfg(tiny_model_dir, tmp_path / "x"))  # chat prompts with the default countdown reward
    with pytest.raises(ValueError, match="too few to hold out"):
        train_rl(make_cfg(tiny_model_dir, tmp_path / "y", reward="uppercase_start", eval_every=1, eval_prompts=5))
