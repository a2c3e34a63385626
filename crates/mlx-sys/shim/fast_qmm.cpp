// fast_qmm.cpp: a faster CUDA kernel for 4-bit quantized matmuls of 8 or more rows (a
// prompt's prefill, batched prefill chunks) with the bits of MLX's own kernel for them.
//
// MLX 0.32.4 runs `quantized_matmul(x, w, scales, biases, transpose=True)` with 8 or more
// rows of x (M * batch >= 8; 4-bit affine weights, bfloat16 x, N % 128 == 0, K a multiple
// of max(64, group size), and not its sm90 case of a group as long as K) through its CUDA
// `qmm_sm80` kernel (QuantizedMatmul::eval_gpu; the kernel is CuTe device code in
// libmlx.so, mlx/backend/cuda/device/qmm_sm80.cuh): each output element is one float32
// accumulator fed by `mma.sync` m16n8k16 bfloat16 products over K in order, 16 at a time
// (the atom SM80_16x8x16_F32BF16BF16F32_TN, k slot i of a product holding element k0 + i),
// the weights dequantized in registers as `bf16(q) * scale + bias` in bfloat16 (cutlass's
// Array multiply and add), and the sum rounded to bfloat16 at the end. Nothing else
// enters a result: not the tile sizes, nor which rows share a tile, nor the order in which
// tiles run. So a kernel that feeds the same products to the same instruction in the same
// order of K gives the same bits, whatever its tiling, and that is what this one does
// with a tiling of its own: 128 x 128 outputs a block of 8 warps (MLX: 64 x 128, 4 warps),
// a 4-stage `cp.async` pipeline over K tiles of 64, x's tile through `ldmatrix` from a
// swizzled layout, the weight's nibbles dequantized in registers by each warp for its
// columns, scales and biases loaded a tile ahead.
//
// On by default where it applies (`MLX_FAST_QGEMM=0` or `set_fast_qgemm(false)` gives
// MLX's kernel back); `qgemm_check` in mlx-engine's examples checks every output against
// MLX's product bit for bit and times both.
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
// The dequantize expression (set_fast_qgemm_dequant): 1, one fused multiply-add, which is
// what MLX's compiled `qmm_sm80` computes (checked on the H200, benchmarks/GPU.md session
// 24); 0 the multiply and the add each rounded.
std::atomic<int> g_form{1};

// Tile sizes of the device code below (kept in step with it).
constexpr int kThreads = 256;
constexpr int kBn = 128;
constexpr int kBk = 64;
constexpr int kStages = 4;
constexpr int kARow = kBk * 2;  // bytes of a row of x's tile
constexpr int kBRow = 48;       // bytes of a row of w's tile: 32 of nibbles, 16 of padding

int stage_bytes(int bm) { return bm * kARow + kBn * kBRow; }

const char* const kDeviceCode = R"(// mlx-rs: the tiled 4-bit kernel of fast_qmm.cpp.
#pragma once

namespace mlxs_qgemm {

constexpr int kThreads = 256;
constexpr int kBn = 128;
constexpr int kBk = 64;
constexpr int kStages = 4;
constexpr int kARow = kBk * 2;
constexpr int kBRow = 48;

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
// 128 + v minus 128 (v exactly), then v * scale + bias as MLX's kernel forms it (FORM 1:
// one fused multiply-add; 0: the product rounded, then the sum).
template <int FORM>
__device__ __forceinline__ uint32_t dequant2(uint32_t byte, __nv_bfloat162 sb) {
  const uint32_t bits = 0x43004300u | (byte & 0xFu) | ((byte & 0xF0u) << 12);
  const __nv_bfloat162 q =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&bits), __floats2bfloat162_rn(128.f, 128.f));
  const __nv_bfloat162 s2 = __low2bfloat162(sb);
  const __nv_bfloat162 b2 = __high2bfloat162(sb);
  __nv_bfloat162 d;
  if constexpr (FORM == 1) {
    d = __hfma2(q, s2, b2);
  } else {
    d = __hadd2(__hmul2_rn(q, s2), b2);
  }
  return *reinterpret_cast<uint32_t*>(&d);
}

