#!/bin/bash
# The --curriculum pass-rate screen (docs/results/rl-edge/README.md): 4 RL steps from the calculator study's
# sft_patient_s0 (docs/results/tools/run.sh) with the uniform prompt order and with pass-rate selection over count_rank
# buckets, the countdown-real RL recipe (GRPO, PPO loss, group filtering, LoRA r16 at 2e-4, 8 prompts x 8 samples,
# 256 tokens), each scored on the first 100 fresh validation rows at steps 0 and 4; then the table and plot.
# Usage: screen.sh SFT_MODEL OUT_DIR POOL
set -euo pipefail
model=$1; out=$2; pool=$3; here=$(dirname "$0")
for arm in none pass-rate; do
  extra=(); [ "$arm" = pass-rate ] && extra=(--curriculum-buckets count_rank)
  rlft rl --model "$model" --data "$pool" --advantage grpo --loss ppo --loss-mode seq_mean \
    --filter-groups --lora-r 16 --lora-alpha 32 --lr 2e-4 --k 8 --prompts-per-step 8 --max-steps 4 --max-new-tokens 256 \
    --eval-every 4 --eval-limit 100 --save-every 2 --curriculum "$arm" "${extra[@]}" --output-dir "$out/rl_order_$arm"
done
python "$here/../../../scripts/studies/pass_rate_screen.py" --pass-rate "$out/rl_order_pass-rate/metrics.jsonl" \
  --uniform "$out/rl_order_none/metrics.jsonl" --markdown "$out/pass_rate_screen.md" --out "$out/pass_rate_screen.png"
