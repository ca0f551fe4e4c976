#!/bin/bash
# The screen of the accuracy-only training reward (--reward countdown_accuracy: no 0.1 format credit), and pass@8 of
# the start, the uniform run and W-REINFORCE (docs/results/rl-edge/README.md). The RL run has screen_options.sh's flags
# and the uniform run's seed and prompts; its model is scored greedily on the same first 100 fresh validation rows and
# compared with the uniform run's (OUT_DIR/screen_rl_order_none.json, written by screen_options.sh). pass@8: 8 samples
# at temperature 1 on the first 60 of those rows, per-task files. Usage: screen_reward.sh SFT_MODEL OUT_DIR POOL
set -euo pipefail
model=$1; out=$2; pool=$3; here=$(dirname "$0")
bash "$here/screen_option.sh" accuracy "$model" "$out" "$pool" --reward countdown_accuracy  # rl_opt_accuracy, scored
eval=(--data "$pool" --split validation --max-new-tokens 256)
rlft eval compare "$out/screen_rl_order_none.json" "$out/screen_rl_opt_accuracy.json" --json "$out/screen_accuracy_vs_uniform.json"
rlft eval countdown --model "$model" "${eval[@]}" --limit 60 --mode sampled --k 8 --output "$out/passk_start.json"
for run in rl_order_none rl_opt_wreinforce rl_opt_accuracy; do
  rlft eval countdown --model "$out/$run/model" "${eval[@]}" --limit 60 --mode sampled --k 8 --output "$out/passk_$run.json"
done
