"""``rlft demo``: an end-to-end story with a report, one track per module.

- ``--track countdown`` (the default): :mod:`rlft.lab.demo_countdown`, base -> SFT -> filtered SFT -> RL, and
  filtered SFT -> on-policy pairs -> DPO, on Countdown, every model evaluated on the same held-out tasks;
- ``--track ultrafeedback``: :mod:`rlft.lab.demo_ultrafeedback`, preference data -> SFT, DPO, a reward model,
  RLOO with that reward model, win-rates judged by it.

Both tracks read :class:`~rlft.lab.demo_config.DemoConfig` and run their stages with
:mod:`rlft.lab.pipeline` (stage skipping on ``--resume``, timings, cached evaluations); neither imports the other,
and this module only picks one.
"""

from __future__ import annotations

from pathlib import Path

from rlft.lab.demo_config import DemoConfig

__all__ = ["DemoConfig", "run_demo"]


def run_demo(cfg: DemoConfig) -> Path:
    """Run the track ``cfg.track`` names; returns its ``report.md`` path."""
    if cfg.track == "ultrafeedback":
        from rlft.lab.demo_ultrafeedback import run_ultrafeedback_demo

        return run_ultrafeedback_demo(cfg)
    from rlft.lab.demo_countdown import run_countdown_demo

    return run_countdown_demo(cfg)
