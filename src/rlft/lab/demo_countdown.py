"""`rlft demo` (``--track countdown``, the default): Countdown as the spec scores it, on one CPU.

base -> SFT on solver search traces of the Countdown-Tasks-3to4 distribution (``bounded`` traces of the ``standard``
preset: a ranked search that gives up, like the spec's cog_behav set) -> filtered SFT (the spec's "filtered behavior
cloning": SFT continued on only the traces that reach the target) -> RL on Countdown-Tasks-3to4 training rows (the
one RL loop, `rlft rl`: GRPO with group filtering and LoRA), and filtered SFT -> on-policy pairs on training rows ->
RPO (DPO + NLL, beta 0.5, LoRA). Every model is scored on the same held-out test rows, greedy, by count of numbers
(3, 4, and mixed: the spec's metric), and with ``--passk`` also sampled (``passk`` samples at T=0.6, top-p 0.95:
mean score, pass@k, and the best-of-N selectors majority@k and self-certainty@k). ``<output_dir>/report.md``
(default ``runs/demo``) gets the tables, the paired table (each stage against its own start, task by task), the RL
run's validation score against samples generated, and plots (:mod:`rlft.lab.demo_countdown_report`).

``--env countdown-calc`` runs the same story with a calculator tool (:mod:`rlft.lab.demo_env`): SFT on the solver's
tool-call traces with the ``calc`` prompt, RL, the pairs and every evaluation rolling out with the calculator.

Rows: the Countdown-Tasks-3to4 rows that ship with rlft (``countdown-3to4``, :mod:`rlft.tasks.countdown.shipped`), a
file or Hub id given with ``--rows``, or (``--rows None``) a generated stand-in of the same distribution. Its held-out
block (500
test + 500 validation rows, :mod:`rlft.tasks.countdown.splits`) is never trained on: SFT's generated tasks equal to
one are dropped, RL and pairs sample training rows only.

Every finished evaluation is saved as JSON; ``--resume`` reuses those and resumes each stage from its last
checkpoint, so a killed demo continues where it stopped. Time of the defaults: see the README. Every fresh test
evaluation appends a line to ``<output_dir>/eval/test_looks.jsonl`` (:mod:`rlft.lab.ledger`); the file is only
appended to: ``--overwrite`` moves the earlier run aside but carries its looks into the new ledger first.
"""

from __future__ import annotations

import logging
import re
from functools import partial
from pathlib import Path

from rlft.console import console
from rlft.eval.countdown import CountdownEvalResult
from rlft.eval.countdown_command import countdown_env
from rlft.lab.ledger import LEDGER_NAME, append_line, check_ledger_target, read_looks
from rlft.lab.demo_config import DemoConfig
from rlft.lab.demo_countdown_report import write_report
from rlft.recipes.dpo import DPOConfig, train_dpo
from rlft.recipes.pairs import PairsConfig, make_countdown_pairs
from rlft.lab.pipeline import EvalJob, StageTimes, Timer, evaluate_cached, run_stage
from rlft.recipes.rl import train_rl
from rlft.recipes.sft import SFTConfig, train_sft
from rlft.rl.config import RLConfig
from rlft.rollout.base import SamplingParams
from rlft.run_folder import claim_run_dir, write_run_config
from rlft.tasks.countdown.shipped import SHIPPED_NAME
from rlft.tasks.countdown.splits import RowSplit, load_split
from rlft.types import CountdownTask

log = logging.getLogger("rlft")

GREEDY = "greedy"
SAMPLED = "sampled"


