"""Tool calls in a completion: the text protocol, parsing, and running a tool with a bounded time.

The protocol is the Hermes / Qwen2.5 one that TRL, verifiers and verl's agent loop read: the model writes one JSON
object with the tool's name and arguments between tags, and generation of that row pauses right after the closing
tag::

    <tool_call>{"name": "calc", "arguments": {"expression": "93-24+2"}}</tool_call>

The environment runs the call and its result goes back into the row's context as an *observation*, which the model
did not write (``loss_mask`` 0, no log-probs of its own)::

    \\n<tool_response>71</tool_response>\\n

then generation resumes. A call that cannot be parsed, names no tool, has arguments the tool rejects, raises,
returns something that is not text or a number, or runs past its time limit gets an observation that starts with
``error:`` (:func:`run_tool_call`): the model sees the error and the rollout goes on.

Text only: a chat model's template may render tool messages its own way; rlft appends the observation text to the
completion as it is, for base and chat prompts alike (docs/design.md, "Environments").
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"
MAX_RESULT_CHARS = 1_000
"""Longest tool result kept, in characters (the rest is cut and ``...`` appended); the observation's token bound is
the engine's (``max_observation_tokens``)."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict


def format_observation(result: str) -> str:
    """The text appended after a call: ``"\\n<tool_response>" + result + "</tool_response>\\n"``."""
    return f"\n{RESPONSE_OPEN}{result}{RESPONSE_CLOSE}\n"


def ends_with_call(text: str) -> bool:
    """True when ``text`` (one turn's model text) ends, trailing whitespace aside, with a closing tag that closes an
    opening tag written after the turn's last closing tag: the point where generation of the row pauses."""
    stripped = text.rstrip()
    if not stripped.endswith(TOOL_CALL_CLOSE):
        return False
    body = stripped[: -len(TOOL_CALL_CLOSE)]
    return body.rfind(TOOL_CALL_OPEN) > body.rfind(TOOL_CALL_CLOSE)


def last_call(text: str) -> str:
    """The JSON text between the last opening tag of ``text`` and its closing tag (``text`` ends with a call:
    :func:`ends_with_call`)."""
    stripped = text.rstrip()[: -len(TOOL_CALL_CLOSE)]
    return stripped[stripped.rfind(TOOL_CALL_OPEN) + len(TOOL_CALL_OPEN):].strip()


def parse_tool_call(payload: str) -> ToolCall:
    """The call in ``payload`` (the text between the tags): a JSON object ``{"name": str, "arguments": object}``.

    Raises:
        ValueError: not JSON, not an object, no string ``name``, or ``arguments`` not an object (one line, shown to the
            model as its observation).
    """
    try:
        value = json.loads(payload)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"the call is not JSON ({exc.msg if hasattr(exc, 'msg') else 'too deep'})") from None
    if not isinstance(value, dict):
        raise ValueError("the call must be a JSON object with \"name\" and \"arguments\"")
    name, arguments = value.get("name"), value.get("arguments", {})
    if not isinstance(name, str):
        raise ValueError("the call has no string \"name\"")
    if not isinstance(arguments, dict):
        raise ValueError("the call's \"arguments\" must be a JSON object")
    return ToolCall(name, arguments)


def _as_text(result: object) -> str:
    if isinstance(result, bool) or not isinstance(result, (str, int, float)):
        raise TypeError(f"the tool returned {type(result).__name__}, not text or a number")
    if isinstance(result, float):
        if not math.isfinite(result):
            return str(result)
        return str(int(result)) if result.is_integer() and abs(result) < 1e15 else f"{result:.6g}"
    text = str(result)
    return text if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS] + "..."


def run_tool_call(payload: str, tools: Mapping[str, Callable[..., object]], context: dict | None = None, *,
                  timeout_s: float = 5.0) -> tuple[str, bool]:
    """Run the call written as ``payload`` and return ``(result text, ok)``; never raises.

    ``tools[name](**arguments)`` runs in a worker thread; a tool that accepts a ``context`` keyword also gets
    ``context`` (the prompt's ground truth, e.g. a Countdown task's numbers). A result that is a string or a number
    is the observation (floats: integers without ``.0``, else 6 significant digits; strings cut at
    :data:`MAX_RESULT_CHARS`). Anything else gives ``("error: <one line>", False)``: an unparseable call, an unknown
    tool, a ``TypeError`` from the arguments, any exception the tool raises, a result of another type, or no result
    within ``timeout_s`` seconds (the call runs in a daemon thread, abandoned, not killed, at the limit: a tool that
    never returns keeps its thread but neither the rollout nor the process's exit waits for it).
    """
    try:
        call = parse_tool_call(payload)
    except ValueError as exc:
        return f"error: {exc}", False
    fn = tools.get(call.name)
    if fn is None:
        return f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(tools))}", False
    kwargs = dict(call.arguments)
    if context is not None and _takes_context(fn):
        kwargs["context"] = context
    outcome: list = []

    def call_tool() -> None:
        try:
            outcome.append((True, fn(**kwargs)))
        except BaseException as exc:  # any failure of a user's tool becomes the model's observation
            outcome.append((False, exc))

    worker = threading.Thread(target=call_tool, name=f"rlft-tool-{call.name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        return f"error: the tool {call.name!r} took longer than {timeout_s:g} s", False
    ok, value = outcome[0]
    if ok:
        try:
            return _as_text(value), True
        except (TypeError, ValueError) as exc:  # another type; an int too long to print
            return f"error: {str(exc)[:200]}", False
    message = str(value).splitlines()[0] if str(value) else type(value).__name__
    return f"error: {message[:200]}", False


def _takes_context(fn: Callable) -> bool:
    import inspect

    try:
        return "context" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
