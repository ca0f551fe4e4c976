"""float32 against bfloat16 mixed precision on this machine, in one run: SFT step, DPO step and decoding.

Each workload runs twice with everything else the same: ``--dtype float32`` (float32 weights and compute) and
mixed precision (float32 weights and AdamW state, ``torch.autocast`` bfloat16 compute; decoding from a bfloat16
copy of the weights: what ``--dtype auto`` picks on a CPU with native bf16, see ``rlft.precision``).

- SFT: forward + backward + AdamW (as ``rlft sft`` builds it) on Countdown ``bounded`` traces of the
  ``standard`` preset (``--batch`` rows);
- DPO: the same for chosen + rejected sequences (``--batch`` pairs) against precomputed reference log-probs;
- decode: ``--rows`` greedy rows of exactly ``--new-tokens`` tokens each (rlft's decoder, no row stopping: the same
  work in both precisions), and, stopping at EOS as usual, the share of rows whose greedy tokens are identical.

Prints tokens/s of each, the ratio, the first-step losses of both precisions, and the process's peak RSS.

    python bench/precision.py                      # built-in model, 5 timed steps after a warm-up
    python bench/precision.py --steps 3 --rows 32
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from benchlib import peak_memory

from rlft.data.tokenize import collate, tokenize_prompt_completion
from rlft.losses.dpo import dpo_loss
from rlft.losses.sft import sft_loss
from rlft.models import DeviceSpec, load_model, load_tokenizer
from rlft.ops import masked_sum, sequence_logprobs
from rlft.rollout.base import SamplingParams
from rlft.rollout.decode import decode
from rlft.rollout.hf import HFEngine
from rlft.tasks.countdown.generator import PRESETS, generate_tasks
from rlft.tasks.countdown.prompts import render_prompt
from rlft.tasks.countdown.traces import write_trace

CPU = torch.device("cpu")
SPECS = {"float32": DeviceSpec(CPU, torch.float32), "bf16 mixed": DeviceSpec(CPU, torch.float32, torch.bfloat16)}


def batches(tokenizer, n: int, batch: int, seed: int):
    tasks = generate_tasks(PRESETS["standard"], n * batch, seed=seed)
    examples = [tokenize_prompt_completion(tokenizer, render_prompt("short", t, tokenizer),
                                           write_trace(t, "bounded", seed=i, give_up=0.6), max_length=512)
                for i, t in enumerate(tasks)]
    return [collate(examples[i * batch : (i + 1) * batch], tokenizer.pad_token_id) for i in range(n)]


def timed_steps(step, data, steps: int) -> tuple[float, float]:
    """``(tokens/s over the timed steps, first step's loss)``; step 0 is a warm-up."""
    first = step(data[0])
    tokens = seconds = 0.0
    for b in data[1 : steps + 1]:
        t0 = time.perf_counter()
        step(b)
        seconds += time.perf_counter() - t0
        tokens += float(b.attention_mask.sum())
    return tokens / seconds, first


def sft_bench(args, tokenizer, spec) -> tuple[float, float]:
    torch.manual_seed(0)
    model = load_model(args.model, spec).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step(b):
        optimizer.zero_grad(set_to_none=True)
        logprobs = sequence_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask)
        loss, _ = sft_loss(logprobs, b.loss_mask)
        loss.backward()
        optimizer.step()
        return loss.item()

    return timed_steps(step, batches(tokenizer, args.steps + 1, args.batch, seed=1), args.steps)


