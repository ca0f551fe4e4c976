"""Continuous batching for rollouts: when a row finishes, a waiting (prompt, sample) job takes its place.

:func:`rlft.rollout.decode.decode` drops a finished row from the batch, so a chunk's last steps run few rows, and on a
CPU a decoding step costs nearly as much for 4 rows as for 32 (every step reads all the weights). :func:`decode_jobs`
keeps the batch full until the queue is empty:

- **Jobs.** Job ``(i, j)`` is sample ``j`` of prompt ``i``. Jobs wait in their given order; at most ``batch_size`` run.
- **Prefill once per prompt.** A prompt is prefilled (one forward, batched with the other new prompts of that step)
  the first time one of its jobs is admitted; its KV cache and last logits are kept until its last job has been
  admitted, so the k samples of a prompt share one prefill.
- **Refill.** At a step where rows finish (EOS, ``max_new_tokens``, or the loop stop), waiting jobs take their
  rows: a job's prompt KV is written into the last columns of a freed row of the cache, in place, with its
  attention-mask row (0 before the prompt: the finished row's old values stay there, masked) and position. A prompt
  wider than the cache, and rows freed when no job waits, go the long way: the freed rows leave the batch and the
  cache (a copy), the wide prompt's rows are left-padded to the cache's width (the cache widened on the left) and
  appended (a copy). Cache columns that are padding for every row are cut off, so the width stays that of the
  longest live context. The cache's keys and values live in buffers with spare columns, written in place
  (``DynamicLayer`` concatenates: a copy of the whole cache at every step).
- **Reproducible samples.** Each job draws from its own ``torch.Generator`` seeded by :func:`job_seed` from
  ``(seed, i, j)``, one uniform a token, turned into a token by inverse-CDF sampling of the warped distribution (the
  distribution ``generate`` samples from: temperature, top-k and top-p in that order, top-p by
  :class:`rlft.rollout.decode.TopPWarper`, which keeps the tokens transformers' warper keeps). A job's
  tokens therefore do not depend on which other jobs share its batch, the batch size, or the step it was admitted
  at, up to floating-point differences of the logits between batch shapes (a draw changes only when its uniform
  falls within that difference, ~1e-7 in float32, of a boundary of the cumulative distribution: rare, but not
  never). ``torch.multinomial`` on a CPU costs ~1 ms a row over a 49k vocabulary (2 cores, 2026-11-27); the
  vectorised two-level inverse CDF of :func:`draw` well under 1 ms for the 64 rows of a step.
- **Tool calls** (``resume``, :func:`rlft.rollout.turns.generate_turns_inline`). A job whose turn ends with a call
  keeps its row and cache: the observation's ids are fed as its next inputs, one decoding step each (log-prob 0.0),
  then its next turn draws from ``job_seed(seed, i, j, turn)``; the rows around it go on sampling.
- **Statistics.** As in :func:`rlft.rollout.decode.decode`: each token's ``log softmax(logits / T)`` (the sampler
  log-probs the RL loss compares against) and the self-certainty sum (Kang et al. 2025, eq. 3).

Greedy decoding (temperature 0) takes the argmax and draws nothing.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from typing import Callable

import torch

from rlft.rollout.base import SamplingParams
from rlft.rollout.decode import Decoded, cache_keyword, logits_warpers
from rlft.rollout.cache_rows import append_rows, fill_row, trim
from rlft.rollout.loops import LoopStop


Resume = Callable[[int, list[int], int], "list[int] | None"]
"""``resume(job, token_ids, turn_start) -> observation ids or None`` (:func:`decode_jobs`'s tool calls)."""


def job_seed(seed: int, prompt: int, sample: int, turn: int = 0) -> int:
    """The seed of job (``prompt``, ``sample``) under ``seed``: the first 63 bits of SHA-256 of ``"seed/prompt/sample"``
    (a pure function: no two small triples collide in practice, and neighbouring jobs get unrelated streams); turn
    ``t > 0`` of a rollout with tool calls (:mod:`rlft.rollout.turns`) hashes ``"seed/prompt/sample/t"``."""
    key = f"{seed}/{prompt}/{sample}" + (f"/{turn}" if turn else "")
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


BLOCK = 256
"""Vocabulary entries per block of :func:`draw`'s two-level inverse CDF."""


def draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row of ``probs`` ``(N, V)`` (rows need not be normalised; zero entries are never drawn), row r
    with one float64 uniform u from ``generators[r]``: the first index whose cumulative probability exceeds
    ``u * total`` (inverse-CDF sampling). Two levels, so no pass over the vocabulary needs a float64 cumulative sum:
    the float64 cumulative sum of the :data:`BLOCK`-entry block sums picks a block with a non-zero mass, then the
    float64 cumulative sum of that block's entries picks the entry. ``(N,)`` long."""
    n, v = probs.shape
    pad = -v % BLOCK
    blocks = torch.nn.functional.pad(probs.float(), (0, pad)).view(n, -1, BLOCK)  # (N, V / BLOCK, BLOCK)
    outer = blocks.sum(dim=-1).double().cumsum(dim=-1)  # (N, V / BLOCK)
    u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators]).to(probs.device)
    target = u * outer[:, -1]
    block = torch.searchsorted(outer, target[:, None], right=True).squeeze(1).clamp(max=outer.shape[1] - 1)
    before = torch.where(block > 0, outer.gather(1, (block - 1).clamp(min=0)[:, None]).squeeze(1), 0.0)
    inner = blocks[torch.arange(n, device=probs.device), block].double().cumsum(dim=-1)  # (N, BLOCK)
    rest = torch.minimum(target - before, inner[:, -1] * (1 - 1e-12))  # stays inside the block's own total
    index = torch.searchsorted(inner, rest[:, None], right=True).squeeze(1).clamp(max=BLOCK - 1)
    return block * BLOCK + index


