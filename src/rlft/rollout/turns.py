"""Rollouts with several turns: a row that writes a complete tool call pauses, the tool runs, its output is appended
to the row's context, and generation resumes (the protocol: :mod:`rlft.rollout.tools`).

:func:`generate_turns` drives any decoder that can continue rows from token ids (:class:`rlft.rollout.hf.HFEngine`'s
'refill', 'drop', 'generate' and 'static'), turn by turn:

1. **Turn 0** decodes the B prompts' k samples exactly as a call without tools (the same jobs, the same seeds): a row
   stops at EOS, at its token budget, at the loop stop, or right after a complete ``</tool_call>`` (:class:`TurnStop`).
2. Each row that stopped at a call gets the tool's result as an observation: ``format_observation`` text tokenized
   on its own (no special tokens), cut to ``max_observation_tokens``, appended to the row's ids with ``loss_mask`` 0
   and no log-prob of its own (0.0 in ``Sample.logprobs``, masked).
3. **Turn t > 0** decodes the paused rows only, each from its whole context (prompt + its ids so far) as a new prompt,
   with ``budget = max_new_tokens - the model's tokens so far``. A row that finished never waits for another; a paused
   row waits only for its own turn's rows, so no row holds up the others. With a seed, a row's turn t draws from
   :func:`rlft.rollout.refill.job_seed` ``(seed, prompt, sample, t)``: a row's tokens depend on its own history only,
   whatever the batch size, the slots, or which other rows called tools.
4. It ends at an answer (EOS), at the model-token budget (``--max-new-tokens`` counts the model's own tokens only),
   at the loop stop, or at ``max_turns`` turns (a call in the last turn gets no observation; the row is then cut:
   ``finish_reason`` "length").

Each turn t > 0 prefills its rows' whole contexts again (no KV cache is kept across a tool call): the way for
decoders that only continue rows from token ids ('drop', 'generate', 'static').

:func:`generate_turns_inline` runs the same rollouts inside one continuous batch ('refill',
:func:`rlft.rollout.refill.decode_jobs` with ``resume``): a row that ends a turn with a call keeps its slot and its
KV cache; the tool runs at once and the observation's ids are fed to the row one decoding step each (log-prob 0.0,
``loss_mask`` 0), while the other rows go on sampling; then its next turn draws from the same
``job_seed(seed, prompt, sample, t)`` as above. The samples are the turn-by-turn ones up to floating-point differences
of the logits (a cached context against a prefilled one), and no context is prefilled twice. The FLOPs estimate counts
every completion id (observations included) once, as processed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.decode import Decoded
from rlft.rollout.loops import LoopStop, token_ids_containing
from rlft.rollout.refill import job_seed
from rlft.rollout.tools import ends_with_call, format_observation, last_call, run_tool_call


@dataclass(frozen=True)
class ToolUse:
    """What a rollout with tools may do: the tools, and its turn and observation bounds."""

    tools: Mapping[str, Callable[..., object]] = field(default_factory=dict)
    """``name -> function(**arguments)`` returning text or a number; a function with a ``context`` parameter also gets
    the prompt's context (a task's ground truth)."""
    max_turns: int = 8
    """Most model turns per rollout (so at most ``max_turns - 1`` observations)."""
    max_observation_tokens: int = 32
    """Most tokens of one observation (longer ones are cut)."""
    timeout_s: float = 5.0
    """Most seconds one tool call may run before the model gets an error observation."""

    def __post_init__(self):
        if self.max_turns < 1 or self.max_observation_tokens < 1 or self.timeout_s <= 0:
            raise ValueError(f"max_turns and max_observation_tokens must be >= 1 and timeout_s > 0, got "
                             f"{self.max_turns}, {self.max_observation_tokens}, {self.timeout_s}")


def tool_use_for(tools: Mapping[str, Callable[..., object]], bounds, max_turns: int | None = None) -> ToolUse | None:
    """``tools`` with the bounds a command parsed (``bounds``: anything with ``max_turns``, ``max_observation_tokens``
    and ``tool_timeout``, such as :class:`rlft.options.EnvOptions` or a config holding it) and ``max_turns`` instead of
    ``bounds.max_turns`` when given (an environment's own); None when there are no tools."""
    if not tools:
        return None
    return ToolUse(dict(tools), max_turns or bounds.max_turns, bounds.max_observation_tokens, bounds.tool_timeout)


def close_token_ids(tokenizer) -> frozenset[int]:
    """The ids whose decoded text contains ``>``: only a step that emits one can complete ``</tool_call>``."""
    return token_ids_containing(tokenizer, ">")


class TurnStop:
    """The decoders' per-row stop for a turn (the interface of :class:`rlft.rollout.loops.LoopStop`): a row stops
    right after a complete tool call, or where the loop stop ends it."""

    def __init__(self, tokenizer, loop: LoopStop | None = None):
        self.tokenizer, self.loop = tokenizer, loop
        self.call_ids = close_token_ids(tokenizer)
        self.trigger_ids = self.call_ids | (loop.trigger_ids if loop is not None else frozenset())

    def called(self, token_ids: list[int]) -> bool:
        """True when the decoded ``token_ids`` (one turn's) end with a complete tool call."""
        return ends_with_call(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def looped(self, token_ids: list[int]) -> bool:
        """True when the row stops after its last token: a complete call, or a repeated line."""
        last = token_ids[-1]
        if last in self.call_ids and self.called(token_ids):
            return True
        return self.loop is not None and last in self.loop.trigger_ids and self.loop.looped(token_ids)

    def cut(self, token_ids: list[int]) -> int | None:
        """Tokens kept of a row generated whole (transformers ``generate``): up to where :meth:`looped` first holds."""
        for t, token in enumerate(token_ids):
            if token in self.trigger_ids and self.looped(token_ids[: t + 1]):
                return t + 1
        return None


class DecodeTurn(Protocol):
    def __call__(self, prompts: list[list[int]], jobs: list[tuple[int, int]], seeds: list[int] | None,
                 budgets: list[int], stop: TurnStop) -> list[Decoded]:
        """Decode job ``(i, j)`` from ``prompts[i]`` with at most ``budgets[job]`` tokens, stopping a row where ``stop``
        says (``Decoded.looped``) or at EOS (kept); ``seeds``: one per job, None: the call's seed for every job
        (:func:`rlft.rollout.refill.job_seed` of its pair)."""
        ...


@dataclass
class _Row:
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    certainty: float = 0.0
    model_tokens: int = 0
    calls: int = 0
    errors: int = 0
    finish: str | None = None
    looped: bool = False


def generate_turns(decode_turn: DecodeTurn, tokenizer, prompt_ids: list[list[int]], params: SamplingParams,
                   tool_use: ToolUse, eos_ids: list[int], contexts: list[dict | None] | None = None
                   ) -> list[list[Sample]]:
    """``params.k`` rollouts with tool calls for each prompt (see the module docstring); ``result[b][j]``.

    Args:
        decode_turn: the engine's decoder for one turn (:class:`DecodeTurn`).
        prompt_ids: ``B`` prompts' token ids.
        tool_use: the tools and bounds.
        eos_ids: a row ends at the first of these (kept).
        contexts: per prompt, what a tool with a ``context`` parameter receives; None: nothing.
    Returns:
        B lists of k :class:`Sample`: ``completion_ids`` the model's tokens and the observations in order,
        ``loss_mask`` 1 on the model's and 0 on the observations' tokens, ``logprobs`` 0.0 on observations,
        ``tool_calls`` and ``tool_errors`` counted, ``text`` the decoded whole.
    """
    k, eos = params.k, set(eos_ids)
    keys = [(b, j) for b in range(len(prompt_ids)) for j in range(k)]
    rows = [_Row() for _ in keys]
    stop = TurnStop(tokenizer, LoopStop(tokenizer, params.stop_repeats) if params.stop_repeats else None)
    pending = list(range(len(keys)))
    for turn in range(tool_use.max_turns):
        if not pending:
            break
        if turn == 0:
            prompts, jobs, seeds = prompt_ids, keys, None
        else:
            prompts = [prompt_ids[keys[r][0]] + rows[r].ids for r in pending]
            jobs = [(i, 0) for i in range(len(pending))]
            seeds = None if params.seed is None else [job_seed(params.seed, *keys[r], turn) for r in pending]
        budgets = [params.max_new_tokens - rows[r].model_tokens for r in pending]
        decoded = decode_turn(prompts, jobs, seeds, budgets, stop)
        paused = []
        for r, d in zip(pending, decoded):
            row, ids = rows[r], d.token_ids
            row.ids += ids
            row.mask += [1] * len(ids)
            if row.logprobs is not None:
                row.logprobs = row.logprobs + list(d.logprobs) if len(d.logprobs) == len(ids) else None
            row.certainty += d.certainty_sum
            row.model_tokens += len(ids)
            if ids and ids[-1] in eos:
                row.finish = "stop"
            elif ids and stop.called(ids):
                row.calls += 1
                if turn + 1 == tool_use.max_turns or row.model_tokens >= params.max_new_tokens:
                    row.finish = "length"
                    continue
                context = contexts[keys[r][0]] if contexts is not None else None
                result, ok = run_tool_call(last_call(tokenizer.decode(ids, skip_special_tokens=True)), tool_use.tools,
                                           context, timeout_s=tool_use.timeout_s)
                row.errors += not ok
                observation = tokenizer(format_observation(result), add_special_tokens=False)["input_ids"]
                observation = list(observation)[: tool_use.max_observation_tokens]
                row.ids += observation
                row.mask += [0] * len(observation)
                if row.logprobs is not None:
                    row.logprobs += [0.0] * len(observation)
                paused.append(r)
            else:
                row.finish, row.looped = "length", d.looped
        pending = paused
    samples = [
        Sample(row.ids, tokenizer.decode(row.ids, skip_special_tokens=True), row.finish or "length",
               logprobs=row.logprobs, self_certainty=row.certainty / max(row.model_tokens, 1), looped=row.looped,
               loss_mask=row.mask, tool_calls=row.calls, tool_errors=row.errors) for row in rows
    ]
    return [samples[b * k : (b + 1) * k] for b in range(len(prompt_ids))]


class DecodeAll(Protocol):
    def __call__(self, prompts: list[list[int]], jobs: list[tuple[int, int]], stop: TurnStop,
                 resume: Callable[[int, list[int], int], list[int] | None]) -> list[Decoded]:
        """Decode every job ``(i, j)`` from ``prompts[i]`` with continuous batching, calling ``resume`` where ``stop``
        ends a turn (:func:`rlft.rollout.refill.decode_jobs`)."""
        ...


def generate_turns_inline(decode_all: DecodeAll, tokenizer, prompt_ids: list[list[int]], params: SamplingParams,
                          tool_use: ToolUse, eos_ids: list[int], contexts: list[dict | None] | None = None
                          ) -> list[list[Sample]]:
    """The rollouts of :func:`generate_turns` with each row's cache kept across its calls (see the module docstring):
    the same arguments (``decode_all`` instead of a one-turn decoder) and the same samples, ``result[b][j]``."""
    k, eos = params.k, set(eos_ids)
    keys = [(b, j) for b in range(len(prompt_ids)) for j in range(k)]
    rows = [_Row() for _ in keys]
    observed: list[list[tuple[int, int]]] = [[] for _ in keys]  # per job: (start, length) of each observation
    stop = TurnStop(tokenizer, LoopStop(tokenizer, params.stop_repeats) if params.stop_repeats else None)

    def resume(job: int, token_ids: list[int], turn_start: int) -> list[int] | None:
        """The observation to feed after the job's turn ended with a call; None after a loop or the last turn."""
        if not stop.called(token_ids[turn_start:]):
            return None  # a repeated line: the row ends, looped
        row = rows[job]
        row.calls += 1
        model_tokens = len(token_ids) - sum(n for _, n in observed[job])
        if len(observed[job]) + 1 == tool_use.max_turns or model_tokens >= params.max_new_tokens:  # its last turn
            row.finish = "length"  # a call in the last turn gets no observation
            return None
        context = contexts[keys[job][0]] if contexts is not None else None
        result, ok = run_tool_call(last_call(tokenizer.decode(token_ids[turn_start:], skip_special_tokens=True)),
                                   tool_use.tools, context, timeout_s=tool_use.timeout_s)
        row.errors += not ok
        observation = tokenizer(format_observation(result), add_special_tokens=False)["input_ids"]
        observation = list(observation)[: tool_use.max_observation_tokens]
        observed[job].append((len(token_ids), len(observation)))  # one a turn: len(observed[job]) turns done
        return observation

    decoded = decode_all(prompt_ids, keys, stop, resume)
    samples = []
    for job, (row, d) in enumerate(zip(rows, decoded)):
        mask = [1] * len(d.token_ids)
        for start, n in observed[job]:
            mask[start : start + n] = [0] * n
        row.model_tokens = sum(mask)
        if row.finish is None:  # not a call in the last turn
            row.finish = "stop" if d.token_ids and d.token_ids[-1] in eos and mask[-1] else "length"
            row.looped = d.looped
            last_turn = observed[job][-1][0] + observed[job][-1][1] if observed[job] else 0
            if row.finish == "length" and not d.looped and stop.called(d.token_ids[last_turn:]):
                row.calls += 1  # a call that used up the budget: counted, not run (as turn by turn)
        samples.append(Sample(d.token_ids, tokenizer.decode(d.token_ids, skip_special_tokens=True), row.finish,
                              logprobs=list(d.logprobs), self_certainty=d.certainty_sum / max(row.model_tokens, 1),
                              looped=row.looped, loss_mask=mask, tool_calls=row.calls, tool_errors=row.errors))
    return [samples[b * k : (b + 1) * k] for b in range(len(prompt_ids))]


class WithTools:
    """An engine whose ``generate(prompts, params)`` runs rollouts with ``tool_use``, each prompt's tools given the
    context recorded for its text (``contexts``: prompt text -> context): for callers that only know the one-turn
    interface (the pairs journal, :func:`rlft.rollout.journal.sample_with_journal`). Other attributes are the
    engine's."""

    def __init__(self, engine, tool_use: ToolUse, contexts: Mapping[str, dict]):
        self.engine, self.tool_use, self.contexts = engine, tool_use, contexts

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        return self.engine.generate(prompts, params, tool_use=self.tool_use,
                                    contexts=[self.contexts.get(p) for p in prompts])

    def __getattr__(self, name: str):
        return getattr(self.engine, name)
