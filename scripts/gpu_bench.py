"""One-device speed check of rlft's GPU paths on random-init weights of a real model's shape (nothing downloaded).

Decoding: tokens/s of :class:`rlft.rollout.hf.HFEngine` with its decoders 'drop' (rows leave the batch as they
finish) and 'static' (transformers' static-cache generate, CUDA graphs on a GPU), and 'generate' (transformers'
dynamic cache), at each ``--decode-rows``: ``--prompt-tokens`` random prompt tokens, ``--new-tokens`` sampled at
temperature 1. EOS is an id past the vocabulary, so every row runs to full length (checked).

Training: tokens/s and MFU of one SFT and one DPO optimizer step (the recipes' own ``sft_backward`` /
``preference_backward`` and ``optimizer_step``, AdamW) at each ``--sizes`` ROWSxLENGTH (row lengths uniform in
[LENGTH/2, LENGTH], a quarter prompt; DPO: ROWS/2 pairs, so ROWS sequences), in the modes eager (padded),
compile (``--compile``: rlft.recipes.memory.compile_layers) and compile+packing (``--packing``), micro-batches cut
by ``--max-tokens-per-micro-batch``. MFU = 6 x parameters x real tokens / step seconds / ``--peak-tflops``
(attention FLOPs not counted; tied embeddings counted once, as the LM head). ``--variants``: ``new`` (today's
kernels) and ``old`` (those of 2026-11-27: right-padded batches keep their attention mask, AdamW its foreach
kernels; :data:`rlft.ops.CAUSAL_RIGHT_PADDING_DEVICES`, :data:`rlft.recipes.optim.FUSED_ADAMW_DEVICES` emptied).

No run starts after ``--time-budget`` seconds (240: the whole script within 5 minutes on an H100; skipped runs
are listed). Order: decoding, then eager, compile, compile+packing training (the first compiled step of each
kind compiles, untimed). One table on stdout; ``--output`` writes the results as JSON (a new file, checked before the
model is built; an existing one needs ``--overwrite``). A user error is one line, exit code 2
(:mod:`rlft.lab.script_io`).

    python scripts/gpu_bench.py --output gpu_bench.json                        # SmolLM2-135M shape, H100: < 5 min
    python scripts/gpu_bench.py --shape qwen2.5-0.5b --output gpu_bench_qwen.json
    python scripts/gpu_bench.py --quick                                          # tiny shape, CPU, < 60 s
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rlft.data.tokenize import TokenizedExample  # noqa: E402
from rlft.models import pick_device  # noqa: E402
from rlft.precision import mark  # noqa: E402
import rlft.ops as ops  # noqa: E402
import rlft.recipes.optim as optim  # noqa: E402
from rlft.recipes.common import optimizer_step, prepare_training, step_micro_batches, step_order  # noqa: E402
from rlft.recipes.dpo import DPOConfig, build_preference_loss, pair_batch_tokens, preference_backward  # noqa: E402
from rlft.recipes.dpo_data import TokenizedPair  # noqa: E402
from rlft.recipes.memory import COMPILE_BACKEND_ENV, compile_layers  # noqa: E402
from rlft.recipes.sft import SFTConfig, micro_batch_tokens, sft_backward  # noqa: E402
from rlft.rollout.base import SamplingParams  # noqa: E402
from rlft.rollout.hf import HFEngine  # noqa: E402
from rlft.fsio import atomic_write_json  # noqa: E402
from rlft.lab.script_io import ArgumentParser, check_outputs, fail, run_script  # noqa: E402

SHAPES = {
    "smollm2-135m": ("llama", dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                   intermediate_size=1536, vocab_size=49152)),
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                   intermediate_size=4864, vocab_size=151936)),
    "tiny": ("llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=128, vocab_size=512)),
}
DECODERS = {"drop": "rlft drop", "static": "rlft static", "generate": "hf generate (dynamic)"}
MODES = ("eager", "compile", "compile+packing")
TODAYS_DEVICES = (ops.CAUSAL_RIGHT_PADDING_DEVICES, optim.FUSED_ADAMW_DEVICES)  # what --variants new restores


class IdTokenizer:
    """What HFEngine needs of a tokenizer: prompts are space-separated token ids; EOS is ``vocab`` (never sampled)."""

    def __init__(self, vocab: int):
        self.eos_token_id, self.pad_token_id = vocab, 0

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [[int(t) for t in text.split()] for text in texts]}

    def decode(self, ids, skip_special_tokens=True):
        return ""


def build_model(args, spec):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kind, fields = SHAPES[args.shape]
    config = (LlamaConfig if kind == "llama" else Qwen2Config)(
        **fields, tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=0, pad_token_id=0,
        eos_token_id=None)
    torch.manual_seed(0)
    with torch.device(spec.device):
        model = AutoModelForCausalLM.from_config(config, dtype=spec.dtype, attn_implementation=args.attn)
    return mark(model, spec.compute_dtype)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_decode(model, args, spec, rows: int, decoder: str) -> dict:
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(rows)
    prompts = [" ".join(map(str, torch.randint(1, vocab, (args.prompt_tokens, ), generator=g).tolist()))
               for _ in range(rows)]
    engine = HFEngine(model, IdTokenizer(vocab), batch_size=rows, decoder=decoder)
    params = SamplingParams(k=1, temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    # static compiles per shape: warm up on the very shape; the others need only their kernels loaded
    engine.generate(prompts, params if decoder == "static" else replace(params, max_new_tokens=4))
    sync(spec.device)
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    sync(spec.device)
    seconds = time.perf_counter() - t0
    tokens = sum(len(s.completion_ids) for row in out for s in row)
    return {"kind": "decode", "decoder": DECODERS[decoder], "rows": rows, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "full_length": tokens == rows * args.new_tokens}


def random_sequences(n: int, length: int, vocab: int, rng: random.Random,
                     prompt: int | None = None) -> list[TokenizedExample]:
    out = []
    for _ in range(n):
        size = rng.randint(max(2, length // 2), length)
        p = prompt or max(1, size // 4)
        out.append(TokenizedExample([rng.randrange(1, vocab) for _ in range(size)], [0] * p + [1] * (size - p), False))
    return out


def bench_train(task: str, mode: str, rows: int, length: int, model, spec, args, n_params: int, run_dir: Path,
                variant: str = "new") -> dict:
    old = variant == "old"  # the kernels of 2026-11-27 (module docstring); new: rlft's own defaults
    ops.CAUSAL_RIGHT_PADDING_DEVICES, optim.FUSED_ADAMW_DEVICES = ((), ()) if old else TODAYS_DEVICES
    vocab = model.config.vocab_size
    rng = random.Random(rows * 100_003 + length)
    options = dict(model="random-init", device=str(spec.device), lr=1e-5, save_every=0,
                   packing=mode == "compile+packing", compile=mode != "eager",
                   max_tokens_per_micro_batch=args.max_tokens_per_micro_batch, logits_chunk_size=args.logits_chunk_size,
                   output_dir=str(run_dir))
    if task == "sft":
        cfg = SFTConfig(**options, batch_size=rows, micro_batch_size=rows)
        examples = random_sequences(rows, length, vocab, rng)
        items = [examples[i] for i in step_order(list(range(rows)), lambda i: len(examples[i].input_ids), cfg)]
        tokens = sum(len(e.input_ids) for e in items)
        passes = len(step_micro_batches(items, cfg, micro_batch_tokens(cfg), False))
        backward = partial(sft_backward, model, items, cfg, 0, spec.device)
    else:
        n = max(1, rows // 2)
        cfg = DPOConfig(**options, batch_size=n, micro_batch_size=n)
        pairs = []
        for _ in range(n):
            chosen = random_sequences(1, length, vocab, rng)[0]
            p = chosen.loss_mask.index(1)
            rejected = random_sequences(1, length, vocab, rng, prompt=p)[0]
            rejected = TokenizedExample(chosen.input_ids[:p] + rejected.input_ids[p:], rejected.loss_mask, False)
            pairs.append(TokenizedPair(chosen, rejected))
        indices = step_order(list(range(n)),
                             lambda i: max(len(pairs[i].chosen.input_ids), len(pairs[i].rejected.input_ids)), cfg)
        ref = {k: torch.zeros(n) for k in ("chosen_sum", "rejected_sum", "chosen_mean", "rejected_mean")}  # not timed
        loss_fn = build_preference_loss(cfg)
        tokens = sum(len(p.chosen.input_ids) + len(p.rejected.input_ids) for p in pairs)
        passes = len(step_micro_batches(
            indices, cfg, lambda idx: pair_batch_tokens([pairs[i] for i in idx], cfg.packing), False))
        backward = partial(preference_backward, model, pairs, indices, ref, loss_fn, cfg, 0, spec.device)

    setup = prepare_training("random-init", run_dir, spec, cfg, resume=False, total_steps=1000,
                             load=lambda name, s: model)
    if spec.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.warmup + args.steps):  # the same batch each step: warm-up compiles every shape it needs
        sync(spec.device)
        t0 = time.perf_counter()
        backward()
        optimizer_step(setup, cfg.max_grad_norm)
        sync(spec.device)
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    seconds = sorted(times)[len(times) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30 if spec.device.type == "cuda" else float("nan")
    return {"kind": "train", "task": task, "mode": mode + ("" if variant == "new" else f" ({variant})"),
            "size": f"{rows}x{length}", "tokens": tokens, "micro_batches": passes, "step_s": seconds,
            "tokens_per_s": tokens / seconds, "mfu": 6 * n_params * tokens / seconds / (args.peak_tflops * 1e12),
            "peak_gib": peak}


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    add("--device", default="auto")
    add("--dtype", default="auto", help="rlft's --dtype: auto is bfloat16 weights on CUDA")
    add("--attn", default="sdpa", help="attn_implementation: sdpa, eager, flash_attention_2 (if installed)")
    add("--peak-tflops", type=float, default=790.0, help="the device's dense bf16 peak for MFU (H100 SXM: 989)")
    add("--decode-rows", default="64,256")
    add("--decoders", default="drop,static,generate")
    add("--prompt-tokens", type=int, default=64)
    add("--new-tokens", type=int, default=128)
    add("--sizes", default="16x256,32x512,64x1024", help="training steps, ROWSxLENGTH")
    add("--tasks", default="sft,dpo")
    add("--modes", default=",".join(MODES))
    add("--variants", default="new", help="new (today's kernels), old (2026-11-27's): see above")
    add("--max-tokens-per-micro-batch", type=int, default=16384)
    add("--logits-chunk-size", type=int, default=0)
    add("--warmup", type=int, default=1, help="untimed steps first (compilation happens there)")
    add("--steps", type=int, default=3, help="timed steps (the median is reported)")
    add("--compile-backend", default=None, help="torch.compile backend (default inductor; --quick: aot_eager)")
    add("--time-budget", type=float, default=240.0, help="seconds; runs that would start later are skipped")
    add("--quick", action="store_true", help="tiny shape and sizes, 1 timed step: a CPU smoke test")
    add("--output", default=None, help="write the results as JSON here (a new file)")
    add("--overwrite", action="store_true", help="replace an existing --output")
    if parser.parse_known_args(argv)[0].quick:  # --quick changes the defaults; options given explicitly still win
        parser.set_defaults(shape="tiny", decode_rows="4,8", prompt_tokens=8, new_tokens=8, sizes="4x32,8x64", steps=1,
                            max_tokens_per_micro_batch=256, compile_backend="aot_eager")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)
    if unknown := [m for m in args.modes.split(",") if m not in MODES]:
        fail(f"--modes: unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    if unknown := [v for v in args.variants.split(",") if v not in ("new", "old")]:
        fail(f"--variants: unknown variant(s) {', '.join(unknown)}; choose from new, old")
    if args.compile_backend:
        os.environ[COMPILE_BACKEND_ENV] = args.compile_backend
    return args


def print_table(meta: dict, results: list[dict]) -> None:
    print(f"\n{meta['device_name']} | shape {meta['shape']} ({meta['params'] / 1e6:.1f}M params) | "
          f"{meta['precision']} | attn {meta['attn']} | peak {meta['peak_tflops']:g} TFLOP/s for MFU | "
          f"torch {meta['torch']} | transformers {meta['transformers']} | compile backend {meta['compile_backend']}")
    print(f"{'what':<34}{'size':>10}{'tokens':>9}{'passes':>7}{'step ms':>10}{'tokens/s':>12}{'MFU %':>8}"
          f"{'peak GiB':>9}")
    for r in results:
        if r["kind"] == "decode":
            print(f"{'decode ' + r['decoder']:<34}{str(r['rows']) + ' rows':>10}{r['tokens']:>9}{'':>7}"
                  f"{r['seconds'] * 1e3:>10.0f}{r['tokens_per_s']:>12.0f}{'':>8}{'':>9}"
                  + ("" if r["full_length"] else "  (rows stopped early!)"))
        elif r["kind"] == "train":
            print(f"{r['task'] + ' ' + r['mode']:<34}{r['size']:>10}{r['tokens']:>9}{r['micro_batches']:>7}"
                  f"{r['step_s'] * 1e3:>10.0f}{r['tokens_per_s']:>12.0f}{100 * r['mfu']:>8.1f}{r['peak_gib']:>9.1f}")
        else:
            print(f"{r['what']:<34}  {r['kind']}: {r.get('reason', '')}")


def main(argv=None) -> dict:
    import transformers

    args = parse_args(argv)
    start = time.perf_counter()
    spec = pick_device(args.device, args.dtype)
    model = build_model(args, spec)
    n_params = sum(p.numel() for p in model.parameters())
    meta = {"device_name": torch.cuda.get_device_name(spec.device) if spec.device.type == "cuda" else "cpu",
            "shape": args.shape, "params": n_params, "precision": spec.label, "attn": args.attn,
            "peak_tflops": args.peak_tflops, "torch": torch.__version__, "transformers": transformers.__version__,
            "compile_backend": os.environ.get(COMPILE_BACKEND_ENV, "inductor"), "args": vars(args)}
    results: list[dict] = []

    def run(what: str, fn) -> None:
        if time.perf_counter() - start > args.time_budget:
            results.append({"kind": "skipped", "what": what, "reason": f"past --time-budget {args.time_budget:g} s"})
            return
        try:
            results.append(fn())
        except torch.OutOfMemoryError as e:  # report and go on: a later, smaller run may fit
            results.append({"kind": "failed", "what": what, "reason": f"out of memory: {str(e).splitlines()[0]}"})
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        print(json.dumps(results[-1]), flush=True)

    for decoder in args.decoders.split(","):
        for rows in map(int, args.decode_rows.split(",")):
            run(f"decode {decoder} {rows}", lambda: bench_decode(model, args, spec, rows, decoder))
    model.train()
    compiled = False
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            if mode != "eager" and not compiled:
                compile_layers(model)
                compiled = True
            for task in args.tasks.split(","):
                for i, size in enumerate(args.sizes.split(",")):
                    rows, length = map(int, size.lower().split("x"))
                    for variant in args.variants.split(","):
                        run_dir = Path(tmp) / f"{mode}-{task}-{i}-{variant}"
                        run(f"{task} {mode} {size} {variant}", lambda: bench_train(
                            task, mode, rows, length, model, spec, args, n_params, run_dir, variant))
    meta["seconds"] = time.perf_counter() - start
    print_table(meta, results)
    print(f"total {meta['seconds']:.0f} s")
    report = {"meta": meta, "results": results}
    if args.output:
        atomic_write_json(Path(args.output).expanduser(), report, indent=1)
    return report


if __name__ == "__main__":
    run_script(main)
