#!/usr/bin/env bash
# The H200 runs of session 12 (2026-12-02), one part per device call (each under 600 s).
# Run from the repository root after `source /root/stash/activate.sh`; our release
# binaries unpacked in /root/bins/new (this commit) and /root/bins/old (72edcfd, before
# the generation core moved into mlx-engine).
#
#   bash benchmarks/gpu_session12.sh ab      # issue 18: old vs new, batch-1 decode, 1B/0.5B
#   bash benchmarks/gpu_session12.sh moe     # issue 18: MoE projection fusion on and off
#   bash benchmarks/gpu_session12.sh archs   # issues 26/21: Qwen3-Next, DeepSeek-V3, Qwen3-30B-A3B shapes vs mlx-lm
#   bash benchmarks/gpu_session12.sh dequant # issue 21: 4-bit 8B batch 32 and prefill, MLX_DEQUANT_GEMM on/off, quality gate
#   bash benchmarks/gpu_session12.sh spec    # issue 19: benchmarks/gpu_spec.sh
#
# Results go under $OUT/<part>/ (summary files of the scripts called).
set -u
PART=${1:?part}
OUT=${OUT:-/tmp/out}
NEW=${NEW:-/root/bins/new}
OLD=${OLD:-/root/bins/old}
MODELS=${MODELS:-/tmp/bench-models}
mkdir -p "$OUT/$PART"
export MODELS
case "$PART" in
  ab)
    OUT=$OUT/ab ONLY=llama-3.2-1b-bf16,llama-3.2-1b-4bit,qwen2.5-0.5b-4bit ROUNDS=2 N=3 \
      bash benchmarks/gpu_ab.sh old="$OLD" new="$NEW"
    ;;
  moe)
    OUT=$OUT/moe ONLY=qwen3-30b-a3b-l12-bf16,mixtral-8x7b-l4-bf16 ROUNDS=1 N=2 MLX_LM=1 \
      bash benchmarks/gpu_ab.sh fused="$NEW" separate="$NEW:MLX_FUSED_PROJECTIONS=0"
    rm -rf "$MODELS"/qwen3-30b-a3b-l12-bf16 "$MODELS"/mixtral-8x7b-l4-bf16
    ;;
  archs)
    OUT=$OUT/archs bash benchmarks/gpu.sh "$NEW" \
      --only qwen3-next-80b-a3b-l4-4bit,deepseek-v3-l4-4bit,qwen3-30b-a3b-l12-4bit \
      -p 512 -g 128 -n 2 --rounds 1 --startup-runs 0 --budget 480
    ;;
  dequant)
    # Batch 32 of the 4-bit 8B: ours with the dequantized dense products
    # (MLX_DEQUANT_GEMM=1; it was the default during session 12's run) against mlx-lm,
    # then ours on the exact path (MLX_DEQUANT_GEMM=0).
    OUT=$OUT/dequant/b32 MLX_DEQUANT_GEMM=1 bash benchmarks/gpu.sh "$NEW" --only llama-3.1-8b-4bit \
      -b 32 -p 128 -g 128 -n 1 --rounds 1 --startup-runs 0 --budget 200
    OUT=$OUT/dequant/b32-exact MLX_DEQUANT_GEMM=0 bash benchmarks/gpu.sh "$NEW" \
      --only llama-3.1-8b-4bit -b 32 -p 128 -g 128 -n 1 --rounds 1 --startup-runs 0 --budget 200
    # Quality gate on the GPU: perplexity of a fixed real text, exact path vs dequantized.
    python3 - <<'PY' > "$OUT/dequant/text.jsonl"
import json, pathlib
t = pathlib.Path("crates/mlx-quant/src/calibration.txt").read_text()
for p in t.split("\n\n"):
    if len(p) > 200:
        print(json.dumps({"text": p}))
PY
    for m in llama-3.2-1b-4bit llama-3.1-8b-4bit; do
      [ -d "$MODELS/$m" ] || python3 xtask/py/make_bench_models.py --out "$MODELS" --only "$m" >/dev/null 2>&1
      for mode in 0 1; do  # 0: exact path, 1: dequantized product
        echo "== $m MLX_DEQUANT_GEMM=$mode" >> "$OUT/dequant/quality.txt"
        MLX_DEQUANT_GEMM=$mode "$NEW/mlx-perplexity" --model "$MODELS/$m" \
          --data-path "$OUT/dequant/text.jsonl" --sequence-length 128 --num-samples 8 \
          --batch-size 4 2>&1 | grep -E "Perplexity|Total" >> "$OUT/dequant/quality.txt"
        MLX_DEQUANT_GEMM=$mode "$NEW/mlx-generate" --model "$MODELS/$m" --max-tokens 24 \
          --prompt "The morning train left the valley a few minutes after six" 2>&1 \
          | sed -n '/==========/,/==========/p' >> "$OUT/dequant/quality.txt"
      done
    done
    ;;
  spec)
    OUT=$OUT/spec bash benchmarks/gpu_spec.sh "$NEW"
    ;;
  *) echo "unknown part $PART"; exit 2 ;;
esac
