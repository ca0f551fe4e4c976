"""Existing configs and command lines keep their meaning when option blocks move.

``tests/assets/config_snapshot.json`` was written (``python tests/unit/test_config_snapshot.py --write``) before the
Countdown, RL and demo options were grouped into blocks (2026-11-27). It holds:

- ``configs``: every ``configs/**/*.yaml`` headed ``# rlft <command>``, parsed as ``--config`` parses it
  (:func:`rlft.cli.load_config_defaults`), and every (setting, variant) of ``configs/countdown/ablation`` built as
  ``scripts/countdown_ablation.py`` builds it, as ``dataclasses.asdict`` (or the error it raised);
- ``help``: for the commands whose config classes the blocks touch, each flag of ``rlft <command> --help`` with its
  type, help text and default, as tyro prints them.

The tests compare today's parse with it: same values, same flags, same defaults and help.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "assets" / "config_snapshot.json"
HELP_COMMANDS = ("demo", "sft", "rl", "rloo", "pairs countdown", "eval countdown")
"""The commands whose config classes are built from the option blocks."""
SCRIPT_KEYS = ("kind", "budget", "budget_of", "pairs_of", "pair_prompts", "pair_samples", "pair_offset", "start_from")
"""Variant keys that are the ablation script's own, not recipe options (scripts/countdown_ablation.py)."""
_COUNTDOWN = {"--preset", "--split-seed", "--heldout-size", "--prompt-template"}
HELP_REWORDED: dict[str, set[str]] = {
    "sft": _COUNTDOWN,
    "eval countdown": _COUNTDOWN | {"--data", "--data-split"},
    "pairs countdown": _COUNTDOWN | {"--data", "--data-split", "--data-heldout"},
    "rl": _COUNTDOWN | {"--data", "--data-split", "--data-heldout"},
    "rloo": _COUNTDOWN | {"--data", "--data-split", "--data-heldout"},
}
"""Flags whose help text was deliberately reworded, per command (their type and default still must not change): the
Countdown options, one block with one help text since 2026-11-27 (rlft.tasks.countdown.options)."""
for _command in ("demo", "sft", "rl", "rloo", "pairs countdown", "eval countdown"):  # --dtype: float16 training refused
    HELP_REWORDED[_command] = HELP_REWORDED.get(_command, set()) | {"--dtype"}
HELP_REWORDED["demo"] |= {"--rl-steps", "--pairs-samples", "--rl-eval-every"}  # they start from the filtered SFT model
HELP_REWORDED["demo"] |= {"--eval-batch-size"}  # it sets RL's sampling batch too
HELP_REWORDED["demo"] |= {"--rows", "--num-rows"}  # 'auto' reads the rows that ship with rlft since 2026-12-06
HELP_REWORDED["demo"] |= {"--track"}  # names rlft.lab.demo_ultrafeedback, the demo's module since 2026-12-06
HELP_REWORDED["sft"] |= {"--max-tokens-per-micro-batch"}  # one help text with rl's since 2026-12-02
HELP_REWORDED["sft"] |= {"--trace-style"}  # names the 'calc' style (a calculator tool's calls) since 2026-12-06
HELP_REWORDED["rl"] |= {"--gen-batch-size", "--micro-batch-size"}  # why 64; what to set on a GPU
HELP_REWORDED["rloo"] |= {"--gen-batch-size", "--micro-batch-size"}
for _command in ("rl", "rloo"):  # --curriculum pass-rate (rlft.rl.pass_rate) and the count_rank buckets, 2026-12-06
    HELP_REWORDED[_command] |= {"--curriculum", "--curriculum-buckets", "--curriculum-alpha"}
    HELP_REWORDED[_command] |= {"--reward"}  # names 'countdown_accuracy' (no format credit), 2026-12-06
for _command in ("sft", "rl", "rloo"):  # a checkpoint after the last step too, which a longer run resumes (2026-12-07)
    HELP_REWORDED[_command] |= {"--save-every"}
