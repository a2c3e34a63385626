#!/usr/bin/env bash
# Per-token host profile of batch-1 decode on the GPU machine, ours against mlx-lm.
#
# Run from the repository root after `source /root/stash/activate.sh` (see gpu.sh):
#
#   bash benchmarks/gpu_profile.sh [BIN_DIR]
#
#   BIN_DIR  holds our release mlx-benchmark and the decode_build example
#            (`cargo build --release -p mlx-engine --example decode_build`); default .gpu/bin
#
# Environment: OUT (default /tmp/prof-out), MODELS (/tmp/bench-models), ONLY (shapes,
# default qwen2.5-0.5b,llama-3.2-1b), P / G (prompt / generated tokens, 512 / 256),
# KNOBS=0 skips the MLX_MAX_OPS_PER_BUFFER sweep, EXTRA_ENV (space-separated VAR=VALUE
# sets, each run as one more variant of ours, e.g. "MLX_USE_CUDA_GRAPHS=0").
#
# For every model it records, in $OUT/log.txt:
#   - ours: `MLX_ENGINE_PROFILE=1 mlx-benchmark` (one line per generation: graph
#     construction, async_eval, wait+read and token-to-token means in us),
#   - ours: decode_build (construction and a synchronous eval per step, nothing else
#     running: the eval is MLX's encoding plus the device time),
#   - mlx-lm: benchmarks/profile_mlx_lm.py (the same split of generate_step's loop),
# then a sweep of MLX's CUDA-graph size (MLX_MAX_OPS_PER_BUFFER) on ours, and
# $OUT/summary.txt with the profile lines only.
set -u
BIN=${1:-.gpu/bin}
OUT=${OUT:-/tmp/prof-out}
MODELS=${MODELS:-/tmp/bench-models}
ONLY=${ONLY:-qwen2.5-0.5b,llama-3.2-1b}
P=${P:-512}
G=${G:-256}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[+$(($(date +%s) - T0))s] $*" | tee -a "$OUT/log.txt"; }
run() {
  log "\$ $*"
  timeout "${STEP_TIMEOUT:-150}" "$@" >>"$OUT/log.txt" 2>&1
  local rc=$?
  [ $rc = 0 ] || log "rc=$rc"
}

log "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
log "commit: ${BENCH_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null)}; nsys: $(command -v nsys || echo none)"
TOK=()
[ -d .gpu/tok/qwen2 ] && TOK=(--tokenizers .gpu/tok)
run "$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$ONLY" ${TOK[@]+"${TOK[@]}"}
VARIANTS=()
for s in ${ONLY//,/ }; do VARIANTS+=("$s-bf16" "$s-4bit"); done

for m in "${VARIANTS[@]}"; do
  d=$MODELS/$m
  log "== $m"
  run env MLX_ENGINE_PROFILE=1 "$BIN/mlx-benchmark" --model "$d" -p "$P" -g "$G" -n 2
  for e in ${EXTRA_ENV:-}; do
    run env MLX_ENGINE_PROFILE=1 "$e" "$BIN/mlx-benchmark" --model "$d" -p "$P" -g "$G" -n 2
  done
  run "$BIN/decode_build" "$d" "$P" 128
done

log "== mlx-lm"
paths=()
for m in "${VARIANTS[@]}"; do paths+=("$MODELS/$m"); done
run "$PY" benchmarks/profile_mlx_lm.py --model "${paths[@]}" -p "$P" -g "$G" -n 2

if [ "${KNOBS:-1}" != 0 ]; then
  for m in "${VARIANTS[@]:0:1}" "${VARIANTS[@]:2:1}"; do
    for ops in 30 300 1000; do
      log "== knob $m MLX_MAX_OPS_PER_BUFFER=$ops"
      run env MLX_ENGINE_PROFILE=1 MLX_MAX_OPS_PER_BUFFER=$ops "$BIN/mlx-benchmark" \
        --model "$MODELS/$m" -p "$P" -g "$G" -n 1
    done
  done
fi

grep -E '^\[\+|profile\]|^round|^Trial|^Averages|^build only' "$OUT/log.txt" >"$OUT/summary.txt"
log "done"
