#!/usr/bin/env bash
# The H200 runs of sessions 15-17 (2026-12-03): several parts per device call, each part's
# output packed into one file ($OUT/<part>.tar.gz: a call returns at most 8 files).
# Run from the repository root on the device machine after the staging calls
# (`source /root/stash/activate.sh`, our release binaries in /root/bins/new, the
# tokenizers in /root/stash/tok):
#
#   DEADLINE=540 bash benchmarks/gpu_session15.sh PART [PART...]
#
# A part is started only while fewer than DEADLINE seconds have passed since the script
# began (so one call stays inside the device's 600 s), and is cut at what is left.
#
#   nextdiag   issue 26: Qwen3-Next 4-bit shape, our first runs timed step by step
#              (mlx-generate twice, then mlx-benchmark), to find session 14's stall
#   nextfirst  issue 26: Qwen3-Next 4-bit shape, a first process of each tool on its own cold
#              kernel cache (MLX_PTX_CACHE_DIR): time and kernels compiled
#   nextpf     issue 26: Qwen3-Next 4-bit shape, prefill and decode against mlx-lm (gpu.sh)
#   eval8b     issue 23: benchmarks/gpu_evaluate.sh on the 8B shape only
#   struct8b   issue 20: benchmarks/gpu_structured.sh on the 8B bf16 shape (1 and 32 streams)
#   struct32   issue 20: the same at 32 streams, engine profile lines every 16 steps
#   lora       issue 24: benchmarks/gpu_lora.sh (1B bf16 LoRA, 8B 4-bit QLoRA), 1 round
#              (LORA_ARGS: e.g. --only llama-3.1-8b-4bit --dequant-ab)
#   specsrv    issue 19: server aggregate decode at 1/8/32 streams, echo 8B target, with
#              and without its 4-bit draft (SPEC_ARMS: plain draft draftall none syncsteps;
#              SPEC_STREAMS; SPEC_LOG=DEBUG)
#   specprof   issue 19: the speculating batch's step split into phases (engine profile) at
#              1/8 streams, and mlx-generate's rounds on the same pair (SPEC_PROF_ARMS,
#              SPEC_PROF_MODE, SPEC_K, SPEC_STREAMS, SPEC_ROUNDS, SPEC_WARM)
#   predsrv    issue 19: server speculation without a draft model (OpenAI predicted outputs)
#              against plain requests at 1/8/32 streams (PRED_MODELS, PRED_STREAMS,
#              PRED_TRIALS, PRED_G, PRED_SUSTAIN; benchmarks/predict_bench.py)
#   spec       issue 19: gpu_spec.sh, echo 8B with its 4-bit copy (k 3, 4) and with a random
#              1B draft under --draft-min-acceptance 0.5 (ours only)
#   start8b    issue 21: process start to first token of the 8B 4-bit model, ours and mlx-lm
#   startcc    issue 21: the same start with a 4 GB CUDA driver cache (PTX compiled once)
#   kcache     issue 21: start to first token with our kernels compiled once per machine
#              (kernel_cache.cpp) against MLX compiling them in every process; texts compared
#   specab     issue 19: the speculation regression of session 18, our kernels switched off
#              one by one (SPEC_ARMS); rows / rowsk5 / rowsk7 (MLX_FAST_GEMV_ROWS=1: the
#              verification's dense products through the rows form, k = 3 / 5 / 7); k7eager /
#              k10eager / k3eager / k7eagerrows (MLX_DRAFT_EAGER_FEED=1), k7sync /
#              k7eagersync (MLX_ENGINE_PROFILE=sync: each draft step's own time), plain4 (the
#              4-bit draft model alone), k7oneseq / k7oneseqsync (MLX_FAST_QMM_ONE_SEQ_ROWS=2);
#              kNe / kNn / kNd (k = N, MLX_DRAFT_EAGER_FEED=1 / 0 / unset), rNd / rNn / rNz (the
#              random 1B draft; z: --draft-min-acceptance 0), kNm / plain4m (the draft's
#              groups as one launch: MLX_FAST_QMV_MANY_MAX_ELEMENTS), kNp (MLX_DRAFT_PIPELINE=1:
#              the next round drafted behind the verification), kNs / plain4s (run 8's
#              16M bound: the draft's groups apart), mlxlmN (mlx-lm's speculation, k = N); SPEC_M tokens (128)
#   rowscheck  issue 19 / 21: gemv_rows_check (the rows form of the dense kernel against the
#              one-row path, every shape at 2..8 rows; on the echo 8B bf16: a verification
#              of 4 tokens against decoding them, batch 4 against each row alone)
#   abbf       issue 21: mlx-benchmark 8B bf16 (the echo shape) at batch 2 / 4 / 8
#              (ABBF_BATCHES), MLX's gemm (off) against the rows form (batch:
#              MLX_FAST_GEMV_ROWS=batch), ABBF_ARMS
#   qmm        issue 21: qmm_rows_check (our M-row 4-bit product against MLX's, bits and time)
#   ab8b       issue 21: mlx-benchmark 8B 4-bit at batch 1/8/32 (AB_BATCHES), arms (AB_ARMS):
#              on (the defaults: the tensor-core form of the M-row product), exact
#              (MLX_FAST_QMM_MMA=0: each row's one-row bits), off (MLX_FAST_QMM=0: MLX's qmm),
#              prof (the defaults with the engine's profile lines every 32 steps), mask
#              (MLX_BATCH_DECODE_MASK=array: mlx-lm's all-true decoding mask kept), nopad
#              (MLX_SDPA_PADDED=0: MLX's masked attention for padded rows), pf
#              (MLX_SDPA_PADDED_PREFETCH=1), mmaw4 / mmarw1 / mmaw4rw1 (the tensor-core
#              product with MLX_FAST_QMM_MMA_WARPS=4, with 16 rows of w a block always:
#              MLX_FAST_QMM_MMA_MIN_BLOCKS=1000000000, both), mmarw4 / mmaw4rw4 (64 rows
#              of w a block: MLX_FAST_QMM_MMA_RW=4, alone and with 4 warps), lean / nolean
#              (MLX_FAST_QMV_LEAN=1 / 0: the one-row 4-bit kernels' lean bodies, the default
#              since session 37, / their first form), xs (MLX_FAST_QMV_ALIGNED_SPLIT=1:
#              an unaligned x out of line, 48 registers a thread), manyall (MLX_FAST_QMV_MANY_MAX_ELEMENTS:
#              q/k/v and gate/up as one launch each at every size; the default since
#              session 40), sep (run 8's 16M bound: the 8B's groups as separate launches)
#   leancheck  issue 21: fused_check qmv under MLX_FAST_QMV_LEAN=1 (every product shape and
#              the 8B 4-bit and qwen2.5-0.5b-4bit logits against MLX's qmv, bit for bit),
#              then qmm_rows_check under it (kBodyM's rows against the one-row kernel)
#   mma        issue 21: qmm_mma_check on the 8B 4-bit model's weights (MMA_ARGS)
#   quality    issue 21: benchmarks/gpu_quality.sh (the real default model from
#              /root/stash/smollm2 when staged, 1B and 8B 4-bit shapes)
#   srv4b      issue 21: server aggregate decode, 8B 4-bit, 8 and 32 streams, against mlx-lm
#              (SRV_STREAMS, SRV_ARMS: default, dequant, bigdq, pc32, nopad)
#   pf4b       issue 21: one prompt's prefill, 8B bf16 against 8B 4-bit (default, dequant,
#              forced mma, noqgemm = MLX_FAST_QGEMM=0; PF_ARMS, PF_P, PF_N)
#   text4b     issue 21: greedy text of the 8B 4-bit shape after a ~1,300-token prompt: ours,
#              ours with MLX_FAST_QGEMM=0, mlx-lm (TEXT_CHARS of calibration.txt)
#   moe        issue 21: mixture-of-experts shapes against mlx-lm (MOE_MODELS: the
#              Qwen3-30B-A3B and gpt-oss-20b 4-bit shapes of 12 layers), MOE_CASES of
#              batch:prompt:generation (1:512:128 32:128:128), MOE_ROUNDS (1) processes a
#              tool, alternating, order flipped each round; MOE_ENV for our arm; MOE_ARMS
#              (ours mlx-lm; noqmv = ours with MLX_FAST_QMV=0; gqmv = ours with
#              MLX_FAST_GATHER_QMV=1, gqmvlean with MLX_FAST_QMV_LEAN=1 too: both the
#              defaults since session 37; nogqmv = MLX_FAST_GATHER_QMV=0)
#   qgemm      issue 21: qgemm_check (our tiled 4-bit kernel of 33+ rows against MLX's
#              qmm_sm80: bits and time; QGEMM_ARGS, QGEMM_MODEL, QGEMM_ENV)
#   next       issue 26: gpu_next.sh check warm (Qwen3-Next: lean step's text, ours vs mlx-lm)
#   nextab     issue 26: gpu_next.sh warm, Qwen3-Next decode against mlx-lm with our one-row
#              4-bit kernels on, off (MLX_FAST_QMV=0) and only on large weights
#              (NEXTAB_EXTRA, default minel=MLX_FAST_QMV_MIN_ELEMENTS=16777216), without
#              the profile lines; NEXT_ROUNDS (3) processes per arm, alternating, after an
#              untimed warm-up process of each tool (kernel compiles on a fresh machine)
#   nextgraph  issue 26: decode_build on the Qwen3-Next shape (or NG_MODEL, a variant or an
#              absolute model directory; NG_ARMS) (host
#              split of a decode step: build, async_eval with the device idle) with our
#              kernels on and off, and the
#              step's primitives on the GPU, ours (DECODE_BUILD_DOT) against mlx-lm's
#              (graph_nodes.py)
#   ds3        issue 26: DeepSeek-V3 shape 4-bit (deepseek-v3-l4-4bit), gpu.sh, 2 rounds of
#              ours / mlx-lm alternating, -p 512 -g 128
#   structab   issue 20: gpu_structured.sh with --trials (STRUCT_TRIALS, 3) on the 0.5B and
#              8B bf16 shapes (STRUCT_ONLY) at 1 and 32 streams, no profile lines
#   smolab     issue 21: the real default model and one-change variants (float32 scales,
#              float16, bfloat16 group 64) against mlx-lm (SMOL_VARIANTS, SMOL_ROUNDS)
#   maskcheck  issue 20: mask_check (our grammar-mask kernel, MLX_FAST_MASK, against the
#              ops it replaces: equal bits for every shape and dtype, and times)
#   ttftlen    issue 21: time to first token for prompts of many lengths (a cuDNN plan
#              per new shape): our server, with MLX_SDPA_BUCKET=256, and mlx_lm.server
#              (TTFT_MODELS, TTFT_ARMS, TTFT_LENGTHS)
#   sdpaprobe  issue 19: benchmarks/sdpa_graph_probe.py (a verification's attention: cuDNN's
#              graph built for every new key length, against cached, masked, padded and
#              one-query calls), the 8B's head shape at 4 and 8 query positions; then
#              a prompt's prefill (--prefill: a plan per new prompt length, padded to
#              256-multiples or not, one row and 8 rows)
#   saveptx    MLX's kernel cache of this machine to $OUT/ptx-cache.tar.xz (carry it back as
#              .gpu/ptx-cache.tar.xz for the next machine)
#   structprof issue 20: gpu_structured.sh with the engine's profile lines every 32 steps
#              (STRUCT_ONLY, STRUCT_TRIALS (2), -g STRUCT_G (256)), 1 and 32 streams,
#              per arm (STRUCT_PROF_ARMS: default, beside, first, both: as structarms)
#   structarms issue 20: gpu_structured.sh per arm (STRUCT_ARMS: default, noadvise =
#              MLX_HOST_BUFFER_ADVISE=0, nopool = MLX_HOST_BUFFER_POOL=0, beside =
#              MLX_MASKS_BESIDE=1: the grammar worker's accepts and masks while the
#              forward is queued, sessions 42 and 45, first = MLX_MASKS_FIRST=1: the
#              masks before the forward is queued, one evaluation a step, session 45,
#              both; a name holding fast adds MLX_FAST_MASK=1: the masks applied by one
#              kernel, session 45, the default since session 46; ops adds MLX_FAST_MASK=0:
#              MLX's five ops; spliteval adds MLX_DECODE_SPLIT_EVAL=1: an unconstrained
#              step's forward queued before its sampling, session 48), STRUCT_ONLY,
#              1 and 32 streams, -g STRUCT_G (256), STRUCT_TRIALS (2) pairs, no profile lines
#   structmb   issue 20: structab on the 8B bf16 shape (STRUCT_ONLY) under MLX's graph
#              limits (STRUCT_MB_ARMS: default, mb4000 / mb16000 = MLX_MAX_MB_PER_BUFFER,
#              ops400 = MLX_MAX_OPS_PER_BUFFER=400), -g STRUCT_G (256)
#   gemvproto  issue 21: benchmarks/gemv_proto.py (one-row bf16 product layouts against
#              MLX's gemv: bits and time, 8B / 1B / 0.5B shapes)
#   gemvcheck  issue 21: fused_check gemv (our one-row dense kernel against MLX's gemv: the
#              shape sweep, then the logits of the 8B bf16 shape and of qwen2.5-0.5b-bf16)
#   gemvab     issue 21: mlx-benchmark at batch 1 with our one-row dense kernel on / off
#              (GEMV_ARMS: on, off = MLX_FAST_GEMV=0, u8 / u32 = MLX_FAST_GEMV_LOADS,
#              w4 = MLX_FAST_GEMV_WARPS=4) and mlx-lm, GEMV_MODELS (llama-3.1-8b-bf16),
#              GEMV_ROUNDS (2) rounds of processes in flipped order, -p 128 -g GEMV_G (256)
#   sdpapad    issue 21: sdpa_pad_check (our attention kernel over left-padded rows against
#              MLX's masked attention; SDPA_ITERS; SDPA_ARMS, e.g. "MLX_SDPA_PADDED=1;
#              MLX_SDPA_PADDED_PREFETCH=1"; then ptxas's registers and spills of its
#              kernels)
#   agree      issue 21: greedy answers served alone against served together in one batch
#              (benchmarks/batch_agree.py; AGREE_MODEL (smollm2-f16: the default model in
#              float16), AGREE_STREAMS, AGREE_ARMS (default mask nopad), AGREE_G)
#   normcheck  issue 21: fused_check norm (MLX's rms_norm in our one-row launches) on the 8B,
#              1B and 0.5B 4-bit shapes
#   manycheck  issue 21: fused_check qmv on the 8B 4-bit shape with its groups as one launch
#              (the default since session 40), then llama-3.2-1b-4bit's logits
#   ncuarms    issue 21: ncu kernel durations of NCU_MODEL (llama-3.1-8b-4bit) decoding, per
#              arm (NCU_ARMS: default, sep = MLX_FAST_QMV_MANY_MAX_ELEMENTS=16777216)
#   ncudeep    issue 21: ncu's speed-of-light, occupancy, warp-state and memory sections of a
#              few launches of one kernel (DEEP_KERNEL regex, DEEP_MODEL, DEEP_BATCH,
#              DEEP_SKIP, DEEP_COUNT, DEEP_ENV; DEEP_ARMS: default / xs / env, one ncu run
#              each): why it runs at the speed it does
#   xscheck    issue 21: fused_check qmv under MLX_FAST_QMV_ALIGNED_SPLIT=1 (every product
#              shape, then the 8B 4-bit and qwen2.5-0.5b-4bit logits against MLX's qmv)
#   ncubf16    issue 21: ncu kernel durations of decoding steps of NCU_MODEL
#              (llama-3.1-8b-bf16; mlx-generate, 64 tokens, or with NCU_BATCH=B
#              mlx-benchmark -b B -p 64 -g 128; kernels NCU_SKIP (8000) to
#              NCU_SKIP + NCU_COUNT (900); NCU_ENV for the arm's switches)
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
# A kernel cache carried along (.gpu/ptx-cache.tar.xz: MLX's /tmp/mlx of an earlier
# machine, from the `saveptx` part) spares a fresh machine's first processes their
# compiles; MLX keys each file by its kernel's name and source, so a stale one is unused.
if [ -f .gpu/ptx-cache.tar.xz ] && [ ! -d /tmp/mlx ]; then
  mkdir -p /tmp/mlx && tar -C /tmp/mlx -xJf .gpu/ptx-cache.tar.xz && echo "== kernel cache restored: $(find /tmp/mlx -name '*.ptx' | wc -l) kernels"
