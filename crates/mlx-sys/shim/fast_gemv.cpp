// fast_gemv.cpp: dense products of one row, x [1, K] @ W.T with W [N, K] (a decoding
// step's projections in bfloat16, float16 or float32), together with the op that follows
// them in a decoder layer, in one CUDA kernel with MLX's arithmetic: the residual add of
// the o / down projections (`try_fast_gemv_add`) and the swiglu of a fused gate/up
// product (`try_fast_gemv_swiglu`). One kernel a layer fewer each, the same bits.
//
// MLX 0.32.4 runs `matmul(x, w.T)` with one row of x (M == 1 once x's batch dimensions are
// flattened) and a weight laid out as W.T (strides (1, K)) through `gemv_single`
// (mlx/backend/cuda/gemms/gemv.cu): one warp a row of W, 8 warps a block; with
// n = 4 elements a lane (K a multiple of 128 and both pointers aligned to 4 elements; else
// 2 where K is a multiple of 64 and they are aligned to 2, else 1) lane l takes the n
// consecutive elements n*l + 32*n*i of chunk i and adds float(w) * float(x) into one
// float, element after element, chunk after chunk; then the warp reduces with
// `cg::reduce` and lane 0 rounds the float to the output type.
//
// `row_dot` below keeps every step of that arithmetic (the same lanes and elements, the
// same order, the same multiply-adds, reduction and rounding, and the same choice of n
// from K and the pointers' alignment, made in the kernel since alignment is known only
// there), issuing `U` chunks of a lane's loads before their arithmetic. The stored product
// then gets MLX's `add` of the residual (`res + y` in the output type) or, for rows r and
// inter + r of a fused [gate; up] weight, mlx-lm's compiled swiglu with MLX's own
// `Sigmoid` and `Multiply` device functors (as fast_qmv.cpp's 4-bit swiglu form does).
// `fused_check MODEL ... gemv` in mlx-engine's examples checks both against MLX's ops on
// the H200, shape by shape and on whole decoding runs (benchmarks/GPU.md, session 23).
//
// Alone, the product measured no faster than MLX's (its kernel streams the large weights
// of an 8B model at ~4 TB/s already; GPU.md session 23), so plain products stay MLX's:
// what the kernel saves is the separate `add` and swiglu launches. It takes the products
// MLX would run through `gemv_single` on the CUDA backend (a weight that is the transposed
// view of a row-major [N, K] array, no bias, one row of x) for K a multiple of 128 (every
// projection of the models we run) and weights of at least MLX_FAST_GEMV_MIN_ELEMENTS
// elements (kMinElements, 4M), leaving small models' small weights, whose steps are bound
// by the host, on MLX's kernels. `MLX_FAST_GEMV=0` (or `set_fast_gemv(false)`) leaves
// every product and op to MLX; MLX_FAST_GEMV_LOADS (chunks in flight a lane) and
// MLX_FAST_GEMV_WARPS (warps a block) set the layout for A/B runs (same bits).
#include "fast_gemv.h"

#include "kernel_cache.h"
#include "kernel_switch.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxs_detail {
namespace {

KernelSwitch g_switch("MLX_FAST_GEMV");
// Weights of fewer elements stay on MLX's kernel (see the top of the file).
constexpr long long kMinElements = 1ll << 22;
// The longest rows we take (the kernel is unrolled for its K).
constexpr int kMaxK = 65536;
constexpr int kLoads = 16;
constexpr int kWarps = 8;

long long min_elements() {
  static const long long v = env_count("MLX_FAST_GEMV_MIN_ELEMENTS", kMinElements);
  return v;
}

int loads() {
  static const int v = [] {
    const long long u = env_count("MLX_FAST_GEMV_LOADS", kLoads);
    return (u == 1 || u == 2 || u == 4 || u == 8 || u == 16 || u == 32) ? static_cast<int>(u)
                                                                          : kLoads;
  }();
  return v;
}

// The rows form's modes (MLX_FAST_GEMV_ROWS) and its most rows (the kernel keeps a float
// a row of x in each lane).
constexpr int kRowsOff = 0;
constexpr int kRowsAll = 1;
constexpr int kRowsBatch = 2;
constexpr int kMaxRows = 8;
std::atomic<int> g_rows_mode{-1};

int rows_mode() {
  int v = g_rows_mode.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("MLX_FAST_GEMV_ROWS");
    v = e == nullptr                         ? kRowsOff
        : std::strcmp(e, "1") == 0           ? kRowsAll
        : std::strcmp(e, "batch") == 0      ? kRowsBatch
                                             : kRowsOff;
    g_rows_mode.store(v, std::memory_order_relaxed);
  }
  return v;
}

