"""``rlft eval countdown``: score a model on held-out Countdown tasks (generated, or rows of a Countdown dataset).

Tasks come from a generator preset (``--data`` unset: the held-out split of ``make_splits``, the one training
with the same ``--preset``/``--split-seed``/``--heldout-size`` never sees; a ``--limit`` above ``--heldout-size`` is
refused, naming how many of the tasks a training run would see) or from a Countdown file / Hub dataset, whose rows are
split by :func:`rlft.tasks.countdown.splits.split_rows` into train, validation (screening) and test (the
spec's held-out score) parts; ``--split all`` takes every row in file order. Results are printed by count of
numbers too (3, 4 and mixed: the mix is the spec's metric), and written with ``--output`` as JSON
(:class:`rlft.eval.countdown.CountdownEvalResult`: per-task scores, tasks, truncation, tokens, answer values).

Best-of-N (test-time scaling): ``--mode sampled --k 16 --select majority self-certainty-vote oracle`` applies each
selector of :mod:`rlft.eval.select` to the first n of every task's k samples, for n in ``--select-n`` (default 1, 2, 4,
... and k), so one sampling run gives the score-vs-N curve; each selector@n is paired against a greedy answer on the
same tasks (a greedy pass this command runs with the same max_new_tokens, or ``--greedy-from`` an earlier greedy
evaluation) and costed in generated tokens per task (:mod:`rlft.eval.best_of_n`). The table is printed and written
under the JSON's ``selection`` key; ``--select reward-model`` scores every sample with ``--select-reward-model`` (an
``rlft rm`` folder) and keeps the scores (``task_rm_scores``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

from rlft.eval.countdown import (CountdownEvalResult, evaluate_countdown, other_settings, other_weights, print_result,
                                 read_eval_file)
from rlft.options import MAX_NEW_TOKENS, MAX_NEW_TOKENS_CUDA, DeviceOptions, EnvOptions, RolloutOptions
from rlft.rollout.base import SamplingParams
from rlft.rollout.turns import ToolUse, tool_use_for
from rlft.tasks.countdown.options import DEFAULT_NUM_TRAIN, CountdownDataOptions, CountdownOptions
from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt
from rlft.types import CountdownTask
from rlft.fsio import atomic_write_json
from rlft.validation import OptionError, require, validate_options

log = logging.getLogger("rlft")

DEFAULT_TEST_SIZE = 1024
"""Generated training tasks evaluated by ``--split train`` when ``limit`` is None."""
Selector = Literal["majority", "self-certainty", "self-certainty-vote", "reward-model", "oracle"]
"""The names of :data:`rlft.eval.select.SELECTORS`, as a type tyro offers as choices."""


@dataclass(frozen=True)
class EvalCountdownConfig(DeviceOptions, RolloutOptions, EnvOptions, CountdownDataOptions):
    """Evaluate a model on held-out Countdown tasks."""

    model: str = "smollm2-135m"
    """Built-in model name, local Hugging Face folder, or Hub id."""
    split: Literal["test", "validation", "train", "all"] = "test"
    """Which tasks: with --data, the parts of rlft.tasks.countdown.splits (test: the 500 held-out rows the spec's
    score is read on; validation: 500 other held-out rows, for screening; train: the rest), or 'all' rows in file
    order; generated tasks (no --data): 'test' (held out from training) or 'train'."""
    limit: int | None = 100
    """Evaluate the first `limit` tasks (None: all; generated test tasks: --heldout-size of them)."""
    mode: Literal["greedy", "sampled"] = "greedy"
    """greedy: one temperature-0 completion per task; sampled: `k` samples at `temperature`/`top_p`."""
    k: int = 1
    """Samples per task in sampled mode (pass@1..pass@k are reported); greedy mode takes 1 only."""
    temperature: float = 1.0
    """Sampling temperature in sampled mode."""
    top_p: float = 1.0
    """Nucleus sampling mass in sampled mode."""
    max_new_tokens: int | None = None
    """Most tokens per completion; None: 1024 on CUDA, 256 on CPU (the reference evaluates with >= 1024)."""
    batch_size: int = 32
    """Sequences generated together."""
    stop_repeats: int | None = None
    """Loop-aware stopping (rlft.rollout.loops): a completion that has written an identical non-empty line this many
    times stops there, scored as it stands (no answer) and counted in looped_rate and truncated_rate. None: off, so
    scores stay comparable with files written without it (`rlft eval compare` refuses to pair the two unless
    --allow-setting stop_repeats)."""
    output: str | None = None
    """Write the metrics and examples to this JSON file (an existing file is refused unless --overwrite; a folder, or
    a path inside a model folder, always)."""
    overwrite: bool = False
    """Replace an existing --output file."""
    ledger: str | None = None
    """--split test: the test-look ledger this evaluation appends one line to (rlft.lab.ledger: the weights'
    SHA-256, date, rlft commit, score); None: test_looks.jsonl in --output's folder (without --output the look is
    not recorded, with a warning). A .jsonl file of looks only, never an input or the --output (refused with another
    --split). `rlft eval ledger PATH` counts the looks."""
    seed: int = 0
    """Sampling seed."""
    keep_completions: bool = False
    """Write every sample's text into --output (task_completions): what a study of the failures reads."""
    select: tuple[Selector, ...] = ()
    """Best-of-N selectors to apply to the k samples of each task (--mode sampled): majority (most common answer
    value), self-certainty (the most certain sample, Kang et al. 2025; the hf engine, whose row-dropping decoder is
    then used on CUDA too), self-certainty-vote (Borda vote by certainty), reward-model (--select-reward-model's highest
    score), oracle (the best rule score: pass@n, the upper bound). Each is paired against a greedy answer on the same
    tasks (see --greedy-from)."""
    select_n: tuple[int, ...] = ()
    """The n's of the best-of-N curve: each selector on the first n of the k samples (empty: 1, 2, 4, ... and k)."""
    select_reward_model: str | None = None
    """The reward model of --select reward-model: a folder written by `rlft rm`. A sample is scored as [user: the
    rendered prompt, assistant: the completion], the layout of `rlft pairs countdown` rows."""
    greedy_from: str | None = None
    """The greedy baseline of --select: an `rlft eval countdown --mode greedy --output` JSON of the same tasks in the
    same order (checked); None: a greedy pass on the same tasks is run here, with the same max_new_tokens."""

    def __post_init__(self) -> None:
        validate_options(self)
        self._check_countdown()
        self._check_env(rollout_engine=self.rollout_engine)
        require(self.env in (None, "countdown", "countdown-calc"),
                f"--env {self.env}: `rlft eval countdown` evaluates the Countdown environments; use `rlft eval env`")
        require(self.env != "countdown-calc" or self.prompt_template in ("base", "calc"),
                f"--env countdown-calc renders its own prompt (the 'calc' template): drop --prompt-template "
                f"{self.prompt_template}")
        require(self.mode == "sampled" or self.k == 1,
                f"--k {self.k} needs --mode sampled: greedy evaluation draws one completion per task")
        require(
            self.mode == "greedy" or self.temperature > 0,
            f"--mode sampled needs --temperature > 0: at 0 the --k {self.k} samples of a task are copies of the greedy "
            "answer (use --mode greedy)")
        self._check_selection()
        require(self.ledger is None or self.split == "test",
                f"--ledger needs --split test: --split {self.split} is not a look at the test rows, so it would record "
                "nothing; drop --ledger")
        if self.data is None and self.split == "test":
            n = self.limit if self.limit is not None else self.heldout_size
            require(
                n <= self.heldout_size, f"--limit {n} is more than --heldout-size {self.heldout_size}: "
                f"{training_overlap(self.preset, self.split_seed, self.heldout_size, n)}; pass --limit "
                f"{self.heldout_size} or less, a larger --heldout-size (as the training run used), or --split train")

    def _check_selection(self) -> None:
        """Options of best-of-N selection that contradict each other (OptionError, exit code 2)."""
        if not self.select:
            for name, value in (("--select-n", self.select_n), ("--select-reward-model", self.select_reward_model),
                                ("--greedy-from", self.greedy_from)):
                require(not value, f"{name} needs --select (a best-of-N selector)")
            return
        require(self.mode == "sampled",
                "--select needs --mode sampled: best-of-N picks among the --k samples of a task")
        bad = [n for n in self.select_n if not 1 <= n <= self.k]
        require(not bad, f"--select-n {bad[0] if bad else ''} is outside [1, --k {self.k}]")
        rm = "reward-model" in self.select
        require(not rm or self.select_reward_model is not None,
                "--select reward-model needs --select-reward-model (a reward-model folder written by `rlft rm`)")
        require(rm or self.select_reward_model is None, "--select-reward-model is only read by --select reward-model")
        require(
            not any(s.startswith("self-certainty") for s in self.select) or self.rollout_engine == "hf",
            f"--select self-certainty needs --rollout-engine hf: {self.rollout_engine} does not report self-certainty")

    def check_outputs(self) -> None:
        """Refuse an --output that would replace a file (unless --overwrite), name a folder, or lie in a model folder
        (:func:`rlft.run_folder.check_output_file`), a --greedy-from that is not a file, and a --select-reward-model
        that is not a reward model (:func:`rlft.rewards.reward_model.check_reward_model`); writes nothing. Run at parse
        time and before any model is loaded. (The test-look ledger is the lab's to check: ``rlft eval countdown`` runs
        :func:`rlft.lab.test_looks.check_eval_ledger` too.)"""
        if self.output is not None:
            from rlft.run_folder import check_output_file

            check_output_file(self.output, overwrite=self.overwrite)
        if self.greedy_from is not None and not Path(self.greedy_from).expanduser().is_file():
            raise OptionError(f"--greedy-from {self.greedy_from}: no such file")
        if self.select_reward_model is not None:
            from rlft.rewards.reward_model import check_reward_model

            check_reward_model(self.select_reward_model, "--select-reward-model")

    def input_paths(self) -> dict[str, str | None]:
        """The files and folders this evaluation reads, by option (built-in names and Hub ids included: they name
        no local path)."""
        return {"--model": self.model, "--data": self.data, "--greedy-from": self.greedy_from,
                "--select-reward-model": self.select_reward_model}


