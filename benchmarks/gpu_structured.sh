#!/usr/bin/env bash
# Structured output on the GPU machine: mlx-server decode tok/s at 1 and 32 streams with
# and without a JSON-schema constraint, and the time to first token with a 50-property
# schema (benchmarks/structured_bench.py), on random-weight models of real shapes
# (xtask/py/make_bench_models.py: 0.5B and 8B). The target: constrained decode
# within 5% of unconstrained.
#
#   bash benchmarks/gpu_structured.sh [BIN_DIR] [--only VARIANTS] [-g N] [--streams LIST]
#                                     [--trials N]
#
#   BIN_DIR     release build of mlx-server (default .gpu/bin)
#   --only      variants of make_bench_models.py (default qwen2.5-0.5b-bf16,llama-3.1-8b-bf16)
#   --trials    pairs of runs (none / JSON schema, order flipped each pair) per level (1)
#
# MLX_ENGINE_PROFILE=0 runs the server without its profile lines (they are on by default
# here).
#
# Writes $OUT/structured.md and $OUT/structured.log (with the server's
# MLX_ENGINE_PROFILE lines: `grep 'mlx-engine profile' structured.log`).
set -euo pipefail
BIN=.gpu/bin
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then BIN=$1; shift; fi
ONLY=qwen2.5-0.5b-bf16,llama-3.1-8b-bf16 G=128 STREAMS=1,32 TRIALS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift 2 ;;
    -g) G=$2; shift 2 ;;
    --streams) STREAMS=$2; shift 2 ;;
    --trials) TRIALS=$2; shift 2 ;;
    *) echo "gpu_structured.sh: unknown argument $1" >&2; exit 2 ;;
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
[ -x "$BIN/mlx-server" ] || { echo "gpu_structured.sh: $BIN/mlx-server is missing" >&2; exit 2; }
TOK_ARGS=()
for t in "$BIN/tok" .gpu/tok; do
  if [ -d "$t/llama3" ] && [ -d "$t/qwen2" ]; then TOK_ARGS=(--tokenizers "$t"); break; fi
done
"$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$ONLY" \
  ${TOK_ARGS[@]+"${TOK_ARGS[@]}"} 2>&1 | tee -a "$OUT/structured.log" >&2
PORT=18931
for m in ${ONLY//,/ }; do
  # MLX_ENGINE_PROFILE: the server's host time per phase of its batched steps goes to
  # the log every 256 steps (docs/structured-output.md, "Performance").
  MLX_ENGINE_PROFILE=${MLX_ENGINE_PROFILE:-1} "$BIN/mlx-server" --model "$MODELS/$m" \
    --port "$PORT" >>"$OUT/structured.log" 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null || true' EXIT
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 1
  done
  "$PY" benchmarks/structured_bench.py --base-url "http://127.0.0.1:$PORT" -g "$G" \
    --streams "$STREAMS" --trials "$TRIALS" --label "$m" | tee -a "$OUT/structured.md"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  trap - EXIT
done
cat "$OUT/structured.md"
