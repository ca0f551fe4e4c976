#!/usr/bin/env bash
# After `make demo` (its folder DEMO, runs/demo by default), from the repository root: the demo's RL stage (5 steps of
# 8 prompts x 8 samples from its filtered model) again at seeds 1 and 2, and the filtered model and the three RL
# models evaluated greedy on the 500 validation rows (no test rows). Outputs in OUT (runs/demo_seeds by default);
# a stage that finished is skipped on a rerun, a killed RL run resumes.
set -eu
DEMO=$(realpath "${DEMO:-runs/demo}"); O=$(realpath -m "${OUT:-runs/demo_seeds}"); R=.venv/bin/rlft
mkdir -p "$O"
ev() { [ -f "$O/$2.json" ] || $R eval countdown --model "$1" --data ../shared/data/countdown/train.parquet \
  --split validation --limit 500 --prompt-template short --max-new-tokens 256 --batch-size 256 --output "$O/$2.json"; }
ev "$DEMO/filtered/model" filtered_val
ev "$DEMO/rl/model" rl_s0_val
for s in 1 2; do
  .venv/bin/python - "$DEMO" "$O" "$s" <<'PY'
import sys, yaml
demo, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = yaml.safe_load(open(f"{demo}/rl/config.yaml"))
c.update(model=f"{demo}/filtered/model", seed=seed)
yaml.safe_dump(c, open(f"{out}/rl_s{seed}.yaml", "w"))
PY
  [ -f "$O/rl_s$s/model/model.safetensors" ] || $R rl --config "$O/rl_s$s.yaml" --output-dir "$O/rl_s$s" \
    $( [ -d "$O/rl_s$s" ] && echo --resume )
  ev "$O/rl_s$s/model" "rl_s${s}_val"
done
$R eval compare "$O/filtered_val.json" "$O"/rl_s{0,1,2}_val.json
$R eval compare --seeds 3 "$O/filtered_val.json" "$O"/rl_s{0,1,2}_val.json  # their mean by task
