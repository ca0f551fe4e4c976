"""Countdown ablation: RL estimators/losses/filters, LoRA, DPO (+-RPO) and continued SFT, all from one SFT model.

Every variant starts from the same converged SFT model and is scored on the same held-out tasks of the
``medium3`` preset (distinct, never trained on by any stage): greedy mean score, and with ``--sampled``
the sampled mean score and pass@1/pass@4 (T=0.6, top-p 0.95, 4 samples). Each is paired against the
SFT start task by task (mean difference, 95% interval, tasks better/worse).

    python scripts/countdown_ablation.py run --sft runs/exp/sft/model --out runs/ablation \\
        --variants grpo_filter_lora rloo_1e6 --seeds 0 --tasks 200
    python scripts/countdown_ablation.py report --out runs/ablation --tasks 200

``run`` is resumable: a finished variant/seed (its ``eval_*.json`` present) is skipped, an unfinished
RL run resumes from its last checkpoint. Runs go one after another (2 CPU cores: never two at once).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger("rlft")

PRESET = "medium3"
SPLIT_SEED = 1234
HELDOUT_SIZE = 1000  # every stage's training tasks exclude the first 1000 distinct test tasks; evaluation uses a prefix
PROMPT = "short"


class Setting(NamedTuple):
    """What the SFT dataset's traces look like, and the generation length that fits them (rollouts, pairs and
    evaluation alike)."""

    trace_style: str
    max_new_tokens: int
    give_up: float = 0.6
    micro_batch_size: int = 32
    """RL update and DPO micro-batch (exact gradient accumulation: the maths does not depend on it). At 144 tokens
    a micro-batch of 32 takes ~13 GB in RL and over 20 GB in DPO (chosen + rejected), so side-by-side runs need 8."""


SETTINGS = {
    # sessions 5-12: 3,000 all-correct `direct` solver traces (~40 tokens)
    "direct": Setting("direct", 64),
    # session 13 on: 3,000 `bounded` search traces, ~48% correct (searches that give up answer their closest
    # attempt), like cog_behav's ~43%; up to 6 tries, 144 tokens at most
    "bounded": Setting("bounded", 144, micro_batch_size=8),
}


def rl_base(setting: Setting) -> dict:
    """Shared by every RL variant: 8 prompts x k=8 per step, T=1, no KL (the update regime is what varies)."""
    return dict(preset=PRESET, num_train=20000, heldout_size=HELDOUT_SIZE, split_seed=SPLIT_SEED, prompt_template=PROMPT,
                k=8, prompts_per_step=8, temperature=1.0, max_new_tokens=setting.max_new_tokens, beta=0.0,
                micro_batch_size=setting.micro_batch_size,
                gen_batch_size=64, save_every=5, keep_checkpoints=1, eval_every=10, eval_limit=100,
                eval_max_new_tokens=setting.max_new_tokens, eval_at_start=False, max_steps=30, max_prompt_batches=3,
                device="cpu", dtype="float32")


VARIANTS: dict[str, dict] = {
    # full fine-tuning at the rates small-model RL uses
    "rloo_1e6": dict(kind="rl", advantage="rloo", loss="reinforce", lr=1e-6),
    "rloo_5e6": dict(kind="rl", advantage="rloo", loss="reinforce", lr=5e-6),
    "grpo_2e6": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", lr=2e-6),
    "dr_grpo_2e6": dict(kind="rl", advantage="dr_grpo", loss="ppo", lr=2e-6),
    "lite_ppo_2e6": dict(kind="rl", advantage="lite_ppo", loss="ppo", loss_mode="token_mean", lr=2e-6),
    "reinforce_rej_2e6": dict(kind="rl", advantage="reinforce", loss="reinforce", filter_groups=True, lr=2e-6),
    "grpo_filter_2e6": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True, lr=2e-6),
    "dapo_2e6": dict(kind="rl", advantage="grpo", loss="ppo", clip_high=0.28, loss_mode="token_mean", filter_groups=True,
                     ppo_epochs=2, lr=2e-6),
    "raft_2e6": dict(kind="rl", advantage="raft", loss="raft", raft_threshold=1.0, lr=2e-6),
    "raftpp_2e6": dict(kind="rl", advantage="raft", loss="raft++", raft_threshold=1.0, ppo_epochs=2, lr=2e-6),
    # LoRA at its usual rates
    "grpo_filter_lora_5e5": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True, lora_r=16,
                                 lora_alpha=32.0, lr=5e-5),
    "grpo_filter_lora_1e4": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True, lora_r=16,
                                 lora_alpha=32.0, lr=1e-4),
    "grpo_filter_lora_2e4": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True, lora_r=16,
                                 lora_alpha=32.0, lr=2e-4),
    "grpo_filter_lora_5e4": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True, lora_r=16,
                                 lora_alpha=32.0, lr=5e-4),
    # rollouts at T=0.6, nearer the greedy decoder the protocol scores: groups then disagree where the top candidates compete
    "grpo_filter_lora_2e4_t06": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True, lora_r=16,
                                     lora_alpha=32.0, lr=2e-4, temperature=0.6, max_prompt_batches=4),
    # more prompts per update, fewer samples each (32 x k=4, no refill: all-equal groups are skipped in the update)
    "grpo_wide_lora_2e4": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", k=4, prompts_per_step=32,
                               lora_r=16, lora_alpha=32.0, lr=2e-4),
    # iterated RAFT (expert iteration): 64 prompts x k=4 per step, SFT-style token-mean likelihood of the correct
    # samples, 2 passes over each batch: 4x the distinct tasks per update of the 8 x 8 runs, each sample used twice
    "raft_wide_1e5": dict(kind="rl", advantage="raft", loss="raft", raft_threshold=1.0, k=4, prompts_per_step=64,
                          loss_mode="token_mean", ppo_epochs=2, lr=1e-5),
    "dapo_lora_3e4": dict(kind="rl", advantage="grpo", loss="ppo", clip_high=0.28, loss_mode="token_mean", filter_groups=True,
                          ppo_epochs=2, lora_r=16, lora_alpha=32.0, lr=3e-4),
    "grpo_filter_5e6": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True, lr=5e-6),
    # the protocol recipe above run 3x as long (60 steps, ~9k samples generated): the seed-0/1 runs resume from
    # grpo_filter_lora_1e4's step-15 checkpoints (constant lr: the same trajectory), so their first 15 steps are shared
    "grpo_filter_lora_1e4_60": dict(kind="rl", advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True,
                                    lora_r=16, lora_alpha=32.0, lr=1e-4, max_steps=60),
    "rloo_lora_5e5": dict(kind="rl", advantage="rloo", loss="reinforce", lora_r=16, lora_alpha=32.0, lr=5e-5),
    # preference optimisation on on-policy pairs (2 samples at T=1 per prompt, ties dropped)
    "dpo": dict(kind="dpo", loss_type="dpo", lr=1e-6),
    "rpo": dict(kind="dpo", loss_type="rpo", lr=1e-6),
    "dpo_lora_1e4": dict(kind="dpo", loss_type="dpo", lora_r=16, lora_alpha=32.0, lr=1e-4),
    # pairs_of: train on that variant's pairs of the same seed (sampled once, by whichever runs first)
    "rpo_lora_1e4": dict(kind="dpo", loss_type="rpo", lora_r=16, lora_alpha=32.0, lr=1e-4, pairs_of="dpo_lora_1e4"),
    # DPO at the RL recipe's LoRA rate (the 1e-4 runs' margins stay at ~0.07 nats: the policy barely moves)
    "dpo_lora_2e4": dict(kind="dpo", loss_type="dpo", lora_r=16, lora_alpha=32.0, lr=2e-4, pairs_of="dpo_lora_1e4"),
    # 4x the pairs' samples (1,920 prompts x 4, best vs worst): about the samples of a 60-step RL run; one epoch
    "dpo_wide_lora_1e4": dict(kind="dpo", loss_type="dpo", lora_r=16, lora_alpha=32.0, lr=1e-4, pair_prompts=1920,
                              pair_samples=4, epochs=1.0),
    # the spec's pairs (2 samples per prompt, ties dropped) on 4x the prompts: ~4x the pairs of dpo_lora_1e4, the same
    # recipe otherwise (2 epochs); the samples of a ~60-step RL run
    "dpo_4x_lora_1e4": dict(kind="dpo", loss_type="dpo", lora_r=16, lora_alpha=32.0, lr=1e-4, pair_prompts=3840),
    # screened on the validation tasks after dpo_4x_lora_1e4 (seed 0) ran its greedy searches past 144 tokens: RPO's NLL
    # term on the same pairs (holds the chosen searches' likelihood), and DPO for one epoch (half the updates)
    "rpo_4x_lora_1e4": dict(kind="dpo", loss_type="rpo", lora_r=16, lora_alpha=32.0, lr=1e-4, pairs_of="dpo_4x_lora_1e4"),
    "dpo_4x_lora_1e4_1ep": dict(kind="dpo", loss_type="dpo", lora_r=16, lora_alpha=32.0, lr=1e-4, epochs=1.0,
                                pairs_of="dpo_4x_lora_1e4"),
    # iterative (online) RPO, round 2: new pairs sampled from round 1's model (rpo_4x_lora_1e4 of the same seed, which
    # runs 53% of its greedy searches past 144 tokens: pairs now rank a cut search (0) below a give-up (0.1)), on
    # prompts no earlier round saw (from 7,680 on), the same recipe trained from that model with it as the reference
    "rpo_4x_round2": dict(kind="dpo", loss_type="rpo", lora_r=16, lora_alpha=32.0, lr=1e-4, start_from="rpo_4x_lora_1e4",
                          pair_prompts=960, pair_offset=7680),
    # RPO-4x with a 5x larger beta: the beta = 0.1 runs raise accuracy (+0.04 / +0.11) but push the give-up answer's
    # log-prob down ~10 nats, so half the greedy searches never stop and are cut at 144 tokens (format point lost);
    # a larger beta saturates DPO's sigmoid at a smaller log-ratio margin, i.e. holds the policy nearer the SFT start
    "rpo_4x_beta05": dict(kind="dpo", loss_type="rpo", lora_r=16, lora_alpha=32.0, lr=1e-4, beta=0.5,
                          pairs_of="dpo_4x_lora_1e4"),
    # beta's sensitivity, one step further toward the SFT start (a validation screen after rpo_4x_beta05's confirmation)
    "rpo_4x_beta1": dict(kind="dpo", loss_type="rpo", lora_r=16, lora_alpha=32.0, lr=1e-4, beta=1.0,
                         pairs_of="dpo_4x_lora_1e4"),
    # the baseline: SFT continued on its own dataset for the wall-clock of an RL run
    "sft_continued": dict(kind="sft", lr=2e-5),
    # the baseline of grpo_filter_lora_1e4_60: continued SFT for that run's summed RL step time (same seed)
    "sft_continued_60": dict(kind="sft", lr=2e-5, budget_of="grpo_filter_lora_1e4_60"),
}


VALIDATION_START = 500
"""The validation tasks are held-out tasks 500 .. 999: never trained on (every stage excludes the first 1,000), and
disjoint from the protocol's test tasks (the first 500). Recipes are screened on them, then confirmed on the test tasks."""


