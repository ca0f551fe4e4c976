"""The ``rlft`` command line: ``rlft <command> [--config file.yaml] [--option value ...]``.

Each command is a dataclass of options (one docstring per field, shown by ``--help``) parsed by
tyro, and one function that runs it. ``--config file.yaml`` supplies defaults; flags override them.
Every config validates itself (:mod:`rlft.validation`), so YAML values get the checks flags get.

Errors are one line on stderr, ``rlft <command>: error: <message>``, with exit code 2 for a wrong
option, YAML value or run folder (:class:`rlft.validation.UsageError`) and 1 for anything else (bad
data, a model that cannot be loaded, a judge that fails). ``--debug`` (or ``RLFT_DEBUG=1``) shows the
traceback instead.
"""

from __future__ import annotations

import io
import os
import re
import sys
import traceback
import typing
from contextlib import redirect_stderr
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import yaml

from rlft.console import console, setup_logging
from rlft.validation import OptionError, UsageError


def _commands() -> dict[str, tuple[type, Callable[[Any], Any], str] | tuple[type, Callable[[Any], Any], str, dict[str, Any]]]:
    """Command name -> ``(config class, run function, one-line help[, defaults])``: ``defaults`` (a dict of field
    values) replace the class's own defaults, under ``--config`` values and flags."""
    from rlft.eval.countdown_command import EvalCountdownConfig, run_eval_countdown
    from rlft.eval.winrate import WinrateConfig, run_winrate
    from rlft.recipes.demo import DemoConfig, run_demo
    from rlft.recipes.reward_model import RMConfig, train_rm
    from rlft.recipes.dpo import DPOConfig, train_dpo
    from rlft.recipes.pairs import PairsConfig, make_countdown_pairs
    from rlft.losses.advantages import ADVANTAGES
    from rlft.losses.pg import POLICY_LOSSES
    from rlft.recipes.rl import RLConfig, train_rl
    from rlft.rl.config import RLOO_DEFAULTS
    from rlft.recipes.sft import SFTConfig, train_sft

    return {
        "demo": (DemoConfig, run_demo, "End-to-end demo with report: Countdown (base -> SFT -> RL / DPO, medium3) or --track ultrafeedback (SFT, DPO, RM, RLOO, win-rates)."),
        "sft": (SFTConfig, train_sft, "Supervised fine-tuning: Countdown traces, cog_behav, prompt/completion files, chat data (SmolTalk, Pref-FT)."),
        "rl": (RLConfig, train_rl, f"RL loop with a chosen advantage estimator (--advantage {'|'.join(ADVANTAGES)}) and loss (--loss {'|'.join(POLICY_LOSSES)}), group filtering, LoRA."),
        "rloo": (RLConfig, train_rl, "RLOO (REINFORCE, leave-one-out baseline): `rlft rl` with --advantage rloo --loss reinforce --loss-mode seq_sum --output-dir runs/rloo as defaults.", RLOO_DEFAULTS),
        "pairs countdown": (PairsConfig, make_countdown_pairs, "On-policy preference pairs: sample n per prompt, score with compute_score, keep best vs worst, drop ties."),
        "dpo": (DPOConfig, train_dpo, "Direct preference optimisation (DPO, IPO, cDPO, RPO) on Countdown pairs or chat preference data (UltraFeedback, HH)."),
        "rm": (RMConfig, train_rm, "Bradley-Terry reward model (scalar head on a causal LM) on preference pairs."),
        "eval countdown": (EvalCountdownConfig, run_eval_countdown, "Score a model on held-out Countdown tasks (score, accuracy, format rate, pass@k)."),
        "eval winrate": (WinrateConfig, run_winrate, "Win-rate of a policy vs a reference, judged by a local reward model or a remote reward API."),
    }


def _usage(commands) -> str:
    lines = ["usage: rlft <command> [--config FILE.yaml] [options]", "", "commands:"]
    width = max(len(name) for name in commands)
    lines += [f"  {name:<{width}}  {help_}" for name, (_, _, help_, *_) in commands.items()]
    lines += ["", "Run `rlft <command> --help` for a command's options; `--config FILE.yaml` supplies defaults;",
              "`--dry-run` parses and validates the options and prints the plan without running; `--debug` shows tracebacks."]
    return "\n".join(lines)


def _pop_config(args: list[str]) -> tuple[str | None, list[str]]:
    rest, path, i = [], None, 0
    while i < len(args):
        if args[i] == "--config":
            if i + 1 >= len(args):
                raise OptionError("--config needs a file path")
            path, i = args[i + 1], i + 2
        elif args[i].startswith("--config="):
            path, i = args[i].split("=", 1)[1], i + 1
        else:
            rest.append(args[i])
            i += 1
    return path, rest


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


