"""The update half of an RL step, on fixed samples: where its seconds go, and what length-ordered micro-batches save.

One batch of real samples (``--prompts`` Countdown prompts x ``--k``, T=1, ``--max-new-tokens``, sampled once from
``--model``'s bfloat16 copy as ``rlft rl`` samples), then, in turn and ``--rounds`` times, on that same batch:

- ``rows``: the loss's forward and backward (:func:`rlft.rl.batch.policy_loss_backward`: PPO-clip, sequence-mean,
  LoRA r=16, ``--micro-batch-size`` rows a pass) with micro-batches of consecutive rows, a group's k samples
  together (``micro_batches(by_length=False)``, as before 2026-11-28);
- ``length``: the same with rows taken in order of length (``rlft rl``'s default since 2026-11-28);
- ``tokens`` (with ``--max-tokens N``): the same in micro-batches of at most N padded tokens, as many rows as fit
  (``rlft rl --max-tokens-per-micro-batch``, 2026-12-02);
- ``sync``: ``HFEngine.sync_weights`` then ``HFEngine.sampler()``: the merge of the LoRA policy into the bfloat16
  sampling copy after each update (``sync_weights`` only forgets the copy; the next sampling builds it).

Printed: seconds per candidate (median over rounds), its passes and the padded tokens they computed, and real
(unpadded, prompt included) tokens per second. ``--profile`` also prints torch.profiler's top operators of
one ``length`` pass.

    python bench/rl_update.py --model <an RL start> --rounds 3 --output docs/results/speed/data/rl_update_<date>.txt
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import torch

from rlft.lab.script_io import ArgumentParser, check_outputs, run_script


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the RL start (a model folder)")
    parser.add_argument("--data", default="../shared/data/countdown/train.parquet", help="Countdown-Tasks-3to4 rows")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="also time micro-batches of at most N padded tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="also print the top operators of one 'length' pass")
    parser.add_argument("--output", default=None, help="also write the printed lines here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)  # before any work

    from rlft.lora import apply_lora
    from rlft.losses.pg import make_objective
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.rl.batch import PassPlan, micro_batches, policy_loss_backward, rollout_batch
    from rlft.rl.config import RLConfig
    from rlft.rollout import HFEngine, SamplingParams
    from rlft.tasks.countdown.loaders import load_countdown
    from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt

    from benchlib import Report  # bench/ is on the path when the script runs (not when a test loads it)

    report = Report()
    say = report.say

    spec = pick_device("cpu", "auto")
    tokenizer = load_tokenizer(args.model)
    cfg = RLConfig(model=args.model, loss="ppo", loss_mode="seq_mean", lora_r=16, lora_alpha=32.0)
    model = apply_lora(load_model(args.model, spec), cfg.lora_settings())
    objective = make_objective(cfg.policy, cfg.kl, cfg.importance)
    prompts = [render_prompt("short", task, tokenizer) for task in load_countdown(args.data, limit=args.prompts)]
    special = adds_special_tokens("short")
    engine = HFEngine(model, tokenizer, batch_size=args.prompts * args.k, add_special_tokens=special,
                      copy_weights=True, copy_dtype=spec.compute_dtype)
    samples = engine.generate(prompts, SamplingParams(k=args.k, temperature=1.0, max_new_tokens=args.max_new_tokens,
                                                      seed=args.seed))
    batch = rollout_batch(tokenizer, prompts, samples, add_special_tokens=special)
    advantages = torch.randn(batch.input_ids.shape[0], generator=torch.Generator().manual_seed(args.seed))
    real = float(batch.attention_mask.sum())
    loss_tokens = float(batch.loss_mask.sum())
    say(f"bench/rl_update.py, {time.strftime('%Y-%m-%d %H:%M')}: {' '.join(sys.argv[1:])}")
    say(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {batch.input_ids.shape[0]} samples, "
        f"{real:.0f} real tokens ({loss_tokens:.0f} in the loss), lengths "
        f"{int(batch.attention_mask.sum(1).min())}-{int(batch.attention_mask.sum(1).max())}")

    def cut(name: str) -> list:
        max_tokens = args.max_tokens if name == "tokens" else None
        return list(micro_batches(batch, args.micro_batch_size, max_tokens, by_length=name != "rows"))

    import rlft.rl.batch as rl_batch

    original = rl_batch.micro_batches

    def loss_pass(by_length: bool, max_tokens: int | None = None) -> float:
        rl_batch.micro_batches = functools.partial(original, by_length=by_length)
        try:
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            policy_loss_backward(model, batch, advantages, objective,
                                 PassPlan(1.0, args.micro_batch_size, max_tokens=max_tokens))
            return time.perf_counter() - start
        finally:
            rl_batch.micro_batches = original

    def sync() -> float:
        start = time.perf_counter()
        engine.sync_weights(model)
        engine.sampler()
        return time.perf_counter() - start

    candidates = {"rows": functools.partial(loss_pass, False), "length": functools.partial(loss_pass, True)}
    if args.max_tokens:
        candidates["tokens"] = functools.partial(loss_pass, True, args.max_tokens)
    candidates["sync"] = sync
    for run in candidates.values():  # warm-up
        run()
    seconds: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(args.rounds):
        for name, run in candidates.items():
            seconds[name].append(run())
            say(f"round {r} {name:>6}: {seconds[name][-1]:.2f} s")
    say("")
    for name in candidates:
        median = statistics.median(seconds[name])
        extra = ""
        if name != "sync":
            parts = cut(name)
            extra = (f", {len(parts)} passes, {sum(mb.input_ids.numel() for _, mb in parts)} padded tokens computed, "
                     f"{real / median:.1f} real tokens/s")
        say(f"{name:>6}: {median:.2f} s (median of {', '.join(f'{s:.2f}' for s in seconds[name])}){extra}")
    say(f"rows / length = {statistics.median(seconds['rows']) / statistics.median(seconds['length']):.2f}x")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            loss_pass(True)
        say(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    if args.output:
        report.write(args.output)


if __name__ == "__main__":  # a bad option, an existing --output: one line, exit 2
    run_script(main)
