"""Configs composed of option blocks, read and written by their flat option names.

A composed config (:class:`rlft.rl.config.RLConfig`) is a frozen dataclass whose fields are option blocks (frozen
dataclasses themselves: ``sampling: SamplingOptions``, ``kl: KLOptions``, ...), each part of a loop given its own
block. Its options keep one flat namespace, as flags (each block field marked ``tyro.conf.arg(name="")``), ``--config``
YAML keys and the saved ``config.yaml`` do: every option name belongs to exactly one block. :func:`composed` makes the
class take and show flat names too:

- ``RLConfig(k=4, beta=0.1)``: flat keywords go to the block that declares them (over a block given as a keyword,
  else over the block's default), so ``dataclasses.replace(cfg, k=8)`` works as on a flat config;
- ``cfg.k`` reads ``cfg.sampling.k`` (and ``cfg.lora_settings()`` calls the LoRA block's method): the code every
  recipe shares (start-up, run folder, checkpoints) reads a composed config as it reads a flat one.

:func:`option_fields`, :func:`option_hints` and :func:`option_values` are the flat view of any config class,
composed or not (a plain dataclass is its own flat view): what validation, ``--config`` files, ``--dry-run`` plans and
``config.yaml`` read.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

__all__ = ["composed", "block_fields", "option_fields", "option_hints", "option_values"]


@functools.cache
def block_fields(cls: type) -> dict[str, type]:
    """``{field name: block class}`` of the fields of dataclass ``cls`` that are option blocks (dataclass-typed);
    empty for a flat config."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints.get(f.name))}


def _cls(config: Any) -> type:
    return config if isinstance(config, type) else type(config)


def option_fields(config: Any) -> list[dataclasses.Field]:
    """The options of a config class or instance in order: a block's fields in place of the block."""
    cls = _cls(config)
    blocks = block_fields(cls)
    out: list[dataclasses.Field] = []
    for f in dataclasses.fields(cls):
        out += dataclasses.fields(blocks[f.name]) if f.name in blocks else [f]
    return out


def option_hints(config: Any, include_extras: bool = False) -> dict[str, Any]:
    """``{option name: type}`` of a config class or instance (``typing.get_type_hints`` of each block)."""
    cls = _cls(config)
    hints = dict(typing.get_type_hints(cls, include_extras=include_extras))
    for name, block in block_fields(cls).items():
        del hints[name]
        hints.update(typing.get_type_hints(block, include_extras=include_extras))
    return hints


def option_values(cfg: Any) -> dict[str, Any]:
    """``{option name: value}`` of a config instance: ``dataclasses.asdict`` with each block's fields in its place
    (what ``config.yaml`` holds and ``--dry-run`` shows)."""
    blocks = block_fields(type(cfg))
    out: dict[str, Any] = {}
    for name, value in dataclasses.asdict(cfg).items():
        if name in blocks:
            out.update(value)
        else:
            out[name] = value
    return out


def composed(cls: type) -> type:
    """Class decorator, above ``@dataclass(frozen=True)``: flat keywords and flat attribute reads for a config whose
    fields are option blocks (see the module docstring). Each option name must belong to one block.

    Raises:
        TypeError: two blocks declare the same option (at class creation); an unknown keyword (at construction).
    """
    owners: dict[str, str] = {}  # option name -> the block field that holds it
    members: dict[str, str] = {}  # option names and the blocks' public methods -> block field
    plain = {f.name for f in dataclasses.fields(cls)}
    for name, block in block_fields(cls).items():
        for f in dataclasses.fields(block):
            if f.name in owners or f.name in plain:
                raise TypeError(f"{cls.__name__}: option {f.name!r} is declared twice")
            owners[f.name] = name
        members.update({m: name for m in dir(block) if not m.startswith("_") and m not in members})
    members.update(owners)
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    generated = cls.__init__

    def __init__(self, **kwargs: Any) -> None:
        flat: dict[str, dict[str, Any]] = {}
        for name in [n for n in kwargs if n in owners]:
            flat.setdefault(owners[name], {})[name] = kwargs.pop(name)
        for block, values in flat.items():
            base = kwargs.get(block)
            if base is None:
                f = defaults[block]
                base = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            kwargs[block] = dataclasses.replace(base, **values)
        generated(self, **kwargs)

    def __getattr__(self, name: str) -> Any:
        block = members.get(name)
        if block is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(object.__getattribute__(self, block), name)

    __init__.__doc__ = generated.__doc__
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = __init__
    cls.__getattr__ = __getattr__
    return cls
