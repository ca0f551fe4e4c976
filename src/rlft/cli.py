"""The ``rlft`` command line: ``rlft <command> [--config file.yaml] [--option value ...]``.

Each command is a dataclass of options (one docstring per field, shown by ``--help``) parsed by
tyro, and one function that runs it. ``--config file.yaml`` supplies defaults (several merge in order, a later
file winning key by key; :mod:`rlft.config_files`); flags override them. Every config validates itself
(:mod:`rlft.validation`), so YAML values get the checks flags get. Then, still before anything is loaded, the
command's surroundings are checked (:func:`preflight`: torchrun, run folder, output files), for a real run and for
``--dry-run`` alike.

Errors are one line on stderr, ``rlft <command>: error: <message>``, with exit code 2 for a wrong
option, YAML value or run folder (:class:`rlft.validation.UsageError`) and 1 for anything else (bad
data, a model that cannot be loaded, a judge that fails). ``--debug`` (or ``RLFT_DEBUG=1``) shows the
traceback instead.
"""

from __future__ import annotations

import io
import os
import sys
import traceback
from contextlib import redirect_stderr
from typing import Any, Callable

from rlft.composed import option_fields
from rlft.config_files import merge_config_files
from rlft.console import console, setup_logging
from rlft.validation import OptionError, UsageError


def _commands(
) -> dict[str, tuple[type, Callable[[Any], Any], str] | tuple[type, Callable[[Any], Any], str, dict[str, Any]]]:
    """Command name -> ``(config class, run function, one-line help[, defaults])``: ``defaults`` (a dict of field
    values) replace the class's own defaults, under ``--config`` values and flags."""
    from rlft.eval.compare import EvalCompareConfig, run_eval_compare
    from rlft.eval.countdown_command import EvalCountdownConfig
    from rlft.eval.environment_command import EvalEnvConfig, run_eval_env
    from rlft.lab.ledger import EvalLedgerConfig, run_eval_ledger
    from rlft.eval.winrate import WinrateConfig, run_winrate
    from rlft.lab.demo import DemoConfig, run_demo
    from rlft.lab.test_looks import run_eval_countdown_counted, train_rl_counted
    from rlft.recipes.reward_model import RMConfig, train_rm
    from rlft.recipes.dpo import DPOConfig, train_dpo
    from rlft.recipes.pairs import PairsConfig, make_countdown_pairs
    from rlft.recipes.pairs_env import PairsEnvConfig, make_env_pairs
    from rlft.losses.advantages import ADVANTAGES
    from rlft.losses.pg import POLICY_LOSSES
    from rlft.recipes.rl import RLConfig
    from rlft.rl.config import RLOO_DEFAULTS
    from rlft.recipes.sft import SFTConfig, train_sft

    return {
        "demo": (
            DemoConfig, run_demo,
            "End-to-end demo with report: Countdown (base -> SFT -> filtered SFT -> RL / RPO, Countdown-Tasks-3to4) "
            "or --track ultrafeedback (SFT, DPO, RM, RLOO, win-rates)."
        ),
        "sft": (
            SFTConfig, train_sft,
            "Supervised fine-tuning: Countdown traces, cog_behav, prompt/completion files, chat data "
            "(SmolTalk, Pref-FT)."
        ),
        "rl": (
            RLConfig, train_rl_counted,
            f"RL loop with a chosen advantage estimator (--advantage {'|'.join(ADVANTAGES)}) "
            f"and loss (--loss {'|'.join(POLICY_LOSSES)}), group filtering, LoRA."
        ),
        "rloo": (
            RLConfig, train_rl_counted,
            "RLOO (REINFORCE, leave-one-out baseline): `rlft rl` with --advantage rloo --loss reinforce "
            "--loss-mode seq_sum --output-dir runs/rloo as defaults.",
            RLOO_DEFAULTS),
        "pairs countdown": (
            PairsConfig, make_countdown_pairs,
            "On-policy preference pairs: sample n per prompt, score with compute_score, keep best vs worst, drop ties."
        ),
        "pairs env": (
            PairsEnvConfig, make_env_pairs,
            "On-policy pairs of any environment (--env file.py:Class): n rollouts per row scored by its reward, "
            "best vs worst."),
        "dpo": (
            DPOConfig, train_dpo,
            "Direct preference optimisation (DPO, IPO, cDPO, RPO) on Countdown pairs or chat preference data "
            "(UltraFeedback, HH)."
        ),
        "rm": (RMConfig, train_rm, "Bradley-Terry reward model (scalar head on a causal LM) on preference pairs."),
        "eval countdown": (EvalCountdownConfig, run_eval_countdown_counted,
                           "Score a model on held-out Countdown tasks (score, accuracy, format rate, pass@k)."),
        "eval env": (EvalEnvConfig, run_eval_env,
                     "Score a model on any environment's rows (--env path/to/file.py:ClassName) by its own reward."),
        "eval compare": (
            EvalCompareConfig, run_eval_compare,
            "Paired difference B - A of `eval countdown --output` files of the same tasks (mixed, 3 and 4 numbers), "
            "95% CI; BASE X Y ...: Holm across the batch."
        ),
        "eval ledger": (
            EvalLedgerConfig, run_eval_ledger,
            "Count the test looks a ledger (test_looks.jsonl: one line per test evaluation) records, "
            "with a table per model."
        ),
        "eval winrate": (WinrateConfig, run_winrate,
                         "Win-rate of a policy vs a reference, judged by a local reward model or a remote reward API."),
    }


