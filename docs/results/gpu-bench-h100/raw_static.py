import sys, time, torch
sys.path.insert(0, "scripts")
import gpu_bench as gb
args = gb.parse_args([])
from rlft.models import pick_device
spec = pick_device("auto", "auto")
model = gb.build_model(args, spec)
V = model.config.vocab_size
for rows in (64, 256):
    ids = torch.randint(1, V, (rows, 64), device="cuda"); am = torch.ones_like(ids)
    kw = dict(max_new_tokens=128, do_sample=True, temperature=1.0, cache_implementation="static", eos_token_id=V, pad_token_id=0)
    model.generate(input_ids=ids, attention_mask=am, **kw); torch.cuda.synchronize()
    t = time.perf_counter(); out = model.generate(input_ids=ids, attention_mask=am, **kw); torch.cuda.synchronize(); s = time.perf_counter() - t
    print({"raw transformers static": rows, "tokens_per_s": rows * 128 / s, "new": out.shape[1] - 64}, flush=True)
