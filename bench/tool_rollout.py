"""Rollouts with tool calls on one machine, in one run: turn by turn (each call's context prefilled again) against
one continuous batch whose rows keep their KV cache across their calls.

The workload is Countdown with the calculator (``--env countdown-calc``): ``--rows`` fresh validation rows of
``--data`` (pool.parquet), the ``calc`` prompt, ``--max-new-tokens`` model tokens and ``--max-turns`` turns, greedy
(``--k 1 --temperature 0``: ``rlft eval countdown --env countdown-calc``) or sampled (``--k 8 --temperature 1``: an RL
step), on ``--model`` (a calc SFT model: one that calls the tool), sampled from a bfloat16 copy under CPU mixed
precision as ``rlft`` samples. Candidates:

- ``drop-turns``: turn by turn on :func:`rlft.rollout.decode.decode` (``decoder="drop"``, greedy's decoder before
  the inline rollouts);
- ``refill-turns``: turn by turn on :func:`rlft.rollout.refill.decode_jobs` (:func:`rlft.rollout.turns.generate_turns`
  with continuous batching per turn: sampling's decoder before);
- ``refill-inline``: :func:`rlft.rollout.turns.generate_turns_inline` (``HFEngine``'s default with tools now);
- ``generate-turns``: turn by turn on transformers ``generate`` (``decoder="generate"``: what a loop around
  ``generate`` does, as TRL's tool loop without vLLM).

Each runs once after the others' warm-up-free first call (a call is minutes, the warm-up small against it); printed:
wall seconds, model tokens/s, tool calls per sample, the mean Countdown score of its samples, and how many of its
samples equal the first candidate's (the same rollouts up to float rounding of cached against prefilled contexts: in
bfloat16 a greedy near-tie flips now and then, and the row goes its own way from there).

    OMP_NUM_THREADS=2 python bench/tool_rollout.py --model runs/sft_calc/model --rows 32 \\
        --output docs/results/speed/data/tool_rollout_cpu_<date>.txt
"""

from __future__ import annotations

import time

import torch

from rlft.lab.script_io import ArgumentParser, check_outputs, run_script

CANDIDATES = ("drop-turns", "refill-turns", "refill-inline", "generate-turns")


def rollouts(name: str, engine, prompts: list[str], contexts: list[dict], params, tool_use):
    """The candidate ``name``'s samples (B lists of k)."""
    from rlft.rollout.hf import encode_prompts, eos_token_ids
    from rlft.rollout.refill import decode_jobs
    from rlft.rollout.turns import generate_turns

    if name != "refill-turns":
        engine.decoder = {"drop-turns": "drop", "refill-inline": "auto", "generate-turns": "generate"}[name]
        return engine.generate(prompts, params, tool_use=tool_use, contexts=contexts)
    model, tok = engine.sampler().eval(), engine.tokenizer
    eos = sorted(eos_token_ids(model, tok))

    def decode_turn(turn_prompts, jobs, seeds, budgets, stop):
        return decode_jobs(model, turn_prompts, jobs, params, eos, batch_size=engine.batch_size,
                           pad_id=tok.pad_token_id or eos[0], seed=params.seed, loop_stop=stop, seeds=seeds,
                           budgets=budgets)

    ids = encode_prompts(tok, prompts, add_special_tokens=engine.add_special_tokens)

    from rlft.precision import compute_context

    with torch.no_grad(), compute_context(model):
        return generate_turns(decode_turn, tok, ids, params, tool_use, eos, contexts)


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="a model that calls the calculator (calc SFT)")
    parser.add_argument("--data", default="../shared/data/countdown/pool.parquet")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--candidates", default="drop-turns,refill-turns,refill-inline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32"],
                        help="auto: bfloat16 compute where the CPU has it (as rlft samples); float32: no rounding")
    parser.add_argument("--output", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    names = args.candidates.split(",")
    if unknown := [n for n in names if n not in CANDIDATES]:
        parser.error(f"unknown candidates {unknown}; expected some of {', '.join(CANDIDATES)}")
    check_outputs({"--output": args.output})

    from rlft.eval.countdown_command import EvalCountdownConfig, countdown_env, load_eval_tasks
    from rlft.models import load_tokenizer, pick_device
    from rlft.rewards.countdown import score_completions
    from rlft.rollout.base import SamplingParams
    from rlft.rollout.engines import make_engine
    from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt

    # the tasks, prompts, tools and engine of `rlft eval countdown --env countdown-calc --split validation`
    cfg = EvalCountdownConfig(model=args.model, data=args.data, split="validation", limit=args.rows,
                              env="countdown-calc", max_turns=args.max_turns)
    spec = pick_device("cpu", args.dtype)
    tok = load_tokenizer(args.model)
    tasks = load_eval_tasks(cfg)
    template, tool_use = countdown_env(cfg)
    prompts = [render_prompt(template, task, tok) for task in tasks]
    contexts = [task.ground_truth() for task in tasks]
    params = SamplingParams(k=args.k, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                            seed=args.seed)
    engine = make_engine("hf", args.model, tok, spec, batch_size=args.batch_size,
                         add_special_tokens=adds_special_tokens(template))
    lines, first = [f"tool rollouts: {args.rows} rows x k {args.k}, T {args.temperature}, {args.max_new_tokens} "
                    f"tokens, {args.max_turns} turns, dtype {args.dtype}, {torch.get_num_threads()} threads, "
                    f"{args.model}"], None
    for name in names:
        t0 = time.perf_counter()
        samples = [s for row in rollouts(name, engine, prompts, contexts, params, tool_use) for s in row]
        seconds = time.perf_counter() - t0
        scores = score_completions([p for p in prompts for _ in range(args.k)], [s.text for s in samples],
                                   [c for c in contexts for _ in range(args.k)])
        tokens = sum(s.model_tokens for s in samples)
        ids = [s.completion_ids for s in samples]
        first = first or (seconds, ids)
        same = sum(a == b for a, b in zip(first[1], ids))
        lines.append(f"{name:15s} {seconds:8.1f} s  {tokens / seconds:7.1f} model tok/s  x{first[0] / seconds:5.2f}  "
                     f"calls/sample {sum(s.tool_calls for s in samples) / len(samples):.2f}  "
                     f"score {sum(scores) / len(scores):.3f}  "
                     f"same samples as {names[0]}: {same}/{len(ids)}")
        print(lines[-1], flush=True)
    if args.output:
        from rlft.fsio import atomic_write_text

        atomic_write_text(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    run_script(main)
