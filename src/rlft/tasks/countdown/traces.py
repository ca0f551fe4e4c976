"""Reasoning traces for an SFT warm start on Countdown.

A trace is the completion that follows a prompt ending in ``<think>``::

    <reasoning></think>
    <answer>EXPR</answer>

with the answer alone on the last line and no trailing newline (the tokenizer pipeline appends
EOS). Steps are written compactly (``3*5=15``: no spaces, each digit is a token anyway); the
answer uses the solver's spaced rendering (``3 * 5 + 7``).

Styles:

* ``"direct"`` - the steps of one solution: `` 3*5=15, 15+7=22.</think>...``
* ``"search"`` - a small search a person (or a 135M model) can imitate. All possible first steps
  (two numbers and an operation) are ranked by one rule: **the result closest to the target
  first** (ties: numbers in prompt order, then ``+ - * /``). Candidates are tried in that order.
  A failed candidate is shown as a *dead end*: its step, then the same rule applied greedily to
  the remaining numbers until one number is left, then ``no``. The first candidate that can reach
  the target is continued along a solution (again preferring the best-ranked step that still
  works), followed by a check line. Example (3 numbers, target 22)::

       3*7=21, 21+5=26, no.
      3*5=15, 15+7=22. Check: 3*5+7=22.</think>
      <answer>3 * 5 + 7</answer>

  At most ``max_dead_ends`` dead ends are shown. When more candidates fail before the solution,
  the best-ranked ones are shown (so the first try is always the closest result: one rule to
  imitate), then the trace jumps to the solution. With an integer ``seed`` a seeded random subset
  of the failures is shown instead (still in ranked order), e.g. for different dead ends in each
  epoch. Either way a trace is reproducible from its arguments.
* ``"bounded"`` - the same ranked search with no jump, by a searcher whose patience runs out: the
  candidates are tried in rank order, each written as its line (a dead end ending ``no.``, or the
  solution with its check); after each dead end the searcher gives up with probability
  ``give_up`` (and always after ``max_tries`` dead ends) and answers with its closest attempt::

       3*7=21, 21+5=26, no.
      Closest: 3*7+5=26.</think>
      <answer>3 * 7 + 5</answer>

  So a fixed set of these traces is, like the spec's cog_behav_all_strategies (whose completions
  are ~43% correct), a mixture of searches that succeed and searches that stop with a wrong
  answer; the rule reward tells them apart. With ``give_up=0.6`` about 48% of ``medium3`` traces
  are correct (the solution is the first-ranked candidate for 38% of tasks, within the first three
  for 67%). The give-up draws are seeded by ``seed`` and the task, so a trace is reproducible.

* ``"calc"`` - the ``bounded`` search (the same tries, give-up draws and seeding), each try a call of the
  calculator tool on the try's whole expression (:mod:`rlft.tasks.countdown.calc`; the prompt template ``calc``
  tells the model about it) instead of written arithmetic, followed by the observation the tool returns. The next
  call, or ``</think>`` once the value is the target, follows the observation directly::

       <tool_call>{"name":"calc","arguments":{"expression":"3*7+5"}}</tool_call>
      <tool_response>26</tool_response>
      <tool_call>{"name":"calc","arguments":{"expression":"3*5+7"}}</tool_call>
      <tool_response>22</tool_response>
      </think>
      <answer>3 * 5 + 7</answer>

  A searcher who gives up writes ``Closest: 3*7+5=26.`` after its last observation and answers that. Each
  observation is ``"\\n<tool_response>" + value + "</tool_response>\\n"`` with the exact value: the very text a
  rollout appends after that call (``tests/unit/test_tool_traces.py`` runs every call through the tool).
  :func:`rlft.tasks.countdown.calc.trace_segments` cuts a trace at its observations, which SFT does not train on
  (``rlft sft --trace-style calc --prompt-template calc``). Short, as a 135M model's 256-token budget counts only
  its own tokens: with ``give_up=0, max_tries=6`` (81% correct, as ``bounded``), the 2,000 ``standard`` training
  traces of ``rlft sft`` hold 119 of the model's tokens on average, EOS included, and 251 at most, plus 42
  observation tokens (SmolLM2; a comparison line such as ``26 is not 22.`` after each observation would put 10% over
  256).

Every number written in a trace is computed exactly; every ``direct`` and ``search`` trace scores
1.0 under :func:`rlft.rewards.countdown.compute_score`, a ``bounded`` or ``calc`` trace 1.0 or (given up)
0.1. Lengths with the defaults, in SmolLM2 tokens (one per digit): "easy3" search ~64 on average
(direct ~34); 4-number "standard" search ~111; "medium3" bounded ~61 (longest 144).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from itertools import combinations
from typing import Literal, get_args

from rlft.tasks.countdown.calc import call_text, observation_text
from rlft.tasks.countdown.solver import OPS, Step, Tree, apply, is_solvable, render
from rlft.types import CountdownTask, PromptCompletion

TraceStyle = Literal["direct", "search", "bounded", "calc"]
TRACE_STYLES: tuple[str, ...] = get_args(TraceStyle)

State = tuple[int, ...]


def _candidates(nums: State, target: int) -> list[tuple[Step, State]]:
    """Every allowed next step at ``nums`` with the numbers left after it, best-ranked first.

    Rank: ``|result - target|``, then the enumeration order (pairs in list order, ops + - * /).
    ``+`` and ``*`` keep list order (``44+19``); ``-`` and ``/`` put the larger number first. The
    new value goes to the front of the list. Steps that leave the same numbers as a better-ranked
    step (``6*1`` after ``6/1``) are dropped.
    """
    out = []
    for i, j in combinations(range(len(nums)), 2):
        x, y = nums[i], nums[j]
        rest = tuple(n for k, n in enumerate(nums) if k not in (i, j))
        for op in OPS:
            a, b = (x, y) if op in "+*" else (max(x, y), min(x, y))
            value = apply(a, op, b)
            if value is not None:
                out.append(((a, op, b, value), (value,) + rest))
    out.sort(key=lambda c: abs(c[0][3] - target))  # stable: ties keep enumeration order
    ranked, seen = [], set()
    for step, state in out:
        if tuple(sorted(state)) not in seen:
            seen.add(tuple(sorted(state)))
            ranked.append((step, state))
    return ranked


def _solution_path(nums: State, target: int) -> list[Step]:
    """Steps to the target, taking at each state the best-ranked step that can still reach it."""
    path = []
    while len(nums) > 1:
        step, nums = next((s, rest) for s, rest in _candidates(nums, target) if is_solvable(rest, target))
        path.append(step)
    return path


def solution_rank(nums: Sequence[int], target: int) -> int | None:
    """How many ranked first steps the patient search (``"bounded"``) tries and abandons before the solution's: the
    dead ends a trace that never gives up writes (0: the best-ranked first step leads to the target). None for an
    unsolvable task. ``solution_rank((3, 5, 7), 22) == 1`` (``3*7=21`` is tried first, then ``3*5=15``)."""
    state = tuple(int(n) for n in nums)
    if not is_solvable(state, target):
        return None
    if len(state) == 1:
        return 0
    first = _solution_path(state, target)[0]
    return next(i for i, (step, _) in enumerate(_candidates(state, target)) if step == first)


def _greedy_path(nums: State, target: int) -> list[Step]:
    """Steps taking the best-ranked candidate each time, until one number is left."""
    path = []
    while len(nums) > 1:
        step, nums = _candidates(nums, target)[0]
        path.append(step)
    return path


def _tree(nums: State, path: list[Step]) -> Tree:
    """The expression tree that ``path`` builds from ``nums``."""
    pool: list[tuple[int, Tree]] = [(n, n) for n in nums]

    def take(value: int) -> Tree:
        i = next(k for k, (v, _) in enumerate(pool) if v == value)
        return pool.pop(i)[1]

    for a, op, b, value in path:
        ta, tb = take(a), take(b)
        pool.append((value, (ta, op, tb)))
    assert len(pool) == 1, "a path must use every number"
    return pool[0][1]


def _steps_text(path: list[Step]) -> str:
    return ", ".join(f"{a}{op}{b}={v}" for a, op, b, v in path)


def write_trace(
    task: CountdownTask,
    style: TraceStyle = "search",
    *,
    max_dead_ends: int = 2,
    seed: int | None = None,
    give_up: float = 0.6,
    max_tries: int = 6,
) -> str:
    """The completion for ``task``: ``reasoning</think>\\n<answer>EXPR</answer>``.

    ``style`` is ``"direct"`` (solution steps only), ``"search"`` (ranked tries with up to
    ``max_dead_ends`` dead ends, then the solution and a check; when more candidates fail, the
    best-ranked are shown, or with an integer ``seed`` a seeded random subset of them) or
    ``"bounded"`` (ranked tries in order, giving up after each dead end with probability
    ``give_up`` and after ``max_tries`` dead ends at the latest; see the module docstring) or ``"calc"``
    (the ``"bounded"`` search with each try a calculator call and its observation, which the text holds:
    :func:`rlft.tasks.countdown.calc.trace_segments` finds them). The same arguments always give the
    same text. Raises ValueError for an unsolvable task, an unknown style, ``give_up`` outside [0, 1]
    or ``max_tries`` < 1.
    """
    if style not in TRACE_STYLES:
        raise ValueError(f"unknown trace style {style!r}; expected one of {', '.join(map(repr, TRACE_STYLES))}")
    if not 0.0 <= give_up <= 1.0 or max_tries < 1:
        raise ValueError(f"need 0 <= give_up <= 1 and max_tries >= 1, got give_up={give_up}, max_tries={max_tries}")
    nums, target = tuple(task.nums), task.target
    if not is_solvable(nums, target):
        raise ValueError(f"task {nums} -> {target} has no solution")
    if len(nums) == 1:
        return f" {target}.</think>\n<answer>{target}</answer>"
    path = _solution_path(nums, target)
    answer = render(_tree(nums, path))
    if style == "direct":
        return f" {_steps_text(path)}.</think>\n<answer>{answer}</answer>"
    if style in ("bounded", "calc"):
        writer = _bounded_trace if style == "bounded" else _calc_trace
        return writer(nums, target, path, answer, random.Random(f"{seed}:{nums}:{target}"), give_up, max_tries)

    # Search: the candidates ranked above the solution's first step all fail; show some of them.
    candidates = _candidates(nums, target)
    failed = candidates[: next(i for i, (step, _) in enumerate(candidates) if step == path[0])]
    if len(failed) > max_dead_ends:
        keep = range(max_dead_ends)
        if seed is not None:
            keep = sorted(random.Random(f"{seed}:{nums}:{target}").sample(range(len(failed)), max_dead_ends))
        failed = [failed[i] for i in keep]
    lines = [f"{_steps_text([s] + _greedy_path(r, target))}, no." for s, r in failed]
    lines.append(_check_line(path, answer, target))
    return _trace(lines, answer)


def _check_line(path: list[Step], answer: str, target: int) -> str:
    """The solution's steps and its check: ``3*5=15, 15+7=22. Check: 3*5+7=22.``"""
    return f"{_steps_text(path)}. Check: {answer.replace(' ', '')}={target}."


