"""SFT step throughput and peak memory: rlft's loss path vs the plain Hugging Face loss vs TRL's SFTTrainer.

rlft computes the LM head only on completion positions (``rlft.ops.sequence_logprobs``); the plain
path calls ``model(input_ids, labels=...)``, which materialises logits for every position. Both train
on the same Countdown SFT batches with AdamW. Prints tokens/s and peak memory (CUDA: allocator
peak; CPU: process max RSS, which only grows, so run each path in its own process: --path).

    python bench/sft_throughput.py --path rlft  --model smollm2-135m --steps 5                  # --dtype auto
    python bench/sft_throughput.py --path rlft  --model smollm2-135m --steps 5 --dtype float32
    python bench/sft_throughput.py --path plain --model smollm2-135m --steps 5
    python bench/sft_throughput.py --path trl   --model smollm2-135m --steps 5                  # TRL as it defaults
    python bench/sft_throughput.py --path trl   --model smollm2-135m --steps 5 --trl-precision float32

Precision, for a fair comparison: ``--dtype`` is rlft's (the rlft and plain paths; the weights the trl path is
given): ``auto`` is bfloat16 weights on CUDA and, on a CPU with native bf16, float32 weights with bfloat16 autocast
compute (else float32); ``float32`` everywhere float32. ``--trl-precision`` is TRL's: ``default`` leaves its
config's ``bf16`` unset (TRL >= 0.20 then turns it on unless fp16 is: bfloat16 autocast, on the CPU too),
``bf16`` sets ``bf16=True``, ``float32`` sets ``bf16=False``. The line printed says which precision ran.

The trl path trains ``SFTTrainer`` for one epoch over the same (steps + 1) x batch prompt/completion
pairs (completion-only loss, AdamW, no gradient checkpointing or packing), timed per optimizer step by a
callback; its first step is warm-up, as on the other paths.
TRL shuffles the examples, so its tokens per step are the epoch's mean (its own tokenization).
"""

from __future__ import annotations

import argparse
import time

import torch
from benchlib import add_precision_options, peak_memory, step_timer, trl_precision

from rlft.data.tokenize import collate, tokenize_prompt_completion
from rlft.losses.sft import sft_loss
from rlft.models import load_model, load_tokenizer, pick_device
from rlft.ops import sequence_logprobs
from rlft.precision import compute_context
from rlft.tasks.countdown.generator import PRESETS, generate_tasks
from rlft.tasks.countdown.prompts import render_prompt
from rlft.tasks.countdown.traces import write_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=["rlft", "plain", "trl"], required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompt-template", default="base")
    parser.add_argument("--trace-style", default="search")
    add_precision_options(parser)
    args = parser.parse_args()

    spec = pick_device("auto", args.dtype)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, spec)
    tasks = generate_tasks(PRESETS["standard"], args.batch_size * (args.steps + 1), seed=0)
    pairs = [(render_prompt(args.prompt_template, t, tokenizer), write_trace(t, args.trace_style)) for t in tasks]
    if args.path == "trl":
        times, tokens, precision = run_trl(args, spec, model, tokenizer, pairs)
        report(args, spec, times, tokens, precision)
        return
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    examples = [
        tokenize_prompt_completion(tokenizer, prompt, completion, max_length=512) for prompt, completion in pairs
    ]

    times, tokens = [], []
    for step in range(args.steps + 1):  # step 0 is warm-up, not timed
        batch = collate(examples[step * args.batch_size:(step + 1) * args.batch_size],
                        tokenizer.pad_token_id).to(spec.device)
        if spec.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if args.path == "rlft":
            logprobs = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
            loss, _ = sft_loss(logprobs, batch.loss_mask)
        else:
            labels = batch.input_ids.masked_fill(batch.loss_mask == 0, -100)
            with compute_context(model):  # rlft's precision (--dtype), as the rlft path's sequence_logprobs uses
                loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if spec.device.type == "cuda":
            torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - t0)
            tokens.append(int(batch.attention_mask.sum()))
    report(args, spec, times, tokens, spec.label)


def run_trl(args, spec, model, tokenizer, pairs: list[tuple[str, str]]) -> tuple[list[float], list[float], str]:
    """Seconds and tokens of each timed optimizer step of TRL's ``SFTTrainer`` on ``pairs`` (prompt, completion),
    and the precision it ran in."""
    import tempfile

    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    step_times: list[float] = []
    dataset = Dataset.from_list([{"prompt": p, "completion": c} for p, c in pairs])
    with tempfile.TemporaryDirectory() as tmp:
        config = SFTConfig(
            output_dir=tmp,
            max_steps=args.steps + 1,
            per_device_train_batch_size=args.batch_size,
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_length=512,
            completion_only_loss=True,
            packing=False,
            gradient_checkpointing=False,
            use_cpu=spec.device.type != "cuda",
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            seed=0,
            weight_decay=0.0,
            **trl_precision(args),
        )  # fmt: skip
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                             callbacks=[step_timer(spec.device, step_times)])
        trainer.train()
    per_step = sum(len(ids) for ids in trainer.train_dataset["input_ids"]) / len(step_times)
    return step_times[1:], [per_step] * (len(step_times) - 1), f"trl bf16={config.bf16} (weights {spec.dtype})"


def report(args, spec, times: list[float], tokens: list[float], precision: str) -> None:
    peak = peak_memory(spec.device)
    print(f"path={args.path} model={args.model} device={spec.device} precision=[{precision}] batch={args.batch_size} "
          f"tokens/step={sum(tokens) / len(tokens):.0f} step_s={sum(times) / len(times):.2f} "
          f"tokens/s={sum(tokens) / sum(times):.0f} peak_memory={peak}")


if __name__ == "__main__":
    main()
