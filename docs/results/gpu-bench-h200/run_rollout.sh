#!/usr/bin/env bash
# The second device call behind this folder: bench/rollout_gpu.py (continuous batching against fixed batches on a
# synthetic RL sampling workload), one H200, from the repository root, results under $OUT (default /tmp/out).
set -uo pipefail
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 PYTHONPATH=src
python3 bench/rollout_gpu.py --output "$OUT/rollout_gpu.json" 2>&1 | grep -v "^USDT" | tee "$OUT/rollout_gpu_log.txt"
