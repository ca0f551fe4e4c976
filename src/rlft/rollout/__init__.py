"""Generation engines: prompts in, k sampled completions per prompt out.

:class:`HFEngine` (transformers ``generate``) is the default. A vLLM engine (optional ``vllm`` extra)
will implement the same :class:`GenerationEngine` protocol later; code against the protocol.
"""

from rlft.rollout.base import GenerationEngine, Sample, SamplingParams
from rlft.rollout.hf import HFEngine, eos_token_ids

__all__ = ["GenerationEngine", "HFEngine", "Sample", "SamplingParams", "eos_token_ids"]