def dpo_bench(args, tokenizer, spec) -> tuple[float, float]:
    torch.manual_seed(0)
    model = load_model(args.model, spec).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    chosen = batches(tokenizer, args.steps + 1, args.batch, seed=2)
    rejected = batches(tokenizer, args.steps + 1, args.batch, seed=3)
    with torch.no_grad():  # the reference is the initial policy, its log-probs computed once (as rlft dpo does)
        refs = [(masked_sum(sequence_logprobs(model, c.input_ids, c.attention_mask, c.loss_mask), c.loss_mask, dim=-1),
                 masked_sum(sequence_logprobs(model, r.input_ids, r.attention_mask, r.loss_mask), r.loss_mask, dim=-1))
                for c, r in zip(chosen, rejected)]
    pairs = list(zip(chosen, rejected, refs))

    class Pair:  # timed_steps counts attention_mask tokens
        def __init__(self, item):
            self.item = item
            self.attention_mask = torch.cat([item[0].attention_mask.flatten(), item[1].attention_mask.flatten()])

    def step(pair):
        c, r, (ref_c, ref_r) = pair.item
        optimizer.zero_grad(set_to_none=True)
        pc = masked_sum(sequence_logprobs(model, c.input_ids, c.attention_mask, c.loss_mask), c.loss_mask, dim=-1)
        pr = masked_sum(sequence_logprobs(model, r.input_ids, r.attention_mask, r.loss_mask), r.loss_mask, dim=-1)
        loss, _ = dpo_loss(pc, pr, ref_c, ref_r, beta=0.1)
        loss.backward()
        optimizer.step()
        return loss.item()

    return timed_steps(step, [Pair(p) for p in pairs], args.steps)


def decode_bench(args, tokenizer, spec) -> tuple[float, list[list[int]]]:
    """``(tokens/s of --rows rows x --new-tokens tokens, the greedy completions stopping at EOS)``. The sampler is what
    the RL loop and evaluation use: the model itself in float32, a bfloat16 copy under mixed precision."""
    model = load_model(args.model, spec)
    engine = HFEngine(model, tokenizer, batch_size=args.rows, decoder="drop", copy_weights=spec.compute_dtype
                      is not None, copy_dtype=spec.compute_dtype)
    tasks = generate_tasks(PRESETS["standard"], args.rows, seed=4)
    prompts = [render_prompt("short", t, tokenizer) for t in tasks]
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=args.new_tokens)
    sampler = engine.sampler()  # the decoding weights
    ids = engine.encode_prompts(prompts)
    width = max(map(len, ids))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    attention_mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    with torch.no_grad():
        decode(sampler, input_ids[:4], attention_mask[:4], SamplingParams(k=1, temperature=0.0, max_new_tokens=4),
               [-1])  # warm-up
        t0 = time.perf_counter()
        rows = decode(sampler, input_ids, attention_mask, params, [-1])  # no EOS: every row runs to --new-tokens
        seconds = time.perf_counter() - t0
    out = engine.generate(prompts, params)  # as the recipes decode: stopping at EOS
    return sum(len(r.token_ids) for r in rows) / seconds, [row[0].completion_ids for row in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=16, help="SFT rows / DPO pairs per step")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=64, help="decoded rows (one batch)")
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    print(f"threads {torch.get_num_threads()}, RLFT_CPU_BF16={os.environ.get('RLFT_CPU_BF16', 'unset')}, "
          f"model {args.model}")
    results = {}
    for name, spec in SPECS.items():
        sft, sft_loss0 = sft_bench(args, tokenizer, spec)
        dpo, dpo_loss0 = dpo_bench(args, tokenizer, spec)
        dec, ids = decode_bench(args, tokenizer, spec)
        results[name] = dict(sft=sft, dpo=dpo, decode=dec, ids=ids)
        print(
            f"{name:>10}: SFT {sft:8.1f} tok/s (first loss {sft_loss0:.4f})  "
            f"DPO {dpo:8.1f} tok/s (first loss {dpo_loss0:.4f})  "
            f"decode {dec:7.1f} tok/s   peak {peak_memory(CPU)}")
    a, b = results["float32"], results["bf16 mixed"]
    same = sum(x == y for x, y in zip(a["ids"], b["ids"])) / len(a["ids"])
    print(
        f"bf16 / float32: SFT {b['sft'] / a['sft']:.2f}x  DPO {b['dpo'] / a['dpo']:.2f}x  "
        f"decode {b['decode'] / a['decode']:.2f}x; "
        f"greedy rows identical: {same:.0%}")


if __name__ == "__main__":
    main()