long long max_rows() {
  static const long long v = [] {
    const long long r = env_count("MLX_FAST_GEMV_MAX_ROWS", kMaxRows);
    return r >= 2 && r <= kMaxRows ? r : kMaxRows;
  }();
  return v;
}

// Rows of w a warp in the rows form (MLX_FAST_GEMV_ROWS_R: 1, 2 or 4; the same bits).
int rows_per_warp() {
  static const int v = [] {
    const long long r = env_count("MLX_FAST_GEMV_ROWS_R", 1);
    return (r == 1 || r == 2 || r == 4) ? static_cast<int>(r) : 1;
  }();
  return v;
}

int warps() {
  static const int v = [] {
    const long long w = env_count("MLX_FAST_GEMV_WARPS", kWarps);
    return (w == 1 || w == 2 || w == 4 || w == 8 || w == 16) ? static_cast<int>(w) : kWarps;
  }();
  return v;
}

const char* const kDeviceCode = R"(// mlx-rs: the one-row dense kernel of fast_gemv.cpp.
#pragma once
#include <cooperative_groups/reduce.h>

namespace mlxs_gemv {
namespace cg = cooperative_groups;

// NPT consecutive elements of type T, loaded as one word of their size.
template <int BYTES> struct Word;
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

template <typename T, int NPT>
struct Elems {
  typename Word<NPT * sizeof(T)>::type bits;
  __device__ __forceinline__ T operator[](int j) const {
    return reinterpret_cast<const T*>(&bits)[j];
  }
};

template <typename T, int NPT>
__device__ __forceinline__ Elems<T, NPT> load(const T* p) {
  Elems<T, NPT> e;
  e.bits = __ldg(reinterpret_cast<const typename Word<NPT * sizeof(T)>::type*>(p));
  return e;
}

// `count` (at most U) chunks r0.. of lane `lane` of row `wr` added into `sum`, all their
// loads of w issued before their arithmetic.
template <typename T, int NPT, int U>
__device__ __forceinline__ void chunks(const T* x, const T* wr, const int lane, const int r0,
                                       const int count, float& sum) {
  constexpr int STEP = 32 * NPT;
  Elems<T, NPT> wv[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u < count) wv[u] = load<T, NPT>(wr + (r0 + u) * STEP + lane * NPT);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u < count) {
      const Elems<T, NPT> xv = load<T, NPT>(x + (r0 + u) * STEP + lane * NPT);
#pragma unroll
      for (int j = 0; j < NPT; ++j) {
        sum += static_cast<float>(wv[u][j]) * static_cast<float>(xv[j]);
      }
    }
  }
}

// Lane `lane`'s float sum of row `wr` against x: MLX's gemv_impl for n_per_thread = NPT
// (elements NPT * lane + 32 * NPT * i, in order), U chunks of loads issued at a time.
template <typename T, int NPT, int K, int U>
__device__ __forceinline__ float lane_sum(const T* x, const T* wr, const int lane) {
  constexpr int NCH = K / (32 * NPT);
  constexpr int FULL = NCH / U * U;
  float sum = 0.f;
#pragma unroll 1
  for (int r0 = 0; r0 < FULL; r0 += U) chunks<T, NPT, U>(x, wr, lane, r0, U, sum);
  if constexpr (FULL < NCH) chunks<T, NPT, U>(x, wr, lane, FULL, NCH - FULL, sum);
  return sum;
}

// The float sum of row `row` of w [n, K] against x [K] (every lane gets it): MLX's
// gemv_impl with n_per_thread chosen as MLX's dispatch does, from the pointers (K is a
// multiple of 128), and its warp reduction.
template <typename T, int K, int U>
__device__ __forceinline__ float row_dot(const T* x, const T* w, const int row) {
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = threadIdx.x;
  const T* wr = w + (size_t)row * K;
  const uintptr_t both = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w);
  float sum;
  if (both % (4 * sizeof(T)) == 0) {
    sum = lane_sum<T, 4, K, U>(x, wr, lane);
  } else if (both % (2 * sizeof(T)) == 0) {
    sum = lane_sum<T, 2, K, U>(x, wr, lane);
  } else {
    sum = lane_sum<T, 1, K, U>(x, wr, lane);
  }
  return cg::reduce(warp, sum, cg::plus<float>());
}

