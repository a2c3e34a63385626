// fast_gemv.h: internal to the shim (see fast_gemv.cpp).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxs_detail {

// `a @ b` by our one-row CUDA kernel of MLX's `gemv` arithmetic, when it covers the call
// (a one-row x, b the transposed view of a row-major weight, on the GPU); nullopt when MLX
// should run it.
std::optional<mlx::core::array> try_fast_gemv(const mlx::core::array& a,
                                              const mlx::core::array& b,
                                              mlx::core::StreamOrDevice s);

void set_fast_gemv(bool on);
bool fast_gemv_enabled();
unsigned long long fast_gemv_launches();

}  // namespace mlxs_detail
