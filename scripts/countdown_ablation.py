"""Countdown ablation runner: RL estimators/losses/filters, LoRA, DPO (+-RPO) and continued SFT, all from one SFT model.

The variants and the settings are data, in ``configs/countdown/ablation/`` (its README.md gives the layout): a setting
names the SFT start, every stage's task source, the evaluation splits and the generation budget; a variant names its
kind (rl, dpo, sft), its recipe options and its start (the SFT start, or ``start_from`` another variant's model of
the same seed); a continued-SFT variant's length is an RL run's compute (``budget: wall`` or ``flops``). All are scored
on the same held-out tasks (never trained on by any stage): greedy mean score, and with ``--sampled`` the sampled mean
score and pass@1/pass@4. ``scripts/ablation_report.py`` pairs each against the SFT start (tables, plots).

    python scripts/countdown_ablation.py run --sft runs/exp/sft/model --out runs/ablation \\
        --variants grpo_filter_lora_2e4 rloo_1e6 --seeds 0 --tasks 200
    python scripts/ablation_report.py report --out runs/ablation --tasks 200

``run`` is resumable: a finished variant/seed (its ``eval_*.json`` present) is skipped, an unfinished run resumes from
its last checkpoint (one killed before its first checkpoint restarts; rlft moves the old folder aside), and evaluations
are cached (:func:`rlft.lab.pipeline.evaluate_cached`: a model rebuilt with other weights is evaluated again).
``pairs`` only samples the DPO variants' pairs; ``list`` prints the variants; ``sft-curve`` scores an SFT run's
checkpoints; ``checkpoint`` evaluates the adapter an RL run kept at step ``--step``, merged into its start (the
half-way model of the sample-reuse study). Runs go one after another (2 CPU cores: never two at once).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rlft.checkpoint import checkpoint_folders
from rlft.composed import option_fields
from rlft.console import setup_logging
from rlft.fsio import atomic_write_json
from rlft.lab.pipeline import Setting, heldout_tasks, load_settings, load_variants
from rlft.lab.script_io import ArgumentParser, check_outputs, fail, run_script

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablation_budget import sft_budget  # noqa: E402  (a continued-SFT variant's length)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "countdown" / "ablation"
REAL_DATA = ROOT.parent / "shared" / "data" / "countdown" / "train.parquet"
"""Countdown-Tasks-3to4 rows (no stage trains on them: every training task is generated)."""
SCRIPT_KEYS = ("kind", "budget", "budget_of", "pairs_of", "pair_prompts", "pair_samples", "pair_offset", "start_from")
"""Variant keys this runner reads; every other key is an option of the kind's recipe config."""


@dataclass(frozen=True)
class Ablation:
    """One invocation: the variants and setting (data), the SFT start, the run folder, and what is evaluated."""

    variants: dict[str, dict]
    setting: Setting
    out: Path
    sft: Path
    tasks: int = 200
    """Held-out tasks scored: the first N of the split."""
    split: str = "test"
    """test: held-out 0 .. (the protocol); validation: held-out ``validation_start`` .. (screening recipes)."""
    sampled: bool = False
    real: int = 0
    """Also greedy on N 3-number and N 4-number real Countdown-Tasks-3to4 rows."""
    steps: int | None = None
    sft_step_s: float = 6.0
    budget_from: Path | None = None


def eval_name(mode: str, n: int, split: str = "test") -> str:
    """``eval_greedy_500.json`` (test tasks), ``eval_val_greedy_500.json`` (validation tasks)."""
    return f"eval_{'val_' if split == 'validation' else ''}{mode}_{n}.json"


def real_tasks(n_per_size: int) -> dict[str, list]:
    """The last ``n_per_size`` 3-number and 4-number rows of the real Countdown-Tasks-3to4 file, as ``{"real3": [...],
    "real4": [...]}``; SystemExit when the file is absent."""
    from rlft.tasks.countdown.loaders import load_countdown, tail_by_size
    if not REAL_DATA.exists():
        raise SystemExit(f"--real needs {REAL_DATA} (Countdown-Tasks-3to4)")
    return {f"real{size}": tasks for size, tasks in tail_by_size(load_countdown(str(REAL_DATA)), n_per_size).items()}


