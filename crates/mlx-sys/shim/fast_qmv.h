// fast_qmv.h: internal to the shim (see fast_qmv.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mlx/mlx.h"

namespace mlxs_detail {

// The custom one-row kernel's result when it covers this call (same bits as MLX's `qmv`),
// or for 2..MLX_FAST_QMM_MAX_ROWS rows of x the multi-row kernel's (each row the same bits
// as the one-row kernel gives for it alone); nullopt when MLX's `quantized_matmul` should
// run.
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

// The products of one x by several weights (q/k/v, gate/up) in one launch of the same
// kernels, each output bit-identical to its own `try_fast_qmv`; nullopt when any of them
// would not take our one-row body alone (the caller then runs them one by one).
std::optional<std::vector<mlx::core::array>> try_fast_qmv_many(
    const mlx::core::array& x,
    const std::vector<mlx::core::array>& ws,
    const std::vector<mlx::core::array>& scales,
    const std::vector<std::optional<mlx::core::array>>& biases,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mlx::core::StreamOrDevice s);

// `residual + quantized_matmul(x, w, scales, biases, transpose=True)` with the add done
// by the kernel (MLX's bfloat16 add of the rounded product), where the product alone
// would take our kernels and `residual` has its shape and dtype; nullopt otherwise.
std::optional<mlx::core::array> try_fast_qmv_add(
    const mlx::core::array& x,
    const mlx::core::array& w,
    const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    const mlx::core::array& residual,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mlx::core::StreamOrDevice s);

// mlx-lm's `swiglu(x @ gate.T, x @ up.T)` (MLX's compiled elementwise kernel of it, same
// bits) with both products and the swiglu in one launch, for a gate/up pair (`ws`,
// `scales`, `biases` of two weights with the same shape) that `try_fast_qmv_many` would
// take; nullopt otherwise.
std::optional<mlx::core::array> try_fast_qmv_swiglu(
    const mlx::core::array& x,
    const std::vector<mlx::core::array>& ws,
    const std::vector<mlx::core::array>& scales,
    const std::vector<std::optional<mlx::core::array>>& biases,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mlx::core::StreamOrDevice s);

// `gather_qmm(x, w, scales, biases, rhs_indices=idx, transpose=True)` of a 4-bit affine
// expert stack w [E, n, K/8] for fewer than 8 rows (MLX's `gather_qmv`: a token's experts
// at batch 1), each row through the one-row body on its expert's weight, so each output
// has MLX's `qmv` arithmetic, which its `gather_qmv` runs too (identical on an H100);
// MLX_FAST_GATHER_QMV=0 leaves them to MLX; nullopt where MLX should run it.
std::optional<mlx::core::array> try_fast_gather_qmv(
    const mlx::core::array& x,
    const mlx::core::array& w,
    const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    const std::optional<mlx::core::array>& lhs_indices,
    const std::optional<mlx::core::array>& rhs_indices,
    bool transpose,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mlx::core::StreamOrDevice s);
unsigned long long fast_gather_qmv_launches();

// `dequantize(w, scales, biases)` of a 4-bit affine weight [n, K/8] to bfloat16 through our
// kernel (MLX's values bit for bit, at the memory's speed), on a CUDA GPU stream; nullopt
// where MLX's `dequantize` should run (other bits, modes or dtypes, traced operands, the
// switch MLX_FAST_DEQUANT=0 or `set_fast_dequant(false)`).
std::optional<mlx::core::array> try_fast_dequantize(
    const mlx::core::array& w,
    const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mlx::core::Dtype dtype,
    mlx::core::StreamOrDevice s);
void set_fast_dequant(bool on);
unsigned long long fast_dequant_launches();
void set_fast_qmv(bool on);
void set_fast_qmv_swiglu(bool on);
// A pending MLX rms_norm of a one-row product's x computed in its launch (off by default;
// MLX_FAST_QMV_NORM=1), and how many launches did.
void set_fast_qmv_norm(bool on);
unsigned long long fast_qmv_norm_launches();
void set_fast_qmv_min_elements(long long n);
void set_fast_qmv_residual(bool on);
void set_fast_qmv_many(bool on);
bool fast_qmv_enabled();
unsigned long long fast_qmv_launches();
void set_fast_qmm(bool on);
void set_fast_qmm_warp_rows(int n);
void set_fast_qmm_max_rows(long long n);
bool fast_qmm_enabled();
unsigned long long fast_qmm_launches();
// The tensor-core form of the multi-row product: 0 off, 1 on (rows of several sequences),
// 2 forced (every product of 2 or more rows).
void set_fast_qmm_mma(int mode);
int fast_qmm_mma_mode();
unsigned long long fast_qmm_mma_launches();

}  // namespace mlxs_detail
