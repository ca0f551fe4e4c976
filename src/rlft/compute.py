"""Compute accounting of a training run: its parameter count N and the cumulative tokens and estimated FLOPs
(``6 N`` per token through a forward and backward pass, ``2 N`` per token through a forward pass only; Kaplan et al.
2020, "Scaling Laws for Neural Language Models", Sec. 2.1), logged by RL (:mod:`rlft.recipes.rl`) and SFT
(:mod:`rlft.recipes.sft`), so that runs of different kinds can be given the same compute: an SFT baseline matched
in FLOPs to an RL run (``scripts/countdown_ablation.py``, a variant's ``budget: flops``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from rlft.checkpoint import read_metrics
from rlft.validation import UsageError


def parameter_count(model: torch.nn.Module) -> int:
    """N of the FLOPs estimate: every parameter of ``model``, embeddings (once when tied) and LoRA adapters
    included; under FSDP2 the whole model's (a DTensor's ``numel`` is its global size)."""
    return sum(p.numel() for p in model.parameters())


def model_parameter_count(model_dir: str | Path) -> int:
    """:func:`parameter_count` of the model folder ``model_dir`` (built from its ``config.json`` on the meta device:
    no weights are read); OSError when the folder has no config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return parameter_count(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)))


def logged_values(metrics: Path, key: str, budget: str, without: str) -> list[float]:
    """Every value of ``key`` in a run's ``metrics.jsonl``, in order. Raises UsageError naming the file when it is
    absent or logs no ``key`` (the messages say ``budget``, what the values size, and ``without``, what a file
    without them is)."""
    if not metrics.exists():
        raise UsageError(f"{metrics} does not exist (a continued-SFT budget is its {budget})")
    values = [r[key] for r in read_metrics(metrics) if key in r]
    if not values:
        raise UsageError(f"{metrics} has no {key} records ({without})")
    return values


def summed_step_seconds(metrics: Path) -> float:
    """Sum of ``time/step_s`` over the records of an RL run's ``metrics.jsonl`` (its wall time less start-up and
    saving, also when it was resumed). Raises UsageError when the file is absent or holds no step time."""
    return sum(logged_values(metrics, "time/step_s", "summed step time", "not an RL run's metrics"))


def final_flops(metrics: Path) -> float:
    """The last ``flops/estimated`` (cumulative, :class:`RunTotals`) of a run's ``metrics.jsonl``. Raises UsageError
    when the file is absent or holds none (a run from before rlft counted FLOPs)."""
    return float(logged_values(metrics, "flops/estimated", "estimated FLOPs",
                               "a run from before rlft counted FLOPs")[-1])


def sft_max_tokens(metrics: Path, model_dir: str | Path) -> int:
    """The ``--max-tokens`` of an SFT run from ``model_dir`` given the compute of the run logged in ``metrics``:
    ``ceil(F / 6 N)``, F its :func:`final_flops` and N :func:`model_parameter_count` of ``model_dir``, so that the SFT
    run's own estimate (``6 N`` per trained token) reaches F. Raises UsageError as :func:`final_flops`."""
    import math

    return math.ceil(final_flops(metrics) / (6 * model_parameter_count(model_dir)))


@dataclass
class RunTotals:
    """The run's cumulative counts, logged every step and continued on ``--resume`` from the last logged values
    (:meth:`restored`), as ``samples/total`` always was. What RL counts (SFT: no generated tokens, ``tokens/trained``
    its loss's target tokens, ``T_fb`` every token of its batch, no ``T_f``):

    - ``tokens/generated``: completion tokens sampled this step (every tried group, every rank, EOS included);
      the prompts' prefill and the evaluations' generation are not counted;
    - ``tokens/trained``: completion tokens that went through a backward this step (the loss's target tokens of
      the updated rows, once per ``ppo_epochs`` epoch; rows skipped with a zero weight or left out by
      ``--mask-truncated`` do not count);
    - ``tokens/generated_total``, ``tokens/trained_total``: their sums over the run;
    - ``flops/estimated``: cumulative ``6 N T_fb + 2 N (T_f + T_gen)`` with ``N`` :func:`parameter_count`,
      ``T_fb`` the prompt + completion tokens of the forward+backward passes (every updated row, once per epoch),
      ``T_f`` those of the no-grad forward passes over every row (the reference's and the pre-update policy's
      log-probs, when the step computes them) and ``T_gen`` = ``tokens/generated``. Padding, FSDP2 filler passes,
      gradient checkpointing's recomputation, prompt prefill during sampling and evaluation are not counted.
    """

    params: int
    """N: :func:`parameter_count` of the policy."""
    samples: int = 0
    generated_tokens: float = 0.0
    trained_tokens: float = 0.0
    flops: float = 0.0

    KEYS = {
        "samples": "samples/total", "generated_tokens": "tokens/generated_total",
        "trained_tokens": "tokens/trained_total", "flops": "flops/estimated"
    }
    """Field -> metric name of each cumulative value."""

    @classmethod
    def restored(cls, params: int, history: Sequence[dict]) -> RunTotals:
        """Totals continuing ``history`` (the ``metrics.jsonl`` records up to the resumed step; empty: a fresh run):
        each field is its metric's last logged value (0 when never logged, e.g. a run from before the metric)."""
        values = {field: next((type(getattr(cls, field))(r[key]) for r in reversed(history) if key in r), 0)
                  for field, key in cls.KEYS.items()}
        return cls(params, **values)

    def current(self) -> dict[str, float]:
        """The cumulative metrics as they stand (the step-0 evaluation logs them)."""
        return {key: getattr(self, field) for field, key in self.KEYS.items()}

    def add(self, samples: int, counts: dict[str, float]) -> dict[str, float]:
        """Count one step: ``samples`` generated (every rank's) and :func:`step_counts` summed over ranks; returns
        ``tokens/generated``, ``tokens/trained`` and the cumulative metrics (:meth:`current`)."""
        n = self.params
        self.samples += samples
        self.generated_tokens += counts["generated_tokens"]
        self.trained_tokens += counts["trained_tokens"]
        self.flops += 6 * n * counts["trained_seq_tokens"] + 2 * n * (counts["scored_tokens"] +
                                                                      counts["generated_tokens"])
        return {
            "tokens/generated": counts["generated_tokens"], "tokens/trained": counts["trained_tokens"],
            **self.current()
        }
