#!/usr/bin/env bash
# GPU check of rlft's CUDA paths, on one CUDA GPU, in <= 10 minutes with the built-in model (smollm2-135m).
# It cannot run on CPU-only machines (CI), which is why it is a script and not a test. With vLLM installed
# (pip install -e '.[vllm,tensorboard]') it also checks the vllm and server rollout engines; without it, those
# steps are skipped and the run says so (the transformers engine is checked either way).
#
# What it does and checks, in order (every stage on CUDA in bfloat16, the default there):
#   1. SFT on Countdown search traces with --packing --logits-chunk-size --report-to tensorboard (the padding-free
#      path on CUDA: flash-attention varlen when flash-attn is installed, else SDPA with the block-diagonal mask);
#      checks the first step's loss equals a padded run's (same data, same init) within 1e-2 (bf16).
#   2. RLOO from the SFT model (a few steps; --rollout-engine vllm when vLLM is installed).
#   3. The RL loop's protocol recipe: GRPO advantages, PPO-clip loss, group filtering, LoRA (a few steps).
#   4. On-policy Countdown pairs from the SFT model, and RPO (DPO + NLL) with LoRA on chat preference pairs
#      (DPO_DATA, default: the UltraFeedback rows of tests/assets) -- the reference log-probs with adapters off.
#   5. `rlft eval countdown` on the RL model with --rollout-engine hf (and vllm and server, a `vllm serve` process
#      on 127.0.0.1, when vLLM is installed), greedy; prints the accuracies.
#   6. (vLLM only) scripts/compare_engines.py, once against in-process vLLM and once against the server: greedy
#      completions identical to transformers' on >= 90% of prompts, and vLLM's sampled-token log-probs
#      (temperature 1) within mean |dlogp| <= 0.02 nats, p99 <= 0.25 nats of a transformers teacher-forced
#      recompute (bf16 both sides; see that script for float32 tolerances).
# Every metric it reads must be finite; it prints each stage's throughput (median tokens/s from metrics.jsonl).
# Fails (exit 1) when a check fails or the run exceeds BUDGET_S.
#
#   bash scripts/gpu_check.sh       # OUT=runs/gpu_check MODEL=smollm2-135m PORT=8011 SFT_STEPS=20 SFT_LR=1e-4
#                                   # DPO_DATA=file.jsonl DPO_LIMIT=64 MAX_NEW_TOKENS=256 BUDGET_S=600 to change
set -euo pipefail

OUT=${OUT:-runs/gpu_check}
MODEL=${MODEL:-smollm2-135m}
PORT=${PORT:-8011}
PYTHON=${PYTHON:-python}
BUDGET_S=${BUDGET_S:-600}
SFT_STEPS=${SFT_STEPS:-20}
SFT_LR=${SFT_LR:-1e-4}
DPO_DATA=${DPO_DATA:-tests/assets/chat/h4_train_prefs.jsonl}
DPO_LIMIT=${DPO_LIMIT:-64}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-256}
rlft() { "$PYTHON" -m rlft.cli "$@"; }
START=$(date +%s)
SERVER_PID=""
cleanup() { if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null || true; fi; }
trap cleanup EXIT
stage() { echo "== $1 ($(( $(date +%s) - START )) s)"; }

"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU: this check needs one')"
HAVE_VLLM=1
"$PYTHON" -c "import vllm" 2>/dev/null || { HAVE_VLLM=0; echo "vLLM is not installed: the vllm and server engine checks are skipped (pip install -e '.[vllm]' to run them)"; }
"$PYTHON" -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}')"
mkdir -p "$OUT"

stage "1. SFT (packed, chunked LM head, TensorBoard) and a padded reference step"
SFT_ARGS=(--model "$MODEL" --data countdown --num-train 640 --max-length 512 --batch-size 32 --micro-batch-size 16
          --lr "$SFT_LR" --warmup-ratio 0.05 --save-every 0 --seed 0)
rlft sft "${SFT_ARGS[@]}" --max-steps "$SFT_STEPS" --output-dir "$OUT/sft" --packing --logits-chunk-size 2048 --report-to tensorboard
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

stage "2. RLOO"
ENGINE_ARGS=()
if (( HAVE_VLLM )); then ENGINE_ARGS=(--rollout-engine vllm); fi
rlft rloo --model "$OUT/sft/model" --output-dir "$OUT/rloo" --max-steps 8 --prompts-per-step 16 --k 4 \
  --max-new-tokens "$MAX_NEW_TOKENS" --save-every 0 ${ENGINE_ARGS[@]+"${ENGINE_ARGS[@]}"}

stage "3. RL loop: GRPO + PPO-clip + group filtering + LoRA"
rlft rl --model "$OUT/sft/model" --output-dir "$OUT/rl" --advantage grpo --loss ppo --loss-mode seq_mean \
  --filter-groups --max-prompt-batches 3 --lora-r 16 --lora-alpha 32 --lr 2e-4 --max-steps 4 --prompts-per-step 16 \
  --k 8 --max-new-tokens "$MAX_NEW_TOKENS" --save-every 2 --no-eval-at-start ${ENGINE_ARGS[@]+"${ENGINE_ARGS[@]}"}
