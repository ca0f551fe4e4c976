"""The length of a continued-SFT variant of ``scripts/countdown_ablation.py``: an RL run's compute, in wall time or in
estimated FLOPs (the compute-matched baselines of the Countdown studies)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rlft.compute import sft_max_tokens, summed_step_seconds
from rlft.lab.script_io import read_json


class Ablation(Protocol):
    """What a budget reads of ``countdown_ablation.Ablation`` (its invocation): the variants, the run folder,
    ``--budget-from`` and ``--sft-step-s``."""

    variants: dict[str, dict]
    out: Path
    budget_from: Path | None
    sft_step_s: float


def sft_budget(ab: Ablation, name: str, seed: int, start: Path) -> dict:
    """The length of continued-SFT variant ``name``, the compute of an RL run: ``--budget-from`` (an archived metrics
    file), else the ``budget_of`` variant's finished run of ``seed``, else (wall time only) the median of the
    finished RL variants of ``seed``. ``budget: wall`` (the default): ``{"max_steps": summed step seconds /
    --sft-step-s}``; ``budget: flops``: ``{"max_tokens": ceil(F / 6 N)}`` (:func:`rlft.compute.sft_max_tokens`), F
    the RL run's ``flops/estimated`` and N the parameter count of ``start``, so the SFT run's estimate (``6 N`` per
    trained token) matches it."""
    spec, kind = ab.variants[name], ab.variants[name].get("budget", "wall")
    if kind not in ("wall", "flops"):
        raise SystemExit(f"variant {name!r}: budget {kind!r}: must be wall or flops")
    if ab.budget_from is None and "budget_of" in spec:
        folder = ab.out / spec["budget_of"] / f"s{seed}"
        if not (folder / "run" / "model").exists():
            raise SystemExit(f"{folder} has no finished RL run (its compute is {name}'s budget)")
        metrics = folder / "run" / "metrics.jsonl"
    else:
        metrics = ab.budget_from
    if kind == "flops" and metrics is None:
        raise SystemExit(f"variant {name!r}: budget: flops needs budget_of (or --budget-from)")
    if kind == "flops":
        return {"max_tokens": sft_max_tokens(metrics, start)}
    budget = summed_step_seconds(metrics) if metrics is not None else rl_wallclock(ab, seed)
    return {"max_steps": max(1, round(budget / ab.sft_step_s))}


def rl_wallclock(ab: Ablation, seed: int) -> float:
    """Median training seconds of the finished RL variants of ``seed`` (the continued-SFT budget)."""
    times = sorted(
        read_json(p, "a variant's train_time.json")["seconds"] for name, spec in ab.variants.items()
        if spec["kind"] == "rl" for p in [ab.out / name / f"s{seed}" / "train_time.json"] if p.exists())
    if not times:
        raise SystemExit(
            "sft_continued needs a finished RL variant of the same seed first (its wall-clock is the budget)")
    return times[len(times) // 2]