def _trace(lines: list[str], answer: str) -> str:
    return " " + "\n".join(lines) + f"</think>\n<answer>{answer}</answer>"


def _bounded_search(nums: State, target: int, path: list[Step], rng: random.Random, give_up: float,
                    max_tries: int) -> tuple[list[list[Step]], bool]:
    """The tries of a ``"bounded"`` search: ``(dead ends, solved)``. Ranked candidates are tried in order, each dead end
    finished greedily (its whole path), until the solution ``path``'s first step (the first-ranked candidate that can
    still reach the target: ``solved``) or until the searcher gives up (after each dead end with probability
    ``give_up``, drawn from ``rng``; always after ``max_tries`` dead ends)."""
    dead_ends: list[list[Step]] = []
    for step, rest in _candidates(nums, target):
        if step == path[0]:
            return dead_ends, True
        dead_ends.append([step] + _greedy_path(rest, target))
        if len(dead_ends) >= max_tries or rng.random() < give_up:
            break
    return dead_ends, False


def _closest(dead_ends: list[list[Step]], target: int) -> list[Step]:
    """The first dead end whose value is closest to ``target``."""
    return min(dead_ends, key=lambda tried: abs(tried[-1][3] - target))


def _bounded_trace(nums: State, target: int, path: list[Step], answer: str, rng: random.Random, give_up: float,
                   max_tries: int) -> str:
    """A ``"bounded"`` trace: the tries of :func:`_bounded_search` as lines, then the solution ``path`` with its check
    (``answer`` renders it) or the closest attempt."""
    dead_ends, solved = _bounded_search(nums, target, path, rng, give_up, max_tries)
    lines = [f"{_steps_text(tried)}, no." for tried in dead_ends]
    if solved:
        return _trace(lines + [_check_line(path, answer, target)], answer)
    closest = _closest(dead_ends, target)
    closest_answer = render(_tree(nums, closest))
    lines.append(f"Closest: {closest_answer.replace(' ', '')}={closest[-1][3]}.")
    return _trace(lines, closest_answer)


