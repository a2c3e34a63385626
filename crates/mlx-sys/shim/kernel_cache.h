// kernel_cache.h: internal to the shim. Our CUDA kernels compiled once per machine, not
// once per process.
//
// MLX 0.32's `fast::cuda_kernel` compiles a kernel with NVRTC the first time a process
// runs it (~1.3 s each on the H200, almost all of it MLX's device headers) and never
// writes the result to its disk cache, although it looks there first: before compiling it
// reads `<ptx cache>/<module>.ptx` (and `.txt`, the kernel's mangled name), where the
// module's name is the kernel's name and a hash of the source MLX builds around ours.
// `ensure_kernel_cached` builds that same source, compiles it the way MLX would (the same
// NVRTC library, MLX's own device headers read from libmlx, MLX's options and include
// paths) and writes the result under that name, so this process and every later one load
// it instead of compiling. Where any step fails (no NVRTC, headers not found, a compile
// error, a read-only cache) nothing is written and MLX compiles as before: the same
// source, the same binary.
//
// `MLX_FAST_KERNEL_CACHE=0` (or `set_kernel_cache(false)`) leaves every compile to MLX.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mlx/fast.h"
#include "mlx/mlx.h"

namespace mlxs_detail {

// One parameter of a kernel: its name in the source and its dtype.
using KernelParam = std::pair<std::string, mlx::core::Dtype>;

// Makes sure MLX's PTX disk cache holds the kernel that
// `fast::cuda_kernel(name, <inputs' names>, <outputs' names>, source, header)` builds when
// called with inputs and outputs of these dtypes (every input of rank >= 1, no template
// arguments), compiled for GPU `device`; whether it does now.
bool ensure_kernel_cached(const std::string& name,
                          const std::vector<KernelParam>& inputs,
                          const std::vector<KernelParam>& outputs,
                          const std::string& source,
                          const std::string& header,
                          int device);

// Writes `bytes` to `path` through a temporary file renamed into place, so a concurrent
// reader sees the whole file or none; whether it succeeded.
bool write_file_atomically(const std::string& path, const std::string& bytes);

// The CUDA type name of `d` in MLX's generated kernels ("__nv_bfloat16", "float", ...),
// nullptr for a dtype MLX's custom kernels do not take.
const char* cuda_type(mlx::core::Dtype d);

// Whether our kernels may run on `st` for the activations `x`: a CUDA GPU stream, and `x`
// not a tracer of a function transformation (MLX's custom kernels have no derivatives).
bool on_gpu(const mlx::core::Stream& st, const mlx::core::array& x);

// The device code of a family of our kernels: the text every kernel of the family includes
// and the prefix of the file it is written to (kernel_cache.cpp's device_header).
struct DeviceCode {
  const char* text;
  const char* prefix;
};

// A kernel of ours over MLX's `fast::cuda_kernel`, with `code` as its header (through an
// #include of a file holding it: `async_eval` of a `cuda_kernel` call costs ~0.25 us more
// per KB of its source on the H200's host, and a decoding step makes ~100 of these calls,
// so each kernel's own source is one line), compiled into MLX's disk cache for GPU
// `device` unless it is there (ensure_kernel_cached). MLX reads compiled kernels from its
// disk cache by name alone (without looking at the source), so the name gets a hash of
// everything compiled: a build with other device code never picks up another's binary.
// `shared_memory`: bytes of dynamic shared memory a block (MLX raises the kernel's limit
// above 48 KB for it).
mlx::core::fast::CustomKernelFunction device_kernel(std::string name,
                                                   const std::vector<KernelParam>& inputs,
                                                   const std::vector<KernelParam>& outputs,
                                                   const std::string& src,
                                                   const DeviceCode& code, int device,
                                                   bool ensure_row_contiguous = true,
                                                   int shared_memory = 0);

void set_kernel_cache(bool on);
// Kernels this process compiled into the cache, and kernels it found there.
unsigned long long kernel_cache_compiles();
unsigned long long kernel_cache_hits();

}  // namespace mlxs_detail
