#!/usr/bin/env bash
# The H200 runs of session 14 (2026-12-03): several parts per device call, each part's
# output packed into one file ($OUT/<part>.tar.gz: a call returns at most 8 files).
# Run from the repository root on the device machine after the staging calls
# (`source /root/stash/activate.sh`, our release binaries in /root/bins/new, the
# tokenizers in /root/stash/tok):
#
#   DEADLINE=540 bash benchmarks/gpu_session14.sh PART [PART...]
#
# A part is started only while fewer than DEADLINE seconds have passed since the script
# began (so one call stays inside the device's 600 s), and is cut at what is left.
#
#   lora       issue 24: benchmarks/gpu_lora.sh (1B bf16 LoRA, 8B 4-bit QLoRA), 1 round
#   structured issue 20: benchmarks/gpu_structured.sh (0.5B and 8B bf16, 1 and 32 streams)
#   evaluate   issue 23: benchmarks/gpu_evaluate.sh (1B and 8B bf16, 1,000 requests)
#   disk       issue 25: benchmarks/gpu_disk_cache.sh (1B and 8B bf16, 4,000-token prompt)
#   next       issue 26: Qwen3-Next shape, decode A/B of our kernel switches + mlx-lm
#   nextpf     issue 26: Qwen3-Next shape, prefill and decode against mlx-lm (gpu.sh)
#   spec       issue 19: benchmarks/gpu_spec.sh on the "echo" shapes (a draft that agrees)
#              and a random 1B draft (one that does not), ours with MLX_SDPA_SPLIT_QUERIES=1
#   specsrv    issue 19: server aggregate decode at 1/8/32 streams, echo 8B target, with
#              and without its 4-bit draft (xtask bench --server, mlx-lm's server beside)
set -u
OUT=${OUT:-/tmp/out}
NEW=${NEW:-/root/bins/new}
DEADLINE=${DEADLINE:-540}
export MODELS=/tmp/bench-models
mkdir -p "$OUT" .gpu
[ -e .gpu/tok ] || ln -s /root/stash/tok .gpu/tok
# shellcheck disable=SC1091
[ -n "${PYTHONPATH:-}" ] || source /root/stash/activate.sh >/dev/null
export BENCH_COMMIT=$(cat "$NEW/COMMIT" 2>/dev/null || echo unknown)
T0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
pack() { # PART DIR: one file per part
  tar -C "$2" -czf "$OUT/$1.tar.gz" . 2>/dev/null
  echo "== $1 packed ($(du -h "$OUT/$1.tar.gz" | cut -f1)), $(( $(date +%s) - T0 )) s elapsed"
}
for PART in "$@"; do
  L=$(left)
  if [ "$L" -lt 60 ]; then echo "== $PART skipped: $L s left"; continue; fi
  D=/tmp/parts/$PART
  rm -rf "$D"; mkdir -p "$D"
  echo "== $PART start ($L s left)"
  case "$PART" in
    lora)
      OUT=$D timeout "$L" bash benchmarks/gpu_lora.sh "$NEW" --rounds 1 > "$D/stdout.txt" 2>&1
      rm -rf "$D/adapters" "$D/data" ;;  # the trained adapters are over the 16 MB a file may bring back
    structured)
      OUT=$D timeout "$L" bash benchmarks/gpu_structured.sh "$NEW" > "$D/stdout.txt" 2>&1 ;;
    evaluate)
      OUT=$D timeout "$L" bash benchmarks/gpu_evaluate.sh "$NEW" > "$D/stdout.txt" 2>&1 ;;
    disk)
      OUT=$D timeout "$L" bash benchmarks/gpu_disk_cache.sh "$NEW" > "$D/stdout.txt" 2>&1 ;;
    next)
      OUT=$D ONLY=qwen3-next-80b-a3b-l4-4bit,qwen3-next-80b-a3b-l4-bf16 ROUNDS=1 N=2 MLX_LM=1 \
        timeout "$L" bash benchmarks/gpu_ab.sh base="$NEW" noqmv="$NEW:MLX_FAST_QMV=0" \
        nofuse="$NEW:MLX_FUSED_PROJECTIONS=0" > "$D/stdout.txt" 2>&1 ;;
    nextpf)
      OUT=$D timeout "$L" bash benchmarks/gpu.sh "$NEW" \
        --only qwen3-next-80b-a3b-l4-4bit,qwen3-next-80b-a3b-l4-bf16 \
        -p 512 -g 64 -n 2 --rounds 1 --startup-runs 0 --budget $((L - 20)) > "$D/stdout.txt" 2>&1 ;;
    spec)
      # The plain 8B shapes are not needed past this point: make room on the 64 GB disk.
      rm -rf "$MODELS"/llama-3.1-8b-bf16 "$MODELS"/llama-3.1-8b-4bit
      OUT=$D MLX_SDPA_SPLIT_QUERIES=1 STEP_TIMEOUT=120 timeout "$L" bash benchmarks/gpu_spec.sh "$NEW" \
        --pairs llama-3.1-8b-echo-bf16:llama-3.1-8b-echo-4bit,llama-3.1-8b-echo-bf16:llama-3.2-1b-echo-bf16,llama-3.1-8b-echo-bf16:llama-3.2-1b-bf16 \
        -k 3,5 > "$D/stdout.txt" 2>&1 ;;
    specsrv)
      M=$MODELS/llama-3.1-8b-echo-bf16
      python3 xtask/py/make_bench_models.py --out "$MODELS" --only llama-3.1-8b-echo \
        --tokenizers .gpu/tok > "$D/models.txt" 2>&1
      for arm in plain draft; do
        extra=()
        [ "$arm" = draft ] && extra=(--ours-arg=--draft-model --ours-arg="$MODELS/llama-3.1-8b-echo-4bit")
        MLX_SDPA_SPLIT_QUERIES=1 timeout $(( $(left) > 30 ? $(left) : 30 )) "$NEW/xtask" bench --server \
          --ours "$NEW/mlx-server" --python python3 --model "$M" -p 128 -g 128 \
          --streams 1,8,32 "${extra[@]}" --out "$D/server-$arm.md" > "$D/$arm.log" 2>&1
      done ;;
    *) echo "unknown part $PART" > "$D/stdout.txt" ;;
  esac
  echo "== $PART rc=$? ($(( $(date +%s) - T0 )) s elapsed)"
  tail -25 "$D/stdout.txt" 2>/dev/null
  pack "$PART" "$D"
done
df -h /tmp | tail -1