// Row blockIdx.x * WARPS + threadIdx.y of w [n, K] against x [K], rounded to T as MLX's
// gemv stores it, plus res[row] as MLX's `add` of the residual and that product computes
// it (in T), into out[row].
template <typename T, int K, int U, int WARPS>
__device__ __forceinline__ void gemv_add(const T* x, const T* w, const T* res, T* out,
                                         const int n) {
  const int row = blockIdx.x * WARPS + threadIdx.y;
  if (row >= n) return;
  const float sum = row_dot<T, K, U>(x, w, row);
  if (threadIdx.x == 0) out[row] = res[row] + static_cast<T>(sum);
}

// mlx-lm's swiglu of a fused gate/up product: w [2 * inter, K] holds the gate's rows then
// the up projection's; warps y < WARPS of a block compute gate rows, the others the same
// rows of up, each stored as the product MLX's gemv would store (rounded to T), and one
// lane a row applies MLX's `Sigmoid` and `Multiply` device functors in the order of MLX's
// compiled swiglu kernel: out[r] = (g * sigmoid(g)) * u.
template <typename T, int K, int U, int WARPS>
__device__ __forceinline__ void gemv_swiglu(const T* x, const T* w, T* out, const int inter) {
  __shared__ T prod[2][WARPS];
  const int up = threadIdx.y >= WARPS;
  const int i = threadIdx.y - up * WARPS;
  const int row = blockIdx.x * WARPS + i;
  if (row < inter) {
    const float sum = row_dot<T, K, U>(x, w, row + up * inter);
    if (threadIdx.x == 0) prod[up][i] = static_cast<T>(sum);
  }
  __syncthreads();
  if (threadIdx.y == 0 && threadIdx.x < WARPS && blockIdx.x * WARPS + threadIdx.x < inter) {
    namespace cu = mlx::core::cu;
    const T g = prod[0][threadIdx.x];
    out[blockIdx.x * WARPS + threadIdx.x] = cu::Multiply{}(cu::Multiply{}(g, cu::Sigmoid{}(g)),
                                                          prod[1][threadIdx.x]);
  }
}

// The rows form (MLX_FAST_GEMV_ROWS): M rows of x [M, K] against R rows of w a warp
// (rows[r]), each (row of w, row of x) pair into its own float exactly as lane_sum adds
// one row (the same lane's elements in the same order), every load of w made once for the
// M rows of x and every load of x once for the R rows of w.
template <typename T, int NPT, int U, int M, int R, int K>
__device__ __forceinline__ void chunks_rows(const T* x, const T* w, const int (&rows)[R],
                                            const int lane, const int r0, const int count,
                                            float (&sum)[R][M]) {
  constexpr int STEP = 32 * NPT;
  Elems<T, NPT> wv[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u < count) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = load<T, NPT>(w + (size_t)rows[r] * K + (r0 + u) * STEP + lane * NPT);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u < count) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const Elems<T, NPT> xv = load<T, NPT>(x + m * K + (r0 + u) * STEP + lane * NPT);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int j = 0; j < NPT; ++j) {
            sum[r][m] += static_cast<float>(wv[u][r][j]) * static_cast<float>(xv[j]);
          }
        }
      }
    }
  }
}

template <typename T, int NPT, int K, int U, int M, int R>
__device__ __forceinline__ void lane_sums_rows(const T* x, const T* w, const int (&rows)[R],
                                               const int lane, float (&sum)[R][M]) {
  constexpr int NCH = K / (32 * NPT);
  constexpr int FULL = NCH / U * U;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) sum[r][m] = 0.f;
  }
#pragma unroll 1
  for (int r0 = 0; r0 < FULL; r0 += U) {
    chunks_rows<T, NPT, U, M, R, K>(x, w, rows, lane, r0, U, sum);
  }
  if constexpr (FULL < NCH) {
    chunks_rows<T, NPT, U, M, R, K>(x, w, rows, lane, FULL, NCH - FULL, sum);
  }
}

