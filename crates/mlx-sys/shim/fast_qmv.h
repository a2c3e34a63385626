// fast_qmv.h: internal to the shim (see fast_qmv.cpp).
#pragma once

#include <optional>
#include <string>

#include "mlx/mlx.h"

namespace mlxs_detail {

// The custom one-row kernel's result when it covers this call (same bits as MLX's `qmv`),
// nullopt when MLX's `quantized_matmul` should run.
std::optional<mlx::core::array> try_fast_qmv(
    const mlx::core::array& x,
    const mlx::core::array& w,
    const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    bool transpose,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mlx::core::StreamOrDevice s);

void set_fast_qmv(bool on);
bool fast_qmv_enabled();
unsigned long long fast_qmv_launches();

}  // namespace mlxs_detail
