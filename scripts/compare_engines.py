"""Compare a vLLM engine (in-process, or a `vllm serve` server) with transformers on held-out Countdown prompts.

Checks, on the same prompt token ids:

1. greedy completions: the fraction of prompts whose vLLM and transformers greedy completions are identical
   token for token must be >= --min-greedy-match (bf16 kernels differ, so a near-tie can flip an argmax; every
   mismatch is listed with its first diverging position);
2. sampled-token log-probs: completions sampled by vLLM at temperature 1 (its log-probs are then the
   sampling distribution's), rescored by transformers teacher-forced (:func:`rlft.ops.sequence_logprobs`, same
   dtype); the mean absolute difference per token must be <= --max-mean-abs and the 99th percentile
   <= --max-p99-abs.

Default tolerances are for bfloat16 on both sides: greedy match >= 0.9, mean |dlogp| <= 0.02 nats,
p99 <= 0.25 nats. With --dtype float32: use e.g. --min-greedy-match 0.98 --max-mean-abs 1e-3 --max-p99-abs 1e-2.

    python scripts/compare_engines.py --model runs/gpu_check/rloo/model                       # vLLM in-process
    python scripts/compare_engines.py --model runs/gpu_check/rloo/model --server-url http://127.0.0.1:8011/v1

Exit status 1 when a check fails; the numbers also go to --output (JSON: a new file, checked before anything loads;
an existing one needs --overwrite). A user error is one line, exit status 2 (:mod:`rlft.lab.script_io`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from rlft.fsio import atomic_write_json
from rlft.lab.script_io import ArgumentParser, check_outputs, run_script


def first_divergence(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--server-url", default=None,
                        help="compare a running OpenAI-compatible server instead of in-process vLLM")
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="sampled completions per prompt for the log-prob check")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--preset", default="easy3")
    parser.add_argument("--min-greedy-match", type=float, default=0.9)
    parser.add_argument("--max-mean-abs", type=float, default=0.02)
    parser.add_argument("--max-p99-abs", type=float, default=0.25)
    parser.add_argument("--output", default=None)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)

    from rlft.eval.countdown_command import EvalCountdownConfig, load_eval_tasks
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.ops import sequence_logprobs
    from rlft.rollout.base import SamplingParams
    from rlft.rollout.hf import HFEngine, encode_prompts
    from rlft.tasks.countdown.prompts import render_prompt

    spec = pick_device("cuda", args.dtype)
    tokenizer = load_tokenizer(args.model)
    tasks = load_eval_tasks(EvalCountdownConfig(model=args.model, preset=args.preset, limit=args.limit))
    prompts = [render_prompt("base", t, tokenizer) for t in tasks]
    greedy = SamplingParams(k=1, temperature=0.0, max_new_tokens=args.max_new_tokens, seed=0)
    sampled = SamplingParams(k=args.k, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)

    if args.server_url:
        from rlft.models import resolve_model
        from rlft.rollout.server import OpenAICompletionsEngine
        from rlft.rollout.vllm import _generation_config_eos

        other = OpenAICompletionsEngine(args.server_url, tokenizer,
                                        eos_token_ids=_generation_config_eos(resolve_model(args.model)))
        name = f"server {args.server_url}"
    else:
        from rlft.rollout.vllm import VLLMEngine

        other = VLLMEngine(args.model, dtype=args.dtype, tokenizer=tokenizer, return_logprobs=True,
                           gpu_memory_utilization=0.3, enforce_eager=True)
        name = "vLLM in-process"
    v_greedy = other.generate(prompts, greedy)
    v_sampled = other.generate(prompts, sampled)

    model = load_model(args.model, spec).eval()
    hf_greedy = HFEngine(model, tokenizer, batch_size=64).generate(prompts, greedy)
    mismatches = []
    for b, (v, h) in enumerate(zip(v_greedy, hf_greedy)):
        if v[0].completion_ids != h[0].completion_ids:
            mismatches.append({
                "prompt": b, "first_divergence": first_divergence(v[0].completion_ids, h[0].completion_ids),
                "vllm": v[0].text[:200], "hf": h[0].text[:200]
            })
    match = 1 - len(mismatches) / len(prompts)

    prompt_ids = encode_prompts(tokenizer, prompts)
    diffs = []
    with torch.no_grad():
        for b, samples in enumerate(v_sampled):
            for s in samples:
                if s.logprobs is None:
                    continue
                ids = torch.tensor([prompt_ids[b] + s.completion_ids], device=spec.device)
                mask = torch.zeros(ids.shape, device=spec.device)
                mask[0, len(prompt_ids[b]):] = 1
                hf = sequence_logprobs(model, ids, torch.ones_like(ids), mask)[0, len(prompt_ids[b]):].float().cpu()
                diffs.append((hf - torch.tensor(s.logprobs)).abs())
    if not diffs:
        print("no sampled log-probs came back: cannot check them", file=sys.stderr)
        return 1
    d = torch.cat(diffs)
    report = {
        "engine": name, "model": args.model, "dtype": args.dtype, "prompts": len(prompts), "greedy_match": match,
        "greedy_mismatches": mismatches, "logprob_tokens": int(d.numel()), "logprob_mean_abs": d.mean().item(),
        "logprob_p99_abs": d.quantile(0.99).item(), "logprob_max_abs": d.max().item(), "tolerances": {
            "min_greedy_match": args.min_greedy_match, "max_mean_abs": args.max_mean_abs,
            "max_p99_abs": args.max_p99_abs
        }
    }
    ok = match >= args.min_greedy_match and report["logprob_mean_abs"] <= args.max_mean_abs and report[
        "logprob_p99_abs"] <= args.max_p99_abs
    report["ok"] = ok
    print(
        f"{name} vs transformers ({args.dtype}, {len(prompts)} prompts): greedy identical {match:.3f} "
        f"(>= {args.min_greedy_match}); sampled-token |dlogp| mean {report['logprob_mean_abs']:.4f} "
        f"(<= {args.max_mean_abs}) "
        f"p99 {report['logprob_p99_abs']:.4f} (<= {args.max_p99_abs}) max {report['logprob_max_abs']:.4f} over "
        f"{report['logprob_tokens']} tokens: {'OK' if ok else 'FAIL'}")
    for m in mismatches[:5]:
        print(f"  greedy mismatch, prompt {m['prompt']} from token {m['first_divergence']}: "
              f"vllm={m['vllm'][:80]!r} hf={m['hf'][:80]!r}")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(args.output).expanduser(), report)
    return 0 if ok else 1


if __name__ == "__main__":
    run_script(lambda argv: sys.exit(main(argv)))