def training_overlap(preset: str, split_seed: int, heldout_size: int, n: int) -> str:
    """How many of the first ``n`` generated held-out-stream tasks of ``preset`` are training tasks of ``rlft rl``'s
    default training set (:data:`~rlft.tasks.countdown.options.DEFAULT_NUM_TRAIN` tasks) with that seed and held-out
    size (:meth:`~rlft.tasks.countdown.options.CountdownOptions.generated_tasks`), as a phrase for an error message."""
    from rlft.tasks.countdown.generator import PRESETS, task_key

    if preset not in PRESETS:
        return f"tasks past {heldout_size} are not held out"
    train = {task_key(t) for t in CountdownOptions(preset=preset, split_seed=split_seed,
                                                    heldout_size=heldout_size).generated_tasks(DEFAULT_NUM_TRAIN)[0]}
    tasks = CountdownOptions(preset=preset, split_seed=split_seed, heldout_size=n).generated_tasks(0)[1]
    overlap = sum(task_key(t) in train for t in tasks)
    return (
        f"{overlap} of the {n} tasks are in the training set of `rlft rl --preset {preset} --split-seed {split_seed} "
        f"--heldout-size {heldout_size}` (its default --num-train {DEFAULT_NUM_TRAIN})")


def load_eval_tasks(cfg: EvalCountdownConfig) -> list[CountdownTask]:
    """The tasks ``cfg`` names: rows of a file/Hub dataset, or generated tasks of a preset (the first ``limit``).

    With ``data``: ``split`` "all" reads the first ``limit`` rows; "test", "validation" and "train" are the parts
    of :func:`rlft.tasks.countdown.splits.load_split` (the held-out rows are the same whatever ``limit``).
    Generated (:meth:`~rlft.tasks.countdown.options.CountdownOptions.generated_tasks`): the first ``limit`` (None:
    ``heldout_size``) held-out tasks ("test"; the stream does not depend on the number of training tasks and is
    prefix-stable, so these are held out from a training run with the same preset and seed whenever that run's
    ``heldout_size >= limit``, which the config checks) or the first ``limit`` (None: 1024) training tasks of a run
    holding out ``heldout_size`` tasks ("train": the tasks such a run trains on first).

    Raises:
        ValueError: an unknown preset; ``validation`` or ``all`` without ``data``.
    """
    if cfg.data is not None:
        if cfg.split == "all":
            from rlft.tasks.countdown.loaders import load_countdown

            return load_countdown(cfg.data, split=cfg.data_split, limit=cfg.limit)
        part = cfg.row_split().part(cfg.split)
        return part[: cfg.limit] if cfg.limit is not None else part
    if cfg.split not in ("test", "train"):
        raise ValueError(
            f"--split {cfg.split} needs --data (a Countdown file or Hub dataset); generated tasks have test and train")
    if cfg.split == "train":
        return cfg.generated_tasks(cfg.limit if cfg.limit is not None else DEFAULT_TEST_SIZE)[0]
    return cfg.generated_tasks(0, cfg.limit)[1]


