#!/usr/bin/env bash
# Speculative decoding on the GPU machine (issue 19): our mlx-generate against
# `mlx_lm generate`, each with and without a draft model, on random-weight models of real
# shapes (xtask/py/make_bench_models.py; the 4-bit variant holds the bf16 variant's own
# weights quantized, so as a draft it agrees with its target on most tokens).
#
# Run from the repository root, after `source /root/stash/activate.sh` (as gpu.sh):
#
#   bash benchmarks/gpu_spec.sh [BIN_DIR] [-g N] [-k LIST] [--rounds R] [--models DIR]
#                               [--pairs LIST]
#
#   BIN_DIR   our release binaries (mlx-generate); default .gpu/bin
#   -g        generated tokens (256)
#   -k        draft lengths, comma-separated (3: mlx-lm's default; e.g. 3,5)
#   --rounds  processes per tool and setting, alternating ours / mlx-lm (1)
#   --pairs   target:draft pairs, comma-separated (default below)
#   --models  where the models are written (default /tmp/bench-models)
#
# Default pairs:
#   llama-3.1-8b-bf16:llama-3.1-8b-4bit   self-draft, mostly accepted (goal: >= 1.8x our
#                                         plain decode, ahead of mlx-lm's speculation)
#   llama-3.1-8b-bf16:llama-3.2-1b-bf16   random 1B draft of the same vocabulary: a
#                                         low-acceptance worst case (must not be much
#                                         slower than plain decoding)
# Each setting runs greedy (--temp 0) on one prompt with EOS never hit (random weights
# rarely produce it; the token count is checked). Writes $OUT/summary.md, $OUT/log.txt
# and $OUT/raw/<pair>.txt (every command and its output; ours also prints the accepted /
# drafted counts on stderr). Uses no network.
# Environment: OURS_SPEC_ARGS (extra flags for ours' speculative runs, e.g.
# "--draft-min-acceptance 0.5"); SKIP_MLX_LM=1 leaves mlx-lm's runs out ("-" in the table).
set -euo pipefail

BIN=.gpu/bin
G=256
KS=3
ROUNDS=1
MODELS=/tmp/bench-models
PAIRS=llama-3.1-8b-bf16:llama-3.1-8b-4bit,llama-3.1-8b-bf16:llama-3.2-1b-bf16
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
while [ $# -gt 0 ]; do
  case "$1" in
    -g) G=$2; shift ;;
    -k) KS=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --pairs) PAIRS=$2; shift ;;
    --models) MODELS=$2; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    -*) echo "gpu_spec.sh: unknown option $1" >&2; exit 2 ;;
    *) BIN=$1 ;;
  esac
  shift
done
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT/raw"
LOG=$OUT/log.txt
: >"$LOG"
log() { echo "[gpu_spec.sh] $*" | tee -a "$LOG" >&2; }
PY=${PYTHON:-python3}
if ! "$PY" -c 'import mlx_lm' 2>/dev/null && [ -f /root/stash/activate.sh ]; then
  # shellcheck disable=SC1091
  source /root/stash/activate.sh >>"$LOG" 2>&1
fi
GEN=$BIN/mlx-generate
[ -x "$GEN" ] || { log "missing $GEN"; exit 1; }

# ---- models: every shape named in the pairs, bf16 and 4-bit
SHAPES=$(echo "$PAIRS" | tr ',:' '\n\n' | sed -E 's/-(bf16|4bit)$//' | sort -u | paste -sd, -)
TOK_ARGS=()
for t in "$BIN/tok" .gpu/tok; do
  if [ -d "$t/llama3" ]; then TOK_ARGS=(--tokenizers "$t"); break; fi
done
log "making models ($SHAPES) in $MODELS"
"$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$SHAPES" ${TOK_ARGS[@]+"${TOK_ARGS[@]}"} 2>&1 | tee -a "$LOG" >&2

