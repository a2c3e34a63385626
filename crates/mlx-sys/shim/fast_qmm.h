// fast_qmm.h: internal to the shim (see fast_qmm.cpp).
#pragma once

#include <optional>
#include <string>

#include "affine_operands.h"
#include "mlx/mlx.h"

namespace mlxs_detail {

// `quantized_matmul(x, w, scales, biases, transpose)` of 33 or more rows of x by one
// launch of our tiled 4-bit kernel, which gives MLX's `qmm_sm80` bits (the product MLX
// itself runs there), when it covers the call; nullopt when MLX should run it.
std::optional<mlx::core::array> try_fast_qgemm(const mlx::core::array& x,
                                               const mlx::core::array& w,
                                               const mlx::core::array& scales,
                                               const std::optional<mlx::core::array>& biases,
                                               bool transpose, std::optional<int> group_size,
                                               std::optional<int> bits, const std::string& mode,
                                               mlx::core::StreamOrDevice s);

// `gather_qmm(x, w, scales, biases, rhs_indices=idx, transpose=True)` with one expert
// index a row (x [..., 1, K] with idx of x's batch shape, mlx-lm's sorted mixture-of-experts
// products, or with 1 where idx's last axis is, its unsorted ones) of 8 rows or more by one
// launch of the kernel's gathered form (MLX's `qmm_sm80` / `qmm_naive` bits again), when it
// covers the call; nullopt when MLX should run it.
std::optional<mlx::core::array> try_fast_gather_qgemm(
    const mlx::core::array& x, const mlx::core::array& w, const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    const std::optional<mlx::core::array>& lhs_indices,
    const std::optional<mlx::core::array>& rhs_indices, bool transpose,
    std::optional<int> group_size, std::optional<int> bits, const std::string& mode,
    mlx::core::StreamOrDevice s);

// The shapes of a `gather_qmm` call our gathered CUDA kernels may take (affine_operands.h's
// gather_operands): 4 bits, a CUDA GPU stream, untraced quantized operands, bfloat16 x,
// scales and biases; nullopt otherwise.
std::optional<GatherOperands> gpu_gather_operands(
    const mlx::core::array& x, const mlx::core::array& w, const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    const std::optional<mlx::core::array>& lhs_indices,
    const std::optional<mlx::core::array>& rhs_indices, bool transpose, int group_size,
    std::optional<int> bits, const std::string& mode, const mlx::core::Stream& st);

void set_fast_qgemm(bool on);
void set_fast_gather_qgemm(bool on);
unsigned long long fast_gather_qgemm_launches();
unsigned long long fast_qgemm_launches();

}  // namespace mlxs_detail