def rows_source(cfg: DemoConfig, run_dir: Path) -> tuple[str, str]:
    """``(rows, description)`` of the Countdown rows (a path, a Hub id or a shipped name): ``cfg.rows``; ``"auto"``:
    the rows that ship with rlft (``countdown-3to4``: the first 10,240 rows of Countdown-Tasks-3to4, the same as
    ``../shared/data/countdown/train.parquet``); None: a generated stand-in written to ``run_dir/data/rows.jsonl``
    (the same seed gives the same rows)."""
    if cfg.rows == "auto":
        return SHIPPED_NAME, f"Countdown-Tasks-3to4 (real rows: the first 10,240, shipped with rlft: `{SHIPPED_NAME}`)"
    if cfg.rows is not None:
        return cfg.rows, f"Countdown-Tasks-3to4 rows from `{cfg.rows}`"
    path = run_dir / "data" / "rows.jsonl"
    if not path.is_file():
        from rlft.data.files import write_jsonl
        from rlft.tasks.countdown.generator import PRESETS, generate_tasks

        log.info("--rows None: generating %d stand-in rows of the standard preset", cfg.num_rows)
        tasks = generate_tasks(PRESETS["standard"], cfg.num_rows, seed=f"demo-rows-{cfg.split_seed}")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(path, [{"target": t.target, "nums": list(t.nums)} for t in tasks])
    return str(path), (
        f"a generated stand-in for Countdown-Tasks-3to4 ({cfg.num_rows:,} `standard`-preset tasks, the same "
        "distribution; --rows None)")


def eval_file(out_dir: Path, label: str, name: str) -> Path:
    """Where model ``label``'s evaluation ``name`` is saved: ``<out_dir>/<label>--<name>.json``."""
    return out_dir / f"{label}--{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}.json"


