// fast_sdpa.cpp: attention of one query a row over left-padded rows (batched decoding),
// in one CUDA kernel, taken by `mlx_nn::attention` for a batch's decoding step of padded
// rows on a GPU (`AttnMask::LeftPadded`; `MLX_SDPA_PADDED=0` keeps MLX's attention), and
// of a few queries a row, causal (a speculating batch's verification while the split of
// `mlx_nn::attention` is on: one launch for the nq positions, each query's block the
// arithmetic a launch of that query alone over its visible keys would do).
//
// MLX 0.32.4's CUDA attention for one query (`sdpa_vector`) takes no array mask, so a
// batch whose rows are left-padded by different amounts (rows that joined the batch at
// different lengths: every server batch, `mlx-benchmark -b 32`) runs MLX's unfused
// attention: a batched product, the mask's `where`, a softmax, a product and its pointer
// setup, ~36 us a layer for 8 rows of the 8B 4-bit shape on the H200 against ~7 for the
// fused kernel (benchmarks/GPU.md, session 33). The kernel here is the one-pass form of
// MLX's `sdpa_vector` with a start position a row: block (G query heads of one key-value
// head, row b) of 32 warps, warp w takes keys left_padding[b] + w, + 32, ... with an
// online softmax in float for each of the G heads, lane l the dimensions l * E .. l * E +
// E - 1 (E = D / 32), then the warps' maxima, sums and outputs combined through shared
// memory, head by head. Another order of sums than MLX's unfused form (as MLX's fused
// kernel is for an unpadded batch); the same bits for any G. Session 34 (H100, ncu of the
// 8B 4-bit shape at batch 32): one head a block took ~81 us a layer, 1,024 blocks of
// 1,024 threads in eight waves; G heads a block cut the blocks G-fold (62.9 us a layer,
// batch 32 +11%). Not yet run on a device: `MLX_SDPA_PADDED_PREFETCH=1` (the next key's
// rows in flight). Four heads a block at D = 128 (or 7-8 at D = 64) take 72-92 registers
// a thread (ptxas for sm_90a, benchmarks/kernel_offline.py), over the 64 a block of 1,024
// threads may have: those cannot launch, so the bound below stays.
#include "fast_sdpa.h"

#include "kernel_cache.h"
#include "kernel_switch.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace mx = mlx::core;