def evaluate(ab: Ablation, model_dir: Path, out: Path, seed: int = 0) -> dict:
    """Greedy (and ``ab.sampled``: sampled, the setting's ``eval.sampled``) evaluation of ``model_dir`` on the first
    ``ab.tasks`` tasks of ``ab.split``, and greedy on ``ab.real`` rows of each size; cached in ``out``."""
    from rlft.lab.pipeline import EvalJob, evaluate_cached
    from rlft.rollout.base import SamplingParams
    s, n = ab.setting, ab.tasks
    greedy, held = SamplingParams(k=1, temperature=0.0, max_new_tokens=s.max_new_tokens), heldout_tasks(s, n, ab.split)
    test = ab.split == "test"  # a look at the test rows: counted in <--out>/test_looks.jsonl
    jobs = {"greedy": EvalJob(out / eval_name("greedy", n, ab.split), held, greedy, test_look=test)}
    if ab.sampled:
        params = SamplingParams(**s.eval["sampled"], max_new_tokens=s.max_new_tokens, seed=seed)
        jobs["sampled"] = EvalJob(out / eval_name("sampled", n, ab.split), held, params, test_look=test)
    for name, rows in (real_tasks(ab.real) if ab.real else {}).items():
        jobs[name] = EvalJob(out / f"eval_{name}_{ab.real}.json", rows, greedy)
    return evaluate_cached(model_dir, jobs, prompt_template=s.tasks["prompt_template"], batch_size=s.eval["batch_size"],
                           device=s.device, dtype=s.dtype, label=str(model_dir), ledger=ab.out / "test_looks.jsonl")


def checkpoint_eval(ab: Ablation, name: str, seed: int, step: int) -> dict:
    """The evaluation (:func:`evaluate`) of variant ``name``'s model at RL step ``step``: the LoRA adapter kept in
    ``<out>/<name>/s<seed>/step<step>_checkpoint`` (a copy of the run's ``checkpoints/step-<step>`` folder made while
    it trained, since ``keep_checkpoints`` deletes older ones), else that checkpoint itself (``run/checkpoints/step-
    <step, 8 digits>``, still there when ``keep_checkpoints`` kept it), merged into the model the variant started from
    (:func:`start_model`) by :func:`rlft.lora.merge_adapter`. The merged model and the evaluation files go to
    ``<out>/<name>/s<seed>/step<step>/``; both are reused when present (evaluations are cached by the model's hash).
    SystemExit: no kept checkpoint; UsageError: the start is not the adapter's own (:func:`rlft.lora.check_base`)."""
    from rlft.lora import check_base, merge_adapter
    folder = ab.out / name / f"s{seed}"
    kept = next((c for c in (folder / f"step{step}_checkpoint", folder / "run" / "checkpoints" / f"step-{step:08d}")
                 if (c / "adapter_config.json").is_file()), None)
    if kept is None:
        raise SystemExit(f"{folder}: no LoRA checkpoint of step {step} kept (step{step}_checkpoint/ or "
                         f"run/checkpoints/step-{step:08d}/; --keep-checkpoints keeps a run's own)")
    model, start = folder / f"step{step}" / "model", start_model(ab, name, seed)
    merge_adapter(start, kept, model) if not (model / "config.json").is_file() else check_base(start, kept)
    return evaluate(ab, model, folder / f"step{step}", seed)


def pairs_file(variants: dict, out: Path, name: str, seed: int) -> Path:
    """The pairs a DPO variant trains on: those of its ``pairs_of`` variant (itself when unset) for ``seed``."""
    return out / variants[name].get("pairs_of", name) / f"s{seed}" / "pairs.jsonl"