// row_dot for each of the M rows of x [M, K] against each of rows[R] of w (K a multiple
// of 128, so every row of x and of w has the alignment of the first): sum[r][m] is what
// row_dot gives for row m of x alone against w's row rows[r].
template <typename T, int K, int U, int M, int R>
__device__ __forceinline__ void row_dots(const T* x, const T* w, const int (&rows)[R],
                                         float (&sum)[R][M]) {
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = threadIdx.x;
  const uintptr_t both = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w);
  if (both % (4 * sizeof(T)) == 0) {
    lane_sums_rows<T, 4, K, U, M, R>(x, w, rows, lane, sum);
  } else if (both % (2 * sizeof(T)) == 0) {
    lane_sums_rows<T, 2, K, U, M, R>(x, w, rows, lane, sum);
  } else {
    lane_sums_rows<T, 1, K, U, M, R>(x, w, rows, lane, sum);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) sum[r][m] = cg::reduce(warp, sum[r][m], cg::plus<float>());
  }
}

// out [M, n] = x [M, K] @ w.T, each row rounded to T as MLX's gemv stores a one-row
// product; with RES, plus res [M, n] as MLX's `add` computes it. Warp y of block b takes
// w's rows (b * WARPS + y) * R ..+R.
template <typename T, int K, int U, int WARPS, int M, int R, bool RES>
__device__ __forceinline__ void gemv_rows(const T* x, const T* w, const T* res, T* out,
                                          const int n) {
  const int base = (blockIdx.x * WARPS + threadIdx.y) * R;
  if (base >= n) return;
  int rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = min(base + r, n - 1);
  float sum[R][M];
  row_dots<T, K, U, M, R>(x, w, rows, sum);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (base + r >= n) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const size_t i = (size_t)m * n + base + r;
        if constexpr (RES) {
          out[i] = res[i] + static_cast<T>(sum[r][m]);
        } else {
          out[i] = static_cast<T>(sum[r][m]);
        }
      }
    }
  }
}

// gemv_swiglu for M rows of x: out [M, inter]; warps y < WARPS take R gate rows each,
// the others the same rows of up.
template <typename T, int K, int U, int WARPS, int M, int R>
__device__ __forceinline__ void gemv_rows_swiglu(const T* x, const T* w, T* out,
                                                 const int inter) {
  constexpr int ROWS = WARPS * R;
  __shared__ T prod[2][M][ROWS];
  const int up = threadIdx.y >= WARPS;
  const int i = threadIdx.y - up * WARPS;
  const int base = blockIdx.x * ROWS + i * R;
  if (base < inter) {
    int rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = min(base + r, inter - 1) + up * inter;
    float sum[R][M];
    row_dots<T, K, U, M, R>(x, w, rows, sum);
    if (threadIdx.x == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int m = 0; m < M; ++m) prod[up][m][i * R + r] = static_cast<T>(sum[r][m]);
      }
    }
  }
  __syncthreads();
  for (int t = threadIdx.y * 32 + threadIdx.x; t < M * ROWS; t += 64 * WARPS) {
    namespace cu = mlx::core::cu;
    const int m = t / ROWS, j = t % ROWS;
    const int r = blockIdx.x * ROWS + j;
    if (r < inter) {
      const T g = prod[0][m][j];
      out[(size_t)m * inter + r] = cu::Multiply{}(cu::Multiply{}(g, cu::Sigmoid{}(g)),
                                                  prod[1][m][j]);
    }
  }
}

}  // namespace mlxs_gemv
)";

// What a kernel computes: the product plus a residual, the swiglu of a fused gate/up
// product, or (rows of x only, MLX_FAST_GEMV_ROWS) the product alone.
enum class Form { kResidual, kSwiglu, kPlain };

