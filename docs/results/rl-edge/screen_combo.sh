#!/bin/bash
# The named combination's screen, 2 seeds (docs/results/rl-edge/README.md, "The combination, 2 seeds, against SFT
# continued"): from the calculator study's sft_calc_s{0,1} (docs/results/tools/run.sh), 4 RL steps with
# --env countdown-calc --hint solver --positive-weight 0.1 --reward countdown_accuracy (screen_option.sh: the uniform
# run's flags, seed = the SFT seed; its baseline is that study's rl_calc_s{seed}, the same recipe without the three
# options, docs/results/tools/rl.sh); then the control, SFT continued from the same start for the combination run's
# estimated FLOPs (calculator traces of generated tasks in a new data order, --seed 100+seed; --max-tokens = FLOPs /
# 6N rounded up, rlft.compute.sft_max_tokens; the archived runs rounded down, 1 token less, the same 48 and 51 steps);
# then the start, the control and (in screen_option.sh) the run scored with the calculator on the same first 100 fresh
# validation rows. Usage: screen_combo.sh OUT_DIR POOL (sft_calc_s0, _s1 in it)
set -euo pipefail
out=$1; pool=$2; here=$(dirname "$0")
val=(--env countdown-calc --data "$pool" --split validation --limit 100 --max-new-tokens 256)
for seed in 0 1; do
  bash "$here/screen_option.sh" "combo_s$seed" "$out/sft_calc_s$seed/model" "$out" "$pool" --env countdown-calc \
    --hint solver --positive-weight 0.1 --reward countdown_accuracy --seed "$seed"
done
for seed in 0 1; do
  budget=$(python -c "from pathlib import Path; import sys; from rlft.compute import sft_max_tokens as m
print(m(Path(sys.argv[1]), sys.argv[2]))" "$out/rl_opt_combo_s$seed/metrics.jsonl" "$out/sft_calc_s$seed/model")
  rlft sft --model "$out/sft_calc_s$seed/model" --data countdown --preset standard --give-up 0 --max-tries 6 \
    --num-train 4000 --heldout-data "$pool" --max-tokens "$budget" --batch-size 16 --lr 1e-4 --seed $((seed + 100)) \
    --save-every 0 --trace-style calc --prompt-template calc --output-dir "$out/sftc_calc_s$seed"
  rlft eval countdown --model "$out/sftc_calc_s$seed/model" "${val[@]}" --output "$out/screen_sftc_calc_s$seed.json"
done
for seed in 0 1; do
  rlft eval countdown --model "$out/sft_calc_s$seed/model" "${val[@]}" --output "$out/screen_start_calc_s$seed.json"
done
sha256sum "$out"/rl_opt_combo_s*/model/*.safetensors "$out"/sftc_calc_s*/model/*.safetensors
