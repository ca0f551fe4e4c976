#!/bin/bash
# The named recipes' one look per seed at the fresh test rows (the first 300 of pool.parquet's 1,000 test rows),
# each counted in docs/results/tools/test_looks.jsonl. Named on 2026-12-06, before any look: sft_patient and
# sft_calc (run.sh) at 200,000 processed tokens. Usage: test.sh SEED OUT_DIR POOL
set -euo pipefail
seed=$1; out=$2; pool=$3; here=$(dirname "$0")
eval=(--data "$pool" --split test --limit 300 --max-new-tokens 256 --keep-completions --ledger "$here/test_looks.jsonl")
rlft eval countdown --model "$out/sft_patient_s$seed/model" "${eval[@]}" --output "$out/patient_s${seed}_test.json"
rlft eval countdown --model "$out/sft_calc_s$seed/model" --env countdown-calc "${eval[@]}" \
    --output "$out/calc_s${seed}_test.json"