def choose(logits: torch.Tensor, params: SamplingParams, warpers,
           generators: list[torch.Generator] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The next token of each row of ``logits`` ``(N, V)`` and its statistics: the float32 argmax when greedy, else
    :func:`draw` with one generator a row from ``softmax(warpers(logits))`` (with no top-k or top-p that is
    ``exp(logits / T - logsumexp(logits / T))``). Returns ``(N,)`` tokens, their log-probs under
    ``softmax(logits / T)`` and the self-certainty ``-log V - mean_v log p_v`` of ``p = softmax(logits)`` (the values
    of :func:`rlft.rollout.decode.token_statistics`, from log-sum-exps instead of full log-softmaxes)."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    certainty = lse - logits.mean(dim=-1) - math.log(logits.shape[-1])
    tempered, t_lse = (logits, lse) if params.temperature in (0.0, 1.0) else (logits / params.temperature, None)
    if t_lse is None:
        t_lse = torch.logsumexp(tempered, dim=-1)
    if params.greedy:
        tokens = logits.argmax(dim=-1)
    elif params.top_k == 0 and params.top_p >= 1.0:
        tokens = draw((tempered - t_lse[:, None]).exp_(), generators)
    else:
        scores = warpers(torch.empty(logits.shape[0], 0, dtype=torch.long, device=logits.device), logits)
        tokens = draw(torch.softmax(scores, dim=-1), generators)
    return tokens, tempered.gather(-1, tokens[:, None]).squeeze(1) - t_lse, certainty


class _Prompts:
    """Prompt KV caches and last logits, prefilled on demand and kept until the prompt's last job is admitted."""

    def __init__(self, model, prompts: list[list[int]], jobs: list[tuple[int, int]], pad_id: int, on_forward):
        self.model, self.prompts, self.pad_id, self.on_forward = model, prompts, pad_id, on_forward
        self.waiting = Counter(i for i, _ in jobs)  # jobs of each prompt not admitted yet
        self.entries: dict[int, tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]] = {}

    def prefill(self, indices: list[int]) -> None:
        """One forward over the prompts of ``indices`` not cached yet (left-padded together)."""
        from transformers import DynamicCache

        new = sorted({i for i in indices if i not in self.entries})
        if not new:
            return
        device = next(self.model.parameters()).device
        width = max(len(self.prompts[i]) for i in new)
        ids = torch.full((len(new), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(new), width), dtype=torch.long)
        for r, i in enumerate(new):
            n = len(self.prompts[i])
            ids[r, width - n :] = torch.tensor(self.prompts[i])
            mask[r, width - n :] = 1
        ids, mask = ids.to(device), mask.to(device)
        cache = DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                         **{cache_keyword(self.model): cache}, use_cache=True, logits_to_keep=1)
        self.on_forward(len(new), width)
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for r, i in enumerate(new):
            n = len(self.prompts[i])
            kv = [(k[r : r + 1, :, width - n :], v[r : r + 1, :, width - n :]) for k, v in layers]
            self.entries[i] = (kv, out.logits[r, -1].float())

    def admit(self, i: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Prompt ``i``'s KV (per layer ``(1, H, P, D)``) and last logits ``(V,)`` for one of its jobs; forgotten after
        the prompt's last job."""
        entry = self.entries[i]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:
            del self.entries[i]
        return entry


@torch.no_grad()
def decode_jobs(model, prompts: list[list[int]], jobs: list[tuple[int, int]], params: SamplingParams,
                eos_ids: list[int], *, batch_size: int, pad_id: int, seed: int | None = None,
                loop_stop: LoopStop | None = None, on_done: Callable[[int], None] | None = None,
                on_forward: Callable[[int, int], None] | None = None, seeds: list[int] | None = None,
                budgets: list[int] | None = None, resume: Resume | None = None) -> list[Decoded]:
    """Decode every job with continuous batching (see the module docstring); returns one :class:`Decoded` per job,
    in the order of ``jobs``.

    Args:
        model: a transformers causal LM (or a peft model wrapping one) whose forward takes ``position_ids``, a
            ``DynamicCache`` (:func:`rlft.rollout.decode.cache_keyword`) and ``logits_to_keep``.
        prompts: token ids of each prompt (non-empty).
        jobs: ``(prompt index, sample index)`` pairs; a job's samples depend on its pair and ``seed`` only.
        params: greedy when ``params.temperature == 0``; else sampled through
            :func:`rlft.rollout.decode.logits_warpers`.
        eos_ids: a row stops after the first of these it generates (kept in its ids).
        batch_size: most rows decoded together.
        pad_id: the id written into padding positions (masked out; any id works).
        seed: seeds the jobs' generators (:func:`job_seed`); None draws one from the global RNG.
        loop_stop: stop a row after it repeats a line (:class:`rlft.rollout.loops.LoopStop`); None: off.
        on_done: called with 1 as each job finishes (progress bars).
        on_forward: called as ``(rows, tokens per row)`` before each forward returns: prefills ``(prompts, width)``,
            decoding steps ``(rows, 1)`` (tests count the batch widths with it).
        seeds: one generator seed per job, instead of :func:`job_seed` of ``seed`` and the job's pair (the later turns
            of a rollout with tool calls); None: :func:`job_seed`.
        budgets: most tokens of each job (>= 1), instead of ``params.max_new_tokens`` for all; None: that.
        resume: rollouts with tool calls inside the batch (:func:`rlft.rollout.turns.generate_turns_inline`): when
            ``loop_stop`` ends a job's turn, ``resume(job, token_ids, turn_start)`` gives the observation's ids to
            feed (the job goes on in its row, its cache kept: each id is fed as the row's next input, recorded with
            log-prob 0.0, one decoding step each; then the job's next turn draws from a generator seeded by
            :func:`job_seed` ``(seed, i, j, turn)``, or ``seeds[job] + turn``), or None (the job ends, ``looped``).
            The loop stop reads the current turn's ids only, and budgets count the model's own tokens only.

    Raises:
        ValueError: ``batch_size < 1``, an empty prompt, or a job naming no prompt.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if any(not (0 <= i < len(prompts)) for i, _ in jobs):
        raise ValueError(f"jobs name prompts outside 0..{len(prompts) - 1}")
    if any(not prompts[i] for i, _ in jobs):
        raise ValueError("a job's prompt has no tokens")
    if (seeds is not None and len(seeds) != len(jobs)) or (budgets is not None and len(budgets) != len(jobs)):
        raise ValueError(f"seeds and budgets need one entry per job ({len(jobs)})")
    if budgets is not None and any(n < 1 for n in budgets):
        raise ValueError("every budget must be >= 1 token")
    limits = budgets if budgets is not None else [params.max_new_tokens] * len(jobs)
    on_forward = on_forward or (lambda rows, width: None)
    on_done = on_done or (lambda n: None)
    if seed is None and not params.greedy:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    device = next(model.parameters()).device
    warpers = logits_warpers(params)
    done_ids = set(eos_ids)
    completions = [Decoded() for _ in jobs]
    forced: dict[int, list[int]] = {}  # with resume: job -> observation ids still to feed
    turn_start = [0] * len(jobs)  # where each job's current turn starts in its ids
    turns = [0] * len(jobs)
    model_tokens = [0] * len(jobs)
    store = _Prompts(model, prompts, jobs, pad_id, on_forward)
    queue = list(range(len(jobs)))[::-1]  # pop() takes the next job

    def record(job: int, token: int, logprob: float, certainty: float) -> bool:
        """Append one token to ``job``; True when the job is finished."""
        d = completions[job]
        d.token_ids.append(token)
        d.logprobs.append(logprob)
        d.certainty_sum += certainty
        model_tokens[job] += 1
        if token in done_ids or model_tokens[job] >= limits[job]:
            return True
        if loop_stop is not None and token in loop_stop.trigger_ids and loop_stop.looped(
                d.token_ids[turn_start[job]:] if turn_start[job] else d.token_ids):
            observation = resume(job, d.token_ids, turn_start[job]) if resume is not None else None
            if not observation:
                d.looped = True
                return True
            forced[job] = list(observation)
        return False

    def feed_forced(job: int) -> tuple[int, bool]:
        """The job's next observation id, recorded; and True when it was the last (its next turn starts)."""
        d, token = completions[job], forced[job].pop(0)
        d.token_ids.append(token)
        d.logprobs.append(0.0)
        if forced[job]:
            return token, False
        del forced[job]
        turns[job] += 1
        turn_start[job] = len(d.token_ids)
        return token, True

    def turn_generator(job: int) -> torch.Generator:
        """The generator of the job's current turn (after an observation)."""
        own = job_seed(seed, *jobs[job], turns[job]) if seeds is None else seeds[job] + turns[job]
        return torch.Generator().manual_seed(own)

    def admit(free: int):
        """Up to ``free`` waiting jobs, first token drawn from their prompt's logits; jobs finished by it are
        completed here. Returns (jobs, generators, KV per job, prompt lengths, first tokens)."""
        admitted, gens, kvs, lengths, firsts = [], [], [], [], []
        while free > len(admitted) and queue:
            batch = [queue.pop() for _ in range(min(free - len(admitted), len(queue)))]
            store.prefill([jobs[b][0] for b in batch])
            entries = [store.admit(jobs[b][0]) for b in batch]
            logits = torch.stack([logit for _, logit in entries])
            batch_gens = None if params.greedy else [
                torch.Generator().manual_seed(job_seed(seed, *jobs[b]) if seeds is None else seeds[b]) for b in batch
            ]
            tokens, logprobs, certainty = choose(logits, params, warpers, batch_gens)
            for r, (b, token, lp, c) in enumerate(zip(batch, tokens.tolist(), logprobs.tolist(), certainty.tolist())):
                if record(b, token, lp, c):
                    on_done(1)
                    continue
                admitted.append(b)
                gens.append(None if batch_gens is None else batch_gens[r])
                kvs.append(entries[r][0])
                lengths.append(len(prompts[jobs[b][0]]))
                firsts.append(token)
        return admitted, gens, kvs, lengths, firsts

    cache = None  # the running DynamicCache; None while no row runs
    rows: list[int] = []  # job of each batch row
    gens: list[torch.Generator | None] = []
    mask = position = feed = None  # (B, L) attention mask of the cached columns, (B,) positions, (B,) next inputs

    def append(new, new_gens, kvs, lengths, firsts) -> None:
        """Admitted jobs become new rows at the end of the batch (the cache widened on the left if a prompt is
        wider)."""
        nonlocal cache, mask, rows, gens, position, feed
        cache, mask = append_rows(cache, mask, kvs, lengths, device)
        rows, gens = rows + new, gens + new_gens
        new_position = torch.tensor(lengths, device=device)  # the first token sits right after its prompt
        new_feed = torch.tensor(firsts, device=device)
        position = new_position if position is None else torch.cat([position, new_position])
        feed = new_feed if feed is None else torch.cat([feed, new_feed])

    while True:
        new = admit(batch_size - len(rows))
        if new[0]:
            append(*new)
        if not rows:
            break
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        out = model(input_ids=feed[:, None], attention_mask=mask, position_ids=position[:, None],
                    **{cache_keyword(model): cache}, use_cache=True, logits_to_keep=1)
        on_forward(len(rows), 1)
        logits = out.logits[:, -1, :]
        tokens, logprobs, certainty = choose(logits, params, warpers, gens)
        if forced and any(job in forced for job in rows):  # rows feeding an observation take its next id instead
            chosen, finished = tokens.tolist(), []
            for r, (job, lp, c) in enumerate(zip(rows, logprobs.tolist(), certainty.tolist())):
                if job in forced:
                    chosen[r], last = feed_forced(job)
                    if last and gens[r] is not None:
                        gens[r] = turn_generator(job)
                    finished.append(False)
                else:
                    finished.append(record(job, chosen[r], lp, c))
            tokens = torch.tensor(chosen, device=device)
        else:
            finished = [record(job, token, lp, c)
                        for job, token, lp, c in zip(rows, tokens.tolist(), logprobs.tolist(), certainty.tolist())]
        feed, position = tokens, position + 1
        if not any(finished):
            continue
        on_done(sum(finished))
        free = [r for r, f in enumerate(finished) if f]
        new, new_gens, kvs, lengths, firsts = admit(len(free))
        # a job whose prompt fits the cache's width takes a freed row in place: its prompt's KV written into the
        # row's last columns, the rest of the row masked (no copy of the cache); wider prompts are appended below
        width = mask.shape[1]
        fits = [a for a, n in enumerate(lengths) if n <= width]
        for r, a in zip(free, fits):
            fill_row(cache, mask, r, kvs[a], lengths[a])
            rows[r], gens[r] = new[a], new_gens[a]
            position[r], feed[r] = lengths[a], firsts[a]
        if gone := set(free[len(fits):]):
            keep = [r for r in range(len(rows)) if r not in gone]
            rows, gens = [rows[r] for r in keep], [gens[r] for r in keep]
            if not rows:
                cache = mask = position = feed = None
            else:
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, position, feed = mask[index], position[index], feed[index]
        if wide := [a for a, n in enumerate(lengths) if n > width]:
            append([new[a] for a in wide], [new_gens[a] for a in wide], [kvs[a] for a in wide],
                   [lengths[a] for a in wide], [firsts[a] for a in wide])
        if rows:
            mask = trim(cache, mask)
    return completions
