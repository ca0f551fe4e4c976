#!/usr/bin/env bash
# The second device call behind this folder: rlft rl's reuse paths on CUDA, end to end, from the repository root,
# results under $OUT (default /tmp/out). The built-in model's weights cannot travel: a random-init model of its shape
# gets its config and tokenizer ($ASSETS: the files of ~/.cache/rlft/models/smollm2-135m but model.safetensors, carried
# as an ignored folder), and the toy rule reward uppercase_start (a random model never solves Countdown, so every
# group would be filtered). Runs, 4 steps each, Countdown prompts, GRPO + group filtering + LoRA r=16: TOPR with
# replay (--replay-size 8 --max-staleness 1), PPO epochs 2, and on-policy; then a check of their metrics.
# TINY=1: a 2-layer model of the same vocabulary, for a CPU rehearsal; RUNS: which runs; MICRO_BATCH: rows a pass (8).
set -euo pipefail
OUT=${OUT:-/tmp/out}
ASSETS=${ASSETS:-.device_assets/smollm2-135m}
W=${WORK:-/tmp/reuse_rl}
export PYTHONUNBUFFERED=1 PYTHONPATH=src${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}  # EXTRA: pure-Python deps the image lacks (tyro)
rm -rf "$W"; mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version --format=csv 2>/dev/null || true
python3 - "$ASSETS" "$W/model" "${TINY:-0}" <<'PY'
import shutil, sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src, dst, tiny = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
config = AutoConfig.from_pretrained(src)
if tiny:
    config.update(dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, head_dim=16))
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config).save_pretrained(dst)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
PY
COMMON=(--model "$W/model" --reward uppercase_start --advantage grpo --filter-groups --lora-r 16 --lora-alpha 32
        --lr 2e-4 --max-steps 4 --prompts-per-step 8 --k 8 --max-new-tokens "${MAX_NEW_TOKENS:-128}" --save-every 2
        --eval-every 0 --no-eval-at-start --micro-batch-size "${MICRO_BATCH:-8}")
RUNS=${RUNS:-topr_replay ppo2 on_policy}
for run in $RUNS; do
  case $run in
    topr_replay) extra=(--loss topr --replay-size 8 --max-staleness 1) ;;
    ppo2) extra=(--loss ppo --ppo-epochs 2) ;;
    on_policy) extra=(--loss ppo) ;;
  esac
  start=$(date +%s)
  python3 -m rlft.cli rl "${COMMON[@]}" "${extra[@]}" --output-dir "$W/$run" > "$OUT/${run}_log.txt" 2>&1 \
    || { tail -20 "$OUT/${run}_log.txt"; exit 1; }
  echo "$run: $(( $(date +%s) - start )) s"
  cp "$W/$run/metrics.jsonl" "$OUT/${run}_metrics.jsonl"
  cp "$W/$run/environment.jsonl" "$OUT/${run}_environment.jsonl"
done
python3 - "$OUT" "$RUNS" <<'PY'
import json, math, sys
out = sys.argv[1]
failed = []
for run in sys.argv[2].split():
    rows = [json.loads(line) for line in open(f"{out}/{run}_metrics.jsonl")]
    steps = [r for r in rows if "time/step_s" in r]
    bad = [k for r in steps for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)]
    replayed = [r.get("replay/share", 0.0) for r in steps]
    env = json.loads(open(f"{out}/{run}_environment.jsonl").readline())
    print(f"{run}: {len(steps)} steps on {env.get('gpu') or env.get('cpu')} ({env.get('torch')}), step s "
          f"{[round(r['time/step_s'], 1) for r in steps]}, generate s {[round(r['time/generate_s'], 1) for r in steps]}, "
          f"update s {[round(r['time/update_s'], 1) for r in steps]}, reward {[round(r.get('reward/mean', -1), 2) for r in steps]}, "
          f"replayed share {[round(x, 2) for x in replayed]}, replayed |log ratio| mean / p99 "
          f"{[(round(r.get('replay/abs_log_ratio_mean', 0), 3), round(r.get('replay/abs_log_ratio_p99', 0), 3)) for r in steps]}")
    if len(steps) != 4 or bad:
        failed.append(f"{run}: {len(steps)} steps, non-finite {bad[:5]}")
    if run == "topr_replay" and not any(x > 0 for x in replayed[1:]):
        failed.append("topr_replay: no step trained on replayed groups")
sys.exit("; ".join(failed) if failed else 0)
PY
