"""Rollouts with transformers ``generate``: batched, left-padded, KV-cached, on CPU or CUDA; also on a model
sharded by FSDP2 under torchrun (every rank generating its own prompts, in step with the others)."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Literal, get_args

import torch

from rlft import distributed
from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.decode import Decoded, decode
from rlft.rollout.loops import LoopStop
from rlft.rollout.refill import decode_jobs
from rlft.rollout.turns import ToolUse, TurnStop, generate_turns, generate_turns_inline

Decoder = Literal["auto", "drop", "refill", "generate", "static"]
"""How :class:`HFEngine` decodes: 'drop' (:func:`rlft.rollout.decode.decode`, rows leave the batch as they
finish), 'refill' (:func:`rlft.rollout.refill.decode_jobs`, continuous batching: a waiting (prompt, sample) job takes
a finished row's place; each job samples from its own seeded generator), 'generate' (``model.generate`` with its
dynamic cache), 'static' (``model.generate`` with ``cache_implementation="static"``: fixed shapes, which
transformers compiles into CUDA graphs on a GPU), 'auto' ('static' on CUDA; elsewhere 'refill' for sampling and
'drop' for greedy decoding; a model sharded by FSDP2 always uses 'generate')."""


def eos_token_ids(model, tokenizer) -> set[int]:
    """The union of ``tokenizer.eos_token_id`` and ``model.generation_config.eos_token_id`` (int or list)."""
    ids: set[int] = set()
    gen_config = getattr(model, "generation_config", None)
    for value in (tokenizer.eos_token_id, getattr(gen_config, "eos_token_id", None)):
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else value)
    return ids


def encode_prompts(tokenizer, prompts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of each prompt string: ``tokenizer(prompts, add_special_tokens=...)["input_ids"]``.

    The one place prompts become ids, for generation (:meth:`HFEngine.generate`) and for the
    training batches built from its samples (e.g. :func:`rlft.rl.batch.rollout_batch`), so the
    ids a policy is trained on are exactly those the sampler conditioned on.

    ``add_special_tokens=True`` (the tokenizer's default) lets a tokenizer that adds BOS add it: right
    for plain-text prompts. Use False for text rendered by a chat template
    (:func:`rlft.data.chat.render_generation_prompt`): the template already wrote any BOS, and a
    Llama-3-style tokenizer would otherwise prepend a second one.
    """
    return [list(ids) for ids in tokenizer(list(prompts), add_special_tokens=add_special_tokens)["input_ids"]]


