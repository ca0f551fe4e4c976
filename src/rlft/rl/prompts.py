"""Prompt sources of the RL loop: what the policy is asked, and how the run is evaluated.

Prompts are :class:`rlft.rl.records.RLPrompt` records (re-exported here). A :class:`PromptSource` bundles the
training prompts, the held-out prompts and an ``evaluate(engine)`` function; the loop is given one and never looks
inside. Two sources exist:

- **Countdown**: generated tasks of a preset (or a Countdown file), rendered with a prompt template;
  evaluation is the greedy Countdown score on held-out tasks that no stage trains on
  (``eval/score``, ``eval/accuracy``, ``eval/format_rate``).
- **Chat** (``--prompts-data``): the prompts of a preference/chat dataset rendered with the chat
  template; evaluation is the mean reward of greedy replies to held-out prompts (``eval/reward``,
  ``eval/truncated_frac``).

Under torchrun every rank evaluates its shard of the held-out prompts and the means are combined
(:func:`evaluate_sharded`): with FSDP2 generation is collective, so no rank may evaluate alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from rlft import distributed
from rlft.eval.countdown_command import countdown_env
from rlft.rl.records import Reward, RLPrompt
from rlft.rollout.base import SamplingParams
from rlft.rollout.hf import encode_prompts
from rlft.rollout.turns import ToolUse
from rlft.types import CountdownTask

if TYPE_CHECKING:
    from rlft.rl.config import RLConfig

log = logging.getLogger("rlft")


def load_rl_tasks(cfg: RLConfig) -> tuple[list[CountdownTask], list[CountdownTask]]:
    """``(train, heldout)`` Countdown tasks: the split every Countdown command shares,
    :meth:`rlft.tasks.countdown.options.CountdownTrainingOptions.training_tasks` of ``num_train`` tasks with the
    ``eval_rows`` part held out.

    Generated (``cfg.data`` None): the first ``num_train`` training tasks of ``--preset`` and ``--split-seed`` and the
    first ``heldout_size`` held-out tasks (disjoint). From a Countdown dataset (``cfg.data``): its first ``num_train``
    training rows (held-out rows, and rows equal to one, never train) and its ``eval_rows`` part (validation or test)
    as the held-out tasks; with ``data_heldout`` off, its first ``num_train`` rows and no held-out tasks.

    Raises:
        ValueError: an unknown preset, no training task; rlft.data.files.DataError: a malformed row.
    """
    train, heldout = cfg.training_tasks(cfg.num_train, heldout=cfg.eval_rows)
    if cfg.data is not None and not cfg.data_heldout:
        log.info("%s: %d training rows, none held out (--no-data-heldout: no in-loop evaluation)", cfg.data, len(train))
    elif cfg.data is not None:
        log.info("%s: %d training rows; the in-loop evaluation reads its %d held-out %s rows", cfg.data, len(train),
                 len(heldout), cfg.eval_rows)
    if not train:
        raise ValueError("no Countdown training tasks")
    return train, heldout


def read_chat_prompts(source: str, split: str, limit: int | None = None) -> list[list[dict]]:
    """Prompt conversations of a preference or chat dataset, file order, duplicates removed.

    Rows are read with :func:`rlft.data.preferences.load_chat_examples` (H4 ``messages``/``chosen``
    lists, flattened ``prompt``/``chosen`` strings, HH-RLHF, smol-smoltalk ``messages``); each row's
    prompt is its conversation before the final assistant turn. Invalid rows are skipped, counted and
    logged by the loader (e.g. the empty ``chosen`` of a flattened UltraFeedback row).
    """
    from rlft.data.preferences import load_chat_examples

    examples, counts = load_chat_examples(source, split=split, limit=limit, skip_invalid=True)
    if not examples:
        raise ValueError(
            f"{source} ({split}): no usable prompt in {counts['rows']} rows ({counts['skipped_invalid']} invalid)")
    unique: dict[str, list[dict]] = {}
    for ex in examples:
        last = max(i for i, m in enumerate(ex.messages) if m["role"] == "assistant")
        prompt = ex.messages[:last]
        unique.setdefault(json.dumps(prompt, sort_keys=True, ensure_ascii=False), prompt)
    log.info("%s (%s): %d prompts from %d rows (%d invalid skipped, %d duplicates)", source, split, len(unique),
             counts["rows"], counts["skipped_invalid"], counts["kept"] - len(unique))
    return list(unique.values())


def load_chat_prompts(cfg: RLConfig, tokenizer) -> tuple[list[RLPrompt], list[RLPrompt]]:
    """``(train, eval)`` chat prompts of ``cfg.prompts_data``, rendered with ``tokenizer``'s chat template.

    Prompts longer than ``max_prompt_tokens`` are dropped first (counted in the log). Eval prompts (only
    when ``eval_every`` and ``eval_prompts`` are set): the first ``eval_prompts`` of ``eval_split``, or
    else the last ``eval_prompts`` of the training prompts, which are then not trained on. Training
    prompts equal to an eval prompt are dropped in both cases.
    """
    from rlft.data.chat import render_generation_prompt

    def rendered(conversations: list[list[dict]], what: str) -> list[RLPrompt]:
        prompts = [RLPrompt(render_generation_prompt(tokenizer, m), m, {"messages": m}) for m in conversations]
        if cfg.max_prompt_tokens is not None:
            lengths = [
                len(ids) for ids in encode_prompts(tokenizer, [p.text for p in prompts], add_special_tokens=False)
            ]
            kept = [p for p, n in zip(prompts, lengths) if n <= cfg.max_prompt_tokens]
            if len(kept) < len(prompts):
                log.info("%s prompts: dropped %d of %d longer than max_prompt_tokens=%d", what,
                         len(prompts) - len(kept), len(prompts), cfg.max_prompt_tokens)
            prompts = kept
        return prompts

    train = rendered(read_chat_prompts(cfg.prompts_data, cfg.prompts_split, cfg.prompts_limit), "training")
    heldout: list[RLPrompt] = []
    if cfg.eval_every and cfg.eval_prompts:
        if cfg.eval_split is not None:
            heldout = rendered(read_chat_prompts(cfg.prompts_data, cfg.eval_split), "eval")[: cfg.eval_prompts]
            if not heldout:
                raise ValueError(f"no eval prompts in {cfg.prompts_data} (split {cfg.eval_split})")
        else:
            if len(train) <= cfg.eval_prompts:
                raise ValueError(
                    f"{cfg.prompts_data} has {len(train)} usable prompts: too few to hold out "
                    f"eval_prompts={cfg.eval_prompts} and train on the rest")
            train, heldout = train[: -cfg.eval_prompts], train[-cfg.eval_prompts :]
    held = {p.text for p in heldout}
    if dropped := sum(p.text in held for p in train):
        log.info("dropped %d training prompts equal to eval prompts", dropped)
        train = [p for p in train if p.text not in held]
    if not train:
        raise ValueError(f"no training prompts in {cfg.prompts_data}")
    return train, heldout


def load_prompts(cfg: RLConfig, tokenizer) -> tuple[list[RLPrompt], list[RLPrompt], list[CountdownTask] | None]:
    """``(train, eval, eval_tasks)``: chat prompts (``eval_tasks`` None), or Countdown prompts rendered with
    ``prompt_template`` (``--env countdown-calc``: the 'calc' template; ``eval_tasks``: the first ``eval_limit``
    held-out tasks)."""
    if cfg.prompts_data is not None:
        return *load_chat_prompts(cfg, tokenizer), None
    from rlft.tasks.countdown.prompts import render_prompt

    template, _ = countdown_env(cfg)
    tasks, heldout = load_rl_tasks(cfg)
    train = [RLPrompt(render_prompt(template, t, tokenizer), None, t.ground_truth()) for t in tasks]
    eval_tasks = heldout[: cfg.eval_limit]
    return train, [RLPrompt(render_prompt(template, t, tokenizer), None, t.ground_truth()) for t in eval_tasks
                   ], eval_tasks


def evaluate_chat(engine, prompts: list[RLPrompt], reward: Reward, max_new_tokens: int) -> dict[str, float]:
    """Greedy responses to held-out chat prompts: ``eval/reward`` (mean raw reward, no truncation
    penalty) and ``eval/truncated_frac``."""
    samples = [
        row[0] for row in engine.generate([p.text for p in prompts
                                           ], SamplingParams(k=1, temperature=0.0, max_new_tokens=max_new_tokens))
    ]
    scores = reward.fn(prompts, [s.text for s in samples])
    return {
        "eval/reward": sum(scores) / len(scores),
        "eval/truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples)
    }


def evaluate_heldout(engine, tasks: list[CountdownTask], prompts: list[str], max_new_tokens: int,
                     tool_use: ToolUse | None = None) -> dict[str, float]:
    """Greedy Countdown evaluation: ``eval/score`` (mean 0/0.1/1 score), ``eval/accuracy``, ``eval/format_rate``;
    with tools also ``eval/tool_calls`` and ``eval/tool_errors`` (per answer)."""
    from rlft.eval.countdown import evaluate_countdown

    result = evaluate_countdown(engine, tasks, prompts,
                                SamplingParams(k=1, temperature=0.0, max_new_tokens=max_new_tokens), tool_use=tool_use)
    tools = {"eval/tool_calls": result.tool_calls_per_answer,
             "eval/tool_errors": result.tool_errors_per_answer} if tool_use is not None else {}
    return {"eval/score": result.mean_score, "eval/accuracy": result.accuracy, "eval/format_rate": result.format_rate,
            **tools}


def evaluate_sharded(engine, n: int, evaluate_part: Callable[[list[int]], dict[str, float]],
                     params: SamplingParams) -> dict[str, float]:
    """Metrics that are means over ``n`` held-out items, evaluated by every rank on its
    :func:`rlft.distributed.shard` of ``range(n)``: ``evaluate_part(indices)`` gives the means over those items,
    and the rank means weighted by their item counts are summed over ranks (the one-process means up to float
    rounding). A part makes one ``engine.generate`` call; a rank with no items makes that call with no prompts
    (``params``: the part's sampling), since a sharded model's generation is collective. Collective under
    torchrun: every rank must call it. Not distributed: ``evaluate_part(list(range(n)))``."""
    if not distributed.active():
        return evaluate_part(list(range(n)))
    mine = distributed.shard(list(range(n)))
    if mine:
        means = evaluate_part(mine)
    else:
        engine.generate([], params)
        means = {}
    sums = distributed.all_reduce_sums({key: value * len(mine) for key, value in means.items()})
    return {key: value / n for key, value in sums.items()}


@dataclass(frozen=True)
class PromptSource:
    """What the RL loop samples from and how it evaluates: built once, before the loop."""

    train: list[RLPrompt]
    """Training prompts; step s takes those of :func:`rlft.recipes.common.batch_indices`."""
    eval: list[RLPrompt]
    """Held-out prompts (never trained on); empty: no evaluation."""
    evaluate: Callable[[object], dict[str, float]]
    """``evaluate(engine) -> metrics`` on the held-out prompts (greedy; under torchrun every rank evaluates its shard:
    call it on every rank)."""
    kind: str
    """'countdown', 'chat' or 'env' (a user's environment)."""
    tool_use: ToolUse | None = None
    """The tools rollouts may call (``--env countdown-calc``, a user's environment with tools); None: one turn."""


def make_prompt_source(cfg: RLConfig, tokenizer, reward: Reward) -> PromptSource:
    """The run's prompt source of a built-in environment: chat prompts when ``cfg.prompts_data`` is set, else
    Countdown tasks (with the calculator for ``--env countdown-calc``). A user's environment has its own
    (:func:`rlft.rl.environments.environment_source`)."""
    train, held, eval_tasks = load_prompts(cfg, tokenizer)
    params = SamplingParams(k=1, temperature=0.0,
                            max_new_tokens=cfg.eval_max_new_tokens)  # what both evaluations sample with
    if eval_tasks is None:
        def evaluate(engine):
            return evaluate_sharded(
                engine, len(held),
                lambda part: evaluate_chat(engine, [held[i] for i in part], reward, cfg.eval_max_new_tokens), params)

        return PromptSource(train, held, evaluate, "chat")
    texts = [p.text for p in held]
    _, tool_use = countdown_env(cfg)

    def evaluate_countdown_tasks(engine):
        return evaluate_sharded(
            engine, len(held), lambda part: evaluate_heldout(engine, [eval_tasks[i] for i in part],
                                                             [texts[i] for i in part], cfg.eval_max_new_tokens,
                                                             tool_use), params)

    return PromptSource(train, held, evaluate_countdown_tasks, "countdown", tool_use)
