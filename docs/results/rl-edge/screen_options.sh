#!/bin/bash
# The screens of --hint solver and W-REINFORCE (docs/results/rl-edge/README.md): 4 RL steps from the calculator
# study's sft_patient_s0 with each option, the flags otherwise those of screen.sh's uniform run (whose model
# OUT_DIR/rl_order_none is the baseline: same seed, prompts and recipe); then the start, the baseline, the pass-rate
# run and both options scored greedily on the first 100 fresh validation rows (per-task files), and the paired
# differences against the baseline. Usage: screen_options.sh SFT_MODEL OUT_DIR POOL (after screen.sh)
set -euo pipefail
model=$1; out=$2; pool=$3; here=$(dirname "$0")
bash "$here/screen_option.sh" hint "$model" "$out" "$pool" --hint solver  # run and score: rl_opt_hint
bash "$here/screen_option.sh" wreinforce "$model" "$out" "$pool" --positive-weight 0.1
eval=(--data "$pool" --split validation --limit 100 --max-new-tokens 256)
rlft eval countdown --model "$model" "${eval[@]}" --output "$out/screen_start.json"
for run in rl_order_none rl_order_pass-rate; do
  rlft eval countdown --model "$out/$run/model" "${eval[@]}" --output "$out/screen_$run.json"
done
rlft eval compare "$out/screen_start.json" "$out/screen_rl_order_none.json" --json "$out/screen_start_vs_uniform.json"
rlft eval compare "$out/screen_rl_order_none.json" "$out/screen_rl_order_pass-rate.json" "$out/screen_rl_opt_hint.json" \
  "$out/screen_rl_opt_wreinforce.json" --json "$out/screen_vs_uniform.json"