class HFEngine:
    """A :class:`~rlft.rollout.base.GenerationEngine` built on ``model.generate``.

    - Prompts are tokenized by :meth:`encode_prompts` (:func:`encode_prompts` with the engine's
      ``add_special_tokens``). Default True, the tokenizer's default: a tokenizer that adds BOS adds
      it; nothing else is added. Pass ``add_special_tokens=False`` for prompts rendered by a chat
      template (:func:`rlft.data.chat.render_generation_prompt`), which already carry their BOS.
    - Each prompt is repeated k times; the B*k rows are sorted by prompt length and generated in
      chunks of ``batch_size`` rows, left-padded by hand (the tokenizer's ``padding_side`` is never
      touched), then put back in order.
    - Generation stops at any EOS id (:func:`eos_token_ids`); completions are cut after the first one.
    - Only :class:`SamplingParams` shape the distribution: the model's own generation defaults (e.g.
      an Instruct model's ``top_k``/``repetition_penalty``) are ignored, so that samples follow exactly
      the temperature/top-p/top-k a policy-gradient loss assumes.
    - ``params.seed`` seeds a forked RNG (the global RNG state is left as it was): the same seed,
      prompts and ``batch_size`` give the same samples. With 'refill' (sampling on a CPU by default) sample j of
      prompt i draws from its own generator seeded from (seed, i, j): the same whatever the batch size, the other
      prompts of the call (at the same positions) or k.
    - The model runs in eval mode under ``torch.no_grad()``; its training mode is restored afterwards.
    - ``decoder`` (:data:`Decoder`): on CPU by default 'refill' for sampling, :func:`rlft.rollout.refill.decode_jobs`
      (continuous batching: a finished row's place goes to a waiting (prompt, sample) job, so the batch stays full
      until the queue is empty; each prompt is prefilled once for its k samples), and 'drop' for greedy decoding,
      :func:`rlft.rollout.decode.decode`, which drops a row from the batch and its KV cache the step it emits EOS
      (a chunk costs about the sum of its completions' lengths, not its longest one times its rows). Both report
      each token's log-prob and the self-certainty of each sample. On CUDA 'static', transformers' static-cache
      ``generate`` (compiled to CUDA graphs: fast at small batches, where eager decoding is launch-bound). The
      distribution is ``generate``'s own on every path (argmax, or transformers' temperature/top-k/top-p
      warpers), so greedy outputs are the same; 'drop' and ``generate`` also draw with ``torch.multinomial`` from
      the global RNG, 'refill' by inverse CDF from per-job generators. A sharded model always uses ``generate``
      (its ``synced_gpus`` keeps the ranks in step).
    - ``params.stop_repeats`` (:mod:`rlft.rollout.loops`): 'refill' and 'drop' stop a row that repeats a line;
      ``generate``/'static' rows are cut at the same token afterwards (same samples, no time saved).
    - ``copy_weights``: sample from a plain copy of the model (LoRA adapters merged, weights cast to
      ``copy_dtype`` when given, e.g. bfloat16 under CPU mixed precision) instead of the model itself. The copy is
      made at the first :meth:`generate` after construction or :meth:`sync_weights` (the RL loop calls it after
      every update), so it follows the policy; merged LoRA weights also sample faster than adapters applied on
      the fly. Without a copy, a model with a mixed-precision compute dtype (:mod:`rlft.precision`) decodes
      under its autocast.
    - A model sharded by FSDP2 (:func:`rlft.distributed.sharded`, under torchrun) makes every forward collective:
      each rank generates its own prompts (any number, none included) with ``generate(..., synced_gpus=True)``
      (a rank whose rows are done keeps stepping until every rank's are), and a rank with fewer chunks than
      the busiest one generates filler chunks (one pad-token prompt, outputs dropped) after its own, so every
      rank calls ``generate`` as often. Collective then: every rank must call :meth:`generate` together.
    """

    def __init__(self, model, tokenizer, *, batch_size: int = 32, show_progress: bool = False,
                 add_special_tokens: bool = True, decoder: Decoder = "auto", copy_weights: bool = False,
                 copy_dtype: torch.dtype | None = None):
        """``add_special_tokens``: passed to the tokenizer for every prompt (see :func:`encode_prompts`);
        False for chat-template-rendered prompts (they already carry BOS), True for plain text.
        ``decoder``: see :data:`Decoder`. ``copy_weights``, ``copy_dtype``: see the class docstring.

        Raises:
            ValueError: ``batch_size < 1`` or an unknown ``decoder``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if decoder not in get_args(Decoder):
            raise ValueError(f"unknown decoder {decoder!r}; choose {', '.join(get_args(Decoder))}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.add_special_tokens = add_special_tokens
        self.decoder = decoder
        self.copy_weights = copy_weights
        self.copy_dtype = copy_dtype
        self._sampler = None  # the copy, when copy_weights (made lazily)

    def sync_weights(self, model) -> None:
        """Sample from ``model`` from now on (the RL loop passes its policy after every update; the engine's own
        model object, updated in place, is the usual case) and forget the sampling copy (``copy_weights``): the next
        :meth:`generate` copies ``model``'s current weights. Nothing is copied here."""
        self.model = model
        self._sampler = None

    def sampler(self):
        """The module :meth:`generate` decodes with: the model, or its plain (merged, cast) copy."""
        if not self.copy_weights or distributed.sharded(self.model):
            return self.model
        if self._sampler is None:
            import copy

            from rlft.lora import is_lora

            plain = copy.deepcopy(self.model).merge_and_unload() if is_lora(self.model) else copy.deepcopy(self.model)
            if self.copy_dtype is not None:
                plain = plain.to(self.copy_dtype)
            from rlft.precision import mark

            # Parameters marked as requiring grad (LoRA's merged base is frozen): decoding runs under no_grad anyway,
            # and on CPU a bf16 model whose parameters do not require grad decoded 1.5x slower (383 vs 584 tokens/s,
            # 64 rows of SmolLM2-135M, torch 2.13).
            self._sampler = mark(plain, None).eval().requires_grad_(True)
        return self._sampler

    def decoder_for(self, model, params: SamplingParams | None = None, tools: bool = False) -> str:
        """The decoder :meth:`generate` uses for ``model`` and ``params``: 'generate' when sharded, else ``decoder``
        with 'auto' resolved by the model's device ('static' on CUDA) and, elsewhere, by ``params`` ('refill' when
        sampling, 'drop' when greedy or ``params`` is None) or ``tools`` (rollouts with tool calls: 'refill', greedy
        too, whose rows keep their cache across calls: :func:`rlft.rollout.turns.generate_turns_inline`)."""
        if distributed.sharded(model):
            return "generate"
        if self.decoder != "auto":
            return self.decoder
        if next(model.parameters()).device.type == "cuda":
            return "static"
        return "refill" if tools or (params is not None and not params.greedy) else "drop"

    def encode_prompts(self, prompts: list[str]) -> list[list[int]]:
        """The prompt ids :meth:`generate` conditions on (:func:`encode_prompts` with this engine's setting)."""
        return encode_prompts(self.tokenizer, prompts, add_special_tokens=self.add_special_tokens)

    def generate(self, prompts: list[str], params: SamplingParams, tool_use: ToolUse | None = None,
                 contexts: list[dict | None] | None = None) -> list[list[Sample]]:
        """Sample ``params.k`` completions per prompt; returns B lists of k :class:`Sample`.

        ``tool_use``: rollouts with tool calls (:func:`rlft.rollout.turns.generate_turns`, on every decoder of one
        process), ``contexts`` what each prompt's tools receive; None: one turn, as always.

        Raises:
            ValueError: invalid ``params`` (see :meth:`SamplingParams.validate`), a prompt that
                tokenizes to nothing, no EOS id anywhere, or tools with a model sharded by FSDP2.
        """
        params.validate()
        synced = distributed.sharded(self.model)
        if tool_use is not None and synced:
            raise ValueError("rollouts with tool calls run in one process: a model sharded by FSDP2 is not supported")
        if not prompts and not synced:
            return []
        eos_ids = sorted(eos_token_ids(self.model, self.tokenizer))
        if not eos_ids:
            raise ValueError("neither the tokenizer nor the model's generation_config has an EOS token id")
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos_ids[0]
        prompt_ids = self.encode_prompts(prompts) if prompts else []
        if empty := [b for b, ids in enumerate(prompt_ids) if not ids]:
            raise ValueError(f"prompts {empty} tokenize to no tokens")
        rows = [b for b in range(len(prompts)) for _ in range(params.k)]  # row -> prompt index
        order = sorted(range(len(rows)), key=lambda r: -len(prompt_ids[rows[r]]))  # longest first
        chunks = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        fillers = distributed.most(len(chunks)) - len(chunks) if synced else 0

        results: list[Sample | None] = [None] * len(rows)
        model = self.sampler()
        was_training = model.training
        model.eval()
        from rlft.precision import compute_context

        loop_stop = LoopStop(self.tokenizer, params.stop_repeats) if params.stop_repeats is not None else None
        try:
            with self._rng(params.seed, model.device), torch.no_grad(), compute_context(model), \
                    self._progress(len(rows)) as advance:
                if tool_use is not None:
                    return self._generate_turns(model, prompt_ids, params, tool_use, contexts, eos_ids, pad_id)
                if self.decoder_for(model, params) == "refill":  # all rows in one queue; row r is job (r // k, r % k)
                    jobs = [(b, j) for b in range(len(prompts)) for j in range(params.k)]
                    decoded = decode_jobs(model, prompt_ids, jobs, params, eos_ids, batch_size=self.batch_size,
                                          pad_id=pad_id, seed=params.seed, loop_stop=loop_stop, on_done=advance)
                    results = [self._to_sample(d.token_ids, set(eos_ids), d) for d in decoded]
                else:
                    for chunk in chunks:
                        batch = [prompt_ids[rows[r]] for r in chunk]
                        for r, sample in zip(chunk,
                                             self._generate_batch(model, batch, params, eos_ids, pad_id, loop_stop)):
                            results[r] = sample
                        advance(len(chunk))
                for _ in range(fillers):  # after this rank's own chunks: its samples do not depend on them
                    self._generate_batch(model, [[pad_id]], params, eos_ids, pad_id)
        finally:
            model.train(was_training)
        return [results[b * params.k : (b + 1) * params.k] for b in range(len(prompts))]

    def _generate_turns(self, model, prompt_ids: list[list[int]], params: SamplingParams, tool_use: ToolUse,
                        contexts, eos_ids: list[int], pad_id: int) -> list[list[Sample]]:
        """Rollouts with tool calls on this engine's decoder for ``model`` and ``params``: 'refill' in one continuous
        batch (:func:`rlft.rollout.turns.generate_turns_inline`), the others turn by turn
        (:func:`rlft.rollout.turns.generate_turns`)."""
        decoder = self.decoder_for(model, params, tools=True)
        if decoder == "refill":  # one continuous batch: each row keeps its cache across its calls
            def decode_all(prompts, jobs, stop: TurnStop, resume) -> list[Decoded]:
                return decode_jobs(model, prompts, jobs, params, eos_ids, batch_size=self.batch_size, pad_id=pad_id,
                                   seed=params.seed, loop_stop=stop, resume=resume)

            return generate_turns_inline(decode_all, self.tokenizer, prompt_ids, params, tool_use, eos_ids, contexts)

        def decode_turn(prompts, jobs, seeds, budgets, stop: TurnStop) -> list[Decoded]:
            out: list[Decoded | None] = [None] * len(jobs)
            order = sorted(range(len(jobs)), key=lambda r: -len(prompts[jobs[r][0]]))
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                decoded = self._decode_batch(model, [prompts[jobs[r][0]] for r in chunk], params, eos_ids, pad_id,
                                             stop, [budgets[r] for r in chunk])
                for r, d in zip(chunk, decoded):
                    out[r] = d
            return out

        return generate_turns(decode_turn, self.tokenizer, prompt_ids, params, tool_use, eos_ids, contexts)

    def _decode_batch(self, model, batch: list[list[int]], params: SamplingParams, eos_ids: list[int], pad_id: int,
                      stop: TurnStop, budgets: list[int]) -> list[Decoded]:
        """One turn of the rows ``batch`` (prompt ids, left-padded here) with 'drop' (stopped early) or ``generate``
        / 'static' (generated to the longest budget, then each row cut at its EOS, its budget and its stop: the same
        ids, no time saved, no log-probs)."""
        input_ids, attention_mask = _left_padded(batch, pad_id)
        width = input_ids.shape[1]
        longest = replace(params, max_new_tokens=max(budgets))
        device = model.device
        decoder = self.decoder_for(model, params)
        if decoder == "drop":
            return decode(model, input_ids.to(device), attention_mask.to(device), longest, eos_ids, stop, budgets)
        sampling = dict(do_sample=False) if params.greedy else dict(
            do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
        static = dict(cache_implementation="static") if decoder == "static" else {}
        with _clean_generation_config(model):
            output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                    max_new_tokens=longest.max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id,
                                    use_cache=True, **static, **sampling)
        rows = []
        for generated, budget in zip(output[:, width:].tolist(), budgets):
            ids = generated[:budget]
            end = next((t + 1 for t, token in enumerate(ids) if token in eos_ids), len(ids))
            ids = ids[:end]
            cut = stop.cut(ids)
            rows.append(Decoded(ids if cut is None else ids[:cut], looped=cut is not None))
        return rows

    def _generate_batch(
        self, model, batch: list[list[int]], params: SamplingParams, eos_ids: list[int], pad_id: int,
        loop_stop: LoopStop | None = None,
    ) -> list[Sample]:
        """Left-pad ``batch`` (lists of prompt ids), generate with ``model`` (a sharded model: with ``synced_gpus``,
        every rank stepping until all are done), and split off the completions. ``loop_stop``: 'drop' stops looping
        rows early; ``generate`` cannot, so its rows are cut afterwards (same ids, no time saved)."""
        input_ids, attention_mask = _left_padded(batch, pad_id)
        width = input_ids.shape[1]
        if params.greedy:
            sampling = dict(do_sample=False)
        else:
            sampling = dict(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
        device = model.device
        decoder = self.decoder_for(model, params)
        if decoder == "drop":
            rows = decode(model, input_ids.to(device), attention_mask.to(device), params, eos_ids, loop_stop)
            return [self._to_sample(row.token_ids, set(eos_ids), row) for row in rows]
        static = dict(cache_implementation="static") if decoder == "static" else {}
        with _clean_generation_config(model):
            output = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),  # pad may equal EOS: the mask, not the id, marks padding
                max_new_tokens=params.max_new_tokens,
                eos_token_id=eos_ids,
                pad_token_id=pad_id,
                use_cache=True,
                synced_gpus=distributed.sharded(model),
                **static,
                **sampling,
            )
        return [self._to_sample(row, set(eos_ids), loop_stop=loop_stop) for row in output[:, width:].tolist()]

    def _to_sample(self, generated: list[int], eos: set[int], decoded: Decoded | None = None,
                   loop_stop: LoopStop | None = None) -> Sample:
        """The :class:`Sample` of one row's generated ids (cut after the first EOS); ``decoded``: its statistics
        (and whether the loop stop ended it); ``loop_stop``: cut a row that was generated whole where that stop
        would have ended it."""
        end = next((t + 1 for t, token in enumerate(generated) if token in eos), None)
        # No EOS: the row ran to max_new_tokens (generate only stops early once every row has an EOS; it pads the
        # rows that stopped, after their EOS, and decode() returns them without padding), or the loop stop ended it.
        ids = generated if end is None else generated[:end]
        looped = decoded is not None and decoded.looped
        if loop_stop is not None and (cut := loop_stop.cut(ids)) is not None:
            ids, end, looped = ids[:cut], None, True
        stats = {}
        if decoded is not None:
            stats = dict(logprobs=decoded.logprobs[: len(ids)], self_certainty=decoded.certainty_sum / max(len(ids), 1))
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Sample(ids, text, "length" if end is None else "stop", looped=looped, **stats)

    @staticmethod
    @contextlib.contextmanager
    def _rng(seed: int | None, device: torch.device):
        if seed is None:
            yield
            return
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    @contextlib.contextmanager
    def _progress(self, total: int):
        """Yields ``advance(n)``; draws a rich progress bar when ``show_progress``."""
        if not self.show_progress:
            yield lambda n: None
            return
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            task = progress.add_task("generating", total=total)
            yield lambda n: progress.advance(task, n)


def _left_padded(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, both ``(len(batch), longest)``: the rows of ``batch`` (prompt ids) left-padded
    with ``pad_id``, the mask 1 on each row's own ids."""
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, ids in enumerate(batch):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    return input_ids, attention_mask


@contextlib.contextmanager
def _clean_generation_config(model):
    """Swap in an empty ``GenerationConfig`` so the model's saved sampling defaults cannot leak in.

    transformers merges ``model.generation_config`` into every ``generate`` call (only fields we pass
    explicitly override it), so e.g. an Instruct model's ``repetition_penalty`` would otherwise apply.
    """
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved
