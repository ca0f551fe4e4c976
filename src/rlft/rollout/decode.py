"""Batched KV-cached decoding that drops a row from the batch as soon as it finishes.

transformers' ``generate`` keeps every row of a batch in each forward pass until the last row stops: a batch of
64 completions that average 60 tokens but of which one runs to 144 costs 144 x 64 token-forwards. :func:`decode`
removes a row from the batch, and from its KV cache, the step it emits EOS, so a batch costs about the sum of its
completions' lengths (on 2 CPU cores, 144-token Countdown searches: see ``bench/decode.py``). :class:`HFEngine
<rlft.rollout.hf.HFEngine>` uses it for greedy decoding on a CPU; sampling there goes through
:func:`rlft.rollout.refill.decode_jobs` (continuous batching, per-job generators; ``bench/rollout.py``).

Token choice is transformers' own: greedy is the argmax of the float32 logits; sampling applies transformers'
``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper`` in that order (as ``generate`` does) and
draws with ``torch.multinomial`` from the softmax. So the distribution a row is sampled from is exactly the one
``generate`` would use for the same logits; only which random numbers a row receives differs (rows leave the
batch), so the same seed gives different samples from ``generate``'s, and the same samples again from ``decode``.

Each row also gets, from the logits the loop already has (no second pass): the log-probability of every token it
chose under the tempered, untruncated distribution ``softmax(logits / T)`` (T = 1 for greedy), the quantity the RL
loss recomputes (the sampler/trainer mismatch is their difference), and the sum over its tokens of the
*self-certainty* ``KL(U || p) = -log V - (1/V) sum_v log p_v`` of the untempered next-token distribution
(Kang et al. 2025, "Scalable Best-of-N Selection for Large Language Models via Self-Certainty", eq. 3).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field

import torch

from rlft.rollout.base import SamplingParams


@dataclass
class Decoded:
    """One decoded row."""

    token_ids: list[int] = field(default_factory=list)
    """The generated ids: ends with an EOS id, or has ``max_new_tokens`` ids and no EOS."""
    logprobs: list[float] = field(default_factory=list)
    """Per token, ``log softmax(logits / T)`` at the chosen id (T = 1 when greedy); same length as ``token_ids``."""
    certainty_sum: float = 0.0
    """Sum over the tokens of the self-certainty ``KL(U || p)`` of the untempered distribution (nats); divide by
    the length for Kang et al.'s per-sample score."""
    looped: bool = False
    """True when the loop stop (:class:`rlft.rollout.loops.LoopStop`) ended the row after a repeated line."""


def token_statistics(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``logits`` ``(N, V)`` and chosen ``tokens`` ``(N,)``: the log-prob of the token under
    ``softmax(logits / temperature)`` (temperature 0 is read as 1) and the self-certainty
    ``KL(U || p) = -log V - mean_v log p_v`` of ``p = softmax(logits)`` (>= 0; 0 for a uniform p). Both ``(N,)``
    float32, in nats (Kang et al. 2025, eq. 3)."""
    logits = logits.float()
    log_p = torch.log_softmax(logits, dim=-1)
    certainty = -math.log(logits.shape[-1]) - log_p.mean(dim=-1)
    tempered = log_p if temperature in (0.0, 1.0) else torch.log_softmax(logits / temperature, dim=-1)
    return tempered.gather(-1, tokens[:, None]).squeeze(1), certainty


def cache_keyword(model) -> str:
    """The forward keyword that takes the KV cache: ``cache`` where transformers renamed it (5.x, deprecating
    ``past_key_values``), else ``past_key_values``; read off the (peft-unwrapped) model class's ``forward``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def logits_warpers(params: SamplingParams):
    """transformers' warpers for ``params`` (temperature, then top-k when > 0, then top-p when < 1), as a
    ``LogitsProcessorList``; empty for greedy decoding."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList()
    if params.greedy:
        return warpers
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


def next_tokens(logits: torch.Tensor, params: SamplingParams, warpers=None) -> torch.Tensor:
    """The next token of each row from its last-position ``logits`` ``(N, V)``: argmax when ``params.greedy``,
    else one draw from ``softmax(warpers(logits))`` (``warpers`` defaults to :func:`logits_warpers`). ``(N,)`` long."""
    logits = logits.float()
    if params.greedy:
        return logits.argmax(dim=-1)
    warpers = logits_warpers(params) if warpers is None else warpers
    scores = warpers(torch.empty(logits.shape[0], 0, dtype=torch.long, device=logits.device), logits)
    return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)


@torch.no_grad()
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
           eos_ids: list[int], loop_stop=None) -> list[Decoded]:
    """Generate up to ``params.max_new_tokens`` tokens for each left-padded row; returns each row's tokens and
    their statistics (:class:`Decoded`).

    Args:
        model: a transformers causal LM (or a peft model wrapping one) whose forward takes ``position_ids``,
            a ``DynamicCache`` (:func:`cache_keyword`) and ``logits_to_keep``.
        input_ids: ``(N, W)`` prompt ids, left-padded.
        attention_mask: ``(N, W)``, 1 on prompt tokens, 0 on padding; position ids are counted over it
            (``cumsum - 1``), as ``generate`` does for left padding.
        params: greedy when ``params.temperature == 0``, else sampled (see the module docstring); ``params.seed``
            is not read here (the caller seeds the RNG).
        eos_ids: a row stops after the first of these it generates (the EOS is kept in its list).
        loop_stop: a :class:`rlft.rollout.loops.LoopStop`: a row also stops (``looped``) right after it completes
            a repeated line; None: off.

    Returns:
        N :class:`Decoded`: token ids that end with an EOS id, or ``max_new_tokens`` ids and no EOS; their
        log-probs; their self-certainty sum.

    Raises:
        ValueError: ``input_ids`` and ``attention_mask`` of different shapes, or no row.
    """
    from transformers import DynamicCache

    if input_ids.shape != attention_mask.shape or input_ids.ndim != 2 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must be "
                         "the same (N, W) with N >= 1")
    n = input_ids.shape[0]
    device = input_ids.device
    warpers = logits_warpers(params)
    eos = torch.tensor(sorted(set(eos_ids)), device=device)
    completions = [Decoded() for _ in range(n)]
    rows = torch.arange(n, device=device)  # original row of each live batch row
    mask = attention_mask.long()
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    cache = DynamicCache()  # filled in place by every forward
    with_cache = {cache_keyword(model): cache, "use_cache": True, "logits_to_keep": 1}
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **with_cache)
    position = positions[:, -1]
    for step in range(params.max_new_tokens):
        logits = out.logits[:, -1, :]
        tokens = next_tokens(logits, params, warpers)
        logprobs, certainty = token_statistics(logits, tokens, params.temperature)
        for row, token, logprob, c in zip(rows.tolist(), tokens.tolist(), logprobs.tolist(), certainty.tolist()):
            completions[row].token_ids.append(token)
            completions[row].logprobs.append(logprob)
            completions[row].certainty_sum += c
        if step == params.max_new_tokens - 1:
            break
        live = ~torch.isin(tokens, eos)
        if loop_stop is not None:
            for r, (row, token) in enumerate(zip(rows.tolist(), tokens.tolist())):
                if token in loop_stop.trigger_ids and live[r] and loop_stop.looped(completions[row].token_ids):
                    completions[row].looped = True
                    live[r] = False
        if not live.all():
            if not live.any():
                break
            keep = live.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, tokens, mask, position = rows[keep], tokens[keep], mask[keep], position[keep]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        position = position + 1
        out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=position[:, None], **with_cache)
    return completions
