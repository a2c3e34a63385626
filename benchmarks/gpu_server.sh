#!/usr/bin/env bash
# Server side by side on the GPU machine: `mlx-server` against `mlx_lm.server` at several
# numbers of concurrent streaming requests, through `xtask bench --server` (see
# xtask/src/bench/server.rs for what is measured), on random-weight models of real shapes.
#
# Run from the repository root, after `source /root/stash/activate.sh` (sourced here when
# PYTHONPATH lacks it):
#
#   bash benchmarks/gpu_server.sh [BIN_DIR] [--only VARIANTS] [-p N] [-g N] [--streams LIST]
#
#   BIN_DIR     release builds of mlx-server, mlx-generate and xtask (default .gpu/bin)
#   --only      comma-separated variants of xtask/py/make_bench_models.py
#               (default qwen2.5-0.5b-bf16)
#   -p / -g     prompt tokens / tokens generated per stream (128 / 128)
#   --streams   concurrency levels (default 1,8,32)
#
# Writes $OUT/server.md (the markdown blocks with provenance) and $OUT/server.log.
set -euo pipefail
BIN=.gpu/bin
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then BIN=$1; shift; fi
ONLY=qwen2.5-0.5b-bf16 P=128 G=128 STREAMS=1,8,32
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift 2 ;;
    -p) P=$2; shift 2 ;;
    -g) G=$2; shift 2 ;;
    --streams) STREAMS=$2; shift 2 ;;
    *) echo "gpu_server.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "${PYTHONPATH:-}" ] && [ -f /root/stash/activate.sh ]; then
  # shellcheck disable=SC1091
  source /root/stash/activate.sh
fi
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
MODELS=/tmp/bench-models
PY=python3
for b in mlx-server mlx-generate xtask; do
  [ -x "$BIN/$b" ] || { echo "gpu_server.sh: $BIN/$b is missing" >&2; exit 2; }
done
TOK_ARGS=()
for t in "$BIN/tok" .gpu/tok; do
  if [ -d "$t/llama3" ] && [ -d "$t/qwen2" ]; then TOK_ARGS=(--tokenizers "$t"); break; fi
done
"$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$ONLY" \
  ${TOK_ARGS[@]+"${TOK_ARGS[@]}"} 2>&1 | tee -a "$OUT/server.log" >&2
for m in ${ONLY//,/ }; do
  "$BIN/xtask" bench --server --ours "$BIN/mlx-server" --python "$PY" --model "$MODELS/$m" \
    -p "$P" -g "$G" --streams "$STREAMS" --out "$OUT/server.md" 2>&1 | tee -a "$OUT/server.log" >&2
done
cat "$OUT/server.md"