namespace mlxs_detail {
namespace {

std::atomic<unsigned long long> g_launches{0};

const char* const kDeviceCode = R"(// mlx-rs: attention over left-padded rows (fast_sdpa.cpp).
#pragma once

namespace mlxs_sdpa {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Block (blockIdx.x = group of G query heads h0 .. h0 + G - 1, all of one key-value head;
// blockIdx.y = query qi of nq; blockIdx.z = row b) of 32 x 32 threads: out[b, h, qi, :] =
// softmax(scale q_h . k_j) v_j over keys j in [start[b], L - nq + 1 + qi) of kv head
// h0 / (Hq / Hkv) (causal over a verification's nq positions; nq = 1: decoding). A key and value row read once
// serves the G heads (Hq / Hkv heads share it), so a batch's attention takes Hq / G blocks
// a row. Element strides of q, k, v come from MLX (views of the caches' buffers are fine).
// With P, a warp loads its next key and value rows before the G heads' arithmetic on the
// current ones (two rows in flight; the same arithmetic).
template <typename T, int D, int G, bool P>
__device__ __forceinline__ void sdpa_padded(const T* q, const T* k, const T* v,
                                            const int* start, T* out, const int64_t* qs,
                                            const int64_t* ks, const int64_t* vs,
                                            const int hq, const int hkv, const int len,
                                            const int nq, const float scale) {
  constexpr int BN = 32;
  constexpr int E = D / 32;
  __shared__ float outs[BN][D + 1];
  __shared__ float maxs[G][BN];
  __shared__ float sums[G][BN];
  const int lane = threadIdx.x;
  const int warp = threadIdx.y;
  const int h0 = blockIdx.x * G;
  const int b = blockIdx.z;
  // Query qi of the row's nq (a verification's positions) sees the keys before
  // len - nq + 1 + qi: what the same kernel gives that query alone over those keys.
  const int qi = blockIdx.y;
  const int end = len - nq + 1 + qi;
  const int kvh = h0 / (hq / hkv);
  const T* kp = k + b * ks[0] + kvh * ks[1];
  const T* vp = v + b * vs[0] + kvh * vs[1];
  float qv[G][E];
  float o[G][E];
  float m[G];
  float s[G];
  const float neg_inf = __int_as_float(0xff800000);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const T* qp = q + b * qs[0] + (h0 + g) * qs[1] + qi * qs[2];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      qv[g][e] = scale * static_cast<float>(qp[(lane * E + e) * qs[3]]);
      o[g][e] = 0.f;
    }
    m[g] = neg_inf;
    s[g] = 0.f;
  }
  // Key and value row j's elements of this lane, in float.
  auto load_row = [&](int j, float (&kx)[E], float (&vx)[E]) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      kx[e] = static_cast<float>(kp[j * ks[2] + (lane * E + e) * ks[3]]);
      vx[e] = static_cast<float>(vp[j * vs[2] + (lane * E + e) * vs[3]]);
    }
  };
  float kk[E];
  float vv[E];
  const int first = start[b] + warp;
  if (P && first < end) load_row(first, kk, vv);
  for (int j = first; j < end; j += BN) {
    float kn[E] = {};
    float vn[E] = {};
    if (!P) {
      load_row(j, kk, vv);
    } else if (j + BN < end) {
      load_row(j + BN, kn, vn);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) d += qv[g][e] * kk[e];
      d = warp_sum(d);
      const float nm = fmaxf(m[g], d);
      const float f = expf(m[g] - nm);
      const float p = expf(d - nm);
      s[g] = s[g] * f + p;
#pragma unroll
      for (int e = 0; e < E; ++e) o[g][e] = o[g][e] * f + p * vv[e];
      m[g] = nm;
    }
    if (P) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        kk[e] = kn[e];
        vv[e] = vn[e];
      }
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      maxs[g][warp] = m[g];
      sums[g][warp] = s[g];
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < E; ++e) outs[warp][lane * E + e] = o[g][e];
    __syncthreads();
    // Every warp: the global maximum and sum over the 32 warps (lane l reads warp l's).
    const float wm = maxs[g][lane];
    const float gm = warp_max(wm);
    const float wf = wm == neg_inf ? 0.f : expf(wm - gm);
    const float gs = warp_sum(sums[g][lane] * wf);
    // Warp w then writes dimensions w * E .. w * E + E - 1, each summed over the warps.
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int dim = warp * E + e;
      const float val = warp_sum(outs[lane][dim] * wf);
      if (lane == 0) {
        out[(((long long)b * hq + h0 + g) * nq + qi) * D + dim] = static_cast<T>(val / gs);
      }
    }
    // The next head's outputs overwrite `outs`.
    __syncthreads();
  }
}

}  // namespace mlxs_sdpa
)";

