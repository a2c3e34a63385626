// fast_sdpa.h: internal to the shim (see fast_sdpa.cpp).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxs_detail {

// Attention of N queries a row, q [B, Hq, N, D] over k / v [B, Hkv, L, D] (N <= L), where
// query i of row b sees the keys from left_padding[b] (int32 [B]) up to L - N + i: the
// result of MLX's attention with the boolean mask `left_padding[b] <= position <= L - N +
// i` (N = 1: `position >= left_padding[b]`), by one launch of our CUDA kernel, when
// it covers the call (the CUDA backend, bfloat16 or float16, D of 64 or 128, Hq a
// multiple of Hkv); nullopt otherwise.
std::optional<mlx::core::array> try_sdpa_padded(const mlx::core::array& q,
                                                const mlx::core::array& k,
                                                const mlx::core::array& v, float scale,
                                                const mlx::core::array& left_padding,
                                                mlx::core::StreamOrDevice s);

unsigned long long sdpa_padded_launches();

}  // namespace mlxs_detail
