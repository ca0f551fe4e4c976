"""Steps 1-2 of the RL loop: sample this step's groups and score them (:func:`sample_step`).

Shape legend: B kept groups (prompts) of the step, k samples per prompt, G >= B groups tried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import torch

from rlft import distributed
from rlft.rl.batch import generation_seed
from rlft.rl.groups import varied_groups
from rlft.rl.prompts import RLPrompt
from rlft.rl.rewards import Reward
from rlft.rl.shaping import shaped_rewards
from rlft.rollout.base import Sample, SamplingParams

if TYPE_CHECKING:
    from rlft.rl.config import RLConfig

PromptOrder = Callable[[int], list[int]]
"""``order(virtual_step) -> prompt indices`` of one batch of ``prompts_per_step`` prompts; the loop passes
:func:`rlft.recipes.common.batch_indices` over the training prompts (a seeded permutation per epoch)."""


@dataclass
class StepSamples:
    """The groups a step trains on, and what sampling them cost.

    ``B`` counts the step's kept groups on every rank together; under torchrun a rank holds the prompts and
    samples of its own groups only (``local``), but every rank knows the rewards of all ``B``."""

    prompts: list[RLPrompt]
    """This rank's kept prompts (all ``B`` in one process), in the order of ``local``."""
    samples: list[list[Sample]]
    """Their lists of ``k`` samples."""
    local: list[int]
    """Positions in ``0..B-1`` of this rank's groups (``range(B)`` in one process)."""
    raw: torch.Tensor
    """``(B, k)`` raw rewards of the kept groups."""
    truncated: torch.Tensor
    """``(B, k)`` 1.0 where a sample hit max_new_tokens without EOS."""
    lengths: torch.Tensor
    """``(B, k)`` completion lengths in tokens (EOS included), float."""
    all_raw: torch.Tensor
    """``(G, k)`` raw rewards of every group sampled this step (G >= B)."""
    tried: list[int]
    """``(G,)`` the training-prompt index of every group sampled this step (every rank's), in sampling order."""
    kept: list[int]
    """``(B,)`` positions in ``tried`` of the kept groups, in the order of ``raw``."""
    generate_s: float
    """Seconds spent generating."""
    completion_tokens: int = 0
    """Tokens this rank generated this step."""


def sampling_params(cfg: RLConfig) -> SamplingParams:
    """How the loop samples: ``k`` completions per prompt at ``temperature`` and ``top_p``, at most
    ``max_new_tokens`` each (the seed is set per batch by :func:`sample_step`)."""
    return SamplingParams(k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens)


def sample_step(cfg: RLConfig, step: int, prompts: list[RLPrompt], order: PromptOrder, engine, reward: Reward) -> StepSamples:
    """Sample and score this step's groups (step 1-2 of the loop) with :func:`sampling_params`.

    Without filtering: the prompts of ``order(step)``, sampled with ``generation_seed(seed, step)``. With
    ``cfg.filter_groups``: batches ``j = 0, 1, ...`` of the "virtual steps" ``step * max_prompt_batches + j``
    (a pure function of the step, so a resumed run samples the same groups), keeping varied groups (of the
    :func:`shaped_rewards`) until ``prompts_per_step`` are found or ``max_prompt_batches`` batches were tried.

    Under torchrun every rank takes the same batch of prompts and samples its :func:`rlft.distributed.shard`
    of it (whole groups; seeded per rank), scores them, and the ``(groups, k)`` rewards are gathered on every
    rank (:func:`rlft.distributed.gather_rows`), so the filtering decision, and the kept groups, are those of
    one process given the same samples. Every rank calls ``engine.generate`` for every batch, with an empty
    list when its shard is empty (with FSDP2 the HF engine's generation is collective).
    """
    k = cfg.k
    sampling = sampling_params(cfg)
    kept = 0
    kept_prompts: list[RLPrompt] = []
    kept_samples: list[list[Sample]] = []
    local: list[int] = []
    kept_raw, kept_trunc, kept_lengths, all_raw = [], [], [], []
    tried: list[int] = []
    kept_at: list[int] = []
    generate_s = 0.0
    completion_tokens = 0
    batches = cfg.max_prompt_batches if cfg.filter_groups else 1
    for j in range(batches):
        virtual = step * cfg.max_prompt_batches + j if cfg.filter_groups else step
        chosen = order(virtual)
        offset = len(tried)
        tried.extend(chosen)
        mine = distributed.shard(list(range(len(chosen))))  # this rank's groups of the batch (all in one process)
        batch_prompts = [prompts[chosen[b]] for b in mine]
        t0 = time.perf_counter()
        seed = generation_seed(cfg.seed, virtual, distributed.rank())
        # every rank calls generate, with no prompts too: a sharded model's generation is collective (HFEngine)
        samples = engine.generate([p.text for p in batch_prompts], replace(sampling, seed=seed))
        generate_s += time.perf_counter() - t0
        flat = [s for row in samples for s in row]
        completion_tokens += sum(len(s.completion_ids) for s in flat)
        scores = reward.fn([p for p in batch_prompts for _ in range(k)], [s.text for s in flat]) if flat else []
        if len(scores) != len(flat):
            raise ValueError(f"the reward returned {len(scores)} scores for {len(flat)} completions")
        raw = torch.tensor(scores, dtype=torch.float32).view(len(batch_prompts), k)
        truncated = torch.tensor([s.finish_reason == "length" for s in flat], dtype=torch.float32).view(len(batch_prompts), k)
        lengths = torch.tensor([len(s.completion_ids) for s in flat], dtype=torch.float32).view(len(batch_prompts), k)
        raw, truncated, lengths = (distributed.gather_rows(t, mine, len(chosen)) for t in (raw, truncated, lengths))  # (len(chosen), k)
        all_raw.append(raw)
        keep = varied_groups(shaped_rewards(cfg, raw, truncated, lengths)) if cfg.filter_groups else torch.ones(len(chosen), dtype=torch.bool)
        for b in keep.nonzero().squeeze(1).tolist():
            if kept < cfg.prompts_per_step:
                if b in mine:
                    local.append(kept)
                    kept_prompts.append(batch_prompts[mine.index(b)])
                    kept_samples.append(samples[mine.index(b)])
                kept_raw.append(raw[b])
                kept_trunc.append(truncated[b])
                kept_lengths.append(lengths[b])
                kept_at.append(offset + b)
                kept += 1
        if kept >= cfg.prompts_per_step:
            break
    def stacked(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(rows) if rows else torch.zeros(0, k)

    return StepSamples(kept_prompts, kept_samples, local, stacked(kept_raw), stacked(kept_trunc), stacked(kept_lengths), torch.cat(all_raw),
                       tried, kept_at, generate_s, completion_tokens)
