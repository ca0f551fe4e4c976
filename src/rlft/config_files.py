"""``--config FILE.yaml`` files: read (bounded), checked, merged, with where each value came from.

A config file is a YAML mapping of option names (``-`` or ``_``) to values, usually headed by the command it is for
(``# rlft rloo`` on its first line, as in ``configs/``). :func:`read_config_file` reads one:

- at most :data:`MAX_CONFIG_BYTES` (1 MiB) are read, so ``/dev/zero`` or a huge file is an error, not an endless read;
- a first line ``# rlft <command>`` naming another command than the one run is refused (``rlft rl --config`` of an
  ``rlft rloo`` file would silently train with GRPO advantages, not RLOO's);
- a key given twice in one mapping is refused (``yaml.safe_load`` keeps the last one silently);
- keys must be options of the command.

Several files merge in order, a later file's value replacing an earlier one key by key (:func:`merge_config_files`);
flags override them all. Every problem raises :class:`rlft.validation.OptionError` naming the file (and the line).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from rlft.composed import option_fields, option_hints
from rlft.validation import OptionError

MAX_CONFIG_BYTES = 1 << 20
"""Most bytes a config file may hold (1 MiB; the recipes in configs/ are under 4 KiB)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one YAML mapping (the message names it and both lines)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the base constructor reports it
            continue
        seen[key] = line
        if first is not None:
            raise DuplicateKeyError(
                f"key {key!r} appears twice (lines {first} and {line}); the last one would silently win")
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_bounded(path: str | Path, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of ``path``, reading at most ``limit + 1`` of them.

    Raises:
        OptionError: the file is missing or a folder, or holds more than ``limit`` bytes (the message names the file).
    """
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise OptionError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise OptionError(f"--config {path}: is a directory, not a YAML file") from None
    except PermissionError:
        raise OptionError(f"--config {path}: permission denied") from None
    if len(data) > limit:
        size = f"{limit / (1 << 20):g} MiB" if limit >= 1 << 20 else f"{limit} bytes"
        raise OptionError(f"--config {path}: more than {size}; an options file is a short YAML mapping")
    return data


def header_command(text: str, commands: list[str]) -> str | None:
    """The command a config's first line names (``# rlft rloo`` -> ``rloo``; the longest of ``commands`` its words
    start with), or None when the first line is no ``# rlft <command>`` header."""
    first = text.split("\n", 1)[0].strip()
    if not first.startswith("#"):
        return None
    words = first.lstrip("#").split()
    if not words or words[0] != "rlft":
        return None
    matches = [c for c in commands if words[1 : 1 + len(c.split())] == c.split()]
    return max(matches, key=lambda c: len(c.split())) if matches else None


def _coerce(value: Any, annotation: Any) -> Any:
    """A YAML string where the field wants a number, parsed as the flag would be (``lr: 1e-4`` is a
    string to YAML 1.1); a YAML list for a tuple field, as a tuple. Anything else is returned as is
    (the config's own validation judges it)."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) is not None else (annotation,)
    if value == "None" and type(None) in args:  # as the flag reads it
        return None
    if isinstance(value, str) and float in args and int not in args:
        try:
            return float(value)
        except ValueError:
            return value
    if isinstance(value, str) and int in args:
        try:
            return int(value)
        except ValueError:
            return value
    if isinstance(value, list) and typing.get_origin(annotation) is tuple:
        return tuple(value)
    return value


def read_config_file(cls: type, path: str, command: str | None = None,
                     commands: list[str] | None = None) -> dict[str, Any]:
    """The option values of one config file for ``cls`` (field names, values coerced like flags; not validated yet).

    ``command``: the command being run; with ``commands`` (every command name) a ``# rlft <other>`` header is refused.

    Raises:
        OptionError: see the module docstring; also not YAML, no mapping, an unknown key.
    """
    data = read_bounded(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise OptionError(f"--config {path}: not valid YAML (not UTF-8 text)") from None
    if command is not None and commands:
        named = header_command(text, commands)
        if named is not None and named != command:
            raise OptionError(
                f"--config {path} is a config of `rlft {named}` (its first line), not of `rlft {command}`: "
                f"run `rlft {named} --config {path}`, or change its first line")
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except DuplicateKeyError as e:
        raise OptionError(f"--config {path}: {e}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise OptionError(f"--config {path}: not valid YAML{at}") from None
    if not isinstance(loaded, dict):
        raise OptionError(f"--config {path}: expected a mapping of option names to values")
    known = {f.name for f in option_fields(cls)}  # a composed config's flat option names
    values = {str(key).replace("-", "_"): value for key, value in loaded.items()}
    if len(values) < len(loaded):
        twice = sorted(
            str(k) for k in loaded if sum(str(o).replace("-", "_") == str(k).replace("-", "_") for o in loaded) > 1)
        raise OptionError(f"--config {path}: an option is given twice, spelled with '-' and '_' ({', '.join(twice)})")
    unknown = sorted(set(values) - known)
    if unknown:
        raise OptionError(f"--config {path}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    hints = option_hints(cls)
    return {k: _coerce(v, hints.get(k)) for k, v in values.items()}


def merge_config_files(cls: type, paths: list[str], preset: dict[str, Any] | None = None, command: str | None = None,
                       commands: list[str] | None = None) -> tuple[Any, dict[str, str]]:
    """``cls`` built from ``preset`` (a command's defaults, e.g. ``rlft rloo``'s; None: the class's own) and the files
    ``paths`` in order, a later file's value replacing an earlier one key by key.

    Returns:
        ``(config, sources)``: ``sources`` maps each option a file set to that file's path.
    Raises:
        OptionError: a file's problem (:func:`read_config_file`), or a value of the wrong type or out of range
            (the message names the file that gave it; a clash between options of different files names them all).
    """
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for path in paths:
        values = read_config_file(cls, path, command, commands)
        try:
            cls(**{**(preset or {}), **values})  # each file's values are checked alone first, so errors name it
        except ValueError as e:
            raise OptionError(f"--config {path}: {e}") from None
        merged.update(values)
        sources.update({k: path for k in values})
    try:
        return cls(**{**(preset or {}), **merged}), sources
    except ValueError as e:
        raise OptionError(f"--config {', '.join(paths)}: {e}") from None
