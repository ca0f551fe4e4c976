"""Steps 1-2 of the RL loop: sample this step's groups, score and shape their rewards, and build this rank's
teacher-forcing batch (:func:`sample_step`, which returns one :class:`rlft.rl.records.StepSamples`); with
``--replay-size``, add the groups drawn from the replay buffer to the step (:func:`with_replayed`) and hand the
fresh ones to it (:func:`fresh_groups`), both for :class:`rlft.rl.reuse.Replay`.

Shape legend: B kept groups (prompts) of the step, k samples per prompt, G >= B groups tried.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from rlft import distributed
from rlft.rl.batch import generation_seed, rollout_batch
from rlft.rl.groups import varied_groups
from rlft.rl.hints import failed_groups, hint_metrics, hinted_prompt, step_fraction
from rlft.rl.records import Reward, RLPrompt, StepSamples
from rlft.rl.replay import ReplayGroup
from rlft.rl.shaping import repeated_samples, shaped_rewards
from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.turns import ToolUse
from rlft.validation import UsageError

if TYPE_CHECKING:
    from rlft.rl.config import RLConfig

PromptOrder = Callable[[int], list[int]]
"""``order(virtual_step) -> prompt indices`` of one batch of ``prompts_per_step`` prompts; the loop passes
:func:`rlft.recipes.common.batch_indices` over the training prompts (a seeded permutation per epoch)."""


def sampling_params(cfg: RLConfig) -> SamplingParams:
    """How the loop samples: ``k`` completions per prompt at ``temperature`` and ``top_p``, at most
    ``max_new_tokens`` each, stopped after ``stop_repeats`` identical lines (the seed is set per batch by
    :func:`sample_step`)."""
    return SamplingParams(k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                          stop_repeats=cfg.stop_repeats)


def sample_step(cfg: RLConfig, step: int, prompts: list[RLPrompt], order: PromptOrder, engine, reward: Reward,
                tokenizer=None, tool_use: ToolUse | None = None) -> StepSamples:
    """Sample, score and shape this step's groups (steps 1-2 of the loop) with :func:`sampling_params`.

    Without filtering: the prompts of ``order(step)``, sampled with ``generation_seed(seed, step)``. With
    ``cfg.filter_groups``: batches ``j = 0, 1, ...`` of the "virtual steps" ``step * max_prompt_batches + j``
    (a pure function of the step, so a resumed run samples the same groups), keeping the groups whose shaped
    rewards vary (:func:`rlft.rl.groups.varied_groups`) until ``prompts_per_step`` are found or
    ``max_prompt_batches`` batches were tried. The rewards are shaped once, here
    (:func:`rlft.rl.shaping.shaped_rewards`): the record carries them (``shaped``) for the advantages.

    Under torchrun every rank takes the same batch of prompts and samples its :func:`rlft.distributed.shard`
    of it (whole groups; seeded per rank), scores them, and the ``(groups, k)`` rewards are gathered on every
    rank (:func:`rlft.distributed.gather_rows`), so the filtering decision, and the kept groups, are those of
    one process given the same samples. Every rank calls ``engine.generate`` for every batch, with an empty
    list when its shard is empty (with FSDP2 the HF engine's generation is collective).

    Args:
        engine: a :class:`~rlft.rollout.base.GenerationEngine`.
        reward: scores ``(prompts, completions)``.
        tokenizer: builds this rank's teacher-forcing batch (:func:`rlft.rl.batch.rollout_batch`, prompts
            tokenized with ``engine.add_special_tokens``, as the engine did); None: no batch (``batch`` None).
        tool_use: rollouts with tool calls (each prompt's ground truth is its tools' context): the samples' observations
            get ``loss_mask`` 0 in the batch, and their lengths count the model's own tokens; None: one turn.
    Raises:
        ValueError: the reward returned another number of scores than completions.
    """
    k = cfg.k
    sampling = sampling_params(cfg)
    kept_prompts: list[RLPrompt] = []
    kept_samples: list[list[Sample]] = []
    local: list[int] = []
    kept_rows: list[tuple[torch.Tensor,
                          ...]] = []  # (raw, shaped, truncated, lengths, repeated) of each kept group, (k,) each
    all_raw: list[torch.Tensor] = []
    tried: list[int] = []
    kept_at: list[int] = []
    generate_s = 0.0
    generated_tokens = 0
    hints: dict[str, float] = {}
    hinted: list[int] = []  # positions in tried
    batches = cfg.max_prompt_batches if cfg.filter_groups else 1
    for j in range(batches):
        virtual = step * cfg.max_prompt_batches + j if cfg.filter_groups else step
        chosen = order(virtual)
        offset = len(tried)
        tried.extend(chosen)
        mine = distributed.shard(list(range(len(chosen))))  # this rank's groups of the batch (all in one process)
        batch_prompts = [prompts[chosen[b]] for b in mine]
        seed = generation_seed(cfg.seed, virtual, distributed.rank())
        # every rank calls generate, with no prompts too: a sharded model's generation is collective (HFEngine)
        samples, scores, seconds, tokens = _roll(engine, batch_prompts, replace(sampling, seed=seed), reward, tool_use)
        if cfg.hint != "none" and batch_prompts:  # groups that all failed: again, from a solver prefix
            batch_prompts, samples, scores, more = _hinted(cfg, step, batch_prompts, samples, scores, engine,
                                                           replace(sampling, seed=seed + HINT_SEED), reward, tool_use)
            seconds, tokens = seconds + more.pop("seconds"), tokens + more.pop("tokens")
            hinted += [offset + mine[b] for b in more.pop("failed")]
            fraction = more.pop("fraction")
            hints = {key: hints.get(key, 0.0) + value for key, value in more.items()} | {"fraction": fraction}
        generate_s += seconds
        generated_tokens += tokens
        flat = [s for row in samples for s in row]
        raw = torch.tensor(scores, dtype=torch.float32).view(len(batch_prompts), k)
        truncated = torch.tensor([s.finish_reason == "length" for s in flat],
                                 dtype=torch.float32).view(len(batch_prompts), k)
        lengths = torch.tensor([s.model_tokens for s in flat], dtype=torch.float32).view(len(batch_prompts), k)
        repeated = repeated_samples(cfg.shaping, [s.text for s in flat]).view(len(batch_prompts), k)
        raw, truncated, lengths, repeated = (distributed.gather_rows(t, mine, len(chosen))  # (len(chosen), k) each
                                             for t in (raw, truncated, lengths, repeated))
        shaped = shaped_rewards(cfg.shaping, cfg.max_new_tokens, raw, truncated, lengths, repeated)
        all_raw.append(raw)
        keep = varied_groups(shaped) if cfg.filter_groups else torch.ones(len(chosen), dtype=torch.bool)
        for b in keep.nonzero().squeeze(1).tolist():
            if len(kept_at) < cfg.prompts_per_step:
                if b in mine:
                    local.append(len(kept_at))
                    kept_prompts.append(batch_prompts[mine.index(b)])
                    kept_samples.append(samples[mine.index(b)])
                kept_rows.append((raw[b], shaped[b], truncated[b], lengths[b], repeated[b]))
                kept_at.append(offset + b)
        if len(kept_at) >= cfg.prompts_per_step:
            break
    raw, shaped, truncated, lengths, repeated = (
        torch.stack([group[i] for group in kept_rows]) if kept_rows else torch.zeros(0, k) for i in range(5))
    batch = None
    if tokenizer is not None:
        batch = rollout_batch(tokenizer, [p.text for p in kept_prompts], kept_samples,
                              add_special_tokens=engine.add_special_tokens)
    if hints:
        hints = hint_metrics(hints["groups"], hints["solved"], hints["fraction"], hints["chars"])
    return StepSamples(kept_prompts, kept_samples, local, raw, shaped, truncated, lengths, torch.cat(all_raw), tried,
                       kept_at, generate_s, generated_tokens, batch, repeated=repeated, hints=hints, hinted=hinted)


HINT_SEED = 1 << 42
"""Added to a batch's sampling seed for its hinted groups (:mod:`rlft.rl.hints`): other draws, the same after a
resume."""


def _roll(engine, prompts: list[RLPrompt], params: SamplingParams, reward: Reward, tool_use: ToolUse | None
          ) -> tuple[list[list[Sample]], list[float], float, int]:
    """``params.k`` samples of each prompt (with tools, each prompt's ground truth their context), scored: ``(samples,
    flat scores, seconds generating, generated tokens)``.

    Raises:
        ValueError: the reward returned another number of scores than completions."""
    t0 = time.perf_counter()
    texts = [p.text for p in prompts]
    samples = engine.generate(texts, params) if tool_use is None else engine.generate(
        texts, params, tool_use=tool_use, contexts=[p.ground_truth for p in prompts])
    seconds = time.perf_counter() - t0
    flat = [s for row in samples for s in row]
    scores = reward.fn([p for p in prompts for _ in range(params.k)], [s.text for s in flat]) if flat else []
    if len(scores) != len(flat):
        raise ValueError(f"the reward returned {len(scores)} scores for {len(flat)} completions")
    return samples, list(scores), seconds, sum(len(s.completion_ids) for s in flat)


def _hinted(cfg: RLConfig, step: int, prompts: list[RLPrompt], samples: list[list[Sample]], scores: list[float],
            engine, params: SamplingParams, reward: Reward, tool_use: ToolUse | None):
    """The batch with each group that all failed sampled again from its prompt and a solver prefix
    (:mod:`rlft.rl.hints`): ``(prompts, samples, scores, stats)``, ``stats`` the generation's seconds and tokens and
    the step's hint sums (groups, solved, fraction, chars) and ``failed``, the hinted groups' positions in
    ``prompts``."""
    if distributed.active():
        raise UsageError(f"--hint {cfg.hint} runs in one process (a rank's hinted groups would break collective "
                         "sampling)")
    k = params.k
    failed = failed_groups([scores[b * k : (b + 1) * k] for b in range(len(prompts))])
    fraction = step_fraction(cfg.hint_fraction, step, cfg.max_steps)
    stats = {"seconds": 0.0, "tokens": 0, "groups": 0.0, "solved": 0.0, "fraction": fraction, "chars": 0.0,
             "failed": []}
    if not failed or fraction <= 0:
        return prompts, samples, scores, stats
    style = "calc" if cfg.env == "countdown-calc" else "bounded"
    hinted = [hinted_prompt(prompts[b], fraction, style, cfg.hint == "solution") for b in failed]
    again, again_scores, seconds, tokens = _roll(engine, [p for p, _ in hinted], params, reward, tool_use)
    prompts, samples, scores = list(prompts), list(samples), list(scores)
    for i, b in enumerate(failed):
        prompts[b], samples[b] = hinted[i][0], again[i]
        scores[b * k : (b + 1) * k] = again_scores[i * k : (i + 1) * k]
    solved = len(failed) - len(failed_groups([again_scores[i * k : (i + 1) * k] for i in range(len(failed))]))
    stats.update(seconds=seconds, tokens=tokens, groups=float(len(failed)), solved=float(solved), failed=failed,
                 chars=float(sum(n for _, n in hinted)))
    return prompts, samples, scores, stats


def with_replayed(cfg: RLConfig, got: StepSamples, groups: Sequence[ReplayGroup], prompts: list[RLPrompt],
                  tokenizer=None, *, add_special_tokens: bool = True) -> tuple[StepSamples, list[ReplayGroup]]:
    """The step ``got`` (B fresh groups) with the replayed ``groups`` after its own: one process only.

    Each replayed group (``group.prompt``: its index in ``prompts``) is shaped as a fresh one from what it kept, its raw
    rewards and samples (truncation from each sample's finish reason, lengths from its completion ids, the repetition
    rule from its text: :func:`rlft.rl.shaping.shaped_rewards`), and with ``cfg.filter_groups`` only the groups whose
    shaped rewards vary are kept (:func:`rlft.rl.groups.varied_groups`), as :func:`sample_step` keeps fresh ones.

    Returns:
        ``(step, kept)``: a record whose ``prompts``, ``samples``, ``raw``, ``shaped``, ``truncated``, ``lengths``,
        ``repeated`` and ``batch`` hold the B fresh groups then the R kept replayed ones (rows ``b * k + j`` as before;
        ``local`` = ``range(B + R)``), while ``all_raw``, ``tried``, ``kept``, ``generate_s`` and ``generated_tokens``
        stay the fresh groups' (what this step sampled); and the kept replayed groups, in order.
    """
    k = cfg.k
    if not groups:
        return got, []
    raw = torch.tensor([g.rewards for g in groups], dtype=torch.float32).view(len(groups), k)
    flat = [s for g in groups for s in g.samples]
    truncated = torch.tensor([s.finish_reason == "length" for s in flat], dtype=torch.float32).view(len(groups), k)
    lengths = torch.tensor([s.model_tokens for s in flat], dtype=torch.float32).view(len(groups), k)
    repeated = repeated_samples(cfg.shaping, [s.text for s in flat]).view(len(groups), k)
    shaped = shaped_rewards(cfg.shaping, cfg.max_new_tokens, raw, truncated, lengths, repeated)
    keep = varied_groups(shaped) if cfg.filter_groups else torch.ones(len(groups), dtype=torch.bool)
    kept = [g for g, keep_it in zip(groups, keep.tolist()) if keep_it]
    if not kept:
        return got, []
    fresh_repeated = got.repeated if got.repeated is not None else torch.zeros_like(got.raw)
    prompts_all = got.prompts + [prompts[g.prompt] for g in kept]
    samples_all = got.samples + [list(g.samples) for g in kept]
    batch = None
    if tokenizer is not None:
        batch = rollout_batch(tokenizer, [p.text for p in prompts_all], samples_all,
                              add_special_tokens=add_special_tokens)
    return replace(got, prompts=prompts_all, samples=samples_all, local=list(range(len(prompts_all))), raw=torch.cat([
        got.raw, raw[keep]
    ]), shaped=torch.cat([got.shaped, shaped[keep]]), truncated=torch.cat([got.truncated, truncated[keep]]),
                   lengths=torch.cat([got.lengths, lengths[keep]]), repeated=torch.cat([fresh_repeated, repeated[keep]
                                                                                        ]), batch=batch), kept


def fresh_groups(got: StepSamples, fresh: int) -> list[tuple[int, list[Sample], torch.Tensor]]:
    """What the replay buffer keeps of the step's first ``fresh`` groups (its own, one process):
    ``(training-prompt index, k samples, (k,) raw rewards)`` each (:meth:`rlft.rl.replay.ReplayBuffer.add`)."""
    return [(got.tried[got.kept[b]], got.samples[b], got.raw[b]) for b in range(fresh)]
