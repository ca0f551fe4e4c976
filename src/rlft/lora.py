"""LoRA for every recipe, via peft (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

With ``--lora-r R`` (> 0) a recipe wraps its model in low-rank adapters: each targeted linear layer
``W`` becomes ``W + (alpha / r) * B @ A`` with ``A`` ``(r, in)`` random and ``B`` ``(out, r)`` zero at
the start, so the adapted model equals the base model until the first update, and only ``A``/``B``
train (the base weights are frozen). Consequences the recipes rely on:

- **Reference policy for free**: the base model is the same module with its adapters disabled
  (:func:`adapters_disabled`), so RL's KL reference and DPO's reference log-probs need no second
  copy of the model in memory.
- **Checkpoints** hold the adapter (``adapter_model.safetensors`` + ``adapter_config.json``), the
  optimizer and the trainer state; resuming loads the base model and then the adapter.
- **Output**: ``output_dir/adapter/`` (the adapter alone, loadable with ``peft.PeftModel``) and
  ``output_dir/model/`` (a plain Hugging Face model with the adapter merged in), so every other
  command (eval, RL from an SFT run, ...) reads ``model/`` as usual (:func:`save_final_model`).
- **Adapters know their base**: every saved adapter (``adapter/`` and each checkpoint) holds ``base_model.json``, the
  folder and weights SHA-256 of the model it was trained from (:data:`BASE_RECORD`); :func:`merge_adapter` merges it
  into that model only.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("rlft")

BASE_RECORD = "base_model.json"
"""The file of a saved adapter (a LoRA run's ``adapter/`` and its checkpoints) naming the model it was trained from:
``{"model": that folder, "model_sha256": its weights' SHA-256}`` (:func:`rlft.checkpoint.weights_sha256`). Written by
:func:`rlft.checkpoint.save_model_folder` from the model's :data:`BASE_ATTRIBUTE`; adapters saved before 2026-12-06
have none."""
BASE_ATTRIBUTE = "rlft_adapter_base"
"""The attribute of a model wrapped by :func:`apply_lora` that holds its :data:`BASE_RECORD` (absent when the base
was not loaded from a local folder of ``*.safetensors``)."""


@dataclass(frozen=True)
class LoRAOptions:
    """The LoRA options every training command takes (a mixin of the recipes' configs)."""

    lora_r: int = 0
    """LoRA rank (0: full fine-tuning, no adapters). With r > 0 only the adapters train; typical learning rates are
    1e-5 to 1e-4 (10x a full fine-tune's)."""
    lora_alpha: float = 32.0
    """LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_r."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input (0: none, so training forward passes stay deterministic)."""
    lora_target_modules: str = "all-linear"
    """Modules that get adapters: 'all-linear' (every linear layer of the blocks, not the LM head) or a comma-separated
    list of module-name suffixes, e.g. 'q_proj,v_proj'."""

    def lora_settings(self) -> "LoRASettings | None":
        """These options as :class:`LoRASettings`, or None when ``lora_r == 0``."""
        if self.lora_r == 0:
            return None
        return LoRASettings(self.lora_r, self.lora_alpha, self.lora_dropout, self.lora_target_modules)

    def _check_lora(self) -> None:
        """Checks across the LoRA options (ranges are checked by :func:`rlft.validation.validate_options`)."""
        from rlft.validation import require

        require(not self.lora_r or self.lora_target_modules.strip() != "",
                "--lora-target-modules must name at least one module (or 'all-linear')")


@dataclass(frozen=True)
class LoRASettings:
    r: int
    alpha: float
    dropout: float
    target_modules: str


def _peft_config(settings: LoRASettings, model: torch.nn.Module):
    from peft import LoraConfig

    targets = settings.target_modules.strip()
    target_modules = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    # A reward model's new scalar head must train in full (peft keeps a trainable copy of it).
    modules_to_save = ["score"] if isinstance(getattr(model, "score", None), torch.nn.Linear) else None
    return LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=target_modules, modules_to_save=modules_to_save, bias="none")


def apply_lora(model: torch.nn.Module, settings: LoRASettings, *, adapter_from: Path | None = None) -> torch.nn.Module:
    """Wrap ``model`` in trainable LoRA adapters (fresh, or loaded from ``adapter_from``, a checkpoint
    folder holding ``adapter_config.json``). Returns the ``peft.PeftModel``; base weights are frozen.

    The folder ``model`` was loaded from and its weights' SHA-256 (:func:`base_record`) go with the model, so every
    adapter saved from it records its base (:data:`BASE_RECORD`).

    Raises:
        OptionError: a name of ``settings.target_modules`` matches no module of ``model`` (:func:`check_targets`).
        ValueError: peft refuses the targets (e.g. a module type it cannot adapt).
        UsageError: ``adapter_from`` records another base model than the folder ``model`` was loaded from.
    """
    from peft import PeftModel, get_peft_model

    record = base_record(model)
    if adapter_from is not None:
        if record is not None and read_base_record(adapter_from) is not None:  # a resume: --model now holds other
            check_base(record["model"], adapter_from, sha256=record["model_sha256"])  # weights? UsageError
        peft_model = PeftModel.from_pretrained(model, str(adapter_from), is_trainable=True)
        return _with_base(peft_model, record)
    check_targets(model, settings.target_modules)
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None and getattr(model.config, "tie_word_embeddings", False):
        head = next((name for name, module in model.named_modules() if module is out), "")
        names = [t.strip() for t in settings.target_modules.split(",")]
        if head and any(head == t or head.endswith("." + t) for t in names):
            raise ValueError(
                f"LoRA on {head!r}: the model ties it to the input embeddings, so merging the adapter would "
                "change both; leave the output layer out of --lora-target-modules")
    try:
        peft_model = get_peft_model(model, _peft_config(settings, model))
    except ValueError as e:
        raise ValueError(f"LoRA: {e} (--lora-target-modules {settings.target_modules!r})") from None
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    log.info("LoRA r=%d alpha=%g on %s: %d trainable parameters of %d (%.2f%%)", settings.r, settings.alpha,
             settings.target_modules, trainable, total, 100 * trainable / total)
    return _with_base(peft_model, record)


def base_record(model: torch.nn.Module) -> dict | None:
    """``{"model": folder, "model_sha256": sha}`` of the local folder ``model`` was loaded from (its ``name_or_path``;
    :func:`rlft.checkpoint.weights_sha256` of it), or None when that is not a folder of ``*.safetensors`` (a model
    built in memory, a Hub id)."""
    from rlft.checkpoint import weights_sha256

    folder = str(getattr(model, "name_or_path", "") or "")
    sha = weights_sha256(folder) if folder else None
    return {"model": str(Path(folder).expanduser().resolve()), "model_sha256": sha} if sha else None


def _with_base(peft_model: torch.nn.Module, record: dict | None) -> torch.nn.Module:
    if record is not None:
        setattr(peft_model, BASE_ATTRIBUTE, record)
    return peft_model


def check_targets(model: torch.nn.Module, target_modules: str) -> None:
    """Every name of a comma-separated ``target_modules`` (not ``all-linear``) must match a module of ``model`` as peft
    matches it: the module's full name, or its last ``.``-separated parts (``q_proj`` matches
    ``model.layers.0.self_attn.q_proj``). peft itself only refuses a list matching nothing at all, so a typo next to
    a valid name would silently adapt fewer layers.

    Raises:
        OptionError: the names matching nothing, and the linear layers' names to choose from (the CLI exits with 2).
    """
    from rlft.validation import OptionError

    if target_modules.strip() == "all-linear":
        return
    names = [name for name, _ in model.named_modules() if name]
    wanted = [t.strip() for t in target_modules.split(",") if t.strip()]
    missing = [t for t in wanted if not any(name == t or name.endswith("." + t) for name in names)]
    if missing:
        linear = sorted({
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
        })
        raise OptionError(
            f"--lora-target-modules: {', '.join(map(repr, missing))} {'matches' if len(missing) == 1 else 'match'} "
            f"no module of {type(model).__name__} (its linear layers: {', '.join(linear)}; or 'all-linear')")


def is_lora(model: torch.nn.Module) -> bool:
    """True when ``model`` carries peft adapters."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def adapters_disabled(model: torch.nn.Module):
    """Context in which ``model`` computes as its base model (adapters off); a no-op without LoRA.

    This is the reference policy of a LoRA run: RL's KL reference and DPO's reference log-probs.
    """
    return model.disable_adapter() if is_lora(model) else contextlib.nullcontext()


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model equal to ``model`` with its adapters merged into the weights (``model`` untouched).
    Without LoRA, ``model`` itself."""
    if not is_lora(model):
        return model
    return copy.deepcopy(model).merge_and_unload()


def read_base_record(adapter: str | Path) -> dict | None:
    """The :data:`BASE_RECORD` of the adapter folder ``adapter``, or None when it has none (saved before 2026-12-06).

    Raises:
        UsageError: the file is not JSON, or lacks ``model`` or ``model_sha256`` (naming the file).
    """
    from rlft.validation import UsageError

    path = Path(adapter) / BASE_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        why = " ".join(str(e).split())
        raise UsageError(f"{path}: unreadable ({why}); it should name the adapter's base model") from None
    if not isinstance(record, dict) or not isinstance(record.get("model_sha256"), str) or "model" not in record:
        raise UsageError(f"{path}: expected {{\"model\": ..., \"model_sha256\": ...}} (the adapter's base model)")
    return record


def check_base(base: str | Path, adapter: str | Path, *, sha256: str | None = None) -> dict | None:
    """Check that the LoRA adapter folder ``adapter`` was trained from the model folder ``base``: the weights SHA-256
    its :data:`BASE_RECORD` records equals ``base``'s (``sha256``, else :func:`rlft.checkpoint.weights_sha256` of
    ``base``: the same weights under any path pass). Returns the record; None, with a warning line, for an adapter
    that records no base (saved before 2026-12-06: unchecked, as before).

    Raises:
        UsageError: one line naming both paths and both hashes: ``base`` holds other weights than the adapter's
            base; or ``base`` is not a model folder of ``*.safetensors``; or the record is unreadable.
    """
    from rlft.checkpoint import weights_sha256
    from rlft.validation import UsageError

    record = read_base_record(adapter)
    if record is None:
        log.warning("%s records no base model (an adapter saved before rlft recorded it): merged into %s unchecked",
                    adapter, base)
        return None
    sha = sha256 or weights_sha256(base)
    if sha is None:
        raise UsageError(f"{base}: not a model folder with *.safetensors weights; {adapter} was trained from "
                         f"{record['model']} (weights SHA-256 {record['model_sha256']})")
    if sha != record["model_sha256"]:
        raise UsageError(f"{adapter} was trained from {record['model']} (weights SHA-256 {record['model_sha256']}), "
                         f"but {base} holds other weights (SHA-256 {sha}); use the model it started from")
    return record


def _check_out(base: Path, adapter: Path, out: Path) -> None:
    """UsageError when writing the folder ``out`` would replace or delete ``base`` or ``adapter`` (any path form)."""
    from rlft.validation import UsageError

    target = out.expanduser().resolve()
    for what, path in (("the base model", base), ("the adapter", adapter)):
        folder = path.expanduser().resolve()
        if target == folder:
            raise UsageError(f"merge: out {out} is {what} {path}: writing it would replace it; choose another out")
        if folder in target.parents or target in folder.parents:
            where = "lies inside" if folder in target.parents else "holds"
            raise UsageError(f"merge: out {out} {where} {what} {path}; choose an out folder apart from it")


def _shape_problem(error: Exception) -> str:
    """The first shape mismatch of peft's multi-line load error, on one line (else the error's first line)."""
    if m := re.search(r"size mismatch for (\S+): copying a param with shape (.+?) from checkpoint, "
                      r"the shape in current model is (.+?)\.?$", str(error), re.M):
        return f"{m[1]} is {m[2]} in the adapter, {m[3]} in the model"
    return " ".join(str(error).strip().splitlines()[:1]) or type(error).__name__


def merge_adapter(base: Path, adapter: Path, out: Path) -> Path:
    """Write ``out``: the model folder ``base`` with the LoRA adapter in ``adapter`` (a run's ``adapter/`` or one of its
    checkpoints: a folder holding ``adapter_config.json``) merged into its weights, in float32, and ``base``'s
    tokenizer; the folder is written atomically. This is the merge a LoRA run makes for its final ``model/``
    (:func:`save_final_model`), so a run's final adapter merged into the model it started from gives that file back;
    a checkpoint's adapter gives the model of that step (e.g. the half-way point of a run, for evaluation).
    ``base`` must hold the weights the adapter was trained from (:func:`check_base`; an adapter saved before
    2026-12-06 records none: merged with a warning line). Returns ``out``.

    Raises:
        FileNotFoundError: ``adapter`` holds no ``adapter_config.json``.
        UsageError: one line: ``out`` is ``base`` or ``adapter`` (resolved; or holds or lies inside one of them);
            ``base`` is not the adapter's base model (:func:`check_base`: both paths and hashes); the adapter does not
            fit ``base``'s shape (a tensor's shapes, or the tensors one has that the other lacks).
    """
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from rlft.checkpoint import save_model_folder
    from rlft.models import load_tokenizer
    from rlft.validation import UsageError

    base, adapter, out = Path(base), Path(adapter), Path(out)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter}: no adapter_config.json (not a LoRA adapter folder)")
    _check_out(base, adapter, out)
    if not (base / "config.json").is_file():
        raise UsageError(f"{base}: not a model folder (no config.json); the base model to merge {adapter} into")
    check_base(base, adapter)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    try:
        peft_model = PeftModel.from_pretrained(model, str(adapter))
    except (RuntimeError, ValueError, KeyError) as e:
        raise UsageError(f"{adapter} does not fit {base} (another shape): {_shape_problem(e)}") from None
    saved = _adapter_shapes(adapter)
    loaded = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(peft_model).items()}
    if saved is not None and saved != loaded:
        extra, missing = sorted(set(saved) - set(loaded)), sorted(set(loaded) - set(saved))
        if extra:
            what = f"the adapter has {extra[0]}, which the model lacks"
        else:
            what = f"the model has {missing[0]}, which the adapter lacks" if missing else "their tensors differ"
        raise UsageError(f"{adapter} does not fit {base} (another shape): {what}")
    save_model_folder(out, peft_model.merge_and_unload(), load_tokenizer(str(base)))
    return out


