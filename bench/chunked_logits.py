"""Chunked LM head (``--logits-chunk-size``) vs full logits: peak memory and time of one SFT forward + backward.

A tiny random Qwen2-shaped model (2 blocks, hidden 64) with Qwen2.5's vocabulary of 151,936, so the
``(tokens, vocab)`` logits dominate memory; a batch of ``--batch`` x ``--length`` tokens, every token after
the first a target. Each chunk size runs in its own process (CPU peak memory is the process max RSS, which
only grows; CUDA: the allocator peak). Also prints the baseline memory of the same process before the step
(model, batch), so the step's own peak is visible.

    python bench/chunked_logits.py                 # chunk sizes 0 (off), 1024, 256
    python bench/chunked_logits.py --chunks 0 512
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_one(args) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlft.losses.sft import sft_loss
    from rlft.ops import sequence_logprobs

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.length,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to(device).train()
    input_ids = torch.randint(0, args.vocab, (args.batch, args.length), device=device)
    attention_mask = torch.ones_like(input_ids)
    loss_mask = torch.ones(args.batch, args.length, device=device)
    loss_mask[:, 0] = 0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = peak_bytes(device)
    t0 = time.perf_counter()
    logprobs = sequence_logprobs(model, input_ids, attention_mask, loss_mask, logits_chunk_size=args.chunk)
    loss, _ = sft_loss(logprobs, loss_mask)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"chunk": args.chunk, "device": str(device), "seconds": seconds, "loss": loss.item(),
            "peak_gib": peak_bytes(device) / 2**30, "before_gib": before / 2**30,
            "grad_norm": float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 256])
    parser.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)  # one process, one chunk size
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=151_936)
    args = parser.parse_args()
    if args.chunk is not None:
        print(json.dumps(run_one(args)))
        return
    tokens = args.batch * (args.length - 1)
    print(f"{args.batch}x{args.length} tokens ({tokens} targets), vocab {args.vocab}: full logits = "
          f"{tokens * args.vocab * 4 / 2**30:.2f} GiB per float32 copy")
    for chunk in args.chunks:
        cmd = [
            sys.executable, __file__, "--chunk",
            str(chunk), "--batch",
            str(args.batch), "--length",
            str(args.length), "--vocab",
            str(args.vocab)
        ]
        r = json.loads(
            subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1])
        print(
            f"logits_chunk_size={chunk:>5}: peak {r['peak_gib']:.2f} GiB (before the step {r['before_gib']:.2f} GiB) "
            f"step {r['seconds']:.2f} s  loss {r['loss']:.6f}  grad_norm {r['grad_norm']:.6f}  device={r['device']}",
            flush=True)


if __name__ == "__main__":
    main()
