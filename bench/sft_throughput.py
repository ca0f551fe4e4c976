"""SFT step throughput and peak memory: rlft's loss path vs the plain Hugging Face loss.

rlft computes the LM head only on completion positions (``rlft.ops.sequence_logprobs``); the plain
path calls ``model(input_ids, labels=...)``, which materialises logits for every position. Both train
on the same Countdown SFT batches with AdamW. Prints tokens/s and peak memory (CUDA: allocator
peak; CPU: process max RSS, which only grows, so run each path in its own process: --path).

    python bench/sft_throughput.py --path rlft  --model smollm2-135m --steps 5
    python bench/sft_throughput.py --path plain --model smollm2-135m --steps 5
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from rlft.data.tokenize import collate, tokenize_prompt_completion
from rlft.losses.sft import sft_loss
from rlft.models import load_model, load_tokenizer, pick_device
from rlft.ops import sequence_logprobs
from rlft.tasks.countdown.generator import PRESETS, generate_tasks
from rlft.tasks.countdown.prompts import render_prompt
from rlft.tasks.countdown.traces import write_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=["rlft", "plain"], required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompt-template", default="base")
    parser.add_argument("--trace-style", default="search")
    args = parser.parse_args()

    spec = pick_device()
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, spec)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tasks = generate_tasks(PRESETS["standard"], args.batch_size * (args.steps + 1), seed=0)
    examples = [tokenize_prompt_completion(tokenizer, render_prompt(args.prompt_template, t, tokenizer), write_trace(t, args.trace_style), max_length=512) for t in tasks]

    times, tokens = [], []
    for step in range(args.steps + 1):  # step 0 is warm-up, not timed
        batch = collate(examples[step * args.batch_size : (step + 1) * args.batch_size], tokenizer.pad_token_id).to(spec.device)
        if spec.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if args.path == "rlft":
            logprobs = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
            loss, _ = sft_loss(logprobs, batch.loss_mask)
        else:
            labels = batch.input_ids.masked_fill(batch.loss_mask == 0, -100)
            loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if spec.device.type == "cuda":
            torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - t0)
            tokens.append(int(batch.attention_mask.sum()))
    if spec.device.type == "cuda":
        peak = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (CUDA allocator)"
    else:
        peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (max RSS)"
    print(f"path={args.path} model={args.model} device={spec.device} batch={args.batch_size} "
          f"tokens/step={sum(tokens) / len(tokens):.0f} step_s={sum(times) / len(times):.2f} "
          f"tokens/s={sum(tokens) / sum(times):.0f} peak_memory={peak}")


if __name__ == "__main__":
    main()