def load_greedy_baseline(path: str, tasks: list[CountdownTask], max_new_tokens: int | None = None,
                         model_sha256: str | None = None, prompt_template: str | None = None) -> CountdownEvalResult:
    """The ``--greedy-from`` evaluation, checked to be greedy and of ``tasks`` in the same order; a warning is logged
    when its ``max_new_tokens`` (from its ``config``) differs from ``max_new_tokens``.

    Raises:
        OptionError: not an evaluation file, another mode or other tasks, weights other than ``model_sha256`` (its
            ``config`` records another ``model_sha256``; files without one are not checked), or another prompt template
            than ``prompt_template`` (:func:`rlft.eval.countdown.other_settings`; files that do not record one are not
            checked). The message names the option.
    """
    from rlft.eval.best_of_n import check_same_tasks

    try:
        greedy, config = read_eval_file(path)
    except ValueError as e:
        raise OptionError(f"--greedy-from {e}") from None
    try:
        check_same_tasks([{"nums": list(t.nums), "target": t.target} for t in tasks], greedy, f"--greedy-from {path}")
    except ValueError as e:
        raise OptionError(str(e)) from None
    recorded = config.get("model_sha256")
    if other_weights(recorded, model_sha256):
        raise OptionError(f"--greedy-from {path} evaluated weights with SHA-256 {recorded[:16]}..., but --model has "
                          f"{model_sha256[:16]}...: pair an evaluation of the same model file")
    differs = other_settings(config, {"prompt_template": prompt_template})
    if "prompt_template" in differs:
        raise OptionError(
            f"--greedy-from {path} was evaluated with --prompt-template {differs['prompt_template'][0]}, these "
            f"samples with {prompt_template}: pair answers to the same prompts")
    theirs = config.get("max_new_tokens")
    if max_new_tokens is not None and theirs not in (None, max_new_tokens):
        log.warning(
            "--greedy-from %s was generated with max_new_tokens %s, the samples with %d: the comparison is not at "
            "equal budgets per answer", path, theirs, max_new_tokens)
    return greedy


