// fast_qmm.cpp: a faster CUDA kernel for 4-bit quantized matmuls of 33 or more rows (a
// prompt's prefill, batched prefill chunks) and for mixture-of-experts `gather_qmm` from 8
// rows (prefill and decoding), with the bits of MLX's own kernels for them.
//
// MLX 0.32.4 runs `quantized_matmul(x, w, scales, biases, transpose=True)` with 8 or more
// rows of x (M * batch >= 8; 4-bit affine weights, bfloat16 x, N % 128 == 0, K a multiple
// of max(64, group size), and not its sm90 case of a group as long as K) through its CUDA
// `qmm_sm80` kernel (QuantizedMatmul::eval_gpu; the kernel is CuTe device code in
// libmlx.so, mlx/backend/cuda/device/qmm_sm80.cuh): each output element is one float32
// accumulator fed by `mma.sync` m16n8k16 bfloat16 products over K in order, 16 at a time
// (the atom SM80_16x8x16_F32BF16BF16F32_TN, k slot i of a product holding element k0 + i),
// the weights dequantized as `bf16(q) * scale + bias` in bfloat16 (cutlass's Array
// multiply and add, which the compiler contracts into one FMA), and the sum rounded to
// bfloat16 at the end. Nothing else enters a result: not the tile sizes, nor which rows
// share a tile, nor the order in which tiles run. So a kernel that feeds the same products
// to the same instruction in the same order of K gives the same bits, whatever its tiling,
// and that is what this one does with a tiling of its own: 128 x 128 outputs a block of 8
// warps (MLX: 64 x 128, 4 warps), a 4-stage `cp.async` pipeline over K tiles of 64, the
// weight's tile dequantized once a block into shared memory, and both tiles read through
// `ldmatrix` from swizzled layouts. Where N is not a multiple of 128 (gpt-oss's 2,880), MLX
// runs its `qmm_naive` instead, built from the same atom over K in order and the same
// dequantize: the same bits again, so the kernel takes those too, its last column tile
// masked. MLX's `gather_qmm` (GatherQMM::eval_gpu) takes the same two kernels from 8 rows
// (M * batch; below that its `gather_qmv`), so the gathered forms below have them as well.
//
// On the H200 (`qgemm_check`, benchmarks/GPU.md sessions 24 and 25) every product checked
// was identical to MLX's (N % 128 != 0 included), and 1.4x-2.3x faster from 33 rows; below
// 33 rows MLX's kernel (16- and 32-row tiles) was as fast or faster, so those stay MLX's.
// The gathered forms: 1.8x-2.9x at 256 rows (32 tokens' top 8), 4x-26x from 1,024. On by
// default where it applies (`MLX_FAST_QGEMM=0` or `set_fast_qgemm(false)` gives MLX's
// kernels back).
#include "fast_qmm.h"

#include "affine_operands.h"
#include "kernel_cache.h"
#include "kernel_switch.h"

#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "mlx/backend/cuda/cuda.h"
#include "mlx/mlx.h"

namespace mx = mlx::core;

