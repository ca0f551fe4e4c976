"""RL sampling on a GPU, continuous batching against fixed batches: a synthetic workload on random-init weights.

The built-in model cannot travel to the device (its GGUF is over the transfer limit) and a random model never samples
EOS, so the lengths come from a logit bias instead: the EOS token (an id inside the vocabulary) gets ``+b`` on its
logit, a forward hook on the LM head, with ``b`` chosen so that a random model's nearly uniform next-token
distribution puts about ``--eos-rate`` on it. The completion lengths are then roughly geometric, capped at
``--max-new-tokens``, as RL's are spread. Printed: the length distribution each candidate saw.

One RL step's sampling: ``--prompts`` random prompts of ``--prompt-tokens`` tokens, ``--k`` samples each at T=1,
``--rows`` rows decoded together (``rlft rl --gen-batch-size``). Candidates (``--candidates``):

- ``static``: CUDA's default decoder, transformers' static-cache ``generate`` (compiled, CUDA graphs), fixed
  batches of ``--rows``: each batch waits for its longest row;
- ``refill``: rlft's continuous batching, :func:`rlft.rollout.refill.decode_jobs` (the CPU default for sampling);
- ``drop``: rlft's decoder whose finished rows leave the batch (no refill);
- ``cb``: transformers' continuous batching, ``generate_batch`` (paged cache; bench/rollout.py's settings, with
  CUDA graphs on a GPU).

Each candidate runs once untimed (static compiles for the very shape; the others run 8 tokens), then ``--rounds``
timed runs; tokens/s = generated tokens (EOS counted) over wall seconds. A candidate that fails is reported and skipped.

    python bench/rollout_gpu.py --output rollout_gpu.json         # SmolLM2-135M shape, one GPU, ~3 minutes
    python bench/rollout_gpu.py --quick                            # a tiny shape on the CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "scripts"), str(ROOT / "bench")]

import gpu_bench  # noqa: E402
from rlft.models import pick_device  # noqa: E402
from rlft.rollout.base import SamplingParams  # noqa: E402
from rlft.fsio import atomic_write_json  # noqa: E402
from rlft.rollout.hf import HFEngine  # noqa: E402
from rlft.lab.script_io import ArgumentParser, check_outputs, run_script  # noqa: E402


class BiasedEosTokenizer(gpu_bench.IdTokenizer):
    """:class:`gpu_bench.IdTokenizer` whose EOS is the vocabulary's last id, so that it can be sampled."""

    def __init__(self, vocab: int):
        super().__init__(vocab)
        self.eos_token_id = vocab - 1


def bias_eos(model, eos: int, rate: float) -> float:
    """Add ``b`` to the EOS logit (a hook on the LM head): P(EOS) ~= rate for near-uniform logits; returns ``b``."""
    vocab = model.config.vocab_size
    b = math.log(rate * (vocab - 1) / (1 - rate))
    bias = torch.zeros(vocab, device=model.device, dtype=model.dtype)  # made once: CUDA graph capture copies nothing
    bias[eos] = b

    def hook(module, inputs, logits):
        return logits + bias

    model.get_output_embeddings().register_forward_hook(hook)
    return b


def lengths_of(candidate: str, model, tokenizer, prompts: list[str], params: SamplingParams, rows: int) -> list[int]:
    if candidate == "cb":
        import rollout  # bench/rollout.py

        # each prompt k times, one sample each: transformers 5.17's generate_batch returns one result per prompt
        prompt_ids = [ids for ids in tokenizer(prompts)["input_ids"] for _ in range(params.k)]
        return rollout.run_cb(model, prompt_ids, replace(params, k=1), [tokenizer.eos_token_id], tokenizer.pad_token_id,
                              rows, cuda_graph=model.device.type == "cuda")
    engine = HFEngine(model, tokenizer, batch_size=rows, decoder=candidate)
    return [len(s.completion_ids) for row in engine.generate(prompts, params) for s in row]


def main(argv=None) -> dict:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(gpu_bench.SHAPES), default="smollm2-135m")
    parser.add_argument("--candidates", default="static,refill,cb,drop")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--eos-rate", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny shape, 4 prompts x 4, 16 tokens: a CPU smoke test")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)  # before any work
    if args.quick:
        args.shape, args.prompts, args.k, args.rows, args.prompt_tokens, args.max_new_tokens = "tiny", 4, 4, 8, 8, 16
        args.eos_rate = 0.1
    spec = pick_device("auto", "auto")
    model = gpu_bench.build_model(argparse.Namespace(shape=args.shape, attn="sdpa"), spec)
    model.eval()
    vocab = model.config.vocab_size
    tokenizer = BiasedEosTokenizer(vocab)
    b = bias_eos(model, tokenizer.eos_token_id, args.eos_rate)
    g = torch.Generator().manual_seed(0)
    prompts = [" ".join(map(str, torch.randint(1, vocab - 1, (args.prompt_tokens,), generator=g).tolist()))
               for _ in range(args.prompts)]
    device = spec.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{name}, shape {args.shape}, {args.prompts} prompts x k={args.k}, {args.rows} rows, <= {args.max_new_tokens} "
        f"new tokens, EOS bias {b:.2f} (target rate {args.eos_rate})", flush=True)
    results = []
    for candidate in args.candidates.split(","):
        params = SamplingParams(k=args.k, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
        try:
            warm = params if candidate == "static" else SamplingParams(k=args.k, max_new_tokens=8, seed=0)
            lengths_of(candidate, model, tokenizer, prompts, warm, args.rows)  # static compiles for its very shape
            for r in range(args.rounds):
                sync()
                t0 = time.perf_counter()
                lengths = lengths_of(candidate, model, tokenizer, prompts, replace(params, seed=1 + r), args.rows)
                sync()
                seconds = time.perf_counter() - t0
                results.append({"candidate": candidate, "round": r, "seconds": seconds, "tokens": sum(lengths),
                                "tokens_per_s": sum(lengths) / seconds, "mean_length": statistics.mean(lengths),
                                "at_limit": sum(n >= args.max_new_tokens for n in lengths) / len(lengths)})
        except Exception as e:  # noqa: BLE001 -- report and go on with the next candidate
            results.append({"candidate": candidate, "failed": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
        print(json.dumps(results[-1]), flush=True)
    first = next((r["tokens_per_s"] for r in results if "tokens_per_s" in r), None)
    for r in results:
        if "tokens_per_s" in r:
            print(f"{r['candidate']:>8} round {r['round']}: {r['seconds']:7.2f} s, {r['tokens']:7d} tokens, "
                  f"{r['tokens_per_s']:9.0f} tokens/s ({r['tokens_per_s'] / first:.2f}x), mean length "
                  f"{r['mean_length']:.1f}, {r['at_limit']:.0%} at the limit")
        else:
            print(f"{r['candidate']:>8}: failed: {r['failed']}")
    report = {"device": name, "torch": torch.__version__, "args": vars(args), "eos_bias": b, "results": results}
    if args.output:
        atomic_write_json(Path(args.output).expanduser(), report, indent=1)
    return report


if __name__ == "__main__":  # a bad option, an existing --output: one line, exit 2
    run_script(main)