fi
T0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
ensure_model() { # VARIANT DIR: make_bench_models.py's VARIANT under $MODELS unless there
  [ -d "$MODELS/$1" ] || python3 xtask/py/make_bench_models.py --out "$MODELS" --only "$1" \
    --tokenizers .gpu/tok > "$2/models.txt" 2>&1
}
ensure_echo() { # DIR: the echo 8B pair (bf16 and its 4-bit copy) unless there
  [ -d "$MODELS/llama-3.1-8b-echo-bf16" ] && [ -d "$MODELS/llama-3.1-8b-echo-4bit" ] ||
    python3 xtask/py/make_bench_models.py --out "$MODELS" --only llama-3.1-8b-echo \
      --tokenizers .gpu/tok > "$1/models.txt" 2>&1
}
ptx_usage() { # NAME-PATTERN: ptxas's registers, spills and shared memory of the kernels
  # MLX has cached as PTX (/tmp/mlx, or MLX_PTX_CACHE_DIR) whose file names match; a kernel
  # over 64 registers a thread cannot launch in blocks of 1,024 threads, over 32 holds one
  # such block an SM
  local ptxas cc f
  ptxas=$(command -v ptxas || ls /usr/local/cuda*/bin/ptxas 2>/dev/null | head -1)
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
  [ -n "$ptxas" ] || { echo "ptx_usage: no ptxas"; return; }
  find "${MLX_PTX_CACHE_DIR:-/tmp/mlx}" -name "*$1*.ptx" 2>/dev/null | while read -r f; do
    echo "== $(basename "$f")"
    "$ptxas" -arch=sm_"$cc" -v "$f" -o /dev/null 2>&1 | grep -E "registers|spill" | sed 's/^ptxas info *: *//'
  done
}
decode_cmd() { # MODEL [BATCH]: the decoding run ncu watches (sets cmd): mlx-generate, 64
  # tokens, or with BATCH batched decoding steps (mlx-benchmark -b BATCH -p 64 -g 128)
  cmd=("$NEW/mlx-generate" --model "$MODELS/$1" --prompt "hello there" -m 64)
  [ -n "${2:-}" ] && cmd=("$NEW/mlx-benchmark" --model "$MODELS/$1" -p 64 -g 128 -b "$2" -n 1)
}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
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
    nextdiag)
      M=$MODELS/qwen3-next-80b-a3b-l4-4bit
      ensure_model qwen3-next-80b-a3b-l4-4bit "$D"
      for i in 1 2; do
        s=$(date +%s%N)
        timeout 150 "$NEW/mlx-generate" --model "$M" --prompt "hello there" -m 16 --verbose True \
          > "$D/gen$i.txt" 2>&1
        echo "mlx-generate run $i rc=$? $(( ($(date +%s%N) - s) / 1000000 )) ms" >> "$D/stdout.txt"
      done
      s=$(date +%s%N)
      MLX_ENGINE_PROFILE=1 timeout 200 "$NEW/mlx-benchmark" --model "$M" -p 512 -g 128 -n 1 \
        > "$D/bench.txt" 2>&1
      echo "mlx-benchmark -p 512 -g 128 rc=$? $(( ($(date +%s%N) - s) / 1000000 )) ms" >> "$D/stdout.txt"
      cat "$D/bench.txt" >> "$D/stdout.txt" ;;
    nextfirst)
      # A first process on a cold MLX kernel cache (MLX_PTX_CACHE_DIR per tool): time and
      # the number of kernels each tool had compiled; then ours again on its warm cache.
      M=$MODELS/qwen3-next-80b-a3b-l4-4bit
      ensure_model qwen3-next-80b-a3b-l4-4bit "$D"
      for who in mlx-lm ours ours-again; do
        dir=/tmp/ptx-${who%-again}
        cmd=("$NEW/mlx-generate"); [ "$who" = mlx-lm ] && cmd=(python3 -m mlx_lm generate)
        s=$(date +%s%N)
        MLX_PTX_CACHE_DIR=$dir timeout 110 "${cmd[@]}" --model "$M" --prompt "hello there" -m 16 \
          > "$D/first-$who.txt" 2>&1
        echo "$who rc=$? $(( ($(date +%s%N) - s) / 1000000 )) ms; cache $dir: $(find $dir -type f 2>/dev/null | wc -l) files, $(du -sh $dir 2>/dev/null | cut -f1)" >> "$D/stdout.txt"
        find $dir -type f -printf '%s %f\n' 2>/dev/null | sort -n | tail -40 > "$D/cache-$who.txt"
      done
      cat "$D/stdout.txt" ;;
    nextpf)
      export MLX_PTX_CACHE_DIR=/tmp/ptx-ours
      OUT=$D STEP_TIMEOUT=240 timeout "$L" bash benchmarks/gpu.sh "$NEW" \
        --only qwen3-next-80b-a3b-l4-4bit \
        -p 512 -g 128 -n 2 --rounds 1 --startup-runs 0 --budget $((L - 20)) > "$D/stdout.txt" 2>&1 ;;
    eval8b)
      OUT=$D timeout "$L" bash benchmarks/gpu_evaluate.sh "$NEW" --only llama-3.1-8b-bf16 > "$D/stdout.txt" 2>&1 ;;
    struct8b)
      OUT=$D timeout "$L" bash benchmarks/gpu_structured.sh "$NEW" --only llama-3.1-8b-bf16 > "$D/stdout.txt" 2>&1 ;;
    struct32)
      # STRUCT_ARMS: pool (the defaults), nopool (MLX_HOST_BUFFER_POOL=0: host uploads such
      # as the grammar masks take MLX's cached buffers, as before session 20)
      arms=(${STRUCT_ARMS:-pool nopool})
      i=0
      for arm in "${arms[@]}"; do
        t=$(( ($(left) - 5) / (${#arms[@]} - i) )); i=$((i + 1))
        a="$D/$i-$arm"; mkdir -p "$a"
        e=(MLX_ENGINE_PROFILE_EVERY=16)
        [ "$arm" = nopool ] && e+=(MLX_HOST_BUFFER_POOL=0)
        env OUT="$a" "${e[@]}" timeout "$t" bash benchmarks/gpu_structured.sh \
          "$NEW" --only llama-3.1-8b-bf16 --streams 32 > "$a/stdout.txt" 2>&1
      done ;;
    leancheck)
      # MLX_FAST_QMV_LEAN=1's kernels against MLX's qmv, bit for bit (shapes, then logits)
      ensure_model llama-3.1-8b-4bit "$D"
      ensure_model qwen2.5-0.5b-4bit "$D"
      MLX_FAST_QMV_LEAN=1 timeout $(( $(left) > 150 ? $(left) - 90 : 60 )) "$NEW/fused_check" "$MODELS/llama-3.1-8b-4bit" 64 16 qmv \
        > "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt"
      MLX_FAST_QMV_LEAN=1 FUSED_CHECK_SHAPES=0 timeout 60 "$NEW/fused_check" "$MODELS/qwen2.5-0.5b-4bit" 64 16 qmv \
        >> "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt"
      MLX_FAST_QMV_LEAN=1 MLX_FAST_QMM_MMA=0 timeout 100 "$NEW/qmm_rows_check" --gs 64 --m 2,8,32 --iters 5 \
        >> "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt" ;;
    qmm)
      timeout $(( L < ${QMM_CAP:-200} ? L : ${QMM_CAP:-200} )) "$NEW/qmm_rows_check" ${QMM_ARGS:---gs 64 --m 2,3,4,8,16,32 --iters 20} \
        > "$D/stdout.txt" 2>&1 ;;
    spec)
      # issue 19 after the M-row kernel: the echo self-draft (every draft accepted), and the
      # random 1B draft (none accepted) with --draft-min-acceptance 0.5; ours only.
      OUT=$D MLX_SDPA_SPLIT_QUERIES=1 STEP_TIMEOUT=120 SKIP_MLX_LM=1 timeout "$L" \
        bash benchmarks/gpu_spec.sh "$NEW" --pairs llama-3.1-8b-echo-bf16:llama-3.1-8b-echo-4bit \
        -k 3,4 > "$D/stdout.txt" 2>&1
      mkdir -p "$D/adapt"
      OUT=$D/adapt MLX_SDPA_SPLIT_QUERIES=1 STEP_TIMEOUT=120 SKIP_MLX_LM=1 \
        OURS_SPEC_ARGS="--draft-min-acceptance 0.5" timeout "$(left)" \
        bash benchmarks/gpu_spec.sh "$NEW" --pairs llama-3.1-8b-echo-bf16:llama-3.2-1b-bf16 \
        -k 3 >> "$D/stdout.txt" 2>&1 ;;
    start8b)
      # issue 21: process start to first token, 8B 4-bit (target <= 3 s): each tool 3 times
      # in turn (the first of ours may compile our kernels; MLX keeps them on disk after)
      ensure_model llama-3.1-8b-4bit "$D"
      for i in 1 2 3; do for who in ours mlx-lm; do
        cmd=("$NEW/mlx-generate"); [ "$who" = mlx-lm ] && cmd=(python3 -m mlx_lm generate)
        s=$(date +%s%N)
        timeout 120 "${cmd[@]}" --model "$MODELS/llama-3.1-8b-4bit" --prompt hi -m 1 \
          > "$D/$who-$i.txt" 2>&1
        rc=$?
        # MLX's kernel cache (its default place): a count that grows after the first runs
        # means something compiles again in every process
        n=$(find /tmp/mlx -name '*.ptx' 2>/dev/null | wc -l)
        echo "$who run $i rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms; $n cached kernels" >> "$D/stdout.txt"
      done; done ;;
    startcc)
      # issue 21: where the 8B 4-bit start goes. The CUDA driver's cache of kernels it
      # compiled from PTX (MLX's kernel cache holds PTX) is 256 MB by default; here it gets
      # 4 GB in a fresh place (CUDA_CACHE_MAXSIZE, CUDA_CACHE_PATH), ours 3 times, then
      # once without our 4-bit kernels (MLX_FAST_QMV=0)
      ensure_model llama-3.1-8b-4bit "$D"
      echo "driver cache settings: ${CUDA_CACHE_PATH:-unset} ${CUDA_CACHE_MAXSIZE:-unset} ${CUDA_CACHE_DISABLE:-unset}; ~/.nv: $(du -sh ~/.nv 2>/dev/null | cut -f1)" >> "$D/stdout.txt"
      for arm in cc1 cc2 cc3 noqmv; do
        e=(CUDA_CACHE_MAXSIZE=4294967296 CUDA_CACHE_PATH=/tmp/nvcache)
        [ "$arm" = noqmv ] && e+=(MLX_FAST_QMV=0)
        s=$(date +%s%N)
        env "${e[@]}" timeout 120 "$NEW/mlx-generate" --model "$MODELS/llama-3.1-8b-4bit" \
          --prompt hi -m 1 > "$D/$arm.txt" 2>&1
        echo "$arm rc=$? $(( ($(date +%s%N) - s) / 1000000 )) ms; $(grep Prompt "$D/$arm.txt"); driver cache $(du -sh /tmp/nvcache 2>/dev/null | cut -f1)" >> "$D/stdout.txt"
      done ;;
    text4b)
      # issue 21: greedy text of the 8B 4-bit shape after a long prompt (the prefill through
      # the tiled kernel of fast_qmm.cpp), ours against MLX_FAST_QGEMM=0 and mlx-lm: the same
      # text in all three
      ensure_model llama-3.1-8b-4bit "$D"
      prompt=$(head -c ${TEXT_CHARS:-6000} crates/mlx-quant/src/calibration.txt)
      # TEXT_ARMS (ours noqgemm mlxlm; repeat one to see run-to-run variation)
      i=0
      for arm in ${TEXT_ARMS:-ours noqgemm mlxlm}; do
        i=$((i + 1)); e=(); cmd=("$NEW/mlx-generate")
        [ "$arm" = noqgemm ] && e=(MLX_FAST_QGEMM=0)
        [ "$arm" = mlxlm ] && cmd=(python3 -m mlx_lm generate)
        env "${e[@]}" timeout 120 "${cmd[@]}" --model "$MODELS/llama-3.1-8b-4bit" \
          --prompt "$prompt" -m ${TEXT_TOKENS:-32} > "$D/$i-$arm.txt" 2>&1
        sed -n '/^==========$/,/^==========$/p' "$D/$i-$arm.txt" | grep -v '^==========$' > "$D/$i-$arm.text"
        echo "$i $arm text $(md5sum < "$D/$i-$arm.text" | cut -c1-8); $(grep -i 'prompt' "$D/$i-$arm.txt" | head -1)" >> "$D/stdout.txt"
      done ;;
    kcache)
      # issue 21: our kernels compiled into MLX's disk cache once (a fresh MLX_PTX_CACHE_DIR:
      # the first run compiles, the next two load), then MLX compiling them in every process
      # (MLX_FAST_KERNEL_CACHE=0, its own fresh folder), none of our kernels, and mlx-lm;
      # the 8 generated tokens of every arm must be the same text
      ensure_model llama-3.1-8b-4bit "$D"
      rm -rf /tmp/kc /tmp/kc-off /tmp/kc-mlxlm
      for arm in c1 c2 c3 off1 off2 noqmv mlxlm; do
        e=(MLX_PTX_CACHE_DIR=/tmp/kc MLX_FAST_KERNEL_CACHE_VERBOSE=1)
        cmd=("$NEW/mlx-generate")
        case $arm in
          off*) e=(MLX_PTX_CACHE_DIR=/tmp/kc-off MLX_FAST_KERNEL_CACHE=0) ;;
          noqmv) e+=(MLX_FAST_QMV=0) ;;
          mlxlm) e=(MLX_PTX_CACHE_DIR=/tmp/kc-mlxlm); cmd=(python3 -m mlx_lm generate) ;;
        esac
        s=$(date +%s%N)
        env "${e[@]}" timeout 120 "${cmd[@]}" --model "$MODELS/llama-3.1-8b-4bit" --prompt hi \
          -m 8 > "$D/$arm.txt" 2>&1
        rc=$?
        ms=$(( ($(date +%s%N) - s) / 1000000 ))
        sed -n '/^==========$/,/^==========$/p' "$D/$arm.txt" | grep -v '^==========$' > "$D/$arm.text"
        echo "$arm rc=$rc $ms ms; cached: kc $(find /tmp/kc -name '*.ptx' 2>/dev/null | wc -l), kc-off $(find /tmp/kc-off -name '*.ptx' 2>/dev/null | wc -l); text $(md5sum < "$D/$arm.text" | cut -c1-8); $(grep -c 'kernel cache' "$D/$arm.txt") cache notes" >> "$D/stdout.txt"
      done
      grep -h 'kernel cache' "$D"/*.txt | sort | uniq -c | head -20 >> "$D/stdout.txt"
      ls /tmp/kc | head -40 >> "$D/stdout.txt" ;;
    specab)
      # issue 19, the session-18 regression (echo 8B with its 4-bit copy at ~200 ms a round,
      # 128.9 tok/s in session 14): mlx-generate with the draft under switches that take
      # our kernels out one by one (SPEC_ARMS): default, noqmm (MLX_FAST_QMM=0: the draft's
      # 2-row catch-up on MLX's qmm, as in session 14), noqmv (MLX_FAST_QMV=0: none of our
      # 4-bit kernels), nocudnn (MLX_CUDA_USE_CUDNN_SDPA=0 and no split attention: MLX's
      # own kernels for every attention), wr1 (MLX_FAST_QMM_WARP_ROWS=1: the multi-row
      # kernel's one-row-of-w layout), nopool (MLX_HOST_BUFFER_POOL=0: host uploads on
      # MLX's cached buffers), noadvise (MLX_HOST_BUFFER_ADVISE=0: the pool's managed
      # buffers left to migrate), plain (no draft); each with the engine's profile
      # lines (a speculative run's split of a round: draft, verify build, wait); lean
      # (MLX_FAST_QMV_LEAN=1: the draft's one-row 4-bit kernels' lean bodies)
      ensure_echo "$D"
      P="$(python3 -c "print(' '.join(['hello world'] * 40))")"
      for arm in ${SPEC_ARMS:-default noqmm noqmv plain}; do
        e=(MLX_SDPA_SPLIT_QUERIES=1 MLX_ENGINE_PROFILE=1)
        a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 3)
        case $arm in
          rows) e+=(MLX_FAST_GEMV_ROWS=1) ;;
          rowsr2) e+=(MLX_FAST_GEMV_ROWS=1 MLX_FAST_GEMV_ROWS_R=2) ;;
          rowsr4) e+=(MLX_FAST_GEMV_ROWS=1 MLX_FAST_GEMV_ROWS_R=4) ;;
          rowsk7r2) e+=(MLX_FAST_GEMV_ROWS=1 MLX_FAST_GEMV_ROWS_R=2); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          k7) a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          rowsk5) e+=(MLX_FAST_GEMV_ROWS=1); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 5) ;;
          rowsk7) e+=(MLX_FAST_GEMV_ROWS=1); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          k5) a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 5) ;;
          # eager: the round's last draft fed to the draft model behind the verification
          # (MLX_DRAFT_EAGER_FEED=1: no two-token catch-up step); sync: each draft step
          # waited for (MLX_ENGINE_PROFILE=sync: the profile's step times are device times)
          k7eager) e+=(MLX_DRAFT_EAGER_FEED=1); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          k7sync) e=(MLX_SDPA_SPLIT_QUERIES=1 MLX_ENGINE_PROFILE=sync); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          k7eagersync) e=(MLX_SDPA_SPLIT_QUERIES=1 MLX_ENGINE_PROFILE=sync MLX_DRAFT_EAGER_FEED=1); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          k10eager) e+=(MLX_DRAFT_EAGER_FEED=1); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 10) ;;
          k7eagerrows) e+=(MLX_DRAFT_EAGER_FEED=1 MLX_FAST_GEMV_ROWS=1); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          k3eager) e+=(MLX_DRAFT_EAGER_FEED=1) ;;
          # kNe / kNn: k = N with the eager feed on / off (MLX_DRAFT_EAGER_FEED=1 / 0)
          k*e) e+=(MLX_DRAFT_EAGER_FEED=1); kk=${arm#k}; a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens "${kk%e}") ;;
          # rNd / rNn: the random Llama-3.2-1B bf16 as the draft (same vocabulary, almost
          # nothing accepted), k = N, eager feed default / off
          r*d) ensure_model llama-3.2-1b-bf16 "$D"; kk=${arm#r}; a=(--draft-model "$MODELS/llama-3.2-1b-bf16" --num-draft-tokens "${kk%d}") ;;
          r*z) ensure_model llama-3.2-1b-bf16 "$D"; kk=${arm#r}; a=(--draft-model "$MODELS/llama-3.2-1b-bf16" --num-draft-tokens "${kk%z}" --draft-min-acceptance 0) ;;
          r*n) ensure_model llama-3.2-1b-bf16 "$D"; e+=(MLX_DRAFT_EAGER_FEED=0); kk=${arm#r}; a=(--draft-model "$MODELS/llama-3.2-1b-bf16" --num-draft-tokens "${kk%n}") ;;
          # mlxlmN: mlx-lm's speculation on the echo pair, k = N (its own env: none of ours)
          mlxlm*) e=(MLX_ENGINE_PROFILE=0) ;;
          # kNm: k = N (eager default) with the draft's q/k/v and gate/up groups as one launch each
          k*m) e+=(MLX_FAST_QMV_MANY_MAX_ELEMENTS=1000000000); kk=${arm#k}; a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens "${kk%m}") ;;
          plain4m) e+=(MLX_FAST_QMV_MANY_MAX_ELEMENTS=1000000000); a=() ;;
          # kNs / plain4s: run 8's 16M bound of one launch (the default before session 40)
          k*s) e+=(MLX_FAST_QMV_MANY_MAX_ELEMENTS=16777216); kk=${arm#k}; a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens "${kk%s}") ;;
          plain4s) e+=(MLX_FAST_QMV_MANY_MAX_ELEMENTS=16777216); a=() ;;
          k*d) kk=${arm#k}; a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens "${kk%d}") ;;
          k*n) e+=(MLX_DRAFT_EAGER_FEED=0); kk=${arm#k}; a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens "${kk%n}") ;;
          # kNp: k = N with the pipelined rounds (MLX_DRAFT_PIPELINE=1: the next round's
          # drafts queued behind the verification, session 49)
          k*p) e+=(MLX_DRAFT_PIPELINE=1); kk=${arm#k}; a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens "${kk%p}") ;;
          # oneseq: the draft's two-token catch-up through our multi-row 4-bit kernel
          # (MLX_FAST_QMM_ONE_SEQ_ROWS=2; MLX's qmm_sm90 otherwise)
          k7oneseq) e+=(MLX_FAST_QMM_ONE_SEQ_ROWS=2); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          k7oneseqsync) e=(MLX_SDPA_SPLIT_QUERIES=1 MLX_ENGINE_PROFILE=sync MLX_FAST_QMM_ONE_SEQ_ROWS=2); a=(--draft-model "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens 7) ;;
          plain4) a=() ;;
          noqmm) e+=(MLX_FAST_QMM=0) ;;
          noqmv) e+=(MLX_FAST_QMV=0) ;;
          lean) e+=(MLX_FAST_QMV_LEAN=1) ;;
          nocudnn) e=(MLX_CUDA_USE_CUDNN_SDPA=0 MLX_ENGINE_PROFILE=1) ;;
          wr1) e+=(MLX_FAST_QMM_WARP_ROWS=1) ;;
          nopool) e+=(MLX_HOST_BUFFER_POOL=0) ;;
          noadvise) e+=(MLX_HOST_BUFFER_ADVISE=0) ;;
          plain) a=() ;;
        esac
        echo "## $arm" >> "$D/stdout.txt"
        [ "$(left)" -lt 40 ] && break
        s=$(date +%s%N)
        # plain4: the draft model alone, plainly (its own step time)
        tm="$MODELS/llama-3.1-8b-echo-bf16"; [ "${arm#plain4}" != "$arm" ] && tm="$MODELS/llama-3.1-8b-echo-4bit"
        if [ "${arm#mlxlm}" != "$arm" ]; then
          timeout 150 python3 -m mlx_lm generate --model "$tm" --draft-model \
            "$MODELS/llama-3.1-8b-echo-4bit" --num-draft-tokens "${arm#mlxlm}" --prompt "$P" \
            -m "${SPEC_M:-128}" --verbose True 2>&1 | grep -v "^ *hello" >> "$D/stdout.txt"
        else
        env "${e[@]}" timeout 120 "$NEW/mlx-generate" --model "$tm" \
          --prompt "$P" -m "${SPEC_M:-128}" "${a[@]}" --verbose True 2>&1 | grep -v "^ *hello" >> "$D/stdout.txt"
        fi
        echo "wall $(( ($(date +%s%N) - s) / 1000000 )) ms" >> "$D/stdout.txt"
      done ;;
    rowscheck)
      # ROWS_R: the rows of w a warp to run it with, one process each (MLX_FAST_GEMV_ROWS_R;
      # the same bits); ROWS_M: the sweep's row counts
      ensure_echo "$D"
      for r in ${ROWS_R:-1}; do
        echo "## MLX_FAST_GEMV_ROWS_R=$r" >> "$D/stdout.txt"
        MLX_FAST_GEMV_ROWS_R=$r GEMV_ROWS_CHECK_M=${ROWS_M:-2,3,4,8} MLX_SDPA_SPLIT_QUERIES=1 \
          timeout "$(left)" "$NEW/gemv_rows_check" "$MODELS/llama-3.1-8b-echo-bf16" 64 \
          "${ROWS_ITERS:-10}" >> "$D/stdout.txt" 2>&1
        echo "rc=$?" >> "$D/stdout.txt"
      done
      ptx_usage mlxs_gemv >> "$D/stdout.txt" 2>&1 ;;
    abbf)
      ensure_echo "$D"
      for b in ${ABBF_BATCHES:-2 4 8}; do for arm in ${ABBF_ARMS:-off batch batch off}; do
        [ "$(left)" -lt 40 ] && break 2
        e=(); [ "$arm" = batch ] && e=(MLX_FAST_GEMV_ROWS=batch)
        [ "$arm" = batchr2 ] && e=(MLX_FAST_GEMV_ROWS=batch MLX_FAST_GEMV_ROWS_R=2)
        echo "## b=$b arm=$arm" >> "$D/stdout.txt"
        env "${e[@]}" timeout 120 "$NEW/mlx-benchmark" --model "$MODELS/llama-3.1-8b-echo-bf16" \
          -p 128 -g 128 -b $b -n "${AB_N:-2}" >> "$D/stdout.txt" 2>&1
      done; done ;;
    moe)
      for m in ${MOE_MODELS:-qwen3-30b-a3b-l12-4bit gpt-oss-20b-l12-4bit}; do
        ensure_model "$m" "$D"
      done
      r=0
      while [ $r -lt "${MOE_ROUNDS:-1}" ]; do
        order=(${MOE_ARMS:-ours mlx-lm})
        if [ $((r % 2)) = 1 ]; then rev=(); for a in "${order[@]}"; do rev=("$a" "${rev[@]}"); done; order=("${rev[@]}"); fi
        for m in ${MOE_MODELS:-qwen3-30b-a3b-l12-4bit gpt-oss-20b-l12-4bit}; do
          for c in ${MOE_CASES:-1:512:128 32:128:128}; do
            IFS=: read -r b p g <<< "$c"
            for arm in "${order[@]}"; do
              [ "$(left)" -lt 60 ] && break 4
              e=(${MOE_ENV:-}); cmd=("$NEW/mlx-benchmark")
              [ "$arm" = mlx-lm ] && { e=(); cmd=(python3 -m mlx_lm benchmark); }
              [ "$arm" = noqmv ] && e=(MLX_FAST_QMV=0)
              # gqmv: a token's experts below 8 rows (gpt-oss's top 4 at batch 1) through our
              # one-row body's gathered form, MLX's gather_qmv bits; gqmvlean with LEAN too
              [ "$arm" = gqmv ] && e=(MLX_FAST_GATHER_QMV=1)
              [ "$arm" = gqmvlean ] && e=(MLX_FAST_GATHER_QMV=1 MLX_FAST_QMV_LEAN=1)
              [ "$arm" = nogqmv ] && e=(MLX_FAST_GATHER_QMV=0)
              echo "## round=$r model=$m b=$b p=$p g=$g arm=$arm" >> "$D/stdout.txt"
              env "${e[@]}" timeout 240 "${cmd[@]}" --model "$MODELS/$m" -p "$p" -g "$g" -b "$b" \
                -n "${MOE_N:-2}" >> "$D/stdout.txt" 2>&1
              echo "rc=$?" >> "$D/stdout.txt"
            done
          done
        done
        r=$((r + 1))
      done ;;
    ab8b)
      ensure_model llama-3.1-8b-4bit "$D"
      # AB_BATCHES (1 8 32), AB_ARMS (on off), AB_N (2 trials a process), AB_MLX_LM (8 32)
      for b in ${AB_BATCHES:-1 8 32}; do for arm in ${AB_ARMS:-on exact off}; do
        e=(); [ "$arm" = off ] && e=(MLX_FAST_QMM=0); [ "$arm" = exact ] && e=(MLX_FAST_QMM_MMA=0)
        # qg: products of more than 32 rows of several sequences (the batch's prefill) to the
        # tiled kernel of MLX's bits (fast_qmm.cpp) instead of the tensor-core form
        [ "$arm" = qg ] && e=(MLX_FAST_QMM_MMA_MAX_ROWS=32)
        [ "$arm" = prof ] && e=(MLX_ENGINE_PROFILE=1 MLX_ENGINE_PROFILE_EVERY=32)
        # mask: mlx-lm's all-true mask kept in a decoding step of unpadded rows
        [ "$arm" = mask ] && e=(MLX_BATCH_DECODE_MASK=array)
        # nopad: MLX's masked attention for padded rows (not our sdpa_padded kernel); pf:
        # that kernel with its next key's rows loaded ahead
        [ "$arm" = nopad ] && e=(MLX_SDPA_PADDED=0)
        [ "$arm" = pf ] && e=(MLX_SDPA_PADDED_PREFETCH=1)
        # lean: the one-row 4-bit kernels' lean bodies (byte-permute unpack, per-lane bases)
        [ "$arm" = lean ] && e=(MLX_FAST_QMV_LEAN=1)
        [ "$arm" = nolean ] && e=(MLX_FAST_QMV_LEAN=0)
        # xs: the one-row bodies with x's alignment decided once (MLX_FAST_QMV_ALIGNED_SPLIT,
        # session 50: 48 registers against 64)
        [ "$arm" = xs ] && e=(MLX_FAST_QMV_ALIGNED_SPLIT=1)
        # manyall: q/k/v and gate/up (with the swiglu) as one launch each at every size
        # (the 16M-element bound of run 8 keeps the 8B's groups apart; session 39 found
        # its step bound by the host: ~3.8 us of MLX's encode a primitive)
        [ "$arm" = manyall ] && e=(MLX_FAST_QMV_MANY_MAX_ELEMENTS=1000000000)
        # sep: run 8's 16M-element bound (the 8B's groups as separate launches; the
        # default before session 40)
        [ "$arm" = sep ] && e=(MLX_FAST_QMV_MANY_MAX_ELEMENTS=16777216)
        # norm / nonorm: MLX's rms_norm of a one-row product's input computed in our launch
        # (MLX_FAST_QMV_NORM, session 41) on / off
        [ "$arm" = norm ] && e=(MLX_FAST_QMV_NORM=1)
        [ "$arm" = nonorm ] && e=(MLX_FAST_QMV_NORM=0)
        # the tensor-core product's layout: 4 warps a block (mmaw4), 16 rows of w a block
        # always (mmarw1), both
        [ "$arm" = mmaw4 ] && e=(MLX_FAST_QMM_MMA_WARPS=4)
        [ "$arm" = mmarw1 ] && e=(MLX_FAST_QMM_MMA_MIN_BLOCKS=1000000000)
        [ "$arm" = mmaw4rw1 ] && e=(MLX_FAST_QMM_MMA_WARPS=4 MLX_FAST_QMM_MMA_MIN_BLOCKS=1000000000)
        # 64 rows of w a block (x read from L2 half as often; at 32 rows of x only with 4
        # warps, whose partial sums fit 48 KB): mmarw4 alone takes it at batch 8
        [ "$arm" = mmarw4 ] && e=(MLX_FAST_QMM_MMA_RW=4)
        [ "$arm" = mmaw4rw4 ] && e=(MLX_FAST_QMM_MMA_WARPS=4 MLX_FAST_QMM_MMA_RW=4)
        echo "## b=$b arm=$arm" >> "$D/stdout.txt"
        env "${e[@]}" timeout 120 "$NEW/mlx-benchmark" --model "$MODELS/llama-3.1-8b-4bit" \
          -p 128 -g 128 -b $b -n "${AB_N:-2}" >> "$D/stdout.txt" 2>&1
      done; done
      for b in ${AB_MLX_LM-8 32}; do
        echo "## b=$b mlx-lm" >> "$D/stdout.txt"
        timeout 120 python3 -m mlx_lm benchmark --model "$MODELS/llama-3.1-8b-4bit" \
          -p 128 -g 128 -b $b -n "${AB_N:-2}" >> "$D/stdout.txt" 2>&1
      done ;;
    sdpapad)
      # issue 21: our attention kernel over left-padded rows (fast_sdpa.cpp, written in
      # session 33 without a device) against MLX's masked attention: errors and times
      # SDPA_ARMS: environments to run it under, `;`-separated (default: the defaults)
      IFS=';' read -r -a sdpa_arms <<< "${SDPA_ARMS:-MLX_SDPA_PADDED=1}"
      for a in "${sdpa_arms[@]}"; do
        echo "## $a" >> "$D/stdout.txt"
        # shellcheck disable=SC2086
        env $a timeout "$(left)" "$NEW/sdpa_pad_check" "${SDPA_ITERS:-5}" >> "$D/stdout.txt" 2>&1
        echo "rc=$?" >> "$D/stdout.txt"
      done
      ptx_usage mlxs_sdpa_pad >> "$D/stdout.txt" 2>&1 ;;
    agree)
      # batched decoding's quality check (benchmarks/batch_agree.py): greedy answers of
      # AGREE_STREAMS (8 32) requests served alone against served together, on the real
      # default model (/root/stash/smollm2), its float16 copy (AGREE_MODEL=smollm2-f16:
      # benchmarks/cast_model.py; the padded-rows attention kernel takes half precision
      # only) or AGREE_MODEL; AGREE_ARMS: default, mask (MLX_BATCH_DECODE_MASK=array:
      # mlx-lm's all-true mask kept), nopad (MLX_SDPA_PADDED=0: MLX's masked attention
      # for padded rows)
      dir=${AGREE_MODEL:-/root/stash/smollm2}
      if [ "$dir" = smollm2-f16 ]; then
        dir=/tmp/smollm2-f16
        [ -d "$dir" ] || python3 benchmarks/cast_model.py /root/stash/smollm2 "$dir" --dtype float16 >> "$D/stdout.txt" 2>&1
      fi
      [ -d "$dir" ] || { ensure_model "$dir" "$D"; dir=$MODELS/$dir; }
      port=18951
      for arm in ${AGREE_ARMS:-default mask}; do
        [ "$(left)" -lt 40 ] && break
        e=(); [ "$arm" = mask ] && e=(MLX_BATCH_DECODE_MASK=array)
        [ "$arm" = nopad ] && e=(MLX_SDPA_PADDED=0)
        env "${e[@]}" "$NEW/mlx-server" --model "$dir" --port $port > "$D/server-$arm.log" 2>&1 &
        srv=$!
        for _ in $(seq 1 300); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; sleep 1; done
        for n in ${AGREE_STREAMS:-8 32}; do
          timeout "$(left)" python3 benchmarks/batch_agree.py --base-url http://127.0.0.1:$port \
            --streams "$n" -g "${AGREE_G:-64}" --rounds "${AGREE_ROUNDS:-2}" --label "$arm" \
            >> "$D/stdout.txt" 2>&1
        done
        kill $srv; wait $srv 2>/dev/null
      done ;;
    manycheck)
      # the 8B's q/k/v and gate/up (+ swiglu) groups as one launch (no size bound, the
      # default since session 40) against MLX's qmv, bit for bit: shapes, then logits;
      # then llama-3.2-1b-4bit's logits (its 33.6M-element gate/up pair)
      ensure_model llama-3.1-8b-4bit "$D"
      ensure_model llama-3.2-1b-4bit "$D"
      timeout $(( $(left) > 150 ? $(left) - 90 : 60 )) "$NEW/fused_check" "$MODELS/llama-3.1-8b-4bit" 64 16 qmv \
        > "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt"
      FUSED_CHECK_SHAPES=0 timeout 80 "$NEW/fused_check" "$MODELS/llama-3.2-1b-4bit" 64 16 qmv \
        >> "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt" ;;
    normcheck)
      # MLX's rms_norm computed in our one-row launches (MLX_FAST_QMV_NORM) against MLX's
      # rms_norm kernel, bit for bit: every MLX rms_norm block shape through a group, a
      # swiglu and a single product, then the 8B's logits; then llama-3.2-1b-4bit's and
      # qwen2.5-0.5b-4bit's logits
      ensure_model llama-3.1-8b-4bit "$D"
      ensure_model llama-3.2-1b-4bit "$D"
      ensure_model qwen2.5-0.5b-4bit "$D"
      timeout $(( $(left) > 200 ? $(left) - 140 : 60 )) "$NEW/fused_check" "$MODELS/llama-3.1-8b-4bit" 64 16 norm \
        > "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt"
      for m in llama-3.2-1b-4bit qwen2.5-0.5b-4bit; do
        FUSED_CHECK_SHAPES=0 timeout 65 "$NEW/fused_check" "$MODELS/$m" 64 16 norm >> "$D/stdout.txt" 2>&1
        echo "rc=$?" >> "$D/stdout.txt"
      done ;;
    ncuarms)
      # ncu kernel durations of NCU_MODEL's decoding steps (llama-3.1-8b-4bit) per arm
      # (NCU_ARMS: default, sep = run 8's 16M bound of one launch), NCU_SKIP / NCU_COUNT
      NCU_MODEL=${NCU_MODEL:-llama-3.1-8b-4bit}
      ensure_model "$NCU_MODEL" "$D"
      if [ -z "$NCU" ]; then echo "no ncu" > "$D/stdout.txt"; else
        decode_cmd "$NCU_MODEL"
        for arm in ${NCU_ARMS:-default sep}; do
          e=()
          [ "$arm" = sep ] && e=(MLX_FAST_QMV_MANY_MAX_ELEMENTS=16777216)
          [ "$arm" = norm ] && e=(MLX_FAST_QMV_NORM=1)
          env "${e[@]}" timeout $(( $(left) / 2 )) "$NCU" --csv --metrics gpu__time_duration.sum \
            --launch-skip "${NCU_SKIP:-4000}" --launch-count "${NCU_COUNT:-1500}" \
            "${cmd[@]}" > "$D/ncu-$arm.csv" 2> "$D/stderr-$arm.txt"
          echo "$arm rc=$? ncu=$NCU" >> "$D/stdout.txt"
        done
      fi ;;
    ncudeep)
      # why a kernel runs where it does: ncu's speed-of-light, occupancy, warp-state and
      # memory sections of DEEP_COUNT (3) launches of kernels matching DEEP_KERNEL (a regex
      # of ncu's kernel names; default our one-row 4-bit product) after DEEP_SKIP (200) of
      # them, in mlx-generate on DEEP_MODEL (llama-3.1-8b-4bit), or with DEEP_BATCH=B
      # mlx-benchmark -b B; DEEP_ENV for the arm's switches
      DEEP_MODEL=${DEEP_MODEL:-llama-3.1-8b-4bit}
      ensure_model "$DEEP_MODEL" "$D"
      if [ -z "$NCU" ]; then echo "no ncu" > "$D/stdout.txt"; else
        decode_cmd "$DEEP_MODEL" "${DEEP_BATCH:-}"
        # DEEP_ARMS: one ncu run an arm, in order (default: DEEP_ENV's switches or none;
        # xs: MLX_FAST_QMV_ALIGNED_SPLIT=1), each in its own files, the time left shared
        arms=(${DEEP_ARMS:-env}); i=0
        for arm in "${arms[@]}"; do
          t=$(( ($(left) - 10) / (${#arms[@]} - i) )); i=$((i + 1))
          e=(${DEEP_ENV:-}); [ "$arm" = default ] && e=(); [ "$arm" = xs ] && e=(MLX_FAST_QMV_ALIGNED_SPLIT=1)
          f=$D/ncu-$i-$arm
          env "${e[@]}" timeout "$t" "$NCU" --kernel-name "regex:${DEEP_KERNEL:-mlxs_qmv}" \
            --launch-skip "${DEEP_SKIP:-200}" --launch-count "${DEEP_COUNT:-3}" \
            --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section LaunchStats \
            "${cmd[@]}" > "$f.txt" 2> "$f.stderr.txt"
          echo "## $arm (${e[*]}) rc=$? ncu=$NCU" >> "$D/stdout.txt"
          grep -E "^  [a-z_]|Duration|Throughput|Occupancy|Registers|Stall|Block Size|Grid Size|Waves" \
            "$f.txt" | head -150 >> "$D/stdout.txt"
        done
      fi ;;
    xscheck)
      # MLX_FAST_QMV_ALIGNED_SPLIT=1's kernels against MLX's qmv, bit for bit: every product
      # shape, then the 8B 4-bit and qwen2.5-0.5b-4bit logits
      ensure_model llama-3.1-8b-4bit "$D"
      ensure_model qwen2.5-0.5b-4bit "$D"
      MLX_FAST_QMV_ALIGNED_SPLIT=1 timeout $(( $(left) > 150 ? $(left) - 90 : 60 )) "$NEW/fused_check" "$MODELS/llama-3.1-8b-4bit" 64 16 qmv \
        > "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt"
      MLX_FAST_QMV_ALIGNED_SPLIT=1 FUSED_CHECK_SHAPES=0 timeout 60 "$NEW/fused_check" "$MODELS/qwen2.5-0.5b-4bit" 64 16 qmv \
        >> "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt" ;;
    ncubf16)
      NCU_MODEL=${NCU_MODEL:-llama-3.1-8b-bf16}
      ensure_model "$NCU_MODEL" "$D"
      if [ -z "$NCU" ]; then echo "no ncu" > "$D/stdout.txt"; else
        # NCU_BATCH=B: batched decoding steps instead (mlx-benchmark -b B -p 64 -g 128)
        decode_cmd "$NCU_MODEL" "${NCU_BATCH:-}"
        env ${NCU_ENV:-} timeout $(( L - 10 )) "$NCU" --csv --metrics gpu__time_duration.sum \
          --launch-skip "${NCU_SKIP:-8000}" --launch-count "${NCU_COUNT:-900}" \
          "${cmd[@]}" > "$D/ncu.csv" 2> "$D/stderr.txt"
        echo "rc=$? ncu=$NCU" > "$D/stdout.txt"
      fi ;;
    gemvproto)
      timeout "$L" python3 benchmarks/gemv_proto.py > "$D/stdout.txt" 2>&1 ;;
    gemvcheck)
      ensure_model llama-3.1-8b-bf16 "$D"
      ensure_model qwen2.5-0.5b-bf16 "$D"
      timeout $(( L - 20 )) "$NEW/fused_check" "$MODELS/llama-3.1-8b-bf16" 64 16 gemv \
        > "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt"
      FUSED_CHECK_SHAPES=0 timeout 120 "$NEW/fused_check" "$MODELS/qwen2.5-0.5b-bf16" 64 16 gemv \
        >> "$D/stdout.txt" 2>&1
      echo "rc=$?" >> "$D/stdout.txt" ;;
    gemvab)
      arms=(${GEMV_ARMS:-on off}); r=0
      for m in ${GEMV_MODELS:-llama-3.1-8b-bf16}; do ensure_model "$m" "$D"; done
      while [ $r -lt "${GEMV_ROUNDS:-2}" ]; do
        order=("${arms[@]}" mlx-lm)
        [ $((r % 2)) = 1 ] && order=(mlx-lm $(printf '%s\n' "${arms[@]}" | tac))
        for m in ${GEMV_MODELS:-llama-3.1-8b-bf16}; do for arm in "${order[@]}"; do
          [ "$(left)" -lt 45 ] && break 3
          e=(); cmd=("$NEW/mlx-benchmark")
          case $arm in
            off) e=(MLX_FAST_GEMV=0) ;;
            u8) e=(MLX_FAST_GEMV_LOADS=8) ;;
            u32) e=(MLX_FAST_GEMV_LOADS=32) ;;
            w4) e=(MLX_FAST_GEMV_WARPS=4) ;;
            mlx-lm) cmd=(python3 -m mlx_lm benchmark) ;;
          esac
          echo "## round=$r model=$m arm=$arm" >> "$D/stdout.txt"
          env "${e[@]}" timeout 150 "${cmd[@]}" --model "$MODELS/$m" -p 128 -g "${GEMV_G:-256}" \
            -n 2 >> "$D/stdout.txt" 2>&1
        done; done
        r=$((r + 1))
      done ;;
    pf4b)
      # issue 21: prefill of one prompt (PF_P tokens, 512), 8B bf16 against 8B 4-bit by
      # default (MLX's qmm, mlx-lm's bits), with MLX_DEQUANT_GEMM=1 (our dequantize kernel),
      # dqmlx (the same with MLX's dequantize: MLX_FAST_DEQUANT=0) and with
      # MLX_FAST_QMM_MMA=force; PF_ARMS picks
      # (PF_BF16: the bf16 variant, e.g. llama-3.1-8b-echo-bf16 when that one is there:
      # the same shapes)
      ensure_model llama-3.1-8b-4bit "$D"
      ensure_model "${PF_BF16:-llama-3.1-8b-bf16}" "$D"
      for arm in ${PF_ARMS:-bf16 default dequant mma}; do
        v=llama-3.1-8b-4bit; e=()
        case $arm in
          bf16) v=${PF_BF16:-llama-3.1-8b-bf16} ;;
          dequant) e=(MLX_DEQUANT_GEMM=1) ;;
          dqmlx) e=(MLX_DEQUANT_GEMM=1 MLX_FAST_DEQUANT=0) ;;
          mma) e=(MLX_FAST_QMM_MMA=force) ;;
          noqgemm) e=(MLX_FAST_QGEMM=0) ;;
        esac
        echo "## arm=$arm" >> "$D/stdout.txt"
        env "${e[@]}" timeout 120 "$NEW/mlx-benchmark" --model "$MODELS/$v" -p "${PF_P:-512}" \
          -g 8 -n "${PF_N:-2}" >> "$D/stdout.txt" 2>&1
      done ;;
    qgemm)
      # QGEMM_MODEL: a bench model whose shapes to take (else the synthetic ones). (Session
      # 24's arms regs / smem / bm1 compared forms of the kernel since removed.)
      [ -n "${QGEMM_MODEL:-}" ] && ensure_model "$QGEMM_MODEL" "$D"
      a=(${QGEMM_ARGS:-}); [ -n "${QGEMM_MODEL:-}" ] && a+=(--model "$MODELS/$QGEMM_MODEL")
      # QGEMM_ENV, e.g. MLX_FAST_GATHER_QMV=1 (the gathered products below 8 rows must then
      # run our one-row body with MLX's gather_qmv bits)
      env ${QGEMM_ENV:-} timeout "$L" "$NEW/qgemm_check" "${a[@]}" > "$D/stdout.txt" 2>&1 ;;
    mma)
      ensure_model llama-3.1-8b-4bit "$D"
      # shellcheck disable=SC2086
      timeout "$L" "$NEW/qmm_mma_check" ${MMA_ARGS:---model $MODELS/llama-3.1-8b-4bit --m 2,8,16,32 --forced-m 64,128,512 --iters 20} \
        > "$D/stdout.txt" 2>&1 ;;
    quality)
      dm=; [ -f /root/stash/smollm2/config.json ] && dm=/root/stash/smollm2
      OUT=$D DEFAULT_MODEL=$dm timeout "$L" bash benchmarks/gpu_quality.sh "$NEW" > "$D/stdout.txt" 2>&1 ;;
    srv4b)
      ensure_model llama-3.1-8b-4bit "$D"
      # SRV_ARMS: default, dequant (MLX_DEQUANT_GEMM=1: a single prompt's prefill products
      # as a dequantize and a dense matmul), bigdq (the same, and batched products of more
      # than 256 rows too: MLX_FAST_QMM_MMA_MAX_ROWS=256), pc32 (our server prefilling up to
      # 32 prompts at once, --prompt-concurrency 32, instead of mlx-lm's 8: 32 streams' prompts
      # then go in one prefill, not four); the wall time counts the 32 prompts' prefill
      for arm in ${SRV_ARMS:-default}; do
        e=(); a=(); [ "$arm" = dequant ] && e=(MLX_DEQUANT_GEMM=1)
        [ "$arm" = bigdq ] && e=(MLX_DEQUANT_GEMM=1 MLX_FAST_QMM_MMA_MAX_ROWS=256)
        [ "$arm" = pc32 ] && a=(--ours-arg --prompt-concurrency --ours-arg 32)
        [ "$arm" = nopad ] && e=(MLX_SDPA_PADDED=0)
        env "${e[@]}" timeout "$(left)" "$NEW/xtask" bench --server --ours "$NEW/mlx-server" \
          "${a[@]}" --python python3 --model "$MODELS/llama-3.1-8b-4bit" -p 128 -g 128 \
          --streams ${SRV_STREAMS:-8,32} --label "llama-3.1-8b-4bit $arm" \
          --out "$D/server.md" >> "$D/stdout.txt" 2>&1
      done
      cat "$D/server.md" >> "$D/stdout.txt" ;;
    next)
      # issue 26: benchmarks/gpu_next.sh NEXT_PARTS (check warm): the lean gated-delta step's
      # greedy text against MLX_GDN_LEAN=0 and mlx-lm, then warm rounds against mlx-lm
      OUT=$D DEADLINE=$((L - 10)) N=${NEXT_N:-2} ROUNDS=${NEXT_ROUNDS:-1} \
        bash benchmarks/gpu_next.sh "$NEW" ${NEXT_PARTS:-check warm} > "$D/stdout.txt" 2>&1 ;;
    nextab)
      OUT=$D DEADLINE=$((L - 10)) N=${NEXT_N:-2} ROUNDS=${NEXT_ROUNDS:-3} PROFILE=0 NOQMV=1 WARMUP=1 \
        EXTRA_ARMS=${NEXTAB_EXTRA-minel=MLX_FAST_QMV_MIN_ELEMENTS=16777216} \
        bash benchmarks/gpu_next.sh "$NEW" warm > "$D/stdout.txt" 2>&1 ;;
    nextgraph)
      NG_MODEL=${NG_MODEL:-qwen3-next-80b-a3b-l4-4bit}
      # An absolute NG_MODEL is a model directory (e.g. /root/stash/smollm2, the real default
      # model), else a make_bench_models.py variant
      if [ "${NG_MODEL#/}" != "$NG_MODEL" ]; then M=$NG_MODEL; else
        M=$MODELS/$NG_MODEL; ensure_model "$NG_MODEL" "$D"; fi
      for arm in ${NG_ARMS:-on off on2 off2}; do
        e=(); case $arm in off*) e=(MLX_FAST_QMV=0) ;; esac
        echo "## decode_build $arm" >> "$D/stdout.txt"
        env "${e[@]}" DECODE_BUILD_DOT="$D/ours-$arm.dot" timeout 120 "$NEW/decode_build" "$M" 128 64 \
          >> "$D/stdout.txt" 2>&1
      done
      timeout 120 python3 benchmarks/graph_nodes.py mlx-lm "$M" "$D/mlx-lm.dot" 128 > "$D/mlx-lm-graph.txt" 2>&1
      for f in ours-on ours-off mlx-lm; do
        python3 benchmarks/graph_nodes.py count "$D/$f.dot" > "$D/count-$f.txt" 2>&1
        head -1 "$D/count-$f.txt" >> "$D/stdout.txt"
      done
      rm -f "$D"/ours-on2.dot "$D"/ours-off2.dot ;;
    ds3)
      OUT=$D STEP_TIMEOUT=200 timeout "$L" bash benchmarks/gpu.sh "$NEW" --only deepseek-v3-l4-4bit \
        -p 512 -g 128 -n 2 --rounds 2 --startup-runs 0 --budget $((L - 20)) > "$D/stdout.txt" 2>&1 ;;
    structab)
      OUT=$D MLX_ENGINE_PROFILE=0 timeout "$L" bash benchmarks/gpu_structured.sh "$NEW" \
        --only "${STRUCT_ONLY:-qwen2.5-0.5b-bf16,llama-3.1-8b-bf16}" --streams 1,32 \
        --trials "${STRUCT_TRIALS:-3}" > "$D/stdout.txt" 2>&1 ;;
    structprof)
      # STRUCT_PROF_ARMS: default (the server's profile lines as they are); a name
      # holding beside adds MLX_MASKS_BESIDE=1 (the grammar worker), first
      # MLX_MASKS_FIRST=1 (the masks before the forward is queued, one evaluation a
      # step), fast MLX_FAST_MASK=1 (the masks applied by our one kernel, the default
      # since session 46; ops: MLX_FAST_MASK=0, MLX's five ops), both the
      # first two (beside from two grammar rows, first below): beside, first, fast,
      # firstfast, bothfast; each arm's records under $D/<arm>
      for arm in ${STRUCT_PROF_ARMS:-default}; do
        e=()
        case $arm in *beside*|both*) e+=(MLX_MASKS_BESIDE=1) ;; esac
        case $arm in *first*|both*) e+=(MLX_MASKS_FIRST=1) ;; esac
        case $arm in *fast*) e+=(MLX_FAST_MASK=1) ;; *ops*) e+=(MLX_FAST_MASK=0) ;; esac
        case $arm in *spliteval*) e+=(MLX_DECODE_SPLIT_EVAL=1) ;; esac
        mkdir -p "$D/$arm"
        env "${e[@]}" OUT="$D/$arm" MLX_ENGINE_PROFILE_EVERY=32 timeout "$(left)" bash benchmarks/gpu_structured.sh "$NEW" \
          --only "${STRUCT_ONLY:-qwen2.5-0.5b-bf16,llama-3.1-8b-bf16}" --streams "${STRUCT_STREAMS:-1,32}" \
          -g "${STRUCT_G:-256}" --trials "${STRUCT_TRIALS:-2}" > "$D/$arm/stdout.txt" 2>&1
      done ;;
    maskcheck)
      # issue 20: our grammar-mask kernel against MLX's ops (bits and times)
      timeout "$(left)" "$NEW/mask_check" 5 > "$D/stdout.txt" 2>&1 || echo "rc=$?" >> "$D/stdout.txt" ;;
    sdpaprobe)
      # issue 19: what a verification's attention costs (cuDNN graphs by key length)
      for nq in 4 8; do
        timeout "$(left)" python3 benchmarks/sdpa_graph_probe.py --queries $nq >> "$D/stdout.txt" 2>&1 || echo "rc=$?" >> "$D/stdout.txt"
      done
      # a prompt's prefill: a plan per new prompt length, one row and 8 left-padded rows
      timeout "$(left)" python3 benchmarks/sdpa_graph_probe.py --prefill --calls 24 >> "$D/stdout.txt" 2>&1 || echo "rc=$?" >> "$D/stdout.txt" ;;
    saveptx)
      (cd /tmp/mlx && tar -cJf "$OUT/ptx-cache.tar.xz" .) && ls -la "$OUT/ptx-cache.tar.xz" > "$D/stdout.txt" ;;
    structarms)
      for arm in ${STRUCT_ARMS:-default noadvise}; do
        e=()
        case $arm in
          noadvise) e=(MLX_HOST_BUFFER_ADVISE=0) ;;
          nopool) e=(MLX_HOST_BUFFER_POOL=0) ;;
        esac
        case $arm in *beside*|both*) e+=(MLX_MASKS_BESIDE=1) ;; esac
        case $arm in *first*|both*) e+=(MLX_MASKS_FIRST=1) ;; esac
        case $arm in *fast*) e+=(MLX_FAST_MASK=1) ;; *ops*) e+=(MLX_FAST_MASK=0) ;; esac
        mkdir -p "$D/$arm"
        env "${e[@]}" OUT="$D/$arm" MLX_ENGINE_PROFILE=0 timeout "$(left)" bash benchmarks/gpu_structured.sh \
          "$NEW" --only "${STRUCT_ONLY:-qwen2.5-0.5b-bf16,llama-3.1-8b-bf16}" --streams 1,32 \
          -g "${STRUCT_G:-256}" --trials "${STRUCT_TRIALS:-2}" > "$D/$arm/stdout.txt" 2>&1
        grep "ratio" "$D/$arm/structured.md" | sed "s/^/$arm /" >> "$D/stdout.txt"
      done ;;
    structmb)
      for arm in ${STRUCT_MB_ARMS:-default mb4000 mb16000}; do
        e=()
        case $arm in
          mb*) e=(MLX_MAX_MB_PER_BUFFER=${arm#mb}) ;;
          ops*) e=(MLX_MAX_OPS_PER_BUFFER=${arm#ops}) ;;
        esac
        mkdir -p "$D/$arm"
        env "${e[@]}" OUT="$D/$arm" MLX_ENGINE_PROFILE=0 timeout "$(left)" bash benchmarks/gpu_structured.sh \
          "$NEW" --only "${STRUCT_ONLY:-llama-3.1-8b-bf16}" --streams 1,32 -g "${STRUCT_G:-256}" \
          --trials "${STRUCT_TRIALS:-3}" > "$D/$arm/stdout.txt" 2>&1
        grep "ratio" "$D/$arm/structured.md" | sed "s/^/$arm /" >> "$D/stdout.txt"
      done ;;
    lora)
      # LORA_ARGS: e.g. "--only llama-3.2-1b-bf16 --bound-ab" (adds an arm without the
      # memory bound, which is on by default on CUDA since session 17)
      # shellcheck disable=SC2086
      OUT=$D timeout "$L" bash benchmarks/gpu_lora.sh "$NEW" --rounds 1 ${LORA_ARGS:-} > "$D/stdout.txt" 2>&1
      rm -rf "$D/adapters" "$D/data" ;;
    specsrv)
      # issue 19: the echo 8B bf16 with its own 4-bit copy as the draft model in the
      # batching server; SPEC_ARMS: plain, draft (each step drafts as many as pay, the
      # default) and draftall (MLX_MODEL_DRAFTS=all: num_draft_tokens every step)
      M=$MODELS/llama-3.1-8b-echo-bf16
      python3 xtask/py/make_bench_models.py --out "$MODELS" --only llama-3.1-8b-echo \
        --tokenizers .gpu/tok > "$D/models.txt" 2>&1
      # SPEC_ARMS also: none (MLX_MODEL_DRAFTS=none), syncsteps (MLX_MODEL_PLAIN_STEPS=0:
      # no plain step timed or queued, the GPU default before session 31), eager
      # (MLX_DRAFT_PREFILL=eager: prompts prefilled into the draft model at join, the
      # default before session 32), nobound (MLX_DRAFT_CATCH_UP_SHARE=inf: catch-ups
      # tried whatever the rows have left, before session 33), feed (MLX_DRAFT_EAGER_FEED=1:
      # every row's last draft fed right behind the verification, session 40, off by
      # default), pool (MLX_DRAFT_POOLED_ACCEPTANCE=1: joining rows start from the draft
      # model's acceptance over earlier rounds, session 41), first
      # (MLX_WIDTH_FIRST_SHAPES_UNTIMED=1: a step shape's first step, which may compile
      # kernels, not timed for the width, session 42), firstpool (both), feedfirst (feed and
      # first), warmdraft (the default, outputs kept apart: a first
      # arm on a fresh machine, which compiles the draft's kernels); SPEC_STREAMS
      # (1,8,32); SPEC_LOG=DEBUG logs each step; SPEC_K sets --num-draft-tokens.
      # Our server's log of each arm is kept as ours-<arm>.log.
      for arm in ${SPEC_ARMS:-plain draft draftall}; do
        extra=()
        [ "$arm" != plain ] && extra=(--ours-arg=--draft-model --ours-arg="$MODELS/llama-3.1-8b-echo-4bit")
        [ -n "${SPEC_LOG:-}" ] && extra+=(--ours-arg=--log-level --ours-arg="$SPEC_LOG")
        # SPEC_K: the server's --num-draft-tokens (mlx-lm's default 3 otherwise)
        [ "$arm" != plain ] && [ -n "${SPEC_K:-}" ] && extra+=(--ours-arg=--num-draft-tokens --ours-arg="$SPEC_K")
        unset MLX_MODEL_DRAFTS MLX_MODEL_PLAIN_STEPS MLX_DRAFT_PREFILL MLX_DRAFT_CATCH_UP_SHARE MLX_DRAFT_EAGER_FEED MLX_DRAFT_POOLED_ACCEPTANCE MLX_WIDTH_FIRST_SHAPES_UNTIMED
        case $arm in draftall) export MLX_MODEL_DRAFTS=all ;; none) export MLX_MODEL_DRAFTS=none ;;
          syncsteps) export MLX_MODEL_PLAIN_STEPS=0 ;; eager) export MLX_DRAFT_PREFILL=eager ;;
          nobound) export MLX_DRAFT_CATCH_UP_SHARE=inf ;; feed) export MLX_DRAFT_EAGER_FEED=1 ;;
          pool) export MLX_DRAFT_POOLED_ACCEPTANCE=1 ;; first) export MLX_WIDTH_FIRST_SHAPES_UNTIMED=1 ;;
          firstpool) export MLX_WIDTH_FIRST_SHAPES_UNTIMED=1 MLX_DRAFT_POOLED_ACCEPTANCE=1 ;;
          feedfirst) export MLX_DRAFT_EAGER_FEED=1 MLX_WIDTH_FIRST_SHAPES_UNTIMED=1 ;; esac
        rm -rf /tmp/mlx-bench-server-*
        MLX_SDPA_SPLIT_QUERIES=1 timeout $(( $(left) > 30 ? $(left) : 30 )) "$NEW/xtask" bench --server \
          --ours "$NEW/mlx-server" --python python3 --model "$M" -p 128 -g 128 \
          --streams "${SPEC_STREAMS:-1,8,32}" "${extra[@]}" --out "$D/server-$arm.md" > "$D/$arm.log" 2>&1
        cp /tmp/mlx-bench-server-*/ours.log "$D/ours-$arm.log" 2>/dev/null
      done
      unset MLX_MODEL_DRAFTS MLX_MODEL_PLAIN_STEPS MLX_DRAFT_PREFILL MLX_DRAFT_CATCH_UP_SHARE MLX_DRAFT_EAGER_FEED MLX_DRAFT_POOLED_ACCEPTANCE MLX_WIDTH_FIRST_SHAPES_UNTIMED ;;
    specprof)
      # issue 19: where the speculating batch's steps go, against mlx-generate's rounds on
      # the same pair: our server with the echo 8B bf16 and its 4-bit copy as the draft
      # model (SPEC_K drafts, 3 by default), the engine's profile every 64 steps
      # (MLX_ENGINE_PROFILE=SPEC_PROF_MODE, 1 by default; sync: the forwards waited for);
      # SPEC_PROF_ARMS: all (MLX_MODEL_DRAFTS=all: every step drafts k a row), auto (the
      # default width), plain (no draft model); an arm's name holding "feed" adds
      # MLX_DRAFT_EAGER_FEED=1 (allfeed, autofeed), "dev" MLX_DRAFTS_ON_DEVICE=1 (the
      # drafts not read before the verification: alldev, allfeeddev), "first"
      # MLX_WIDTH_FIRST_SHAPES_UNTIMED=1 (autofirst, autofeedfirst), "amask"
      # MLX_BATCH_VERIFY_MASK=array (the verification's attention under mlx-lm's array
      # mask, as before session 46), "nosplit" MLX_SDPA_SPLIT_QUERIES=0 (cuDNN), "nopq"
      # MLX_SDPA_PADDED_QUERIES=0 (a padded verification's queries a launch each, as
      # before session 47), "ck" MLX_SPLIT_CAUSAL_KERNEL=padded (an unpadded verification
      # through our kernel in one launch), "trace" the width's trace of each choice in the
      # server's log, "nopooled" MLX_DRAFT_POOLED_ACCEPTANCE=0 (a joining row starts from
      # the fixed prior, as before session 47), "nohold" MLX_DRAFT_JOINING_HOLD=0 (a
      # catch-up not held while prompts join, as before session 48), "widest"
      # MLX_WIDTH_TRY_WIDEST=1 (a plain batch's try is its widest step, not one draft a
      # row; session 48's "tryone" arm was its build with MLX_WIDTH_TRY_ONE=1, the
      # default since), "robust" MLX_WIDTH_ROBUST_TIMES=1 (a slow step moves a size's
      # time less), "wholepiece" MLX_DRAFT_CATCH_UP_PIECE=0 (one row's catch-up in one
      # forward, not pieces of 32 tokens); SPEC_STREAMS (1,8): SPEC_ROUNDS (3) rounds
      # of that many concurrent requests of 128 tokens (prompt ~128, greedy, as
      # `xtask bench --server`); then mlx-generate --draft-model on the pair with the same k
      # and profile (its rounds' split), and plain. Server logs ours-<arm>.log, stdout.txt
      # the rounds' times and mlx-generate's profile lines.
      ensure_echo "$D"
      M=$MODELS/llama-3.1-8b-echo-bf16; DM=$MODELS/llama-3.1-8b-echo-4bit; K=${SPEC_K:-3}
      port=18951
      body=$(python3 -c "import json; print(json.dumps({'prompt': 'x' + ' hello' * 127, 'max_tokens': 128, 'temperature': 0.0}))")
      # SPEC_WARM=1: first a server with the draft model runs one burst at each stream
      # count (its lines labelled "warmup"), so that a fresh machine's compiles (64 s inside the first
      # arm's timed rounds in session 48's call 10) fall before the arms.
      warm=(); [ "${SPEC_WARM:-0}" = 1 ] && warm=(warmup)
      for arm in ${warm[@]+"${warm[@]}"} ${SPEC_PROF_ARMS:-all auto}; do
        [ "$(left)" -lt 60 ] && break
        e=(MLX_SDPA_SPLIT_QUERIES=1 MLX_ENGINE_PROFILE="${SPEC_PROF_MODE:-1}" MLX_ENGINE_PROFILE_EVERY=64)
        a=(--draft-model "$DM" --num-draft-tokens "$K")
        case $arm in plain) a=() ;; esac
        case $arm in *all*) e+=(MLX_MODEL_DRAFTS=all) ;; esac
        case $arm in *feed*) e+=(MLX_DRAFT_EAGER_FEED=1) ;; esac
        case $arm in *dev*) e+=(MLX_DRAFTS_ON_DEVICE=1) ;; esac
        case $arm in *first*) e+=(MLX_WIDTH_FIRST_SHAPES_UNTIMED=1) ;; esac
        case $arm in *amask*) e+=(MLX_BATCH_VERIFY_MASK=array) ;; esac
        case $arm in *nosplit*) e=("${e[@]/MLX_SDPA_SPLIT_QUERIES=1/MLX_SDPA_SPLIT_QUERIES=0}") ;; esac
        case $arm in *nopq*) e+=(MLX_SDPA_PADDED_QUERIES=0) ;; esac
        case $arm in *ck*) e+=(MLX_SPLIT_CAUSAL_KERNEL=padded) ;; esac
        case $arm in *trace*) e+=(MLX_LOG=info,mlx_engine::batch::speculate=trace) ;; esac
        case $arm in *nopooled*) e+=(MLX_DRAFT_POOLED_ACCEPTANCE=0) ;; *pooled*) e+=(MLX_DRAFT_POOLED_ACCEPTANCE=1) ;; esac
        case $arm in *nohold*) e+=(MLX_DRAFT_JOINING_HOLD=0) ;; esac
        case $arm in *tryone*) ;; *widest*) e+=(MLX_WIDTH_TRY_WIDEST=1) ;; esac
        case $arm in *robust*) e+=(MLX_WIDTH_ROBUST_TIMES=1) ;; esac
        case $arm in *wholepiece*) e+=(MLX_DRAFT_CATCH_UP_PIECE=0) ;; esac
        env "${e[@]}" "$NEW/mlx-server" --model "$M" --port $port "${a[@]}" > "$D/ours-$arm.log" 2>&1 &
        srv=$!
        for _ in $(seq 1 300); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; sleep 1; done
        for n in $(echo "${SPEC_STREAMS:-1,8}" | tr ',' ' '); do
          rounds=${SPEC_ROUNDS:-3}; [ "$arm" = warmup ] && rounds=0
          for r in $(seq 0 "$rounds"); do
            t0=$(date +%s.%N)
            seq "$n" | xargs -P "$n" -I{} curl -s -o /dev/null http://127.0.0.1:$port/v1/completions \
              -H 'Content-Type: application/json' -d "$body"
            t1=$(date +%s.%N)
            # round 0 warms the shapes up
            echo "$arm streams $n round $r: $(python3 -c "print(f'{$n * 128 / ($t1 - $t0):.1f}')") tok/s" >> "$D/stdout.txt"
          done
        done
        kill $srv; wait $srv 2>/dev/null
      done
      P="$(python3 -c "print(' '.join(['hello world'] * 40))")"
      # SPEC_GEN: draft (the default eager feed), nofeed (MLX_DRAFT_EAGER_FEED=0), plain
      for g in ${SPEC_GEN:-draft nofeed plain}; do
        [ "$(left)" -lt 30 ] && break
        a=(--draft-model "$DM" --num-draft-tokens "$K"); [ $g = plain ] && a=()
        f=(); [ $g = nofeed ] && f=(MLX_DRAFT_EAGER_FEED=0)
        echo "== mlx-generate $g" >> "$D/stdout.txt"
        env "${f[@]}" MLX_SDPA_SPLIT_QUERIES=1 MLX_ENGINE_PROFILE="${SPEC_PROF_MODE:-1}" timeout "$(left)" \
          "$NEW/mlx-generate" --model "$M" "${a[@]}" --prompt "$P" -m 256 2>&1 |
          grep -E "profile|tokens-per-sec|accept" >> "$D/stdout.txt"
      done ;;
    predsrv)
      # issue 19: speculation inside the batching server without a draft model (OpenAI
      # predicted outputs, benchmarks/predict_bench.py) against the same requests without,
      # PRED_MODELS: smollm2 (the real default model, /root/stash/smollm2, predicting the
      # passage it is asked to repeat) and make_bench_models.py variants (predicting their
      # own plain answer: random weights copy nothing); PRED_STREAMS (1,8,32), PRED_TRIALS
      # (2), -g PRED_G (128); PRED_ARMS: auto (each step verifies the drafts that pay,
      # batch/width.rs, the default), all (MLX_PREDICTION_DRAFTS=all: every draft), none
      # (MLX_PREDICTION_DRAFTS=none: the prediction batch stepping plainly), mix (the
      # default, every other stream predicted: predict_bench.py --mix); PRED_SUSTAIN=S:
      # closed loops of S seconds a run instead of bursts (predict_bench.py --sustain; the
      # real default model only: it predicts the source passages); an arm's name ending in
      # "split" adds MLX_SDPA_SPLIT_QUERIES=1 (autosplit, allsplit; the server's default
      # since session 46), "nosplit" MLX_SDPA_SPLIT_QUERIES=0 (MLX's cuDNN attention)
      port=18941
      for arm in ${PRED_ARMS:-auto}; do
      for m in ${PRED_MODELS:-smollm2 llama-3.1-8b-bf16}; do
        [ "$(left)" -lt 60 ] && break 2
        e=(); mix=()
        case $arm in all*) e=(MLX_PREDICTION_DRAFTS=all) ;; none*) e=(MLX_PREDICTION_DRAFTS=none) ;;
          mix*) mix=(--mix) ;; esac
        case $arm in *nosplit*) e+=(MLX_SDPA_SPLIT_QUERIES=0) ;; *split*) e+=(MLX_SDPA_SPLIT_QUERIES=1) ;; esac
        if [ "$m" = smollm2 ]; then
          dir=/root/stash/smollm2; how=source
          [ -f "$dir/config.json" ] || { echo "== $m: $dir not staged" >> "$D/stdout.txt"; continue; }
        else
          ensure_model "$m" "$D"; dir=$MODELS/$m; how=self
        fi
        env "${e[@]}" "$NEW/mlx-server" --model "$dir" --port $port > "$D/server-$m-$arm.log" 2>&1 &
        srv=$!
        for _ in $(seq 1 300); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; sleep 1; done
        timeout "$(left)" python3 benchmarks/predict_bench.py --base-url http://127.0.0.1:$port \
          -g "${PRED_G:-128}" --streams "${PRED_STREAMS:-1,8,32}" --trials "${PRED_TRIALS:-2}" \
          --predict $how "${mix[@]}" ${PRED_SUSTAIN:+--sustain "$PRED_SUSTAIN"} --label "$m $arm" \
          >> "$D/stdout.txt" 2>&1
        echo "rc=$?" >> "$D/stdout.txt"
        kill $srv; wait $srv 2>/dev/null
      done
      done ;;
    smolab)
      # issue 21: the real default model (/root/stash/smollm2) and variants that change one
      # thing each (benchmarks/smol_variants.py: f32s = float32 scales, f16 = float16
      # weights and activations; requant_bf16.py: bf16g64), ours against mlx-lm, -p 128
      # -g 128, SMOL_ROUNDS (2) rounds alternating, order flipped each round; SMOL_VARIANTS
      S=/root/stash/smollm2; V=/root/smolvar
      [ -f "$S/config.json" ] || { echo "== $S not staged" >> "$D/stdout.txt"; continue; }
      if [ ! -f "$V/f16/config.json" ]; then
        python3 benchmarks/smol_variants.py "$S" "$V" >> "$D/stdout.txt" 2>&1
        python3 benchmarks/requant_bf16.py "$S" "$V/bf16g64" >> "$D/stdout.txt" 2>&1
      fi
      r=0
      while [ $r -lt "${SMOL_ROUNDS:-2}" ]; do
        order=(ours mlx-lm); [ $((r % 2)) = 1 ] && order=(mlx-lm ours)
        for v in ${SMOL_VARIANTS:-orig f32s f16 bf16g64}; do
          M=$V/$v; [ "$v" = orig ] && M=$S
          for arm in "${order[@]}"; do
            [ "$(left)" -lt 30 ] && break 3
            cmd=("$NEW/mlx-benchmark"); [ "$arm" = mlx-lm ] && cmd=(python3 -m mlx_lm benchmark)
            echo "## round=$r variant=$v arm=$arm" >> "$D/stdout.txt"
            timeout 100 "${cmd[@]}" --model "$M" -p 128 -g 128 -b 1 -n 2 >> "$D/stdout.txt" 2>&1
            echo "rc=$?" >> "$D/stdout.txt"
          done
        done
        r=$((r + 1))
      done ;;
    ttftlen)
      # issue 21: time to first token for prompts of many lengths (benchmarks/ttft_lengths.py:
      # a cuDNN plan per new prompt shape), TTFT_MODELS (qwen2.5-0.5b-bf16) x TTFT_ARMS
      # (default: our server as it is; bucket: MLX_SDPA_BUCKET=256, a prompt's attention
      # padded to 256-multiples, bucketN: N-multiples, nobucket: MLX_SDPA_BUCKET=0; mlxlm:
      # mlx_lm.server), two passes of TTFT_LENGTHS (24)
      # lengths of 40-1500 words, one request at a time
      port=18961
      for m in ${TTFT_MODELS:-qwen2.5-0.5b-bf16}; do
        ensure_model "$m" "$D"
        for arm in ${TTFT_ARMS:-default bucket mlxlm}; do
          [ "$(left)" -lt 60 ] && break 2
          e=(); cmd=("$NEW/mlx-server")
          case $arm in bucket) e=(MLX_SDPA_BUCKET=256) ;; bucket*) e=(MLX_SDPA_BUCKET="${arm#bucket}") ;;
            nobucket) e=(MLX_SDPA_BUCKET=0) ;; mlxlm) cmd=(python3 -m mlx_lm server) ;; esac
          env "${e[@]}" "${cmd[@]}" --model "$MODELS/$m" --port $port > "$D/server-$m-$arm.log" 2>&1 &
          srv=$!
          for _ in $(seq 1 300); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; sleep 1; done
          timeout "$(left)" python3 benchmarks/ttft_lengths.py --base-url http://127.0.0.1:$port \
            --lengths "${TTFT_LENGTHS:-24}" --label "$m $arm" >> "$D/stdout.txt" 2>&1
          echo "rc=$?" >> "$D/stdout.txt"
          kill $srv; wait $srv 2>/dev/null
        done
      done ;;
    *) echo "unknown part $PART" > "$D/stdout.txt" ;;
  esac
  echo "== $PART rc=$? ($(( $(date +%s) - T0 )) s elapsed)"
  tail -25 "$D/stdout.txt" 2>/dev/null
  pack "$PART" "$D"
done
df -h /tmp | tail -1