namespace mlxs_detail {
namespace {

KernelSwitch g_switch("MLX_FAST_QGEMM");
// The gathered form (mixture-of-experts products, try_fast_gather_qgemm): also needs
// g_switch; MLX_FAST_QGEMM_GATHER=0 leaves them to MLX.
KernelSwitch g_gather("MLX_FAST_QGEMM_GATHER");
// The gathered form has two ways to run its rows. In chunks of 64 consecutive rows, each
// chunk's runs of one expert one after the other (a full pass over K each), or a block for
// each run of at most 16 rows (gemm_runs). On the H200 (qgemm_check, sorted random indices,
// GPU.md session 25) the runs were faster up to 16 rows an expert on average (Qwen3-30B-A3B's
// 128 experts at 1,024 rows: 352 against 627 us for the fused gate / up), the chunks from 32
// (4,096 rows: 578 against 635 us; gpt-oss-20b's 32 experts at 2,048 rows: 591 against 733).
// So chunks from this many rows an expert (MLX_FAST_QGEMM_CHUNK_ROWS sets another).
long long chunk_rows_per_expert() {
  static const long long v = std::max(env_count("MLX_FAST_QGEMM_CHUNK_ROWS", 32), 1ll);
  return v;
}

// Tile sizes of the device code below (kept in step with it).
constexpr int kThreads = 256;
constexpr int kBn = 128;
constexpr int kBk = 64;
constexpr int kStages = 4;
constexpr int kARow = kBk * 2;  // bytes of a row of x's (and the dequantized weight's) tile

// Dynamic shared memory of a block: kStages stages of x's tile and the weight's nibbles,
// and two buffers of the weight's tile in bfloat16.
int shared_bytes(int bm) { return kStages * (bm * kARow + kBn * 32) + 2 * kBn * kARow; }

const char* const kDeviceCode = R"(// mlx-rs: the tiled 4-bit kernel of fast_qmm.cpp.
#pragma once

namespace mlxs_qgemm {

constexpr int kThreads = 256;
constexpr int kBn = 128;
constexpr int kBk = 64;
constexpr int kStages = 4;
constexpr int kARow = kBk * 2;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, zero-filled past `src_bytes` (0 or 16).
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm4(uint32_t addr, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a (16 x 16, rows of x) * b (16 x 8, columns: rows of w), float32 accumulators: the
// instruction of MLX's atom. Lane l = 4 g + t holds a's rows g, g + 8 at k 2t, 2t + 1
// (a[0], a[1]) and 2t + 8, 2t + 9 (a[2], a[3]); b's k 2t, 2t + 1 (b0) and 2t + 8, 2t + 9
// (b1) of column g; c's rows g (c[0], c[1]) and g + 8 (c[2], c[3]) at columns 2t, 2t + 1.
__device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The two weights of byte `byte` (low nibble first) dequantized: as the bfloat16 bits of
// 128 + v minus 128 (v exactly), then v * scale + bias as one fused multiply-add in
// bfloat16, which is what MLX's compiled kernel computes (its cutlass multiply and add
// contract; the product rounded before the add matched none of 243 products).
__device__ __forceinline__ uint32_t dequant2(uint32_t byte, __nv_bfloat162 sb) {
  const uint32_t bits = 0x43004300u | (byte & 0xFu) | ((byte & 0xF0u) << 12);
  const __nv_bfloat162 q =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&bits), __floats2bfloat162_rn(128.f, 128.f));
  const __nv_bfloat162 d = __hfma2(q, __low2bfloat162(sb), __high2bfloat162(sb));
  return *reinterpret_cast<const uint32_t*>(&d);
}

// out [m, n] = x [m, k] @ dequantize(w [n, k / 8], scales, biases [n, k / GS]).T, bfloat16;
// block (blockIdx.x, blockIdx.y) takes rows BM * blockIdx.x .. of x and 128 * blockIdx.y ..
// of w (n % 128 == 0, k % 64 == 0, k % GS == 0). 8 warps as 2 (rows of x) by 4 (rows of w),
// each BM / 2 x 32 outputs, read x's tile and the weight's tile (dequantized once a block
// into shared memory, bfloat16) through ldmatrix. Per K tile of 64, thread t dequantizes 32
// weights (half a row of w's tile) into one of two buffers, for the tile after the one the
// warps multiply; tile kt + 1's nibbles and x's tile kt must be in place at iteration kt,
// so 4 stages keep 2 tiles in flight. (Dequantizing in registers by each warp for its own
// columns, as MLX's kernel does, measured 1.2x-1.4x slower: GPU.md session 24.) This pass
// takes output rows lo .. hi - 1 (inside the tile of BM rows from m0) by w [n, k / 8] (one
// expert's, in the gathered forms); rows outside it are zero and not stored. Output row r
// reads row r / xrep of x (xrep > 1: one row of x for xrep experts, mlx-lm's unsorted
// gather). With 16 rows a block (BM 16) the 8 warps split the columns only, 16 each. Columns
// past n (n % 128 != 0: the last column tile) read row n0 of w as zeros and are not stored.
template <int GS, int BM>
__device__ __forceinline__ void gemm_rows(const __nv_bfloat16* x, const uint32_t* w,
                                          const __nv_bfloat16* scales,
                                          const __nv_bfloat16* biases, __nv_bfloat16* out,
                                          const int n, const int k, const int m0, const int lo,
                                          const int hi, const int xrep) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int WM = BM >= 32 ? 2 : 1;  // warps along the rows
  constexpr int WN = 8 / WM;            // and along the columns
  constexpr int NW = kBn / WN;          // columns a warp: 32 or 16
  constexpr int J = NW / 8;             // n8 tiles a warp
  constexpr int MT = BM / (16 * WM);    // m16 tiles a warp
  constexpr int XL = (BM * 8 + kThreads - 1) / kThreads;  // x's 16-byte chunks a thread
  constexpr int SA = BM * kARow;  // x's tile
  constexpr int SW = kBn * 32;    // w's nibbles
  constexpr int STAGE = SA + SW;
  constexpr int SB = kBn * kARow;  // w's tile in bfloat16
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp / WN;
  const int wn = warp % WN;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n0 = blockIdx.y * kBn;
  const int tiles = k / kBk;
  const int groups = k / GS;
  const uint32_t base = smem_addr(smem);
  const uint32_t bbase = base + kStages * STAGE;
  uint8_t* const bptr = smem + kStages * STAGE;
  const uint8_t* wb = reinterpret_cast<const uint8_t*>(w);
  // The half row of w this thread dequantizes: row dr, k 32 dh .. 32 dh + 31 of a tile.
  const int dr = tid >> 1;
  const int dh = tid & 1;
  const bool w_ok = n0 + dr < n;
  const int wrow = w_ok ? n0 + dr : n0;
  const size_t srow = (size_t)wrow * groups;