def start_model(ab: Ablation, name: str, seed: int) -> Path:
    """The model variant ``name`` starts from for ``seed``, also its reference and (DPO) the sampler of its pairs:
    ``ab.sft``, or with ``start_from`` that variant's finished model of the same seed (SystemExit when missing)."""
    if "start_from" not in ab.variants[name]:
        return ab.sft
    earlier = ab.variants[name]["start_from"]
    model = ab.out / earlier / f"s{seed}" / "run" / "model"
    if not model.is_dir():
        raise SystemExit(f"{name} starts from {model}, which does not exist: run {earlier} for seed {seed} first")
    return model


def ensure_pairs(ab: Ablation, name: str, seed: int) -> Path:
    """The pairs file DPO variant ``name`` trains on for ``seed`` (:func:`pairs_file`), sampled when absent from the
    start of the variant that owns them (``pairs_of``, else ``name``): its ``pair_prompts`` (default: the setting's
    ``pairs.num_prompts``) prompts from ``pair_offset + seed * pair_prompts`` on, ``pair_samples`` samples each (a
    killed sampling run continues from its journal, ``pairs.samples.jsonl``)."""
    from rlft.recipes.pairs import PairsConfig, make_countdown_pairs
    owner = ab.variants[name].get("pairs_of", name)
    spec, s = ab.variants[owner], ab.setting
    pairs = pairs_file(ab.variants, ab.out, name, seed)
    if not pairs.exists():
        pairs.parent.mkdir(parents=True, exist_ok=True)
        n_prompts = spec.get("pair_prompts", s.pairs["num_prompts"])
        make_countdown_pairs(PairsConfig(
            **{**s.tasks, **s.pairs, "num_prompts": n_prompts,
               "num_samples": spec.get("pair_samples", s.pairs["num_samples"])},
            model=str(start_model(ab, owner, seed)), start=spec.get("pair_offset", 0) + seed * n_prompts,
            max_new_tokens=s.max_new_tokens, output=str(pairs), seed=seed, device=s.device, dtype=s.dtype))
    return pairs


def recipe_options(cls: type, name: str, spec: dict) -> dict:
    """The variant's options for recipe config ``cls`` (every key but SCRIPT_KEYS); SystemExit naming an unknown one."""
    if unknown := {k for k in spec if k not in SCRIPT_KEYS} - {f.name for f in option_fields(cls)}:
        raise SystemExit(f"variant {name!r}: {', '.join(sorted(unknown))}: not an option of {cls.__name__}")
    return {k: v for k, v in spec.items() if k not in SCRIPT_KEYS}


def finished_evals(ab: Ablation, folder: Path) -> bool:
    """Whether ``folder`` holds every evaluation ``ab`` asks for (a test-split one does not count for validation)."""
    names = [eval_name("greedy", ab.tasks, ab.split)] + [eval_name("sampled", ab.tasks, ab.split)] * ab.sampled
    return all((folder / x).exists() for x in names + [f"eval_real4_{ab.real}.json"] * bool(ab.real))


