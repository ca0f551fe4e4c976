"""One RL step of the Countdown recipe, before and after continuous batching and the loop stop, on one machine.

The step is the study recipe's (``docs/results/countdown-real``: GRPO advantages, PPO-clip loss, sequence-mean
aggregation, group filtering with up to 3 prompt batches, LoRA r=16 at lr 2e-4, 8 prompts x k=8 at T=1, 256 new
tokens, ``--dtype auto``: bf16 sampling copy and autocast on a bf16 CPU), on Countdown-Tasks-3to4 training rows,
from ``--model``. The arms run in turn, each ``rlft rl`` for ``--steps`` steps in its own folder:

- ``before``: today's decoder before continuous batching (``HFEngine(decoder="drop")``: finished rows leave the
  batch, none join it), no loop stop (``--stop-repeats None``), and the loss's micro-batches in row order
  (``micro_batches(by_length=False)``: a group's k samples together, as before 2026-11-28);
- ``after``: rlft's defaults (HFEngine's CPU default for sampling, ``refill``: a finished row's place goes to a
  waiting job; ``--stop-repeats 5``; micro-batches by length, :func:`rlft.rl.batch.micro_batches`);
- ``after-compile`` (with ``--compile-arm``): the after arm with ``--compile``: the loss passes run the decoder layers
  through ``torch.compile`` (inductor: C++ kernels on a CPU), sampling runs them eager. Step 1 compiles.

Each arm decodes ``--before-rows`` / ``--after-rows`` sequences together (``rlft rl --gen-batch-size``; 64 both by
default, the study's setting; ``--before-rows 32`` is ``rlft rl``'s default before 2026-11-28).

The arms draw different random numbers (refill seeds each job; drop uses the global RNG), so their samples, rewards
and group filtering differ: read the step time with the tokens generated beside it. Step 1 of each arm is warm-up
and not counted; printed per arm: the median of ``time/step_s`` over the other steps, the mean
``tokens/generated`` and ``completion/looped_frac`` per step, the medians of ``time/generate_s`` and
``time/update_s``, and the update's rate (mean ``tokens/trained`` over the median update seconds: the loss's
micro-batches show there). ``--rounds 2`` runs before, after, before, after.

    python bench/rl_step.py --model runs/demo/filtered/model --steps 3 \\
        --output docs/results/speed/data/rl_step_<date>.txt
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

from rlft.fsio import atomic_write_text
from rlft.lab.script_io import ArgumentParser, check_outputs, run_script

ARMS = ("before", "after")
COMPILED = "after-compile"


def run_arm(arm: str, args, out: Path) -> dict:
    """``rlft rl`` for ``args.steps`` steps in ``out``, sampling as ``arm`` says; the per-step metrics, step 1 left
    out."""
    import functools

    import rlft.rl.batch as rl_batch
    import rlft.rollout.hf as hf
    from rlft.recipes.rl import train_rl
    from rlft.rl.config import RLConfig
    from rlft.rl.options import SamplingOptions

    original, original_micro_batches = hf.HFEngine.__init__, rl_batch.micro_batches

    def drop_decoder(self, *a, **k):
        original(self, *a, **{**k, "decoder": "drop"})

    if arm == "before":
        hf.HFEngine.__init__ = drop_decoder
        rl_batch.micro_batches = functools.partial(original_micro_batches, by_length=False)
    try:
        train_rl(
            RLConfig(model=args.model, data=args.data, prompt_template="short", preset="standard", heldout_size=1000,
                     advantage="grpo", loss="ppo", loss_mode="seq_mean", filter_groups=True, max_prompt_batches=3,
                     lora_r=16, lora_alpha=32.0, lr=2e-4, k=8, prompts_per_step=8, temperature=1.0, beta=0.0,
                     max_new_tokens=args.max_new_tokens, micro_batch_size=8, gen_batch_size=args.before_rows
                     if arm == "before" else args.after_rows, max_steps=args.steps, eval_every=0, eval_at_start=False,
                     save_every=0, num_train=20000, seed=args.seed, output_dir=str(out),
                     stop_repeats=None if arm == "before" else SamplingOptions.stop_repeats, compile=arm == COMPILED))
    finally:
        hf.HFEngine.__init__, rl_batch.micro_batches = original, original_micro_batches
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "time/step_s" in r and r["step"] > 1]


def summary(arm: str, steps: list[dict]) -> str:
    seconds = [r["time/step_s"] for r in steps]
    tokens = statistics.mean(r["tokens/generated"] for r in steps)
    looped = statistics.mean(r.get("completion/looped_frac", 0.0) for r in steps)
    generate_s = statistics.median(r["time/generate_s"] for r in steps)
    update_s = statistics.median(r["time/update_s"] for r in steps)
    trained = statistics.mean(r["tokens/trained"] for r in steps)
    return (f"arm={arm} timed_steps={len(steps)} step_s={statistics.median(seconds):.2f} (median; all: "
            f"{', '.join(f'{s:.1f}' for s in seconds)}) generated_tokens_per_step={tokens:.0f} "
            f"tokens_per_s={tokens / statistics.median(seconds):.1f} looped_frac={looped:.3f} "
            f"generate_s={generate_s:.1f} update_s={update_s:.1f} trained_tokens_per_step={trained:.0f} "
            f"trained_tokens_per_update_s={trained / update_s:.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the RL start (a model folder)")
    parser.add_argument("--data", default="../shared/data/countdown/train.parquet", help="Countdown-Tasks-3to4 rows")
    parser.add_argument("--steps", type=int, default=3, help="steps per arm; step 1 is warm-up")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--before-rows", type=int, default=64, help="the before arm's --gen-batch-size")
    parser.add_argument("--after-rows", type=int, default=64, help="the after arm's --gen-batch-size")
    parser.add_argument(
        "--compile-arm", action="store_true",
        help=f"a third arm, {COMPILED!r}: the after arm with --compile (decoder layers through torch.compile "
        "for the loss passes; step 1 compiles)")
    parser.add_argument("--output", type=Path, default=None, help="also write the printed lines here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)  # before any work
    if args.steps < 2:
        parser.error("--steps must be >= 2 (step 1 is warm-up)")
    lines = [f"# bench/rl_step.py --model {args.model} --steps {args.steps} --rounds {args.rounds} "
             f"--max-new-tokens {args.max_new_tokens} --before-rows {args.before_rows} --after-rows {args.after_rows}"
             f"{' --compile-arm' if args.compile_arm else ''}; "
             f"{platform.processor() or platform.machine()}"]
    arms = ARMS + ((COMPILED,) if args.compile_arm else ())
    per_arm: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in arms:
                steps = run_arm(arm, args, Path(tmp) / f"{arm}-{r}")
                per_arm[arm] += steps
                lines.append(f"round={r} " + summary(arm, steps))
                print(lines[-1], flush=True)
    for arm in arms:
        lines.append("all " + summary(arm, per_arm[arm]))
    medians = {arm: statistics.median(r["time/step_s"] for r in per_arm[arm]) for arm in arms}
    for arm in arms[1:]:
        lines.append(f"before / {arm} step time = {medians['before']:.2f} / {medians[arm]:.2f} = "
                     f"{medians['before'] / medians[arm]:.2f}x")
    print("\n".join(lines[-2 * len(arms) + 1:]))
    if args.output is not None:
        atomic_write_text(args.output.expanduser(), "\n".join(lines) + "\n")


if __name__ == "__main__":  # a bad option, an existing --output: one line, exit 2
    run_script(main)
