"""Chat rendering with the tokenizer's chat template, and loss masks on the assistant turns.

Masks are built by rendering prefixes of the conversation and diffing token positions, never from
``{% generation %}`` tags / ``return_assistant_tokens_mask`` (silently empty or wrong for Qwen2.5;
docs/design.md pitfall 2). For an assistant turn ``i``:

1. ``P = render(messages[:i], add_generation_prompt=True)`` and ``F = render(messages[:i + 1])``;
   ``F`` must start with ``P`` (the template's *prefix property*; if not, ValueError naming the
   template). Injected default system prompts (Qwen2.5, SmolLM2) therefore land in ``P`` and are
   never trained.
2. The tokens of ``F`` beyond those of ``P`` are the turn: its content, its end-of-turn token(s) and
   whatever separator the template writes after them.

**Mask convention** (all templates): trained = the assistant's content tokens **and its
end-of-turn token** (``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama-3), exactly what a model
generates before it stops. Not trained: the role header / generation prompt
(``<|im_start|>assistant\\n``), the separator the template writes *after* the end-of-turn token
(ChatML's ``"\\n"``; the model never generates it, the next prompt supplies it), system and user
turns. The end of a turn is the last end-of-turn token (:data:`END_OF_TURN_MARKERS` that are single
tokens of the vocabulary, or ``eos_token``) inside the turn's tokens; a template whose markers are
not single tokens gets its whole turn diff trained. A sequence ends at its last trained token: the
ChatML ``"\\n"`` after the final ``<|im_end|>`` and any later non-assistant turns are not part of it.
The mask comes from positions, never token values, so the final end-of-turn token is trained even
when ``pad_token_id == eos_token_id`` (docs/design.md pitfall 1).

**Tokenization**: text is rendered with ``apply_chat_template(..., tokenize=False)`` and encoded with
``tokenizer(text, add_special_tokens=False)``: the template writes any BOS itself, so the tokenizer
must not add a second one (Llama-3 templates start with ``<|begin_of_text|>``; ``tokenizer(text)``
would prepend another). Prompts from :func:`render_generation_prompt` must be encoded the same way.
The token ids of a render are kept whenever they extend the ids built so far; where BPE tokenizes
across a prompt/reply boundary differently (a reply starting with a newline after ChatML's
``assistant\\n``: Qwen merges ``"\\n\\n"``; SmolLM2's GPT-2-style pre-tokenizer writes a trailing
``"\\n\\n"`` as one token alone but as two before a word), the reply is encoded on its own after the
prompt's tokens: exactly the tokens a model generating from that prompt produces. Consequences:
the final (``last_assistant``) turn and preference pairs always start with exactly
``encode(render_generation_prompt(messages[:i]))``; with ``all_assistant`` every later turn is
appended to the tokens of the earlier ones (the token stream of a chat that generated each reply),
which equals the whole-prompt encoding whenever the tokenizer is stable at turn boundaries (ChatML
and Llama-3 templates with their markers as special tokens, replies not starting with a newline).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from rlft.data.tokenize import TokenizedExample

Message = dict[str, str]
"""One chat message: ``{"role": "system" | "user" | "assistant", "content": str}``."""

ROLES = ("system", "user", "assistant")

CHAT_TEMPLATES: dict[str, str] = {
    # ChatML as Qwen2.5 / SmolLM2 write it, without their model-specific default system prompt.
    "chatml": (
        "{%- for message in messages -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    ),
    # Llama-3 (Instruct) layout: BOS once, header, blank line, trimmed content, <|eot_id|>, no separator.
    "llama3": (
        "{{- '<|begin_of_text|>' -}}"
        "{%- for message in messages -%}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
        " + message['content'] | trim + '<|eot_id|>' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
    ),
}
"""Chat templates selectable by name (``--chat-template``); a path to a ``.jinja`` file works too."""

END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>", "</s>",
                       "<|endoftext|>")
"""Tokens that end an assistant turn (with the tokenizer's ``eos_token``), when they are single tokens."""


def _choices() -> str:
    return ", ".join(repr(name) for name in CHAT_TEMPLATES) + " or a path to a .jinja file"


def ensure_chat_template(tokenizer, name: str | None):
    """Give ``tokenizer`` a chat template and return it (modified in place).

    ``name``: a key of :data:`CHAT_TEMPLATES` or a path to a Jinja file; ``None`` keeps the
    tokenizer's own template.

    Raises:
        ValueError: unknown name / missing file, or no name and the tokenizer has no template.
    """
    if name is None:
        _require_template(tokenizer)
        return tokenizer
    if name in CHAT_TEMPLATES:
        tokenizer.chat_template = CHAT_TEMPLATES[name]
        return tokenizer
    path = Path(name).expanduser()
    if path.is_file():
        tokenizer.chat_template = path.read_text(encoding="utf-8")
        return tokenizer
    raise ValueError(f"unknown chat template {name!r} (no such name or file); --chat-template takes {_choices()}")


def _require_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the tokenizer {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!s} "
            "has no chat template; "
            f"pass --chat-template with {_choices()}")