class RecordingEngine:
    """An engine that passes ``generate`` through and keeps the last call's completion texts, ``(B, k)`` (the
    reward model scores them after the evaluation)."""

    def __init__(self, engine):
        self.engine = engine
        self.texts: list[list[str]] = []

    def generate(self, prompts, params, **tools):
        samples = self.engine.generate(prompts, params, **tools)
        self.texts = [[s.text for s in row] for row in samples]
        return samples


def load_rm_scorer(cfg: EvalCountdownConfig):
    """The ``--select-reward-model`` scorer (:class:`rlft.rewards.reward_model.RewardModelScorer`)."""
    from rlft.rewards.reward_model import RewardModelScorer

    return RewardModelScorer(cfg.select_reward_model, batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype)


def best_of_n(cfg: EvalCountdownConfig, result: CountdownEvalResult, greedy: CountdownEvalResult,
              greedy_source: str) -> dict:
    """The ``selection`` dict of the output: ``greedy`` (:func:`rlft.eval.best_of_n.greedy_summary`), ``rows`` (every
    selector@n, :func:`rlft.eval.best_of_n.selection_rows`), ``sizes``, ``skipped`` (selectors the result cannot
    support, with why), ``reward_model`` and ``reward_model_input``. Prints the table."""
    from rlft.eval.best_of_n import (RM_INPUT, available_selectors, greedy_summary, print_selection, selection_rows,
                                     selection_sizes)

    selectors, skipped = available_selectors(result, list(dict.fromkeys(cfg.select)))
    for name, why in skipped.items():
        log.warning("--select %s skipped: %s", name, why)
    sizes = selection_sizes(cfg.k, cfg.select_n)
    selection = {
        "greedy": greedy_summary(greedy, greedy_source), "sizes": sizes, "skipped": skipped,
        "reward_model": cfg.select_reward_model, "reward_model_input": RM_INPUT if cfg.select_reward_model else None,
        "rows": selection_rows(result, greedy.task_scores, selectors, sizes)
    }
    print_selection(selection, title=f"Best-of-N selection: {cfg.model} ({cfg.k} samples at T {cfg.temperature})")
    return selection


TestLookCallback = Callable[[CountdownEvalResult, dict], None]
"""Told of an evaluation of the test rows (``--split test``) once it is done and written: the result and its config
record (the options, the weights' ``model_sha256``, ``heldout``: which test rows). ``rlft eval countdown`` counts the
look in the test-look ledger (:func:`rlft.lab.test_looks.run_eval_countdown_counted`)."""