def heldout(n: int, split: str = "test"):
    """The first ``n`` test tasks (held-out 0 ..), or with ``split="validation"`` the first ``n`` validation tasks
    (held-out 500 ..; at most 500)."""
    from rlft.tasks.countdown.generator import PRESETS, make_splits

    if split == "validation":
        if n > HELDOUT_SIZE - VALIDATION_START:
            raise SystemExit(f"the validation split has {HELDOUT_SIZE - VALIDATION_START} tasks, not {n}")
        return make_splits(PRESETS[PRESET], 0, VALIDATION_START + n, SPLIT_SEED)[1][VALIDATION_START:]
    return make_splits(PRESETS[PRESET], 0, n, SPLIT_SEED)[1]


def eval_name(mode: str, n: int, split: str = "test") -> str:
    """``eval_greedy_500.json`` (test tasks), ``eval_val_greedy_500.json`` (validation tasks)."""
    return f"eval_{'val_' if split == 'validation' else ''}{mode}_{n}.json"


REAL_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "countdown" / "train.parquet"
"""Countdown-Tasks-3to4 rows (no stage trains on them: every training task is generated ``medium3``)."""


def real_tasks(n_per_size: int) -> dict[str, list]:
    """The last ``n_per_size`` 3-number rows and the last ``n_per_size`` 4-number rows of the real
    Countdown-Tasks-3to4 file, as ``{"real3": [...], "real4": [...]}``; raises SystemExit when the file is absent."""
    from rlft.tasks.countdown.loaders import load_countdown, tail_by_size

    if not REAL_DATA.exists():
        raise SystemExit(f"--real needs {REAL_DATA} (Countdown-Tasks-3to4)")
    return {f"real{size}": tasks for size, tasks in tail_by_size(load_countdown(str(REAL_DATA)), n_per_size).items()}


