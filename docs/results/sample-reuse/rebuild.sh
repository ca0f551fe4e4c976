#!/usr/bin/env bash
# A fresh machine's way back to the screens, from the repository root: the SFT start (countdown-real "Reproduce",
# stopped at its step-350 checkpoint), real_sft_patient s0 (frozen tree 11717a2 with this study's 5_reuse.yaml), the
# archived evaluations the report pairs against, then each screen named on the command line (validation, seed 0),
# the evaluation of its kept step-10 model and the screens' table. Every stage that finished is skipped on a rerun.
#   docs/results/sample-reuse/rebuild.sh reuse_ppo_r4 reuse_topr_r4      (RUNS=runs, FROZEN=../frozen by default)
# Bit for bit only on an Intel CPU with AMX (the start hashes to 452f45f9e9c698ea, real_sft_patient to
# 816279fd50aaa582); the AMD rebuilds differ (countdown-real/adapters/README.md). Its times: this folder's README.
set -uo pipefail
source docs/results/sample-reuse/common.sh
CK=$RUNS/real/sft/checkpoints/step-00000350
if [ ! -f "$RUNS/real/sft/model/model.safetensors" ]; then
  $ROOT/.venv/bin/rlft sft --data countdown --preset standard --heldout-data ../shared/data/countdown/train.parquet \
      --num-train 8000 --heldout-size 1000 --trace-style bounded --give-up 0.6 --prompt-template short \
      --batch-size 16 --micro-batch-size 8 --max-steps 800 --lr 1e-4 --schedule constant --warmup-ratio 0.03 \
      --save-every 50 --keep-checkpoints 16 --output-dir "$RUNS/real/sft" $(ls -d "$RUNS"/real/sft/checkpoints/step-* \
      >/dev/null 2>&1 && echo --resume || { [ -d "$RUNS/real/sft" ] && echo --overwrite; }) &
  SFT=$!; until [ -f "$CK/model.safetensors" ]; do sleep 20; done; sleep 20; kill $SFT; wait $SFT
  mkdir -p "$RUNS/real/sft/model" && cp -r "$CK/." "$RUNS/real/sft/model/"
fi
log "SFT start: $(sha16 "$RUNS/real/sft/model/model.safetensors")"
[ -d "$FROZEN" ] || git worktree add --detach "$FROZEN" 11717a2
cp configs/countdown/ablation/5_reuse.yaml "$FROZEN/configs/countdown/ablation/"
# the archived runs: the on-policy reference, the start's validation evaluation, the screens already run
unpack "$D/countdown-real/data/sft_patient_grpo" real_sft_patient_grpo 0 validation
# the on-policy run's step-10 model (its first 10 steps rerun on 2026-12-02, equal at every step) on the same rows
unpack "$D/sample-reuse/data/real_sft_patient_grpo" real_sft_patient_grpo 0 validation
for f in "$D"/sample-reuse/data/reuse_*_s0_metrics.jsonl; do
  v=$(basename "$f" _s0_metrics.jsonl)  # a finished screen: its end evaluation archived
  [ -f "$D/sample-reuse/data/${v}_s0_eval_validation_greedy.json.gz" ] && unpack "$D/sample-reuse/data/$v" "$v" 0 validation
done
place_start_eval 0  # the start's archived evaluation
O="--setting real --tasks 500 --seeds 0 --steps 20 --no-start-eval --sft $RUNS/real/sft/model --out $A"
O="$O --split validation"
frozen run $O --sft-step-s 6.8 \
    --budget-from docs/results/countdown-real/data/rl_s0_metrics.jsonl --variants real_sft_patient
log "real_sft_patient: $(sha16 "$A/real_sft_patient/s0/run/model/model.safetensors")"
for v in "$@"; do
  keep_step10 "$v" 0
  log "$v"
  frozen run $O --variants "$v"
  kill $KEEP 2>/dev/null; $PY scripts/countdown_ablation.py checkpoint $O --step 10 --variants "$v"
  log "$v: $(sha16 "$A/$v/s0/run/model/model.safetensors")"
done
$PY scripts/studies/reuse_report.py --out "$A" --seed 0 --split validation --tasks 500
