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

// The shapes of gather_qmm(x, w, scales, biases, rhs_indices=idx, transpose=True) where our
// kernels take it: an affine product with one expert index a row of x (x [..., 1, K] with
// idx's shape as its batch, mlx-lm's sorted call, or with 1 on idx's last axis, its unsorted
// one: a row of x for each of a token's experts), no lhs_indices, a packed uint32 weight
// [experts, N, K * bits / 32] with scales and biases [experts, N, K / group_size], uint32
// indices, a group size of 32, 64 or 128. The dtypes of x, scales and biases are the
// caller's to check.
struct GatherOperands {
  int k;
  int n;
  int experts;
  long long rows;  // output rows: idx's size
  long long xrep;  // output rows a row of x (1, or idx's last axis)
  mlx::core::Shape out_shape;  // idx's shape, 1, N
};

inline std::optional<GatherOperands> gather_operands(
    const mlx::core::array& x, const mlx::core::array& w, const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    const std::optional<mlx::core::array>& lhs_indices,
    const std::optional<mlx::core::array>& rhs_indices, bool transpose, const std::string& mode,
    int group_size, int bits) {
  if (!transpose || mode != "affine" || !biases || lhs_indices || !rhs_indices ||
      (bits != 4 && bits != 8)) {
    return std::nullopt;
  }
  if (group_size != 32 && group_size != 64 && group_size != 128) return std::nullopt;
  const mlx::core::array& idx = *rhs_indices;
  if (w.dtype() != mlx::core::uint32 || idx.dtype() != mlx::core::uint32 || w.ndim() != 3 ||
      scales.ndim() != 3 || biases->shape() != scales.shape() || x.ndim() < 2 ||
      x.shape(-2) != 1 || idx.ndim() < 1 || idx.size() == 0) {
    return std::nullopt;
  }
  GatherOperands g{x.shape(-1), w.shape(1), w.shape(0), static_cast<long long>(idx.size()), 1,
                   idx.shape()};
  if (g.k <= 0 || g.n <= 0 || g.k % group_size != 0 || w.shape(2) * (32 / bits) != g.k ||
      scales.shape() != mlx::core::Shape{g.experts, g.n, g.k / group_size}) {
    return std::nullopt;
  }
  const mlx::core::Shape batch(x.shape().begin(), x.shape().end() - 2);
  if (batch != idx.shape()) {
    mlx::core::Shape b1 = idx.shape();
    b1.back() = 1;
    if (batch != b1) return std::nullopt;
    g.xrep = idx.shape(-1);
  }
  g.out_shape.push_back(1);
  g.out_shape.push_back(g.n);
  return g;
}

// Whether a quantized operand is a tracer: its scales or biases are trained (distilling a
// quantized model, mlx-lm's DWQ). Our kernels' derivatives give x's gradient only, so such
// products stay MLX's, whose derivative gives theirs.
inline bool quantized_operands_traced(const mlx::core::array& w, const mlx::core::array& scales,
                                      const std::optional<mlx::core::array>& biases) {
  return w.is_tracer() || scales.is_tracer() || (biases && biases->is_tracer());
}

}  // namespace mlxs_detail
