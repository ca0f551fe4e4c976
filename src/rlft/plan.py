"""``rlft <command> --dry-run``: parse, resolve and validate a command's options and print its plan.

Nothing is downloaded, loaded, trained or written: models and data are described by where they would
come from (built-in, local folder or file, Hub id), so a GPU recipe in ``configs/`` can be checked on a
machine with no Hub access.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rlft.composed import option_fields, option_values

MODEL_FIELDS = ("model", "ref_model", "policy", "reference", "judge", "reward_model")
"""Options that name a model."""
DATA_FIELDS = ("data", "prompts_data", "eval_data")
"""Options that name a dataset."""


DISTRIBUTED_PLANS = {
    "ddp": "a full replica per rank, each step's batch split across ranks, gradients summed",
    "fsdp2": "FSDP2: parameters, gradients and optimizer state sharded per decoder layer, gradients summed",
}
"""What each ``--distributed`` strategy does, for the plan."""


def distributed_plan(cfg) -> str:
    """What ``cfg.distributed`` does under a torchrun launch of more than one rank, e.g. ``--distributed auto = fsdp2
    (FSDP2: ...)`` (:func:`rlft.options.resolved_strategy`)."""
    from rlft.options import resolved_strategy

    strategy = resolved_strategy(cfg, world_size=2)  # any world size > 1
    shown = f"{cfg.distributed} = {strategy}" if cfg.distributed != strategy else strategy
    return f"--distributed {shown} ({DISTRIBUTED_PLANS[strategy]})"


def describe_model(name: str) -> str:
    """Where ``name`` would load from, without loading it."""
    from rlft.models import EMBEDDED_MODELS, looks_like_path

    if name in EMBEDDED_MODELS:
        return f"built-in {name} (wheel {EMBEDDED_MODELS[name][2]})"
    if name == "remote":
        return "a remote OpenAI-compatible reward API"
    path = Path(name).expanduser()
    if path.exists():
        return f"local folder {path}" + ("" if (path / "config.json").is_file() else " (no config.json yet)")
    if looks_like_path(name) or name.startswith("runs/"):
        return f"local folder {name} (written by an earlier stage; not there yet)"
    return f"Hub id {name} (downloaded when the command runs)"


def describe_data(name: str) -> str:
    """Where a dataset option would read from, without reading it."""
    if name == "countdown":
        return "generated Countdown tasks"
    if name == "countdown-3to4":  # rlft.tasks.countdown.shipped.SHIPPED_NAME (a higher layer: named, not imported)
        return "the Countdown-Tasks-3to4 rows that ship with rlft (rlft/tasks/countdown/data/countdown_3to4.parquet)"
    path = Path(name).expanduser()
    if path.is_file():
        return f"local file {path}"
    if path.suffix in (".jsonl", ".json", ".parquet", ".gz") or name.startswith((".", "/", "~", "runs/")):
        return f"local file {name} (written by an earlier stage; not there yet)"
    return f"Hub dataset {name} (downloaded when the command runs)"


def plan(command: str, cfg, sources: dict[str, str] | None = None) -> str:
    """The dry-run report of ``rlft <command>`` with the parsed and validated ``cfg``; ``sources`` (option name ->
    where its value came from: ``flag``, ``--config FILE``, a command's default, ``default``) are shown as a YAML
    comment after each option."""
    names = {f.name for f in option_fields(cfg)}
    lines = [f"rlft {command}: dry run (options parsed and validated, output folder and files checked; nothing loaded, "
             "trained or written)"]
    for name in MODEL_FIELDS:
        value = getattr(cfg, name, None) if name in names else None
        if isinstance(value, str) and value:
            lines.append(f"  {name}: {describe_model(value)}")
    for name in DATA_FIELDS:
        value = getattr(cfg, name, None) if name in names else None
        if isinstance(value, str) and value:
            lines.append(f"  {name}: {describe_data(value)}")
    for name in ("output_dir", "output"):
        if name in names:
            lines.append(f"  writes: {getattr(cfg, name)}")
    if "lora_r" in names and getattr(cfg, "lora_r"):
        lines.append(f"  LoRA: r={cfg.lora_r}, alpha={cfg.lora_alpha:g}, targets {cfg.lora_target_modules}")
    if "distributed" in names:
        lines.append(f"  under torchrun: {distributed_plan(cfg)}")
    lines.append("options:")
    for key, value in option_values(cfg).items():  # flat option names (rlft.composed)
        dumped = yaml.safe_dump({key: list(value) if isinstance(value, tuple) else value}, sort_keys=False).splitlines()
        if sources and key in sources:
            dumped[0] += f"  # {sources[key]}"
        lines += ["  " + line for line in dumped]
    return "\n".join(lines)
