"""``rlft pairs env``: on-policy preference pairs of any environment (``--env path/to/file.py:ClassName``, or the
built-in Countdown ones through ``rlft pairs countdown``): sample n rollouts per training row (with the environment's
tools), score each with its reward, keep the best as ``chosen`` and the worst as ``rejected``, drop ties.

Output: a JSONL file with one row per kept prompt, ``{"prompt", "chosen", "rejected", "score_chosen",
"score_rejected"}`` (what ``rlft dpo --data`` reads; tool observations in a response are untrained there, as in the
rollout: :func:`rlft.recipes.dpo_data.tokenize_text_pair`), and ``<output stem>.stats.json`` with the counts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Annotated

from rlft.options import MAX_NEW_TOKENS, DeviceOptions, EnvOptions
from rlft.validation import NON_NEGATIVE, POSITIVE, POSITIVE_INT, require, validate_options

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class PairsEnvConfig(DeviceOptions, EnvOptions):
    """Sample rollouts of an environment's training rows, score them with its reward, write best-vs-worst pairs."""

    model: str = "runs/sft/model"
    """Model to sample from: built-in name, local HF folder, or Hub id."""
    num_prompts: Annotated[int, POSITIVE_INT] = 512
    """The first this many training rows (rows('train')) after --start."""
    start: Annotated[int, NON_NEGATIVE] = 0
    """Skip this many training rows first."""
    num_samples: Annotated[int, POSITIVE_INT] = 2
    """Rollouts per prompt (>= 2)."""
    temperature: Annotated[float, POSITIVE] = 1.0
    """Sampling temperature (> 0)."""
    max_new_tokens: Annotated[int, POSITIVE_INT] = MAX_NEW_TOKENS
    """Most tokens the model writes per rollout (observations not counted)."""
    batch_size: Annotated[int, POSITIVE_INT] = 32
    """Sequences generated together."""
    seed: Annotated[int, NON_NEGATIVE] = 0
    """Sampling seed."""
    output: str = "runs/pairs/env.jsonl"
    """Where to write the pairs (JSONL; stats beside it as .stats.json). An existing file is refused unless
    --overwrite."""
    overwrite: bool = False
    """Replace an existing --output and its stats."""

    def __post_init__(self) -> None:
        validate_options(self)
        self._check_env()
        require(self.env not in ("countdown", "countdown-calc", "chat"),
                f"--env {self.env}: use `rlft pairs countdown --env {self.env}`" if self.env != "chat" else
                "--env chat: pairs of chat prompts come from a preference dataset")
        require(self.num_samples >= 2, f"--num-samples must be >= 2 to form a pair, got {self.num_samples}")

    def check_outputs(self) -> None:
        """Refuse a run without --env, and an --output or stats file that would be replaced (unless --overwrite);
        writes nothing. Run at parse time (every config's defaults stay valid) and before any work."""
        from rlft.run_folder import check_outputs

        require(self.env is not None, "rlft pairs env needs --env (path/to/file.py:ClassName)")
        check_outputs({"--output": self.output, "stats": str(_stats(self.output))}, overwrite=self.overwrite)


def _stats(output: str):
    from pathlib import Path

    return Path(output).with_suffix(".stats.json")


def make_env_pairs(cfg: PairsEnvConfig) -> dict:
    """Build the pairs file ``cfg.output`` and its stats file; returns the stats.

    Raises:
        ValueError: an environment that cannot be loaded, too few training rows, a malformed row or reward.
    """
    from rlft.data.files import write_jsonl
    from rlft.distributed import require_one_process
    from rlft.environment import env_reward, env_rows, load_environment
    from rlft.fsio import atomic_write_json
    from rlft.models import load_tokenizer, pick_device
    from rlft.recipes.pairs import best_and_worst
    from rlft.rollout.base import SamplingParams
    from rlft.rollout.engines import make_engine
    from rlft.rollout.turns import tool_use_for

    require_one_process("rlft pairs env")
    cfg.check_outputs()
    t0 = time.perf_counter()
    env = load_environment(cfg.env)
    rows = env_rows(env, "train")[cfg.start : cfg.start + cfg.num_prompts]
    if not rows:
        raise ValueError(f"{type(env).__name__}: no training rows after --start {cfg.start}")
    if any(not isinstance(row["prompt"], str) for row in rows):
        raise ValueError(f"{type(env).__name__}: rlft pairs env takes text prompts (a row's 'prompt' is a chat)")
    tokenizer = load_tokenizer(cfg.model)
    engine = make_engine("hf", cfg.model, tokenizer, pick_device(cfg.device, cfg.dtype), batch_size=cfg.batch_size,
                         show_progress=True)
    tool_use = tool_use_for(env.tools, cfg, env.max_turns)
    params = SamplingParams(k=cfg.num_samples, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                            seed=cfg.seed)
    prompts = [row["prompt"] for row in rows]
    samples = engine.generate(prompts, params) if tool_use is None else engine.generate(
        prompts, params, tool_use=tool_use, contexts=rows)
    pairs, ties = [], 0
    for b, (row, group) in enumerate(zip(rows, samples)):
        scores = [env_reward(env, row, s.text, cfg.start + b) for s in group]
        picked = best_and_worst(scores)
        if picked is None:
            ties += 1
            continue
        best, worst = picked
        pairs.append({"prompt": row["prompt"], "chosen": group[best].text, "rejected": group[worst].text,
                      "score_chosen": scores[best], "score_rejected": scores[worst]})
    write_jsonl(cfg.output, pairs)
    stats = {"prompts": len(rows), "kept": len(pairs), "dropped_ties": ties, "samples_per_prompt": cfg.num_samples,
             "tool_calls_per_sample": sum(s.tool_calls for g in samples for s in g) / (len(rows) * cfg.num_samples),
             "seconds": time.perf_counter() - t0, "config": asdict(cfg)}
    atomic_write_json(_stats(cfg.output), stats)
    log.info("pairs: %d prompts, %d kept, %d dropped as ties; written to %s", len(rows), len(pairs), ties, cfg.output)
    return stats
