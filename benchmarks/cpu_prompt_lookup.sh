#!/usr/bin/env bash
# Prompt-lookup speculation on the CPU with the real default model (issue 19).
#
# Prompt-copying tasks, greedy, each setting run as its own process, the settings
# interleaved in every round: ours plain, ours with prompt lookup (--prompt-lookup-ngram N
# --prompt-lookup-tokens K, a few N:K), and `mlx_lm generate` plain as the reference
# (mlx-lm has no draft-free speculation). Both tools load the same MLX directory: the
# default model (SmolLM2-135M-Instruct, 4-bit from its Q4_1 GGUF) that our binaries place
# in <mlx-rs cache>/models/SmolLM2-135M-Instruct on first use.
#
# Run from the repository root after `cargo build --release -p mlx-bins --bin mlx-generate`:
#
#   bash benchmarks/cpu_prompt_lookup.sh [OUT_DIR] [-m N] [--rounds R] [--lookup LIST]
#
#   OUT_DIR    results (default benchmarks/runs/cpu-lookup-<UTC time>)
#   -m         --max-tokens (200; the copying tasks usually end at EOS before it)
#   --rounds   rounds, each running every task and setting once (3)
#   --lookup   N:K settings, comma-separated (3:10,2:4,3:20)
#
# Env: OURS (default target/release/mlx-generate), PY (default .venv/bin/python),
# MODEL (default: the default model's directory as above).
# Writes OUT/summary.md (means per task and setting, ratios to ours plain, acceptance,
# whether each lookup text equals ours' plain text and whether ours' plain text equals
# mlx-lm's) and OUT/raw/ (every command's stdout and stderr). Exits 1 if a lookup
# output text differs from ours' plain output (greedy: it must not).
set -euo pipefail

OUT=""
M=200
ROUNDS=3
LOOKUP=3:10,2:4,3:20
while [ $# -gt 0 ]; do
  case "$1" in
    -m) M=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --lookup) LOOKUP=$2; shift ;;
    -*) echo "unknown flag $1" >&2; exit 2 ;;
    *) OUT=$1 ;;
  esac
  shift
done
OUT=${OUT:-benchmarks/runs/cpu-lookup-$(date -u +%Y%m%dT%H%M%S)}
OURS=${OURS:-target/release/mlx-generate}
PY=${PY:-.venv/bin/python}
CACHE=${MLX_RS_CACHE:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/mlx-rs}}
CACHE=${CACHE:-$HOME/.cache/mlx-rs}
MODEL=${MODEL:-$CACHE/models/SmolLM2-135M-Instruct}

[ -x "$OURS" ] || { echo "no $OURS: build it first" >&2; exit 1; }
if [ ! -f "$MODEL/config.json" ]; then
  echo "preparing the default model with $OURS" >&2
  "$OURS" --prompt hi -m 1 >/dev/null
fi
[ -f "$MODEL/config.json" ] || { echo "no model directory $MODEL" >&2; exit 1; }
mkdir -p "$OUT/raw"

