"""What reusing a sample costs in wall time: one RL step's sampling against one update pass, on random-init weights.

Sample reuse (``--ppo-epochs r``, or ``--replay-size`` with r - 1 steps of staleness) trains on each generated
sample r times: a step then costs one sampling and about r update passes over a step's worth of samples (replay
trains on the fresh groups plus r - 1 steps' replayed ones in one pass of r times the rows). Whether that is cheap
depends on the machine: on this 2-core CPU the on-policy runs of ``docs/results/sample-reuse`` spent ~2/3 of a step
sampling (``time/generate_s`` 76 s against ``time/update_s`` 37 s, medians, ``real_sft_patient_grpo`` s0); here the
same split is measured where the built-in model cannot travel (a GPU: its GGUF is over the transfer limit).

The workload is ``rlft rl``'s step of the study: ``--prompts`` prompts x ``--k`` samples at T=1, at most
``--max-new-tokens`` new tokens, ``--gen-batch-size`` rows decoded together; the update trains on ``--train-groups``
of the groups (group filtering tries ~24 groups a step for the 8 it keeps in the study's on-policy run: 3,648
samples generated over 20 steps for 149 kept groups). The policy has LoRA r=16 on every linear layer of the blocks
and samples from a merged bfloat16 copy (``HFEngine(copy_weights=True)``, the device's default decoder: static on
CUDA, refill on the CPU); the update is PPO-clip, sequence-mean, ``--micro-batch-size`` rows a pass, AdamW (fused on
CUDA). A random model never samples EOS, so, as in ``bench/rollout_gpu.py``, the EOS logit gets a bias that makes
completions roughly geometric with mean ~1 / ``--eos-rate`` (capped). Each round: ``sample`` (the merge into the
sampling copy and ``generate``) then ``update`` (forward, backward and optimizer step over the trained samples),
after one untimed round.

Printed: median seconds of each, then the step time at reuse factor r = 1, 2, 4 (sample + r x update) relative to
on-policy, and generated samples per second at each r.

    python bench/reuse_cost.py --prompts 24 --train-groups 8 --output reuse_cost.json  # one GPU, SmolLM2-135M shape
    python bench/reuse_cost.py --quick                                          # a tiny shape on the CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "scripts"), str(ROOT / "bench")]

import gpu_bench  # noqa: E402
from rollout_gpu import BiasedEosTokenizer, bias_eos  # noqa: E402

from rlft.fsio import atomic_write_json  # noqa: E402
from rlft.lab.script_io import ArgumentParser, check_outputs, run_script  # noqa: E402

REUSE = (1, 2, 4)


def step_costs(sample_s: float, update_s: float, reuse=REUSE, samples: int = 1) -> list[dict]:
    """Per reuse factor r: a step's seconds (``sample_s + r * update_s``), that relative to r = 1, and generated
    samples per second (``samples`` a step)."""
    base = sample_s + update_s
    return [{"r": r, "step_s": sample_s + r * update_s, "vs_on_policy": (sample_s + r * update_s) / base,
             "samples_per_s": samples / (sample_s + r * update_s)} for r in reuse]


def main(argv=None) -> dict:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(gpu_bench.SHAPES), default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--eos-rate", type=float, default=0.007, help="about 1 / the mean completion length")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--gen-batch-size", type=int, default=64, help="rows decoded together (rlft rl's default)")
    parser.add_argument("--train-groups", type=int, default=None,
                        help="groups the update trains on (group filtering keeps some of those sampled); None: all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny shape, 2 prompts x 4, 16 tokens: a CPU smoke test")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)  # before any work
    if args.quick:
        args.shape, args.prompts, args.k, args.prompt_tokens, args.max_new_tokens = "tiny", 2, 4, 8, 16
        args.eos_rate, args.rounds = 0.1, 2

    from rlft.lora import apply_lora
    from rlft.losses.pg import make_objective
    from rlft.models import pick_device
    from rlft.recipes.optim import optimizer_kernels
    from rlft.rl.batch import PassPlan, policy_loss_backward, rollout_batch
    from rlft.rl.config import RLConfig
    from rlft.rollout.base import SamplingParams
    from rlft.rollout.hf import HFEngine

    spec = pick_device("auto", "auto")
    device = spec.device
    model = gpu_bench.build_model(argparse.Namespace(shape=args.shape, attn="sdpa"), spec)
    vocab = model.config.vocab_size
    tokenizer = BiasedEosTokenizer(vocab)
    bias = bias_eos(model, tokenizer.eos_token_id, args.eos_rate)  # on the LM head, kept by the sampling copy
    cfg = RLConfig(model="random", loss="ppo", loss_mode="seq_mean", lora_r=16, lora_alpha=32.0,
                   micro_batch_size=args.micro_batch_size)
    policy = apply_lora(model, cfg.lora_settings())
    objective = make_objective(cfg.policy, cfg.kl, cfg.importance)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6, **optimizer_kernels("adamw", params, sharded=False))
    engine = HFEngine(policy, tokenizer, batch_size=args.gen_batch_size, copy_weights=True,
                      copy_dtype=spec.compute_dtype)
    g = torch.Generator().manual_seed(0)
    prompts = [" ".join(map(str, torch.randint(1, vocab - 1, (args.prompt_tokens,), generator=g).tolist()))
               for _ in range(args.prompts)]
    plan = PassPlan(1.0, args.micro_batch_size)
    kept = args.train_groups or args.prompts  # groups each update trains on
    sampling = SamplingParams(k=args.k, temperature=1.0, max_new_tokens=args.max_new_tokens)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    decoder = engine.decoder_for(engine.sampler(), sampling)
    print(f"{name}, shape {args.shape}, {args.prompts} prompts x k={args.k} ({kept} groups "
          f"trained), <= {args.max_new_tokens} new tokens, {args.gen_batch_size} rows decoded together, "
          f"decoder {decoder}, micro-batch {args.micro_batch_size}, EOS bias {bias:.2f}", flush=True)

    def timed(fn):
        gpu_bench.sync(device)
        start = time.perf_counter()
        out = fn()
        gpu_bench.sync(device)
        return time.perf_counter() - start, out

    def sample(seed: int):
        engine.sync_weights(policy)  # forget the copy: the step's merge is part of its sampling cost
        return engine.generate(prompts, replace(sampling, seed=seed))

    def update(batch):
        optimizer.zero_grad(set_to_none=True)
        advantages = torch.randn(batch.input_ids.shape[0], generator=torch.Generator().manual_seed(0))
        policy_loss_backward(policy, batch, advantages.to(device), objective, plan)
        optimizer.step()

    rounds = []
    for r in range(args.rounds + 1):  # round 0 warms up (compilation, allocator) and is not counted
        sample_s, samples = timed(lambda: sample(1 + r))
        batch = rollout_batch(tokenizer, prompts[:kept], samples[:kept]).to(device)
        update_s, _ = timed(lambda: update(batch))
        lengths = [len(s.completion_ids) for row in samples for s in row]
        rounds.append({"round": r, "sample_s": sample_s, "update_s": update_s, "tokens": sum(lengths),
                       "mean_length": statistics.mean(lengths),
                       "at_limit": sum(n >= args.max_new_tokens for n in lengths) / len(lengths)})
        print(json.dumps(rounds[-1]), flush=True)
    timed_rounds = rounds[1:]
    sample_s = statistics.median(x["sample_s"] for x in timed_rounds)
    update_s = statistics.median(x["update_s"] for x in timed_rounds)
    costs = step_costs(sample_s, update_s, samples=args.prompts * args.k)
    print(f"sample {sample_s:.2f} s, update {update_s:.2f} s a step (medians of {len(timed_rounds)}): sampling is "
          f"{sample_s / (sample_s + update_s):.0%} of an on-policy step")
    for c in costs:
        print(f"r={c['r']}: {c['step_s']:.2f} s a step, {c['vs_on_policy']:.2f}x on-policy, "
              f"{c['samples_per_s']:.1f} generated samples/s")
    report = {"device": name, "torch": torch.__version__, "args": vars(args), "eos_bias": bias, "rounds": rounds,
              "trained_samples": kept * args.k,
              "sample_s": sample_s, "update_s": update_s, "costs": costs}
    if args.output:
        atomic_write_json(Path(args.output).expanduser(), report, indent=1)
    return report


if __name__ == "__main__":  # a bad option, an existing --output: one line, exit 2
    run_script(main)