// out [m, n] = x [m, k] @ dequantize(w [n, k / 8], scales, biases [n, k / GS]).T, bfloat16;
// block (blockIdx.x, blockIdx.y) takes rows BM * blockIdx.x .. of x and 128 * blockIdx.y ..
// of w (n % 128 == 0, k % 64 == 0, k % GS == 0). 8 warps as 2 (rows of x) by 4 (rows of w),
// each BM / 2 x 32 outputs.
template <int GS, int BM, int FORM>
__device__ __forceinline__ void gemm(const __nv_bfloat16* x, const uint32_t* w,
                                     const __nv_bfloat16* scales, const __nv_bfloat16* biases,
                                     __nv_bfloat16* out, const int m, const int n, const int k) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int MT = BM / 32;                 // m16 tiles a warp
  constexpr int STAGE = BM * kARow + kBn * kBRow;
  constexpr int NG = GS < kBk ? kBk / GS : 1;  // groups a K tile touches
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp >> 2;
  const int wn = warp & 3;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int m0 = blockIdx.x * BM;
  const int n0 = blockIdx.y * kBn;
  const int tiles = k / kBk;
  const int groups = k / GS;
  const uint32_t base = smem_addr(smem);
  const uint8_t* wb = reinterpret_cast<const uint8_t*>(w);

  // Tile `kt` of x and w into stage `st`: x's rows of 128 bytes as 8 chunks of 16, chunk c
  // of row r at (c ^ (r & 7)) (the 8 rows one ldmatrix reads fall in 8 distinct chunks);
  // w's rows of 32 bytes at a stride of 48 (a warp's 8 rows of 8-byte reads: 8 bank pairs).
  auto load_tile = [&](int kt, int st) {
    const uint32_t sa = base + st * STAGE;
    const uint32_t sb = sa + BM * kARow;
#pragma unroll
    for (int i = 0; i < BM * 8 / kThreads; ++i) {
      const int q = tid + i * kThreads;
      const int r = q >> 3;
      const int c = q & 7;
      const int row = m0 + r;
      const bool ok = row < m;
      const __nv_bfloat16* src = x + (size_t)(ok ? row : 0) * k + kt * kBk + c * 8;
      cp16(sa + r * kARow + ((c ^ (r & 7)) << 4), src, ok ? 16 : 0);
    }
    const int r = tid >> 1;
    const int c = tid & 1;
    cp16(sb + r * kBRow + c * 16, wb + (size_t)(n0 + r) * (k / 2) + kt * (kBk / 2) + c * 16, 16);
  };
  // Scale and bias (as one pair) of this lane's 4 rows of w for the groups of tile kt.
  auto load_scales = [&](int kt, __nv_bfloat162 (&sb)[4][NG]) {
    const int g0 = kt * kBk / GS;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const size_t row = (size_t)(n0 + wn * 32 + j * 8 + g) * groups;
#pragma unroll
      for (int i = 0; i < NG; ++i) {
        sb[j][i] = __halves2bfloat162(scales[row + g0 + i], biases[row + g0 + i]);
      }
    }
  };

  float acc[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load_tile(s, s);
    cp_commit();
  }
  __nv_bfloat162 sb[4][NG], nsb[4][NG];
  load_scales(0, sb);

#pragma unroll 1
  for (int kt = 0; kt < tiles; ++kt) {
    cp_wait<kStages - 2>();
    __syncthreads();
    // The stage this overwrites was last read in iteration kt - 1, before the barrier.
    {
      const int nt = kt + kStages - 1;
      if (nt < tiles) load_tile(nt, nt % kStages);
      cp_commit();
    }
    if (kt + 1 < tiles) load_scales(kt + 1, nsb);
    const int st = kt % kStages;
    const uint32_t sa = base + st * STAGE;
    const uint8_t* sbw = smem + st * STAGE + BM * kARow;
#pragma unroll
    for (int ks = 0; ks < kBk / 16; ++ks) {
      const int gi = NG == 1 ? 0 : (ks * 16) / GS;
      uint32_t a[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = wm * (BM / 2) + i * 16 + (lane & 15);
        const int c = ks * 2 + (lane >> 4);
        ldsm4(sa + r * kARow + ((c ^ (r & 7)) << 4), a[i]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint2 wv =
            *reinterpret_cast<const uint2*>(sbw + (wn * 32 + j * 8 + g) * kBRow + ks * 8);
        const uint32_t b0 = dequant2<FORM>(wv.x >> (8 * t), sb[j][gi]);
        const uint32_t b1 = dequant2<FORM>(wv.y >> (8 * t), sb[j][gi]);
#pragma unroll
        for (int i = 0; i < MT; ++i) mma(acc[i][j], a[i], b0, b1);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < NG; ++i) sb[j][i] = nsb[j][i];
  }
  cp_wait<0>();

#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int r = m0 + wm * (BM / 2) + i * 16 + g;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = n0 + wn * 32 + j * 8 + 2 * t;
      if (r < m) {
        *reinterpret_cast<__nv_bfloat162*>(out + (size_t)r * n + c) =
            __floats2bfloat162_rn(acc[i][j][0], acc[i][j][1]);
      }
      if (r + 8 < m) {
        *reinterpret_cast<__nv_bfloat162*>(out + (size_t)(r + 8) * n + c) =
            __floats2bfloat162_rn(acc[i][j][2], acc[i][j][3]);
      }
    }
  }
}

}  // namespace mlxs_qgemm