  // The row of x each of this thread's chunks reads (the same for every K tile), and
  // whether it is one of the pass's rows.
  const __nv_bfloat16* xsrc[XL];
  bool xok[XL];
#pragma unroll
  for (int i = 0; i < XL; ++i) {
    const int row = m0 + ((tid + i * kThreads) >> 3);
    xok[i] = row >= lo && row < hi;
    xsrc[i] = x + (size_t)((xok[i] ? row : lo) / xrep) * k + ((tid + i * kThreads) & 7) * 8;
  }
  // x may be a view that starts off a 16-byte boundary (its rows are then too, K being a
  // multiple of 64): its chunks are then read element by element instead of by cp.async.
  const bool x_aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  auto load_tile = [&](int kt, int st) {
    const uint32_t sa = base + st * STAGE;
    const uint32_t sw = sa + SA;
#pragma unroll
    for (int i = 0; i < XL; ++i) {
      const int q = tid + i * kThreads;
      if (BM * 8 % kThreads != 0 && q >= BM * 8) break;
      const int r = q >> 3;
      const int c = q & 7;
      const bool ok = xok[i];
      const __nv_bfloat16* src = xsrc[i] + kt * kBk;
      const uint32_t dst = sa + r * kARow + ((c ^ (r & 7)) << 4);
      if (x_aligned) {
        cp16(dst, src, ok ? 16 : 0);
      } else {
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (ok) {
          __nv_bfloat16* e = reinterpret_cast<__nv_bfloat16*>(&v);
#pragma unroll
          for (int j = 0; j < 8; ++j) e[j] = src[j];
        }
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
                     "r"(v.z), "r"(v.w));
      }
    }
    cp16(sw + dr * 32 + dh * 16, wb + (size_t)wrow * (k / 2) + kt * (kBk / 2) + dh * 16,
         w_ok ? 16 : 0);
  };
  auto load_scale = [&](int kt) {
    const size_t i = srow + (kt * kBk + dh * 32) / GS;
    return __halves2bfloat162(scales[i], biases[i]);
  };
  // Tile kt's nibbles (stage kt % kStages) to bfloat16 in buffer kt & 1, x's swizzle.
  auto dequant_tile = [&](int kt, __nv_bfloat162 sb) {
    const uint4 v = *reinterpret_cast<const uint4*>(smem + (kt % kStages) * STAGE + SA +
                                                   dr * 32 + dh * 16);
    uint8_t* dst = bptr + (kt & 1) * SB + dr * kARow;
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = dh * 4 + j;
      uint4 o;
      o.x = dequant2(words[j], sb);
      o.y = dequant2(words[j] >> 8, sb);
      o.z = dequant2(words[j] >> 16, sb);
      o.w = dequant2(words[j] >> 24, sb);
      *reinterpret_cast<uint4*>(dst + ((c ^ (dr & 7)) << 4)) = o;
    }
  };

  float acc[MT][J][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load_tile(s, s);
    cp_commit();
  }
  cp_wait<kStages - 2>();
  __syncthreads();
  dequant_tile(0, load_scale(0));
  __nv_bfloat162 sb = load_scale(tiles > 1 ? 1 : 0);

