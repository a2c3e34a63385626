// fast_gemv.h: internal to the shim (see fast_gemv.cpp).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxs_detail {

// `residual + a @ b` by one launch of our one-row CUDA kernel of MLX's `gemv` arithmetic
// (and MLX's `add`), when it covers the call (a one-row x, b the transposed view of a
// row-major weight, residual of the product's shape and dtype, on the GPU); nullopt when
// MLX should run it.
std::optional<mlx::core::array> try_fast_gemv_add(const mlx::core::array& a,
                                                  const mlx::core::array& b,
                                                  const mlx::core::array& residual,
                                                  mlx::core::StreamOrDevice s);

// mlx-lm's `swiglu(g, u)` of `[g, u] = split(a @ b, 2, -1)` (b the transposed view of a
// fused [gate; up] weight) by one launch of that kernel, when it covers the call; nullopt
// when MLX should run it.
std::optional<mlx::core::array> try_fast_gemv_swiglu(const mlx::core::array& a,
                                                     const mlx::core::array& b,
                                                     mlx::core::StreamOrDevice s);

// `a @ b` for 2..8 rows of x (MLX_FAST_GEMV_ROWS: `1` every such product, `batch` rows of
// several sequences only; off by default) by one launch of the rows form, each row with
// the bits of the one-row kernel (MLX's `gemv`), the weight read once; nullopt when MLX
// should run it.
std::optional<mlx::core::array> try_fast_gemv_rows(const mlx::core::array& a,
                                                   const mlx::core::array& b,
                                                   mlx::core::StreamOrDevice s);
// 0 off, 1 every product of 2..8 rows, 2 rows of several sequences.
void set_fast_gemv_rows(int mode);
int fast_gemv_rows_mode();

void set_fast_gemv(bool on);
bool fast_gemv_enabled();
unsigned long long fast_gemv_launches();

}  // namespace mlxs_detail