def evaluate(model_dir: Path, out: Path, n: int, sampled: bool, seed: int = 0, real: int = 0,
             setting: Setting = SETTINGS["direct"], split: str = "test") -> dict:
    """Greedy (and sampled) evaluation of ``model_dir`` on the first n held-out tasks of ``split`` (:func:`heldout`),
    and with ``real`` > 0 greedy on ``real`` 3-number and ``real`` 4-number Countdown-Tasks-3to4 rows
    (``real3``/``real4``); cached in ``out`` (:func:`eval_name`)."""
    from rlft.eval.countdown import evaluate_countdown
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.rollout.base import SamplingParams
    from rlft.rollout.hf import HFEngine
    from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt

    length = setting.max_new_tokens
    modes = [("greedy", SamplingParams(k=1, temperature=0.0, max_new_tokens=length))]
    if sampled:
        modes.append(("sampled", SamplingParams(k=4, temperature=0.6, top_p=0.95, max_new_tokens=length, seed=seed)))
    results = {}
    held = heldout(n, split)
    task_sets = {mode: held for mode, _ in modes}
    if real:
        greedy = modes[0][1]
        for name, rows in real_tasks(real).items():
            modes.append((name, greedy))
            task_sets[name] = rows
    model = tokenizer = None
    for mode, params in modes:
        path = out / (f"eval_{mode}_{real}.json" if mode.startswith("real") else eval_name(mode, n, split))
        if path.exists():
            results[mode] = json.loads(path.read_text())
            continue
        if model is None:
            spec = pick_device("cpu", "float32")
            tokenizer, model = load_tokenizer(str(model_dir)), load_model(str(model_dir), spec)
        engine = HFEngine(model, tokenizer, batch_size=64, add_special_tokens=adds_special_tokens(PROMPT))
        t0 = time.perf_counter()
        tasks = task_sets[mode]
        result = evaluate_countdown(engine, tasks, [render_prompt(PROMPT, t, tokenizer) for t in tasks], params)
        data = {**result.to_dict(), "eval_s": time.perf_counter() - t0}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        results[mode] = data
        log.info("%s %s on %d %s tasks: score %.4f", model_dir, mode, len(tasks), split, result.mean_score)
    return results