# The tasks: the answer mostly copies the prompt.
PARA=$(head -n 1 crates/mlx-quant/src/calibration.txt)
TASK_NAMES=(repeat typos)
TASK_PROMPTS=(
  "Repeat this text exactly:

$PARA"
  "Fix the typos in this code and return the whole corrected function:

def mean_and_spread(valeus):
    if not valeus:
        raise ValueError(\"no vlaues given\")
    totl = 0.0
    for value in valeus:
        totl += value
    mean = totl / len(valeus)
    spread = max(valeus) - min(valeus)
    retrun mean, spread"
)

{
  echo "# CPU prompt lookup, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "host: $(uname -srm), $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "ours: $OURS (built $(date -u -r "$OURS" '+%Y-%m-%d %H:%M UTC'); tree at $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "mlx-lm: $("$PY" -c 'import mlx_lm, mlx.core as mx; print(mlx_lm.__version__, "/ mlx", mx.__version__)')"
  echo "model: $MODEL"
  echo "flags: -m $M, greedy (temperature 0), rounds $ROUNDS, lookup N:K $LOOKUP"
  echo
} > "$OUT/summary.md"

SETTINGS=(plain)
IFS=, read -r -a NKS <<< "$LOOKUP"
for nk in "${NKS[@]}"; do SETTINGS+=("lookup-$nk"); done
SETTINGS+=(mlx-lm)

# The text between the two "==========" lines.
text_of() { awk '/^==========$/{n++; next} n==1' "$1"; }
field() { sed -n "s/^$2: \([0-9]*\) tokens, \([0-9.]*\) tokens-per-sec.*/\\$3/p" "$1" | tail -n 1; }

for r in $(seq 1 "$ROUNDS"); do
  for t in "${!TASK_NAMES[@]}"; do
    name=${TASK_NAMES[$t]}
    prompt=${TASK_PROMPTS[$t]}
    for s in "${SETTINGS[@]}"; do
      base="$OUT/raw/$name.$s.r$r"
      case "$s" in
        plain) cmd=("$OURS" --model "$MODEL" --prompt "$prompt" -m "$M") ;;
        mlx-lm) cmd=("$PY" -m mlx_lm generate --model "$MODEL" --prompt "$prompt" -m "$M") ;;
        lookup-*)
          nk=${s#lookup-}
          cmd=("$OURS" --model "$MODEL" --prompt "$prompt" -m "$M"
            --prompt-lookup-ngram "${nk%%:*}" --prompt-lookup-tokens "${nk##*:}") ;;
      esac
      printf '%q ' "${cmd[@]}" > "$base.cmd"
      "${cmd[@]}" > "$base.out" 2> "$base.err"
      text_of "$base.out" > "$base.txt"
      echo "round $r $name $s: $(field "$base.out" Generation 2) tok/s" \
        "$(grep -h '^Speculative:' "$base.err" || true)" >&2
    done
  done
done

# Summary: means over rounds.
status=0
for name in "${TASK_NAMES[@]}"; do
  ref="$OUT/raw/$name.plain.r1.txt"
  plain_tps=$(for r in $(seq 1 "$ROUNDS"); do field "$OUT/raw/$name.plain.r$r.out" Generation 2; done |
    awk '{s+=$1} END {printf "%.3f", s/NR}')
  {
    echo "## $name"
    echo
    echo "| setting | generated tokens | decode tok/s (mean) | per round | vs ours plain | accepted / drafted | text = ours plain |"
    echo "| --- | ---: | ---: | --- | ---: | --- | --- |"
  } >> "$OUT/summary.md"
  for s in "${SETTINGS[@]}"; do
    tps=() same=yes acc=""
    for r in $(seq 1 "$ROUNDS"); do
      f="$OUT/raw/$name.$s.r$r"
      tps+=("$(field "$f.out" Generation 2)")
      cmp -s "$f.txt" "$ref" || same=no
      a=$(sed -n 's/^Speculative: \([0-9]* of [0-9]*\) drafted.*(\([0-9.]*%\)).*/\1 (\2)/p' "$f.err")
      [ -n "$a" ] && acc=$a
    done
    ntok=$(field "$OUT/raw/$name.$s.r1.out" Generation 1)
    mean=$(printf '%s\n' "${tps[@]}" | awk '{s+=$1} END {printf "%.3f", s/NR}')
    ratio=$(awk -v a="$mean" -v b="$plain_tps" 'BEGIN {printf "%.2fx", a/b}')
    case "$s" in lookup-*) [ "$same" = yes ] || status=1 ;; esac
    echo "| $s | $ntok | $mean | ${tps[*]} | $ratio | ${acc:--} | $same |" >> "$OUT/summary.md"
  done
  echo >> "$OUT/summary.md"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/summary.md"
cat "$OUT/summary.md"
[ "$status" = 0 ] || echo "FAILED: a lookup output differs from ours' plain output" >&2
exit "$status"
