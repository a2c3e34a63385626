// fast_mask.h: internal to the shim (see fast_mask.cpp).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxs_detail {

// `logits` [R, V] with every token whose bit is clear in `words` ([R, ceil(V / 32)] or
// [R, ceil(V / 32), 1] uint32: bit v % 32 of word v / 32 allows token v) set to -inf, the
// others' bits kept: the result of MLX's `where(bits, logits, -inf)` over the words
// expanded to one flag a token, as one launch of our CUDA kernel when it covers the call
// (the CUDA backend, a float logits dtype, the switch on); nullopt otherwise.
std::optional<mlx::core::array> try_masked_logits(const mlx::core::array& words,
                                                  const mlx::core::array& logits,
                                                  mlx::core::StreamOrDevice s);

void set_fast_mask(bool on);
bool fast_mask_enabled();
unsigned long long fast_mask_launches();

}  // namespace mlxs_detail
