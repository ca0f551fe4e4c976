"""The ``rlft`` command line: ``rlft <command> [--config file.yaml] [--option value ...]``.

Each command is a dataclass of options (one docstring per field, shown by ``--help``) parsed by
tyro, and one function that runs it. ``--config file.yaml`` supplies defaults; flags override them.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import yaml

from rlft.console import console, setup_logging


def _commands() -> dict[str, tuple[type, Callable[[Any], Any], str]]:
    from rlft.eval.countdown import EvalCountdownConfig, run_eval_countdown
    from rlft.eval.winrate import WinrateConfig, run_winrate
    from rlft.recipes.demo import DemoConfig, run_demo
    from rlft.recipes.reward_model import RMConfig, train_rm
    from rlft.recipes.dpo import DPOConfig, train_dpo
    from rlft.recipes.pairs import PairsConfig, make_countdown_pairs
    from rlft.recipes.rl import RLConfig, train_rl
    from rlft.recipes.rloo import RLOOConfig, train_rloo
    from rlft.recipes.sft import SFTConfig, train_sft

    return {
        "demo": (DemoConfig, run_demo, "End-to-end demo with report: Countdown (base -> SFT -> RLOO / DPO) or --track ultrafeedback (SFT, DPO, RM, RLOO, win-rates)."),
        "sft": (SFTConfig, train_sft, "Supervised fine-tuning: Countdown traces, cog_behav, prompt/completion files, chat data (SmolTalk, Pref-FT)."),
        "rl": (RLConfig, train_rl, "RL loop with a chosen advantage estimator (--advantage rloo|grpo|lite_ppo|dr_grpo|raft|reinforce) and loss (--loss reinforce|ppo|raft|raft++), group filtering, LoRA."),
        "rloo": (RLOOConfig, train_rloo, "RLOO (REINFORCE, leave-one-out baseline): Countdown with the rule reward, or chat prompts with a reward model."),
        "pairs countdown": (PairsConfig, make_countdown_pairs, "On-policy preference pairs: sample n per prompt, score with compute_score, keep best vs worst, drop ties."),
        "dpo": (DPOConfig, train_dpo, "Direct preference optimisation (DPO, IPO, cDPO, RPO) on Countdown pairs or chat preference data (UltraFeedback, HH)."),
        "rm": (RMConfig, train_rm, "Bradley-Terry reward model (scalar head on a causal LM) on preference pairs."),
        "eval countdown": (EvalCountdownConfig, run_eval_countdown, "Score a model on held-out Countdown tasks (score, accuracy, format rate, pass@k)."),
        "eval winrate": (WinrateConfig, run_winrate, "Win-rate of a policy vs a reference, judged by a local reward model or a remote reward API."),
    }


def _usage(commands) -> str:
    lines = ["usage: rlft <command> [--config FILE.yaml] [options]", "", "commands:"]
    width = max(len(name) for name in commands)
    lines += [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in commands.items()]
    lines += ["", "Run `rlft <command> --help` for a command's options."]
    return "\n".join(lines)


def _pop_config(args: list[str]) -> tuple[str | None, list[str]]:
    rest, path, i = [], None, 0
    while i < len(args):
        if args[i] == "--config":
            if i + 1 >= len(args):
                raise SystemExit("rlft: --config needs a file path")
            path, i = args[i + 1], i + 2
        elif args[i].startswith("--config="):
            path, i = args[i].split("=", 1)[1], i + 1
        else:
            rest.append(args[i])
            i += 1
    return path, rest


def load_config_defaults(cls: type, path: str):
    """Build ``cls`` from a YAML mapping (keys are field names, ``-`` or ``_``); unknown keys are an error."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise SystemExit(f"rlft: {path}: expected a mapping of option names to values")
    known = {f.name for f in fields(cls)}
    values = {key.replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SystemExit(f"rlft: {path}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**values)


def main(argv: list[str] | None = None) -> None:
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
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
    cls, run, help_ = commands[name]
    config_path, rest = _pop_config(argv[len(name.split()) :])
    default = load_config_defaults(cls, config_path) if config_path else None
    kwargs = {"default": default} if default is not None else {}
    cfg = tyro.cli(cls, args=rest, prog=f"rlft {name}", description=help_, **kwargs)
    setup_logging()
    from rlft.models import ModelNotFoundError

    try:
        run(cfg)
    except ModelNotFoundError as e:
        print(f"rlft {name}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        console.print(f"[yellow]rlft {name}: interrupted; rerun with --resume to continue from the last checkpoint[/]")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
