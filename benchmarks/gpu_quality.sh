#!/usr/bin/env bash
# The quality gate of the 4-bit paths that round differently from MLX on the GPU
# (docs/parity.md), run on the GPU machine: for each model, the perplexity of a fixed real
# text (the long paragraphs of crates/mlx-quant/src/calibration.txt, 8 x 128 tokens,
# batch 4: products of 512 rows) and the greedy text of fixed prompts, on the exact path
# and on each other path with that path taking every product it can:
#   mma      MLX_FAST_QMM_MMA=force  (the tensor-core form of the multi-row product,
#                                      on by default for batched decoding)
#   dequant  MLX_DEQUANT_GEMM=1 MLX_DEQUANT_GEMM_MIN_ELEMENTS=0 (opt-in)
# The exact path is MLX_FAST_QMM_MMA=0 MLX_DEQUANT_GEMM=0. The gate is issue 21's: a path
# passes when its perplexity is within 0.1% of the exact path's on the real default model
# and on the real-shape model the targets are set on (GATED, default: smollm2
# llama-3.1-8b-4bit, matched against each directory's name), and every greedy text of the
# real model is the same. Other models are scored and reported, not gated (the random 1B
# shape moved 0.118% under the forced tensor-core form in session 17, with per-product
# errors no larger than MLX's: random weights' near-uniform logits amplify any change of
# rounding; benchmarks/GPU.md), and random weights' greedy texts part after a few tokens
# under any change of rounding.
#
# Run from the repository root, after `source /root/stash/activate.sh`:
#
#   bash benchmarks/gpu_quality.sh BIN_DIR [MODEL_DIR...]
#
#   BIN_DIR    release builds of mlx-perplexity and mlx-generate
#   MODEL_DIR  4-bit MLX model directories (default: the real default model where
#              $DEFAULT_MODEL names it, then llama-3.2-1b-4bit and llama-3.1-8b-4bit from
#              xtask/py/make_bench_models.py, made under /tmp/bench-models if missing)
#
# Env: PATHS (mma dequant), GATED, OUT (/tmp/quality-out). Writes $OUT/quality.md; exit
# status 1 when a path fails the gate.
set -uo pipefail
BIN=${1:?usage: gpu_quality.sh BIN_DIR [MODEL_DIR...]}
shift
OUT=${OUT:-/tmp/quality-out}
MODELS=/tmp/bench-models
mkdir -p "$OUT"
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  [ -n "${DEFAULT_MODEL:-}" ] && models+=("$DEFAULT_MODEL")
  for m in llama-3.2-1b-4bit llama-3.1-8b-4bit; do
    [ -d "$MODELS/$m" ] || python3 xtask/py/make_bench_models.py --out "$MODELS" --only "$m" \
      --tokenizers .gpu/tok > "$OUT/make-$m.txt" 2>&1
    models+=("$MODELS/$m")
  done
fi
python3 - > "$OUT/text.jsonl" <<'PY'
import json, pathlib
t = pathlib.Path("crates/mlx-quant/src/calibration.txt").read_text()
for p in t.split("\n\n"):
    if len(p) > 200:
        print(json.dumps({"text": p}))
PY
prompts=(
  "The morning train left the valley a few minutes after six"
  "What is the capital of France?"
  "Write a haiku about a train in the rain."
  "List three uses of a paper clip:"
)
envs() { # PATH: the environment of one path
  case "$1" in
    exact) echo "MLX_FAST_QMM_MMA=0 MLX_DEQUANT_GEMM=0" ;;
    mma) echo "MLX_FAST_QMM_MMA=force MLX_DEQUANT_GEMM=0" ;;
    dequant) echo "MLX_FAST_QMM_MMA=0 MLX_DEQUANT_GEMM=1 MLX_DEQUANT_GEMM_MIN_ELEMENTS=0" ;;
  esac
}
ppl() { # PATH MODEL
  # shellcheck disable=SC2046
  env $(envs "$1") timeout 300 "$BIN/mlx-perplexity" --model "$2" --data-path "$OUT/text.jsonl" \
    --sequence-length 128 --num-samples 8 --batch-size 4 2>&1 | sed -n 's/^Perplexity: \([^ ]*\).*/\1/p'
}
# Prints |B - A| / A as a percentage, then 1 when that is under 0.1% (else 0).
compare() {
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); r = abs(b - a) / a; print(f'{r:.5%}', int(r < 1e-3))" \
    "$1" "$2" 2>/dev/null || echo "n/a 0"
}
gen() { # PATH MODEL PROMPT
  # shellcheck disable=SC2046
  env $(envs "$1") timeout 120 "$BIN/mlx-generate" --model "$2" --max-tokens 32 --prompt "$3" \
    2>&1 | sed -n '/==========/,/==========/p'
}
fail=0
{
  echo "| model | path | perplexity | exact | relative | greedy texts same (gated on the real model) | gated |"
  echo "| --- | --- | ---: | ---: | ---: | --- | --- |"
} > "$OUT/quality.md"
for m in "${models[@]}"; do
  name=$(basename "$m")
  # Every prompt on the real model, the first on random-weight ones (reported only).
  n=1; [ "$m" = "${DEFAULT_MODEL:-}" ] && n=${#prompts[@]}
  p0=$(ppl exact "$m")
  for ((i = 0; i < n; i++)); do gen exact "$m" "${prompts[$i]}" > "$OUT/$name-exact-$i.txt"; done
  for path in ${PATHS:-mma dequant}; do
    p1=$(ppl "$path" "$m")
    same=0
    for ((i = 0; i < n; i++)); do
      gen "$path" "$m" "${prompts[$i]}" > "$OUT/$name-$path-$i.txt"
      cmp -s "$OUT/$name-exact-$i.txt" "$OUT/$name-$path-$i.txt" && same=$((same + 1))
    done
    read -r rel ok < <(compare "$p0" "$p1")
    gated=no
    for g in ${GATED:-smollm2 SmolLM2-135M-Instruct llama-3.1-8b-4bit}; do [ "$name" = "$g" ] && gated=yes; done
    if [ $gated = yes ]; then
      [ "$ok" = 1 ] || fail=1
      [ "$same" != "$n" ] && [ "$m" = "${DEFAULT_MODEL:-}" ] && fail=1
    fi
    echo "| $name | $path | $p1 | $p0 | $rel | $same of $n | $gated |" >> "$OUT/quality.md"
  done
done
cat "$OUT/quality.md"
if [ $fail = 0 ]; then echo "QUALITY: PASS"; else echo "QUALITY: FAIL"; fi
exit $fail
