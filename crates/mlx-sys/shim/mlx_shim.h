/* mlx_shim.h: a small C interface of our own over MLX's C++ API.
 *
 * Conventions
 * - Every fallible function returns 0 on success and non-zero on failure; the
 *   failure's message is kept per thread and read with mlxs_last_error().
 *   No C++ exception ever crosses this boundary.
 * - Handles (mlxs_array, mlxs_vec, mlxs_map, ...) are owned by the caller and
 *   released with their *_free function. Output handles are written only on
 *   success.
 * - A NULL mlxs_array where an "optional" array is documented means "none".
 * - Streams are plain values: kind 0 = the default stream of the default
 *   device, 1 = the default stream of the given device, 2 = the given stream.
 */
#ifndef MLX_SHIM_H
#define MLX_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlxs_array_s* mlxs_array;
typedef struct mlxs_vec_s* mlxs_vec;
typedef struct mlxs_map_s* mlxs_map;
typedef struct mlxs_strmap_s* mlxs_strmap;
typedef struct mlxs_gguf_meta_s* mlxs_gguf_meta;
typedef struct mlxs_closure_s* mlxs_closure;
typedef struct mlxs_kernel_s* mlxs_kernel;
typedef struct mlxs_keyseq_s* mlxs_keyseq;

typedef enum {
  MLXS_BOOL = 0,
  MLXS_UINT8,
  MLXS_UINT16,
  MLXS_UINT32,
  MLXS_UINT64,
  MLXS_INT8,
  MLXS_INT16,
  MLXS_INT32,
  MLXS_INT64,
  MLXS_FLOAT16,
  MLXS_FLOAT32,
  MLXS_FLOAT64,
  MLXS_BFLOAT16,
  MLXS_COMPLEX64,
} mlxs_dtype;

typedef enum { MLXS_CPU = 0, MLXS_GPU = 1 } mlxs_device_type;

typedef struct {
  int32_t type; /* mlxs_device_type */
  int32_t index;
} mlxs_device;

typedef struct {
  int32_t kind; /* 0 default, 1 device, 2 stream */
  int32_t index; /* stream index when kind == 2 */
  mlxs_device device;
} mlxs_stream;

/* ---------- errors, version ---------- */
const char* mlxs_last_error(void);
void mlxs_set_last_error(const char* msg);
const char* mlxs_version(void);

/* ---------- devices and streams ---------- */
int mlxs_default_device(mlxs_device* out);
int mlxs_set_default_device(mlxs_device d);
int mlxs_device_is_available(mlxs_device d, bool* out);
int mlxs_device_count(int32_t type, int* out);
int mlxs_default_stream(mlxs_device d, mlxs_stream* out);
int mlxs_new_stream(mlxs_device d, mlxs_stream* out);
int mlxs_set_default_stream(mlxs_stream s);
int mlxs_synchronize(mlxs_stream s);

/* ---------- array lifecycle and data ---------- */
void mlxs_array_free(mlxs_array a);
/* A new handle to the same array; null (message in mlxs_last_error) only if allocating fails. */
mlxs_array mlxs_array_clone(mlxs_array a);
/* Makes `dst` hold the array `src` holds (every user of the handle `dst` sees it). */
void mlxs_array_assign(mlxs_array dst, mlxs_array src);
int mlxs_array_from_data(mlxs_array* out, const void* data, size_t nbytes,
                         const int32_t* shape, size_t ndim, int32_t dtype);
/* Host data made into arrays (more than 8 bytes) take buffers from a pool of their own
   (given back when the array is freed) rather than MLX's cache, which on CUDA may hand them a device buffer and
   replace it with managed memory and a synchronous copy every time: mode 1 on, 0 off
   (default: on where CUDA is available; MLX_HOST_BUFFER_POOL=0 / 1 at start). */
void mlxs_set_host_buffer_pool(int32_t mode);
/* How many host arrays took a buffer from that pool (not from MLX). */
uint64_t mlxs_host_buffer_pool_reuses(void);
/* How many buffers that pool took from MLX were advised to stay in host memory (CUDA's
   managed memory; MLX_HOST_BUFFER_ADVISE=0 leaves them to migrate). */
uint64_t mlxs_host_buffer_pool_advised(void);
/* A new array of `nbytes` zeroed host bytes (from the same buffers as
   mlxs_array_from_data), written in place through `*data` before any operation reads it:
   no intermediate copy of the caller's. */
int mlxs_array_from_fill(mlxs_array* out, size_t nbytes, const int32_t* shape, size_t ndim,
                         int32_t dtype, void** data);
int mlxs_array_from_f64(mlxs_array* out, double v, int32_t dtype);
int mlxs_array_from_i64(mlxs_array* out, int64_t v, int32_t dtype);
int mlxs_array_from_bool(mlxs_array* out, bool v);
size_t mlxs_array_ndim(mlxs_array a);
const int32_t* mlxs_array_shape(mlxs_array a);
int32_t mlxs_array_dtype(mlxs_array a);
size_t mlxs_array_size(mlxs_array a);
/* Whether the array's data exists (evaluated, or made from host data). */
bool mlxs_array_is_available(mlxs_array a);
size_t mlxs_array_nbytes(mlxs_array a);
size_t mlxs_array_itemsize(mlxs_array a);
int mlxs_array_eval(mlxs_array a);
/* Evaluate, make row-contiguous and copy nbytes (== array nbytes) into dst. */
int mlxs_array_read(mlxs_array a, void* dst, size_t nbytes);
/* MLX's printed representation; free the string with mlxs_string_free. */
int mlxs_array_repr(mlxs_array a, char** out);
void mlxs_string_free(char* s);

