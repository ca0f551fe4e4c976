#!/usr/bin/env bash
# GPU check of the scale-out pieces, on one CUDA GPU with vLLM installed (pip install -e '.[vllm,remote,tensorboard]'),
# in <= 10 minutes with the built-in model (smollm2-135m). It cannot run on CPU-only machines (CI), which is why
# it is a script and not a test.
#
# What it does and checks, in order:
#   1. SFT on Countdown search traces with --packing --logits-chunk-size --report-to tensorboard (the padding-free
#      path on CUDA: flash-attention varlen when flash-attn is installed, else SDPA with the block-diagonal mask);
#      checks the first step's loss equals a padded run's (same data, same init) within 1e-2 (bf16).
#   2. RLOO from the SFT model (a few steps; with --rollout-engine vllm when the recipe has that option).
#   3. `rlft eval countdown` on the RLOO model with --rollout-engine hf, vllm and server (a `vllm serve` process
#      on 127.0.0.1), greedy; prints the three accuracies.
#   4. scripts/compare_engines.py, once against in-process vLLM and once against the server: greedy completions
#      identical to transformers' on >= 90% of prompts, and vLLM's sampled-token log-probs (temperature 1)
#      within mean |dlogp| <= 0.02 nats, p99 <= 0.25 nats of a transformers teacher-forced recompute (bf16 both
#      sides; see that script for float32 tolerances). Fails (exit 1) when a check fails or the run exceeds 600 s.
#
#   bash scripts/gpu_check.sh                 # OUT=runs/gpu_check MODEL=smollm2-135m PORT=8011 to change
set -euo pipefail

OUT=${OUT:-runs/gpu_check}
MODEL=${MODEL:-smollm2-135m}
PORT=${PORT:-8011}
PYTHON=${PYTHON:-python}
BUDGET_S=${BUDGET_S:-600}
rlft() { "$PYTHON" -m rlft.cli "$@"; }
START=$(date +%s)
SERVER_PID=""
cleanup() { if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null || true; fi; }
trap cleanup EXIT

"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU: this check needs one')"
"$PYTHON" -c "import vllm" || { echo "vLLM is not installed: pip install -e '.[vllm]'" >&2; exit 1; }
mkdir -p "$OUT"

echo "== 1. SFT (packed, chunked LM head, TensorBoard) and a padded reference step"
SFT_ARGS=(--model "$MODEL" --data countdown --num-train 640 --max-length 512 --batch-size 32 --micro-batch-size 16
          --lr 1e-4 --warmup-ratio 0.05 --save-every 0 --seed 0)
rlft sft "${SFT_ARGS[@]}" --max-steps 20 --output-dir "$OUT/sft" --packing --logits-chunk-size 2048 --report-to tensorboard
rlft sft "${SFT_ARGS[@]}" --max-steps 1 --output-dir "$OUT/sft_padded"
"$PYTHON" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
first = lambda run: json.loads(open(f"{out}/{run}/metrics.jsonl").readline())["loss/sft"]
packed, padded = first("sft"), first("sft_padded")
print(f"first-step SFT loss: packed {packed:.5f}, padded {padded:.5f}")
sys.exit(0 if abs(packed - padded) <= 1e-2 else "packed and padded first-step losses differ by more than 1e-2")
PY
test -n "$(ls "$OUT/sft/tensorboard")" || { echo "no TensorBoard events written" >&2; exit 1; }

echo "== 2. RLOO"
RLOO_ENGINE=()
RLOO_HELP=$(rlft rloo --help 2>/dev/null || true)
if grep -q -- "--rollout-engine" <<< "$RLOO_HELP"; then RLOO_ENGINE=(--rollout-engine vllm); fi
rlft rloo --model "$OUT/sft/model" --output-dir "$OUT/rloo" --max-steps 8 --prompts-per-step 16 --k 4 \
  --max-new-tokens 256 --save-every 0 ${RLOO_ENGINE[@]+"${RLOO_ENGINE[@]}"}

echo "== 3. eval countdown with each engine"
EVAL_ARGS=(--model "$OUT/rloo/model" --limit 128 --max-new-tokens 256 --mode greedy)
rlft eval countdown "${EVAL_ARGS[@]}" --rollout-engine hf --output "$OUT/eval_hf.json"
rlft eval countdown "${EVAL_ARGS[@]}" --rollout-engine vllm --output "$OUT/eval_vllm.json"
"$PYTHON" -m vllm.entrypoints.openai.api_server --model "$OUT/rloo/model" --host 127.0.0.1 --port "$PORT" \
  --dtype bfloat16 --gpu-memory-utilization 0.3 --seed 0 --generation-config vllm > "$OUT/vllm_server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 180); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "vllm serve exited; see $OUT/vllm_server.log" >&2; exit 1; }
  sleep 1
done
rlft eval countdown "${EVAL_ARGS[@]}" --rollout-engine server --rollout-url "http://127.0.0.1:$PORT/v1" --output "$OUT/eval_server.json"
"$PYTHON" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for engine in ("hf", "vllm", "server"):
    r = json.load(open(f"{out}/eval_{engine}.json"))
    print(f"eval countdown --rollout-engine {engine:>6}: accuracy {r['accuracy']:.3f}")
PY

echo "== 4. vLLM vs transformers: greedy completions and sampled-token log-probs"
"$PYTHON" scripts/compare_engines.py --model "$OUT/rloo/model" --server-url "http://127.0.0.1:$PORT/v1" --output "$OUT/compare_server.json"
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""
"$PYTHON" scripts/compare_engines.py --model "$OUT/rloo/model" --output "$OUT/compare_vllm.json"

ELAPSED=$(( $(date +%s) - START ))
echo "gpu_check: all checks passed in ${ELAPSED} s (budget ${BUDGET_S} s)"
if (( ELAPSED > BUDGET_S )); then echo "gpu_check: over the ${BUDGET_S} s budget" >&2; exit 1; fi
