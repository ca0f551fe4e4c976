"""Optional vLLM generation engine (``pip install rlft[vllm]``, CUDA only), same protocol as HFEngine.

Importing this module never imports vLLM; :class:`VLLMEngine` does, in its constructor.

Targets vLLM >= 0.10 (the ``rlft[vllm]`` pin) with the V1 engine run **in-process**: the constructor
sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (unless already set) before vLLM starts, so that the model
lives in this process and :meth:`VLLMEngine.sync_weights` can copy the training weights into it with
the model's own ``load_weights`` (the route TRL's "colocate" mode and verl use). The model object is
looked up, in order, at

- ``llm.llm_engine.model_executor.driver_worker.worker.model_runner.model`` (V1 in-process; V0 >= 0.7),
- ``llm.llm_engine.model_executor.driver_worker.model_runner.model`` (V0 <= 0.6).

With a multi-process engine core (or tensor parallelism > 1) neither exists and ``sync_weights``
raises; weights would then have to travel over NCCL (vLLM's RLHF examples), which this thin engine
does not do. Untested here (no GPU, no vLLM in CI): treat it as a starting point.

Differences from :class:`rlft.rollout.hf.HFEngine`: prompts are tokenized by our HF tokenizer and
passed as token ids (so teacher forcing sees exactly the sampler's ids); vLLM samples with its own
kernels and dtype, so its token log-probs differ slightly from a HF recompute (irrelevant for
REINFORCE with ratio 1, where only the sampled ids are used).
"""

from __future__ import annotations

import os

from rlft.rollout.base import Sample, SamplingParams
from rlft.rollout.loops import stop_loops

def _generation_config_eos(path: str) -> set[int]:
    """EOS ids of the model folder's ``generation_config.json`` (HFEngine stops at these too)."""
    try:
        from transformers import GenerationConfig

        value = GenerationConfig.from_pretrained(path).eos_token_id
    except Exception:  # no generation_config.json: the tokenizer's EOS only
        return set()
    if value is None:
        return set()
    return {value} if isinstance(value, int) else set(value)


INSTALL_HINT = ("VLLMEngine needs vLLM, which is not installed: run `pip install rlft[vllm]` (CUDA machines only), "
                "or use HFEngine")


class VLLMEngine:
    """A :class:`~rlft.rollout.base.GenerationEngine` backed by ``vllm.LLM``.

    Args:
        model_name_or_path: built-in name, local HF folder or Hub id (resolved like ``--model``).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (leave room for training).
        dtype: vLLM weight dtype.
        seed: vLLM's global seed (``SamplingParams.seed`` seeds each request on top of it).
        tokenizer: the HF tokenizer that tokenizes prompts; default: loaded from the model.
        add_special_tokens: how prompts are tokenized, as :class:`~rlft.rollout.hf.HFEngine` (False for
            chat-template-rendered prompts, which already carry their BOS).
        return_logprobs: ask vLLM for each sampled token's log-prob (``SamplingParams(logprobs=0)``) and put
            them in ``Sample.logprobs`` (vLLM's default logprobs mode: before temperature/top-p).
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``max_model_len``, ``enforce_eager``).
    Raises:
        ImportError: vLLM is not installed (with the install command).
    """

    def __init__(self, model_name_or_path: str, *, gpu_memory_utilization: float = 0.5, dtype: str = "bfloat16",
                 seed: int = 0, tokenizer=None, add_special_tokens: bool = True, return_logprobs: bool = False,
                 **llm_kwargs):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the model in this process
        try:
            import vllm
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        from rlft.models import load_tokenizer, resolve_model

        self._vllm = vllm
        path = resolve_model(model_name_or_path)
        llm_kwargs.setdefault("generation_config", "vllm")  # ignore the model's sampling defaults, as HFEngine does
        self.llm = vllm.LLM(model=path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                            **llm_kwargs)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_name_or_path)
        if self.tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token id")
        self.eos_ids = {self.tokenizer.eos_token_id} | _generation_config_eos(path)
        self.add_special_tokens = add_special_tokens
        self.return_logprobs = return_logprobs

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        """Sample ``params.k`` completions per prompt; returns B lists of k :class:`Sample` (HFEngine's contract)."""
        params.validate()
        if not prompts:
            return []
        prompt_ids = self.tokenizer(list(prompts), add_special_tokens=self.add_special_tokens)["input_ids"]
        common = dict(n=params.k, max_tokens=params.max_new_tokens, stop_token_ids=sorted(self.eos_ids),
                      skip_special_tokens=True)
        if self.return_logprobs:
            common["logprobs"] = 0  # the sampled token's log-prob only
        if params.greedy:
            common.update(temperature=0.0)
        else:
            common.update(temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k if params.top_k > 0 else -1)
        requests = [
            self._vllm.SamplingParams(**common, seed=None if params.seed is None else params.seed + b)
            for b in range(len(prompts))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], requests, use_tqdm=False)
        # params.stop_repeats: each whole sample cut where the loop stop would have ended it (no time saved)
        return stop_loops([[self._to_sample(c) for c in out.outputs] for out in outputs], self.tokenizer,
                          params.stop_repeats)

    def _to_sample(self, completion) -> Sample:
        ids = list(completion.token_ids)
        logprobs = None
        if self.return_logprobs and completion.logprobs is not None:  # one {token_id: Logprob} dict per token
            logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs)]
        if completion.finish_reason == "stop":
            if not ids or ids[-1] not in self.eos_ids:  # make "stop" samples end with their EOS id, as HFEngine's do
                stop = completion.stop_reason if isinstance(completion.stop_reason,
                                                            int) else self.tokenizer.eos_token_id
                ids.append(stop)
                logprobs = None  # no log-prob for an id vLLM did not return
            return Sample(ids, completion.text, "stop", logprobs)
        return Sample(ids, completion.text, "length", logprobs)

    def _runner_model(self):
        """The vLLM model object of this process (see the module docstring for the paths tried)."""
        engine = self.llm.llm_engine
        for path in ("model_executor.driver_worker.worker.model_runner.model",
                     "model_executor.driver_worker.model_runner.model"):
            obj = engine
            try:
                for attr in path.split("."):
                    obj = getattr(obj, attr)
            except AttributeError:
                continue
            return obj
        raise RuntimeError(
            "cannot reach the vLLM model in this process (multi-process engine core or tensor parallelism?); "
            "create VLLMEngine with VLLM_ENABLE_V1_MULTIPROCESSING=0 and tensor_parallel_size=1"
        )

    def sync_weights(self, model) -> None:
        """Copy the training model's current weights into the vLLM model: a HF causal LM, any device/dtype, with
        LoRA adapters merged first (:func:`rlft.lora.merged_copy`: a merged copy, ``model`` untouched; a plain
        model is read as it is).

        Call after every optimizer step, before generating with the new policy (the RL loop does, whatever the
        engine). The prefix cache is reset, since its keys/values were computed with the old weights.

        Raises:
            RuntimeError: the vLLM model is not in this process (see the module docstring).
        """
        import torch

        from rlft.lora import merged_copy

        plain = merged_copy(model)
        with torch.no_grad():
            self._runner_model().load_weights((name, tensor.detach()) for name, tensor in plain.state_dict().items())
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()

    load_weights = sync_weights