def pairs_file(out: Path, name: str, seed: int) -> Path:
    """The pairs a DPO variant trains on: those of its ``pairs_of`` variant (itself when unset) for ``seed``."""
    return out / VARIANTS[name].get("pairs_of", name) / f"s{seed}" / "pairs.jsonl"


def start_model(name: str, seed: int, sft: Path, out: Path) -> Path:
    """The model variant ``name`` starts from for ``seed``, which is also its reference and (DPO) samples its pairs:
    ``sft``, or with ``start_from`` that variant's finished model of the same seed (SystemExit when it is missing)."""
    if "start_from" not in VARIANTS[name]:
        return sft
    model = out / VARIANTS[name]["start_from"] / f"s{seed}" / "run" / "model"
    if not model.is_dir():
        raise SystemExit(f"{name} starts from {model}, which does not exist: run {VARIANTS[name]['start_from']} "
                         f"for seed {seed} first")
    return model


def ensure_pairs(name: str, seed: int, sft: Path, out: Path, setting: Setting) -> Path:
    """The pairs file DPO variant ``name`` trains on for ``seed`` (:func:`pairs_file`), sampled when absent from the
    start (:func:`start_model`) of the variant that owns them (``pairs_of``, else ``name``): that variant's
    ``pair_prompts`` (default 960) training prompts from ``pair_offset + seed * pair_prompts`` on (offset default 0),
    ``pair_samples`` (default 2) samples each at T=1 (a killed sampling run continues from its journal,
    ``pairs.samples.jsonl``, when started again)."""
    from rlft.recipes.pairs import PairsConfig, make_countdown_pairs

    owner = VARIANTS[name].get("pairs_of", name)
    pair_spec = VARIANTS[owner]
    pairs = pairs_file(out, name, seed)
    if not pairs.exists():  # default: 960 prompts x 2 samples, as many samples as an RL run's 30 steps x 64
        pairs.parent.mkdir(parents=True, exist_ok=True)
        n_prompts = pair_spec.get("pair_prompts", 960)
        make_countdown_pairs(PairsConfig(model=str(start_model(owner, seed, sft, out)), preset=PRESET,
                                         num_prompts=n_prompts, start=pair_spec.get("pair_offset", 0) + seed * n_prompts,
                                         split_seed=SPLIT_SEED, heldout_size=HELDOUT_SIZE, prompt_template=PROMPT,
                                         num_samples=pair_spec.get("pair_samples", 2), temperature=1.0,
                                         max_new_tokens=setting.max_new_tokens, batch_size=128,
                                         output=str(pairs), seed=seed, device="cpu", dtype="float32"))
    return pairs


