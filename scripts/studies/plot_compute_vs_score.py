"""Held-out greedy score against training compute after the SFT start, SFT and RL on one axis.

Reads only the archived files of ``docs/results/countdown-medium3/data`` and writes
``docs/results/countdown-medium3/compute_vs_score.png``:

    python scripts/studies/plot_compute_vs_score.py [--data DIR] [--out PNG] [--sft-step-s 6.5] [--overwrite]

x: CPU seconds of training counted from the SFT start's own first step (SFT steps at ``--sft-step-s``
each; an RL run at its summed ``time/step_s``, in-loop evaluation included). y: greedy mean score on the
500 protocol tasks with the 95% interval of the mean (unpaired: :func:`rlft.eval.countdown.paired_difference`
against a zero score; paired differences, in the write-up and ``rlft eval compare``, are tighter). The SFT start's
own curve was scored on the first 200 tasks only and is drawn dashed. A missing or unreadable archived file: one line
naming it, exit 2 (:mod:`rlft.lab.script_io`); so is an ``--out`` that is not a picture, is one of the archived
files, or exists without ``--overwrite`` (the default ``--out`` exists: rebuilding it takes ``--overwrite``).
(``converged_2026-11-24/``, ``rl60_2026-11-24/``, ``dpo4x_2026-11-25/`` are the archive's folders.)
"""

from __future__ import annotations

from pathlib import Path

from rlft.checkpoint import read_metrics
from rlft.compute import summed_step_seconds  # the continued-SFT budget's own sum
from rlft.eval.countdown import mean_interval
from rlft.lab.script_io import ArgumentParser, check_outputs, check_picture, fail, read_json, run_script

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "results" / "countdown-medium3" / "data"
START_STEPS = 300  # the SFT start's steps
PARALLEL_SLOWDOWN = 12.4 / 6.9  # s per SFT step: two 1-thread processes side by side vs one 2-thread process


def load(path: Path):
    """An archived JSON file. Raises ValueError naming it when it is missing or not JSON
    (rlft.lab.script_io.read_json)."""
    return read_json(path, "an archived file of docs/results/countdown-medium3/data")


def mean_ci(path: Path) -> tuple[float, float]:
    """Mean per-task score of an eval file and the half-width of its 95% normal interval (the one rule of
    :func:`rlft.eval.countdown.paired_difference`, against a score of 0 on every task: sd of the task means /
    sqrt(N))."""
    data = load(path)
    if not isinstance(data, dict) or not data.get("task_scores"):
        fail(f"{path}: no task_scores (not an `rlft eval countdown` JSON)")
    return mean_interval(data["task_scores"])


