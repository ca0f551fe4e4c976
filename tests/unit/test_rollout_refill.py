"""rlft.rollout.refill: continuous batching keeps the batch full, and a job's samples depend only on (seed, i, j)."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.models import DeviceSpec, load_model
from rlft.ops import sequence_logprobs
from rlft.rl.batch import rollout_batch, sampler_logprobs
from rlft.rollout import HFEngine, SamplingParams
from rlft.rollout.decode import decode
from rlft.rollout.decode import logits_warpers, token_statistics
from rlft.rollout.refill import choose, decode_jobs, draw, job_seed
from tests.unit.test_rollout_hf import PROMPTS, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def many_eos(tokenizer, share: float = 0.08, seed: int = 0) -> list[int]:
    """A random ``share`` of the vocabulary (and the real EOS): on a near-uniform tiny model a row then stops at
    each step with probability ~``share``, so rows finish at many different steps."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(len(tokenizer), generator=g)[: int(share * len(tokenizer))].tolist()
    return sorted({tokenizer.eos_token_id, *ids})


def encode(tokenizer, prompts):
    return [list(ids) for ids in tokenizer(prompts)["input_ids"]]


def run(model, tokenizer, jobs, params, eos, batch_size, prompts=PROMPTS, widths=None):
    on_forward = None if widths is None else (lambda rows, width: widths.append((rows, width)))
    out = decode_jobs(model, encode(tokenizer, prompts), jobs, params, eos, batch_size=batch_size, pad_id=0,
                      seed=params.seed, on_forward=on_forward)
    return [d.token_ids for d in out]


def exact_model(tokenizer):
    """:func:`tiny_model` in float64. A forward's logits depend on the batch's shape in their last bits (matmul
    blocking, padding); a draw whose uniform lies that close to a boundary of the cumulative distribution picks the
    neighbouring token (in float32 that happened once in these tests' thousands of draws, at one seed). In float64
    those differences are ~1e-15, so samples must match exactly."""
    return tiny_model(tokenizer).double()


def test_samples_do_not_depend_on_batch_composition(smol_tokenizer):
    """Job (i, j) gives the same tokens decoded alone, with other prompts, at any batch size, in any slot (with
    batch_size 2 most jobs are refilled into a slot freed by another), and for k = 2 or 4."""
    model = exact_model(smol_tokenizer)
    eos = many_eos(smol_tokenizer)
    params = SamplingParams(temperature=1.0, top_k=500, top_p=0.95, max_new_tokens=20, seed=11)
    jobs = [(i, j) for i in range(len(PROMPTS)) for j in range(4)]
    reference = dict(zip(jobs, run(model, smol_tokenizer, jobs, params, eos, batch_size=32)))
    assert len({len(ids) for ids in reference.values()}) >= 4  # rows finish at different steps
    assert len({tuple(ids) for ids in reference.values()}) == len(jobs)  # every job draws its own stream
    for batch_size in (1, 2, 5):
        assert dict(zip(jobs, run(model, smol_tokenizer, jobs, params, eos, batch_size))) == reference
    mixed = [(3, 1), (0, 2), (4, 0), (3, 1)]  # another order, a repeated job
    assert run(model, smol_tokenizer, mixed, params, eos, batch_size=2) == [reference[j] for j in mixed]
    assert run(model, smol_tokenizer, [(2, 3)], params, eos, batch_size=8) == [reference[(2, 3)]]
    # through the engine: k = 2 is the first two samples of k = 4; other prompts around do not matter
    model.generation_config.eos_token_id = eos
    k4 = HFEngine(model, smol_tokenizer, batch_size=3).generate(PROMPTS, SamplingParams(**{**params.__dict__, "k": 4}))
    k2 = HFEngine(model, smol_tokenizer, batch_size=7).generate(PROMPTS[:3],
                                                                SamplingParams(**{**params.__dict__, "k": 2}))
    assert [[s.completion_ids for s in row] for row in k4] == [[reference[(i, j)] for j in range(4)] for i in range(5)]
    assert [[s.completion_ids for s in row] for row in k2] == [[reference[(i, j)] for j in range(2)] for i in range(3)]
    other_seed = run(model, smol_tokenizer, jobs, SamplingParams(**{**params.__dict__, "seed": 12}), eos, batch_size=4)
    assert other_seed != [reference[j] for j in jobs]