/* ---------- vectors of arrays ---------- */
int mlxs_vec_new(mlxs_vec* out);
void mlxs_vec_free(mlxs_vec v);
int mlxs_vec_push(mlxs_vec v, mlxs_array a);
size_t mlxs_vec_len(mlxs_vec v);
int mlxs_vec_get(mlxs_vec v, size_t i, mlxs_array* out);

/* ---------- ordered maps: name -> array, name -> string ---------- */
int mlxs_map_new(mlxs_map* out);
void mlxs_map_free(mlxs_map m);
int mlxs_map_insert(mlxs_map m, const char* key, mlxs_array a);
size_t mlxs_map_len(mlxs_map m);
const char* mlxs_map_key(mlxs_map m, size_t i);
int mlxs_map_value(mlxs_map m, size_t i, mlxs_array* out);
int mlxs_strmap_new(mlxs_strmap* out);
void mlxs_strmap_free(mlxs_strmap m);
int mlxs_strmap_insert(mlxs_strmap m, const char* key, const char* value);
size_t mlxs_strmap_len(mlxs_strmap m);
const char* mlxs_strmap_key(mlxs_strmap m, size_t i);
const char* mlxs_strmap_value(mlxs_strmap m, size_t i);

/* ---------- GGUF metadata: 0 none, 1 array, 2 string, 3 list of strings ---------- */
void mlxs_gguf_meta_free(mlxs_gguf_meta m);
size_t mlxs_gguf_meta_len(mlxs_gguf_meta m);
const char* mlxs_gguf_meta_key(mlxs_gguf_meta m, size_t i);
int32_t mlxs_gguf_meta_kind(mlxs_gguf_meta m, size_t i);
int mlxs_gguf_meta_array(mlxs_gguf_meta m, size_t i, mlxs_array* out);
const char* mlxs_gguf_meta_string(mlxs_gguf_meta m, size_t i);
size_t mlxs_gguf_meta_strings_len(mlxs_gguf_meta m, size_t i);
const char* mlxs_gguf_meta_strings_get(mlxs_gguf_meta m, size_t i, size_t j);
/* Building metadata for mlxs_save_gguf: entries keep the order they are pushed in.
   Strings are given with their byte length (they may hold NUL bytes). */
int mlxs_gguf_meta_new(mlxs_gguf_meta* out);
int mlxs_gguf_meta_push_array(mlxs_gguf_meta m, const char* key, mlxs_array a);
int mlxs_gguf_meta_push_string(mlxs_gguf_meta m, const char* key, const char* s, size_t len);
int mlxs_gguf_meta_push_strings(mlxs_gguf_meta m, const char* key, const char* const* strs,
                                const size_t* lens, size_t n);

/* ---------- io ---------- */
int mlxs_load_safetensors(const char* path, mlxs_stream s, mlxs_map* arrays, mlxs_strmap* meta);
int mlxs_save_safetensors(const char* path, mlxs_map arrays, mlxs_strmap meta);
int mlxs_load_gguf(const char* path, mlxs_stream s, mlxs_map* arrays, mlxs_gguf_meta* meta);
/* mx::save_gguf. Both maps are handed to MLX as unordered maps built by inserting the
   entries in their order (as mx.save_gguf builds them from Python dicts), so the same
   entries in the same order give the same file. `meta` may be null. */
int mlxs_save_gguf(const char* path, mlxs_map arrays, mlxs_gguf_meta meta);
int mlxs_load_npy(const char* path, mlxs_stream s, mlxs_array* out);
int mlxs_save_npy(const char* path, mlxs_array a);

/* ---------- memory ---------- */
size_t mlxs_get_active_memory(void);
size_t mlxs_get_peak_memory(void);
size_t mlxs_get_cache_memory(void);
void mlxs_reset_peak_memory(void);
int mlxs_set_memory_limit(size_t limit, size_t* previous);
int mlxs_set_cache_limit(size_t limit, size_t* previous);
int mlxs_set_wired_limit(size_t limit, size_t* previous);
void mlxs_clear_cache(void);

/* ---------- element-wise ---------- */
/* Unary op codes for mlxs_unary. */
typedef enum {
  MLXS_ABS = 0, MLXS_NEGATIVE, MLXS_SIGN, MLXS_FLOOR, MLXS_CEIL, MLXS_SQRT,
  MLXS_RSQRT, MLXS_SQUARE, MLXS_RECIPROCAL, MLXS_EXP, MLXS_EXPM1, MLXS_LOG,
  MLXS_LOG1P, MLXS_LOG2, MLXS_LOG10, MLXS_SIN, MLXS_COS, MLXS_TAN,
  MLXS_ARCSIN, MLXS_ARCCOS, MLXS_ARCTAN, MLXS_SINH, MLXS_COSH, MLXS_TANH,
  MLXS_ARCSINH, MLXS_ARCCOSH, MLXS_ARCTANH, MLXS_SIGMOID, MLXS_ERF,
  MLXS_ERFINV, MLXS_LOGICAL_NOT, MLXS_BITWISE_INVERT, MLXS_ISNAN,
  MLXS_ISINF, MLXS_ISFINITE, MLXS_ISPOSINF, MLXS_ISNEGINF, MLXS_STOP_GRADIENT,
  MLXS_COPY, MLXS_REAL, MLXS_IMAG, MLXS_CONJUGATE, MLXS_DEGREES, MLXS_RADIANS,
  MLXS_TRUNC, MLXS_CONTIGUOUS,
} mlxs_unary_op;
int mlxs_unary(mlxs_array* out, int32_t op, mlxs_array a, mlxs_stream s);

