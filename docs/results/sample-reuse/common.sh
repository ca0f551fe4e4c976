# Shared by rebuild.sh and confirm.sh (sourced from the repository root): paths, a log line, the frozen tree's
# ablation script, archived runs unpacked, and the copy of a run's step-10 checkpoint made while it trains (its runs
# keep one checkpoint).
ROOT=$(pwd); RUNS=$(realpath -m "${RUNS:-runs}"); FROZEN=$(realpath -m "${FROZEN:-../frozen}")
PY=$ROOT/.venv/bin/python; A=$RUNS/real/ablation; D=$ROOT/docs/results
log() { echo "$(date -u +%FT%T) $*"; }
sha16() { sha256sum "$1" | cut -c1-16; }
unzip_eval() {  # an archived evaluation without its cache key (archived keys hold mtimes: stale once rebuilt)
  $PY -c "import gzip, json, sys; d = json.load(gzip.open(sys.argv[1])); d.pop('cache_key', None)
json.dump(d, open(sys.argv[2], 'w'))" "$1" "$2"
}
frozen() { (cd "$FROZEN" && PYTHONPATH=src $PY scripts/countdown_ablation.py "$@"); }  # frozen tree 11717a2's script
unpack() {  # archived prefix (<data folder>/<name>), variant, seed, split: the archived run files and evaluations on
  # that split (the step-10 model's too), each where present, put where countdown_ablation.py and reuse_report.py read
  local src=$1_s$3 dst=$A/$2/s$3 out=eval_greedy_500.json f
  [ "$4" = validation ] && out=eval_val_greedy_500.json
  mkdir -p "$dst/run"
  for f in metrics.jsonl config.yaml; do if [ -f "${src}_$f" ]; then cp "${src}_$f" "$dst/run/$f"; fi; done
  if [ -f "${src}_eval_$4_greedy.json.gz" ]; then unzip_eval "${src}_eval_$4_greedy.json.gz" "$dst/$out"; fi
  if [ -f "${src}_step10_eval_$4_greedy.json.gz" ]; then
    mkdir -p "$dst/step10"; unzip_eval "${src}_step10_eval_$4_greedy.json.gz" "$dst/step10/$out"
  fi
}
keep_step10() {  # variant, seed: in the background, copy its step-10 checkpoint once written; sets KEEP (its pid)
  local f=$A/$1/s$2
  ( until [ -d "$f/run/checkpoints/step-00000010" ] || [ -d "$f/step10_checkpoint" ]; do sleep 10; done
    sleep 15; [ -d "$f/step10_checkpoint" ] || cp -r "$f/run/checkpoints/step-00000010" "$f/step10_checkpoint"
  ) & KEEP=$!
}
place_start_eval() {  # seed: real_sft_patient's archived validation evaluation, placed in the background once a step
  local f=$A/real_sft_patient/s$1 m n  # of its rebuild trained (placed before, it would skip the run)
  mkdir -p "$f"; [ -f "$f/run/model/model.safetensors" ] && return
  rm -f "$f/eval_val_greedy_500.json"; m=$f/run/metrics.jsonl; n=$(cat "$m" 2>/dev/null | wc -l)
  ( until [ "$(cat "$m" 2>/dev/null | wc -l)" -gt "$n" ]; do sleep 10; done
    unzip_eval "$D/countdown-real/data/sft_patient_s$1_eval_validation_greedy.json.gz" "$f/eval_val_greedy_500.json" ) &
}