def _calc_trace(nums: State, target: int, path: list[Step], answer: str, rng: random.Random, give_up: float,
                max_tries: int) -> str:
    """A ``"calc"`` trace: the tries of :func:`_bounded_search` (the same search and draws as ``"bounded"``), each a
    call of the calculator on the try's whole expression and its observation (the exact value, as the tool returns
    it); then the answer, or the closest attempt."""
    dead_ends, solved = _bounded_search(nums, target, path, rng, give_up, max_tries)
    parts = [call_text(_compact(render(_tree(nums, tried)))) + observation_text(str(tried[-1][3]))
             for tried in dead_ends]
    if solved:
        parts.append(call_text(_compact(answer)) + observation_text(str(target)))
    else:
        closest = _closest(dead_ends, target)
        answer = render(_tree(nums, closest))
        parts.append(f"Closest: {_compact(answer)}={closest[-1][3]}.")
    return " " + "".join(parts) + f"</think>\n<answer>{answer}</answer>"


def _compact(expression: str) -> str:
    return expression.replace(" ", "")


def sft_examples(
    tasks: Iterable[CountdownTask],
    prompt_fn: Callable[[CountdownTask], str],
    style: TraceStyle = "search",
    *,
    max_dead_ends: int = 2,
    seed: int | None = None,
    give_up: float = 0.6,
    max_tries: int = 6,
) -> list[PromptCompletion]:
    """``PromptCompletion(prompt_fn(task), write_trace(task, ...))`` for every task."""
    return [
        PromptCompletion(prompt_fn(task), write_trace(task, style, max_dead_ends=max_dead_ends, seed=seed,
                                                      give_up=give_up, max_tries=max_tries))
        for task in tasks
    ]