typedef enum {
  MLXS_ADD = 0, MLXS_SUBTRACT, MLXS_MULTIPLY, MLXS_DIVIDE, MLXS_FLOOR_DIVIDE,
  MLXS_REMAINDER, MLXS_POWER, MLXS_MAXIMUM, MLXS_MINIMUM, MLXS_EQUAL,
  MLXS_NOT_EQUAL, MLXS_GREATER, MLXS_GREATER_EQUAL, MLXS_LESS,
  MLXS_LESS_EQUAL, MLXS_LOGICAL_AND, MLXS_LOGICAL_OR, MLXS_BITWISE_AND,
  MLXS_BITWISE_OR, MLXS_BITWISE_XOR, MLXS_LEFT_SHIFT, MLXS_RIGHT_SHIFT,
  MLXS_ARCTAN2, MLXS_LOGADDEXP, MLXS_MATMUL, MLXS_INNER, MLXS_OUTER,
  MLXS_KRON,
} mlxs_binary_op;
int mlxs_binary(mlxs_array* out, int32_t op, mlxs_array a, mlxs_array b, mlxs_stream s);

int mlxs_round(mlxs_array* out, mlxs_array a, int decimals, mlxs_stream s);
int mlxs_where(mlxs_array* out, mlxs_array cond, mlxs_array x, mlxs_array y, mlxs_stream s);
/* a_min / a_max optional. */
int mlxs_clip(mlxs_array* out, mlxs_array a, mlxs_array a_min, mlxs_array a_max, mlxs_stream s);
int mlxs_nan_to_num(mlxs_array* out, mlxs_array a, float nan, bool has_posinf, float posinf,
                    bool has_neginf, float neginf, mlxs_stream s);
int mlxs_isclose(mlxs_array* out, mlxs_array a, mlxs_array b, double rtol, double atol,
                 bool equal_nan, mlxs_stream s);
int mlxs_allclose(mlxs_array* out, mlxs_array a, mlxs_array b, double rtol, double atol,
                  bool equal_nan, mlxs_stream s);
int mlxs_array_equal(mlxs_array* out, mlxs_array a, mlxs_array b, bool equal_nan, mlxs_stream s);
/* On the CPU, matmul / addmm (alpha = beta = 1) of a [..., M, K] by a [K, N] of float32,
   bfloat16 or float16, and quantized_matmul of 4- / 8-bit affine weights, go through our
   primitives of MLX's arithmetic (cpu_gemv.cpp): same bits, faster.
   On or off (default on; MLX_FAST_CPU_GEMV=0 turns it off); how many products used it. */
void mlxs_set_fast_cpu_gemv(bool on);
bool mlxs_fast_cpu_gemv_enabled(void);
uint64_t mlxs_fast_cpu_gemv_uses(void);
/* residual + x @ wt (wt the transposed view of a weight W [N, K]): the same array as
   mlxs_add(residual, matmul(x, wt)), in one launch of our CUDA kernel of MLX's `gemv` and
   `add` arithmetic (fast_gemv.cpp) where it covers the call (the CUDA backend, one row of
   x, bfloat16 / float16 / float32, K a multiple of 128, at least
   MLX_FAST_GEMV_MIN_ELEMENTS weight elements, default 4M). */
int mlxs_matmul_add(mlxs_array* out, mlxs_array x, mlxs_array wt, mlxs_array residual,
                    mlxs_stream s);
/* mlx-lm's swiglu(g, u) of [g, u] = split(x @ wt, 2, -1), wt the transposed view of a
   fused [gate; up] weight: in *out with *taken true where one launch of that kernel covers
   the call, else *taken false and nothing in *out (the caller runs the product, the split
   and the compiled swiglu). */
int mlxs_matmul_swiglu(mlxs_array* out, bool* taken, mlxs_array x, mlxs_array wt,
                       mlxs_stream s);
/* Those kernels on or off (default on; MLX_FAST_GEMV=0 turns them off); how many products
   used them. */
void mlxs_set_fast_gemv(bool on);
bool mlxs_fast_gemv_enabled(void);
uint64_t mlxs_fast_gemv_launches(void);
/* The rows form of that kernel (fast_gemv.cpp): products of 2..8 rows of x (with or
   without the residual add or the swiglu) by one launch, each row with the one-row
   kernel's bits (MLX's `gemv`), the weight read once. Mode 0 off (the default), 1 every
   such product (one sequence's too: a speculative verification, a short prompt), 2 rows
   of several sequences only (x [B, 1, K]); MLX_FAST_GEMV_ROWS=1 / batch starts it on. */
void mlxs_set_fast_gemv_rows(int32_t mode);
int32_t mlxs_fast_gemv_rows_mode(void);
/* Attention of one query a row, q [B, Hq, 1, D] over k / v [B, Hkv, L, D], row b seeing
   the keys from left_padding[b] (int [B]) on, scaled by `scale`: in *out with *taken true
   where one launch of our CUDA kernel covers the call (fast_sdpa.cpp: the CUDA backend,
   bfloat16 / float16, D 64 or 128; not yet run on a device), else *taken false and nothing
   in *out. */
