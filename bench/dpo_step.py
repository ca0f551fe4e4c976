"""DPO step throughput and peak memory: rlft's recipe vs TRL's ``DPOTrainer``, same pairs and settings.

Both train one epoch over the same chat preference pairs (UltraFeedback prompt/chosen/rejected, rendered
with the model's chat template) with the sigmoid DPO loss (beta 0.1), AdamW, B pairs per optimizer step
in micro-batches of M pairs (chosen and rejected in one forward pass on both sides), reference
log-probs precomputed before training (not timed), no gradient checkpointing. Only pairs that fit --max-length
whole (with the template) are used, so neither side truncates.

Precision: ``--dtype`` is rlft's (auto: bfloat16 weights on CUDA, bfloat16 autocast over float32 weights on a CPU
with native bf16; float32), also the weights TRL is given; ``--trl-precision`` is TRL's ``bf16`` flag (default:
unset, which TRL >= 0.20 turns on unless fp16 is; bf16; float32). The printed line says which ran.

Prints seconds per optimizer step (median), pairs/s, tokens/s (prompt + chosen + prompt + rejected tokens
per pair, each side counting its own tokenization) and peak memory (CUDA: allocator peak; CPU: process
max RSS, which only grows, so run each side in its own process: --path).

    python bench/dpo_step.py --path rlft --data ../shared/data/ultrafeedback/train_clean.jsonl  # --dtype auto
    python bench/dpo_step.py --path rlft --data ../shared/data/ultrafeedback/train_clean.jsonl --dtype float32
    python bench/dpo_step.py --path trl  --data ../shared/data/ultrafeedback/train_clean.jsonl  # TRL's default
    python bench/dpo_step.py --path trl  --data ../shared/data/ultrafeedback/train_clean.jsonl --trl-precision float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from benchlib import add_precision_options, peak_memory, step_timer, trl_precision

from rlft.data.chat import render_chat
from rlft.data.files import read_rows
from rlft.models import load_model, load_tokenizer, pick_device


def select_pairs(args, tokenizer) -> list[dict]:
    """The first ``steps * batch_size`` rows of --data (flattened prompt/chosen/rejected text) that fit whole."""
    rows = []
    for _, row in read_rows(args.data):
        if not isinstance(row, dict) or not all(
                isinstance(row.get(f), str) and row[f] for f in ("prompt", "chosen", "rejected")):
            continue
        if row["chosen"] == row["rejected"]:
            continue
        rendered = [
            render_chat(tokenizer,
                        [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row[side]}],
                        train_on="last_assistant", max_length=args.max_length - 8)  # margin for template differences
            for side in ("chosen", "rejected")
        ]  # fmt: skip
        if all(r is not None and not r.truncated for r in rendered):
            rows.append({"prompt": row["prompt"], "chosen": row["chosen"], "rejected": row["rejected"]})
        if len(rows) == args.steps * args.batch_size:
            return rows
    raise SystemExit(
        f"only {len(rows)} pairs of {args.data} fit --max-length {args.max_length}; need {args.steps * args.batch_size}"
    )


def run_rlft(args, pairs_file: Path, out: Path) -> list[dict]:
    """Per-step ``{"step_s", "pairs", "tokens"}`` from rlft's DPO recipe (its metrics log)."""
    from rlft.recipes.dpo import DPOConfig, train_dpo

    train_dpo(DPOConfig(
        model=args.model, data=str(pairs_file), data_format="chat", output_dir=str(out), max_length=args.max_length,
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, max_steps=args.steps, lr=args.lr,
        warmup_ratio=0.0, schedule="constant", save_every=0, drop_ties=False, dtype=args.dtype,
    ))  # fmt: skip
    stats = json.loads((out / "data_stats.json").read_text())
    if stats["dropped_too_long"] or stats["chosen_truncated"] or stats["rejected_truncated"]:
        raise SystemExit(f"rlft cut or dropped pairs the selection kept whole: {stats}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{"step_s": r["tokens"] / r["tokens_per_s"], "pairs": args.batch_size, "tokens": r["tokens"]} for r in rows]


def run_trl(args, pairs_file: Path, out: Path) -> list[dict]:
    """The same per-step records from TRL's ``DPOTrainer`` (timed by a callback; tokens from its tokenized data)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    spec = pick_device("auto", args.dtype)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, spec)
    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    dataset = Dataset.from_list([{
        "prompt": [{"role": "user", "content": r["prompt"]}], "chosen": [{"role": "assistant", "content": r["chosen"]}],
        "rejected": [{"role": "assistant", "content": r["rejected"]}]
    } for r in rows])  # fmt: skip
    times: list[float] = []
    config = DPOConfig(
        output_dir=str(out),
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=args.batch_size // args.micro_batch_size,
        max_length=args.max_length,
        beta=0.1,
        loss_type=["sigmoid"],
        precompute_ref_log_probs=True,
        gradient_checkpointing=False,
        use_cpu=spec.device.type != "cuda",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        max_grad_norm=1.0,
        weight_decay=0.0,
        **trl_precision(args),
    )  # fmt: skip
    args.precision = f"trl bf16={config.bf16} (weights {spec.dtype})"
    trainer = DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[step_timer(spec.device, times)])
    trainer.train()
    data = trainer.train_dataset
    total = sum(
        2 * len(p) + len(c) + len(r) for p, c, r in zip(data["prompt_ids"], data["chosen_ids"], data["rejected_ids"]))
    return [{"step_s": t, "pairs": args.batch_size, "tokens": total / len(times)} for t in times
            ]  # one epoch: mean tokens per step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=["rlft", "trl"], required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data", default="../shared/data/ultrafeedback/train_clean.jsonl")
    parser.add_argument("--steps", type=int, default=4,
                        help="optimizer steps = one epoch over steps x batch-size pairs")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-6)
    add_precision_options(parser)
    args = parser.parse_args()
    if args.batch_size % args.micro_batch_size:
        parser.error("batch-size must be a multiple of micro-batch-size")

    spec = pick_device("auto", args.dtype)
    args.precision = spec.label  # the trl path replaces it with TRL's
    with tempfile.TemporaryDirectory() as tmp:
        pairs_file = Path(tmp) / "pairs.jsonl"
        pairs = select_pairs(args, load_tokenizer(args.model))
        pairs_file.write_text("".join(json.dumps(p) + "\n" for p in pairs))
        records = (run_rlft if args.path == "rlft" else run_trl)(args, pairs_file, Path(tmp) / "run")
    total_s = sum(r["step_s"] for r in records)
    print(
        f"path={args.path} model={args.model} device={spec.device} precision=[{args.precision}] "
        f"pairs/step={args.batch_size} steps={len(records)} "
        f"step_s={statistics.median(r['step_s'] for r in records):.2f} (median) "
        f"pairs/s={sum(r['pairs'] for r in records) / total_s:.2f} "
        f"tokens/s={sum(r['tokens'] for r in records) / total_s:.0f} "
        f"tokens/pair={sum(r['tokens'] for r in records) / sum(r['pairs'] for r in records):.0f} "
        f"peak_memory={peak_memory(spec.device)}")


if __name__ == "__main__":
    main()
