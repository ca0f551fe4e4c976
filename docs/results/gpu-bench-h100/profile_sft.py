"""Profile one rlft SFT step (compile or compile+packing) on the device: top CUDA kernels and a forward/backward/optimizer split."""
import sys, time, random, tempfile
from pathlib import Path
import torch
sys.path.insert(0, "scripts")
import gpu_bench as gb
from rlft.models import pick_device
from rlft.recipes.common import optimizer_step, prepare_training
from rlft.recipes.memory import compile_layers
from rlft.recipes.sft import SFTConfig, sft_backward

quick = "--quick" in sys.argv
args = gb.parse_args(["--quick"] if quick else [])
spec = pick_device("auto", "auto")
model = gb.build_model(args, spec); model.train()
compile_layers(model)
rows, length = (8, 64) if quick else (64, 1024)
packing = "--packing" in sys.argv
cfg = SFTConfig(model="random-init", device=str(spec.device), lr=1e-5, save_every=0, packing=packing, compile=True,
                max_tokens_per_micro_batch=1 << 20, logits_chunk_size=0, output_dir=tempfile.mkdtemp(), batch_size=rows, micro_batch_size=rows)
items = gb.step_order_examples(gb.random_sequences(rows, length, model.config.vocab_size, random.Random(1)), cfg)
setup = prepare_training("random-init", Path(cfg.output_dir), spec, cfg, resume=False, total_steps=100, load=lambda n, s: model)
cuda = spec.device.type == "cuda"
def sync():
    if cuda: torch.cuda.synchronize()
for _ in range(3):
    sft_backward(model, items, cfg, 0, spec.device); optimizer_step(setup, cfg.max_grad_norm)
sync()
t0 = time.perf_counter(); sft_backward(model, items, cfg, 0, spec.device); sync(); t1 = time.perf_counter()
optimizer_step(setup, cfg.max_grad_norm); sync(); t2 = time.perf_counter()
print(f"packing={packing} fwd+bwd {1e3*(t1-t0):.0f} ms, optimizer {1e3*(t2-t1):.0f} ms, tokens {sum(len(e.input_ids) for e in items)}")
acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
with torch.profiler.profile(activities=acts) as prof:
    sft_backward(model, items, cfg, 0, spec.device); optimizer_step(setup, cfg.max_grad_norm); sync()
key = "cuda_time_total" if cuda else "cpu_time_total"
print(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70))
