#!/usr/bin/env bash
# The study's confirmation (README "Protocol", step 3), from the repository root, after rebuild.sh: the leader named on
# the validation screens, greedy on the 500 test rows in seeds 0 and 1, paired task by task against the on-policy run
# (its archived test evaluations, ../countdown-real's confirmation batch) at equal generated samples, and its step-10
# model (half the samples) against the same. Every test evaluation appends a line to <RUNS>/real/ablation/test_looks.jsonl.
#   docs/results/sample-reuse/confirm.sh reuse_ppo_r4            (RUNS=runs, FROZEN=../frozen by default)
# A seed whose two test evaluations are archived (data/<leader>_s<seed>_*) is unpacked, not trained or evaluated again:
# no new look. Seed 1 otherwise rebuilds real_sft_patient s1 first (~1 h here); the archived on-policy s1 run started
# from 0d84fe346dda772a. If the rebuild differs, the on-policy run trains again from it and is evaluated on the test
# rows as well. Each seed's new run files and test evaluations are archived into data/ (archive). Every stage that
# finished is skipped on a rerun.
set -uo pipefail
LEADER=${1:?name the leader (a variant of configs/countdown/ablation/5_reuse.yaml)}
source docs/results/sample-reuse/common.sh
O="--setting real --tasks 500 --steps 20 --no-start-eval --sft $RUNS/real/sft/model --out $A"
reference() {  # seed: the archived on-policy run (metrics, config, test evaluation) where reuse_report.py reads it
  unpack "$D/countdown-real/data/sft_patient_grpo" real_sft_patient_grpo "$1" test
}
archived() {  # seed: whether both of the leader's test evaluations of that seed are archived
  local src=$D/sample-reuse/data/${LEADER}_s$1
  [ -f "${src}_eval_test_greedy.json.gz" ] && [ -f "${src}_step10_eval_test_greedy.json.gz" ]
}
leader_on_test() {  # seed: the leader trained (unless its model exists), then its end and step-10 models on test rows
  [ -f "$A/$LEADER/s$1/run/model/model.safetensors" ] || keep_step10 "$LEADER" "$1"
  log "$LEADER s$1"
  frozen run $O --split test --seeds "$1" --variants "$LEADER"
  kill ${KEEP:-} 2>/dev/null; unset KEEP
  $PY scripts/countdown_ablation.py checkpoint $O --split test --seeds "$1" --step 10 --variants "$LEADER"
  log "$LEADER s$1: $(sha16 "$A/$LEADER/s$1/run/model/model.safetensors")"
}
archive() {  # variant, seed: its run files and test evaluations into data/ (evaluations gzipped without a time
  # stamp), and the ledger's new lines into data/confirmation_2026-12-02_test_looks.jsonl; nothing that is there already
  local f=$A/$1/s$2 dst=$D/sample-reuse/data/$1_s$2
  [ -f "$f/eval_greedy_500.json" ] || return 0
  for x in run/metrics.jsonl:metrics.jsonl run/config.yaml:config.yaml train_time.json:train_time.json; do
    [ -f "${dst}_${x#*:}" ] || { [ -f "$f/${x%%:*}" ] && cp "$f/${x%%:*}" "${dst}_${x#*:}"; }
  done
  $PY - "$f" "$dst" "$A/test_looks.jsonl" "$D/sample-reuse/data/confirmation_2026-12-02_test_looks.jsonl" <<'PY'
import json, sys
from pathlib import Path
from rlft.fsio import atomic_write_json
run, dst, looks, ledger = map(Path, sys.argv[1:])
for name, to in (("eval_greedy_500.json", "eval_test_greedy"), ("step10/eval_greedy_500.json", "step10_eval_test_greedy")):
    out = Path(f"{dst}_{to}.json.gz")
    if (run / name).is_file() and not out.exists():
        atomic_write_json(out, json.loads((run / name).read_text()))
old = ledger.read_text().splitlines() if ledger.exists() else []
new = [line for line in (looks.read_text().splitlines() if looks.exists() else []) if line not in old]
if new:
    ledger.write_text("".join(line + "\n" for line in old + new))
PY
}
reference 0
if archived 0; then unpack "$D/sample-reuse/data/$LEADER" "$LEADER" 0 test; else leader_on_test 0; archive "$LEADER" 0; fi
$PY scripts/studies/reuse_report.py --out "$A" --seed 0 --split test --tasks 500
if archived 1; then
  reference 1; unpack "$D/sample-reuse/data/$LEADER" "$LEADER" 1 test
else  # seed 1: the start (its archived validation evaluation placed once a step trained), then the leader
  place_start_eval 1
  frozen run $O --split validation --seeds 1 --sft-step-s 6.8 \
      --budget-from docs/results/countdown-real/data/rl_s1_metrics.jsonl --variants real_sft_patient
  START=$(sha16 "$A/real_sft_patient/s1/run/model/model.safetensors"); log "real_sft_patient s1: $START"
  if [ "$START" = 0d84fe346dda772a ]; then
    reference 1
  else  # not the archived start: the on-policy run from this one, its test evaluation a new look
    log "real_sft_patient s1 differs from the archived 0d84fe346dda772a: the on-policy run trains again"
    frozen run $O --split test --seeds 1 --variants real_sft_patient_grpo; archive real_sft_patient_grpo 1
  fi
  leader_on_test 1; archive "$LEADER" 1
fi
$PY scripts/studies/reuse_report.py --out "$A" --seed 1 --split test --tasks 500