int mlxs_sdpa_padded(mlxs_array* out, bool* taken, mlxs_array q, mlxs_array k, mlxs_array v,
                     float scale, mlxs_array left_padding, mlxs_stream s);
uint64_t mlxs_sdpa_padded_launches(void);
/* `logits` [R, V] with each token whose bit is clear in `words` (uint32 [R, ceil(V/32)] or
   [R, ceil(V/32), 1]; bit v % 32 of word v / 32 allows token v) set to -inf, the others'
   bits kept (MLX's `where` over the expanded bits): in *out with *taken true where one
   launch of our CUDA kernel covers the call (fast_mask.cpp: the CUDA backend, a float
   dtype, MLX_FAST_MASK=1 or mlxs_set_fast_mask(true); off by default), else *taken false
   and nothing in *out. */
int mlxs_masked_logits(mlxs_array* out, bool* taken, mlxs_array words, mlxs_array logits,
                       mlxs_stream s);
void mlxs_set_fast_mask(bool on);
bool mlxs_fast_mask_enabled(void);
uint64_t mlxs_fast_mask_launches(void);
int mlxs_addmm(mlxs_array* out, mlxs_array c, mlxs_array a, mlxs_array b, float alpha,
               float beta, mlxs_stream s);
int mlxs_astype(mlxs_array* out, mlxs_array a, int32_t dtype, mlxs_stream s);
int mlxs_view(mlxs_array* out, mlxs_array a, int32_t dtype, mlxs_stream s);

/* ---------- reductions (axes == NULL: all axes) ---------- */
typedef enum {
  MLXS_SUM = 0, MLXS_MEAN, MLXS_MAX, MLXS_MIN, MLXS_PROD, MLXS_ALL, MLXS_ANY,
  MLXS_LOGSUMEXP,
} mlxs_reduce_op;
int mlxs_reduce(mlxs_array* out, int32_t op, mlxs_array a, const int32_t* axes, size_t naxes,
                bool keepdims, mlxs_stream s);
int mlxs_var(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool keepdims,
             int ddof, mlxs_stream s);
int mlxs_std(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool keepdims,
             int ddof, mlxs_stream s);
/* has_axis == false: over the flattened array. */
int mlxs_argmax(mlxs_array* out, mlxs_array a, bool has_axis, int axis, bool keepdims, mlxs_stream s);
int mlxs_argmin(mlxs_array* out, mlxs_array a, bool has_axis, int axis, bool keepdims, mlxs_stream s);
int mlxs_softmax(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool precise,
                 mlxs_stream s);

typedef enum { MLXS_CUMSUM = 0, MLXS_CUMPROD, MLXS_CUMMAX, MLXS_CUMMIN, MLXS_LOGCUMSUMEXP } mlxs_scan_op;
int mlxs_scan(mlxs_array* out, int32_t op, mlxs_array a, int axis, bool reverse, bool inclusive,
              mlxs_stream s);

/* ---------- sorting and selection (has_axis == false: flattened) ---------- */
int mlxs_sort(mlxs_array* out, mlxs_array a, bool has_axis, int axis, mlxs_stream s);
int mlxs_argsort(mlxs_array* out, mlxs_array a, bool has_axis, int axis, mlxs_stream s);
int mlxs_partition(mlxs_array* out, mlxs_array a, int kth, bool has_axis, int axis, mlxs_stream s);
int mlxs_argpartition(mlxs_array* out, mlxs_array a, int kth, bool has_axis, int axis, mlxs_stream s);
int mlxs_topk(mlxs_array* out, mlxs_array a, int k, bool has_axis, int axis, mlxs_stream s);

/* ---------- shapes ---------- */
int mlxs_reshape(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim, mlxs_stream s);
/* axes == NULL: reverse the axes. */
int mlxs_transpose(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s);
int mlxs_swapaxes(mlxs_array* out, mlxs_array a, int axis1, int axis2, mlxs_stream s);
int mlxs_moveaxis(mlxs_array* out, mlxs_array a, int source, int destination, mlxs_stream s);
int mlxs_expand_dims(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s);
/* axes == NULL: every axis of size one. */
int mlxs_squeeze(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s);
int mlxs_flatten(mlxs_array* out, mlxs_array a, int start_axis, int end_axis, mlxs_stream s);
int mlxs_unflatten(mlxs_array* out, mlxs_array a, int axis, const int32_t* shape, size_t ndim, mlxs_stream s);
int mlxs_concatenate(mlxs_array* out, mlxs_vec arrays, int axis, mlxs_stream s);
int mlxs_stack(mlxs_array* out, mlxs_vec arrays, int axis, mlxs_stream s);
int mlxs_split_sections(mlxs_vec* out, mlxs_array a, int num_splits, int axis, mlxs_stream s);
int mlxs_split_indices(mlxs_vec* out, mlxs_array a, const int32_t* indices, size_t n, int axis,
                       mlxs_stream s);
/* mode: "constant", "edge", "reflect" or "symmetric". */
int mlxs_pad(mlxs_array* out, mlxs_array a, const int32_t* axes, const int32_t* low,
             const int32_t* high, size_t n, mlxs_array pad_value, const char* mode, mlxs_stream s);