def test_refill_keeps_the_batch_full(smol_tokenizer):
    """Every prompt is prefilled once for its 4 jobs; decoding steps run batch_size rows until the queue is empty
    (the width only falls once no job waits, and never rises again); the decoding steps carry exactly
    sum(len(completion) - 1) rows (a row's first token comes from its prompt's prefill, its last is never fed);
    today's decoder, chunk by chunk, needs more forwards for the same jobs."""
    model = tiny_model(smol_tokenizer)
    eos = many_eos(smol_tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    jobs = [(i, j) for i in range(len(PROMPTS)) for j in range(4)]
    widths: list[tuple[int, int]] = []
    out = run(model, smol_tokenizer, jobs, params, eos, batch_size=4, widths=widths)
    assert sum(rows for rows, width in widths if width > 1) == len(PROMPTS)  # prompts prefilled, each once
    steps = [rows for rows, width in widths if width == 1]
    assert sum(steps) == sum(len(ids) - 1 for ids in out)
    assert len({len(ids) for ids in out}) >= 4
    first_short = next(t for t, rows in enumerate(steps) if rows < 4)
    assert set(steps[:first_short]) == {4} and steps[first_short:] == sorted(steps[first_short:], reverse=True)
    assert len(steps) - first_short <= max(len(ids) for ids in out)  # the tail is at most the longest job
    sizes = []
    handle = model.lm_head.register_forward_hook(lambda module, inputs, output: sizes.append(inputs[0].shape[0]))
    try:
        ids = encode(smol_tokenizer, PROMPTS)
        for start in range(0, len(jobs), 4):
            batch = [ids[i] for i, _ in jobs[start : start + 4]]
            width = max(map(len, batch))
            decode(model, torch.tensor([[0] * (width - len(b)) + b for b in batch]),
                   torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch]), params, eos)
    finally:
        handle.remove()
    assert len(sizes) > len(widths)


@pytest.mark.parametrize("tok_name", ["smol_tokenizer", "qwen_tokenizer"])
def test_greedy_equals_todays_decoder(tok_name, request):
    """Greedy: the refill path picks exactly the tokens of decode() (and so of generate), rows stopping early."""
    tokenizer = request.getfixturevalue(tok_name)
    model = tiny_model(tokenizer)
    eos = many_eos(tokenizer, share=0.15)
    model.generation_config.eos_token_id = eos
    params = SamplingParams(k=2, temperature=0.0, max_new_tokens=12)
    drop = HFEngine(model, tokenizer, batch_size=8, decoder="drop").generate(PROMPTS, params)
    refill = HFEngine(model, tokenizer, batch_size=3, decoder="refill").generate(PROMPTS, params)
    assert [[(s.completion_ids, s.finish_reason) for s in row] for row in refill] == \
        [[(s.completion_ids, s.finish_reason) for s in row] for row in drop]
    assert len({len(s.completion_ids) for row in drop for s in row}) >= 2
    for a, b in zip([s for row in refill for s in row], [s for row in drop for s in row]):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.self_certainty == pytest.approx(b.self_certainty, abs=1e-5)
    assert HFEngine(model, tokenizer).decoder_for(model, params) == "drop"
    assert HFEngine(model, tokenizer).decoder_for(model, SamplingParams(temperature=1.0)) == "refill"


def test_long_rows_grow_the_cache_buffers(smol_tokenizer):
    """Rows longer than the cache buffers' spare columns (SPARE): greedy refill still equals decode(), and sampled
    jobs still do not depend on the batch size, with rows finishing, refilled and trimmed along the way."""
    from rlft.rollout.cache_rows import SPARE

    model = exact_model(smol_tokenizer)
    eos = many_eos(smol_tokenizer, share=0.01)
    model.generation_config.eos_token_id = eos
    greedy = SamplingParams(k=2, temperature=0.0, max_new_tokens=2 * SPARE + 10)
    drop = HFEngine(model, smol_tokenizer, batch_size=16, decoder="drop").generate(PROMPTS, greedy)
    refill = HFEngine(model, smol_tokenizer, batch_size=3, decoder="refill").generate(PROMPTS, greedy)
    assert [[s.completion_ids for s in row] for row in refill] == [[s.completion_ids for s in row] for row in drop]
    assert max(len(s.completion_ids) for row in drop for s in row) > 2 * SPARE
    sampled = SamplingParams(temperature=1.0, max_new_tokens=2 * SPARE + 10, seed=4)
    jobs = [(i, j) for i in range(len(PROMPTS)) for j in range(2)]
    wide = run(model, smol_tokenizer, jobs, sampled, eos, batch_size=10)
    assert run(model, smol_tokenizer, jobs, sampled, eos, batch_size=3) == wide
    assert max(map(len, wide)) > 2 * SPARE and min(map(len, wide)) < SPARE