// `m` rows of x (1: the one-row kernels; 2..kMaxRows: the rows form, `r` rows of w a
// warp).
const mx::fast::CustomKernelFunction& kernel_for(Form form, int k, mx::Dtype dtype, int u,
                                                 int warps, int m, int r, int device) {
  using Key = std::tuple<int, int, int, int, int, int, int, int>;
  static std::mutex mu;
  static std::map<Key, mx::fast::CustomKernelFunction> kernels;
  std::lock_guard<std::mutex> lock(mu);
  const Key key{static_cast<int>(form), k, static_cast<int>(dtype.val()), u, warps, m, r, device};
  auto it = kernels.find(key);
  if (it != kernels.end()) return it->second;
  const std::string targs = std::string(cuda_type(dtype)) + ", " + std::to_string(k) + ", " +
                            std::to_string(u) + ", " + std::to_string(warps);
  std::string name = std::string("mlxs_gemv_") + cuda_type(dtype) + "_k" + std::to_string(k) +
                     "_u" + std::to_string(u) + "_w" + std::to_string(warps);
  std::vector<KernelParam> inputs{{"x", dtype}, {"w", dtype}};
  std::string src;
  // The rows form keeps about as many loads of w in flight a lane: u / r chunks of r rows.
  const std::string rargs = std::string(cuda_type(dtype)) + ", " + std::to_string(k) + ", " +
                            std::to_string(std::max(1, u / r)) + ", " +
                            std::to_string(warps) + ", " + std::to_string(m) + ", " +
                            std::to_string(r);
  if (m > 1) name += "_m" + std::to_string(m) + "_r" + std::to_string(r);
  switch (form) {
    case Form::kResidual:
      inputs.emplace_back("res", dtype);
      name += "_res";
      src = m > 1 ? "  mlxs_gemv::gemv_rows<" + rargs + ", true>(x, w, res, out, w_shape[0]);\n"
                  : "  mlxs_gemv::gemv_add<" + targs + ">(x, w, res, out, w_shape[0]);\n";
      break;
    case Form::kSwiglu:
      name += "_swiglu";
      src = m > 1 ? "  mlxs_gemv::gemv_rows_swiglu<" + rargs + ">(x, w, out, w_shape[0] / 2);\n"
                  : "  mlxs_gemv::gemv_swiglu<" + targs + ">(x, w, out, w_shape[0] / 2);\n";
      break;
    case Form::kPlain:
      name += "_plain";
      src = "  mlxs_gemv::gemv_rows<" + rargs + ", false>(x, w, w, out, w_shape[0]);\n";
      break;
  }
  auto fn = device_kernel(name, inputs, {{"out", dtype}}, src,
                          DeviceCode{kDeviceCode, "mlxs_gemv"}, device);
  return kernels.emplace(key, std::move(fn)).first->second;
}

// W [N, K] (row-major) where `b` [K, N] is its transposed view as MLX's matmul would see
// it, else nullopt: `b` evaluated with strides (1, K) over exactly N * K elements (a
// weight's cached transpose after its first step), or a pending transpose of an evaluated
// row-major W (the first step).
std::optional<mx::array> row_major_source(const mx::array& b, const mx::Stream& st) {
  if (b.ndim() != 2 || b.is_tracer()) return std::nullopt;
  const int k = b.shape(0), n = b.shape(1);
  if (b.is_available()) {
    const auto& str = b.strides();
    if (str[0] != 1 || str[1] != k || b.data_size() != static_cast<size_t>(k) * n) {
      return std::nullopt;
    }
    // A view of the same buffer, row-major again (no copy: MLX's Transpose is a view).
    return mx::transpose(b, {1, 0}, st);
  }
  if (!b.has_primitive() || b.inputs().size() != 1) return std::nullopt;
  // By name (libmlx does not export its primitives' type information), then the axes.
  if (std::strcmp(b.primitive().name(), "Transpose") != 0) return std::nullopt;
  if (static_cast<const mx::Transpose&>(b.primitive()).state() != std::vector<int>{1, 0}) {
    return std::nullopt;
  }
  const mx::array& w = b.inputs()[0];
  if (w.ndim() != 2 || !w.is_available() || !w.flags().row_contiguous ||
      w.data_size() != static_cast<size_t>(k) * n || w.shape(0) != n || w.shape(1) != k) {
    return std::nullopt;
  }
  return w;
}

// A product our kernels take: its stream, K, N, row-major weight and rows of x.
struct Product {
  mx::Stream st;
  int k;
  int n;
  mx::array w;
  int m;
};

// Whether x's `m` rows (2 or more) go to the rows form: MLX_FAST_GEMV_ROWS (read once,
// settable) `1` every product of 2..MLX_FAST_GEMV_MAX_ROWS rows, `batch` only rows of
// several sequences (x [B, 1, K]: a batch's decoding step), else (the default) none.
bool rows_taken(const mx::array& a, long long m) {
  if (m < 2 || m > max_rows()) return false;
  const int mode = rows_mode();
  if (mode == kRowsAll) return true;
  return mode == kRowsBatch && a.ndim() >= 3 && a.shape(-2) == 1;
}

