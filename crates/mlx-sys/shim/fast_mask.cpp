// fast_mask.cpp: a batch's grammar masks applied to its logits in one CUDA kernel, taken
// by the decoding step's constrained sampling (mlx-engine `constrain::apply_mask_words`).
//
// The step uploads each grammar row's allowed tokens as a bitset (bit v % 32 of word
// v / 32) and, without this kernel, expands it on the device and applies it with MLX's
// ops: `arange`, `right_shift`, `bitwise_and`, `astype(bool)` and `where` (five kernels,
// and five graph nodes to build and encode on the host at every step, in a step that is
// bound by the host for small models: GPU.md session 43 put the constrained step's
// overhead at 32 rows of the 0.5B shape at ~350 us, ~60 of them the mask's upload and
// ops). Here one thread a logit reads its row's word and writes the logit or -inf: the
// same bits as `where` (either the logit's own bits or the dtype's -inf). On by default
// since session 46 (every bit equal to the ops' and 2-3x faster a call on an H100, GPU.md
// session 45): `MLX_FAST_MASK=0` (or `mlxs_set_fast_mask(false)`) turns it off.
#include "fast_mask.h"

#include "kernel_cache.h"
#include "kernel_switch.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace mx = mlx::core;

namespace mlxs_detail {
namespace {

KernelSwitch g_switch("MLX_FAST_MASK", /*on_by_default=*/true);

const char* const kDeviceCode = R"(// mlx-rs: grammar masks on logits (fast_mask.cpp).
#pragma once

namespace mlxs_mask {

// Thread i of R x V: out[i] = logits[i] where bit (v % 32) of words[r, v / 32] is set,
// else -inf (r = i / V, v = i % V; both arrays row-contiguous). The float -inf converted
// to T is T's -inf, as MLX's `where` with a -inf scalar of T writes it.
template <typename T>
__device__ __forceinline__ void masked_logits(const uint32_t* words, const T* logits, T* out,
                                              const int rows, const int vocab,
                                              const int n_words) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long total = static_cast<long long>(rows) * vocab;
  if (i >= total) return;
  const int r = static_cast<int>(i / vocab);
  const int v = static_cast<int>(i - static_cast<long long>(r) * vocab);
  const uint32_t w = words[static_cast<long long>(r) * n_words + (v >> 5)];
  out[i] = ((w >> (v & 31)) & 1u) ? logits[i] : static_cast<T>(-__int_as_float(0x7f800000));
}

}  // namespace mlxs_mask
)";

const mx::fast::CustomKernelFunction& kernel_for(mx::Dtype dtype, int device) {
  using Key = std::pair<int, int>;
  static std::mutex mu;
  static std::map<Key, mx::fast::CustomKernelFunction> kernels;
  std::lock_guard<std::mutex> lock(mu);
  const Key key{static_cast<int>(dtype.val()), device};
  auto it = kernels.find(key);
  if (it != kernels.end()) return it->second;
  const std::string name = std::string("mlxs_masked_logits_") + cuda_type(dtype);
  const std::string src = std::string("  mlxs_mask::masked_logits<") + cuda_type(dtype) +
                          ">(words, logits, out, logits_shape[0], logits_shape[1], "
                          "words_shape[1]);\n";
  auto fn = device_kernel(name, {{"words", mx::uint32}, {"logits", dtype}}, {{"out", dtype}},
                          src, DeviceCode{kDeviceCode, "mlxs_mask"}, device);
  return kernels.emplace(key, std::move(fn)).first->second;
}

constexpr int kThreads = 256;

}  // namespace

std::optional<mx::array> try_masked_logits(const mx::array& words, const mx::array& logits,
                                           mx::StreamOrDevice s) {
  if (!g_switch.on()) return std::nullopt;
  const mx::Stream st = mx::to_stream(s);
  if (!on_gpu(st, logits)) return std::nullopt;
  const mx::Dtype dt = logits.dtype();
  if (dt != mx::bfloat16 && dt != mx::float16 && dt != mx::float32) return std::nullopt;
  if (words.dtype() != mx::uint32 || logits.ndim() != 2) return std::nullopt;
  const int rows = logits.shape(0), vocab = logits.shape(1);
  const int n_words = (vocab + 31) / 32;
  if (rows < 1 || vocab < 1 || words.shape(0) != rows || words.shape(1) != n_words) {
    return std::nullopt;
  }
  if (words.ndim() == 3 ? words.shape(2) != 1 : words.ndim() != 2) return std::nullopt;
  const long long total = static_cast<long long>(rows) * vocab;
  const long long blocks = (total + kThreads - 1) / kThreads;
  if (blocks * kThreads > 0x7fffffffLL) return std::nullopt;
  const mx::array w = words.ndim() == 3 ? mx::reshape(words, {rows, n_words}, st) : words;
  const auto& fn = kernel_for(dt, st.device.index);
  auto outs = fn({w, logits}, {{rows, vocab}}, {dt},
                 std::make_tuple(static_cast<int>(blocks * kThreads), 1, 1),
                 std::make_tuple(kThreads, 1, 1), {}, std::nullopt, false, st);
  g_switch.count();
  return outs[0];
}

void set_fast_mask(bool on) { g_switch.set(on); }
bool fast_mask_enabled() { return g_switch.on(); }
unsigned long long fast_mask_launches() { return g_switch.uses(); }

}  // namespace mlxs_detail