int mlxs_repeat(mlxs_array* out, mlxs_array a, int repeats, bool has_axis, int axis, mlxs_stream s);
int mlxs_tile(mlxs_array* out, mlxs_array a, const int32_t* reps, size_t n, mlxs_stream s);
int mlxs_broadcast_to(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim, mlxs_stream s);
int mlxs_broadcast_arrays(mlxs_vec* out, mlxs_vec arrays, mlxs_stream s);
int mlxs_flip(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s);
int mlxs_roll(mlxs_array* out, mlxs_array a, int shift, bool has_axis, int axis, mlxs_stream s);
int mlxs_as_strided(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim,
                    const int64_t* strides, size_t offset, mlxs_stream s);

/* ---------- indexing ---------- */
int mlxs_slice(mlxs_array* out, mlxs_array a, const int32_t* start, const int32_t* stop,
               const int32_t* strides, size_t ndim, mlxs_stream s);
int mlxs_slice_dynamic(mlxs_array* out, mlxs_array a, mlxs_array start, const int32_t* axes,
                       size_t naxes, const int32_t* slice_size, size_t ndim, mlxs_stream s);
int mlxs_slice_update(mlxs_array* out, mlxs_array src, mlxs_array update, const int32_t* start,
                      const int32_t* stop, const int32_t* strides, size_t ndim, mlxs_stream s);
int mlxs_slice_update_dynamic(mlxs_array* out, mlxs_array src, mlxs_array update, mlxs_array start,
                              const int32_t* axes, size_t naxes, mlxs_stream s);
/* has_axis == false: index the flattened array. */
int mlxs_take(mlxs_array* out, mlxs_array a, mlxs_array indices, bool has_axis, int axis, mlxs_stream s);
int mlxs_take_along_axis(mlxs_array* out, mlxs_array a, mlxs_array indices, int axis, mlxs_stream s);
int mlxs_put_along_axis(mlxs_array* out, mlxs_array a, mlxs_array indices, mlxs_array values,
                        int axis, mlxs_stream s);
int mlxs_gather(mlxs_array* out, mlxs_array a, mlxs_vec indices, const int32_t* axes, size_t naxes,
                const int32_t* slice_sizes, size_t nsizes, mlxs_stream s);
typedef enum { MLXS_SCATTER = 0, MLXS_SCATTER_ADD, MLXS_SCATTER_PROD, MLXS_SCATTER_MAX, MLXS_SCATTER_MIN } mlxs_scatter_op;
int mlxs_scatter(mlxs_array* out, int32_t op, mlxs_array a, mlxs_vec indices, mlxs_array updates,
                 const int32_t* axes, size_t naxes, mlxs_stream s);
int mlxs_masked_scatter(mlxs_array* out, mlxs_array a, mlxs_array mask, mlxs_array src, mlxs_stream s);

/* ---------- construction ---------- */
int mlxs_arange(mlxs_array* out, double start, double stop, double step, int32_t dtype, mlxs_stream s);
int mlxs_zeros(mlxs_array* out, const int32_t* shape, size_t ndim, int32_t dtype, mlxs_stream s);
int mlxs_ones(mlxs_array* out, const int32_t* shape, size_t ndim, int32_t dtype, mlxs_stream s);
int mlxs_full(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_array value, int32_t dtype,
              mlxs_stream s);
int mlxs_eye(mlxs_array* out, int n, int m, int k, int32_t dtype, mlxs_stream s);
int mlxs_tri(mlxs_array* out, int n, int m, int k, int32_t dtype, mlxs_stream s);
int mlxs_tril(mlxs_array* out, mlxs_array a, int k, mlxs_stream s);
int mlxs_triu(mlxs_array* out, mlxs_array a, int k, mlxs_stream s);
int mlxs_linspace(mlxs_array* out, double start, double stop, int num, int32_t dtype, mlxs_stream s);
int mlxs_diag(mlxs_array* out, mlxs_array a, int k, mlxs_stream s);
int mlxs_diagonal(mlxs_array* out, mlxs_array a, int offset, int axis1, int axis2, mlxs_stream s);
int mlxs_trace(mlxs_array* out, mlxs_array a, int offset, int axis1, int axis2, int32_t dtype, mlxs_stream s);
int mlxs_einsum(mlxs_array* out, const char* subscripts, mlxs_vec operands, mlxs_stream s);
int mlxs_hadamard_transform(mlxs_array* out, mlxs_array a, bool has_scale, float scale, mlxs_stream s);
int mlxs_conv1d(mlxs_array* out, mlxs_array input, mlxs_array weight, int stride, int padding,
                int dilation, int groups, mlxs_stream s);
int mlxs_conv2d(mlxs_array* out, mlxs_array input, mlxs_array weight, const int32_t* stride,
                const int32_t* padding, const int32_t* dilation, int groups, mlxs_stream s);
/* `inputs` unchanged, but evaluated only after `dependencies` (mx.depends). */
int mlxs_depends(mlxs_vec* out, mlxs_vec inputs, mlxs_vec dependencies);
/* Writes the unevaluated graph behind `outputs` as Graphviz dot (mx.export_to_dot). */
int mlxs_export_to_dot(const char* path, mlxs_vec outputs);