def run_variant(ab: Ablation, name: str, seed: int) -> None:
    """Train variant ``name`` for ``seed`` (unless its model exists) and evaluate it on ``ab.split``."""
    spec, s, folder = ab.variants[name], ab.setting, ab.out / name / f"s{seed}"
    if finished_evals(ab, folder):
        return
    folder.mkdir(parents=True, exist_ok=True)
    run, model_dir = folder / "run", folder / "run" / "model"
    # resume from the newest checkpoint; one killed before its first is moved aside (run.replaced-<time>), restarted
    resume = run.exists() and bool(checkpoint_folders(run))
    restart, device = dict(resume=resume, overwrite=run.exists() and not resume), dict(device=s.device, dtype=s.dtype)
    if not model_dir.exists():
        t0 = time.perf_counter()
        start = start_model(ab, name, seed)
        if spec["kind"] == "rl":
            from rlft.lab.test_looks import train_rl_counted  # eval_rows: test -> each look counted in the run
            from rlft.rl.config import RLConfig
            options = {**s.tasks, **s.rl, "max_new_tokens": s.max_new_tokens, "eval_max_new_tokens": s.max_new_tokens,
                       "micro_batch_size": s.micro_batch_size, **({"max_steps": ab.steps} if ab.steps else {}),
                       **recipe_options(RLConfig, name, spec)}  # a variant's own max_steps wins over --steps
            # exact gradient accumulation: a run killed for memory may resume with a smaller micro-batch
            train_rl_counted(RLConfig(**options, model=str(start), output_dir=str(run), seed=seed, **restart,
                                      **device, resume_override=("micro_batch_size", )))
        elif spec["kind"] == "dpo":
            from rlft.recipes.dpo import DPOConfig, train_dpo
            pairs = ensure_pairs(ab, name, seed)
            train_dpo(
                DPOConfig(**{**s.dpo, **recipe_options(DPOConfig, name, spec)}, model=str(start), data=str(pairs),
                          output_dir=str(run), micro_batch_size=s.micro_batch_size, seed=seed, **restart, **device))
        else:  # continued SFT from its start, for the compute of an RL run (its wall time or its FLOPs)
            from rlft.recipes.sft import SFTConfig, train_sft
            traces = {"trace_style": s.trace_style, "give_up": s.give_up}  # the setting's, unless the variant sets them
            train_sft(SFTConfig(**{**s.tasks, **s.sft_continued, **traces, **recipe_options(SFTConfig, name, spec)},
                                model=str(start), output_dir=str(run), **sft_budget(ab, name, seed, start), seed=seed,
                                **restart, **device))
        atomic_write_json(folder / "train_time.json", {"seconds": time.perf_counter() - t0})
    evaluate(ab, model_dir, folder, seed)