def _adapter_shapes(adapter: Path) -> dict[str, tuple[int, ...]] | None:
    """``{tensor name: shape}`` of ``adapter/adapter_model.safetensors`` (read from its header), None without one."""
    from safetensors import safe_open

    path = adapter / "adapter_model.safetensors"
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def save_final_model(run_dir: Path, model: torch.nn.Module, tokenizer, state_dict: dict | None = None) -> Path:
    """Write the run's final model to ``run_dir/model`` (atomically) and return that folder.

    With LoRA: ``run_dir/adapter`` gets the adapter and ``run_dir/model`` the merged plain model.
    ``state_dict``: the full weights of a sharded model (:func:`rlft.distributed.full_state_dicts`; not with LoRA).
    """
    from rlft.checkpoint import save_model_folder

    run_dir = Path(run_dir)
    if state_dict is not None:
        if is_lora(model):
            raise ValueError("a sharded LoRA model cannot be saved (--distributed fsdp2 does not take LoRA)")
        save_model_folder(run_dir / "model", model, tokenizer, state_dict=state_dict)
        return run_dir / "model"
    if is_lora(model):
        save_model_folder(run_dir / "adapter", model, tokenizer)
    save_model_folder(run_dir / "model", merged_copy(model), tokenizer)
    return run_dir / "model"
