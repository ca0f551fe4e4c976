"""Countdown with a calculator tool: the prompt's instructions, the text of a call and of its observation as a trace
writes them, and a completion split at its observations so that the loss mask can leave them out.

The protocol is :mod:`rlft.rollout.tools`' (the Hermes / Qwen2.5 tags): the model writes
``<tool_call>{"name":"calc","arguments":{"expression":"3*5+7"}}</tool_call>``, generation pauses, and the
observation ``"\\n<tool_response>22</tool_response>\\n"`` is appended (``loss_mask`` 0). The tags are written here
as text, as :mod:`rlft.tasks.countdown.traces` writes ``<answer>`` tags for the score to read: docs/design.md's
layer table lets ``tasks/`` import only layer 0 and ``data``, so this module cannot import ``rollout/``;
``tests/unit/test_tool_traces.py`` checks that both write and read the same text. The tool itself,
:func:`rlft.rewards.countdown_calc.calc`, sits beside the score whose parser it uses.
"""

from __future__ import annotations

import json
import re

CALC_TOOL = "calc"
"""The calculator's name in a call (the key of :data:`rlft.rewards.countdown_calc.CALC_TOOLS`)."""
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_OBSERVATION = re.compile(re.escape(TOOL_CALL_CLOSE) + r"\s*?(\n" + re.escape(RESPONSE_OPEN) + ".*?"
                          + re.escape(RESPONSE_CLOSE) + r"\n)", re.DOTALL)


def call_text(expression: str) -> str:
    """A call of the calculator, as the model writes it: ``<tool_call>{"name":"calc","arguments":{"expression":
    "3*5+7"}}</tool_call>``, compact JSON (3 SmolLM2 tokens fewer than ``json.dumps``' spacing, same object)."""
    payload = json.dumps({"name": CALC_TOOL, "arguments": {"expression": expression}}, separators=(",", ":"))
    return TOOL_CALL_OPEN + payload + TOOL_CALL_CLOSE


def observation_text(result: str) -> str:
    """The observation appended after a call whose result text is ``result``:
    ``"\\n<tool_response>" + result + "</tool_response>\\n"`` (:func:`rlft.rollout.tools.format_observation`)."""
    return f"\n{RESPONSE_OPEN}{result}{RESPONSE_CLOSE}\n"


CALC_INSTRUCTIONS = (
    "You can compute an expression with the calculator: write " + call_text("(1+2)/3")
    + " and its value comes back in " + RESPONSE_OPEN + " " + RESPONSE_CLOSE + " tags."
)
"""What the ``calc`` prompt template adds to the user's text: the tool exists, and its exact call syntax."""


def trace_segments(text: str) -> list[tuple[str, bool]]:
    """``text`` (a completion) cut at its observations: ``[(piece, trained), ...]`` in order, ``trained`` False on
    each observation and True on the model's text between them; the pieces join back to ``text``, and empty pieces
    are left out (``""`` gives ``[]``).

    An observation is what :func:`observation_text` writes (``"\\n<tool_response>...</tool_response>\\n"``, up to the
    first ``"</tool_response>\\n"``) right after a call's closing ``</tool_call>`` (whitespace between them aside):
    the model's own text never holds one there, since generation pauses at the closing tag. A ``<tool_response>``
    the model wrote anywhere else, or one that never closes, is the model's text (trained). Any completion can be
    cut, with or without tool calls: one with no observation is one trained piece.
    """
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for match in _OBSERVATION.finditer(text):
        start, end = match.span(1)
        pieces += [(text[pos:start], True), (text[start:end], False)]
        pos = end
    pieces.append((text[pos:], True))
    return [(piece, trained) for piece, trained in pieces if piece]


def has_observations(text: str) -> bool:
    """Whether :func:`trace_segments` finds an observation in ``text``."""
    return _OBSERVATION.search(text) is not None
