"""Batched KV-cached decoding that drops a row from the batch as soon as it finishes.

transformers' ``generate`` keeps every row of a batch in each forward pass until the last row stops: a batch of
64 completions that average 60 tokens but of which one runs to 144 costs 144 x 64 token-forwards. :func:`decode`
removes a row from the batch, and from its KV cache, the step it emits EOS, so a batch costs about the sum of its
completions' lengths (on 2 CPU cores, 144-token Countdown searches: see ``bench/decode.py``). :class:`HFEngine
<rlft.rollout.hf.HFEngine>` uses it for greedy decoding on a CPU; sampling there goes through
:func:`rlft.rollout.refill.decode_jobs` (continuous batching, per-job generators; ``bench/rollout.py``).

Token choice is transformers' own: greedy is the argmax of the float32 logits; sampling applies transformers'
``TemperatureLogitsWarper`` and ``TopKLogitsWarper``, then top-p (:class:`TopPWarper`: the tokens
``TopPLogitsWarper`` keeps, found among the 256 most likely instead of by sorting the vocabulary) in that order (as
``generate`` does) and draws with ``torch.multinomial`` from the softmax. So the distribution a row is sampled from
is the one ``generate`` would use for the same logits; only which random numbers a row receives differs (rows leave
the batch), so the same seed gives different samples from ``generate``'s, and the same samples again from ``decode``.

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


def token_statistics(logits: torch.Tensor, tokens: torch.Tensor,
                     temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
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


class TopPWarper:
    """Nucleus sampling's filter (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", eq. 2-3): of
    each row's tokens sorted by probability, keep the shortest prefix whose mass reaches ``top_p``; the others' scores
    become -inf. A token is kept iff the mass of the tokens above it is below ``top_p`` (the most likely is always
    kept): the set transformers' ``TopPLogitsWarper(top_p)`` keeps, up to float rounding when that mass is within
    ~1e-6 of ``top_p`` (it sums the sorted probabilities from the least likely up; this sums down from the top).

    That warper sorts the whole vocabulary of every row at every step: on a CPU, 36% of a sampled Countdown
    evaluation's time (49,152 tokens, T 0.6, top_p 0.95). This looks among the ``candidates`` most likely tokens
    (``torch.topk``) and sorts the whole row only when their mass is below ``top_p`` (the nucleus may reach past
    them). Called as a transformers logits processor: ``(input_ids, scores)`` with ``scores`` ``(N, V)`` float;
    returns a new ``(N, V)`` tensor, ``scores`` untouched; ``top_p`` 1 keeps every token.

    Raises:
        ValueError: ``top_p`` outside (0, 1] or ``candidates`` < 1.
    """

    def __init__(self, top_p: float, candidates: int = 256):
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
        if candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates}")
        self.top_p, self.candidates = float(top_p), candidates

    def removed(self, probs: torch.Tensor, top: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``(N, V)`` bool, True on the tokens to drop, from each row's ``m`` most likely tokens in descending order
        (``top``, ``index``: ``(N, m)``; the row's nucleus must lie among them)."""
        above = torch.cat([torch.zeros_like(top[:, :1]), top.cumsum(dim=-1)[:, :-1]], dim=-1)  # mass above each
        keep = above < self.top_p
        keep[:, 0] = True
        return torch.ones_like(probs, dtype=torch.bool).scatter_(1, index, ~keep)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.top_p >= 1.0:  # no filter (TopPLogitsWarper(1.0) drops only tokens of probability 0)
            return scores.clone()
        probs = scores.float().softmax(dim=-1)
        top, index = probs.topk(min(self.candidates, probs.shape[-1]), dim=-1)
        remove = self.removed(probs, top, index)
        wide = top.sum(dim=-1) < self.top_p  # the nucleus may reach past the candidates: sort these rows whole
        if top.shape[-1] < probs.shape[-1] and wide.any():
            rows = probs[wide]
            remove[wide] = self.removed(rows, *rows.sort(dim=-1, descending=True))
        return scores.masked_fill(remove, -math.inf)


def logits_warpers(params: SamplingParams):
    """The warpers for ``params`` (transformers' temperature, then top-k when > 0, then :class:`TopPWarper` when
    top-p < 1), as a transformers ``LogitsProcessorList``; empty for greedy decoding."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

    warpers = LogitsProcessorList()
    if params.greedy:
        return warpers
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPWarper(params.top_p))
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
           eos_ids: list[int], loop_stop=None, budgets: list[int] | None = None) -> list[Decoded]:
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
            a repeated line; None: off. Anything with its ``trigger_ids`` and ``looped(token_ids)`` works (the turn
            stop of :mod:`rlft.rollout.turns` also ends a row at a complete tool call).
        budgets: most tokens of each row (<= ``params.max_new_tokens``); None: ``params.max_new_tokens`` for all.

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
        if budgets is not None:
            for r, row in enumerate(rows.tolist()):
                if len(completions[row].token_ids) >= budgets[row]:
                    live[r] = False
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
