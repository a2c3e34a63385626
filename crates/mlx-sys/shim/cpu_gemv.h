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

void set_fast_cpu_gemv(bool on);
bool fast_cpu_gemv_enabled();
unsigned long long fast_cpu_gemv_uses();

}  // namespace mlxs_detail
