// cpu_gemv.h: internal to the shim (see cpu_gemv.cpp).
#pragma once

#include <optional>
#include <string>

#include "mlx/mlx.h"

namespace mlxs_detail {

// `a @ b` (+ c broadcast, as addmm with alpha = beta = 1) by our few-row CPU primitive of
// MLX's arithmetic, when it covers the call; nullopt when MLX should run it.
std::optional<mlx::core::array> try_cpu_gemv(const mlx::core::array& a,
                                             const mlx::core::array& b,
                                             const std::optional<mlx::core::array>& c,
                                             mlx::core::StreamOrDevice s);

// quantized_matmul(x, w, scales, biases, transpose=True) of bfloat16 x 4-bit affine by our
// CPU primitive of MLX's CPU arithmetic (`_qmm_t`), when it covers the call.
std::optional<mlx::core::array> try_cpu_qmv(const mlx::core::array& x,
                                            const mlx::core::array& w,
                                            const mlx::core::array& scales,
                                            const std::optional<mlx::core::array>& biases,
                                            bool transpose, std::optional<int> group_size,
                                            std::optional<int> bits, const std::string& mode,
                                            mlx::core::StreamOrDevice s);

// gather_qmm(x, w, scales, biases, rhs_indices=idx, transpose=True) with one expert index a
// row of x (x [..., 1, K] with idx of x's batch shape, or with 1 on idx's last axis: mlx-lm's
// sorted and unsorted mixture-of-experts products), 4- or 8-bit affine, x / scales / biases
// all bfloat16 or all float32, by our CPU primitive of MLX's CPU arithmetic (`_qmm_t` a
// row), when it covers the call.
std::optional<mlx::core::array> try_cpu_gather_qmm(
    const mlx::core::array& x, const mlx::core::array& w, const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    const std::optional<mlx::core::array>& lhs_indices,
    const std::optional<mlx::core::array>& rhs_indices, bool transpose,
    std::optional<int> group_size, std::optional<int> bits, const std::string& mode,
    bool sorted, mlx::core::StreamOrDevice s);

void set_fast_cpu_gemv(bool on);
bool fast_cpu_gemv_enabled();
unsigned long long fast_cpu_gemv_uses();

}  // namespace mlxs_detail
