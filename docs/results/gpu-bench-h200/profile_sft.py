"""Profile one rlft SFT step, compiled, padded, one micro-batch, on the device: a forward+backward / optimizer split
and the top CUDA kernels. ``--old``: the kernels of 2026-11-27 (attention mask kept, foreach AdamW; see
scripts/gpu_bench.py --variants). ``--rows R --length L`` (64 x 1024); ``--quick``: a tiny shape on the CPU."""
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, "scripts")
import gpu_bench as gb  # noqa: E402
import rlft.ops as ops  # noqa: E402
import rlft.recipes.common as common  # noqa: E402
from rlft.models import pick_device  # noqa: E402
from rlft.recipes.common import optimizer_step, prepare_training  # noqa: E402
from rlft.recipes.memory import compile_layers  # noqa: E402
from rlft.recipes.sft import SFTConfig, sft_backward  # noqa: E402


def option(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


quick, old = "--quick" in sys.argv, "--old" in sys.argv
if old:  # else rlft's own defaults
    ops.CAUSAL_RIGHT_PADDING_DEVICES, common.FUSED_ADAMW_DEVICES = (), ()
args = gb.parse_args(["--quick"] if quick else [])
spec = pick_device("auto", "auto")
model = gb.build_model(args, spec)
model.train()
compile_layers(model)
rows, length = (8, 64) if quick else (option("--rows", 64), option("--length", 1024))
cfg = SFTConfig(model="random-init", device=str(spec.device), lr=1e-5, save_every=0, compile=True,
                max_tokens_per_micro_batch=1 << 20, logits_chunk_size=0 if quick else 8192,
                output_dir=tempfile.mkdtemp(), batch_size=rows, micro_batch_size=rows)
items = gb.step_order_examples(gb.random_sequences(rows, length, model.config.vocab_size, random.Random(1)), cfg)
setup = prepare_training("random-init", Path(cfg.output_dir), spec, cfg, resume=False, total_steps=100,
                         load=lambda n, s: model)
cuda = spec.device.type == "cuda"


def sync():
    if cuda:
        torch.cuda.synchronize()


for _ in range(3):
    sft_backward(model, items, cfg, 0, spec.device)
    optimizer_step(setup, cfg.max_grad_norm)
sync()
t0 = time.perf_counter()
sft_backward(model, items, cfg, 0, spec.device)
sync()
t1 = time.perf_counter()
optimizer_step(setup, cfg.max_grad_norm)
sync()
t2 = time.perf_counter()
tokens = sum(len(e.input_ids) for e in items)
print(f"{'old' if old else 'new'} kernels, {rows}x{length}: fwd+bwd {1e3 * (t1 - t0):.0f} ms, optimizer "
      f"{1e3 * (t2 - t1):.0f} ms, tokens {tokens}, fused AdamW {setup.optimizer.defaults.get('fused')}")
acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
with torch.profiler.profile(activities=acts) as prof:
    sft_backward(model, items, cfg, 0, spec.device)
    optimizer_step(setup, cfg.max_grad_norm)
    sync()
key = "cuda_time_total" if cuda else "cpu_time_total"
print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70))
