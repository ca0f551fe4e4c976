"""Countdown prompt templates (TinyZero's), and parsing them back.

Every template ends the prompt inside an open ``<think>`` so that the completion is
``reasoning</think>\\n<answer>EXPR</answer>``, and contains "Assistant:" (or the chat template's
assistant header) so that :func:`rlft.rewards.countdown.compute_score` can find the response.

All prompt functions take ``(task, tokenizer=None)`` so a CLI can pick one by name from
:data:`PROMPT_TEMPLATES`.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from rlft.tasks.countdown.calc import CALC_INSTRUCTIONS
from rlft.types import CountdownTask

# The user instruction of TinyZero's `examples/data_preprocess/countdown.py` (make_prefix).
USER_TEMPLATE = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>."
)
ASSISTANT_PREFIX = "Let me solve this step by step.\n<think>"
# TinyZero's template_type="base", character for character.
BASE_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer.\nUser: " + USER_TEMPLATE + "\nAssistant: " + ASSISTANT_PREFIX
)
# A compact prompt for CPU demos (fewer tokens per rollout); not from TinyZero.
SHORT_TEMPLATE = (
    "User: Using the numbers {numbers}, create an equation that equals {target}. "
    "Answer as <answer> expression </answer>.\nAssistant: <think>"
)

_QUERY_RE = re.compile(r"Using the numbers \[([\d,\s]*)\], create an equation that equals (\d+)")


def _fields(task: CountdownTask) -> dict[str, Any]:
    return {"numbers": list(task.nums), "target": task.target}  # numbers render as "[44, 19, 35]"


def user_message(task: CountdownTask) -> str:
    """The user instruction alone (TinyZero's wording), e.g. for a chat template."""
    return USER_TEMPLATE.format(**_fields(task))


def base_prompt(task: CountdownTask, tokenizer: Any = None) -> str:
    """TinyZero's "base" prompt, ending with ``Let me solve this step by step.\\n<think>``."""
    return BASE_TEMPLATE.format(**_fields(task))


def short_prompt(task: CountdownTask, tokenizer: Any = None) -> str:
    """A one-line instruction ending with ``Assistant: <think>`` (for small CPU demos)."""
    return SHORT_TEMPLATE.format(**_fields(task))


def calc_prompt(task: CountdownTask, tokenizer: Any = None) -> str:
    """The "base" prompt with :data:`rlft.tasks.countdown.calc.CALC_INSTRUCTIONS` (the calculator tool and its call
    syntax) after the user's instruction; the rest is "base"'s, character for character, ending with ``<think>``."""
    head, marker, tail = base_prompt(task).rpartition("\nAssistant: ")
    return f"{head} {CALC_INSTRUCTIONS}{marker}{tail}"


def chat_prompt(task: CountdownTask, tokenizer: Any = None) -> str:
    """The tokenizer's chat template around the user instruction, then the assistant's opening.

    That is ``apply_chat_template([user], add_generation_prompt=True)`` followed by
    ``Let me solve this step by step.\\n<think>``. Raises ValueError without a chat template.
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the 'chat' Countdown prompt needs a tokenizer with a chat template; "
            "use the 'base' prompt for base models"
        )
    messages = [{"role": "user", "content": user_message(task)}]
    head = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return head + ASSISTANT_PREFIX


PROMPT_TEMPLATES: dict[str, Callable[..., str]] = {
    "base": base_prompt,
    "chat": chat_prompt,
    "short": short_prompt,
    "calc": calc_prompt,
}
"""Prompt functions by name; each is called as ``fn(task, tokenizer)``."""


def parse_query(text: str) -> tuple[tuple[int, ...], int] | None:
    """``(nums, target)`` from a prompt containing TinyZero's instruction, or None."""
    match = _QUERY_RE.search(text)
    if match is None:
        return None
    nums = tuple(int(x) for x in match.group(1).split(",") if x.strip())
    return (nums, int(match.group(2))) if nums else None


def render_prompt(name: str, task: CountdownTask, tokenizer=None) -> str:
    """Render ``task`` with ``PROMPT_TEMPLATES[name]`` (the chat template uses ``tokenizer``).

    Raises:
        ValueError: unknown template name, or "chat" with a tokenizer that has no chat template.
    """
    if name not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt template {name!r}; choose from {sorted(PROMPT_TEMPLATES)}")
    return PROMPT_TEMPLATES[name](task, tokenizer)


def adds_special_tokens(name: str) -> bool:
    """Whether prompts of template ``name`` should be tokenized with the tokenizer's special tokens.

    Chat-template text already carries its BOS (if any), so it is encoded without adding one; plain
    templates get the tokenizer's defaults, exactly as at training time.
    """
    return name != "chat"
