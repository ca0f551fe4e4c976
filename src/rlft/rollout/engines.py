"""Pick a generation engine once, by name: ``--rollout-engine hf|vllm|server`` (+ ``--rollout-url``).

- ``hf``: :class:`rlft.rollout.hf.HFEngine` on the model loaded here (CPU or CUDA);
- ``vllm``: :class:`rlft.rollout.vllm.VLLMEngine`, vLLM in this process (``pip install rlft[vllm]``, CUDA);
- ``server``: :class:`rlft.rollout.server.OpenAICompletionsEngine`, an already running OpenAI-compatible
  completions server such as ``vllm serve <model>`` at ``--rollout-url`` (e.g. ``http://127.0.0.1:8000/v1``);
  only the tokenizer is loaded here, and the server must serve the same model.
"""

from __future__ import annotations

from typing import Literal

from rlft.rollout.base import GenerationEngine

RolloutEngine = Literal["hf", "vllm", "server"]
ROLLOUT_ENGINES = ("hf", "vllm", "server")


def make_engine(kind: str, model_name: str, tokenizer, spec, *, url: str | None = None, batch_size: int = 32,
                show_progress: bool = False, add_special_tokens: bool = True) -> GenerationEngine:
    """The engine ``kind`` names, sampling from ``model_name`` (built-in name, local folder or Hub id).

    Args:
        tokenizer: the model's HF tokenizer (every engine tokenizes prompts with it).
        spec: :class:`rlft.models.DeviceSpec` (hf: device and dtype, the weights loaded in the compute dtype under
            mixed precision, :meth:`~rlft.models.DeviceSpec.for_inference`; vllm: dtype).
        url: the server for ``server``.
        batch_size, show_progress: hf only (vLLM and the server schedule their own batches).
        add_special_tokens: how prompts are tokenized (False for chat-template-rendered prompts).
    Raises:
        ValueError: unknown ``kind``, or ``server`` without ``url``. ImportError: vllm/openai missing.
    """
    if kind == "hf":
        from rlft.models import load_model
        from rlft.rollout.hf import HFEngine

        return HFEngine(load_model(model_name, spec.for_inference()), tokenizer, batch_size=batch_size, show_progress=show_progress,
                        add_special_tokens=add_special_tokens)
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