/* ---------- fast ---------- */
int mlxs_fast_rms_norm(mlxs_array* out, mlxs_array x, mlxs_array weight, float eps, mlxs_stream s);
/* Cross-entropy of `logits` [..., V] against integer `targets` [...]: one fused kernel on GPU
   backends (float32 accumulation); MLX composes it from ops elsewhere. */
int mlxs_fast_cross_entropy(mlxs_array* out, mlxs_array logits, mlxs_array targets, mlxs_stream s);
int mlxs_fast_layer_norm(mlxs_array* out, mlxs_array x, mlxs_array weight, mlxs_array bias,
                         float eps, mlxs_stream s);
/* has_base == false: freqs must be given. */
int mlxs_fast_rope(mlxs_array* out, mlxs_array x, int dims, bool traditional, bool has_base,
                   float base, float scale, int offset, mlxs_array freqs, mlxs_stream s);
int mlxs_fast_rope_dynamic(mlxs_array* out, mlxs_array x, int dims, bool traditional, bool has_base,
                           float base, float scale, mlxs_array offset, mlxs_array freqs, mlxs_stream s);
/* mask_mode: "" or "causal" (or "array" with mask). mask and sinks optional. */
int mlxs_fast_sdpa(mlxs_array* out, mlxs_array q, mlxs_array k, mlxs_array v, float scale,
                   const char* mask_mode, mlxs_array mask, mlxs_array sinks, mlxs_stream s);

/* Custom kernels (fast.metal_kernel / fast.cuda_kernel). backend: 0 metal, 1 cuda. */
int mlxs_kernel_new(mlxs_kernel* out, int backend, const char* name, const char* const* input_names,
                    size_t n_inputs, const char* const* output_names, size_t n_outputs,
                    const char* source, const char* header, bool ensure_row_contiguous,
                    bool atomic_outputs, int shared_memory);
void mlxs_kernel_free(mlxs_kernel k);
/* output_shapes: flattened, with output_ndims[i] dims for output i.
 * template args: names, kinds (0 int, 1 bool, 2 dtype), values. */
int mlxs_kernel_apply(mlxs_vec* out, mlxs_kernel k, mlxs_vec inputs, const int32_t* output_shapes,
                      const size_t* output_ndims, const int32_t* output_dtypes, size_t n_outputs,
                      const int32_t* grid, const int32_t* threadgroup,
                      const char* const* tmpl_names, const int32_t* tmpl_kinds,
                      const int32_t* tmpl_values, size_t n_tmpl, bool has_init, float init_value,
                      bool verbose, mlxs_stream s);

/* ---------- quantization ---------- */
/* group_size / bits <= 0 mean "the mode's default"; global_scale optional. */
int mlxs_quantize(mlxs_vec* out, mlxs_array w, int group_size, int bits, const char* mode,
                  mlxs_array global_scale, mlxs_stream s);
/* biases, global_scale optional; dtype < 0: default. */
int mlxs_dequantize(mlxs_array* out, mlxs_array w, mlxs_array scales, mlxs_array biases,
                    int group_size, int bits, const char* mode, mlxs_array global_scale,
                    int32_t dtype, mlxs_stream s);
/* On the CUDA backend, one-row bfloat16 x 4-bit affine products that MLX runs through its
   `qmv` kernel go through our faster kernels of the same arithmetic (fast_qmv.cpp), and
   products of 2..MLX_FAST_QMM_MAX_ROWS (32) rows of such an x through our multi-row kernel,
   each row of which is bit-identical to that row's one-row product (not to MLX's own
   kernel for many rows). */
int mlxs_quantized_matmul(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                          mlxs_array biases, bool transpose, int group_size, int bits,
                          const char* mode, mlxs_stream s);
/* quantized_matmul(x, ws[i], scales[i], biases[i], transpose=true) for every i (biases
   empty: none), the same arrays as one call each; on the CUDA backend one-row products go
   through one launch of those kernels for all of them where each would take them alone
   (MLX_FAST_QMV_MANY=0: one launch each). */
/* add(residual, quantized_matmul(x, w, scales, biases, transpose=true)): the same array;
   on the CUDA backend (unless mlxs_set_fast_qmv_residual(false) or
   MLX_FAST_QMV_RESIDUAL=0), a one-row product our kernels take does the add in the same
   launch. */
int mlxs_quantized_matmul_add(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                              mlxs_array biases, mlxs_array residual, int group_size, int bits,
                              const char* mode, mlxs_stream s);
int mlxs_quantized_matmul_many(mlxs_vec* out, mlxs_array x, mlxs_vec ws, mlxs_vec scales,
                               mlxs_vec biases, int group_size, int bits, const char* mode,
                               mlxs_stream s);
/* Those kernels on or off (default on; the environment variable MLX_FAST_QMV=0 turns them
   off). */
void mlxs_set_fast_qmv(bool on);
/* Our CUDA kernel for mlxs_dequantize of 4-bit affine weights to bfloat16 (MLX's values
   bit for bit; the dequantized dense product uses it too) on or off (default on;
   MLX_FAST_DEQUANT=0 turns it off). */
void mlxs_set_fast_dequant(bool on);
/* How many dequantizations have been built with it in this process. */
uint64_t mlxs_fast_dequant_launches(void);
/* Our CUDA kernels compiled into MLX's PTX disk cache (MLX_PTX_CACHE_DIR, else
   <tmp>/mlx/<version>/ptx) the first time a machine needs them, and loaded from there by
   every later process, on or off (default on; MLX_FAST_KERNEL_CACHE=0 turns it off:
   MLX then compiles them in every process). */