def evaluate_model(model: str, label: str, test: list[CountdownTask], cfg: DemoConfig, out_dir: Path,
                   sampled: bool = True, limit: int | None = None) -> dict[str, CountdownEvalResult]:
    """Greedy on the first ``limit`` (default ``eval_limit``) test rows and (``sampled``) ``passk`` samples on the
    first ``passk_limit``; cached as JSON in ``out_dir`` and, with ``--resume``, reused while the model's weights,
    sampling, tasks and environment are unchanged (:func:`rlft.lab.pipeline.evaluate_cached`). ``--env
    countdown-calc``: rollouts with the calculator (:func:`rlft.eval.countdown_command.countdown_env`)."""
    greedy = SamplingParams(k=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    jobs = {
        GREEDY: EvalJob(eval_file(out_dir, label, GREEDY), test[:cfg.eval_limit if limit is None else limit], greedy,
                        test_look=True)
    }
    if cfg.passk and sampled:
        params = SamplingParams(k=cfg.passk, temperature=cfg.passk_temperature, top_p=cfg.passk_top_p,
                                max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
        jobs[SAMPLED] = EvalJob(eval_file(out_dir, label, SAMPLED), test[: cfg.passk_limit], params, test_look=True)
    template, tool_use = countdown_env(cfg)  # countdown: (--prompt-template, None)
    tools = {"env": cfg.env, "tool_use": tool_use} if tool_use is not None else {}
    return evaluate_cached(model, jobs, prompt_template=template, batch_size=cfg.eval_batch_size, device=cfg.device,
                           dtype=cfg.dtype, reuse=cfg.resume, label=label, show_progress=True,
                           ledger=out_dir / LEDGER_NAME, **tools)


def earlier_looks(ledger: Path, overwrite: bool) -> list[dict]:
    """The test looks an ``--overwrite`` would move aside with the earlier run (its ``eval/test_looks.jsonl``), to be
    carried into the new run's ledger; [] without ``--overwrite`` (``--resume`` appends to the same file) or ledger.

    Raises:
        UsageError: the earlier ledger is not one (:func:`rlft.lab.ledger.check_ledger_target`; a damaged line is
            named), before anything is moved.
    """
    if not overwrite or not ledger.is_file():
        return []
    check_ledger_target(ledger, option="the earlier run's ledger")
    return read_looks(ledger)


def pairs_stats(pairs_path: Path) -> dict:
    """The counts ``pairs countdown`` wrote beside its pairs (``<name>.stats.json``: prompts, kept, dropped_ties).

    Raises:
        ValueError: naming the file: missing, damaged (not JSON) or without those counts; deleting the pairs file and
            its stats samples them again on ``--resume``.
    """
    from rlft.lab.script_io import read_json

    path = pairs_path.with_suffix(".stats.json")
    what = "the pair counts `rlft pairs countdown` writes (delete it and the pairs file to sample them again)"
    stats = read_json(path, what)
    if not isinstance(stats, dict) or not all(
            isinstance(stats.get(k), int) for k in ("prompts", "kept", "dropped_ties")):
        raise ValueError(f"{path}: not {what}")
    return stats


def sft_config(cfg: DemoConfig, rows: str, model: str, out: Path, filtered: bool = False) -> SFTConfig:
    """The SFT stage's config (``filtered``: the filtered SFT stage, ``filtered_steps`` on only the traces that reach
    the target, continued from ``model``, the SFT model): ``cfg``'s traces, batch and constant lr after 3% warmup
    (``--env countdown-calc``: ``cfg``'s trace style and prompt template are ``calc``, :mod:`rlft.lab.demo_env`)."""
    steps = cfg.filtered_steps if filtered else cfg.sft_steps
    return SFTConfig(model=model, data="countdown", preset=cfg.preset, num_train=cfg.num_train, correct_only=filtered,
                     heldout_size=1000, heldout_data=rows, trace_style=cfg.trace_style, max_dead_ends=cfg.max_dead_ends,
                     give_up=cfg.give_up, max_tries=cfg.max_tries, prompt_template=cfg.prompt_template,
                     output_dir=str(out), max_length=512, batch_size=cfg.batch_size,
                     micro_batch_size=cfg.micro_batch_size, max_steps=steps, lr=cfg.lr, schedule="constant",
                     warmup_ratio=0.03, save_every=max(steps // 4, 1), split_seed=cfg.split_seed, seed=cfg.seed,
                     resume=cfg.resume, device=cfg.device, dtype=cfg.dtype)


def rl_config(cfg: DemoConfig, rows: str, model: str, num_train: int, out: Path) -> RLConfig:
    """The RL stage's config: ``cfg``'s ``--rl-*`` options (:data:`rlft.lab.demo_config.RL_OPTIONS`) and environment
    (``--env countdown-calc`` and its bounds; nothing for countdown), from ``model`` on the ``num_train`` training rows
    of ``rows``, evaluated on the validation rows at the start and every ``rl_eval_every`` steps."""
    return RLConfig(**cfg.rl_options(), **cfg.env_options(), model=model, data=rows, num_train=num_train,
                    output_dir=str(out), eval_at_start=True, eval_rows="validation",
                    eval_max_new_tokens=cfg.max_new_tokens, save_every=max(cfg.rl_steps // 3, 1), resume=cfg.resume)


def pairs_config(cfg: DemoConfig, rows: str, model: str, num_train: int, output: Path) -> PairsConfig:
    """The on-policy pairs' config: ``pairs_prompts`` of the last training rows of ``rows`` (``num_train`` of them)
    sampled ``pairs_samples`` times from ``model``, in ``cfg``'s environment (``--env countdown-calc``: with the
    calculator)."""
    return PairsConfig(model=model, data=rows, num_prompts=cfg.pairs_prompts, start=num_train - cfg.pairs_prompts,
                       prompt_template=cfg.prompt_template, num_samples=cfg.pairs_samples,
                       temperature=cfg.pairs_temperature, max_new_tokens=cfg.max_new_tokens,
                       batch_size=cfg.eval_batch_size, output=str(output), seed=cfg.seed, device=cfg.device,
                       dtype=cfg.dtype, **cfg.env_options())


def run_countdown_demo(cfg: DemoConfig) -> Path:
    """Run the Countdown demo; returns the report path. With --resume, stages whose output exists are skipped and
    evaluations whose cache still answers them are read back (:mod:`rlft.lab.pipeline`)."""
    cfg = cfg.effective()
    folder = claim_run_dir(cfg)  # an earlier demo: --resume or --overwrite
    earlier = earlier_looks(folder.path / "eval" / LEDGER_NAME, folder.overwrite)
    run_dir = folder.open()
    for look in earlier:  # the test rows were looked at before: the count goes on
        append_line(run_dir / "eval" / LEDGER_NAME, look)
    write_run_config(run_dir, cfg)
    rows, rows_note = rows_source(cfg, run_dir)
    split: RowSplit = load_split(rows)
    timings = StageTimes(run_dir / "timings.json", cfg.resume)  # a resumed demo adds to the earlier run's seconds
    notes: list[str] = [f"rows: {rows_note}; {len(split.train):,} training rows, held out {len(split.validation)} "
                        f"validation and {len(split.test)} test rows"]
    if cfg.env == "countdown-calc":
        notes.append(f"environment: countdown-calc, a calculator tool over each task's numbers (the `calc` prompt, "
                     f"SFT on its tool-call traces, observations untrained); rollouts of at most {cfg.max_turns} "
                     f"turns, observations cut at {cfg.max_observation_tokens} tokens, {cfg.tool_timeout:g} s a call")
    stage = partial(run_stage, timings=timings, resume=cfg.resume, keep_checkpoints=cfg.keep_checkpoints)
    device = dict(device=cfg.device, dtype=cfg.dtype)
    evals = run_dir / "eval"

    with Timer(timings, "evaluate base"):  # greedy only: the untuned model writes no answer
        results = {"base": evaluate_model(cfg.model, "base", split.test, cfg, evals, sampled=False,
                                             limit=cfg.base_eval_limit)}

    sft = stage("SFT", run_dir / "sft" / "model", lambda: train_sft(sft_config(cfg, rows, cfg.model, run_dir / "sft")))
    with Timer(timings, "evaluate SFT"):
        results["sft"] = evaluate_model(str(sft), "sft", split.test, cfg, evals)
    start, start_label, starts = sft, "sft", {}  # RL's and DPO's start; each trained model's start, by label
    if cfg.filtered_steps:
        start = stage("filtered SFT", run_dir / "filtered" / "model",
                      lambda: train_sft(sft_config(cfg, rows, str(sft), run_dir / "filtered", filtered=True)))
        with Timer(timings, "evaluate filtered SFT"):
            results["filtered"] = evaluate_model(str(start), "filtered", split.test, cfg, evals)
        start_label, starts["filtered"] = "filtered", "sft"

    if cfg.rl_steps:
        rl = stage("RL", run_dir / "rl" / "model",
                   lambda: train_rl(rl_config(cfg, rows, str(start), len(split.train), run_dir / "rl")))
        with Timer(timings, "evaluate RL"):
            results["rl"] = evaluate_model(str(rl), "rl", split.test, cfg, evals)
        starts["rl"] = start_label

    if cfg.pairs_prompts:
        pairs_path = run_dir / "pairs" / "countdown.jsonl"
        stage("on-policy pairs", pairs_path,
              lambda: make_countdown_pairs(pairs_config(cfg, rows, str(start), len(split.train), pairs_path)))
        stats = pairs_stats(pairs_path)
        notes.append(f"on-policy pairs: {stats['prompts']} prompts (the last training rows), {stats['kept']} kept, "
                     f"{stats['dropped_ties']} dropped as ties")
        if stats["kept"] == 0:
            notes.append("DPO skipped: every sampled pair was a tie")
        else:
            dpo = stage(
                "DPO", run_dir / "dpo" / "model", lambda: train_dpo(
                    DPOConfig(model=str(start), data=str(pairs_path), output_dir=str(run_dir / "dpo"), beta=cfg.
                              dpo_beta, loss_type=cfg.dpo_loss_type, rpo_alpha=cfg.dpo_rpo_alpha, lora_r=cfg.dpo_lora_r,
                              lora_alpha=cfg.dpo_lora_alpha, max_length=512, batch_size=cfg.dpo_batch_size,
                              micro_batch_size=cfg.dpo_micro_batch_size, epochs=cfg.dpo_epochs, lr=cfg.dpo_lr, optimizer
                              =cfg.dpo_optimizer, save_every=5, seed=cfg.seed, resume=cfg.resume, **device)))
            with Timer(timings, "evaluate DPO"):
                results["dpo"] = evaluate_model(str(dpo), "dpo", split.test, cfg, evals)
            starts["dpo"] = start_label

    timings.with_total()
    report = write_report(cfg, run_dir, results, timings, notes, starts)
    console.print(f"[bold green]Report written to {report}[/]")
    return report