#pragma unroll 1
  for (int kt = 0; kt < tiles; ++kt) {
    // Tile kt + 1 landed (tile kt + 2 may still be in flight); buffer kt & 1 written; the
    // warps done with tile kt - 1 (its stage and buffer are written below).
    cp_wait<kStages - 3>();
    __syncthreads();
    {
      const int nt = kt + kStages - 1;
      if (nt < tiles) load_tile(nt, nt % kStages);
      cp_commit();
    }
    if (kt + 1 < tiles) {
      dequant_tile(kt + 1, sb);
      if (kt + 2 < tiles) sb = load_scale(kt + 2);
    }
    const uint32_t sa = base + (kt % kStages) * STAGE;
    const uint32_t sbf = bbase + (kt & 1) * SB;
#pragma unroll
    for (int ks = 0; ks < kBk / 16; ++ks) {
      uint32_t b[J][2];
#pragma unroll
      for (int p = 0; p < J / 2; ++p) {
        const int r = wn * NW + p * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int c = ks * 2 + ((lane >> 3) & 1);
        uint32_t q[4];
        ldsm4(sbf + r * kARow + ((c ^ (r & 7)) << 4), q);
        b[2 * p][0] = q[0];
        b[2 * p][1] = q[1];
        b[2 * p + 1][0] = q[2];
        b[2 * p + 1][1] = q[3];
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        uint32_t a[4];
        const int r = wm * (BM / WM) + i * 16 + (lane & 15);
        const int c = ks * 2 + (lane >> 4);
        ldsm4(sa + r * kARow + ((c ^ (r & 7)) << 4), a);
#pragma unroll
        for (int j = 0; j < J; ++j) mma(acc[i][j], a, b[j][0], b[j][1]);
      }
    }
  }
  cp_wait<0>();

#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int r = m0 + wm * (BM / WM) + i * 16 + g;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = n0 + wn * NW + j * 8 + 2 * t;
      if (c >= n) continue;
      if (r >= lo && r < hi) {
        *reinterpret_cast<__nv_bfloat162*>(out + (size_t)r * n + c) =
            __floats2bfloat162_rn(acc[i][j][0], acc[i][j][1]);
      }
      if (r + 8 >= lo && r + 8 < hi) {
        *reinterpret_cast<__nv_bfloat162*>(out + (size_t)(r + 8) * n + c) =
            __floats2bfloat162_rn(acc[i][j][2], acc[i][j][3]);
      }
    }
  }
}

// The block's rows of x (all of them: one pass).
template <int GS, int BM>
__device__ __forceinline__ void gemm(const __nv_bfloat16* x, const uint32_t* w,
                                     const __nv_bfloat16* scales, const __nv_bfloat16* biases,
                                     __nv_bfloat16* out, const int m, const int n, const int k) {
  const int m0 = blockIdx.x * BM;
  gemm_rows<GS, BM>(x, w, scales, biases, out, n, k, m0, m0, min(m, m0 + BM), 1);
}