void mlxs_set_kernel_cache(bool on);
/* Kernels this process compiled into the cache, and kernels it found there. */
uint64_t mlxs_kernel_cache_compiles(void);
uint64_t mlxs_kernel_cache_hits(void);
/* One launch for several weights in quantized_matmul_many on or off (default on;
   MLX_FAST_QMV_MANY=0 turns it off). */
void mlxs_set_fast_qmv_many(bool on);
/* The residual add of mlxs_quantized_matmul_add in our kernel on or off (default on). */
void mlxs_set_fast_qmv_residual(bool on);
/* mlx-lm's swiglu(x @ ws[0].T, x @ ws[1].T) of a gate/up pair: one array in *out, from
   one launch of our kernels (the same bits as MLX's quantized_matmul and compiled swiglu),
   where that launch covers the call (the CUDA backend, a one-row bfloat16 x, affine 4-bit
   weights of one shape that quantized_matmul_many would run as one launch); else the two
   products, as mlxs_quantized_matmul_many gives them, for the caller's swiglu. */
int mlxs_quantized_swiglu(mlxs_vec* out, mlxs_array x, mlxs_vec ws, mlxs_vec scales,
                          mlxs_vec biases, int group_size, int bits, const char* mode,
                          mlxs_stream s);
/* That launch on or off (default on; MLX_FAST_QMV_SWIGLU=0 turns it off). */
void mlxs_set_fast_qmv_swiglu(bool on);
void mlxs_set_fast_qmv_norm(bool on);
uint64_t mlxs_fast_qmv_norm_launches(void);
/* Weights of fewer than n elements stay on MLX's kernels (default 0, or
   MLX_FAST_QMV_MIN_ELEMENTS). */
void mlxs_set_fast_qmv_min_elements(int64_t n);
bool mlxs_fast_qmv_enabled(void);
/* How many products have been built with it in this process. */
uint64_t mlxs_fast_qmv_launches(void);
/* The multi-row kernel on or off (default on; MLX_FAST_QMM=0 turns it off; it also needs
   mlxs_set_fast_qmv on). */
void mlxs_set_fast_qmm(bool on);
/* The most rows of x it takes (default 32, or MLX_FAST_QMM_MAX_ROWS); more go to MLX. */
void mlxs_set_fast_qmm_max_rows(int64_t n);
/* Rows of the weight one warp of it computes: 0 (the default, or MLX_FAST_QMM_WARP_ROWS):
   2 where the grid stays large enough, else 1; or 1, 2, 4 (other values: 0). The same
   bits, another speed. */
void mlxs_set_fast_qmm_warp_rows(int n);
bool mlxs_fast_qmm_enabled(void);
/* How many products have been built with the multi-row kernel in this process. */
uint64_t mlxs_fast_qmm_launches(void);
/* The tensor-core form of the multi-row product (fp32 sums in another order: not MLX's
   bits; docs/parity.md): 0 off (each row keeps its one-row bits), 1 on (the default;
   MLX_FAST_QMM_MMA=0 or force at start sets another) for rows of several sequences from
   MLX_FAST_QMM_MMA_MIN_ROWS (2) rows (up to MLX_FAST_QMM_MMA_MAX_ROWS, no bound by
   default), 2 forced for every product of 2 or more rows (the quality gate's setting).
   Other values are clamped to 0..2. */
void mlxs_set_fast_qmm_mma(int mode);
int mlxs_fast_qmm_mma_mode(void);
/* How many products have been built with it in this process. */
uint64_t mlxs_fast_qmm_mma_launches(void);
/* Our tiled CUDA kernel for 4-bit products of 33 or more rows, of MLX's `qmm_sm80` bits
   (fast_qmm.cpp): on unless MLX_FAST_QGEMM=0; the products built with it in this
   process. */
void mlxs_set_fast_qgemm(bool on);
uint64_t mlxs_fast_qgemm_launches(void);
/* Its gathered forms for mixture-of-experts products (gather_qmm with one expert index a
   row of x, 8 rows or more): on unless MLX_FAST_QGEMM_GATHER=0; the products built with
   them in this process. */
void mlxs_set_fast_gather_qgemm(bool on);
uint64_t mlxs_fast_gather_qgemm_launches(void);
int mlxs_gather_qmm(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                    mlxs_array biases, mlxs_array lhs_indices, mlxs_array rhs_indices,
                    bool transpose, int group_size, int bits, const char* mode,
                    bool sorted_indices, mlxs_stream s);
int mlxs_gather_mm(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_array lhs_indices,
                   mlxs_array rhs_indices, bool sorted_indices, mlxs_stream s);
int mlxs_to_fp8(mlxs_array* out, mlxs_array x, mlxs_stream s);
int mlxs_from_fp8(mlxs_array* out, mlxs_array x, int32_t dtype, mlxs_stream s);

/* ---------- random (key optional) ---------- */
int mlxs_random_seed(uint64_t seed);
int mlxs_random_key(mlxs_array* out, uint64_t seed);
int mlxs_random_split(mlxs_array* out, mlxs_array key, int num, mlxs_stream s);
int mlxs_random_bits(mlxs_array* out, const int32_t* shape, size_t ndim, int width, mlxs_array key,
                     mlxs_stream s);
