"""Pick a generation engine once, by name: ``--rollout-engine hf|vllm|server`` (+ ``--rollout-url``).

- ``hf``: :class:`rlft.rollout.hf.HFEngine` on the model loaded here (CPU or CUDA), or on a live model passed in
  (the RL loop's policy, which it may sample from through a merged, cast copy: ``copy_weights``);
- ``vllm``: :class:`rlft.rollout.vllm.VLLMEngine`, vLLM in this process (``pip install rlft[vllm]``, CUDA);
- ``server``: :class:`rlft.rollout.server.OpenAICompletionsEngine`, an already running OpenAI-compatible
  completions server such as ``vllm serve <model>`` at ``--rollout-url`` (e.g. ``http://127.0.0.1:8000/v1``);
  only the tokenizer is loaded here, and the server must serve the same model.

Every engine has ``generate(prompts, params)`` and ``sync_weights(model)``: after an update the RL loop calls
``engine.sync_weights(policy)`` whatever the engine (hf: samples from ``policy`` from then on, its sampling copy
remade; vllm: the policy's weights, LoRA merged, pushed into vLLM's copy; server: refused, a server's weights are
its own).
"""

from __future__ import annotations

from typing import Literal

from rlft import distributed
from rlft.rollout.base import GenerationEngine
from rlft.validation import UsageError

RolloutEngine = Literal["hf", "vllm", "server"]
ROLLOUT_ENGINES = ("hf", "vllm", "server")

TRAINING_ENGINES_UNDER_TORCHRUN = ("hf",)
"""Engines that can follow a policy trained under torchrun (:func:`check_training_engine`): the HF engine samples
from each rank's own (replicated or sharded) policy; vLLM's weights would have to be gathered from every rank."""


def check_training_engine(kind: str) -> None:
    """Refuse, before anything loads, an engine that cannot follow a policy being trained in this launch.

    Raises:
        UsageError: under torchrun, an engine other than those of :data:`TRAINING_ENGINES_UNDER_TORCHRUN`.
    """
    if distributed.active() and kind not in TRAINING_ENGINES_UNDER_TORCHRUN:
        raise UsageError(
            f"the RL loop under torchrun samples with --rollout-engine {' or '.join(TRAINING_ENGINES_UNDER_TORCHRUN)} "
            f"only, not {kind} (vLLM would need the policy's weights pushed from every rank)")


def make_engine(kind: str, model_name: str, tokenizer, spec, *, model=None, copy_weights: bool = False, copy_dtype=None,
                url: str | None = None, batch_size: int = 32, show_progress: bool = False,
                add_special_tokens: bool = True) -> GenerationEngine:
    """The engine ``kind`` names, sampling from ``model_name`` (built-in name, local folder or Hub id).

    Args:
        tokenizer: the model's HF tokenizer (every engine tokenizes prompts with it).
        spec: :class:`rlft.models.DeviceSpec` (hf: device and dtype, the weights loaded in the compute dtype under
            mixed precision, :meth:`~rlft.models.DeviceSpec.for_inference`; vllm: dtype).
        model: hf only: sample from this live model (e.g. the policy the RL loop trains; nothing is loaded) instead
            of loading ``model_name``. vllm starts from ``model_name``'s weights and gets the live model's at
            ``engine.sync_weights(model)``.
        copy_weights, copy_dtype: hf only: sample from a plain copy of the model (LoRA merged, cast to
            ``copy_dtype`` when given), remade after every ``sync_weights`` (:class:`rlft.rollout.hf.HFEngine`).
        url: the server for ``server``.
        batch_size, show_progress: hf only (vLLM and the server schedule their own batches).
        add_special_tokens: how prompts are tokenized (False for chat-template-rendered prompts).
    Raises:
        ValueError: unknown ``kind``, or ``server`` without ``url``. ImportError: vllm/openai missing.
    """
    if kind == "hf":
        from rlft.rollout.hf import HFEngine

        if model is None:
            from rlft.models import load_model

            model = load_model(model_name, spec.for_inference())
        return HFEngine(model, tokenizer, batch_size=batch_size, show_progress=show_progress,
                        add_special_tokens=add_special_tokens, copy_weights=copy_weights, copy_dtype=copy_dtype)
    if kind == "vllm":
        from rlft.rollout.vllm import VLLMEngine

        return VLLMEngine(model_name, dtype=str(spec.dtype).removeprefix("torch."), tokenizer=tokenizer,
                          add_special_tokens=add_special_tokens)
    if kind == "server":
        if not url:
            raise ValueError("--rollout-engine server needs --rollout-url (e.g. http://127.0.0.1:8000/v1)")
        from rlft.models import resolve_model
        from rlft.rollout.server import OpenAICompletionsEngine
        from rlft.rollout.vllm import _generation_config_eos

        return OpenAICompletionsEngine(url, tokenizer, add_special_tokens=add_special_tokens,
                                       eos_token_ids=_generation_config_eos(resolve_model(model_name)))
    raise ValueError(f"unknown rollout engine {kind!r}; choose from {', '.join(ROLLOUT_ENGINES)}")