DEFAULT_CHANGED: dict[str, dict[str, str]] = {"demo": {"--sft-steps": "(default: 40)", "--passk": "(default: 0)",
                                                       "--pairs-prompts": "(default: 128)",
                                                       "--eval-batch-size": "(default: 256)"},
                                             "rl": {"--gen-batch-size": "(default: 64)"},
                                             "rloo": {"--gen-batch-size": "(default: 64)"}}
"""Defaults deliberately changed, per command, with the new default as tyro prints it (2026-11-27: the demo gained
its filtered SFT stage and skips the sampled evaluation; 2026-11-28, to fit 45 minutes: 40 SFT steps, 128 pair
prompts, 256 sequences decoded together; rl's sampler decodes a default step's 64 samples together, not 32)."""


ENV_ADDED = {"env": None, "max_turns": 8, "max_observation_tokens": 32, "tool_timeout": 5.0}
"""--env and the bounds of rollouts with tool calls (2026-12-06): one block, added to rl, rloo and eval countdown."""
ENV_FLAGS = {"--env", "--max-turns", "--max-observation-tokens", "--tool-timeout"}
HINT_FLAGS = {"--hint", "--hint-fraction", "--time-limit", "--max-flops"}  # hints; time and compute stops (2026-12-06)
ADDED = {
    "RLConfig": {
        "stop_repeats": 5, "compile": False, "repetition_limit": None, "repetition_penalty": None, "replay_size": 0,
        "max_staleness": 1, "max_tokens_per_micro_batch": None, "positive_weight": 1.0, **ENV_ADDED,
        "hint": "none", "hint_fraction": 0.5, "time_limit": None, "max_flops": None
    }, "EvalCountdownConfig": {"ledger": None, "stop_repeats": None, "keep_completions": False, **ENV_ADDED},
    "PairsConfig": ENV_ADDED, "SFTConfig": {"max_tokens": None}
}
"""Options added since the snapshot, per config class, with their defaults (a config file that does not set one gets
it)."""
SET_SINCE = {"real_sft_correct_grpo": {"stop_repeats": None}}
"""Added options a variant (in every setting) sets explicitly, with its value: the recipe as named, before the
option's default changed the sampling (configs/countdown/ablation/4_real.yaml)."""
ADDED_FLAGS = {"rl": {"--compile", "--replay-size", "--max-staleness", "--stop-repeats", "--max-tokens-per-micro-batch",
                      "--positive-weight", *ENV_FLAGS, *HINT_FLAGS},
               "rloo": {"--compile", "--replay-size", "--max-staleness", "--stop-repeats",
                        "--max-tokens-per-micro-batch", "--positive-weight", *ENV_FLAGS, *HINT_FLAGS},
               "eval countdown": {"--ledger", "--stop-repeats", "--keep-completions", *ENV_FLAGS},
               "pairs countdown": ENV_FLAGS, "demo": {"--filtered-steps"}, "sft": {"--max-tokens"}}
DEMO_ENV_ADDED = {**ENV_ADDED, "env": "countdown"}
"""rlft demo's --env countdown|countdown-calc (default countdown) and the same bounds (2026-12-06, rlft.lab.demo_env):
added deliberately, the one change to the demo's options (a config file without them runs as before)."""
ADDED["DemoConfig"] = DEMO_ENV_ADDED
ADDED_FLAGS["demo"] |= ENV_FLAGS


def _without_added(record: dict, key: str = "") -> dict:
    """``record`` (of config file or variant ``key``) with the options added since the snapshot taken out, after
    checking they hold their defaults (or the value ``SET_SINCE`` gives for the variant of ``key``,
    "setting/variant")."""
    record_class = record.get("class")
    record = {k: v for k, v in record.items() if k != "class"}
    if "values" not in record:
        return record
    values = dict(record["values"])
    for name, default in {**ADDED.get(record_class, {}), **SET_SINCE.get(key.split("/")[-1], {})}.items():
        assert values.pop(name) == default, name
    return {**record, "values": values}


REGISTRY_FLAGS = {"--advantage", "--loss", "--loss-mode", "--is-correction", "--kl-mode", "--kl-estimator",
                  "--curriculum-buckets", "--rl-advantage", "--rl-loss", "--rl-loss-mode", "--trace-style",
                  "--curriculum"}
