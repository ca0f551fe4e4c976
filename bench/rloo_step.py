"""RLOO step throughput and peak memory: rlft's recipe vs TRL's ``RLOOTrainer``, same work per step.

One optimizer step = sample k completions for each of P Countdown prompts (transformers ``generate``,
temperature T, at most N new tokens), score them with the Countdown rule reward, and one REINFORCE
update with the leave-one-out baseline over all P*k samples (micro-batches of M, AdamW, beta = 0 so
neither side holds a reference model). Both sides load the same model with the same weights' dtype, without
gradient checkpointing, and see the same prompts in the same order.

Precision: ``--dtype`` is rlft's (auto: bfloat16 weights on CUDA; on a CPU with native bf16 float32 weights,
bfloat16 autocast for the update's forwards and sampling from a bfloat16 copy; float32), also the weights TRL
is given; ``--trl-precision`` is TRL's ``bf16`` flag (default: unset, which TRL >= 0.20 turns on unless fp16 is;
bf16; float32). The printed line says which ran.

Prints seconds per step (median over the timed steps; step 1 is warm-up and not timed), completions/s,
generated tokens/s and peak memory (CUDA: allocator peak; CPU: process max RSS, which only grows, so
run each side in its own process: --path).

    python bench/rloo_step.py --path rlft --model runs/countdown/sft/model --steps 4                  # --dtype auto
    python bench/rloo_step.py --path rlft --model runs/countdown/sft/model --steps 4 --dtype float32
    python bench/rloo_step.py --path trl  --model runs/countdown/sft/model --steps 4                  # TRL's default
    python bench/rloo_step.py --path trl  --model runs/countdown/sft/model --steps 4 --trl-precision float32

Differences that remain: rlft skips the forward/backward of samples whose advantage is exactly zero
(their gradient is zero when beta = 0), which TRL computes; rlft's step time includes the reward
and logging, TRL's (a callback's step begin/end) includes its own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from benchlib import add_precision_options, peak_memory, step_timer, trl_precision

from rlft.models import pick_device
from rlft.rewards.countdown import score_completions


def rloo_config(args, out: Path):
    """rlft's RLOO config for this benchmark (the TRL side reads its prompts and their order from it too)."""
    from rlft.rl.config import rloo_config as rlft_rloo_config

    return rlft_rloo_config(
        model=args.model,
        preset=args.preset,
        num_train=args.num_train,
        split_seed=args.split_seed,
        prompt_template=args.prompt_template,
        output_dir=str(out),
        k=args.k,
        prompts_per_step=args.prompts_per_step,
        max_steps=args.steps + 1,
        lr=args.lr,
        beta=0.0,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        micro_batch_size=args.micro_batch_size,
        gen_batch_size=args.prompts_per_step * args.k,
        save_every=0,
        eval_every=0,
        seed=args.seed,
        dtype=args.dtype,
    )  # fmt: skip


def run_rlft(args, out: Path) -> list[dict]:
    """Per-step records ``{"step_s", "completions", "completion_tokens"}`` from rlft's RLOO recipe."""
    from rlft.recipes.rl import train_rl

    train_rl(rloo_config(args, out))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    n = args.prompts_per_step * args.k
    return [{"step_s": r["time/step_s"], "completions": n, "completion_tokens": r["completion/mean_tokens"] * n}
            for r in rows]


def run_trl(args, out: Path) -> list[dict]:
    """The same per-step records from TRL's ``RLOOTrainer`` (timed by a callback), on rlft's prompts in rlft's order."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import RLOOConfig, RLOOTrainer

    from rlft.models import load_model, load_tokenizer
    from rlft.recipes.common import batch_indices
    from rlft.rl.prompts import load_prompts

    spec = pick_device("auto", args.dtype)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, spec)
    cfg = rloo_config(args, out)
    prompts, _, _ = load_prompts(cfg, tokenizer)
    order = [
        i for step in range(cfg.max_steps) for i in batch_indices(step, len(prompts), cfg.prompts_per_step, cfg.seed)
    ]
    dataset = Dataset.from_list([{"prompt": prompts[i].text, **prompts[i].ground_truth} for i in order
                                 ])  # prompt, target, numbers

    def countdown_reward(prompts, completions, target, numbers, **_) -> list[float]:
        truths = [{"target": t, "numbers": n} for t, n in zip(target, numbers)]
        return score_completions(prompts, completions, truths)

    times: list[float] = []
    lengths: list[float] = []  # mean completion tokens of each step, from TRL's own log

    class CompletionLengths(TrainerCallback):
        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    config = RLOOConfig(
        output_dir=str(out),
        max_steps=args.steps + 1,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        num_generations=args.k,
        per_device_train_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=args.prompts_per_step * args.k // args.micro_batch_size,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        gradient_checkpointing=False,
        use_cpu=spec.device.type != "cuda",
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        max_grad_norm=1.0,
        weight_decay=0.0,
        warmup_steps=0,
        **trl_precision(args),
    )  # fmt: skip
    args.precision = f"trl bf16={config.bf16} (weights {spec.dtype})"
    RLOOTrainer(model=model, reward_funcs=countdown_reward, args=config, train_dataset=dataset,
                processing_class=tokenizer, callbacks=[step_timer(spec.device, times),
                                                       CompletionLengths()]).train()
    n = args.prompts_per_step * args.k
    return [{"step_s": t, "completions": n, "completion_tokens": length * n} for t, length in zip(times, lengths)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=["rlft", "trl"], required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=4, help="timed steps (one more runs first as warm-up)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--preset", default="easy3")
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--split-seed", type=int, default=1234)
    parser.add_argument("--prompt-template", default="short")
    parser.add_argument("--seed", type=int, default=0)
    add_precision_options(parser)
    args = parser.parse_args()
    if (args.prompts_per_step * args.k) % args.micro_batch_size:
        parser.error("prompts-per-step * k must be a multiple of micro-batch-size")

    spec = pick_device("auto", args.dtype)
    args.precision = spec.label  # the trl path replaces it with TRL's
    with tempfile.TemporaryDirectory() as tmp:
        records = (run_rlft if args.path == "rlft" else run_trl)(args, Path(tmp) / "run")
    timed = records[1:]
    if not timed:
        raise SystemExit("no timed steps: use --steps >= 1")
    step_s = statistics.median(r["step_s"] for r in timed)
    total_s = sum(r["step_s"] for r in timed)
    tokens = sum(r["completion_tokens"] for r in timed)
    completions = sum(r["completions"] for r in timed)
    print(
        f"path={args.path} model={args.model} device={spec.device} precision=[{args.precision}] "
        f"prompts/step={args.prompts_per_step} k={args.k} "
        f"steps={len(timed)} step_s={step_s:.2f} (median) completions/s={completions / total_s:.2f} "
        f"generated_tokens/s={tokens / total_s:.1f} mean_completion_tokens={tokens / completions:.1f} "
        f"peak_memory={peak_memory(spec.device)}")


if __name__ == "__main__":
    main()