std::optional<Product> eligible(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  if (!g_switch.on()) return std::nullopt;
  const mx::Stream st = mx::to_stream(s);
  if (!on_gpu(st, a)) return std::nullopt;
  const mx::Dtype dt = a.dtype();
  if (b.dtype() != dt || (dt != mx::bfloat16 && dt != mx::float16 && dt != mx::float32)) {
    return std::nullopt;
  }
  if (a.ndim() < 2 || b.ndim() != 2) return std::nullopt;
  const int k = a.shape(-1);
  const int n = b.shape(1);
  if (b.shape(0) != k || k % 128 != 0 || k > kMaxK || n < 1 || a.size() % k != 0) {
    return std::nullopt;
  }
  const long long m = static_cast<long long>(a.size()) / k;
  if (m != 1 && !rows_taken(a, m)) return std::nullopt;
  if (static_cast<long long>(n) * k < min_elements()) return std::nullopt;
  auto w = row_major_source(b, st);
  if (!w) return std::nullopt;
  return Product{st, k, n, *w, static_cast<int>(m)};
}

// Launches `form` over `rows` rows of output (blocks of `warps()` warps of one row each, or
// of rows_per_warp() rows each in the rows form; twice as many warps a block for the
// swiglu), with `inputs` after x and w.
std::optional<mx::array> launch(Form form, const Product& p, const mx::array& a, int rows,
                                std::vector<mx::array> inputs) {
  const int wp = warps();
  const int r = p.m > 1 ? rows_per_warp() : 1;
  const long long per_block = static_cast<long long>(wp) * r;
  const long long blocks = (static_cast<long long>(rows) + per_block - 1) / per_block;
  if (blocks * 32 > std::numeric_limits<int>::max()) return std::nullopt;
  const int ys = form == Form::kSwiglu ? 2 * wp : wp;
  const auto& fn = kernel_for(form, p.k, a.dtype(), loads(), wp, p.m, r, p.st.device.index);
  mx::Shape out_shape = a.shape();
  out_shape.back() = rows;
  inputs.insert(inputs.begin(), {a, p.w});
  // x's shape does not matter to the kernel (m rows of K, made row-contiguous by MLX), so
  // the output takes matmul's.
  auto outs = fn(inputs, {out_shape}, {a.dtype()},
                 std::make_tuple(static_cast<int>(blocks * 32), ys, 1),
                 std::make_tuple(32, ys, 1), {}, std::nullopt, false, p.st);
  g_switch.count();
  return outs[0];
}

}  // namespace

std::optional<mx::array> try_fast_gemv_add(const mx::array& a, const mx::array& b,
                                           const mx::array& residual, mx::StreamOrDevice s) {
  auto p = eligible(a, b, s);
  if (!p || residual.dtype() != a.dtype() || residual.ndim() != a.ndim()) return std::nullopt;
  mx::Shape out_shape = a.shape();
  out_shape.back() = p->n;
  if (residual.shape() != out_shape) return std::nullopt;
  return launch(Form::kResidual, *p, a, p->n, {residual});
}

std::optional<mx::array> try_fast_gemv_swiglu(const mx::array& a, const mx::array& b,
                                              mx::StreamOrDevice s) {
  auto p = eligible(a, b, s);
  if (!p || p->n % 2 != 0) return std::nullopt;
  return launch(Form::kSwiglu, *p, a, p->n / 2, {});
}

std::optional<mx::array> try_fast_gemv_rows(const mx::array& a, const mx::array& b,
                                            mx::StreamOrDevice s) {
  if (rows_mode() == kRowsOff) return std::nullopt;
  auto p = eligible(a, b, s);
  if (!p || p->m < 2) return std::nullopt;
  return launch(Form::kPlain, *p, a, p->n, {});
}

void set_fast_gemv_rows(int mode) {
  g_rows_mode.store(mode == kRowsAll || mode == kRowsBatch ? mode : kRowsOff,
                    std::memory_order_relaxed);
}
int fast_gemv_rows_mode() { return rows_mode(); }

void set_fast_gemv(bool on) { g_switch.set(on); }
bool fast_gemv_enabled() { return g_switch.on(); }
unsigned long long fast_gemv_launches() { return g_switch.uses(); }

}  // namespace mlxs_detail