def sft_steps(metrics: Path) -> int:
    """How many SFT steps an archived SFT ``metrics.jsonl`` logged (records with ``loss/sft``)."""
    if not metrics.exists():
        fail(f"{metrics} does not exist (an archived file of docs/results/countdown-medium3/data)")
    return sum("loss/sft" in r for r in read_metrics(metrics))


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=DATA.parent / "compute_vs_score.png")
    parser.add_argument("--sft-step-s", type=float, default=6.5)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    check_picture("--out", args.out)
    data = args.data.expanduser()
    inputs = sorted(p for p in data.rglob("*") if p.is_file()) if data.is_dir() else []  # never the picture
    check_outputs({"--out": args.out}, inputs, overwrite=args.overwrite)
    d, step_s = args.data, args.sft_step_s
    s10, s11, s12 = (d / n for n in ("converged_2026-11-24", "rl60_2026-11-24", "dpo4x_2026-11-25"))
    start_x = START_STEPS * step_s
    # the step-864 model the "from continued" runs start from: sft_continued_60 seed 1's end
    conv_x = start_x + sft_steps(d / "sft_continued_60_s1_metrics.jsonl") * step_s

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    curve = load(d / "sft_curve.json")
    ax.plot([c["step"] * step_s for c in curve], [c["score"] for c in curve], "--", color="grey",
            label="SFT start's run, lr 2e-4 cosine (first 200 tasks)")

    def point(x: float, path: Path, **style) -> tuple[float, float]:
        y, half = mean_ci(path)
        ax.errorbar([x], [y], yerr=[half], capsize=3, **style)
        return x, y

    start = point(start_x, d / "sft_start_eval_greedy_500.json", fmt="ks", label="SFT start (step 300)")
    # continued SFT at constant 2e-5: seed 1's checkpoint curve, seed 0's end point
    xs, ys = [start[0]], [start[1]]
    for c in load(s10 / "continued_60_s1_curve.json"):
        x, y = point(start_x + c["step"] * step_s, s10 / f"continued_60_s1_step-{c['step']}_eval_greedy_500.json",
                     fmt="o", color="tab:blue", label="continued SFT, const 2e-5, seed 1" if c["step"] == 100 else None)
        xs.append(x), ys.append(y)
    ax.plot(xs, ys, color="tab:blue", alpha=0.6)
    conv_y = ys[-1]  # the curve's last checkpoint (564) is the step-864 model
    # seed 0's metrics were not archived: its steps are its budget, RL-60 seed 0's summed step time / 6.5 s (540)
    seed0 = point(start_x + round(summed_step_seconds(d / "grpo_filter_lora_1e4_60_s0_metrics.jsonl") / 6.5) * step_s,
                  d / "sft_continued_60_s0_eval_greedy_500.json", fmt="D", color="tab:cyan",
                  label="continued SFT, seed 0")
    ax.plot([start[0], seed0[0]], [start[1], seed0[1]], color="tab:cyan", alpha=0.6)
    # RL from the SFT start: 20- and 60-step runs, both seeds
    for steps, marker in (("", "^"), ("_60", "v")):
        for seed in (0, 1):
            name = f"grpo_filter_lora_1e4{steps}_s{seed}"
            point(start_x + summed_step_seconds(d / f"{name}_metrics.jsonl"), d / f"{name}_eval_greedy_500.json",
                  fmt=marker, color="tab:red",
                  label=f"RL from the start ({'60' if steps else '20'} steps, seeds 0/1)" if seed == 0 else None)
    # from the step-864 continued model: RL 15 steps and continued SFT for RL's wall-clock, per seed
    for seed in (0, 1):
        rl, sft = f"from_continued_grpo_filter_lora_1e4_s{seed}", f"from_continued_sft_continued_s{seed}"
        point(conv_x + summed_step_seconds(s10 / f"{rl}_metrics.jsonl"), s10 / f"{rl}_eval_greedy_500.json", fmt="P",
              color="tab:orange", label="RL 15 steps from continued SFT (per seed)" if seed == 1 else None)
        point(conv_x + sft_steps(s10 / f"{sft}_metrics.jsonl") * step_s, s10 / f"{sft}_eval_greedy_500.json", fmt="X",
              color="tab:green", label="more SFT from continued SFT, RL's wall-clock (per seed)" if seed == 1 else None)
        # rl60_2026-11-24/: the same RL runs continued to 60 steps (resumed from their step-10 checkpoints)
        rl60 = f"from_continued_grpo_filter_lora_1e4_60_s{seed}"
        point(conv_x + summed_step_seconds(s11 / f"{rl60}_metrics.jsonl"), s11 / f"{rl60}_eval_greedy_500.json",
              fmt="*", markersize=9, color="tab:purple",
              label="RL 60 steps from continued SFT (per seed)" if seed == 1 else None)
        sft60 = f"from_continued_sft_continued_60_s{seed}"  # and more SFT for those 60 steps' summed step time
        point(conv_x + sft_steps(s11 / f"{sft60}_metrics.jsonl") * step_s, s11 / f"{sft60}_eval_greedy_500.json",
              fmt="p", markersize=8, color="tab:olive",
              label="more SFT from continued SFT, RL-60's wall-clock (per seed)" if seed == 1 else None)
    # dpo4x_2026-11-25/: DPO from the step-864 model on 1,920 prompts x 4 samples' best-vs-worst pairs. Its seconds
    # (pairs + training) ran at 1 thread beside other 1-thread jobs: divided by PARALLEL_SLOWDOWN for the 2-thread axis
    for seed in (0,):  # seed 1's DPO was not run (killed for memory beside seed 0, then out of time)
        dpo = f"from_continued_dpo_wide_lora_1e4_s{seed}"
        point(conv_x + load(s12 / f"{dpo}_train_time.json")["seconds"] / PARALLEL_SLOWDOWN,
              s12 / f"{dpo}_eval_greedy_500.json", fmt="h", markersize=8, color="tab:brown",
              label="DPO from continued SFT, 7.7k samples' pairs (seed 0)")
    ax.axhline(start[1] + 0.05, color="red", lw=0.8, ls=":", label="step-300 SFT start + 0.05 (issue bar)")
    ax.axhline(conv_y + 0.05, color="darkred", lw=0.8, ls="-.", label="step-864 model + 0.05 (bar from the plateau)")
    ax.set_xlabel(f"training CPU seconds from the SFT run's first step (SFT steps at {step_s} s)")
    ax.set_ylabel("greedy score, 500 held-out medium3 tasks (95% CI)")
    ax.set_title("SmolLM2-135M on medium3: held-out score against training compute")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    print(args.out)


if __name__ == "__main__":
    run_script(main)