def run_variant(name: str, seed: int, sft: Path, out: Path, steps: int | None, n: int, sampled: bool, sft_step_s: float,
                real: int = 0, budget_from: Path | None = None, setting: Setting = SETTINGS["direct"],
                split: str = "test") -> None:
    """Train variant ``name`` for ``seed`` from ``sft`` (unless its model exists) and evaluate it on ``split``."""
    spec = VARIANTS[name]
    folder = out / name / f"s{seed}"
    if ((folder / eval_name("greedy", n, split)).exists() and (not sampled or (folder / eval_name("sampled", n, split)).exists())
            and (not real or (folder / f"eval_real4_{real}.json").exists())):
        return
    folder.mkdir(parents=True, exist_ok=True)
    model_dir = folder / "run" / "model"
    if not model_dir.exists():
        t0 = time.perf_counter()
        script_keys = ("kind", "budget_of", "pairs_of", "pair_prompts", "pair_samples", "pair_offset", "epochs",
                       "start_from")  # read here, not recipe options
        options = {k: v for k, v in spec.items() if k not in script_keys}
        start = start_model(name, seed, sft, out)
        if spec["kind"] == "rl":
            from rlft.recipes.rl import RLConfig, train_rl

            cfg = RLConfig(**{**rl_base(setting), **options, "model": str(start), "output_dir": str(folder / "run"),
                              "seed": seed,
                              "resume": (folder / "run" / "checkpoints").exists(),
                              # exact gradient accumulation: a run killed for memory may resume with a smaller micro-batch
                              "resume_override": ("micro_batch_size",), **({"max_steps": steps} if steps else {})})
            train_rl(cfg)
        elif spec["kind"] == "dpo":
            from rlft.recipes.dpo import DPOConfig, train_dpo

            pairs = ensure_pairs(name, seed, sft, out, setting)
            options.setdefault("beta", 0.1)
            train_dpo(DPOConfig(**options, model=str(start), data=str(pairs), output_dir=str(folder / "run"),
                                batch_size=32, micro_batch_size=setting.micro_batch_size, epochs=spec.get("epochs", 2.0), seed=seed,
                                save_every=5, keep_checkpoints=1, resume=(folder / "run" / "checkpoints").exists(),
                                device="cpu", dtype="float32"))
        else:  # continued SFT for the wall-clock of the matching RL run
            from rlft.recipes.sft import SFTConfig, train_sft

            if budget_from is not None:  # an archived RL run's metrics (e.g. docs/results/.../data/*_metrics.jsonl)
                budget = summed_step_seconds(budget_from)
            elif "budget_of" in spec:
                budget = rl_step_seconds(out / spec["budget_of"] / f"s{seed}")
            else:
                budget = rl_wallclock(out, seed)
            sft_steps = max(1, round(budget / sft_step_s))
            train_sft(SFTConfig(**options, model=str(sft), data="countdown", preset=PRESET, num_train=3000,
                                heldout_size=HELDOUT_SIZE, split_seed=SPLIT_SEED, trace_style=setting.trace_style,
                                give_up=setting.give_up, prompt_template=PROMPT,
                                output_dir=str(folder / "run"), batch_size=16, micro_batch_size=16, max_steps=sft_steps,
                                schedule="constant", warmup_ratio=0.0, seed=seed, save_every=50, keep_checkpoints=20,
                                resume=(folder / "run" / "checkpoints").exists(), device="cpu", dtype="float32"))
        (folder / "train_time.json").write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    evaluate(model_dir, folder, n, sampled, seed, real, setting, split)


def rl_step_seconds(folder: Path) -> float:
    """Summed ``time/step_s`` (sampling, reward, update, in-loop evaluation) of the finished RL run in ``folder``:
    its wall-clock less start-up and saving, also when it was resumed (its metrics keep the earlier steps)."""
    if not (folder / "run" / "model").exists():
        raise SystemExit(f"{folder} has no finished RL run (its step time is the continued-SFT budget)")
    return summed_step_seconds(folder / "run" / "metrics.jsonl")


def summed_step_seconds(metrics: Path) -> float:
    """Sum of ``time/step_s`` over the records of an RL run's ``metrics.jsonl``; SystemExit when there is none."""
    from rlft.checkpoint import read_metrics

    if not metrics.exists():
        raise SystemExit(f"{metrics} does not exist (the continued-SFT budget is its summed step time)")
    seconds = [r["time/step_s"] for r in read_metrics(metrics) if "time/step_s" in r]
    if not seconds:
        raise SystemExit(f"{metrics} has no time/step_s records (not an RL run's metrics)")
    return sum(seconds)


