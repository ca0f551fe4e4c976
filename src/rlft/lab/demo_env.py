"""``rlft demo --env countdown|countdown-calc``: the Countdown track's environment (:class:`DemoEnvOptions`).

``countdown`` (the default) is the demo as it always ran. ``countdown-calc`` is the same tasks with a calculator
tool (:data:`rlft.rewards.countdown_calc.CALC_TOOLS`): SFT trains on the solver's tool-call traces (``--trace-style
calc``, observations untrained) with the ``calc`` prompt, and RL, the on-policy pairs and every evaluation roll out
with the calculator, bounded by ``--max-turns``, ``--max-observation-tokens`` and ``--tool-timeout``
(:class:`rlft.options.EnvOptions`, the same options ``rlft rl`` takes). Its prompt template and trace style are
applied where those options are left at the demo's defaults (:data:`CALC_DEFAULTS`), when the config is built, as
``--quick`` applies its sizes; another explicit value is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlft.options import EnvOptions
from rlft.validation import require

DEMO_ENVS = ("countdown", "countdown-calc")
"""The environments ``rlft demo`` runs: the built-in Countdown ones (a user's ``file.py:Class`` goes to ``rlft rl``)."""
CALC_DEFAULTS: dict[str, str] = {"prompt_template": "calc", "trace_style": "calc"}
"""``--env countdown-calc``: the values of the options it sets where they are left at their defaults (the prompt that
tells of the calculator, and SFT traces that call it)."""


@dataclass(frozen=True)
class DemoEnvOptions(EnvOptions):
    """The Countdown track's environment (``--env``) and the bounds of its rollouts with tool calls."""

    env: str = "countdown"
    """The Countdown track's environment: 'countdown' (the rule reward, one turn) or 'countdown-calc' (the same tasks
    with a calculator tool: SFT on the solver's tool-call traces with the 'calc' prompt, and RL, the pairs and every
    evaluation rolling out with the calculator, bounded by --max-turns, --max-observation-tokens, --tool-timeout)."""

    def _check_demo_env(self) -> None:
        """Refuse an environment the demo does not run (a user's file, ``chat``) and ``--env`` on the UltraFeedback
        track, each in one line.

        Raises:
            OptionError: naming ``--env``.
        """
        require(self.env in DEMO_ENVS,
                f"--env {self.env}: the demo runs the built-in Countdown environments ({', '.join(DEMO_ENVS)}); "
                "train another environment with `rlft rl --env`")
        require(self.env == "countdown" or self.track == "countdown",
                f"--env {self.env} is the Countdown track's: --track {self.track} has its own data (drop --env)")

    def env_defaults(self) -> dict[str, str]:
        """The values ``--env`` gives options left at their defaults: :data:`CALC_DEFAULTS` for countdown-calc on the
        Countdown track, else none."""
        return dict(CALC_DEFAULTS) if self.env == "countdown-calc" and self.track == "countdown" else {}

    def _check_env_options(self) -> None:
        """After the defaults are applied: countdown-calc runs with the 'calc' prompt and traces, and those (which
        tell of a calculator) only with countdown-calc.

        Raises:
            OptionError: naming ``--prompt-template`` or ``--trace-style``.
        """
        if self.track != "countdown":
            return
        for name, value in CALC_DEFAULTS.items():
            flag, given = "--" + name.replace("_", "-"), getattr(self, name)
            if self.env == "countdown-calc":
                require(given == value, f"--env countdown-calc runs with {flag} {value} (the calculator's): drop "
                        f"{flag} {given}")
            else:
                require(given != value, f"{flag} {value} is --env countdown-calc's (a calculator tool that --env "
                        f"{self.env} does not answer): add --env countdown-calc")

    def env_options(self) -> dict[str, object]:
        """The options of ``rlft rl`` and ``rlft pairs countdown`` that run the environment: ``--env countdown-calc``
        and its bounds; ``{}`` for countdown (those commands' default, so their configs stay as before)."""
        if self.env != "countdown-calc":
            return {}
        return {"env": self.env, "max_turns": self.max_turns, "max_observation_tokens": self.max_observation_tokens,
                "tool_timeout": self.tool_timeout}
