"""``rlft eval env``: any environment (built into rlft or a user's ``path/to/file.py:ClassName``) scored on a split's
rows by its own reward, with its tools; the table, and a JSON file with the per-row rewards."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Literal

from rlft.eval.environment import EnvEvalResult, evaluate_env, row_prompt
from rlft.options import MAX_NEW_TOKENS, DeviceOptions, EnvOptions
from rlft.rollout.base import SamplingParams
from rlft.validation import NON_NEGATIVE, POSITIVE, POSITIVE_INT, require, validate_options

__all__ = ["EvalEnvConfig", "run_eval_env"]


@dataclass(frozen=True)
class EvalEnvConfig(DeviceOptions, EnvOptions):
    """Evaluate a model on an environment's rows (--env path/to/file.py:ClassName)."""

    model: str = "smollm2-135m"
    """Built-in model name, local Hugging Face folder, or Hub id."""
    split: Literal["test", "validation", "train"] = "test"
    """Which of the environment's rows (its rows(split))."""
    limit: Annotated[int, POSITIVE_INT] | None = None
    """Evaluate the first `limit` rows (None: all)."""
    mode: Literal["greedy", "sampled"] = "greedy"
    """greedy: one temperature-0 rollout per row; sampled: `k` rollouts at `temperature`."""
    k: Annotated[int, POSITIVE_INT] = 1
    """Rollouts per row in sampled mode."""
    temperature: Annotated[float, POSITIVE] = 1.0
    """Sampling temperature in sampled mode."""
    max_new_tokens: Annotated[int, POSITIVE_INT] = MAX_NEW_TOKENS
    """Most tokens the model writes per rollout (observations not counted)."""
    batch_size: Annotated[int, POSITIVE_INT] = 32
    """Sequences generated together."""
    seed: Annotated[int, NON_NEGATIVE] = 0
    """Sampling seed."""
    output: str | None = None
    """Write the metrics and per-row rewards to this JSON file (an existing file is refused unless --overwrite)."""
    overwrite: bool = False
    """Replace an existing --output file."""

    def __post_init__(self) -> None:
        validate_options(self)
        self._check_env()
        require(self.env not in ("countdown", "countdown-calc", "chat"),
                f"--env {self.env}: use `rlft eval countdown --env {self.env}` (Countdown) or `rlft eval winrate` "
                "(chat)" if self.env != "chat" else "--env chat: use `rlft eval winrate`")
        require(self.mode == "sampled" or self.k == 1, f"--k {self.k} needs --mode sampled")

    def check_outputs(self) -> None:
        """Refuse a run without --env, and an --output that would replace a file (unless --overwrite) or name a
        folder; writes nothing. Run at parse time (every config's defaults stay valid) and before any work."""
        require(self.env is not None, "rlft eval env needs --env (path/to/file.py:ClassName)")
        if self.output is not None:
            from rlft.run_folder import check_output_file

            check_output_file(self.output, overwrite=self.overwrite)

    def input_paths(self) -> dict[str, str | None]:
        """The files this evaluation reads, by option."""
        return {"--model": self.model, "--env": self.env.rpartition(":")[0] if self.env else None}


def run_eval_env(cfg: EvalEnvConfig) -> EnvEvalResult:
    """Load the environment and the model, roll out on the split's rows (greedy, or k samples), score each rollout by
    the environment's reward, print the table and write ``cfg.output`` (the result and its config).

    Raises:
        ValueError: an environment that cannot be loaded, no rows in the split, a malformed row or reward.
    """
    from rich.console import Console
    from rich.table import Table

    from rlft.distributed import require_one_process
    from rlft.environment import env_rows, load_environment
    from rlft.fsio import atomic_write_json
    from rlft.models import load_tokenizer, pick_device
    from rlft.rollout.engines import make_engine
    from rlft.rollout.turns import tool_use_for

    require_one_process("rlft eval env")
    cfg.check_outputs()
    env = load_environment(cfg.env)
    rows = env_rows(env, cfg.split)[: cfg.limit]
    spec = pick_device(cfg.device, cfg.dtype)
    tokenizer = load_tokenizer(cfg.model)
    prompts = [row_prompt(row, tokenizer) for row in rows]
    engine = make_engine("hf", cfg.model, tokenizer, spec, batch_size=cfg.batch_size, show_progress=True)
    tool_use = tool_use_for(env.tools, cfg, env.max_turns)
    greedy = cfg.mode == "greedy"
    params = SamplingParams(k=cfg.k, temperature=0.0 if greedy else cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                            seed=cfg.seed)
    result = evaluate_env(engine, env, rows, prompts, params, tool_use)
    table = Table(title=f"{type(env).__name__} ({cfg.split}, {len(rows)} rows x {cfg.k}): {cfg.model}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result.metrics(prefix="").items():
        table.add_row(name, f"{value:.4f}")
    table.add_row("model tokens per answer", f"{result.mean_model_tokens:.1f}")
    Console().print(table)
    if cfg.output:
        path = Path(cfg.output).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**asdict(result), "config": asdict(cfg)})
    return result
