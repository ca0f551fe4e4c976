"""Solver-guided rollouts (``--hint solver`` / ``--hint solution``): a group whose k samples all fail is sampled again
from its prompt with a prefix of the solver's trace as the start of the assistant's text.

On a task where every sample fails, the group's rewards carry no signal (or only the format score's), and the step
learns nothing from it. BREAD (Zhang et al. 2025, "BREAD: Branched Rollouts from Expert Anchors Bridge SFT & RL for
Reasoning", arXiv 2506.17211) inserts a short expert prefix into such groups, so the model's own continuations of it
can succeed and carry signal, and lets the prefix shrink as the model improves. rlft's version:

- **Which groups**: those of the step with no sample scoring 1.0 (the rule reward's success); a group with a success
  is never hinted. Each is sampled once more, k samples from ``prompt + prefix``, which replaces the failed group
  in the step (the failed samples were generated: they count in ``tokens/generated``).
- **The prefix**: the solver's patient search (:func:`rlft.tasks.countdown.traces.write_trace` ``"bounded"`` with
  no giving up, so it ends at a solution; ``"calc"``, its calculator form, for ``--env countdown-calc``), cut at the
  last step boundary (after ``", "``, after a newline, or the reasoning's end) within ``fraction`` of its reasoning's
  characters (at least its first step): a partial expert search, never its ``</think>`` or answer line.
  ``--hint solution`` keeps only the search's last line, the solution's steps (``" 55-7=48, 48+36=84, 84-19=65.
  Check: ..."``), cut the same way within ``fraction`` of that line: the expert's own steps, as in BREAD, with no
  dead end before them. The patient search's prefix mostly holds dead ends (its attempts that fail come first), so
  at 0.5 it often stops before the solution's first step; the solution's prefix always holds one or more of its
  steps. It is plain text only (a calculator trace's solution is one call: no partial step to give).
- **How long**: ``fraction = --hint-fraction x (1 - step / --max-steps)``, shrinking linearly to 0 over the run.
  BREAD instead adapts the prefix per problem (branched rollouts from expert anchors, a prefix inserted "adaptively"
  so that each update holds at least one successful trace, per its abstract); rlft tries one prefix per failed group
  on one schedule for all: cheaper, and a hinted group may still hold no success (``hint/solved`` counts those that
  do).
- **What is trained**: the prefix is part of the prompt (context): ``loss_mask`` 0, no log-probs of its own, no KL;
  the advantages come from the hinted group's rewards as from any group's.

Metrics (:func:`hint_metrics`): ``hint/groups`` (hinted groups of the step), ``hint/solved`` (of those, the ones with
a success after the hint), ``hint/fraction`` and ``hint/chars`` (mean prefix length, characters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rlft.rl.records import RLPrompt
from rlft.types import CountdownTask

HintName = Literal["none", "solver", "solution"]

SOLVED = 1.0
"""The raw reward of a success (the Countdown rule's 1.0): a group with one is never hinted."""


@dataclass(frozen=True)
class HintOptions:
    """``--hint``, ``--hint-fraction``: solver-guided rollouts for groups that all fail (:mod:`rlft.rl.hints`)."""

    hint: HintName = "none"
    """'solver': a group whose k samples all fail is sampled again with a prefix of the solver's search as the start
    of the answer (BREAD, arXiv 2506.17211; the prefix is context, never trained); 'solution': the same with a prefix
    of the solution's steps alone (no dead ends; not with countdown-calc); 'none': off."""
    hint_fraction: float = 0.5
    """With --hint solver/solution: the prefix's share of the solver's reasoning at step 0, shrinking linearly to 0 at
    --max-steps."""

    def _check_hint(self, env: str | None, prompts_data: str | None, replay_size: int) -> None:
        """One-line errors for a hint that cannot act (OptionError)."""
        from rlft.environment import is_user_env
        from rlft.validation import require

        require(0.0 < self.hint_fraction <= 1.0, f"--hint-fraction must lie in (0, 1], got {self.hint_fraction}")
        if self.hint == "none":
            require(self.hint_fraction == 0.5, "--hint-fraction is only read with --hint solver")
            return
        require(prompts_data is None and not is_user_env(env) and env != "chat",
                f"--hint {self.hint} needs Countdown prompts: the solver writes their hints")
        require(replay_size == 0,
                f"--hint {self.hint} with --replay-size: a replayed group would lose its hinted prompt")
        require(self.hint != "solution" or env != "countdown-calc",
                "--hint solution with --env countdown-calc: a calculator trace's solution is one call, with no partial "
                "step to give; use --hint solver")


def hint_prefix(task: CountdownTask, fraction: float, style: str = "bounded", solution: bool = False) -> str:
    """The first ``fraction`` of the solver's reasoning for ``task``, cut at a step boundary (see the module
    docstring); ``style``: "bounded" (plain text) or "calc" (calculator calls and their observations); ``solution``:
    of the reasoning's last line only (the solution's steps, ``--hint solution``).

    Raises:
        ValueError: ``fraction`` outside (0, 1]; an unsolvable task; ``solution`` with the "calc" style.
    """
    from rlft.tasks.countdown.traces import write_trace

    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    trace = write_trace(task, style, give_up=0.0, max_tries=10_000)
    reasoning = trace[: trace.index("</think>")]
    if solution:
        if style != "bounded":
            raise ValueError(f"a solution prefix is plain text: style {style!r} has none")
        reasoning = reasoning[reasoning.rfind("\n") + 1 :]
        reasoning = reasoning if reasoning.startswith(" ") else " " + reasoning
    bounds = [m.end() for m in re.finditer(r", |\n", reasoning)] + [len(reasoning)]
    within = [b for b in bounds if b <= fraction * len(reasoning)]
    return reasoning[: within[-1] if within else bounds[0]]


def step_fraction(hint_fraction: float, step: int, max_steps: int) -> float:
    """``hint_fraction x (1 - step / max_steps)``: the prefix's share at ``step`` (0-based) of ``max_steps``."""
    return hint_fraction * (1.0 - step / max_steps)


def hinted_prompt(prompt: RLPrompt, fraction: float, style: str = "bounded",
                  solution: bool = False) -> tuple[RLPrompt, int]:
    """``prompt`` with the solver's prefix (:func:`hint_prefix`) appended to its text, and the prefix's length in
    characters.

    Raises:
        ValueError: a prompt with no Countdown ground truth (``target`` and ``numbers``)."""
    truth = prompt.ground_truth or {}
    if "target" not in truth or "numbers" not in truth:
        raise ValueError("--hint solver: the prompt has no Countdown ground truth (target, numbers)")
    prefix = hint_prefix(CountdownTask(tuple(truth["numbers"]), int(truth["target"])), fraction, style,
                         solution)
    return RLPrompt(prompt.text + prefix, prompt.messages, prompt.ground_truth), len(prefix)


def failed_groups(raw: list[list[float]]) -> list[int]:
    """Indices of the groups (rows of ``raw``, ``(G, k)`` raw rewards) with no success (every reward < 1.0)."""
    return [g for g, row in enumerate(raw) if max(row) < SOLVED]


def hint_metrics(groups: float, solved: float, fraction: float, chars: float) -> dict[str, float]:
    """The step's ``hint/*`` metrics (see the module docstring) from its sums: hinted ``groups``, the ``solved`` ones,
    the prefixes' total ``chars``; ``fraction`` the step's."""
    return {"hint/groups": groups, "hint/solved": solved, "hint/fraction": fraction,
            "hint/chars": chars / groups if groups else 0.0}
