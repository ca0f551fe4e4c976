"""Generation engines: prompts in, k sampled completions per prompt out.

:class:`HFEngine` (transformers ``generate``) is the default; :class:`rlft.rollout.vllm.VLLMEngine` (vLLM
in-process, optional ``vllm`` extra) and :class:`OpenAICompletionsEngine` (an OpenAI-compatible completions
server such as ``vllm serve``) implement the same :class:`GenerationEngine` protocol; code against the
protocol and pick one with :func:`make_engine` (``--rollout-engine hf|vllm|server``).
"""

from rlft.rollout.base import GenerationEngine, Sample, SamplingParams
from rlft.rollout.engines import make_engine
from rlft.rollout.hf import HFEngine, eos_token_ids
from rlft.rollout.server import OpenAICompletionsEngine

__all__ = [
    "GenerationEngine", "HFEngine", "OpenAICompletionsEngine", "Sample", "SamplingParams", "eos_token_ids",
    "make_engine"
]
