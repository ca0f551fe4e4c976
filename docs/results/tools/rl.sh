#!/bin/bash
# The calculator study's RL stage (docs/results/tools/README.md): from each arm's SFT model (run.sh), the same RL
# recipe in both arms (the countdown-real recipe of the rl-edge screens: GRPO, PPO loss, --filter-groups, LoRA r16 at
# 2e-4, 8 prompts x 8 samples, 256 model tokens, on the pool's training rows): the calculator arm (--env
# countdown-calc) 4 steps, the arm without the tool until its whole pipeline (SFT + RL) has used the calculator arm's
# estimated FLOPs (--max-flops: the calculator arm's SFT and RL FLOPs less its own SFT's; it stops at the end of the
# step that reaches them, so it gets up to one step more, never less). Each final model scored on 100 fresh
# validation rows, then the named recipes' one look per seed at the first 300 fresh test rows, counted in
# test_looks.jsonl. Named on 2026-12-06, before any look: "sft_calc + 4 RL steps" and "sft_patient + RL at the same
# pipeline FLOPs". Usage: rl.sh SEED OUT_DIR POOL (a calculator run already finished in OUT_DIR is kept)
set -euo pipefail
seed=$1; out=$2; pool=$3; here=$(dirname "$0")
recipe=(--data "$pool" --advantage grpo --loss ppo --loss-mode seq_mean --filter-groups --lora-r 16 --lora-alpha 32
        --lr 2e-4 --k 8 --prompts-per-step 8 --max-new-tokens 256 --eval-every 4 --eval-limit 100 --save-every 2
        --seed "$seed")
calc=$out/rl_calc_s$seed; patient=$out/rl_patient_s$seed
[ -f "$calc/model/model.safetensors" ] ||
  rlft rl --model "$out/sft_calc_s$seed/model" --env countdown-calc "${recipe[@]}" --max-steps 4 --output-dir "$calc"
budget=$(python -c "from pathlib import Path; from rlft.compute import final_flops as f; import sys; o = Path(sys.argv[1])
print(f(o / 'sft_calc_s$seed/metrics.jsonl') + f(o / 'rl_calc_s$seed/metrics.jsonl') - f(o / 'sft_patient_s$seed/metrics.jsonl'))" "$out")
rlft rl --model "$out/sft_patient_s$seed/model" "${recipe[@]}" --max-steps 12 --max-flops "$budget" --output-dir "$patient"
val=(--data "$pool" --split validation --limit 100 --max-new-tokens 256)
rlft eval countdown --model "$patient/model" "${val[@]}" --output "$out/rl_patient_s${seed}_validation.json"
rlft eval countdown --model "$calc/model" --env countdown-calc "${val[@]}" --output "$out/rl_calc_s${seed}_validation.json"
eval=(--data "$pool" --split test --limit 300 --max-new-tokens 256 --keep-completions --ledger "$here/test_looks.jsonl")
rlft eval countdown --model "$patient/model" "${eval[@]}" --output "$out/rl_patient_s${seed}_test.json"
rlft eval countdown --model "$calc/model" --env countdown-calc "${eval[@]}" --output "$out/rl_calc_s${seed}_test.json"
sha256sum "$calc"/model/*.safetensors "$patient"/model/*.safetensors