// mlx's gather_qmm with one index a row: output row r is row r / xrep of x [m / xrep, k]
// by expert idx[r] of w [experts, n, k / 8] (scales and biases [experts, n, k / GS]). The
// block's rows go in runs of one expert (rows sorted by expert make few runs), each a pass
// of gemm_rows over that expert's weight: every output is the same products in the same
// order as alone. For many rows an expert (a prompt's).
template <int GS, int BM>
__device__ __forceinline__ void gemm_gather(const __nv_bfloat16* x, const uint32_t* w,
                                            const __nv_bfloat16* scales,
                                            const __nv_bfloat16* biases, const uint32_t* idx,
                                            __nv_bfloat16* out, const int m, const int n,
                                            const int k, const int xrep) {
  const int m0 = blockIdx.x * BM;
  const int end = min(m, m0 + BM);
  int lo = m0;
  const size_t wsize = (size_t)n * (k / 8);
  const size_t ssize = (size_t)n * (k / GS);
  while (lo < end) {
    const uint32_t e = idx[lo];
    int hi = lo + 1;
    while (hi < end && idx[hi] == e) ++hi;
    gemm_rows<GS, BM>(x, w + e * wsize, scales + e * ssize, biases + e * ssize, out, n, k, m0,
                      lo, hi, xrep);
    lo = hi;
    // The next run's loads reuse the shared memory this one's warps read.
    __syncthreads();
  }
}

// The same product for few rows an expert (batched decoding, where MLX gives each row a
// block of its own): block b starts a tile at row b where a run of one expert starts or
// where a multiple of BM falls inside a run, and takes that run's rows up to the next
// multiple of BM, one pass; other blocks return at once. So runs of any length go in
// parallel, at most BM rows a block, and each expert's weight is read once a tile.
template <int GS, int BM>
__device__ __forceinline__ void gemm_runs(const __nv_bfloat16* x, const uint32_t* w,
                                          const __nv_bfloat16* scales,
                                          const __nv_bfloat16* biases, const uint32_t* idx,
                                          __nv_bfloat16* out, const int m, const int n,
                                          const int k, const int xrep) {
  const int r = blockIdx.x;
  if (r >= m) return;
  const uint32_t e = idx[r];
  if (r % BM != 0 && idx[r - 1] == e) return;
  const int end = min(m, (r / BM + 1) * BM);
  int hi = r + 1;
  while (hi < end && idx[hi] == e) ++hi;
  const size_t wsize = (size_t)n * (k / 8);
  const size_t ssize = (size_t)n * (k / GS);
  gemm_rows<GS, BM>(x, w + e * wsize, scales + e * ssize, biases + e * ssize, out, n, k, r, r,
                    hi, xrep);
}

}  // namespace mlxs_qgemm

// MLX declares the kernel that calls `gemm` right after this header, without launch
// bounds; 256 threads a block at up to 128 registers a thread let two blocks share a
// multiprocessor.
#undef __global__
#define __global__ __location__(global) __launch_bounds__(256, 2)
)";

// Rows of x a block: 128, or 64 where fewer rows would leave most of a 128-row tile empty
// (64-row blocks where 128-row ones would leave fewer than two a multiprocessor measured
// no faster: GPU.md session 24).
int block_rows(long long m) { return m <= 64 ? 64 : 128; }

// The fewest rows of x the kernel takes: on the H200 (`qgemm_check`, GPU.md session 24) ours
// was 0.55x-0.8x of MLX's product at 8 and 16 rows (MLX's tile there is 16 rows, ours 64;
// both stream the weight with N / 128 blocks) and 0.9x-1.6x from 33 rows, 1.4x-1.75x from
// 128. MLX_FAST_QGEMM_MIN_ROWS=N sets another floor (at least 8, where MLX's own `qmm`
// starts).
long long min_rows() {
  static const long long v = std::max(env_count("MLX_FAST_QGEMM_MIN_ROWS", 33), 8ll);
  return v;
}

// Whether the kernel covers weights of n x k at group size gs where MLX runs `qmm_sm80`
// (N % 128 == 0, K % max(64, GS) == 0) or, for other N, its `qmm_naive` (the same
// SM80_16x8x16 products over K in order and the same dequantize, so the same bits:
// checked by qgemm_check on the H200; N a multiple of 8 here, the last column tile masked).
// MLX_FAST_QGEMM_NMASK=0 leaves N % 128 != 0 to MLX.
bool takes_shape(int n, int k, int gs) {
  static const bool nmask = env_count("MLX_FAST_QGEMM_NMASK", 1) != 0;
  return n > 0 && n % 8 == 0 && (n % kBn == 0 || nmask) && k > 0 && k % std::max(kBk, gs) == 0;
}

