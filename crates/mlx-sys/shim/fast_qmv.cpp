// fast_qmv.cpp: a faster CUDA kernel for one-row 4-bit quantized matmuls (the decoding
// step's projections), with the same arithmetic as MLX's own `qmv` kernel.
//
// MLX 0.32.4 runs `quantized_matmul(x, w, scales, biases, transpose=True)` with one row of
// x (M * batch == 1) through its CUDA `qmv` kernel (on the H200 for every shape seen, the
// 128256- and 151936-row vocabulary heads included): one warp per output row; lane l takes
// the 16 consecutive elements l*16 + r*512 of chunk r, dequantizes them in bfloat16
// (`w * scale + bias`) and accumulates x * w with bfloat16 fused multiply-adds into 16
// per-lane accumulators, chunk after chunk; then each lane sums its 16 accumulators in
// float32 in order, the warp reduces with `cg::reduce`, and lane 0 rounds the float sum to
// bfloat16. That kernel walks its chunks one after the other, so a warp has one load of
// weights in flight at a time: on an H200 it streams a 4096 x 14336 weight at ~0.8 TB/s.
//
// The kernels below keep every rounding step of that definition (same lanes, same order of
// accumulation, same reduction; the dequantize is MLX's expression verbatim: forming
// v * scale exactly by an FMA and then adding the bias changed results, so the compiler
// evidently contracts MLX's multiply-add) and change only how the loads are issued and how
// rows map to warps:
// - kBody: one row a warp, all of a lane's loads issued before its arithmetic, fully
//   unrolled for the (compile-time) K;
// - kBodyRows: several rows a warp (x read once for them) with a window of loads in
//   flight, for the long rows of down projections and the many rows of vocabulary heads.
// Outputs are bit-identical (checked on the H200 against MLX's kernel for every product
// shape of the benchmark models at group sizes 32/64/128, heads included, and for the
// logits of whole decoding runs: `fused_check MODEL ... qmv` in mlx-engine's examples,
// benchmarks/GPU.md runs 6 and 7). Under ncu (cold L2), kBody beat MLX's kernel at every
// shape measured (4096 x 14336 36 -> 18 us, the 8B head 287 -> 135 us, 512 x 2048
// 4.7 -> 3.8 us), and a prototype of kBodyRows did better still on down projections and
// heads (14336 x 4096 38 -> 21 us, the 8B head -> 118 us).
//
// The kernels go through MLX's `fast::cuda_kernel` (compiled with NVRTC on first use,
// cached on disk by MLX). They are used only where MLX itself would run `qmv` (the
// conditions below), on the CUDA backend, for bfloat16 activations, 4-bit affine weights,
// group sizes 32, 64, 128 and K <= 16384. `MLX_FAST_QMV=0` or `mlxs_set_fast_qmv(false)`
// turns them off; `MLX_FAST_QMV_PIPELINED=0` keeps every shape on kBody;
// `MLX_FAST_QMV_MIN_ELEMENTS=N` leaves weights of fewer than N elements to MLX.
#include "fast_qmv.h"

#include "affine_operands.h"
#include "kernel_switch.h"

#include <cstdlib>
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

// Weights of fewer elements stay on MLX's kernel. All sizes by default: ours measured
// faster at every shape of the benchmark models (down to 512 x 2048), and the 8B model
// decodes 18% faster with its small k/v projections on it too (benchmarks/GPU.md run 7).
// MLX_FAST_QMV_MIN_ELEMENTS=N sets another floor (for A/B runs).
constexpr long long kMinElements = 0;
// The longest rows we take (the kernel is unrolled for its K; K up to this was checked).
constexpr int kMaxK = 16384;
// CUDA's limit on the blocks of a grid's y dimension.
constexpr long long kMaxBlocksY = 65535;

KernelSwitch g_switch("MLX_FAST_QMV");
KernelSwitch g_pipelined("MLX_FAST_QMV_PIPELINED");

long long min_elements() {
  static const long long v = [] {
    const char* e = std::getenv("MLX_FAST_QMV_MIN_ELEMENTS");
    if (e == nullptr || *e == '\0') return kMinElements;
    char* end = nullptr;
    long long n = std::strtoll(e, &end, 10);
    return (end != nullptr && *end == '\0' && n >= 0) ? n : kMinElements;
  }();
  return v;
}

// How a kernel lays the rows out: `rows` warps per block, `rw` rows per warp, loads issued
// `u` chunks ahead (`window`) or `u` chunks at a time (else); `body` picks the source.
struct Layout {
  int body;  // 0: kBody (one row a warp, all loads first), 1: kBodyRows
  int rows;
  int rw;
  int u;
  bool window;
  bool operator<(const Layout& o) const {
    return std::tie(body, rows, rw, u, window) < std::tie(o.body, o.rows, o.rw, o.u, o.window);
  }
};