def test_freed_rows_are_refilled_in_place_and_wide_prompts_appended(smol_tokenizer, monkeypatch):
    """A job whose prompt fits the cache's width is written into a freed row in place; a prompt wider than the cache
    (the long prompt of PROMPTS, waiting behind short ones, rows stopping after 1-3 tokens) takes the long way (the
    freed row removed, the prompt appended); rows freed when no job waits leave the batch. Both paths run here, and
    every job's tokens are those it draws decoded alone."""
    import rlft.rollout.refill as refill

    calls = {"fill": 0, "append": 0}
    fill, append_rows = refill.fill_row, refill.append_rows

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(refill, "fill_row", counted("fill", fill))
    monkeypatch.setattr(refill, "append_rows", counted("append", append_rows))
    model = exact_model(smol_tokenizer)
    eos = many_eos(smol_tokenizer, share=0.3)
    params = SamplingParams(temperature=1.0, max_new_tokens=3, seed=5)
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[1], PROMPTS[4]]  # short, short, long, short
    jobs = [(i, j) for i in range(len(prompts)) for j in range(3)]
    together = run(model, smol_tokenizer, jobs, params, eos, batch_size=2, prompts=prompts)
    assert calls["fill"] >= 3 and calls["append"] >= 2  # appended: the first admission and the long prompt
    alone = [run(model, smol_tokenizer, [job], params, eos, batch_size=1, prompts=prompts)[0] for job in jobs]
    assert together == alone
    assert len({len(ids) for ids in together}) >= 2


def teacher_forced(model, tokenizer, prompts, samples, temperature):
    batch = rollout_batch(tokenizer, prompts, samples)
    with torch.no_grad():
        trained = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, temperature)
    return sampler_logprobs(batch, samples), trained, batch.loss_mask


def test_sampler_logprobs_match_teacher_forcing_in_float32(tiny_model_dir, smol_tokenizer):
    """The refill decoder's per-token log-probs are log softmax(logits / T) of the chosen tokens: equal to the
    trainer's teacher-forced recomputation (tight in float32), also for rows admitted late into a padded cache."""
    model = load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32))
    model.generation_config.eos_token_id = many_eos(smol_tokenizer)
    prompts = PROMPTS
    samples = HFEngine(model, smol_tokenizer, batch_size=3, decoder="refill").generate(
        prompts, SamplingParams(k=3, temperature=0.7, max_new_tokens=10, seed=1))
    sampled, trained, loss_mask = teacher_forced(model, smol_tokenizer, prompts, samples, 0.7)
    assert sampled is not None and (sampled != 0).sum() == loss_mask.sum()
    assert torch.allclose(sampled, trained, atol=1e-4)


def test_sampler_logprobs_match_teacher_forcing_in_bfloat16(tiny_model_dir, smol_tokenizer):
    """A bfloat16 sampling copy (the RL loop's on a CPU) against the float32 policy's recomputation: equal to bf16
    precision (the sampler/trainer mismatch the --is-correction path corrects)."""
    model = load_model(str(tiny_model_dir), DeviceSpec(torch.device("cpu"), torch.float32))
    model.generation_config.eos_token_id = many_eos(smol_tokenizer)
    engine = HFEngine(model, smol_tokenizer, batch_size=4, decoder="refill", copy_weights=True,
                      copy_dtype=torch.bfloat16)
    samples = engine.generate(PROMPTS, SamplingParams(k=2, temperature=1.0, max_new_tokens=10, seed=2))
    sampled, trained, loss_mask = teacher_forced(model, smol_tokenizer, PROMPTS, samples, 1.0)
    diff = (sampled - trained)[loss_mask.bool()].abs()
    assert diff.max() < 0.05 and diff.mean() < 0.01
    assert diff.max() > 0  # really a bf16 sampler


