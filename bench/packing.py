"""Padding-free packing vs right padding: training-step tokens/s and peak memory, same examples, same micro-batches.

Two workloads, each one optimizer step = ``--batch-size`` examples in micro-batches of ``--micro-batch-size``
(ordered by length within the step, as the recipes do), forward + backward + AdamW, float32 on CPU,
bfloat16 on CUDA:

- ``dpo``: UltraFeedback pairs (``--data``, chat-rendered, cut to ``--max-length``), the DPO recipe's
  :func:`rlft.recipes.dpo.pair_logprobs` (chosen and rejected in one pass) and the sigmoid DPO loss
  against fixed reference log-probs (reference not timed);
- ``sft``: Countdown search traces (the SFT recipe's ``--data countdown --trace-style search`` examples)
  through :func:`rlft.recipes.sft.micro_batch_logprobs` and the SFT loss.

Each side runs in its own process (CPU peak memory is the process max RSS, which only grows); the first
step is a warm-up and is not timed. tokens/s counts real (non-padding) tokens on both sides, so the ratio
is the speed-up at equal work. ``--pack-length`` bounds the packed rows (None: one row per micro-batch,
best with flash-attention's varlen kernel; on CPU the block-diagonal mask cost grows with the row's square).

    python bench/packing.py --task dpo --data ../shared/data/ultrafeedback/train_clean.jsonl
    python bench/packing.py --task sft
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


def dpo_batches(args, tokenizer):
    from rlft.recipes.dpo import DPOConfig, load_tokenized_pairs

    cfg = DPOConfig(model=args.model, data=args.data, data_format="chat", max_length=args.max_length,
                    limit=4 * args.batch_size * (args.steps + 1), drop_ties=False, skip_invalid=True)
    pairs, _ = load_tokenized_pairs(cfg, tokenizer)
    return pairs, lambda p: max(len(p.chosen.input_ids), len(p.rejected.input_ids))


def sft_examples(args, tokenizer):
    from rlft.recipes.sft import SFTConfig, load_sft_examples

    cfg = SFTConfig(model=args.model, data="countdown", trace_style="search", preset=args.preset,
                    num_train=args.batch_size * (args.steps + 1), max_length=args.max_length)
    examples, _ = load_sft_examples(cfg, tokenizer)
    return examples, lambda e: len(e.input_ids)


def run_side(args) -> dict:
    """One side (``args.side``) in this process: per-step seconds and real tokens, peak memory."""
    from benchlib import peak_memory

    from rlft.losses.dpo import dpo_loss
    from rlft.losses.sft import sft_loss
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.recipes.dpo import pair_logprobs
    from rlft.recipes.sft import SFTConfig, micro_batch_logprobs

    torch.manual_seed(0)
    spec = pick_device()
    tokenizer = load_tokenizer(args.model)
    items, length = (dpo_batches if args.task == "dpo" else sft_examples)(args, tokenizer)
    if len(items) < args.batch_size * (args.steps + 1):
        raise SystemExit(f"only {len(items)} examples; need {args.batch_size * (args.steps + 1)}")
    model = load_model(args.model, spec)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-7)
    packing = args.side == "packed"
    pad = tokenizer.pad_token_id
    sft_cfg = SFTConfig(packing=packing, pack_length=args.pack_length)
    sync = torch.cuda.synchronize if spec.device.type == "cuda" else (lambda: None)
    records, computed = [], 0
    for step in range(args.steps + 1):
        batch = sorted(items[step * args.batch_size : (step + 1) * args.batch_size], key=length)
        sync()
        t0 = time.perf_counter()
        tokens = 0
        for start in range(0, len(batch), args.micro_batch_size):
            mb = batch[start : start + args.micro_batch_size]
            if step > 0:
                computed += computed_tokens(mb, args, model, packing)
            weight = len(mb) / len(batch)
            if args.task == "dpo":
                lp = pair_logprobs(model, mb, pad, spec.device, packing=packing, pack_length=args.pack_length)
                zeros = torch.zeros_like(lp.chosen_sum)
                loss, _ = dpo_loss(lp.chosen_sum, lp.rejected_sum, zeros, zeros)
                tokens += sum(len(p.chosen.input_ids) + len(p.rejected.input_ids) for p in mb)
            else:
                logprobs, loss_mask, real = micro_batch_logprobs(model, mb, pad, spec.device, sft_cfg)
                loss, _ = sft_loss(logprobs, loss_mask, num_tokens=sum(sum(e.loss_mask) for e in batch))
                weight, tokens = 1.0, tokens + real
            (loss * weight).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        sync()
        if step > 0:  # step 0 warms up
            records.append({"step_s": time.perf_counter() - t0, "tokens": tokens})
    total_s = sum(r["step_s"] for r in records)
    return {
        "side": args.side, "task": args.task, "device": str(spec.device), "steps": len(records),
        "step_s": statistics.median(r["step_s"] for r in records), "tokens_per_s": sum(r["tokens"] for r in records) /
        total_s, "tokens_per_step": sum(r["tokens"] for r in records) / len(records),
        "peak_memory": peak_memory(spec.device), "computed_per_step": computed / len(records)
    }


def computed_tokens(mb, args, model, packing: bool) -> int:
    """Token positions the model runs over for one micro-batch, padding included: rows x row length."""
    from rlft.data.packing import default_pack_length, plan_rows

    sequences = [e for p in mb for e in (p.chosen, p.rejected)] if args.task == "dpo" else list(mb)
    lengths = [len(e.input_ids) for e in sequences]
    if not packing:
        return len(lengths) * max(lengths)
    rows = plan_rows(lengths, args.pack_length or default_pack_length(model, lengths))
    return len(rows) * max(sum(lengths[i] for i in row) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["dpo", "sft"], required=True)
    parser.add_argument("--side", choices=["padded", "packed", "both"], default="both")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data", default="../shared/data/ultrafeedback/train_clean.jsonl",
                        help="dpo: preference pairs")
    parser.add_argument("--preset", default="easy3", help="sft: Countdown preset")
    parser.add_argument("--steps", type=int, default=2, help="timed optimizer steps (after one warm-up step)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--pack-length", type=int, default=None,
                        help="most tokens per packed row (default: one row per micro-batch)")
    args = parser.parse_args()
    if args.side != "both":
        print(json.dumps(run_side(args)))
        return
    results = {}
    for side in ("padded", "packed"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--side", side]
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
        results[side] = json.loads(out)
        r = results[side]
        print(
            f"{args.task} {side:>6}: step_s={r['step_s']:.2f} (median of {r['steps']}) "
            f"tokens/step={r['tokens_per_step']:.0f} computed/step={r['computed_per_step']:.0f} "
            f"tokens/s={r['tokens_per_s']:.0f} peak_memory={r['peak_memory']} device={r['device']}", flush=True)
    print(
        f"{args.task}: packed/padded tokens/s = "
        f"{results['packed']['tokens_per_s'] / results['padded']['tokens_per_s']:.2f}x "
        f"(pack_length={args.pack_length}, batch {args.batch_size}, micro-batch {args.micro_batch_size}, "
        f"max_length {args.max_length})"
    )


if __name__ == "__main__":
    main()