// Chosen on the H200 (benchmarks/GPU.md run 7): under ncu, a prototype of kBodyRows
// streamed long rows (down projections: 14336 x 4096 29.3 -> 21.3 us) and very many rows
// (vocabulary heads: 128256 x 4096 135 -> 118 us) faster than kBody, which stayed best
// elsewhere; end to end, these layouts took the 8B model from 264 to 304 tok/s.
Layout layout_for(int n, int k) {
  if (g_pipelined.on()) {
    if (n > 16384) return {1, 4, 2, 8, false};
    if (k >= 12288) return {1, 4, 1, 4, true};
  }
  return {0, 4, 1, 32, false};
}

// Both bodies load one chunk's 16 activations the same way: a view of x may start
// anywhere, so 16-byte loads only where it is aligned.
const std::string kLoadX = R"(    uint4 xa, xb;
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
)";

// The kernel's source for one (K, group size): the body is the same for all, K and GS
// are compile-time constants so the chunk loop unrolls and its loads can be hoisted.
const std::string kBody = R"(
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
)" + kLoadX + R"(    const __nv_bfloat162* x0 = reinterpret_cast<const __nv_bfloat162*>(&xa);
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

// The same arithmetic, `RW` rows a warp (x is read once for them), the weights' nibbles
// unpacked as the pairs (e, e + 4) of each 32-bit word and x permuted to match (each
// element keeps its own accumulator, so the pairing changes no result), and the loads
// either issued `U` chunks ahead of their arithmetic (WIN) or `U` chunks at a time.
const std::string kBodyRows = R"(
  constexpr int NCH = K / 512;
  constexpr int REST = K % 512;
  constexpr int G = K / GS;
  constexpr int NB = NCH > 0 ? NCH : 1;
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = threadIdx.x;
  const int n = w_shape[0];
  const int row0 = (blockIdx.y * ROWS + threadIdx.y) * RW;
  if (row0 >= n) return;
  const uint8_t* wr[RW];
  const __nv_bfloat16* sr[RW];
  const __nv_bfloat16* br[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int r = min(row0 + i, n - 1);
    wr[i] = reinterpret_cast<const uint8_t*>(w) + (size_t)r * (K / 2);
    sr[i] = scales + (size_t)r * G;
    br[i] = biases + (size_t)r * G;
  }
  __nv_bfloat162 acc[RW][8];
#pragma unroll
  for (int i = 0; i < RW; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = __floats2bfloat162_rn(0.f, 0.f);
  const bool x_aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
  auto bf2 = [](uint32_t u) { return *reinterpret_cast<__nv_bfloat162*>(&u); };
  // x of one chunk as the pairs (e, e + 4) and (8 + e, 12 + e), e = 0..3.
  auto xpairs = [&](int idx, __nv_bfloat162* xp) {
)" + kLoadX + R"(    xp[0] = bf2(__byte_perm(xa.x, xa.z, 0x5410));
    xp[1] = bf2(__byte_perm(xa.x, xa.z, 0x7632));
    xp[2] = bf2(__byte_perm(xa.y, xa.w, 0x5410));
    xp[3] = bf2(__byte_perm(xa.y, xa.w, 0x7632));
    xp[4] = bf2(__byte_perm(xb.x, xb.z, 0x5410));
    xp[5] = bf2(__byte_perm(xb.x, xb.z, 0x7632));
    xp[6] = bf2(__byte_perm(xb.y, xb.w, 0x5410));
    xp[7] = bf2(__byte_perm(xb.y, xb.w, 0x7632));
  };
  // One row's chunk: the nibble pair j of a word is (word >> 4j) & 0x000F000F; as the
  // bfloat16 bits of 128 + v, minus 128: v exactly. Then MLX's dequantize and FMA.
  auto tile = [&](__nv_bfloat162* a, const __nv_bfloat162* xp, uint2 wv,
                  __nv_bfloat16 s, __nv_bfloat16 b) {
    const __nv_bfloat162 s2 = __bfloat162bfloat162(s);
    const __nv_bfloat162 b2 = __bfloat162bfloat162(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = j < 4 ? wv.x : wv.y;
      const __nv_bfloat162 q =
          __hsub2(bf2(((word >> (4 * (j & 3))) & 0x000F000Fu) | 0x43004300u), k128);
      const __nv_bfloat162 d = __hadd2(__hmul2(q, s2), b2);
      a[j] = __hfma2(xp[j], d, a[j]);
    }
  };
  if (WIN) {
    uint2 wv[RW][NB];
    __nv_bfloat16 sc[RW][NB], bi[RW][NB];
#pragma unroll
    for (int r = 0; r < NCH + U; ++r) {
      if (r < NCH) {
        const int idx = lane * 16 + r * 512;
#pragma unroll
        for (int i = 0; i < RW; ++i) {
          wv[i][r] = __ldg(reinterpret_cast<const uint2*>(wr[i] + idx / 2));
          sc[i][r] = __ldg(sr[i] + idx / GS);
          bi[i][r] = __ldg(br[i] + idx / GS);
        }
      }
      if (r >= U && r - U < NCH) {
        const int c = r - U;
        __nv_bfloat162 xp[8];
        xpairs(lane * 16 + c * 512, xp);
#pragma unroll
        for (int i = 0; i < RW; ++i) tile(acc[i], xp, wv[i][c], sc[i][c], bi[i][c]);
      }
      // Keeps the compiler from hoisting every load to the top (the window is the point).
      asm volatile("" ::: "memory");
    }
  } else {
#pragma unroll 1
    for (int r0 = 0; r0 < NCH; r0 += U) {
      uint2 wv[RW][U];
      __nv_bfloat16 sc[RW][U], bi[RW][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int r = r0 + u;
        if (r < NCH) {
          const int idx = lane * 16 + r * 512;
#pragma unroll
          for (int i = 0; i < RW; ++i) {
            wv[i][u] = __ldg(reinterpret_cast<const uint2*>(wr[i] + idx / 2));
            sc[i][u] = __ldg(sr[i] + idx / GS);
            bi[i][u] = __ldg(br[i] + idx / GS);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int r = r0 + u;
        if (r < NCH) {
          __nv_bfloat162 xp[8];
          xpairs(lane * 16 + r * 512, xp);
#pragma unroll
          for (int i = 0; i < RW; ++i) tile(acc[i], xp, wv[i][u], sc[i][u], bi[i][u]);
        }
      }
    }
  }
  if (REST > 0) {
    const int idx = lane * 16 + K - REST;
    if (idx < K) {
      __nv_bfloat162 xp[8];
      xpairs(idx, xp);
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const uint2 wv = __ldg(reinterpret_cast<const uint2*>(wr[i] + idx / 2));
        tile(acc[i], xp, wv, sr[i][idx / GS], br[i][idx / GS]);
      }
    }
  }
  // Each lane's sum in element order 0..15, then the warp's, as MLX.
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) sum += __low2float(acc[i][j]);
#pragma unroll
    for (int j = 0; j < 4; ++j) sum += __high2float(acc[i][j]);
#pragma unroll
    for (int j = 4; j < 8; ++j) sum += __low2float(acc[i][j]);
#pragma unroll
    for (int j = 4; j < 8; ++j) sum += __high2float(acc[i][j]);
    sum = cg::reduce(warp, sum, cg::plus<float>());
    if (lane == 0 && row0 + i < n) out[row0 + i] = __float2bfloat16_rn(sum);
  }
)";

