"""The sampled evaluation's workload with top-p: transformers' ``TopPLogitsWarper`` against rlft's ``TopPWarper``.

A sampled Countdown evaluation (``rlft eval countdown --mode sampled``; the ablation's ``--sampled``: k=4 at T 0.6,
top-p 0.95) samples through :func:`rlft.rollout.refill.decode_jobs` (HFEngine's CPU default), which filters every
row's logits with top-p at every step. Candidates, the same engine with one top-p filter swapped:

- ``transformers``: transformers' ``TopPLogitsWarper`` (sorts each row's whole vocabulary; rlft's filter until
  2026-11-29);
- ``rlft``: :class:`rlft.rollout.decode.TopPWarper` (the same kept tokens, found among the 256 most likely).

Both keep the same tokens, so with the same seed they draw the same samples: each round checks that the two
candidates' completions are identical, token for token (a difference is printed; it would mean the kept sets
differ on some row, which float rounding allows only when a row's mass above a token is within ~1e-6 of top-p).
The candidates run in turn, ``--rounds`` times (A B A B), after one untimed warm-up each, the seed ``--seed +
round``. Printed per run, then per candidate: wall seconds, tokens/s (generated tokens, EOS included) and the ratio to
``transformers``.

    python bench/top_p.py --threads 2                                  # built-in model, 16 prompts x 4, ~3 minutes
    python bench/top_p.py --model runs/real/sft/model --prompts 32 --rounds 2 --threads 2 \\
        --output docs/results/speed/data/top_p_cpu_<date>.txt          # the SFT start: the evaluation's workload
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from rlft.lab.script_io import ArgumentParser, check_outputs, run_script


def transformers_warpers(params):
    """:func:`rlft.rollout.decode.logits_warpers` with transformers' ``TopPLogitsWarper`` as its top-p filter."""
    from transformers import LogitsProcessorList, TopPLogitsWarper

    from rlft.rollout.decode import TopPWarper, logits_warpers

    swapped = [TopPLogitsWarper(w.top_p) if isinstance(w, TopPWarper) else w for w in logits_warpers(params)]
    return LogitsProcessorList(swapped)


CANDIDATES = ("transformers", "rlft")


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a model folder or the built-in smollm2-135m")
    parser.add_argument("--data", default="../shared/data/countdown/train.parquet")
    parser.add_argument("--prompt-template", default="short")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64, help="rows decoded together (the evaluation's batch)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--output", default=None, help="also write the report to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)  # before any work

    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)

    from benchlib import Report  # bench/ is on the path when the script runs
    from rollout import cpu_name, distribution, load_prompts

    import rlft.rollout.refill as refill
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.rollout import HFEngine, SamplingParams
    from rlft.tasks.countdown.prompts import adds_special_tokens

    report = Report()
    say = report.say
    spec = pick_device("cpu", "auto").for_inference()
    tokenizer = load_tokenizer(args.model)
    engine = HFEngine(load_model(args.model, spec), tokenizer, batch_size=args.batch_size,
                      add_special_tokens=adds_special_tokens(args.prompt_template))
    prompts, source = load_prompts(args, tokenizer)
    ours = refill.logits_warpers
    warpers = {"transformers": transformers_warpers, "rlft": ours}

    def sample(name: str, params) -> list[list[int]]:
        refill.logits_warpers = warpers[name]
        try:
            return [s.completion_ids for row in engine.generate(prompts, params) for s in row]
        finally:
            refill.logits_warpers = ours

    say(f"bench/top_p.py, {time.strftime('%Y-%m-%d %H:%M')}: {' '.join(sys.argv[1:]) or '(defaults)'}")
    say(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}); "
        f"torch {torch.__version__}, transformers {transformers.__version__}")
    say(f"model: {args.model} ({spec.label}); prompts: {len(prompts)} '{args.prompt_template}' prompts from {source}, "
        f"k={args.k}, T={args.temperature}, top-p {args.top_p}, {args.max_new_tokens} new tokens, "
        f"batch {args.batch_size}")
    warm = SamplingParams(k=2, temperature=args.temperature, top_p=args.top_p, max_new_tokens=8, seed=0)
    for name in CANDIDATES:
        sample(name, warm)
    seconds = {name: [] for name in CANDIDATES}
    tokens = {name: [] for name in CANDIDATES}
    for r in range(args.rounds):
        params = SamplingParams(k=args.k, temperature=args.temperature, top_p=args.top_p,
                                max_new_tokens=args.max_new_tokens, seed=args.seed + r)
        got = {}
        for name in CANDIDATES:
            t0 = time.perf_counter()
            got[name] = sample(name, params)
            seconds[name].append(time.perf_counter() - t0)
            lengths = list(map(len, got[name]))
            tokens[name].append(sum(lengths))
            say(f"round {r} {name:>12}: {seconds[name][-1]:6.1f} s, {sum(lengths)} tokens, "
                f"{sum(lengths) / seconds[name][-1]:6.1f} tokens/s; {distribution(lengths, args.max_new_tokens)}")
        differ = sum(a != b for a, b in zip(got["transformers"], got["rlft"]))
        n = len(got["rlft"])
        say(f"round {r}: " + ("identical samples" if not differ else f"{differ} of {n} samples differ"))
    say("")
    rate = {name: sum(tokens[name]) / sum(seconds[name]) for name in CANDIDATES}
    say(f"{'candidate':>12} {'wall s/run':>11} {'tokens/s':>9} {'x transformers':>15}")
    for name in CANDIDATES:
        say(f"{name:>12} {sum(seconds[name]) / len(seconds[name]):11.1f} {rate[name]:9.1f} "
            f"{rate[name] / rate['transformers']:15.2f}")
    if args.output:
        report.write(args.output)


if __name__ == "__main__":  # a bad option, an existing --output: one line, exit 2
    run_script(main)
