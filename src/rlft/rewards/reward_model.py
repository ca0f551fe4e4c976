"""Scalar reward models: reading the reward at the last real token, and a batched scorer.

A reward model here is a ``*ForSequenceClassification`` transformer with ``num_labels=1`` (a causal
LM body plus a linear ``score`` head). Its reward for a conversation is the head's output at the
**last real token** of the rendered conversation.

Why not ``model(...).logits``: transformers pools at "the rightmost token that is not
``pad_token_id``", which is wrong when ``pad_token_id == eos_token_id`` (Qwen, SmolLM2): the real EOS
that ends every response counts as padding, so the reward is read one token early, and differently
for a response that was cut before its EOS (docs/design.md pitfalls 1 and 3). :func:`sequence_rewards`
runs the body itself and takes the position from the attention mask, whatever the padding side, with
position ids counted from the first real token, so a score does not depend on the batch size, the
amount of padding or the padding side (up to float rounding).

Conversations are rendered exactly as :mod:`rlft.recipes.reward_model` renders training pairs: the
prompt messages followed by ``{"role": "assistant", "content": response}`` through the tokenizer's
chat template, giving the same tokens as :func:`rlft.data.chat.tokenize_preference_pair` (see
:func:`tokenize_scored`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from rlft.models import DeviceSpec, ModelNotFoundError, load_tokenizer, pick_device, resolve_model

log = logging.getLogger("rlft")

Messages = list[dict]
Prompt = str | Sequence[dict]

NO_LIMIT = 1 << 30
"""``max_length`` passed on when a caller sets no limit."""


def as_messages(prompt: Prompt) -> Messages:
    """A prompt as a list of chat messages: a plain string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages = list(prompt)
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise ValueError(f"a prompt must be a string or a list of {{'role', 'content'}} dicts, got {prompt!r:.200}")
    return messages