def _usage(commands) -> str:
    lines = ["usage: rlft <command> [--config FILE.yaml] [options]", "", "commands:"]
    width = max(len(name) for name in commands)
    lines += [f"  {name:<{width}}  {help_}" for name, (_, _, help_, *_) in commands.items()]
    lines += [
        "", "Run `rlft <command> --help` for a command's options; `--config FILE.yaml` supplies defaults;",
        "several --config files merge in order (later ones win); `--dry-run` parses and validates the options, runs",
        "the checks of the output folder and files, and prints the plan (where each value comes from) without running;",
        "`--debug` shows tracebacks."
    ]
    return "\n".join(lines)


def _pop_configs(args: list[str]) -> tuple[list[str], list[str]]:
    """``(config paths in order, the other arguments)``: every ``--config FILE`` / ``--config=FILE`` is taken out."""
    rest, paths, i = [], [], 0
    while i < len(args):
        if args[i] == "--config":
            if i + 1 >= len(args):
                raise OptionError("--config needs a file path")
            paths.append(args[i + 1])
            i += 2
        elif args[i].startswith("--config="):
            paths.append(args[i].split("=", 1)[1])
            i += 1
        else:
            rest.append(args[i])
            i += 1
    return paths, rest


def load_config_defaults(cls: type, path: str | list[str], preset: dict[str, Any] | None = None,
                         command: str | None = None):
    """Build ``cls`` from one YAML file or several (merged in order, later files winning key by key) over ``preset``
    (a command's defaults, e.g. ``rlft rloo``'s; None: the class's own); see :mod:`rlft.config_files`.

    Values are checked like flags: the config's ``__post_init__`` validates types and ranges. ``command``: the
    command run, so that a file headed ``# rlft <another command>`` is refused.

    Raises:
        OptionError: a file is missing, too large or not YAML, names another command in its header, holds no mapping,
            a key twice, an unknown key, or a value of the wrong type or out of range (the message names the file
            and the option).
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    return merge_config_files(cls, [str(p) for p in paths], preset, command, list(_commands()) if command else None)[0]


def flag_fields(cls: type, args: list[str]) -> set[str]:
    """Names of the fields of ``cls`` that the flags ``args`` set (``--max-steps``, ``--max-steps=3``,
    ``--no-resume``)."""
    names = {f.name for f in option_fields(cls)}
    out = set()
    for arg in args:
        if not arg.startswith("--"):
            continue
        name = arg[2:].split("=", 1)[0].replace("-", "_")
        if name in names:
            out.add(name)
        elif name.startswith("no_") and name[3:] in names:
            out.add(name[3:])
    return out


def value_sources(cls: type, rest: list[str], config_sources: dict[str, str], preset: dict[str, Any] | None,
                  name: str) -> dict[str, str]:
    """Where each option's value comes from, for the plan: ``flag``, ``--config FILE``, ``rlft <name> default``
    (a command's preset, e.g. ``rlft rloo``'s) or ``default``."""
    flags = flag_fields(cls, rest)
    out = {}
    for f in option_fields(cls):
        if f.name in flags:
            out[f.name] = "flag"
        elif f.name in config_sources:
            out[f.name] = f"--config {config_sources[f.name]}"
        elif preset and f.name in preset:
            out[f.name] = f"rlft {name} default"
        else:
            out[f.name] = "default"
    return out


def preflight(name: str, cfg: Any) -> None:
    """The checks a command's run makes on its surroundings before loading anything, run at parse time, so that a
    real run and ``--dry-run`` refuse the same things: a sampling command under torchrun
    (:func:`rlft.distributed.require_one_process`), the run folder of a training command (claim rules, resume
    compatibility: :func:`rlft.run_folder.check_run_dir`), the files a command writes (``cfg.check_outputs()``), and
    the lab's checks of a command (:func:`_lab_checks`: the test-look ledger of ``eval countdown``).

    Raises:
        UsageError: what the check refuses (the CLI exits with code 2).
    """
    from rlft import distributed
    from rlft.options import RunOptions

    if name in SAMPLING_COMMANDS:
        distributed.require_one_process(f"rlft {name}")
    if isinstance(cfg, RunOptions) or isinstance(getattr(cfg, "run", None), RunOptions):  # RLConfig: a block
        from rlft.run_folder import check_run_dir

        check_run_dir(cfg)
    check = getattr(cfg, "check_outputs", None)
    if callable(check):
        check()
    if (lab_check := _lab_checks().get(name)) is not None:
        lab_check(cfg)


def _lab_checks() -> dict[str, Callable[[Any], None]]:
    """Command name -> a check of the lab (:mod:`rlft.lab`) that :func:`preflight` runs after the config's own."""
    from rlft.lab.test_looks import check_eval_ledger

    return {"eval countdown": check_eval_ledger}