def rl_wallclock(out: Path, seed: int) -> float:
    """Median training seconds of the finished RL variants of ``seed`` (the continued-SFT budget)."""
    times = sorted(json.loads(p.read_text())["seconds"] for name, spec in VARIANTS.items() if spec["kind"] == "rl"
                   for p in [out / name / f"s{seed}" / "train_time.json"] if p.exists())
    if not times:
        raise SystemExit("sft_continued needs a finished RL variant of the same seed first (its wall-clock is the budget)")
    return times[len(times) // 2]


def seed_folders(out: Path, kind: str | None = None):
    """``(variant name, seed folder)`` of every variant in ``VARIANTS`` order (of ``kind`` only when given), seeds sorted."""
    for name, spec in VARIANTS.items():
        if (kind is None or spec["kind"] == kind) and (out / name).exists():
            yield from ((name, folder) for folder in sorted((out / name).glob("s*")))


def paired(a: dict, b: dict) -> dict:
    from rlft.eval.countdown import paired_difference

    return paired_difference(a["task_scores"], b["task_scores"])


def report(out: Path, n: int, sft_dir: Path, setting: Setting = SETTINGS["direct"]) -> str:
    """Markdown table of every finished variant/seed vs the SFT start, and a plot of score vs samples seen."""
    sft = evaluate(sft_dir, out / "sft_start", n, sampled=(out / "sft_start" / f"eval_sampled_{n}.json").exists(),
                   setting=setting)
    def real_cells(folder: Path) -> str:  # greedy score on the real 3- and 4-number rows, when evaluated
        cells = []
        for size in (3, 4):
            found = sorted(folder.glob(f"eval_real{size}_*.json"))
            cells.append(f"{json.loads(found[-1].read_text())['mean_score']:.3f}" if found else "-")
        return " | ".join(cells)

    def pass_cells(result: dict | None) -> str:  # sampled pass@1 and pass@4, when evaluated
        return " | ".join(f"{result['pass_at_k'][k]:.3f}" if result else "-" for k in ("1", "4"))

    rows = ["| variant | seed | greedy score | paired vs SFT [95% CI] | better/worse | sampled score | pass@1 | pass@4 | "
            "real 3-num | real 4-num | train s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    s = sft["greedy"]
    sampled = sft.get("sampled")
    sampled_cell = f"{sampled['mean_score']:.3f}" if sampled else "-"
    rows.append(f"| SFT start | - | {s['mean_score']:.3f} | - | - | {sampled_cell} | {pass_cells(sampled)} | "
                f"{real_cells(out / 'sft_start')} | - |")
    for name, folder in seed_folders(out):
        path = folder / f"eval_greedy_{n}.json"
        if not path.exists():
            continue
        g = json.loads(path.read_text())
        d = paired(g, s)
        sp = folder / f"eval_sampled_{n}.json"
        smp = json.loads(sp.read_text()) if sp.exists() else None
        t = json.loads((folder / "train_time.json").read_text())["seconds"] if (folder / "train_time.json").exists() else float("nan")
        extra = "-"
        if smp and sampled:
            ds = paired(smp, sampled)
            extra = f"{smp['mean_score']:.3f} ({ds['diff']:+.3f} [{ds['ci_low']:+.3f}, {ds['ci_high']:+.3f}])"
        rows.append(f"| {name} | {folder.name[1:]} | {g['mean_score']:.3f} | {d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | "
                    f"{d['better']}/{d['worse']} | {extra} | {pass_cells(smp)} | {real_cells(folder)} | {t:.0f} |")
    return "\n".join(rows)


def churn(out: Path, n: int) -> str:
    """Which held-out tasks the finished variants flip: per run, tasks whose greedy score changed vs the SFT
    start (up / down), the tasks changed by any run, and the mean pairwise Pearson correlation of the runs'
    per-task differences (near 0: each run flips its own tasks; near 1: every run flips the same ones)."""
    import itertools
    import statistics

    start = [row[0] for row in json.loads((out / "sft_start" / f"eval_greedy_{n}.json").read_text())["task_scores"]]
    diffs = {}
    for name, folder in seed_folders(out):  # the variants' finished seeds, as report() lists them
        if (path := folder / f"eval_greedy_{n}.json").exists():
            diffs[f"{name} {folder.name}"] = [row[0] - s0 for row, s0 in zip(json.loads(path.read_text())["task_scores"], start)]
    lines = [f"{name}: {sum(d != 0 for d in v)} changed ({sum(d > 0 for d in v)} up, {sum(d < 0 for d in v)} down)"
             for name, v in diffs.items()]
    changed = sum(any(v[i] != 0 for v in diffs.values()) for i in range(len(start)))
    pairs = [statistics.correlation(a, b) for a, b in itertools.combinations(diffs.values(), 2)]
    lines.append(f"tasks changed by any run: {changed} of {len(start)}; per-task differences, mean pairwise "
                 f"correlation {statistics.fmean(pairs):.2f} (min {min(pairs):.2f}, max {max(pairs):.2f}) over {len(pairs)} pairs")
    return "\n".join(lines)


def sft_curve(run: Path, out: Path, n: int, every: int, setting: Setting = SETTINGS["direct"]) -> list[dict]:
    """Greedy held-out score of an SFT run's checkpoints (every ``every`` steps) and final model: the
    convergence curve. Cached per checkpoint in ``out/sft_curve/step-N``; plotted to ``out/sft_curve.png``."""
    from rlft.checkpoint import read_metrics
    from rlft.eval.report import plot_curve

    points = []
    for ckpt in sorted((run / "checkpoints").glob("step-*")):
        step = int(ckpt.name.split("-")[1])
        if step % every == 0:
            points.append((step, ckpt))
    final_step = max((r["step"] for r in read_metrics(run / "metrics.jsonl")), default=0)
    if (run / "model").exists():
        points.append((final_step, run / "model"))
    curve = []
    for step, folder in points:
        result = evaluate(folder, out / "sft_curve" / f"step-{step}", n, sampled=False, setting=setting)["greedy"]
        curve.append({"step": step, "score": result["mean_score"], "accuracy": result["accuracy"]})
    (out / "sft_curve.json").write_text(json.dumps(curve, indent=2))
    plot_curve([{"step": c["step"], "eval/score": c["score"]} for c in curve], "eval/score", out / "sft_curve.png",
               title=f"SFT on 3,000 medium3 traces: greedy score on {n} held-out tasks", smooth=10**6)
    return curve


def plot_samples_vs_score(out: Path, n_curve: int = 100) -> Path | None:
    """Held-out greedy score (the first ``n_curve`` tasks, logged by the RL loop every 10 steps) against
    samples generated, one line per RL variant/seed, starting at the SFT model's score; ``out/samples_vs_score.png``."""
    from rlft.checkpoint import read_metrics
    from rlft.eval.report import plot_samples_vs_score as plot_runs

    start = None  # the SFT model's score on the same first n_curve tasks (a prefix of a larger greedy evaluation)
    for path in sorted((out / "sft_start").glob("eval_greedy_*.json")):
        scores = json.loads(path.read_text())["task_scores"]
        if len(scores) >= n_curve:
            start = sum(row[0] for row in scores[:n_curve]) / n_curve
            break
    runs = {f"{name} s{folder.name[1:]}": read_metrics(folder / "run" / "metrics.jsonl") for name, folder in seed_folders(out, "rl")}
    return plot_runs(runs, out / "samples_vs_score.png", start=start, ylabel=f"greedy score ({n_curve} held-out tasks)",
                     title="Held-out score against samples seen")


def samples_generated(out: Path, name: str, folder: Path) -> int | None:
    """Samples a variant/seed generated before its update: an RL run's ``samples/total``, a DPO run's pair prompts x
    samples per prompt (``pairs.stats.json`` of the variant whose pairs it trains on) plus those of the variant it
    starts from (``start_from``), 0 for continued SFT (it trains on its fixed dataset); None when a record is missing."""
    from rlft.checkpoint import read_metrics

    spec = VARIANTS[name]
    if spec["kind"] == "rl":
        records = read_metrics(folder / "run" / "metrics.jsonl")
        return records[-1]["samples/total"] if records else None
    if spec["kind"] == "dpo":
        from rlft.recipes.pairs import stats_path

        stats = stats_path(pairs_file(out, name, int(folder.name[1:])))
        if not stats.exists():
            return None
        stats = json.loads(stats.read_text())
        own = stats["prompts"] * stats["samples_per_prompt"]
        if "start_from" not in spec:
            return own
        earlier = samples_generated(out, spec["start_from"], out / spec["start_from"] / folder.name)
        return None if earlier is None else own + earlier
    return 0


def plot_paired(out: Path, n: int) -> Path | None:
    """Every finished variant/seed's greedy score on the ``n`` held-out tasks, paired against the SFT start (mean
    difference with its 95% interval), against the samples it generated (``samples_generated``; variants sharing an
    x are spread a little apart, seeds too), with the issue's +0.05 bar; ``out/paired_vs_samples.png`` (None when no run is
    finished)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sft = out / "sft_start" / f"eval_greedy_{n}.json"
    if not sft.exists():
        return None
    start = json.loads(sft.read_text())
    points = {}
    for name, folder in seed_folders(out):
        path, x = folder / f"eval_greedy_{n}.json", samples_generated(out, name, folder)
        if path.exists() and x is not None:
            d = paired(json.loads(path.read_text()), start)
            points.setdefault(name, []).append((x, d["diff"], d["ci_low"], d["ci_high"]))
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.set_prop_cycle(color=plt.cm.tab10.colors)
    span = max(x for rows in points.values() for x, *_ in rows) or 1
    total, drawn = sum(map(len, points.values())), 0
    for name, rows in points.items():
        xs, ys, lo, hi = zip(*rows)
        xs = [x + (drawn + i - total / 2) * span / 100 for i, x in enumerate(xs)]  # every point its own x
        drawn += len(rows)
        ax.errorbar(xs, ys, yerr=[[y - l for y, l in zip(ys, lo)], [h - y for y, h in zip(ys, hi)]], fmt="o", capsize=3,
                    label=f"{name} ({len(rows)} seed{'s' if len(rows) > 1 else ''})")
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=1, label="SFT start")
    ax.axhline(0.05, color="black", linestyle=":", linewidth=1, label="issue's bar (+0.05)")
    ax.set_xlabel("samples generated (continued SFT: 0, it trains on its dataset for RL's compute)")
    ax.set_ylabel(f"greedy score - SFT start ({n} tasks, 95% CI)")
    ax.set_title("Every run on the held-out tasks, paired against the SFT start")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path = out / "paired_vs_samples.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


ARCHIVED = re.compile(r"^(?P<name>.+?)_s(?P<seed>\d+)_(?P<file>eval_.+\.json|metrics\.jsonl|pairs_stats\.json|train_time\.json)$")
"""An archived run file, ``<variant>_s<seed>_<file>`` (docs/results/countdown-bounded/data)."""
UNPACKED_AS = {"metrics.jsonl": "run/metrics.jsonl", "pairs_stats.json": "pairs.stats.json"}
"""Where an archived file goes inside ``<variant>/s<seed>/`` when its run folder names it differently."""


def unpack_archive(archive: Path, out: Path) -> int:
    """Copy an archive's run files into the ``out/<variant>/s<seed>/`` layout that ``report`` and the plots read:
    ``eval_*.json`` and ``train_time.json`` as they are, ``metrics.jsonl`` to ``run/metrics.jsonl``, ``pairs_stats.json``
    to ``pairs.stats.json``; ``sft_start_eval_*.json`` to ``sft_start/``. Files of unknown variants and files already
    in ``out`` are left alone. Returns the number of files copied."""
    import shutil

    copied = 0
    for path in sorted(archive.iterdir()):
        if path.name.startswith("sft_start_eval_"):
            target = out / "sft_start" / path.name.removeprefix("sft_start_")
        elif (m := ARCHIVED.match(path.name)) and m["name"] in VARIANTS:
            target = out / m["name"] / f"s{m['seed']}" / UNPACKED_AS.get(m["file"], m["file"])
        else:
            continue
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            copied += 1
    return copied


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "pairs", "report", "list", "sft-curve", "churn", "compare", "unpack"],
                        help="run: train and evaluate; pairs: only sample the DPO variants' pairs; report: the table "
                             "and plots; unpack: copy an archive's run files (--archive) into --out, for report")
    parser.add_argument("--archive", type=Path, default=Path("docs/results/countdown-bounded/data"),
                        help="unpack: the folder of archived <variant>_s<seed>_<file> run files")
    parser.add_argument("--pair", nargs=2, type=Path, metavar=("A", "B"),
                        help="compare: two eval_*.json files of the same tasks; prints A minus B, paired, with its 95%% CI")
    parser.add_argument("--sft-run", type=Path, default=Path("runs/exp/sft"), help="sft-curve: the SFT run folder")
    parser.add_argument("--every", type=int, default=50, help="sft-curve: evaluate every N-th step's checkpoint")
    parser.add_argument("--sft", type=Path, default=Path("runs/exp/sft/model"))
    parser.add_argument("--out", type=Path, default=Path("runs/ablation"))
    parser.add_argument("--variants", nargs="*", default=[])
    parser.add_argument("--seeds", nargs="*", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: rl_base()'s)")
    parser.add_argument("--tasks", type=int, default=200, help="held-out tasks scored (the first N of the 500+ set)")
    parser.add_argument("--sampled", action="store_true", help="also the sampled evaluation (T=0.6, top-p 0.95, 4 samples)")
    parser.add_argument("--real", type=int, default=0, help="also greedy on N 3-number and N 4-number real Countdown-Tasks-3to4 rows")
    parser.add_argument("--sft-step-s", type=float, default=6.0, help="seconds per SFT step (for the continued-SFT budget)")
    parser.add_argument("--no-start-eval", action="store_true",
                        help="run: do not evaluate the SFT start first (another process does; runs side by side)")
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="direct",
                        help="the SFT traces' style and the generation length (direct: sessions 5-12; bounded: session 13 on)")
    parser.add_argument("--split", choices=["test", "validation"], default="test",
                        help="run: evaluate on the test tasks (held-out 0 .., the protocol) or the validation tasks "
                             "(held-out 500 .., for screening recipes)")
    parser.add_argument("--budget-from", type=Path, default=None,
                        help="continued SFT: the budget is this RL metrics.jsonl's summed step time (e.g. an archived run's)")
    args = parser.parse_args(argv)
    setting = SETTINGS[args.setting]
    from rlft.console import setup_logging

    setup_logging()
    if args.command == "sft-curve":
        for point in sft_curve(args.sft_run, args.out, args.tasks, args.every, setting):
            print(point)
        return
    if args.command == "compare":
        if not args.pair:
            parser.error("compare needs --pair A B")
        a, b = (json.loads(path.read_text()) for path in args.pair)
        d = paired(a, b)
        print(f"{args.pair[0]} ({a['mean_score']:.3f}) minus {args.pair[1]} ({b['mean_score']:.3f}) on {d['n']} tasks: "
              f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], better/worse {d['better']}/{d['worse']}")
        return
    if args.command == "unpack":
        print(f"{unpack_archive(args.archive, args.out)} files copied from {args.archive} into {args.out}")
        return
    if args.command == "churn":
        print(churn(args.out, args.tasks))
        return
    if args.command == "list":
        print("\n".join(f"{k}: {v}" for k, v in VARIANTS.items()))
        return
    if args.command == "pairs":
        for seed in args.seeds:
            for name in args.variants:
                if VARIANTS.get(name, {}).get("kind") != "dpo":
                    sys.exit(f"pairs: {name!r} is not a DPO variant")
                print(ensure_pairs(name, seed, args.sft, args.out, setting))
        return
    if args.command == "run":
        if not args.no_start_eval:
            evaluate(args.sft, args.out / "sft_start", args.tasks, args.sampled, real=args.real, setting=setting,
                     split=args.split)
        for seed in args.seeds:
            for name in args.variants:
                if name not in VARIANTS:
                    sys.exit(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
                run_variant(name, seed, args.sft, args.out, args.steps, args.tasks, args.sampled, args.sft_step_s, args.real,
                            args.budget_from, setting, args.split)
        if args.no_start_eval:
            return
    print(report(args.out, args.tasks, args.sft, setting))
    if args.command == "report":
        print(plot_samples_vs_score(args.out))
        print(plot_paired(args.out, args.tasks))


if __name__ == "__main__":
    main()