// MLX declares the kernel that calls `gemm` right after this header, without launch
// bounds; 256 threads a block at up to 128 registers a thread let two blocks share a
// multiprocessor.
#undef __global__
#define __global__ __location__(global) __launch_bounds__(256, 2)
)";

// Rows of x a block: 128, or 64 where fewer rows would leave most of a 128-row tile empty.
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

const mx::fast::CustomKernelFunction& kernel_for(int gs, int bm, int form, int device) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int>, mx::fast::CustomKernelFunction> kernels;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(gs, bm, form);
  auto it = kernels.find(key);
  if (it != kernels.end()) return it->second;
  const std::string targs =
      std::to_string(gs) + ", " + std::to_string(bm) + ", " + std::to_string(form);
  const std::string src = "  mlxs_qgemm::gemm<" + targs +
                          ">(x, w, scales, biases, out, x_shape[0], w_shape[0], x_shape[1]);\n";
  const std::string name = "mlxs_qgemm_g" + std::to_string(gs) + "_m" + std::to_string(bm) +
                           "_f" + std::to_string(form);
  auto fn = device_kernel(name,
                          {{"x", mx::bfloat16},
                           {"w", mx::uint32},
                           {"scales", mx::bfloat16},
                           {"biases", mx::bfloat16}},
                          {{"out", mx::bfloat16}}, src, DeviceCode{kDeviceCode, "mlxs_qgemm"},
                          device, true, stage_bytes(bm) * kStages);
  return kernels.emplace(key, std::move(fn)).first->second;
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
  // Where MLX runs qmm_sm80: 8 or more rows in all, N % 128 == 0, K % max(64, GS) == 0, and
  // not its sm90 kernel (K % 64 == 0 with one group a row).
  const long long m = static_cast<long long>(x.size()) / k;
  if (m < min_rows() || n % kBn != 0 || k % std::max(kBk, gs) != 0 || gs >= k) {
    return std::nullopt;
  }
  const int bm = block_rows(m);
  const long long mtiles = (m + bm - 1) / bm;
  if (m > std::numeric_limits<int>::max() || mtiles * kThreads > std::numeric_limits<int>::max() ||
      n / kBn > 65535) {
    return std::nullopt;
  }
  mx::Shape out_shape = x.shape();
  out_shape.back() = n;
  const mx::array x2 = mx::reshape(x, {static_cast<int>(m), k}, st);
  const int form = g_form.load(std::memory_order_relaxed);
  auto outs = kernel_for(gs, bm, form, st.device.index)(
      {x2, w, scales, *biases}, {out_shape}, {mx::bfloat16},
      std::make_tuple(static_cast<int>(mtiles * kThreads), n / kBn, 1),
      std::make_tuple(kThreads, 1, 1), {}, std::nullopt, false, st);
  g_switch.count();
  return outs[0];
}

void set_fast_qgemm(bool on) { g_switch.set(on); }
bool fast_qgemm_enabled() { return g_switch.on(); }
unsigned long long fast_qgemm_launches() { return g_switch.uses(); }
void set_fast_qgemm_dequant(int form) {
  g_form.store(form == 0 ? 0 : 1, std::memory_order_relaxed);
}

}  // namespace mlxs_detail
