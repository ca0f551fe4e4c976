#!/bin/bash
# The calculator study's screen (docs/results/tools/README.md): SFT on the solver's patient traces, with the
# calculator (--trace-style calc, --env countdown-calc) and without it (--trace-style bounded), at equal tokens
# processed (--max-tokens counts prompt, completion and observation tokens: equal FLOPs), then each model scored
# greedily on the first 300 fresh validation rows of pool.parquet. Usage: run.sh SEED OUT_DIR POOL (then test.sh for the named recipes)
set -euo pipefail
seed=$1; out=$2; pool=$3
budget=200000
common=(--data countdown --preset standard --give-up 0 --max-tries 6 --num-train 4000 --heldout-data "$pool"
        --max-tokens $budget --batch-size 16 --lr 1e-4 --seed "$seed" --save-every 0)
rlft sft "${common[@]}" --trace-style bounded --prompt-template base --output-dir "$out/sft_patient_s$seed"
rlft sft "${common[@]}" --trace-style calc --prompt-template calc --output-dir "$out/sft_calc_s$seed"
eval=(--data "$pool" --split validation --limit 300 --max-new-tokens 256)
rlft eval countdown --model "$out/sft_patient_s$seed/model" "${eval[@]}" --output "$out/patient_s${seed}_validation.json"
rlft eval countdown --model "$out/sft_calc_s$seed/model" --env countdown-calc "${eval[@]}" \
    --output "$out/calc_s${seed}_validation.json"
sha256sum "$out"/sft_*_s"$seed"/model/*.safetensors
