"""The RL sampling workload on one machine, in one run: today's decoder against continuous batching.

One RL step's sampling: ``--prompts`` Countdown prompts (the ``short`` template, the real Countdown-Tasks-3to4 rows
of ``../shared/data/countdown/train.parquet`` when present, else the ``standard`` generator preset), ``--k``
samples each at T=1, at most ``--max-new-tokens`` tokens, ``--batch-size`` rows decoded together (the RL
recipe's ``--gen-batch-size``), sampled from a bfloat16 copy of the policy under CPU mixed precision (what
``rlft rl`` samples from: ``HFEngine(copy_weights=True, copy_dtype=bfloat16)``). Candidates:

- ``drop``: today's decoder, :func:`rlft.rollout.decode.decode` (finished rows leave the batch);
- ``refill``: rlft's continuous batching, :func:`rlft.rollout.refill.decode_jobs` (HFEngine's CPU default for
  sampling);
- ``cb``: transformers' continuous batching, ``model.generate_batch`` (paged cache, ``max_requests_per_batch`` =
  ``--batch-size``, ``num_return_sequences`` = k, ``return_logprobs=True`` as the RL loss needs log-probs);
- ``generate``: transformers' ``generate`` through HFEngine (``decoder="generate"``).

A candidate may carry its own rows decoded together and the loop stop: ``refill@64+stop`` is ``refill`` at 64 rows
with ``stop_repeats`` 5 (``rlft rl``'s default); ``drop@32`` is ``drop`` at 32 rows (``--batch-size`` otherwise).
Ratios are to the first candidate listed.

The candidates run in turn, ``--rounds`` times (A B C D A B C D: contention from other work on the machine hits them
alike), after one untimed warm-up each. Every run samples the same prompts with seed ``--seed + round``, so a
candidate's rounds differ in their samples; candidates draw different random numbers, so their completion lengths
differ too: compare tokens/s (generated tokens, EOS included, over wall seconds). Printed per run, then per
candidate: wall seconds, tokens/s, its ratio to the first candidate's, and the completion-length distribution.

    OMP_NUM_THREADS=1 python bench/rollout.py --threads 1        # drop, refill, generate: 1 round, ~4 minutes
    OMP_NUM_THREADS=1 python bench/rollout.py --threads 1 --rounds 2 --candidates drop,refill,cb,generate \
        --output docs/results/speed/data/rollout_cpu_<date>.txt          # the recorded run, ~15 minutes
    python bench/rollout.py --model <an RL start> --candidates drop@32,refill@32,refill@64,refill@64+stop
        # rlft rl's sampling before (drop, --gen-batch-size 32) and after, on a model that loops

On a CPU shared with other work, one thread per process (``OMP_NUM_THREADS=1``, ``--threads 1``) is the stable
setting: with 2 threads each OpenMP region waits for a descheduled thread, and decoding steps varied 10x from run to
run. ``cb`` costs ~3.5 minutes a round on 2 cores, so it is not in the default list.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from rlft import provenance
from rlft.rl.options import SamplingOptions
from rlft.lab.script_io import ArgumentParser, check_outputs, run_script

CANDIDATES = ("drop", "refill", "cb", "generate")
STOP_REPEATS = SamplingOptions.stop_repeats
"""The loop stop of a ``+stop`` candidate: ``rlft rl``'s default ``--stop-repeats``."""


def parse_candidate(text: str, batch_size: int) -> tuple[str, int, bool]:
    """``name[@rows][+stop]`` -> (decoder name, rows decoded together, loop stop on).

    Raises:
        ValueError: an unknown name, rows < 1, or a loop stop on ``cb`` (it has none).
    """
    body, stop = (text[:-len("+stop")], True) if text.endswith("+stop") else (text, False)
    name, _, rows = body.partition("@")
    if name not in CANDIDATES:
        raise ValueError(f"unknown candidate {text!r}: choose from {', '.join(CANDIDATES)}, as name[@rows][+stop]")
    if rows and (not rows.isdigit() or int(rows) < 1):
        raise ValueError(f"candidate {text!r}: rows after @ must be a positive integer")
    if stop and name == "cb":
        raise ValueError(f"candidate {text!r}: transformers' continuous batching has no loop stop")
    return name, int(rows) if rows else batch_size, stop