def tokenize_scored(tokenizer, prompt: Prompt, response: str, *, max_length: int | None = None) -> list[int] | None:
    """Token ids of ``[*prompt, {"role": "assistant", "content": response}]``: the prompt rendered with
    the generation prompt, the response and its end-of-turn token, exactly the tokens the reward-model
    recipe trains on for each side of a pair (:func:`rlft.data.chat.tokenize_preference_pair`), so the
    reward is read at the response's end-of-turn token. An empty response is scored too (just its
    end-of-turn token).

    Returns None when the prompt alone does not fit in ``max_length`` tokens; a response that does
    not fit is cut at the end.
    """
    from rlft.data.chat import render_chat

    conversation = [*as_messages(prompt), {"role": "assistant", "content": response}]
    example = render_chat(tokenizer, conversation, train_on="last_assistant", max_length=max_length or NO_LIMIT)
    return None if example is None else list(example.input_ids)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` index of the last position whose mask is 1 in each row of a ``(B, T)`` mask (left,
    right or no padding alike; 0 for an all-zero row)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (positions * (attention_mask != 0)).argmax(-1)


def score_head(model) -> torch.nn.Module:
    """The linear reward head of a ``*ForSequenceClassification`` model (``score`` in Llama, Qwen2,
    Mistral, Gemma, GPT-2, ...)."""
    head = getattr(model, "score", None)
    if not isinstance(head, torch.nn.Module):
        raise TypeError(
            f"{type(model).__name__} has no `score` head: pass a decoder-only *ForSequenceClassification model")
    return head


def sequence_rewards(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Reward of each row, read at its last real token.

    Args:
        model: a ``*ForSequenceClassification`` model with ``num_labels == 1``.
        input_ids, attention_mask: ``(B, T)``; padding on either side (or both) is fine, the mask
            alone marks real tokens (pad ids are never looked at).
    Returns:
        ``(B,)`` float32 rewards (differentiable when grad is enabled).
    """
    from rlft.distributed import root_call  # a plain call unless the model is sharded (FSDP2)

    return root_call(model, _sequence_rewards, model, input_ids, attention_mask)


def _sequence_rewards(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    from rlft.precision import compute_context

    with compute_context(model):
        return _padded_rewards(model, input_ids, attention_mask)


def _padded_rewards(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = attention_mask.long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # 0 at each row's first real token
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # under LoRA: the adapted HF model
    hidden = inner.base_model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                              use_cache=False).last_hidden_state
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_token_index(mask)]  # (B, H)
    rewards = score_head(model)(last)  # (B, num_labels)
    if rewards.shape[-1] != 1:
        raise ValueError(f"a reward model has num_labels=1, this one has {rewards.shape[-1]}")
    return rewards.squeeze(-1).float()


def packed_sequence_rewards(model, input_ids: torch.Tensor, position_ids: torch.Tensor,
                            last_index: torch.Tensor) -> torch.Tensor:
    """Reward of each sequence of packed rows (:func:`rlft.data.packing.pack_examples`), read at its last token.

    Args:
        model: a ``*ForSequenceClassification`` model with ``num_labels == 1``.
        input_ids, position_ids: ``(R, L)`` packed rows, positions restarting at 0 at every sequence
            (no attention mask: transformers keeps attention inside each sequence, see
            :mod:`rlft.data.packing`).
        last_index: ``(N,)`` flat index ``r * L + t`` of each sequence's last token.
    Returns:
        ``(N,)`` float32 rewards, equal to :func:`sequence_rewards` of the same sequences padded (up to
        float rounding).
    """
    from rlft.distributed import root_call  # a plain call unless the model is sharded (FSDP2)

    return root_call(model, _packed_sequence_rewards, model, input_ids, position_ids, last_index)


def _packed_sequence_rewards(model, input_ids: torch.Tensor, position_ids: torch.Tensor,
                             last_index: torch.Tensor) -> torch.Tensor:
    from rlft.ops import packed_hidden_states
    from rlft.precision import compute_context

    with compute_context(model):
        hidden = packed_hidden_states(model.base_model, input_ids, position_ids)  # (R, L, H)
        rewards = score_head(model)(hidden.flatten(0, 1)[last_index])  # (N, num_labels)
    if rewards.shape[-1] != 1:
        raise ValueError(f"a reward model has num_labels=1, this one has {rewards.shape[-1]}")
    return rewards.squeeze(-1).float()


def pad_sequences(sequences: Sequence[Sequence[int]], pad_token_id: int,
                  side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, each ``(B, max_len)`` long, padded on ``side`` ("left"/"right")."""
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        n = len(seq)
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        input_ids[i, cols] = torch.tensor(list(seq), dtype=torch.long)
        attention_mask[i, cols] = 1
    return input_ids, attention_mask


NOT_A_REWARD_MODEL = (
    "is not a reward model (its config is not a 1-label sequence classifier, so its score head would be "
    "new and random): pass a folder written by `rlft rm`")
"""How a causal LM given where a trained reward model is needed is refused (after its name)."""


def is_reward_model_checkpoint(path: str) -> bool:
    """True when the folder's config says it already is a 1-label sequence classifier (its score head
    is trained), False for a causal LM (whose head :func:`load_reward_model` must create)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    archs = getattr(config, "architectures", None) or []
    return any(a.endswith("ForSequenceClassification") for a in archs) and getattr(config, "num_labels", None) == 1


def check_reward_model(model: str, option: str) -> None:
    """Refuse ``model`` unless it names a reward model: a built-in name or local folder (as written by ``rlft rm``;
    no Hub look-up at parse time) whose config is a 1-label sequence classifier (:func:`is_reward_model_checkpoint`).
    A causal LM would be given a new, random score head, whose scores are not a reward model's. Used at parse time
    by ``eval countdown --select-reward-model`` and ``scripts/rm_pair_accuracy.py --model``.

    Raises:
        OptionError: no such folder, no model config in it, or not a reward model (the message names ``option``).
    """
    from rlft.models import EMBEDDED_MODELS
    from rlft.validation import OptionError

    if model not in EMBEDDED_MODELS and not Path(model).expanduser().is_dir():
        raise OptionError(f"{option} {model}: no such folder (a reward-model folder written by `rlft rm`)")
    try:
        is_rm = is_reward_model_checkpoint(resolve_model(model))
    except (ModelNotFoundError, OSError, ValueError) as e:
        raise OptionError(f"{option} {model}: not a loadable model folder ({' '.join(str(e).split())})") from None
    if not is_rm:
        raise OptionError(f"{option} {model} {NOT_A_REWARD_MODEL}")


def freeze_lower_layers(model, train_layers: int) -> int:
    """Freeze the embeddings and all but the top ``train_layers`` transformer blocks of ``model``.

    What stays trainable: the top ``train_layers`` blocks, the final norm and every parameter outside
    the backbone (the score head). A frozen prefix stores no activations for backward, and the backward
    stops at the first trainable block, so a step costs about one forward plus ``train_layers / L`` of a
    backward. Works for decoder-only models whose backbone keeps its blocks in ``.layers`` (Llama,
    Qwen2, Mistral, Gemma, SmolLM2); raises ``TypeError`` for others and ``ValueError`` when
    ``train_layers`` is negative. Returns the number of frozen parameters.
    """
    blocks = getattr(model.base_model, "layers", None)
    if not isinstance(blocks, torch.nn.ModuleList):
        raise TypeError(f"{type(model.base_model).__name__} keeps no `.layers` block list: "
                        "train_layers needs a Llama-style backbone")
    if train_layers < 0:
        raise ValueError(f"train_layers must be >= 0, got {train_layers}")
    trainable_blocks = {id(p) for block in blocks[len(blocks) - train_layers :] for p in block.parameters()}
    norm = getattr(model.base_model, "norm", None)
    keep = trainable_blocks | {id(p) for p in (norm.parameters() if isinstance(norm, torch.nn.Module) else [])}
    frozen = 0
    for p in model.base_model.parameters():
        if id(p) not in keep:
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen


def init_score_head(model, kind: str = "normal") -> None:
    """Initialise a new reward head.

    ``kind="normal"``: N(0, 1/(d+1)) (Stiennon et al. 2020 / OpenAI lm-human-preferences): with
    unit-scale final hidden states the initial rewards have std ~1, not the ~0.02*sqrt(d) of the
    default init, so early gradients reach the body. ``kind="zero"``: every initial reward is 0 (a
    Bradley-Terry loss of exactly log 2); the body gets gradients once the head has moved. Raises
    ``ValueError`` for another kind.
    """
    if kind not in ("normal", "zero"):
        raise ValueError(f"unknown score-head init {kind!r}; choose 'normal' or 'zero'")
    head = score_head(model)
    d = head.weight.shape[-1]
    with torch.no_grad():
        head.weight.normal_(0.0, 1.0 / math.sqrt(d + 1)) if kind == "normal" else head.weight.zero_()
        if getattr(head, "bias", None) is not None:
            head.bias.zero_()


def load_reward_model(name_or_path: str, spec: DeviceSpec | None = None, *, pad_token_id: int | None = None,
                      init_head: bool | None = None, head_init: str = "normal", trained_only: bool = False):
    """Load ``AutoModelForSequenceClassification(num_labels=1)`` from a reward-model folder or a causal
    LM (built-in name, local folder or Hub id).

    Args:
        pad_token_id: written to ``config.pad_token_id`` when given (transformers refuses batches
            without one; :func:`sequence_rewards` itself never uses it).
        init_head: re-initialise the score head with :func:`init_score_head`; None (default): only
            when the checkpoint is not already a reward model (the head is new).
        head_init: the ``kind`` of that initialisation ("normal" or "zero").
        trained_only: refuse a checkpoint that is not already a reward model (for scoring: a new head is random).

    The input embedding's ``padding_idx`` is cleared (see the comment in the code): the pad token's
    embedding row gets gradients like any other, which matters when pad == eos.

    Raises:
        ModelNotFoundError: nothing loadable under that name. ValueError: ``trained_only`` and not a reward model.
    """
    from transformers import AutoModelForSequenceClassification

    spec = spec or pick_device()
    path = resolve_model(name_or_path)
    try:
        new_head = not is_reward_model_checkpoint(path)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"could not load reward model {name_or_path!r}: {e}") from None
    if new_head and trained_only:
        raise ValueError(f"{name_or_path} {NOT_A_REWARD_MODEL}")
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=spec.dtype)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"could not load reward model {name_or_path!r}: {e}") from None
    if init_head or (init_head is None and new_head):
        init_score_head(model, head_init)
        log.info("%s: new reward head initialised %s", name_or_path,
                 "N(0, 1/(d+1))" if head_init == "normal" else "to zero")
    if pad_token_id is not None:
        model.config.pad_token_id = pad_token_id
    # transformers builds the input embedding with padding_idx=config.pad_token_id, which zeroes that
    # row's gradient. With pad == eos (SmolLM2, pad_token_id 2 = <|im_end|>) that freezes the embedding
    # of the very token the reward is read at, and only in a model whose saved config carried the pad
    # id (a resumed run would train differently from a fresh one). Padding is handled by the attention
    # mask alone, so the row is trained like any other.
    embeddings = model.get_input_embeddings()
    if getattr(embeddings, "padding_idx", None) is not None:
        embeddings.padding_idx = None
    from rlft.precision import mark

    return mark(model.to(spec.device), spec.compute_dtype)


class RewardModelScorer:
    """Scores (prompt, response) pairs with a local reward model: ``score(prompts, responses) -> list[float]``.

    The same interface as :class:`rlft.rewards.remote.RemoteRewardJudge`, so either can judge a
    win-rate. Scoring is batched (identical pairs scored once, so they get identical rewards; pairs
    sorted by length, put back in order), runs under
    ``torch.no_grad()`` in eval mode, pads on ``tokenizer.padding_side`` and reads each reward at the
    last real token (:func:`sequence_rewards`): the result does not depend on ``batch_size``, the
    padding side or the other pairs in a batch.

    Args:
        model_or_path: a reward-model folder (or any name :func:`load_reward_model` accepts), or an
            already loaded ``*ForSequenceClassification`` model (then ``tokenizer`` is required and
            ``device``/``dtype`` are ignored: the model stays where it is).
        tokenizer: defaults to the folder's tokenizer.
        batch_size: pairs per forward pass.
        chat_template: passed to :func:`rlft.data.chat.ensure_chat_template` (a name such as
            ``"chatml"`` or a path to a ``.jinja`` file) when the tokenizer should use another template than its own;
            None keeps the folder's template (the one the reward model was trained with).
        max_length: longest scored sequence; longer responses are cut at the end as in training.
            None: no limit. A prompt alone longer than that raises ValueError.
    """

    def __init__(
        self,
        model_or_path,
        tokenizer=None,
        *,
        batch_size: int = 16,
        device: str = "auto",
        dtype: str = "auto",
        chat_template: str | None = None,
        max_length: int | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(model_or_path, (str, Path)):
            self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(str(model_or_path))
            self.model = load_reward_model(str(model_or_path), pick_device(device, dtype).for_inference(),
                                           pad_token_id=self.tokenizer.pad_token_id, trained_only=True)
        else:
            if tokenizer is None:
                raise ValueError("pass the tokenizer along with an already loaded model")
            self.model, self.tokenizer = model_or_path, tokenizer
            if self.model.config.pad_token_id is None:
                self.model.config.pad_token_id = tokenizer.pad_token_id
        if chat_template is not None:
            from rlft.data.chat import ensure_chat_template

            ensure_chat_template(self.tokenizer, chat_template)
        self.batch_size = batch_size
        self.max_length = max_length

    def tokenize(self, prompt: Prompt, response: str) -> list[int]:
        """Token ids the model scores for one pair (see :func:`tokenize_scored`)."""
        ids = tokenize_scored(self.tokenizer, prompt, response, max_length=self.max_length)
        if ids is None:
            raise ValueError(
                f"a prompt is longer than max_length={self.max_length} tokens: {as_messages(prompt)!r:.200}")
        return ids

    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        """One reward per pair; ``prompts[i]`` is a message list or a plain string (one user message)."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts and {len(responses)} responses")
        if not prompts:
            return []
        all_sequences = [tuple(self.tokenize(p, r)) for p, r in zip(prompts, responses)]
        index: dict[tuple[int, ...], int] = {}  # identical inputs are scored once: identical rewards
        for seq in all_sequences:
            index.setdefault(seq, len(index))
        sequences = list(index)
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        side = getattr(self.tokenizer, "padding_side", "right") or "right"
        device = next(self.model.parameters()).device
        out = [0.0] * len(sequences)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start : start + self.batch_size]
                    input_ids, attention_mask = pad_sequences([sequences[i] for i in chunk], pad_id, side)
                    rewards = sequence_rewards(self.model, input_ids.to(device), attention_mask.to(device))
                    for i, r in zip(chunk, rewards.tolist()):
                        out[i] = float(r)
        finally:
            self.model.train(was_training)
        return [out[index[seq]] for seq in all_sequences]

    __call__ = score
