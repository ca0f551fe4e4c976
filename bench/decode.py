"""Sampling throughput: rlft's decoding loop (finished rows leave the batch) vs transformers ``generate``.

Both sides are :class:`rlft.rollout.hf.HFEngine` on the same model, prompts, chunk size and sampling parameters;
only ``decoder`` differs (True: :func:`rlft.rollout.decode.decode`; False: ``model.generate``, which keeps
every row of a chunk in the forward pass until the chunk's last row stops). Prompts are Countdown training tasks
(``--preset``, ``--prompt-template``), k samples each. Prints, per side: wall seconds, completions/s, generated
tokens/s (tokens of the completions, EOS included: the useful work), mean and longest completion, and the peak
memory (CPU: max RSS, which only grows, so each side runs in its own process with ``--path``; CUDA: allocator peak).

    python bench/decode.py --path rlft     --model runs/bounded/sft/model --prompts 64 --k 2 --max-new-tokens 144
    python bench/decode.py --path generate --model runs/bounded/sft/model --prompts 64 --k 2 --max-new-tokens 144

With the same seed the two sides draw different random numbers once a row has left the batch, so their samples
(and lengths) differ; compare tokens/s, not seconds, and use enough prompts that the mean lengths agree.
"""

from __future__ import annotations

import argparse
import time

from benchlib import peak_memory

from rlft.models import load_model, load_tokenizer, pick_device
from rlft.rollout import HFEngine, SamplingParams
from rlft.tasks.countdown.generator import PRESETS, make_splits
from rlft.tasks.countdown.prompts import adds_special_tokens, render_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", choices=["rlft", "generate"], required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--preset", default="medium3")
    parser.add_argument("--prompt-template", default="short")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=144)
    parser.add_argument("--batch-size", type=int, default=64, help="rows generated together (HFEngine's chunk)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    spec = pick_device(args.device, "auto")
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, spec)
    tasks, _ = make_splits(PRESETS[args.preset], args.prompts, 1000, 1234)
    prompts = [render_prompt(args.prompt_template, task, tokenizer) for task in tasks]
    engine = HFEngine(model, tokenizer, batch_size=args.batch_size,
                      add_special_tokens=adds_special_tokens(args.prompt_template),
                      decoder="drop" if args.path == "rlft" else "generate")
    params = SamplingParams(k=args.k, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    engine.generate(prompts[:2], SamplingParams(k=1, temperature=0.0, max_new_tokens=4))  # warm-up
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    seconds = time.perf_counter() - t0
    lengths = [len(s.completion_ids) for row in out for s in row]
    truncated = sum(s.finish_reason == "length" for row in out for s in row)
    print(
        f"{args.path}: {len(lengths)} completions in {seconds:.1f} s on {spec.device}/{spec.dtype}: "
        f"{len(lengths) / seconds:.2f} completions/s, {sum(lengths) / seconds:.1f} generated tokens/s "
        f"(mean {sum(lengths) / len(lengths):.1f} tokens, longest {max(lengths)}, {truncated} cut at "
        f"{args.max_new_tokens}); "
        f"peak memory {peak_memory(spec.device)}")


if __name__ == "__main__":
    main()