def load_config_defaults(cls: type, path: str, preset: dict[str, Any] | None = None):
    """Build ``cls`` from a YAML mapping (keys are field names, ``-`` or ``_``) over ``preset`` (a command's
    defaults, e.g. ``rlft rloo``'s; None: the class's own).

    Values are checked like flags: the config's ``__post_init__`` validates types and ranges.

    Raises:
        OptionError: the file is missing or not YAML, holds no mapping, an unknown key, or a value of
            the wrong type or out of range (the message names the file and the option).
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise OptionError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise OptionError(f"--config {path}: is a directory, not a YAML file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise OptionError(f"--config {path}: not valid YAML{at}") from None
    if not isinstance(data, dict):
        raise OptionError(f"--config {path}: expected a mapping of option names to values")
    known = {f.name for f in fields(cls)}
    values = {str(key).replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise OptionError(f"--config {path}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    hints = typing.get_type_hints(cls)
    values = {k: _coerce(v, hints.get(k)) for k, v in values.items()}
    try:
        return cls(**{**(preset or {}), **values})
    except ValueError as e:
        raise OptionError(f"--config {path}: {e}") from None


_BOX = re.compile(r"^[\s\u2500-\u257f]+|[\s\u2500-\u257f]+$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _tyro_message(text: str) -> str:
    """The first line inside a tyro error panel: its title (in the top border, or alone on the first
    line when the stream cannot draw boxes), frame and rules dropped."""
    lines = [line for line in _ANSI.sub("", text).splitlines() if line.strip()]
    body = [_BOX.sub("", line.strip(" |+")) for line in lines[1:]]  # lines[0]: the title
    return next((line for line in body if line.strip("-=_ ")), "invalid arguments")


def parse_config(cls: type, rest: list[str], name: str, help_: str, default: Any = None):
    """Parse ``rest`` into ``cls`` with tyro (``default`` from ``--config``).

    Raises:
        OptionError: tyro refused the flags (its panel reduced to one line), or the config's validation
            refused the values.
    """
    import tyro

    kwargs = {"default": default} if default is not None else {}
    captured = io.StringIO()
    columns = os.environ.get("COLUMNS")
    if not {"-h", "--help"} & set(rest):
        os.environ["COLUMNS"] = "4000"  # tyro's error panel on one line per message
    try:
        with redirect_stderr(captured):
            return tyro.cli(cls, args=rest, prog=f"rlft {name}", description=help_, **kwargs)
    except SystemExit as e:
        if not e.code:  # --help
            sys.stderr.write(captured.getvalue())
            raise
        message = _tyro_message(captured.getvalue())
        raise OptionError(re.sub(rf"^Error parsing {cls.__name__}: ", "", message)) from None
    except UsageError:
        raise
    except ValueError as e:  # a config's __post_init__ check across options
        raise OptionError(str(e)) from None
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns


def _one_line(error: BaseException) -> str:
    """An exception as one line: rlft's own errors (and ValueError/OSError) by their message, others
    with their type and a hint at --debug."""
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)) and error.filename and str(error.filename) not in text:
        text = f"{error.filename}: {error.strerror or text}"
    if isinstance(error, (ValueError, OSError, ConnectionError, KeyboardInterrupt)) or type(error).__module__.startswith("rlft"):
        return text
    return f"{type(error).__name__}: {text} (rerun with --debug for the traceback)"


def main(argv: list[str] | None = None) -> None:
    """Run ``rlft <command> ...``; exits with 0 on success, 2 on a usage error, 1 on another error,
    130 when interrupted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("RLFT_DEBUG", "") not in ("", "0")
    dry_run = "--dry-run" in argv
    argv = [a for a in argv if a not in ("--debug", "--dry-run")]
    commands = _commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(commands))
        return
    name = next((n for n in commands if argv[: len(n.split())] == n.split()), None)
    if name is None:
        group = [n for n in commands if n.split()[0] == argv[0]]
        hint = f"; `rlft {argv[0]}` has: {', '.join(n.split()[1] for n in group)}" if group else ""
        print(f"rlft: unknown command {' '.join(argv[:2])!r}{hint}\n\n{_usage(commands)}", file=sys.stderr)
        raise SystemExit(2)
    cls, run, help_, *preset = commands[name]
    preset = preset[0] if preset else None
    try:
        config_path, rest = _pop_config(argv[len(name.split()) :])
        default = load_config_defaults(cls, config_path, preset) if config_path else (cls(**preset) if preset else None)
        cfg = parse_config(cls, rest, name, help_, default)
    except OptionError as e:
        if debug:
            traceback.print_exc()
        print(f"rlft {name}: error: {_one_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    if dry_run:
        from rlft.plan import plan

        print(plan(name, cfg))
        return
    setup_logging()
    try:
        run(cfg)
    except KeyboardInterrupt:
        console.print(f"[yellow]rlft {name}: interrupted; rerun with --resume to continue from the last checkpoint[/]")
        raise SystemExit(130) from None
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"rlft {name}: error: {_one_line(e)}", file=sys.stderr)
        raise SystemExit(getattr(e, "exit_code", 1)) from None
    from rlft.distributed import shutdown

    shutdown()  # under torchrun: every rank finished; nothing otherwise


if __name__ == "__main__":
    main()