test -f "$OUT/rl/model/config.json" || { echo "the RL run wrote no merged model" >&2; exit 1; }

stage "4. on-policy Countdown pairs, and RPO with LoRA on chat pairs"
rlft pairs countdown --model "$OUT/sft/model" --num-prompts 128 --num-samples 2 --max-new-tokens "$MAX_NEW_TOKENS" \
  --output "$OUT/pairs.jsonl"
rlft dpo --model "$OUT/sft/model" --data "$DPO_DATA" --limit "$DPO_LIMIT" --loss-type rpo --lora-r 16 --lora-alpha 32 \
  --lr 1e-4 --epochs 2 --batch-size 8 --micro-batch-size 4 --max-length 512 --save-every 0 --output-dir "$OUT/dpo"

stage "5. eval countdown"
ENGINES=(hf)
if (( HAVE_VLLM )); then ENGINES=(hf vllm server); fi
EVAL_ARGS=(--model "$OUT/rl/model" --limit 128 --max-new-tokens "$MAX_NEW_TOKENS" --mode greedy)
rlft eval countdown "${EVAL_ARGS[@]}" --rollout-engine hf --output "$OUT/eval_hf.json"
if (( HAVE_VLLM )); then
  rlft eval countdown "${EVAL_ARGS[@]}" --rollout-engine vllm --output "$OUT/eval_vllm.json"
  "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$OUT/rl/model" --host 127.0.0.1 --port "$PORT" \
    --dtype bfloat16 --gpu-memory-utilization 0.3 --seed 0 --generation-config vllm > "$OUT/vllm_server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 180); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "vllm serve exited; see $OUT/vllm_server.log" >&2; exit 1; }
    sleep 1
  done
  rlft eval countdown "${EVAL_ARGS[@]}" --rollout-engine server --rollout-url "http://127.0.0.1:$PORT/v1" --output "$OUT/eval_server.json"
fi
"$PYTHON" - "$OUT" "${ENGINES[@]}" <<'PY'
import json, sys
out = sys.argv[1]
for engine in sys.argv[2:]:
    r = json.load(open(f"{out}/eval_{engine}.json"))
    print(f"eval countdown --rollout-engine {engine:>6}: score {r['mean_score']:.3f}, accuracy {r['accuracy']:.3f}, "
          f"format {r['format_rate']:.3f}, truncated {r['truncated_rate']:.3f} on {r['num_tasks']} tasks")
PY

if (( HAVE_VLLM )); then
  stage "6. vLLM vs transformers: greedy completions and sampled-token log-probs"
  "$PYTHON" scripts/compare_engines.py --model "$OUT/rl/model" --server-url "http://127.0.0.1:$PORT/v1" --output "$OUT/compare_server.json"
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""
  "$PYTHON" scripts/compare_engines.py --model "$OUT/rl/model" --output "$OUT/compare_vllm.json"
fi

stage "throughput and finiteness"
"$PYTHON" - "$OUT" <<'PY'
import json, math, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
bad = []
for run in ("sft", "rloo", "rl", "dpo"):
    rows = [json.loads(line) for line in (out / run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        bad += [f"{run} step {row.get('step')}: {k} = {v}" for k, v in row.items()
                if isinstance(v, float) and not math.isfinite(v)]
    tps = [row["tokens_per_s"] for row in rows if "tokens_per_s" in row]
    losses = [row["loss"] for row in rows if "loss" in row] or [row.get("loss/sft") for row in rows if "loss/sft" in row]
    line = f"{run:>5}: {len(rows)} steps"
    if tps:
        line += f", median {statistics.median(tps):,.0f} tokens/s"
    if losses:
        line += f", loss {losses[0]:.4f} -> {losses[-1]:.4f}"
    step_s = [row["time/step_s"] for row in rows if "time/step_s" in row]
    if step_s:
        generate_s = statistics.median(row.get("time/generate_s", 0.0) for row in rows)
        line += f", median step {statistics.median(step_s):.1f} s (generation {generate_s:.1f} s)"
    rewards = [row["reward/mean"] for row in rows if "reward/mean" in row]
    if rewards:
        line += f", reward {rewards[0]:.3f} -> {rewards[-1]:.3f}"
    kept = sum(row.get("groups/kept", 0) for row in rows)
    if any("groups/kept" in row for row in rows):
        line += f", groups kept {kept} of {sum(row.get('groups/tried', 0) for row in rows)}"
    print(line)
pairs = sum(1 for _ in open(out / "pairs.jsonl"))
print(f"pairs countdown: {pairs} pairs from 128 prompts x 2 samples")
sys.exit("non-finite metrics:\n" + "\n".join(bad[:20]) if bad else 0)
PY

ELAPSED=$(( $(date +%s) - START ))
if (( HAVE_VLLM )); then WHAT="all checks"; else WHAT="all transformers-engine checks (vLLM ones skipped)"; fi
echo "gpu_check: $WHAT passed in ${ELAPSED} s (budget ${BUDGET_S} s)"
if (( ELAPSED > BUDGET_S )); then echo "gpu_check: over the ${BUDGET_S} s budget" >&2; exit 1; fi
