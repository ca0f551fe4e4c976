#!/bin/bash
# Issue 73's long horizon (docs/results/rl-horizon/README.md). One stage per call, each resumable:
#   run.sh sft SEED OUT POOL            patient SFT from the built-in model to its plateau: 300 steps of 16 on the
#                                       solver's traces of 50,000 generated standard tasks (none equal to a fresh
#                                       held-out row), a checkpoint every 50 steps (~1 h 40 min here)
#   run.sh sft-evals SEED OUT POOL      each SFT checkpoint and the final model/ scored greedily on the first 200
#                                       fresh validation rows
#   run.sh rl SEED OUT POOL MINUTES     the RL run from the step-300 model (start_SEED, countdown-real's recipe, 240
#                                       steps: 4x the 60-step run's samples) for MINUTES of its loop, then stops at a
#                                       checkpoint; call again to go on (--resume)
#   run.sh rl-evals SEED OUT POOL       each RL checkpoint (every 20 steps) merged into the start and scored as above
#   run.sh sftc SEED OUT POOL STEPS     the control: the same SFT run continued (same traces, same lr) to STEPS steps
#   run.sh curves SEED OUT MD PNG       scripts/studies/horizon_curves.py over every scored point
set -euo pipefail; shopt -s nullglob  # a stage with nothing to score yet loops over nothing
stage=$1; seed=$2; out=$3
sft=(--data countdown --preset standard --give-up 0 --max-tries 6 --num-train 50000 --trace-style bounded
     --prompt-template base --batch-size 16 --lr 1e-4 --schedule constant --warmup-ratio 0.03 --save-every 50
     --keep-checkpoints 16 --seed "$seed" --output-dir "$out/sft_s$seed")
last_step() {  # the last step a run's metrics.jsonl logs: its model/ (rlft before 2026-12-07 wrote no checkpoint then)
  python -c "import sys; from rlft.lab.script_io import read_metrics as r; print(r(sys.argv[1])[-1]['step'])" "$1"; }
val() { rlft eval countdown --model "$1" --data "$pool" --split validation --limit 200 --max-new-tokens 256 --output "$2"; }
case $stage in
  sft) pool=$4; rlft sft "${sft[@]}" --heldout-data "$pool" --max-steps 300
    [ -d "$out/start_s$seed" ] || cp -r "$out/sft_s$seed/model" "$out/start_s$seed"  # the RL start, kept past sftc
    sha256sum "$out/start_s$seed"/*.safetensors "$out/sft_s$seed"/checkpoints/step-*/*.safetensors ;;
  sftc) pool=$4; rlft sft "${sft[@]}" --heldout-data "$pool" --max-steps "$5" --resume ;;
  sft-evals) pool=$4
    for ck in "$out/sft_s$seed"/checkpoints/step-*; do
      step=$((10#${ck##*step-})); f="$out/val200_sft_s${seed}_$step.json"
      [ -f "$f" ] || val "$ck" "$f"
    done
    f="$out/val200_sft_s${seed}_$(last_step "$out/sft_s$seed/metrics.jsonl").json"
    [ -f "$f" ] || val "$out/sft_s$seed/model" "$f" ;;
  rl) pool=$4
    # --num-train 8000: 240 steps try up to 3,840 prompts, none twice (the default 2,000 would repeat them)
    rlft rl --model "$out/start_s$seed" --data "$pool" --num-train 8000 --advantage grpo --loss ppo \
      --loss-mode seq_mean --filter-groups --lora-r 16 --lora-alpha 32 --lr 2e-4 --k 8 --prompts-per-step 8 \
      --max-steps 240 --max-new-tokens 256 --compile --save-every 20 --keep-checkpoints 12 --seed "$seed" \
      --time-limit "$5" --resume --output-dir "$out/rl_s$seed" ;;
  rl-evals) pool=$4
    for ck in "$out/rl_s$seed"/checkpoints/step-*; do
      step=$((10#${ck##*step-})); f="$out/val200_rl_s${seed}_$step.json"; m="$out/merged/rl_s${seed}_$step"
      [ -f "$f" ] && continue
      [ -f "$m/config.json" ] || python -c "import sys; from rlft.lora import merge_adapter as m; m(*sys.argv[1:])" \
        "$out/start_s$seed" "$ck" "$m"
      val "$m" "$f"
    done
    if [ -f "$out/rl_s$seed/model/config.json" ]; then  # model/ (merged) is the last logged step's, time-limited too
      f="$out/val200_rl_s${seed}_$(last_step "$out/rl_s$seed/metrics.jsonl").json"
      [ -f "$f" ] || val "$out/rl_s$seed/model" "$f"
    fi ;;
  curves) md=$4; png=$5; args=(--curve "sft=$out/sft_s$seed/metrics.jsonl")
    for f in "$out"/val200_sft_s"${seed}"_*.json; do s=${f##*_}; args+=(--point "sft:${s%.json}=$f"); done
    if [ -f "$out/rl_s$seed/metrics.jsonl" ]; then
      args+=(--curve "rl=$out/rl_s$seed/metrics.jsonl" --from rl=sft:300 --point "rl:0=$out/val200_sft_s${seed}_300.json")
      for f in "$out"/val200_rl_s"${seed}"_*.json; do s=${f##*_}; args+=(--point "rl:${s%.json}=$f"); done
    fi
    python scripts/studies/horizon_curves.py "${args[@]}" --markdown "$md" --out "$png" --overwrite ;;
  *) echo "unknown stage $stage (sft, sft-evals, rl, rl-evals, sftc, curves)" >&2; exit 2 ;;
esac
