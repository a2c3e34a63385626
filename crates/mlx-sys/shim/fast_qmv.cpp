// fast_qmv.cpp: a faster CUDA kernel for one-row 4-bit quantized matmuls (the decoding
// step's projections), with the same arithmetic as MLX's own `qmv` kernel.
//
// MLX 0.32.4 runs `quantized_matmul(x, w, scales, biases, transpose=True)` with one row of
// x (M * batch == 1), N and K <= 16384 through its CUDA `qmv` kernel: one warp per output
// row; lane l takes the 16 consecutive elements l*16 + r*512 of chunk r, dequantizes them
// in bfloat16 (w * scale + bias, each rounded) and accumulates x * w with bfloat16 fused
// multiply-adds into 16 per-lane accumulators, chunk after chunk; then each lane sums its
// 16 accumulators in float32 in order, the warp reduces with `cg::reduce`, and lane 0
// rounds the float sum to bfloat16. That kernel walks its chunks one after the other, so a
// warp has one load of weights in flight at a time: on an H200 it streams a 4096 x 14336
// weight at ~0.8 TB/s.
//
// The kernel below keeps every rounding step of that definition (same lanes, same order of
// accumulation, same reduction) and changes only when the loads are issued: all of a
// lane's weight, scale and bias loads are issued before its arithmetic, fully unrolled for
// the (compile-time) K. Outputs are bit-identical (checked on the H200 against MLX's kernel
// for every projection shape of the benchmark models at group sizes 32/64/128, and for the
// logits of whole decoding runs: `fused_check MODEL ... qmv` in mlx-engine's examples,
// benchmarks/GPU.md run 6), and large weights run ~1.7-2x faster.
//
// The kernel goes through MLX's `fast::cuda_kernel` (compiled with NVRTC on first use,
// cached on disk by MLX). It is used only where MLX itself
// would run `qmv` (the conditions below), on the CUDA backend, for bfloat16 activations,
// 4-bit affine weights and group sizes 32, 64, 128, and only for weights of >= 6M
// elements (smaller ones measured no faster). `MLX_FAST_QMV=0` or `mlxs_set_fast_qmv(false)`
// turns it off.
#include "fast_qmv.h"

#include "affine_operands.h"
#include "kernel_switch.h"

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "mlx/backend/cuda/cuda.h"
#include "mlx/mlx.h"

namespace mx = mlx::core;

namespace mlxs_detail {
namespace {

// Rows (warps) per block, and how many chunks of loads are issued together.
constexpr int kRows = 4;
constexpr int kUnroll = 32;
constexpr long long kMinElements = 6LL << 20;
// MLX's limits for taking `qmv` on sm90 (larger N or K go through its `qmm` kernels).
constexpr int kMaxDim = 16384;

KernelSwitch g_switch("MLX_FAST_QMV");

// The kernel's source for one (K, group size): the body is the same for all, K and GS
// are compile-time constants so the chunk loop unrolls and its loads can be hoisted.
const char* kBody = R"(
  constexpr int NCH = K / 512;
  constexpr int REST = K % 512;
  constexpr int G = K / GS;
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = threadIdx.x;
  const int row = blockIdx.y * ROWS + threadIdx.y;
  const int n = w_shape[0];
  if (row >= n) return;
  const uint8_t* wr = reinterpret_cast<const uint8_t*>(w) + (size_t)row * (K / 2);
  const __nv_bfloat16* sr = scales + (size_t)row * G;
  const __nv_bfloat16* br = biases + (size_t)row * G;
  __nv_bfloat162 acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = __floats2bfloat162_rn(0.f, 0.f);
  // A view of x may start anywhere: 16-byte loads only where it is aligned.
  const bool x_aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
  // One chunk: 16 weights (8 bytes, low nibble first) against 16 activations.
  auto tile = [&](int idx, uint2 wv, __nv_bfloat16 s, __nv_bfloat16 b) {
    uint4 xa, xb;
    if (x_aligned) {
      xa = *reinterpret_cast<const uint4*>(x + idx);
      xb = *reinterpret_cast<const uint4*>(x + idx + 8);
    } else {
      __nv_bfloat16* pa = reinterpret_cast<__nv_bfloat16*>(&xa);
      __nv_bfloat16* pb = reinterpret_cast<__nv_bfloat16*>(&xb);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        pa[e] = x[idx + e];
        pb[e] = x[idx + 8 + e];
      }
    }
    const __nv_bfloat162* x0 = reinterpret_cast<const __nv_bfloat162*>(&xa);
    const __nv_bfloat162* x1 = reinterpret_cast<const __nv_bfloat162*>(&xb);
    __nv_bfloat162 s2 = __bfloat162bfloat162(s);
    __nv_bfloat162 b2 = __bfloat162bfloat162(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t word = j < 4 ? wv.x : wv.y;
      uint32_t byte = (word >> (8 * (j & 3))) & 0xFFu;
      // bfloat16 bits of 128 + v, minus 128: the nibble v, exactly.
      uint32_t bits = 0x43004300u | (byte & 0xFu) | ((byte >> 4) << 16);
      __nv_bfloat162 q = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&bits), k128);
      __nv_bfloat162 d = __hadd2(__hmul2(q, s2), b2);
      acc[j] = __hfma2(j < 4 ? x0[j] : x1[j - 4], d, acc[j]);
    }
  };
