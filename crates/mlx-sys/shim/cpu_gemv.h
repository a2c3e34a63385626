// cpu_gemv.h: internal to the shim (see cpu_gemv.cpp).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxs_detail {

// `a @ b` (+ c broadcast, as addmm with alpha = beta = 1) by our few-row CPU primitive of
// MLX's arithmetic, when it covers the call; nullopt when MLX should run it.
std::optional<mlx::core::array> try_cpu_gemv(const mlx::core::array& a,
                                             const mlx::core::array& b,
                                             const std::optional<mlx::core::array>& c,
                                             mlx::core::StreamOrDevice s);

void set_fast_cpu_gemv(bool on);
bool fast_cpu_gemv_enabled();
unsigned long long fast_cpu_gemv_uses();

}  // namespace mlxs_detail