"""Flags whose choices are a registry's keys (docs/design.md section 5): a new entry is a new choice, none may go
(sft's --trace-style: rlft.tasks.countdown.traces.TRACE_STYLES, which gained 'calc'; rl's --curriculum:
rlft.recipes.rl.CURRICULA, which gained 'pass-rate')."""


def _registry_choices(before: str, now: str) -> tuple[str, str]:
    """``(before, now)`` with the choices ``{a,b,...}`` of ``now`` replaced by those of ``before`` when they only
    add to them (a registry grew)."""
    old, new = re.match(r"^\{([^}]*)\}", before), re.match(r"^\{([^}]*)\}", now)
    if old and new and set(old.group(1).split(",")) <= set(new.group(1).split(",")):
        now = old.group(0) + now[new.end():]
    return before, now


def _type_and_default(text: str) -> tuple[str, str]:
    """The type token tyro prints first (``INT``, ``{None}|STR``, ``{a,b}``; none for a flag pair) and the default."""
    first = text.split(" ", 1)[0]
    default = re.search(r"\(default: [^)]*\)$", text)
    return (first if re.match(r"^(\{|\[|[A-Z|]+$)", first) else "", default.group(0) if default else "")


def _jsonable(value):
    return json.loads(json.dumps(value))


def _attempt(build) -> dict:
    try:
        cfg = build()
        from rlft.composed import option_values  # dataclasses.asdict, a composed config's blocks flat (RLConfig)

        return {"values": _jsonable(option_values(cfg)), "class": type(cfg).__name__}  # class: not in the file
    except (ValueError, TypeError) as e:  # OptionError is a ValueError
        return {"error": str(e)}


def parsed_configs() -> dict[str, dict]:
    """``{relative path: {"command", "values"|"error"}}`` of every headed YAML file under configs/."""
    from rlft.cli import _commands, load_config_defaults
    from rlft.config_files import header_command

    commands = _commands()
    out = {}
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        command = header_command(path.read_text(), list(commands))
        if command is None:
            continue
        cls, _, _, *preset = commands[command]
        rel = str(path.relative_to(ROOT))
        out[rel] = {"command": command,
                    **_attempt(lambda: load_config_defaults(cls, str(path), preset[0] if preset else None, command))}
    return out


def ablation_configs() -> dict[str, dict]:
    """``{"setting/variant[/pairs]": {"values"|"error"}}``: each variant's recipe config for each setting, built from
    ``settings.yaml`` and the variant files as scripts/countdown_ablation.py builds it (placeholders for paths)."""
    from rlft.recipes.dpo import DPOConfig
    from rlft.recipes.pairs import PairsConfig
    from rlft.lab.pipeline import load_settings, load_variants
    from rlft.recipes.sft import SFTConfig
    from rlft.rl.config import RLConfig

    folder = ROOT / "configs" / "countdown" / "ablation"
    settings, variants = load_settings(folder), load_variants(folder)
    out = {}
    for sname, s in settings.items():
        device = dict(device=s.device, dtype=s.dtype)
        for vname, spec in variants.items():
            options = {k: v for k, v in spec.items() if k not in SCRIPT_KEYS}
            key = f"{sname}/{vname}"
            if spec["kind"] == "rl":
                out[key] = _attempt(lambda: RLConfig(
                    **{**s.tasks, **s.rl, "max_new_tokens": s.max_new_tokens, "eval_max_new_tokens": s.max_new_tokens,
                       "micro_batch_size": s.micro_batch_size, **options},
                    model="start", output_dir="run", seed=0, **device, resume_override=("micro_batch_size",)))
            elif spec["kind"] == "dpo":
                out[key] = _attempt(
                    lambda: DPOConfig(**{**s.dpo, **options}, model="start", data="pairs.jsonl", output_dir="run",
                                      micro_batch_size=s.micro_batch_size, seed=0, **device))
                n = spec.get("pair_prompts", s.pairs["num_prompts"])
                out[key + "/pairs"] = _attempt(lambda: PairsConfig(
                    **{
                        **s.tasks, **s.pairs, "num_prompts": n, "num_samples": spec.get(
                            "pair_samples", s.pairs["num_samples"])
                    }, model="start", start=spec.get("pair_offset", 0), max_new_tokens=s.max_new_tokens, output=
                    "pairs.jsonl", seed=0, **device))
            else:
                out[key] = _attempt(lambda: SFTConfig(**{**s.tasks, **s.sft_continued, **options}, model="start",
                                                      trace_style=s.trace_style, give_up=s.give_up, output_dir="run",
                                                      max_steps=1, seed=0, **device))
    return out


