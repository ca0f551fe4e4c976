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
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("rlft")


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

    Raises:
        OptionError: a name of ``settings.target_modules`` matches no module of ``model`` (:func:`check_targets`).
        ValueError: peft refuses the targets (e.g. a module type it cannot adapt).
    """
    from peft import PeftModel, get_peft_model

    if adapter_from is not None:
        return PeftModel.from_pretrained(model, str(adapter_from), is_trainable=True)
    check_targets(model, settings.target_modules)
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None and getattr(model.config, "tie_word_embeddings", False):
        head = next((name for name, module in model.named_modules() if module is out), "")
        names = [t.strip() for t in settings.target_modules.split(",")]
        if head and any(head == t or head.endswith("." + t) for t in names):
            raise ValueError(f"LoRA on {head!r}: the model ties it to the input embeddings, so merging the adapter would "
                             "change both; leave the output layer out of --lora-target-modules")
    try:
        peft_model = get_peft_model(model, _peft_config(settings, model))
    except ValueError as e:
        raise ValueError(f"LoRA: {e} (--lora-target-modules {settings.target_modules!r})") from None
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    log.info("LoRA r=%d alpha=%g on %s: %d trainable parameters of %d (%.2f%%)", settings.r, settings.alpha,
             settings.target_modules, trainable, total, 100 * trainable / total)
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
        linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)})
        raise OptionError(f"--lora-target-modules: {', '.join(map(repr, missing))} {'matches' if len(missing) == 1 else 'match'} no module of "
                          f"{type(model).__name__} (its linear layers: {', '.join(linear)}; or 'all-linear')")


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


def merge_adapter(base: Path, adapter: Path, out: Path) -> Path:
    """Write ``out``: the model folder ``base`` with the LoRA adapter in ``adapter`` (a run's ``adapter/`` or one of its
    checkpoints: a folder holding ``adapter_config.json``) merged into its weights, in float32, and ``base``'s tokenizer;
    the folder is written atomically. This is the merge a LoRA run makes for its final ``model/``
    (:func:`save_final_model`), so a run's final adapter merged into the model it started from gives that file back;
    a checkpoint's adapter gives the model of that step (e.g. the half-way point of a run, for evaluation).
    Returns ``out``.

    Raises:
        FileNotFoundError: ``adapter`` holds no ``adapter_config.json``.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlft.checkpoint import save_model_folder
    from rlft.models import load_tokenizer

    if not (Path(adapter) / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter}: no adapter_config.json (not a LoRA adapter folder)")
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    save_model_folder(Path(out), merged, load_tokenizer(str(base)))
    return Path(out)


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