def _describe_template(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    for name, text in CHAT_TEMPLATES.items():
        if template == text:
            return f"chat template {name!r}"
    snippet = str(template)[:80].replace("\n", "\\n")
    return f"the tokenizer's chat template ({snippet}...)"


def _check_messages(messages: list[Message]) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"expected a non-empty list of messages, got {messages!r}")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"message {j} must be {{'role': one of {ROLES}, 'content': str}}, got {m!r}")


def _render(tokenizer, messages: list[Message], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _end_of_turn_ids(tokenizer) -> set[int]:
    ids = set()
    for marker in (*END_OF_TURN_MARKERS, getattr(tokenizer, "eos_token", None)):
        if not marker:
            continue
        token_id = tokenizer.convert_tokens_to_ids(marker)
        if token_id is not None and tokenizer.convert_ids_to_tokens(token_id) == marker:
            ids.add(token_id)
    return ids


def _extend(tokenizer, ids: list[int], done_text: str, text: str) -> list[int]:
    """Tokens of ``text`` (which extends ``done_text``, already encoded as ``ids``), keeping ``ids``.

    The whole text is encoded when that keeps ``ids`` as a prefix; otherwise (BPE merges across the
    boundary) the new part is encoded on its own and appended.
    """
    whole = _encode(tokenizer, text)
    if whole[: len(ids)] == ids:
        return whole
    return ids + _encode(tokenizer, text[len(done_text) :])


def _prefix_error(tokenizer, messages: list[Message], i: int, what: str) -> ValueError:
    return ValueError(
        f"{_describe_template(tokenizer)} breaks the prefix property needed for assistant masks: {what} "
        f"(assistant turn at message {i} of {len(messages)}). Masks are built by diffing renders of "
        "conversation prefixes; use a template that renders earlier turns identically "
        f"(e.g. --chat-template {_choices()})."
    )


def _assistant_spans(tokenizer, messages: list[Message], turns: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids up to the end of the last turn in ``turns``, and each turn's trained ``[start, end)``."""
    eot = _end_of_turn_ids(tokenizer)
    ids: list[int] = []
    done_text = ""
    spans = []
    for i in turns:
        prompt_text = _render(tokenizer, messages[:i], add_generation_prompt=True)
        full_text = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not prompt_text.startswith(done_text):
            raise _prefix_error(tokenizer, messages, i, "an earlier turn renders differently once later turns follow")
        if not full_text.startswith(prompt_text):
            raise _prefix_error(tokenizer, messages, i, "the generation prompt is not a prefix of the rendered reply")
        ids = _extend(tokenizer, ids, done_text, prompt_text)
        start = len(ids)
        ids = _extend(tokenizer, ids, prompt_text, full_text)
        ends = [j for j in range(start, len(ids)) if ids[j] in eot]
        end = ends[-1] + 1 if ends else len(ids)
        if end <= start:
            raise ValueError(f"assistant turn at message {i} renders to no tokens with {_describe_template(tokenizer)}")
        spans.append((start, end))
        done_text = full_text
    return ids, spans


def render_chat(
    tokenizer,
    messages: list[Message],
    *,
    train_on: Literal["all_assistant", "last_assistant"] = "all_assistant",
    max_length: int,
) -> TokenizedExample | None:
    """Tokenize a conversation with its chat template; loss mask on the assistant turns.

    ``train_on="all_assistant"`` (SFT) trains every assistant turn, ``"last_assistant"`` only the final
    one (earlier replies are context). Each trained turn is its content plus its end-of-turn token (see
    the module docstring). The sequence ends with the last trained token. Longer than
    ``max_length``: the end is cut and ``truncated`` set; None when no trained token survives.

    Raises:
        ValueError: no chat template (names ``--chat-template``), malformed messages, no assistant
            turn, an assistant turn first, or a template without the prefix property.
    """
    _require_template(tokenizer)
    _check_messages(messages)
    if train_on not in ("all_assistant", "last_assistant"):
        raise ValueError(f"train_on must be 'all_assistant' or 'last_assistant', got {train_on!r}")
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise ValueError("the conversation has no assistant turn to train on")
    if turns[0] == 0:
        raise ValueError("the conversation starts with an assistant turn: there is no prompt to generate it from")
    if train_on == "last_assistant":
        turns = turns[-1:]
    ids, spans = _assistant_spans(tokenizer, messages, turns)
    ids = ids[: spans[-1][1]]
    mask = [0] * len(ids)
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    truncated = len(ids) > max_length
    ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask):
        return None
    return TokenizedExample(input_ids=ids, loss_mask=mask, truncated=truncated)


def render_generation_prompt(tokenizer, messages: list[Message]) -> str:
    """The text a model continues to write the next assistant turn (``add_generation_prompt=True``).

    Encode it with ``tokenizer(text, add_special_tokens=False)`` (the template wrote any BOS): then the
    prompt tokens followed by the generated reply and its end-of-turn token are exactly the tokens
    :func:`render_chat` / :func:`tokenize_preference_pair` train on.
    """
    _require_template(tokenizer)
    _check_messages(messages)
    return _render(tokenizer, messages, add_generation_prompt=True)


def _cut_left(ids: list[int], keep: int, bos_token_id: int | None) -> list[int]:
    """The last ``keep`` tokens; a leading BOS that occurs only once (a sequence start, not a turn
    marker like SmolLM2's ``<|im_start|>``) is kept in front."""
    if len(ids) <= keep:
        return ids
    if keep >= 2 and bos_token_id is not None and ids[0] == bos_token_id and ids.count(bos_token_id) == 1:
        return ids[:1] + ids[len(ids) - keep + 1 :]
    return ids[len(ids) - keep :]


def tokenize_preference_pair(
    tokenizer,
    prompt_messages: list[Message],
    chosen: str,
    rejected: str,
    *,
    max_length: int,
    max_prompt_length: int | None = None,
    min_response_tokens: int = 8,
) -> tuple[TokenizedExample, TokenizedExample] | None:
    """Tokenize ``prompt + chosen`` and ``prompt + rejected``; loss mask on each response only.

    Each sequence is the prompt rendered with the generation prompt, then the reply and its
    end-of-turn token (trained), as in :func:`render_chat` with ``train_on="last_assistant"``.

    Truncation (callers count the ``None`` drops):

    * the prompt keeps its **end**: with ``max_prompt_length`` it is cut to that many tokens from the
      left, whole tokens at a time. What comes first is lost: the system prompt (an injected default
      one too) and the start of early turns; a leading BOS that occurs once is kept.
    * the responses keep their **start**: each is cut to ``max_length - prompt tokens`` (its
      end-of-turn token goes first).
    * the pair is dropped (None) when that room is smaller than
      ``min(min_response_tokens, len(response))`` for either response.

    ``truncated`` is True on an example when anything was cut: its response's end or the prompt's start.
    """
    _require_template(tokenizer)
    _check_messages(prompt_messages)
    for name, reply in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(reply, str) or not reply.strip():
            raise ValueError(f"{name} must be a non-empty string, got {reply!r}")
    n = len(prompt_messages)
    responses = []
    prompt_ids: list[int] = []
    for reply in (chosen, rejected):
        conversation = [*prompt_messages, {"role": "assistant", "content": reply}]
        prompt_ids, [(start, end)] = _assistant_spans(tokenizer, conversation, [n])
        responses.append(prompt_ids[start:end])
        prompt_ids = prompt_ids[:start]
    prompt_cut = max_prompt_length is not None and len(prompt_ids) > max_prompt_length
    if prompt_cut:
        prompt_ids = _cut_left(prompt_ids, max_prompt_length, getattr(tokenizer, "bos_token_id", None))
    room = max_length - len(prompt_ids)
    if any(room < max(1, min(min_response_tokens, len(r))) for r in responses):
        return None
    return tuple(  # type: ignore[return-value]
        TokenizedExample(
            input_ids=prompt_ids + r[:room],
            loss_mask=[0] * len(prompt_ids) + [1] * len(r[:room]),
            truncated=prompt_cut or len(r) > room,
        )
        for r in responses
    )
