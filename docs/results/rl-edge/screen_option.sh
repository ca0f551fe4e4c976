#!/bin/bash
# One option's screen (docs/results/rl-edge/README.md; screen_options.sh and screen_reward.sh run theirs with it):
# 4 RL steps from the same start with the uniform run's flags plus the option's, then its model scored greedily on
# the same first 100 fresh validation rows (per-task file OUT_DIR/screen_rl_opt_NAME.json, paired against
# screen_rl_order_none.json by scripts/studies/options_screen.py). Usage: screen_option.sh NAME SFT_MODEL OUT_DIR POOL
# FLAG...
# e.g. screen_option.sh hint_solution MODEL OUT POOL --hint solution. An --env among the flags is the evaluation's too
# (screen_option.sh calc_hint SFT_CALC OUT POOL --env countdown-calc --hint solver: its baseline is the calculator
# study's rl_calc_s0, the same recipe from the same start, docs/results/tools/rl.sh).
set -euo pipefail
name=$1; model=$2; out=$3; pool=$4; shift 4
env=(); prev=
for flag in "$@"; do [ "$prev" = --env ] && env=(--env "$flag"); prev=$flag; done
rlft rl --model "$model" --data "$pool" --advantage grpo --loss ppo --loss-mode seq_mean \
  --filter-groups --lora-r 16 --lora-alpha 32 --lr 2e-4 --k 8 --prompts-per-step 8 --max-steps 4 --max-new-tokens 256 \
  --eval-every 4 --eval-limit 100 --save-every 2 "$@" --output-dir "$out/rl_opt_$name"
rlft eval countdown --model "$out/rl_opt_$name/model" --data "$pool" --split validation --limit 100 \
  --max-new-tokens 256 "${env[@]}" --output "$out/screen_rl_opt_$name.json"