def sft_curve(ab: Ablation, run: Path, every: int) -> list[dict]:
    """Greedy score on ``ab.tasks`` tasks of ``ab.split`` (screen on validation) of an SFT run's checkpoints (every
    ``every`` steps) and final model: the convergence curve. Cached per checkpoint in ``ab.out/sft_curve/step-N``;
    written to ``ab.out/sft_curve.json`` and plotted to ``ab.out/sft_curve.png`` (main checks both first)."""
    from rlft.checkpoint import read_metrics
    from rlft.eval.report import plot_curve
    points = [(int(c.name.split("-")[1]), c) for c in sorted((run / "checkpoints").glob("step-*"))]
    points = [(step, c) for step, c in points if step % every == 0]
    if (run / "model").exists():
        points.append((max((r["step"] for r in read_metrics(run / "metrics.jsonl")), default=0), run / "model"))
    greedy = replace(ab, sampled=False, real=0)
    curve = [{"step": step, "score": r.mean_score, "accuracy": r.accuracy, "truncated": r.truncated_rate}
             for step, folder in points
             for r in [evaluate(greedy, folder, ab.out / "sft_curve" / f"step-{step}")["greedy"]]]
    atomic_write_json(ab.out / "sft_curve.json", curve)
    plot_curve([{"step": c["step"], "eval/score": c["score"]} for c in curve], "eval/score", ab.out / "sft_curve.png",
               title=f"SFT on {ab.setting.tasks['preset']} traces: greedy score on {ab.tasks} {ab.split} tasks",
               smooth=10**6)
    return curve


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("command", choices=["run", "pairs", "list", "sft-curve", "checkpoint"])
    add("--configs", type=Path, default=CONFIGS, help="the folder of settings.yaml and the variant files")
    add("--setting", default="direct", help="a setting of settings.yaml (direct: docs/results/countdown-medium3; "
        "bounded: countdown-bounded; real: countdown-real)")
    add("--sft", type=Path, default=None, help="the SFT start (default: the setting's sft)")
    add("--out", type=Path, default=Path("runs/ablation"))
    add("--variants", nargs="*", default=[])
    add("--seeds", nargs="*", type=int, default=[0])
    add("--steps", type=int, default=None,
        help="RL steps (default: the setting's rl.max_steps); a variant's own max_steps wins")
    add("--tasks", type=int, default=200, help="held-out tasks scored (the first N of the split)")
    add("--split", choices=["test", "validation"], default="test",
        help="evaluate on the test tasks (the protocol) or the validation tasks (for screening recipes)")
    add("--sampled", action="store_true", help="also the sampled evaluation (the setting's eval.sampled)")
    add("--real", type=int, default=0, help="also greedy on N 3-number and N 4-number real Countdown-Tasks-3to4 rows")
    add("--sft-step-s", type=float, default=6.0, help="seconds per SFT step (for the continued-SFT budget)")
    add("--budget-from", type=Path, default=None,
        help="continued SFT: the budget is this RL metrics.jsonl's summed step time (e.g. an archived run's)")
    add("--no-start-eval", action="store_true",
        help="run: do not evaluate the SFT start first (another process does; runs side by side)")
    add("--sft-run", type=Path, default=Path("runs/exp/sft"), help="sft-curve: the SFT run folder")
    add("--every", type=int, default=50, help="sft-curve: evaluate every N-th step's checkpoint")
    add("--step", type=int, default=10, help="checkpoint: evaluate each variant's kept step-N adapter "
        "(<out>/<variant>/s<seed>/stepN_checkpoint) merged into its start")
    add("--overwrite", action="store_true", help="sft-curve: replace <out>/sft_curve.json and .png")
    args = parser.parse_args(argv)
    for option, value, low in (("--tasks", args.tasks, 1), ("--every", args.every, 1), ("--step", args.step, 1),
                               ("--steps", args.steps or 1, 1), ("--real", args.real, 0)):
        if value < low:
            fail(f"{option} must be >= {low}, got {value}")
    settings, variants = load_settings(args.configs), load_variants(args.configs)
    if args.setting not in settings:
        parser.error(f"--setting {args.setting}: not in {args.configs / 'settings.yaml'} ({', '.join(settings)})")
    if unknown := [v for v in args.variants if v not in variants]:
        sys.exit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(variants)}")
    setting = settings[args.setting]
    if args.command == "run" and not (Path(args.sft or setting.sft) / "config.json").is_file():
        fail(f"--sft {args.sft or setting.sft}: no model folder (config.json) there: pass the SFT start's model folder")
    ab = Ablation(variants, setting, out=args.out, sft=args.sft or Path(setting.sft), tasks=args.tasks,
                  split=args.split, sampled=args.sampled, real=args.real, steps=args.steps, sft_step_s=args.sft_step_s,
                  budget_from=args.budget_from)
    runs = [(seed, name) for seed in args.seeds for name in args.variants]  # seed by seed, each variant in turn
    setup_logging()
    if args.command == "list":
        print("\n".join(f"{k}: {v}" for k, v in variants.items()))
    elif args.command == "sft-curve":
        for name in ("sft_curve.json", "sft_curve.png"):  # before any evaluation
            check_outputs({"--out": args.out / name}, overwrite=args.overwrite)
        for point in sft_curve(ab, args.sft_run, args.every):
            print(point)
    elif args.command == "checkpoint":
        for seed, name in runs:
            scores = checkpoint_eval(ab, name, seed, args.step)
            print(name, seed, {mode: round(result.mean_score, 4) for mode, result in scores.items()})
    elif args.command == "pairs":
        for seed, name in runs:
            if variants[name]["kind"] != "dpo":
                sys.exit(f"pairs: {name!r} is not a DPO variant")
            print(ensure_pairs(ab, name, seed))
    else:
        if not args.no_start_eval:
            evaluate(ab, ab.sft, args.out / "sft_start")
        for seed, name in runs:
            run_variant(ab, name, seed)
        print(f"tables and plots: python scripts/ablation_report.py report --out {args.out} --tasks {args.tasks}")


if __name__ == "__main__":
    run_script(main)  # a bad settings or variant file, too many validation tasks, a bad option: one line, exit 2
