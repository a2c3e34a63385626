#!/usr/bin/env bash
# H200: time to first token of a ~4,000-token prompt right after an mlx-server restart,
# with and without the prompt cache's disk tier (--prompt-cache-dir), through
# benchmarks/disk_cache_ttft.py, on random-weight models of real shapes.
#
# Run from the repository root, after `source /root/stash/activate.sh` (sourced here when
# PYTHONPATH lacks it):
#
#   bash benchmarks/gpu_disk_cache.sh [BIN_DIR] [--only VARIANTS] [--tokens N] [--runs N]
#
#   BIN_DIR     release build of mlx-server (default .gpu/bin)
#   --only      comma-separated variants of xtask/py/make_bench_models.py
#               (default llama-3.2-1b-bf16,llama-3.1-8b-bf16)
#   --tokens    prompt tokens, about (4000)
#   --runs      restarts timed per mode (3)
#
# Writes $OUT/disk_cache.md (the markdown blocks) and prints them.
set -euo pipefail
BIN=.gpu/bin
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then BIN=$1; shift; fi
ONLY=llama-3.2-1b-bf16,llama-3.1-8b-bf16 TOKENS=4000 RUNS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    *) echo "gpu_disk_cache.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "${PYTHONPATH:-}" ] && [ -f /root/stash/activate.sh ]; then
  # shellcheck disable=SC1091
  source /root/stash/activate.sh
fi
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
MODELS=/tmp/bench-models
[ -x "$BIN/mlx-server" ] || { echo "gpu_disk_cache.sh: $BIN/mlx-server is missing" >&2; exit 2; }
TOK_ARGS=()
for t in "$BIN/tok" .gpu/tok; do
  if [ -d "$t/llama3" ] && [ -d "$t/qwen2" ]; then TOK_ARGS=(--tokenizers "$t"); break; fi
done
python3 xtask/py/make_bench_models.py --out "$MODELS" --only "$ONLY" \
  ${TOK_ARGS[@]+"${TOK_ARGS[@]}"} >&2
for m in ${ONLY//,/ }; do
  python3 benchmarks/disk_cache_ttft.py --bin "$BIN/mlx-server" --model "$MODELS/$m" \
    --tokens "$TOKENS" --runs "$RUNS" --out "$OUT/disk_cache.md"
done
cat "$OUT/disk_cache.md"
