#!/usr/bin/env bash
# The device call behind this folder: bench/reuse_cost.py on one H200 (random-init weights; the built-in model's GGUF
# cannot travel), from the repository root, results under $OUT (default /tmp/out). The study's step: 24 groups of
# k=8 sampled for 8 trained (group filtering's ratio in real_sft_patient_grpo s0), 256 new tokens, mean ~150.
set -uo pipefail
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 PYTHONPATH=src
START=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/smi.txt"
run() {  # name, then bench/reuse_cost.py's arguments
  local name=$1; shift
  if (( $(date +%s) - START > ${STOP_AFTER_S:-330} )); then echo "$name skipped (time)"; return; fi
  python3 bench/reuse_cost.py "$@" --output "$OUT/$name.json" 2>&1 | grep -v "^USDT" | tee "$OUT/$name.txt"
}
run study_mb8 --prompts 24 --train-groups 8 --micro-batch-size 8
run study_mb64 --prompts 24 --train-groups 8 --micro-batch-size 64
run all_trained_mb64 --prompts 8 --micro-batch-size 64
run qwen_study_mb64 --shape qwen2.5-0.5b --prompts 24 --train-groups 8 --micro-batch-size 64
echo "total $(( $(date +%s) - START )) s"
