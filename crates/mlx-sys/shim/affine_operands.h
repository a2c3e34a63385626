// affine_operands.h: internal to the shim. The operands our quantized kernels read.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "mlx/mlx.h"

namespace mlxs_detail {

// For quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode): {K, N}
// when it is an affine product of x [..., K] by a 2-D packed uint32 weight [N, K * bits /
// 32] with scales and biases [N, K / group_size] and a group size of 32, 64 or 128 (what
// fast_qmv.cpp and cpu_gemv.cpp handle); nullopt otherwise.
inline std::optional<std::pair<int, int>> affine_operands(
    const mlx::core::array& x, const mlx::core::array& w, const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases, bool transpose, const std::string& mode,
    int group_size, int bits) {
  if (!transpose || mode != "affine" || !biases || (bits != 4 && bits != 8)) return std::nullopt;
  if (group_size != 32 && group_size != 64 && group_size != 128) return std::nullopt;
  if (w.dtype() != mlx::core::uint32 || x.ndim() < 1 || w.ndim() != 2 || scales.ndim() != 2 ||
      biases->shape() != scales.shape()) {
    return std::nullopt;
  }
  const int k = x.shape(-1);
  const int n = w.shape(0);
  if (k <= 0 || n <= 0 || k % group_size != 0 || w.shape(1) * (32 / bits) != k ||
      scales.shape(0) != n || scales.shape(1) != k / group_size) {
    return std::nullopt;
  }
  return std::make_pair(k, n);
}

// Whether a quantized operand is a tracer: its scales or biases are trained (distilling a
// quantized model, mlx-lm's DWQ). Our kernels' derivatives give x's gradient only, so such
// products stay MLX's, whose derivative gives theirs.
inline bool quantized_operands_traced(const mlx::core::array& w, const mlx::core::array& scales,
                                      const std::optional<mlx::core::array>& biases) {
  return w.is_tracer() || scales.is_tracer() || (biases && biases->is_tracer());
}

}  // namespace mlxs_detail