// Whether the kernel takes a product of m rows of x by weights of n x k at group size gs:
// takes_shape, not MLX's sm90 kernel (one group a row), from min_rows(), and with m in an
// int (the kernel's row index).
bool takes_rows(long long m, int n, int k, int gs) {
  return m >= min_rows() && m <= std::numeric_limits<int>::max() && takes_shape(n, k, gs) &&
         gs < k;
}

enum class Form { Plain, GatherChunks, GatherRuns };

// The kernel of `form` for group size gs and bm rows a block.
const mx::fast::CustomKernelFunction& kernel_for(int gs, int bm, Form form, int device) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, Form>, mx::fast::CustomKernelFunction> kernels;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(gs, bm, form);
  auto it = kernels.find(key);
  if (it != kernels.end()) return it->second;
  const std::string targs = std::to_string(gs) + ", " + std::to_string(bm);
  // Gathered: x [m / xrep, k], idx [m].
  const std::string gargs =
      ">(x, w, scales, biases, idx, out, idx_shape[0], w_shape[1], x_shape[1], "
      "idx_shape[0] / x_shape[0]);\n";
  std::string src, name;
  switch (form) {
    case Form::Plain:
      src = "  mlxs_qgemm::gemm<" + targs +
            ">(x, w, scales, biases, out, x_shape[0], w_shape[0], x_shape[1]);\n";
      name = "mlxs_qgemm_g";
      break;
    case Form::GatherChunks:
      src = "  mlxs_qgemm::gemm_gather<" + targs + gargs;
      name = "mlxs_qgemm_gather_g";
      break;
    case Form::GatherRuns:
      src = "  mlxs_qgemm::gemm_runs<" + targs + gargs;
      name = "mlxs_qgemm_runs_g";
      break;
  }
  name += std::to_string(gs) + "_m" + std::to_string(bm);
  std::vector<KernelParam> inputs{{"x", mx::bfloat16},
                                  {"w", mx::uint32},
                                  {"scales", mx::bfloat16},
                                  {"biases", mx::bfloat16}};
  if (form != Form::Plain) inputs.emplace_back("idx", mx::uint32);
  auto fn = device_kernel(name, inputs, {{"out", mx::bfloat16}}, src,
                          DeviceCode{kDeviceCode, "mlxs_qgemm"}, device, true, shared_bytes(bm));
  return kernels.emplace(key, std::move(fn)).first->second;
}

// The kernel of `form` over x (as [xrows, k]) and `operands` (w, scales, biases, and the
// expert indices of the gathered forms), `blocks` blocks of bm rows along the output's
// rows; the output is `out_shape` (n columns). nullopt past the bounds of a grid.
std::optional<mx::array> launch(const mx::array& x, long long xrows,
                                const std::vector<mx::array>& operands, int k, int n,
                                const mx::Shape& out_shape, long long blocks, int bm, int gs,
                                Form form, const mx::Stream& st) {
  const long long ntiles = (n + kBn - 1) / kBn;
  if (blocks * kThreads > std::numeric_limits<int>::max() || ntiles > 65535 ||
      xrows > std::numeric_limits<int>::max()) {
    return std::nullopt;
  }
  std::vector<mx::array> inputs{mx::reshape(x, {static_cast<int>(xrows), k}, st)};
  inputs.insert(inputs.end(), operands.begin(), operands.end());
  auto outs = kernel_for(gs, bm, form, st.device.index)(
      inputs, {out_shape}, {mx::bfloat16},
      std::make_tuple(static_cast<int>(blocks * kThreads), static_cast<int>(ntiles), 1),
      std::make_tuple(kThreads, 1, 1), {}, std::nullopt, false, st);
  return outs[0];
}

}  // namespace