def test_draw_follows_the_distribution():
    """Inverse-CDF draws: never a zero-probability token; frequencies within 5 standard errors; one generator a
    row, so a row's draws do not depend on the rows beside it."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(1, 30) * 2, dim=-1)
    probs[0, [3, 7]] = 0.0
    n = 20000
    g = torch.Generator().manual_seed(0)
    draws = torch.cat([draw(probs, [g]) for _ in range(n)])
    freq = torch.bincount(draws, minlength=30).double() / n
    p = (probs[0] / probs[0].sum()).double()
    assert freq[3] == 0 and freq[7] == 0
    assert torch.all((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-9)
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    pair = draw(torch.softmax(torch.randn(2, 30), -1), gens)
    again = draw(torch.softmax(torch.randn(1, 30), -1), [torch.Generator().manual_seed(2)])
    assert pair.shape == (2,) and again.shape == (1,)
    assert job_seed(0, 1, 2) == job_seed(0, 1, 2) != job_seed(0, 2, 1) and 0 <= job_seed(5, 0, 0) < 2**63


def test_two_level_draw_is_the_inverse_cdf():
    """Over a vocabulary of many blocks (some all zero, a size that is no multiple of the block): draw() picks, for
    each row's uniform u, exactly the entry a full float64 cumulative sum picks, and never a zero entry."""
    torch.manual_seed(0)
    v = 3 * 256 + 77
    probs = torch.softmax(torch.randn(400, v) * 3, dim=-1)
    probs[:, 256:512] = 0.0  # a whole block without mass
    probs[:, ::7] = 0.0
    seeds = list(range(400))
    got = draw(probs, [torch.Generator().manual_seed(s) for s in seeds])
    u = torch.cat([torch.rand(1, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in seeds])
    cdf = probs.double().cumsum(-1)
    want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    assert (got == want).float().mean() >= 0.995  # equal but for float ties at a boundary
    assert torch.all(probs[torch.arange(400), got] > 0)
    assert not ((got >= 256) & (got < 512)).any() and got.max() < v


@pytest.mark.parametrize("params",
                         [SamplingParams(temperature=0.7),
                          SamplingParams(temperature=1.3, top_k=6, top_p=0.8)])
def test_choose_samples_the_warped_distribution(params):
    """choose(): frequencies of 20000 draws within 5 standard errors of softmax(transformers' warpers(logits)),
    nothing outside top-k / the nucleus; its log-probs and self-certainty are token_statistics'."""
    torch.manual_seed(1)
    logits = torch.randn(1, 40) * 2
    warpers = logits_warpers(params)
    p = torch.softmax(warpers(torch.empty(1, 0, dtype=torch.long), logits.clone()), dim=-1)[0].double()
    n = 20000
    g = torch.Generator().manual_seed(0)
    draws = torch.cat([choose(logits, params, warpers, [g])[0] for _ in range(n)])
    freq = torch.bincount(draws, minlength=40).double() / n
    assert set(draws.unique().tolist()) <= set(p.nonzero().squeeze(1).tolist())
    assert torch.all((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-9)
    rows = logits.expand(3, -1)
    tokens, logprobs, certainty = choose(rows, params, warpers, [torch.Generator().manual_seed(s) for s in range(3)])
    want_lp, want_c = token_statistics(rows, tokens, params.temperature)
    assert torch.allclose(logprobs, want_lp, atol=1e-6) and torch.allclose(certainty, want_c, atol=1e-6)
    greedy, _, _ = choose(rows, SamplingParams(temperature=0.0), None, None)
    assert torch.equal(greedy, rows.argmax(-1))


def test_errors(smol_tokenizer):
    model = tiny_model(smol_tokenizer)
    with pytest.raises(ValueError, match="batch_size"):
        decode_jobs(model, [[1]], [(0, 0)], SamplingParams(), [0], batch_size=0, pad_id=0)
    with pytest.raises(ValueError, match="outside"):
        decode_jobs(model, [[1]], [(1, 0)], SamplingParams(), [0], batch_size=2, pad_id=0)
    with pytest.raises(ValueError, match="no tokens"):
        decode_jobs(model, [[]], [(0, 0)], SamplingParams(), [0], batch_size=2, pad_id=0)
    assert math.isfinite(job_seed(1, 2, 3))