#pragma unroll
  for (int r0 = 0; r0 < NCH; r0 += U) {
    uint2 wv[U];
    __nv_bfloat16 sc[U], bi[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int r = r0 + u;
      if (r < NCH) {
        const int idx = lane * 16 + r * 512;
        wv[u] = __ldg(reinterpret_cast<const uint2*>(wr + idx / 2));
        sc[u] = sr[idx / GS];
        bi[u] = br[idx / GS];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int r = r0 + u;
      if (r < NCH) tile(lane * 16 + r * 512, wv[u], sc[u], bi[u]);
    }
  }
  if (REST > 0) {
    const int idx = lane * 16 + K - REST;
    if (idx < K) {
      uint2 wv = __ldg(reinterpret_cast<const uint2*>(wr + idx / 2));
      tile(idx, wv, sr[idx / GS], br[idx / GS]);
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sum += __low2float(acc[j]);
    sum += __high2float(acc[j]);
  }
  sum = cg::reduce(warp, sum, cg::plus<float>());
  if (lane == 0) out[row] = __float2bfloat16_rn(sum);
)";

// The kernel for one (K, group size), built once: K and GS are compile-time constants, so
// the chunk loop unrolls and its loads can be issued ahead of the arithmetic.
const mx::fast::CustomKernelFunction& kernel_for(int k, int gs) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, mx::fast::CustomKernelFunction> kernels;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(k, gs);
  auto it = kernels.find(key);
  if (it != kernels.end()) return it->second;
  std::string src;
  src += "  constexpr int K = " + std::to_string(k) + ";\n";
  src += "  constexpr int GS = " + std::to_string(gs) + ";\n";
  src += "  constexpr int ROWS = " + std::to_string(kRows) + ";\n";
  src += "  constexpr int U = " + std::to_string(kUnroll) + ";\n";
  src += kBody;
  auto fn = mx::fast::cuda_kernel(
      "mlxs_qmv_bf16_q4_k" + std::to_string(k) + "_g" + std::to_string(gs),
      {"x", "w", "scales", "biases"},
      {"out"},
      src,
      "#include <cooperative_groups/reduce.h>\n",
      /* ensure_row_contiguous */ true);
  return kernels.emplace(key, std::move(fn)).first->second;
}

}  // namespace

std::optional<mx::array> try_fast_qmv(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    bool transpose,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mx::StreamOrDevice s) {
  if (!g_switch.on() || bits.value_or(4) != 4) return std::nullopt;
  const int gs = group_size.value_or(64);
  auto kn = affine_operands(x, w, scales, biases, transpose, mode, gs, 4);
  if (!kn || x.dtype() != mx::bfloat16 || scales.dtype() != mx::bfloat16 ||
      biases->dtype() != mx::bfloat16) {
    return std::nullopt;
  }
  const auto [k, n] = *kn;
  if (static_cast<long long>(x.size()) != k || k % 32 != 0) return std::nullopt;
  if (n > kMaxDim || k > kMaxDim || static_cast<long long>(n) * k < kMinElements) {
    return std::nullopt;
  }
  mx::Stream st = mx::to_stream(s);
  if (st.device.type != mx::Device::gpu || !mx::cu::is_available()) return std::nullopt;

  mx::Shape out_shape = x.shape();
  out_shape.back() = n;
  const int blocks = (n + kRows - 1) / kRows;
  auto outs = kernel_for(k, gs)(
      {x, w, scales, *biases},
      {out_shape},
      {mx::bfloat16},
      std::make_tuple(32, blocks * kRows, 1),
      std::make_tuple(32, kRows, 1),
      {},
      std::nullopt,
      false,
      st);
  g_switch.count();
  return outs[0];
}

void set_fast_qmv(bool on) { g_switch.set(on); }
bool fast_qmv_enabled() { return g_switch.on(); }
unsigned long long fast_qmv_launches() { return g_switch.uses(); }

}  // namespace mlxs_detail