def countdown_env(cfg) -> tuple[str, ToolUse | None]:
    """``(prompt template, tools)`` of a Countdown command's ``--env``: ``('calc', the calculator)`` for
    countdown-calc (:data:`rlft.rewards.countdown_calc.CALC_TOOLS`, with ``--max-turns``, ``--max-observation-tokens``
    and ``--tool-timeout``), else ``(--prompt-template, None)``."""
    if cfg.env != "countdown-calc":
        return cfg.prompt_template, None
    from rlft.rewards.countdown_calc import CALC_TOOLS

    return "calc", tool_use_for(CALC_TOOLS, cfg)


def run_eval_countdown(cfg: EvalCountdownConfig, *, on_test_look: TestLookCallback | None = None
                       ) -> CountdownEvalResult:
    """Load the model, build tasks and prompts, evaluate, print a table, write ``cfg.output`` if set (the result, its
    ``config`` with the weights' ``model_sha256``, and the ``environment``, :func:`rlft.provenance.environment`); with
    ``cfg.select``, also the best-of-N curves against a greedy answer (the output's ``selection`` key). With
    ``--split test``, ``on_test_look`` (if given) is then called once (:data:`TestLookCallback`); this function counts
    no look itself.

    Raises:
        UsageError: launched by torchrun; an --output that must not be
            written (:meth:`EvalCountdownConfig.check_outputs`); a --greedy-from of other tasks or other
            weights (:func:`load_greedy_baseline`); all before the model is loaded.
        rlft.models.ModelNotFoundError: the model cannot be loaded.
        ValueError: unknown preset or prompt template, or no tasks.
    """
    from rlft.checkpoint import weights_sha256
    from rlft.distributed import require_one_process
    from rlft.models import load_tokenizer, pick_device
    from rlft.provenance import environment
    from rlft.rollout.engines import make_engine

    require_one_process("rlft eval countdown")
    cfg.check_outputs()
    spec = pick_device(cfg.device, cfg.dtype)
    max_new_tokens = cfg.max_new_tokens or (MAX_NEW_TOKENS_CUDA if spec.device.type == "cuda" else MAX_NEW_TOKENS)
    tasks = load_eval_tasks(cfg)
    heldout = cfg.heldout_block() if cfg.split in ("test", "validation") else None  # 'original' / 'fresh' rows
    model_sha256 = weights_sha256(cfg.model)
    greedy = (load_greedy_baseline(cfg.greedy_from, tasks, max_new_tokens, model_sha256, cfg.prompt_template)
              if cfg.greedy_from else None)
    tokenizer = load_tokenizer(cfg.model)
    template, tool_use = countdown_env(cfg)
    prompts = [render_prompt(template, task, tokenizer) for task in tasks]
    engine = make_engine(cfg.rollout_engine, cfg.model, tokenizer, spec, url=cfg.rollout_url, batch_size=cfg.batch_size,
                         show_progress=True, add_special_tokens=adds_special_tokens(template))
    if any(name.startswith("self-certainty") for name in cfg.select) and getattr(engine, "decoder", None) == "auto":
        # the hf decoder that reports self-certainty (CUDA's default, static-cache generate, does not)
        engine.decoder = "drop"
    greedy_params = SamplingParams(k=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=cfg.seed,
                                   stop_repeats=cfg.stop_repeats)
    if cfg.mode == "greedy":
        params = greedy_params
    else:
        params = SamplingParams(k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=max_new_tokens,
                                seed=cfg.seed, stop_repeats=cfg.stop_repeats)
    recorder = RecordingEngine(engine)
    tools = {"tool_use": tool_use} if tool_use is not None else {}
    tools |= {"keep_completions": True} if cfg.keep_completions else {}
    result = evaluate_countdown(recorder, tasks, prompts, params, **tools)
    print_result(result, title=f"Countdown eval: {cfg.model}")
    if cfg.select:
        if cfg.select_reward_model is not None:
            from rlft.eval.best_of_n import rm_scores

            result.task_rm_scores = rm_scores(load_rm_scorer(cfg), prompts, recorder.texts)
        source = cfg.greedy_from
        if greedy is None:
            log.info("greedy baseline: %d tasks, max_new_tokens %d", len(tasks), max_new_tokens)
            greedy, source = evaluate_countdown(engine, tasks, prompts, greedy_params, **tools), "this run"
        result.selection = best_of_n(cfg, result, greedy, source)
    if cfg.output:
        path = Path(cfg.output).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**result.to_dict(), "config": {**asdict(cfg), "model_sha256": model_sha256,
                                                                      "heldout": heldout},
                                 "environment": environment()})
    if cfg.split == "test" and on_test_look is not None:  # a look at the held-out test tasks: the caller counts it
        on_test_look(result, {**asdict(cfg), "model_sha256": model_sha256, "heldout": heldout})
    return result
