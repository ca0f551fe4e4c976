#!/usr/bin/env bash
# The device call behind this folder: one H200, from the repository root, results under $OUT (default /tmp/out).
# 1. scripts/gpu_bench.py: static-cache decoding at 64/256 rows; SFT and DPO --compile steps, padded, each batch in one
#    micro-batch, with today's kernels (new) and 2026-11-27's (old); 2. a profile of the SFT step, new and old.
set -uo pipefail
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 PYTHONPATH=src
START=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/smi.txt"
python3 scripts/gpu_bench.py --decoders static --decode-rows 64,256 --tasks sft,dpo --modes compile --variants new,old \
  --sizes 64x1024,128x1024 --max-tokens-per-micro-batch 131072 --logits-chunk-size 8192 --time-budget 240 \
  --output "$OUT/gpu_bench.json" 2>&1 | grep -v "^USDT" | tee "$OUT/gpu_bench_log.txt"
for variant in new old; do
  if (( $(date +%s) - START > ${PROFILE_BY_S:-400} )); then echo "profile $variant skipped (time)"; continue; fi
  python3 docs/results/gpu-bench-h200/profile_sft.py $([ $variant = old ] && echo --old) 2>&1 | grep -v "^USDT" \
    | tee "$OUT/profile_sft_$variant.txt"
done
echo "total $(( $(date +%s) - START )) s"
