"""Prototype of a one-row bfloat16 product (x @ w.T, x [1, K], w [N, K]) with MLX's CUDA
`gemv` arithmetic and more loads in flight, through `mx.fast.cuda_kernel` (issue 21:
the 8B bf16 model at batch 1).

MLX 0.32.4 runs such a product through `gemv_single` (mlx/backend/cuda/gemms/gemv.cu):
a warp a row of w, lane l taking the 4 consecutive elements 4l + 128i of chunk i (when K
is a multiple of 128 and both pointers are 8-byte aligned), accumulating
float(w) * float(x) into one float, chunk after chunk, then `cg::reduce` over the warp and
lane 0 rounding to bfloat16. The variants below keep that arithmetic and change only how
many chunks of a lane's loads are issued before its arithmetic (U) and how many warps a
block has (ROWS). Each variant is checked bit for bit against `x @ w.T` and timed, per
launch, over weights rotated so each launch reads from HBM, not L2.

    python3 benchmarks/gemv_proto.py [--iters 200] [--shapes 4096x14336,...]

Prints one line per (shape, kernel): microseconds a launch, TB/s of weight read, whether
its output equals MLX's bit for bit.
"""

import argparse
import time

import mlx.core as mx

HEADER = r"""
#include <cooperative_groups/reduce.h>
namespace gemv_proto {
namespace cg = cooperative_groups;

// A row of w [n, K] against x [K]: MLX's gemv_single arithmetic for 4 elements a lane,
// U chunks of loads issued before their arithmetic.
template <int K, int U, int ROWS>
__device__ __forceinline__ void row4(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                     __nv_bfloat16* out, int n) {
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int row = blockIdx.x * ROWS + threadIdx.y;
  if (row >= n) return;
  const int lane = threadIdx.x;
  const __nv_bfloat16* wr = w + (size_t)row * K;
  constexpr int NCH = K / 128;
  float sum = 0.f;
#pragma unroll
  for (int r0 = 0; r0 < NCH; r0 += U) {
    uint2 wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r0 + u < NCH) {
        wv[u] = __ldg(reinterpret_cast<const uint2*>(wr + (r0 + u) * 128 + lane * 4));
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r0 + u < NCH) {
        const uint2 xv = *reinterpret_cast<const uint2*>(x + (r0 + u) * 128 + lane * 4);
        const __nv_bfloat16* wp = reinterpret_cast<const __nv_bfloat16*>(&wv[u]);
        const __nv_bfloat16* xp = reinterpret_cast<const __nv_bfloat16*>(&xv);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          sum += static_cast<float>(wp[j]) * static_cast<float>(xp[j]);
        }
      }
    }
  }
  sum = cg::reduce(warp, sum, cg::plus<float>());
  if (lane == 0) out[row] = static_cast<__nv_bfloat16>(sum);
}

// The same with a sliding window: U chunks in flight, one issued as one is consumed.
template <int K, int U, int ROWS>
__device__ __forceinline__ void row4w(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                      __nv_bfloat16* out, int n) {
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int row = blockIdx.x * ROWS + threadIdx.y;
  if (row >= n) return;
  const int lane = threadIdx.x;
  const __nv_bfloat16* wr = w + (size_t)row * K;
  constexpr int NCH = K / 128;
  float sum = 0.f;
  uint2 wv[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u < NCH) wv[u] = __ldg(reinterpret_cast<const uint2*>(wr + u * 128 + lane * 4));
  }
#pragma unroll
  for (int r = 0; r < NCH; ++r) {
    const uint2 cur = wv[r % U];
    if (r + U < NCH) {
      wv[r % U] = __ldg(reinterpret_cast<const uint2*>(wr + (r + U) * 128 + lane * 4));
    }
    const uint2 xv = *reinterpret_cast<const uint2*>(x + r * 128 + lane * 4);
    const __nv_bfloat16* wp = reinterpret_cast<const __nv_bfloat16*>(&cur);
    const __nv_bfloat16* xp = reinterpret_cast<const __nv_bfloat16*>(&xv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sum += static_cast<float>(wp[j]) * static_cast<float>(xp[j]);
    }
  }
  sum = cg::reduce(warp, sum, cg::plus<float>());
  if (lane == 0) out[row] = static_cast<__nv_bfloat16>(sum);
}
}  // namespace gemv_proto
"""


def make_kernel(name, body, k, u, rows):
    src = f"  gemv_proto::{body}<{k}, {u}, {rows}>(x, w, out, w_shape[0]);\n"
    return mx.fast.cuda_kernel(
        name=f"{name}_k{k}_u{u}_r{rows}",
        input_names=["x", "w"],
        output_names=["out"],
        source=src,
        header=HEADER,
    )


def run_kernel(kern, x, w, rows):
    n = w.shape[0]
    blocks = (n + rows - 1) // rows
    return kern(
        inputs=[x, w],
        grid=(blocks * 32, rows, 1),
        threadgroup=(32, rows, 1),
        output_shapes=[(1, n)],
        output_dtypes=[mx.bfloat16],
    )[0]


def timed(fn, ws, iters):
    # Warm up (compile), then time `iters` launches over weights rotated past L2.
    mx.eval(fn(ws[0]))
    mx.synchronize()
    t0 = time.perf_counter()
    outs = [fn(ws[i % len(ws)]) for i in range(iters)]
    mx.eval(outs)
    mx.synchronize()
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument(
        "--shapes",
        default="4096x6144,4096x4096,4096x28672,14336x4096,4096x128256,4096x14336,4096x1024,896x4864,4864x896,2048x8192,8192x2048",
        help="KxN of the products (w is [N, K])",
    )
    ap.add_argument("--variants", default="b:8:8,b:16:8,b:32:8,b:16:4,w:8:8,w:16:8,w:16:4")
    args = ap.parse_args()
    mx.random.seed(0)
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        nbytes = n * k * 2
        copies = max(2, (512 << 20) // nbytes + 1)
        ws = [mx.random.normal((n, k)).astype(mx.bfloat16) for _ in range(copies)]
        x = mx.random.normal((1, k)).astype(mx.bfloat16)
        mx.eval(ws, x)
        ref = x @ ws[0].T
        mx.eval(ref)
        t = timed(lambda w: x @ w.T, ws, args.iters)
        print(f"{k}x{n} mlx_gemv {t * 1e6:8.2f} us {nbytes / t / 1e12:5.2f} TB/s", flush=True)
        for v in args.variants.split(","):
            body, u, rows = v.split(":")
            u, rows = int(u), int(rows)
            if k % 128 != 0:
                continue
            kern = make_kernel("gemv_proto", "row4" if body == "b" else "row4w", k, u, rows)
            y = run_kernel(kern, x, ws[0], rows)
            same = bool(mx.array_equal(y, ref).item())
            t = timed(lambda w: run_kernel(kern, x, w, rows), ws, args.iters)
            print(
                f"{k}x{n} {body}:u{u}:r{rows} {t * 1e6:8.2f} us {nbytes / t / 1e12:5.2f} TB/s "
                f"identical={same}",
                flush=True,
            )
        del ws


if __name__ == "__main__":
    main()