def load_prompts(args, tokenizer) -> tuple[list[str], str]:
    from rlft.tasks.countdown.generator import PRESETS, make_splits
    from rlft.tasks.countdown.prompts import render_prompt

    data = Path(args.data)
    if data.is_file():
        from rlft.tasks.countdown.loaders import load_countdown

        tasks, source = load_countdown(str(data), limit=args.prompts), f"{data} rows 0..{args.prompts - 1}"
    else:
        tasks, _ = make_splits(PRESETS["standard"], args.prompts, 1000, 1234)
        source = "the 'standard' generator preset (no --data file)"
    return [render_prompt(args.prompt_template, task, tokenizer) for task in tasks], source


def cpu_name() -> str:
    """The CPU's model name (:func:`rlft.provenance.cpu_name`) and core count."""
    return f"{provenance.cpu_name()}, {os.cpu_count()} cores"


def run_engine(engine, prompts, params) -> list[int]:
    out = engine.generate(prompts, params)
    return [len(s.completion_ids) for row in out for s in row]


def run_cb(model, prompt_ids, params, eos_ids, pad_id, batch_size, cuda_graph: bool = False) -> list[int]:
    """transformers' continuous batching; returns the completion lengths (the EOS counted, as rlft counts it).
    ``cuda_graph``: let it capture CUDA graphs (a GPU; bench/rollout_gpu.py)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

    threads = torch.get_num_threads()  # the generation thread gets the main thread's count (OpenMP's is per thread)
    loop = ContinuousBatchingManager._run_generation_loop
    if not getattr(loop, "same_threads", False):
        def same_threads(self, *args, **kwargs):
            torch.set_num_threads(threads)
            return loop(self, *args, **kwargs)

        same_threads.same_threads = True
        ContinuousBatchingManager._run_generation_loop = same_threads
    torch.manual_seed(params.seed)
    config = GenerationConfig(do_sample=True, temperature=params.temperature, top_k=0, top_p=1.0,
                              max_new_tokens=params.max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id,
                              num_return_sequences=params.k)
    # Sized for the workload (left to itself on a CPU it sizes a cache and a dense varlen mask from free memory,
    # tens of seconds of zero-filling a call): pages for every row's prompt and completion, a batch of every prompt.
    page = 256
    longest = max(map(len, prompt_ids)) + params.max_new_tokens
    options = dict(max_requests_per_batch=batch_size, return_logprobs=True, use_cuda_graph=cuda_graph, page_size=page,
                   num_blocks=batch_size * -(-longest // page) + batch_size,
                   max_batch_tokens=max(batch_size, sum(map(len, prompt_ids))))
    accepted = inspect.signature(
        ContinuousBatchingConfig).parameters  # older transformers (5.17) name the page block_size
    if "page_size" not in accepted and "block_size" in accepted:
        options["block_size"] = options.pop("page_size")
    cb = ContinuousBatchingConfig(**{k: v for k, v in options.items() if k in accepted})
    out = model.generate_batch(prompt_ids, generation_config=config, continuous_batching_config=cb,
                               max_new_tokens=params.max_new_tokens)
    if len(out) != len(prompt_ids) * params.k or any(o.error for o in out.values()):
        raise RuntimeError(f"generate_batch returned {len(out)} results for {len(prompt_ids) * params.k} requests")
    return [len(o.generated_tokens) for o in out.values()]


def distribution(lengths: list[int], limit: int) -> str:
    q = statistics.quantiles(lengths, n=10)
    return (
        f"mean {statistics.mean(lengths):.1f}, p10 {q[0]:.0f}, median {statistics.median(lengths):.0f}, "
        f"p90 {q[-1]:.0f}, "
        f"at the {limit}-token limit {sum(x >= limit for x in lengths) / len(lengths):.0%}")


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a model folder or the built-in smollm2-135m")
    parser.add_argument("--data", default="../shared/data/countdown/train.parquet")
    parser.add_argument("--prompt-template", default="short")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64, help="rows decoded together (rlft rl --gen-batch-size)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--candidates", default="drop,refill,generate",
                        help=f"comma-separated, each name[@rows][+stop], name one of {', '.join(CANDIDATES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--output", default=None, help="also write the report to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)  # before any work
    candidates = args.candidates.split(",")
    try:
        specs = {text: parse_candidate(text, args.batch_size) for text in candidates}
    except ValueError as e:
        parser.error(str(e))

    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)

    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.rollout import HFEngine, SamplingParams
    from rlft.rollout.hf import eos_token_ids
    from rlft.tasks.countdown.prompts import adds_special_tokens

    from benchlib import Report  # bench/ is on the path when the script runs (not when a test loads it)

    report = Report()
    say = report.say

    spec = pick_device("cpu", "auto")
    tokenizer = load_tokenizer(args.model)
    policy = load_model(args.model, spec)
    prompts, source = load_prompts(args, tokenizer)
    special = adds_special_tokens(args.prompt_template)
    base = HFEngine(policy, tokenizer, batch_size=args.batch_size, add_special_tokens=special,
                    copy_weights=spec.compute_dtype is not None, copy_dtype=spec.compute_dtype)
    sampler = base.sampler()  # the bf16 copy the RL loop samples from (or the model itself without mixed precision)
    engines = {text: HFEngine(sampler, tokenizer, batch_size=rows, add_special_tokens=special, decoder=name)
               for text, (name, rows, _) in specs.items() if name != "cb"}
    prompt_ids = base.encode_prompts(prompts)
    eos_ids = sorted(eos_token_ids(sampler, tokenizer))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]

    def sample(text: str, params) -> list[int]:
        name, rows, stop = specs[text]
        if name == "cb":
            return run_cb(sampler, prompt_ids, params, eos_ids, pad_id, rows)
        return run_engine(engines[text], prompts, replace(params, stop_repeats=STOP_REPEATS if stop else None))

    say(f"bench/rollout.py, {time.strftime('%Y-%m-%d %H:%M')}: {' '.join(sys.argv[1:]) or '(defaults)'}")
    say(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}); "
        f"torch {torch.__version__}, "
        f"transformers {transformers.__version__}")
    say(f"model: {args.model} ({spec.label}; sampling from {next(sampler.parameters()).dtype} weights); "
        f"prompts: {len(prompts)} '{args.prompt_template}' prompts from {source} "
        f"({min(map(len, prompt_ids))}-{max(map(len, prompt_ids))} tokens), "
        f"k={args.k}, T=1, {args.max_new_tokens} new tokens, batch {args.batch_size} unless a candidate says @rows")
    warm = SamplingParams(k=2, temperature=1.0, max_new_tokens=8, seed=0)
    for name in candidates:
        sample(name, warm)
    runs: dict[str, list[tuple[float, list[int]]]] = {name: [] for name in candidates}
    for r in range(args.rounds):
        params = SamplingParams(k=args.k, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed + r)
        for name in candidates:
            t0 = time.perf_counter()
            lengths = sample(name, params)
            seconds = time.perf_counter() - t0
            runs[name].append((seconds, lengths))
            say(f"round {r} {name:>15}: {seconds:6.1f} s, {sum(lengths)} tokens, "
                f"{sum(lengths) / seconds:6.1f} tokens/s; {distribution(lengths, args.max_new_tokens)}")
    rate = {name: sum(sum(lens) for _, lens in rs) / sum(s for s, _ in rs) for name, rs in runs.items()}
    say("")
    first = candidates[0]
    width = max(9, len(first) + 2)
    say(f"{'candidate':>15} {'wall s/run':>11} {'tokens/s':>9} {'x ' + first:>{width}}  completion lengths (all rounds)"
        )
    for name, rs in runs.items():
        ratio = f"{rate[name] / rate[first]:.2f}"
        say(f"{name:>15} {statistics.mean(s for s, _ in rs):11.1f} {rate[name]:9.1f} {ratio:>{width}}  "
            f"{distribution([x for _, lens in rs for x in lens], args.max_new_tokens)}")
    if args.output:
        report.write(args.output)


if __name__ == "__main__":  # a bad option, an existing --output: one line, exit 2
    run_script(main)
