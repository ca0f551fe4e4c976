"""The generation-engine protocol shared by every rollout backend.

An engine turns B prompt strings into B lists of k :class:`Sample` each. :class:`rlft.rollout.hf.HFEngine`
(transformers ``generate``) is the default; a vLLM engine will implement the same protocol later, so
recipes and evaluations only ever depend on :class:`GenerationEngine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from rlft.options import MAX_NEW_TOKENS


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions. Validate with :meth:`validate` (engines call it)."""

    k: int = 1
    """Samples per prompt (the inner list length of ``generate``'s result)."""
    temperature: float = 1.0
    """Softmax temperature; 0.0 means greedy decoding (top_p/top_k are then ignored)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1.0 is off."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 is off."""
    max_new_tokens: int = MAX_NEW_TOKENS
    """Most tokens generated per completion, EOS included."""
    seed: int | None = None
    """Seed for sampling; the same seed, prompts and engine settings give the same samples. None: use
    the global RNG."""
    stop_repeats: int | None = None
    """Loop-aware stopping (opt-in): stop a completion right after it completes the N-th identical non-empty line
    (:mod:`rlft.rollout.loops`); it is then marked ``Sample.looped`` and keeps ``finish_reason == "length"``.
    None: off."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Raises ValueError on k < 1, max_new_tokens < 1, temperature < 0, top_p outside (0, 1], top_k < 0,
        stop_repeats < 2."""
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.stop_repeats is not None and self.stop_repeats < 2:
            raise ValueError(f"stop_repeats must be >= 2 (or None: off), got {self.stop_repeats}")


@dataclass
class Sample:
    """One generated completion."""

    completion_ids: list[int]
    """Generated token ids (length <= max_new_tokens): no prompt, no padding; ends with the EOS id
    when ``finish_reason == "stop"``."""
    text: str
    """The decoded completion, special tokens skipped."""
    finish_reason: Literal["stop", "length"]
    """"stop": an EOS id was generated; "length": max_new_tokens was reached first, or the loop stop cut the
    completion (``looped``): no EOS either way, so code reading "length" as "truncated" treats both alike."""
    logprobs: list[float] | None = None
    """Log-probability of each of ``completion_ids`` under the sampler, when the engine reports them
    (:class:`rlft.rollout.hf.HFEngine`'s row-dropping decoder: under ``softmax(logits / T)``, untruncated;
    :class:`rlft.rollout.server.OpenAICompletionsEngine`; :class:`rlft.rollout.vllm.VLLMEngine` with
    ``return_logprobs=True``), else None. Same length as ``completion_ids``."""
    self_certainty: float | None = None
    """Mean over the completion's tokens of ``KL(U || p)`` of the sampler's next-token distribution (Kang et al.
    2025; higher: more certain), when the engine reports it (:class:`rlft.rollout.hf.HFEngine`'s row-dropping
    decoder), else None."""
    looped: bool = False
    """True when ``SamplingParams.stop_repeats`` stopped the completion after a repeated line (then
    ``finish_reason == "length"``)."""
    loss_mask: list[int] | None = None
    """A rollout with tool calls (:mod:`rlft.rollout.turns`): 1 on each of ``completion_ids`` the model wrote, 0 on
    the observations' ids (context, never trained on); None: every id is the model's."""
    tool_calls: int = 0
    """Complete tool calls the model wrote."""
    tool_errors: int = 0
    """Of those, the calls whose observation is an error (unparseable, unknown tool, failed, too slow)."""

    @property
    def model_tokens(self) -> int:
        """The ids the model wrote (``completion_ids`` less the observations): what ``max_new_tokens`` bounds."""
        return len(self.completion_ids) if self.loss_mask is None else sum(self.loss_mask)


@runtime_checkable
class GenerationEngine(Protocol):
    """Anything that samples completions for prompt strings."""

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        """Return ``result[b][j]``: sample j (of ``params.k``) for ``prompts[b]``; outer length B."""
        ...