# One process; prints "tps accepted drafted" (accepted/drafted: ours only, else "-").
run_gen() {
  local raw=$1 who=$2; shift 2
  local out rc=0
  printf '### %s $ %s\n' "$who" "$(printf '%q ' "$@")" >>"$raw"
  out=$(timeout "$STEP_TIMEOUT" "$@" 2>&1) || rc=$?
  printf '%s\n### rc=%d\n' "$out" "$rc" >>"$raw"
  [ "$rc" = 0 ] || { echo "FAIL"; return; }
  local tps n acc
  tps=$(echo "$out" | sed -n 's/^Generation: \([0-9]*\) tokens, \([0-9.]*\) tokens-per-sec/\2/p' | tail -1)
  n=$(echo "$out" | sed -n 's/^Generation: \([0-9]*\) tokens.*/\1/p' | tail -1)
  acc=$(echo "$out" | sed -n 's/^Speculative: \([0-9]*\) of \([0-9]*\) drafted.*/\1 \2/p' | tail -1)
  [ "$n" = "$G" ] || log "WARNING: $who generated $n tokens, not $G"
  echo "$tps ${acc:-- -}"
}

SUMMARY=$OUT/summary.md
{
  echo "# Speculative decoding, $(date -u '+%Y-%m-%d %H:%M UTC'), commit ${BENCH_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
  echo
  echo "greedy, -g $G, best of $ROUNDS processes per cell; tokens/s (accepted/drafted)"
  echo
  echo "| target | draft | k | ours plain | ours spec | speedup | mlx-lm plain | mlx-lm spec | ours spec / mlx-lm spec |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$SUMMARY"
best() { sort -g | tail -1; }
for pair in ${PAIRS//,/ }; do
  target=${pair%%:*} draft=${pair##*:}
  raw=$OUT/raw/$target+$draft.txt
  : >"$raw"
  base=(--model "$MODELS/$target" --prompt "Write a long story about a dragon." -m "$G" --temp 0)
  ours_plain=() mlx_plain=()
  for ((i = 1; i <= ROUNDS; i++)); do
    ours_plain+=("$(run_gen "$raw" ours-plain "$GEN" "${base[@]}" | cut -d' ' -f1)")
    if [ "${SKIP_MLX_LM:-0}" = 1 ]; then mlx_plain+=("-"); else
      mlx_plain+=("$(run_gen "$raw" mlx-lm-plain "$PY" -m mlx_lm generate "${base[@]}" | cut -d' ' -f1)")
    fi
  done
  op=$(printf '%s\n' "${ours_plain[@]}" | best)
  mp=$(printf '%s\n' "${mlx_plain[@]}" | best)
  for k in ${KS//,/ }; do
    spec=(--draft-model "$MODELS/$draft" --num-draft-tokens "$k")
    os_all=() ms_all=() acc="-"
    for ((i = 1; i <= ROUNDS; i++)); do
      # shellcheck disable=SC2086
      r=$(run_gen "$raw" ours-spec "$GEN" "${base[@]}" "${spec[@]}" ${OURS_SPEC_ARGS:-})
      os_all+=("${r%% *}"); acc=$(echo "$r" | cut -d' ' -f2-)
      if [ "${SKIP_MLX_LM:-0}" = 1 ]; then ms_all+=("-"); else
        ms_all+=("$(run_gen "$raw" mlx-lm-spec "$PY" -m mlx_lm generate "${base[@]}" "${spec[@]}" | cut -d' ' -f1)")
      fi
    done
    os=$(printf '%s\n' "${os_all[@]}" | best)
    ms=$(printf '%s\n' "${ms_all[@]}" | best)
    ratio() { "$PY" -c "import sys; a, b = sys.argv[1:]; print(f'{float(a) / float(b):.2f}x' if a.replace('.', '').isdigit() and b.replace('.', '').isdigit() else '-')" "$1" "$2"; }
    echo "| $target | $draft | $k | $op | $os (${acc/ //}) | $(ratio "$os" "$op") | $mp | $ms | $(ratio "$os" "$ms") |" >>"$SUMMARY"
    log "$target <- $draft k=$k: ours plain $op spec $os ($acc), mlx-lm plain $mp spec $ms"
  done
done
cat "$SUMMARY"