int mlxs_random_uniform(mlxs_array* out, mlxs_array low, mlxs_array high, const int32_t* shape,
                        size_t ndim, int32_t dtype, mlxs_array key, mlxs_stream s);
/* loc, scale optional. */
int mlxs_random_normal(mlxs_array* out, const int32_t* shape, size_t ndim, int32_t dtype,
                       mlxs_array loc, mlxs_array scale, mlxs_array key, mlxs_stream s);
int mlxs_random_randint(mlxs_array* out, mlxs_array low, mlxs_array high, const int32_t* shape,
                        size_t ndim, int32_t dtype, mlxs_array key, mlxs_stream s);
int mlxs_random_bernoulli(mlxs_array* out, mlxs_array p, const int32_t* shape, size_t ndim,
                          mlxs_array key, mlxs_stream s);
int mlxs_random_gumbel(mlxs_array* out, const int32_t* shape, size_t ndim, int32_t dtype,
                       mlxs_array key, mlxs_stream s);
/* num_samples <= 0: one sample per distribution (the axis is removed). */
int mlxs_random_categorical(mlxs_array* out, mlxs_array logits, int axis, int num_samples,
                            mlxs_array key, mlxs_stream s);
int mlxs_random_truncated_normal(mlxs_array* out, mlxs_array lower, mlxs_array upper,
                                 const int32_t* shape, size_t ndim, int32_t dtype, mlxs_array key,
                                 mlxs_stream s);
int mlxs_random_permutation(mlxs_array* out, mlxs_array x, int axis, mlxs_array key, mlxs_stream s);
/* A random permutation of arange(n), as uint32 (Python's `permutation(int)`). */
int mlxs_random_permutation_n(mlxs_array* out, int n, mlxs_array key, mlxs_stream s);
/* The calling thread's global key sequence: a copy of it (`save`), put back (`restore`),
   copied, freed. A sequence of draws can so keep its own keys (a seeded request). */
int mlxs_random_state_save(mlxs_keyseq* out);
int mlxs_random_state_restore(mlxs_keyseq state);
int mlxs_keyseq_clone(mlxs_keyseq* out, mlxs_keyseq state);
void mlxs_keyseq_free(mlxs_keyseq state);
/* The next key of this thread's global key sequence (what a draw without a key uses). */
int mlxs_random_next_key(mlxs_array* out);

/* ---------- linalg ---------- */
/* ord_kind: 0 default (Frobenius / 2-norm), 1 numeric ord, 2 string ord. axes NULL: all. */
int mlxs_linalg_norm(mlxs_array* out, mlxs_array a, int ord_kind, double ord, const char* ord_str,
                     const int32_t* axes, size_t naxes, bool keepdims, mlxs_stream s);
int mlxs_linalg_qr(mlxs_array* q, mlxs_array* r, mlxs_array a, mlxs_stream s);
int mlxs_linalg_svd(mlxs_vec* out, mlxs_array a, bool compute_uv, mlxs_stream s);
int mlxs_linalg_inv(mlxs_array* out, mlxs_array a, mlxs_stream s);
int mlxs_linalg_pinv(mlxs_array* out, mlxs_array a, mlxs_stream s);
int mlxs_linalg_cholesky(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s);
int mlxs_linalg_cholesky_inv(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s);
int mlxs_linalg_tri_inv(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s);
int mlxs_linalg_solve(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_stream s);
int mlxs_linalg_solve_triangular(mlxs_array* out, mlxs_array a, mlxs_array b, bool upper, mlxs_stream s);
int mlxs_linalg_eigh(mlxs_array* w, mlxs_array* v, mlxs_array a, const char* uplo, mlxs_stream s);

/* ---------- transforms ---------- */
int mlxs_eval(mlxs_vec arrays);
int mlxs_async_eval(mlxs_vec arrays);

/* A function from arrays to arrays implemented by the caller. It reads
 * `inputs`, pushes its results into `outputs` and returns 0; on failure it
 * calls mlxs_set_last_error and returns non-zero. `payload` is released with
 * `dtor` when the last closure using it is freed. */
typedef int (*mlxs_closure_fn)(void* payload, mlxs_vec inputs, mlxs_vec outputs);
int mlxs_closure_new(mlxs_closure* out, mlxs_closure_fn fn, void* payload, void (*dtor)(void*));
void mlxs_closure_free(mlxs_closure c);
int mlxs_closure_apply(mlxs_vec* out, mlxs_closure c, mlxs_vec inputs);
int mlxs_compile(mlxs_closure* out, mlxs_closure c, bool shapeless);
int mlxs_checkpoint(mlxs_closure* out, mlxs_closure c);
/* 0 disabled, 1 no_simplify, 2 no_fuse, 3 enabled */
int mlxs_set_compile_mode(int mode);
int mlxs_vjp(mlxs_vec* outputs, mlxs_vec* vjps, mlxs_closure c, mlxs_vec primals, mlxs_vec cotangents);
int mlxs_jvp(mlxs_vec* outputs, mlxs_vec* jvps, mlxs_closure c, mlxs_vec primals, mlxs_vec tangents);
/* The closure's first output must be a scalar. */
int mlxs_value_and_grad(mlxs_vec* values, mlxs_vec* grads, mlxs_closure c, mlxs_vec inputs,
                        const int32_t* argnums, size_t nargnums);

#ifdef __cplusplus
}
#endif
#endif
