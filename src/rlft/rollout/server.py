"""Rollouts from an OpenAI-compatible **completions** server, e.g. ``vllm serve MODEL`` (server mode).

:class:`OpenAICompletionsEngine` implements the :class:`~rlft.rollout.base.GenerationEngine` protocol
(``generate(prompts, params) -> list[list[Sample]]``) over HTTP with the ``openai`` client
(``pip install rlft[remote]``). Each prompt becomes one ``POST {base_url}/completions`` request:

- ``prompt``: the prompt's **token ids**, tokenized by our HF tokenizer exactly as
  :class:`~rlft.rollout.hf.HFEngine` does (:func:`rlft.rollout.hf.encode_prompts`), so a training batch
  built from the samples conditions on the ids the sampler saw;
- ``n`` (= ``params.k``), ``max_tokens``, ``temperature`` (0 for greedy), ``top_p``, ``seed``
  (``params.seed + b`` for prompt b, like :class:`~rlft.rollout.vllm.VLLMEngine`), ``logprobs=0`` (the
  sampled token's log-prob only);
- vLLM's extra parameters: ``top_k`` (-1 for off), ``stop_token_ids`` (every EOS id, as HFEngine stops
  at them), ``skip_special_tokens=True`` (the text, like HFEngine's), ``return_tokens_as_token_ids=True``
  (log-prob tokens come back as ``"token_id:<id>"``, so ids survive detokenization) and
  ``return_token_ids=True`` (vLLM >= 0.10.2 also returns ``token_ids`` per choice; either is read).

Requests run concurrently (``max_concurrency`` threads); the server batches them. Choices are put in
``index`` order. A ``"stop"`` completion whose last id is not an EOS id gets the tokenizer's EOS appended
(as :class:`~rlft.rollout.vllm.VLLMEngine` does) and then has no log-probs (None).

Log-probs are what the server reports: vLLM's default (``--logprobs-mode raw_logprobs``) is the model's
distribution **before** temperature/top-p/top-k, i.e. temperature-1 log-probs; they agree with a
transformers recompute only up to kernel and dtype differences (``scripts/gpu_check.sh`` measures it).

The server's weights are its own: :meth:`OpenAICompletionsEngine.sync_weights` refuses (the engine samples a fixed
model, for evaluation and pairs, never a policy being trained).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.hf import encode_prompts
from rlft.rollout.loops import stop_loops
from rlft.validation import UsageError

TOKEN_ID_PREFIX = "token_id:"


def _api_base(url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1`` -> ``http://host:port/v1``."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _get(obj, name: str):
    """A field of an openai response object, including fields the client does not model (vLLM's extras)."""
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


class OpenAICompletionsEngine:
    """A :class:`~rlft.rollout.base.GenerationEngine` backed by an OpenAI-compatible completions endpoint.

    Args:
        base_url: the server, ``http://host:port`` or ``http://host:port/v1`` (``vllm serve`` listens on
            port 8000 by default).
        tokenizer: the HF tokenizer of the served model: encodes prompts, names the EOS id.
        model: the served model name; None asks ``GET /v1/models`` and takes the first.
        api_key: sent as a bearer token (``vllm serve --api-key``); "EMPTY" when the server has none.
        add_special_tokens: as :class:`~rlft.rollout.hf.HFEngine` (False for chat-template prompts).
        eos_token_ids: extra ids that end a completion (e.g. the model's ``generation_config``), on top of
            ``tokenizer.eos_token_id``.
        max_concurrency: requests in flight at once.
        timeout_s, max_retries: per request, passed to the ``openai`` client.
    Raises:
        ImportError: the ``openai`` package is missing. ValueError: the tokenizer has no EOS id.
    """

    def __init__(self, base_url: str, tokenizer, *, model: str | None = None, api_key: str = "EMPTY",
                 add_special_tokens: bool = True, eos_token_ids: set[int] | None = None, max_concurrency: int = 64,
                 timeout_s: float = 600.0, max_retries: int = 2):
        try:
            import openai
        except ImportError:
            raise ImportError(
                "the server engine needs the openai client: pip install 'rlft[remote]' (or `pip install openai`)"
            ) from None
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token id")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_url = _api_base(base_url)
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries)
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self.eos_ids = {tokenizer.eos_token_id} | set(eos_token_ids or ())
        self.max_concurrency = max_concurrency
        self.model = model if model is not None else self._first_model()

    def _first_model(self) -> str:
        models = [m.id for m in self.client.models.list()]
        if not models:
            raise RuntimeError(f"{self.base_url}/models lists no model; pass model=")
        return models[0]

    def encode_prompts(self, prompts: list[str]) -> list[list[int]]:
        """The prompt ids sent to the server (:func:`rlft.rollout.hf.encode_prompts`)."""
        return encode_prompts(self.tokenizer, prompts, add_special_tokens=self.add_special_tokens)

    def request_body(self, prompt_ids: list[int], params: SamplingParams, b: int) -> dict:
        """The keyword arguments of ``client.completions.create`` for prompt ``b`` (see the module docstring)."""
        body = dict(model=self.model, prompt=prompt_ids, n=params.k, max_tokens=params.max_new_tokens, logprobs=0)
        extra = dict(stop_token_ids=sorted(self.eos_ids), skip_special_tokens=True, return_tokens_as_token_ids=True,
                     return_token_ids=True)
        if params.greedy:
            body["temperature"] = 0.0
        else:
            body.update(temperature=params.temperature, top_p=params.top_p)
            extra["top_k"] = params.top_k if params.top_k > 0 else -1
        if params.seed is not None:
            body["seed"] = params.seed + b
        body["extra_body"] = extra
        return body

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        """Sample ``params.k`` completions per prompt; returns B lists of k :class:`Sample` (HFEngine's
        contract, plus ``Sample.logprobs``).

        Raises:
            ValueError: invalid ``params`` or a prompt that tokenizes to nothing.
            RuntimeError: a response with the wrong number of choices, an unknown finish reason, or
                log-probs that do not match the completion ids. ``openai.APIError``: the request failed.
        """
        params.validate()
        if not prompts:
            return []
        prompt_ids = self.encode_prompts(prompts)
        if empty := [b for b, ids in enumerate(prompt_ids) if not ids]:
            raise ValueError(f"prompts {empty} tokenize to no tokens")

        def one(b: int) -> list[Sample]:
            response = self.client.completions.create(**self.request_body(prompt_ids[b], params, b))
            choices = sorted(response.choices, key=lambda c: c.index)
            if len(choices) != params.k:
                raise RuntimeError(f"the server returned {len(choices)} choices for prompt {b}, expected n={params.k}")
            return [self._to_sample(c) for c in choices]

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            samples = list(pool.map(one, range(len(prompts))))
        # params.stop_repeats: each whole sample cut where the loop stop would have ended it (no time saved)
        return stop_loops(samples, self.tokenizer, params.stop_repeats)

    def sync_weights(self, model) -> None:
        """Refused: the server samples from its own weights, which this process cannot change, so it cannot follow a
        policy being trained (the RL loop calls ``sync_weights`` after every update; use the hf or vllm engine there).

        Raises:
            UsageError: always.
        """
        raise UsageError(
            f"--rollout-engine server samples from the weights of the server at {self.base_url}, which rlft cannot "
            "update: it cannot follow a policy being trained (use --rollout-engine hf or vllm)")

    def _to_sample(self, choice) -> Sample:
        lp = choice.logprobs
        tokens = list(lp.tokens) if lp is not None and lp.tokens is not None else None
        logprobs = [float(x) for x in lp.token_logprobs] if lp is not None and lp.token_logprobs is not None else None
        ids = _get(choice, "token_ids")
        if ids is None:
            if tokens is None:
                raise RuntimeError(
                    "the server returned neither token_ids nor logprobs tokens; is it vLLM's OpenAI server?")
            if not all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
                raise RuntimeError(
                    "logprobs tokens are not 'token_id:<id>': the server ignored return_tokens_as_token_ids")
            ids = [int(t[len(TOKEN_ID_PREFIX):]) for t in tokens]
        ids = [int(i) for i in ids]
        if logprobs is not None and len(logprobs) != len(ids):
            raise RuntimeError(f"{len(logprobs)} log-probs for {len(ids)} completion tokens")
        reason = choice.finish_reason
        if reason not in ("stop", "length"):
            raise RuntimeError(f"unexpected finish_reason {reason!r} (expected 'stop' or 'length')")
        if reason == "stop" and (not ids or ids[-1] not in self.eos_ids):
            ids, logprobs = ids + [self.tokenizer.eos_token_id], None  # make "stop" samples end with their EOS id
        return Sample(ids, choice.text, reason, logprobs)