_BOX = re.compile(r"[\u2500-\u257f]")


def help_flags(command: str) -> dict[str, str]:
    """``{flag: "TYPE help (default: ...)"}`` of ``rlft <command> --help`` (whitespace collapsed)."""
    import tyro

    from rlft.cli import _commands

    cls, _, help_, *preset = _commands()[command]
    default = cls(**preset[0]) if preset else None
    buffer = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "300"
    try:
        with redirect_stdout(buffer), pytest.raises(SystemExit):
            tyro.cli(cls, args=["--help"], prog=f"rlft {command}", description=help_,
                     **({"default": default} if default is not None else {}))
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    flags: dict[str, list[str]] = {}
    current = None
    for line in buffer.getvalue().splitlines():
        inner = _BOX.sub(" ", line)[1:].rstrip()  # a flag starts after one space; its text goes on further in
        match = re.match(r"^ (--[a-z0-9-]+)(?:, --no-[a-z0-9-]+)?(?:\s+(.*))?$", inner)
        if match:
            current = match.group(1)
            flags[current] = [match.group(2) or ""]
        elif inner.startswith(" -h, --help") or not inner.strip():
            current = None
        elif current is not None:
            flags[current].append(inner.strip())
    return {flag: " ".join(" ".join(parts).split()) for flag, parts in flags.items()}


def snapshot() -> dict:
    return {"configs": parsed_configs(), "ablation": ablation_configs(),
            "help": {command: help_flags(command) for command in HELP_COMMANDS}}


@pytest.fixture(scope="module")
def saved() -> dict:
    return json.loads(SNAPSHOT.read_text())


def test_config_files_parse_to_the_same_values(saved):
    now = parsed_configs()
    assert sorted(now) == sorted(saved["configs"])
    for path, record in saved["configs"].items():
        assert _without_added(now[path]) == record, path


def test_ablation_variants_build_the_same_configs(saved):
    now = ablation_configs()
    assert set(saved["ablation"]) <= set(now)  # variants named since then are new keys; none may go
    for key, record in saved["ablation"].items():
        assert _without_added(now[key], key) == record, key


@pytest.mark.parametrize("command", HELP_COMMANDS)
def test_flags_defaults_and_help_unchanged(saved, command):
    now, before = help_flags(command), saved["help"][command]
    added = ADDED_FLAGS.get(command, set())
    assert added <= set(now) and sorted(set(now) - added) == sorted(before), \
        f"rlft {command}: flags added {sorted(set(now) - added - set(before))}, " \
        f"removed {sorted(set(before) - set(now))}"
    reworded = HELP_REWORDED.get(command, set())
    for flag, text in before.items():
        if flag in REGISTRY_FLAGS:
            text, now[flag] = _registry_choices(text, now[flag])
        if flag in DEFAULT_CHANGED.get(command, {}):
            assert _type_and_default(now[flag]) == (_type_and_default(text)[0],
                                                    DEFAULT_CHANGED[command][flag]), (command, flag)
        elif flag in reworded:
            assert _type_and_default(now[flag]) == _type_and_default(text), (command, flag)
        else:
            assert now[flag] == text, (command, flag)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/unit/test_config_snapshot.py --write  (rewrites the snapshot)")
    data = snapshot()
    for group in ("configs", "ablation"):
        data[group] = {k: {n: v for n, v in r.items() if n != "class"} for k, r in data[group].items()}
    SNAPSHOT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