SAMPLING_COMMANDS = ("eval countdown", "eval winrate", "pairs countdown", "eval env", "pairs env")
"""Commands that sample in one process: refused under torchrun (both ranks would sample the same tasks and write
the same files)."""


class _TyroRefusal(Exception):
    """Raised by :func:`_refuse` inside tyro: its parse failure, as one line."""


def _tyro_error_line(event: Any) -> str:
    """One line for a tyro parse failure, from the event's fields (tyro's ``_errors`` hook, not its rendered
    panel): an unknown option, a missing or short value, a choice outside the allowed ones, a value that does not
    convert, a failed construction (e.g. a field check), two options of one group. An event of a kind tyro adds
    later is named by its class."""
    from tyro import _errors as tyro_errors

    def flag(argument: Any) -> str:
        return argument.display_name()

    if isinstance(event, tyro_errors.UnrecognizedArgs):
        return f"Unrecognized options: {', '.join(event.tokens)}"
    if isinstance(event, tyro_errors.MissingArgs):
        return "missing required option(s): " + ", ".join(flag(a.arg) for a in event.missing_arguments)
    if isinstance(event, tyro_errors.InvalidChoice):
        return f"invalid choice {event.value!r} for argument {flag(event.argument)!r}. Expected one of {event.choices}."
    if isinstance(event, tyro_errors.BadValue):
        got = f", got {event.offending_value!r}" if event.offending_value is not None else ""
        return f"{flag(event.argument)}: expected a value{got}"
    if isinstance(event, tyro_errors.InstantiationFailure):
        if event.argument is None or event.message.startswith(flag(event.argument)):
            return event.message
        return f"Error parsing {flag(event.argument)}: {event.message}"
    if isinstance(event, tyro_errors.MutexConflict):
        return f"{event.first_token} and {event.second_token} cannot be given together"
    return f"invalid arguments ({type(event).__name__})"


def _refuse(event: Any) -> None:
    """tyro's parse-error hook: take the failure over as one line (:func:`_tyro_error_line`)."""
    raise _TyroRefusal(" ".join(_tyro_error_line(event).split()))


def parse_config(cls: type, rest: list[str], name: str, help_: str, default: Any = None):
    """Parse ``rest`` into ``cls`` with tyro (``default`` from ``--config``).

    Raises:
        OptionError: tyro refused the flags (read from its parse-error event: :func:`_tyro_error_line`), or the
            config's validation refused the values.
    """
    import tyro
    from tyro import _errors as tyro_errors

    kwargs = {"default": default} if default is not None else {}
    captured = io.StringIO()  # tyro's own prints (help, warnings): shown for --help only
    try:
        with tyro_errors.on_parse_error(_refuse), redirect_stderr(captured):
            return tyro.cli(cls, args=rest, prog=f"rlft {name}", description=help_, **kwargs)
    except SystemExit as e:
        if not e.code:  # --help
            sys.stderr.write(captured.getvalue())
        raise
    except _TyroRefusal as e:
        raise OptionError(str(e)) from None
    except UsageError:
        raise
    except ValueError as e:  # a config's __post_init__ check across options
        raise OptionError(str(e)) from None


def _one_line(error: BaseException) -> str:
    """An exception as one line: rlft's own errors (and ValueError/OSError) by their message, others
    with their type and a hint at --debug."""
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError,
                          PermissionError)) and error.filename and str(error.filename) not in text:
        text = f"{error.filename}: {error.strerror or text}"
    if isinstance(
            error,
        (ValueError, OSError, ConnectionError, KeyboardInterrupt)) or type(error).__module__.startswith("rlft"):
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
        config_paths, rest = _pop_configs(argv[len(name.split()) :])
        config_sources: dict[str, str] = {}
        if config_paths:
            default, config_sources = merge_config_files(cls, config_paths, preset, name, list(commands))
        else:
            default = cls(**preset) if preset else None
        cfg = parse_config(cls, rest, name, help_, default)
        preflight(name, cfg)
    except (UsageError, OSError) as e:  # OSError: a path the checks could not read (e.g. permission denied)
        if debug:
            traceback.print_exc()
        print(f"rlft {name}: error: {_one_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    if dry_run:
        from rlft.plan import plan

        print(plan(name, cfg, value_sources(cls, rest, config_sources, preset, name)))
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
