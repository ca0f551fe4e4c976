#!/bin/bash
# The calculator study's RL stage (docs/results/tools/README.md): from each arm's SFT model (run.sh), the same RL
# recipe in both arms (the countdown-real recipe of the rl-edge screens: GRPO, PPO loss, --filter-groups, LoRA r16 at
# 2e-4, 8 prompts x 8 samples, 256 model tokens, 4 steps on the pool's training rows), the calculator arm with
# --env countdown-calc; each run scored on 100 fresh validation rows at steps 0 and 4. Then the named recipes' one
# look per seed at the first 300 fresh test rows, counted in test_looks.jsonl. Named on 2026-12-06, before any look:
# "sft_patient + 4 RL steps" and "sft_calc + 4 RL steps". Usage: rl.sh SEED OUT_DIR POOL
set -euo pipefail
seed=$1; out=$2; pool=$3; here=$(dirname "$0")
recipe=(--data "$pool" --advantage grpo --loss ppo --loss-mode seq_mean --filter-groups --lora-r 16 --lora-alpha 32
        --lr 2e-4 --k 8 --prompts-per-step 8 --max-steps 4 --max-new-tokens 256 --eval-every 4 --eval-limit 100
        --save-every 2 --seed "$seed")
rlft rl --model "$out/sft_calc_s$seed/model" --env countdown-calc "${recipe[@]}" --output-dir "$out/rl_calc_s$seed"
rlft rl --model "$out/sft_patient_s$seed/model" "${recipe[@]}" --output-dir "$out/rl_patient_s$seed"
eval=(--data "$pool" --split test --limit 300 --max-new-tokens 256 --keep-completions --ledger "$here/test_looks.jsonl")
rlft eval countdown --model "$out/rl_patient_s$seed/model" "${eval[@]}" --output "$out/rl_patient_s${seed}_test.json"
rlft eval countdown --model "$out/rl_calc_s$seed/model" --env countdown-calc "${eval[@]}" \
    --output "$out/rl_calc_s${seed}_test.json"
sha256sum "$out"/rl_*_s"$seed"/model/*.safetensors