const mx::fast::CustomKernelFunction& kernel_for(mx::Dtype dtype, int d, int g, bool prefetch,
                                                 float scale, int device) {
  using Key = std::tuple<int, int, int, bool, unsigned, int>;
  static std::mutex mu;
  static std::map<Key, mx::fast::CustomKernelFunction> kernels;
  unsigned bits = 0;
  static_assert(sizeof(bits) == sizeof(scale));
  std::memcpy(&bits, &scale, sizeof(bits));
  std::lock_guard<std::mutex> lock(mu);
  const Key key{static_cast<int>(dtype.val()), d, g, prefetch, bits, device};
  auto it = kernels.find(key);
  if (it != kernels.end()) return it->second;
  // The scale as an exact hexadecimal float literal in the kernel's one source line.
  char lit[64];
  std::snprintf(lit, sizeof(lit), "%af", static_cast<double>(scale));
  char tag[16];
  std::snprintf(tag, sizeof(tag), "%08x", bits);
  const std::string name = std::string("mlxs_sdpa_pad_") + cuda_type(dtype) + "_d" +
                           std::to_string(d) + "_g" + std::to_string(g) +
                           (prefetch ? "_p" : "") + "_s" + tag;
  const std::string src = std::string("  mlxs_sdpa::sdpa_padded<") + cuda_type(dtype) + ", " +
                          std::to_string(d) + ", " + std::to_string(g) + ", " +
                          (prefetch ? "true" : "false") + ">(q, k, v, lp, out, q_strides.data(), k_strides.data(), "
                          "v_strides.data(), q_shape[1], k_shape[1], k_shape[2], q_shape[2], " +
                          lit + ");\n";
  auto fn = device_kernel(name, {{"q", dtype}, {"k", dtype}, {"v", dtype}, {"lp", mx::int32}},
                          {{"out", dtype}}, src, DeviceCode{kDeviceCode, "mlxs_sdpa"}, device,
                          /*ensure_row_contiguous=*/false);
  return kernels.emplace(key, std::move(fn)).first->second;
}

// Query heads a block takes: the largest divisor of the heads sharing a key-value head
// with G * D / 32 <= 8, so a thread's queries and accumulators (2 * G * D / 32 floats)
// stay as few registers as one head of D = 128 in two, and a block of 1024 threads fits
// the 64 registers a thread it may have (G * D / 32 = 16 takes 72 or more: see above).
int heads_per_block(int group, int d) {
  const int most = std::max(1, 8 / (d / 32));
  for (int g = most; g > 1; --g) {
    if (group % g == 0) return g;
  }
  return 1;
}

}  // namespace

std::optional<mx::array> try_sdpa_padded(const mx::array& q, const mx::array& k,
                                         const mx::array& v, float scale,
                                         const mx::array& left_padding,
                                         mx::StreamOrDevice s) {
  const mx::Stream st = mx::to_stream(s);
  if (!on_gpu(st, q)) return std::nullopt;
  const mx::Dtype dt = q.dtype();
  if ((dt != mx::bfloat16 && dt != mx::float16) || k.dtype() != dt || v.dtype() != dt) {
    return std::nullopt;
  }
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) return std::nullopt;
  const int b = q.shape(0), hq = q.shape(1), nq = q.shape(2), d = q.shape(3);
  if (nq < 1 || nq > k.shape(2)) return std::nullopt;
  if ((d != 64 && d != 128) || k.shape(0) != b || v.shape(0) != b || k.shape(3) != d ||
      v.shape(3) != d || k.shape(1) != v.shape(1) || k.shape(2) != v.shape(2) ||
      k.shape(1) < 1 || hq % k.shape(1) != 0 || k.shape(2) < 1) {
    return std::nullopt;
  }
  if (left_padding.ndim() != 1 || left_padding.shape(0) != b) return std::nullopt;
  const mx::array lp = left_padding.dtype() == mx::int32
                           ? left_padding
                           : mx::astype(left_padding, mx::int32, st);
  const int g = heads_per_block(hq / k.shape(1), d);
  // `MLX_SDPA_PADDED_PREFETCH=1` (an experiment, read once): the next key's rows loaded
  // before the current one's arithmetic.
  static const bool prefetch = env_count("MLX_SDPA_PADDED_PREFETCH", 0) == 1;
  const auto& fn = kernel_for(dt, d, g, prefetch, scale, st.device.index);
  auto outs = fn({q, k, v, lp}, {{b, hq, nq, d}}, {dt}, std::make_tuple(hq / g * 32, 32 * nq, b),
                 std::make_tuple(32, 32, 1), {}, std::nullopt, false, st);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return outs[0];
}

unsigned long long sdpa_padded_launches() { return g_launches.load(std::memory_order_relaxed); }

}  // namespace mlxs_detail