// The kernel for one (K, group size, layout), built once: K, GS and the layout are
// compile-time constants, so the chunk loops unroll and their loads can be issued ahead of
// the arithmetic.
const mx::fast::CustomKernelFunction& kernel_for(int k, int gs, const Layout& l) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, Layout>, mx::fast::CustomKernelFunction> kernels;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(k, gs, l);
  auto it = kernels.find(key);
  if (it != kernels.end()) return it->second;
  auto def = [](const char* name, int v) {
    return std::string("  constexpr int ") + name + " = " + std::to_string(v) + ";\n";
  };
  std::string src = def("K", k) + def("GS", gs) + def("ROWS", l.rows) + def("U", l.u);
  std::string name = "mlxs_qmv_bf16_q4_k" + std::to_string(k) + "_g" + std::to_string(gs);
  if (l.body == 1) {
    src += def("RW", l.rw) + "  constexpr bool WIN = " + (l.window ? "true" : "false") + ";\n";
    name += "_r" + std::to_string(l.rows) + "x" + std::to_string(l.rw) + (l.window ? "w" : "u") +
            std::to_string(l.u);
  }
  src += l.body == 1 ? kBodyRows : kBody;
  auto fn = mx::fast::cuda_kernel(
      name,
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
  // First the stream: on other devices the caller goes on to the CPU kernel, which checks
  // the operands itself.
  mx::Stream st = mx::to_stream(s);
  if (st.device.type != mx::Device::gpu || !mx::cu::is_available()) return std::nullopt;
  const int gs = group_size.value_or(64);
  auto kn = affine_operands(x, w, scales, biases, transpose, mode, gs, 4);
  if (!kn || x.dtype() != mx::bfloat16 || scales.dtype() != mx::bfloat16 ||
      biases->dtype() != mx::bfloat16) {
    return std::nullopt;
  }
  const auto [k, n] = *kn;
  if (static_cast<long long>(x.size()) != k || k % 32 != 0) return std::nullopt;
  if (k > kMaxK || static_cast<long long>(n) * k < min_elements()) return std::nullopt;
  // MLX's sm90 `qmm` is eligible only for rows no longer than a group (K % 64 == 0,
  // group size >= K); there MLX keeps `qmv` only up to 16384 outputs, so leave it those.
  if (k % 64 == 0 && gs >= k && n > 16384) return std::nullopt;
  const Layout l = layout_for(n, k);
  const long long rows_per_block = static_cast<long long>(l.rows) * l.rw;
  const long long blocks = (n + rows_per_block - 1) / rows_per_block;
  if (blocks > kMaxBlocksY) return std::nullopt;

  mx::Shape out_shape = x.shape();
  out_shape.back() = n;
  auto outs = kernel_for(k, gs, l)(
      {x, w, scales, *biases},
      {out_shape},
      {mx::bfloat16},
      std::make_tuple(32, static_cast<int>(blocks * l.rows), 1),
      std::make_tuple(32, l.rows, 1),
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