std::optional<mx::array> try_fast_qgemm(const mx::array& x, const mx::array& w,
                                        const mx::array& scales,
                                        const std::optional<mx::array>& biases, bool transpose,
                                        std::optional<int> group_size, std::optional<int> bits,
                                        const std::string& mode, mx::StreamOrDevice s) {
  if (!g_switch.on() || bits.value_or(4) != 4) return std::nullopt;
  const mx::Stream st = mx::to_stream(s);
  if (!on_gpu(st, x) || quantized_operands_traced(w, scales, biases)) return std::nullopt;
  const int gs = group_size.value_or(64);
  auto kn = affine_operands(x, w, scales, biases, transpose, mode, gs, 4);
  if (!kn || x.dtype() != mx::bfloat16 || scales.dtype() != mx::bfloat16 ||
      biases->dtype() != mx::bfloat16) {
    return std::nullopt;
  }
  const auto [k, n] = *kn;
  const long long m = static_cast<long long>(x.size()) / k;
  if (!takes_rows(m, n, k, gs)) return std::nullopt;
  const int bm = block_rows(m);
  mx::Shape out_shape = x.shape();
  out_shape.back() = n;
  auto y = launch(x, m, {w, scales, *biases}, k, n, out_shape, (m + bm - 1) / bm, bm, gs,
                  Form::Plain, st);
  if (y) g_switch.count();
  return y;
}

std::optional<GatherOperands> gpu_gather_operands(
    const mx::array& x, const mx::array& w, const mx::array& scales,
    const std::optional<mx::array>& biases, const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices, bool transpose, int group_size,
    std::optional<int> bits, const std::string& mode, const mx::Stream& st) {
  if (bits.value_or(4) != 4) return std::nullopt;
  if (!on_gpu(st, x) || quantized_operands_traced(w, scales, biases)) return std::nullopt;
  auto g = gather_operands(x, w, scales, biases, lhs_indices, rhs_indices, transpose, mode,
                           group_size, 4);
  if (!g || x.dtype() != mx::bfloat16 || scales.dtype() != mx::bfloat16 ||
      biases->dtype() != mx::bfloat16) {
    return std::nullopt;
  }
  return g;
}

std::optional<mx::array> try_fast_gather_qgemm(
    const mx::array& x, const mx::array& w, const mx::array& scales,
    const std::optional<mx::array>& biases, const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices, bool transpose, std::optional<int> group_size,
    std::optional<int> bits, const std::string& mode, mx::StreamOrDevice s) {
  if (!g_switch.on() || !g_gather.on()) return std::nullopt;
  const mx::Stream st = mx::to_stream(s);
  const int gs = group_size.value_or(64);
  const auto g = gpu_gather_operands(x, w, scales, biases, lhs_indices, rhs_indices, transpose,
                                     gs, bits, mode, st);
  if (!g) return std::nullopt;
  const auto [k, n, experts, m, xrep, out_shape] = *g;
  // MLX runs gather_qmm through `qmm_sm80` (or `qmm_naive`) from 8 rows, below that its
  // `gather_qmv` (other bits).
  if (m < 8 || m > std::numeric_limits<int>::max() || !takes_shape(n, k, gs)) {
    return std::nullopt;
  }
  const mx::array idx2 = mx::reshape(*rhs_indices, {static_cast<int>(m)}, st);
  const std::vector<mx::array> operands{w, scales, *biases, idx2};
  std::optional<mx::array> y;
  if (m >= chunk_rows_per_expert() * experts) {
    y = launch(x, m / xrep, operands, k, n, out_shape, (m + 63) / 64, 64, gs, Form::GatherChunks,
               st);
  } else {
    y = launch(x, m / xrep, operands, k, n, out_shape, m, 16, gs, Form::GatherRuns, st);
  }
  if (y) g_gather.count();
  return y;
}

void set_fast_qgemm(bool on) { g_switch.set(on); }
void set_fast_gather_qgemm(bool on) { g_gather.set(on); }
unsigned long long fast_gather_qgemm_launches() { return g_gather.uses(); }
unsigned long long fast_qgemm_launches() { return g_switch.uses(); }
}  // namespace mlxs_detail
