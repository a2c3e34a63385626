#!/usr/bin/env bash
# The H200 runs of session 13 (2026-12-03), one part per device call (each under 600 s).
# Run from the repository root after `source /root/stash/activate.sh`; our release
# binaries unpacked in /root/bins/new.
#
#   bash benchmarks/gpu_session13.sh verify  # issue 19: cached forward of q_len tokens (speculative
#                                            # verification) in mlx-lm, cuDNN SDPA on and off
#   bash benchmarks/gpu_session13.sh next    # issue 26: Qwen3-Next shape, decode A/B of our kernels
#                                            # (fast_qmv, projection fusion) with mlx-lm's profile
#   bash benchmarks/gpu_session13.sh nextpf  # issue 26: Qwen3-Next shape prefill/decode vs mlx-lm
#   bash benchmarks/gpu_session13.sh dequant # issue 21: 4-bit 8B batch 32 with MLX_DEQUANT_GEMM=1
#                                            # (peak memory after the mx::depends gating)
#   bash benchmarks/gpu_session13.sh spec    # issue 19: benchmarks/gpu_spec.sh
#   bash benchmarks/gpu_session13.sh spec1b  # issue 19: Llama-3.2-1B bf16 with its own 4-bit
#                                            # quantization as the draft: plain, speculative,
#                                            # speculative with MLX_SDPA_SPLIT_QUERIES=1, mlx-lm
#
# Results go under $OUT/<part>/.
set -u
PART=${1:?part}
OUT=${OUT:-/tmp/out}
NEW=${NEW:-/root/bins/new}
MODELS=${MODELS:-/tmp/bench-models}
mkdir -p "$OUT/$PART"
export MODELS
TOK=()
[ -d .gpu/tok/llama3 ] && TOK=(--tokenizers .gpu/tok)
mk() { [ -d "$MODELS/$1" ] || python3 xtask/py/make_bench_models.py --out "$MODELS" --only "$1" ${TOK[@]+"${TOK[@]}"} >/dev/null 2>&1; }
case "$PART" in
  verify)
    mk llama-3.1-8b-bf16
    for sdpa in 1 0; do
      echo "== MLX_CUDA_USE_CUDNN_SDPA=$sdpa" >> "$OUT/verify/probe.txt"
      MLX_CUDA_USE_CUDNN_SDPA=$sdpa timeout 200 python3 benchmarks/verify_shapes_probe.py \
        "$MODELS/llama-3.1-8b-bf16" --qlens 1,3,4,8 --iters 8 >> "$OUT/verify/probe.txt" 2>&1
    done
    ;;
  next)
    OUT=$OUT/next ONLY=qwen3-next-80b-a3b-l4-4bit,qwen3-next-80b-a3b-l4-bf16 ROUNDS=1 N=2 MLX_LM=1 \
      bash benchmarks/gpu_ab.sh base="$NEW" noqmv="$NEW:MLX_FAST_QMV=0" \
      nofuse="$NEW:MLX_FUSED_PROJECTIONS=0"
    ;;
  nextpf)
    OUT=$OUT/nextpf bash benchmarks/gpu.sh "$NEW" \
      --only qwen3-next-80b-a3b-l4-4bit,qwen3-next-80b-a3b-l4-bf16 \
      -p 512 -g 64 -n 2 --rounds 1 --startup-runs 0 --budget 400
    ;;
  dequant)
    OUT=$OUT/dequant/b32 MLX_DEQUANT_GEMM=1 bash benchmarks/gpu.sh "$NEW" --only llama-3.1-8b-4bit \
      -b 32 -p 128 -g 128 -n 1 --rounds 1 --startup-runs 0 --budget 300
    ;;
  spec)
    OUT=$OUT/spec bash benchmarks/gpu_spec.sh "$NEW"
    ;;
  spec1b)
    mk llama-3.2-1b-bf16
    mk llama-3.2-1b-4bit
    base=(--model "$MODELS/llama-3.2-1b-bf16" --prompt "Write a long story about a dragon." -m 128 --temp 0)
    draft=(--draft-model "$MODELS/llama-3.2-1b-4bit" --num-draft-tokens 3)
    one() {  # NAME CMD...: the generation line (and ours' accepted/drafted line) of one process
      local name=$1; shift
      echo "== $name" >> "$OUT/spec1b/log.txt"
      timeout 90 "$@" > "$OUT/spec1b/$name.txt" 2>&1
      echo "$name: $(grep -E 'Generation:|ccept' "$OUT/spec1b/$name.txt" | tr '\n' ' ')" | tee -a "$OUT/spec1b/summary.txt"
    }
    one ours-plain "$NEW/mlx-generate" "${base[@]}"
    one ours-spec "$NEW/mlx-generate" "${base[@]}" "${draft[@]}" --verbose True
    one ours-spec-split env MLX_SDPA_SPLIT_QUERIES=1 "$NEW/mlx-generate" "${base[@]}" "${draft[@]}" --verbose True
    one mlx-lm-plain python3 -m mlx_lm generate "${base[@]}"
    one mlx-lm-spec python3 -m mlx_lm generate "${base[@]}" "${draft[@]}"
    ;;
  *) echo "unknown part $PART"; exit 2 ;;
esac
