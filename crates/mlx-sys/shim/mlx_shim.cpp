// mlx_shim.cpp: implementation of mlx_shim.h over MLX's C++ API.
// Entry points that run MLX operations catch all exceptions and turn them into a
// status code plus a per-thread message, so nothing from MLX unwinds into Rust.
// The handle and container helpers that allocate (mlxs_array_clone, mlxs_vec_*,
// mlxs_map_*, mlxs_strmap_*, mlxs_gguf_meta_array) are guarded too: they return a status
// (or a null handle with the message set), so even std::bad_alloc never unwinds into Rust.
// Only accessors that return a pointer into an existing container (keys, lengths) are
// left unguarded, and mlxs_array_assign (a shared-pointer copy): they cannot throw.
#include "mlx_shim.h"

#include "affine_operands.h"
#include "cpu_gemv.h"
#include "fast_gemv.h"
#include "fast_mask.h"
#include "fast_sdpa.h"
#include "fast_qmm.h"
#include "fast_qmv.h"
#include "kernel_cache.h"
#include "kernel_switch.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "mlx/backend/cuda/cuda.h"
#include "mlx/compile_impl.h"
#include "mlx/einsum.h"
#include "mlx/graph_utils.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlx/scheduler.h"
#include "mlx/version.h"

namespace mx = mlx::core;

struct mlxs_array_s {
  mx::array a;
};
struct mlxs_vec_s {
  std::vector<mx::array> v;
};
struct mlxs_map_s {
  std::vector<std::pair<std::string, mx::array>> items;
};
struct mlxs_strmap_s {
  std::vector<std::pair<std::string, std::string>> items;
};
struct mlxs_gguf_meta_s {
  std::vector<std::pair<std::string, mx::GGUFMetaData>> items;
};
using ArrayFn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;
struct mlxs_closure_s {
  ArrayFn fn;
  bool compiled = false;
};
struct mlxs_kernel_s {
  mx::fast::CustomKernelFunction fn;
};
struct mlxs_keyseq_s {
  mx::random::KeySequence ks;
};

namespace {

thread_local std::string g_last_error;

mlxs_array wrap(mx::array a) {
  return new mlxs_array_s{std::move(a)};
}
const mx::array& A(mlxs_array a) {
  if (a == nullptr) throw std::invalid_argument("null array handle");
  return a->a;
}
std::optional<mx::array> OPT(mlxs_array a) {
  if (a == nullptr) return std::nullopt;
  return a->a;
}

mx::Dtype to_dtype(int32_t d) {
  switch (d) {
    case MLXS_BOOL: return mx::bool_;
    case MLXS_UINT8: return mx::uint8;
    case MLXS_UINT16: return mx::uint16;
    case MLXS_UINT32: return mx::uint32;
    case MLXS_UINT64: return mx::uint64;
    case MLXS_INT8: return mx::int8;
    case MLXS_INT16: return mx::int16;
    case MLXS_INT32: return mx::int32;
    case MLXS_INT64: return mx::int64;
    case MLXS_FLOAT16: return mx::float16;
    case MLXS_FLOAT32: return mx::float32;
    case MLXS_FLOAT64: return mx::float64;
    case MLXS_BFLOAT16: return mx::bfloat16;
    case MLXS_COMPLEX64: return mx::complex64;
    default: throw std::invalid_argument("unknown dtype code " + std::to_string(d));
  }
}
int32_t from_dtype(mx::Dtype d) {
  switch (d.val()) {
    case mx::Dtype::Val::bool_: return MLXS_BOOL;
    case mx::Dtype::Val::uint8: return MLXS_UINT8;
    case mx::Dtype::Val::uint16: return MLXS_UINT16;
    case mx::Dtype::Val::uint32: return MLXS_UINT32;
    case mx::Dtype::Val::uint64: return MLXS_UINT64;
    case mx::Dtype::Val::int8: return MLXS_INT8;
    case mx::Dtype::Val::int16: return MLXS_INT16;
    case mx::Dtype::Val::int32: return MLXS_INT32;
    case mx::Dtype::Val::int64: return MLXS_INT64;
    case mx::Dtype::Val::float16: return MLXS_FLOAT16;
    case mx::Dtype::Val::float32: return MLXS_FLOAT32;
    case mx::Dtype::Val::float64: return MLXS_FLOAT64;
    case mx::Dtype::Val::bfloat16: return MLXS_BFLOAT16;
    case mx::Dtype::Val::complex64: return MLXS_COMPLEX64;
  }
  return -1;
}

mx::Device to_device(mlxs_device d) {
  return mx::Device(d.type == MLXS_GPU ? mx::Device::gpu : mx::Device::cpu, d.index);
}
mlxs_device from_device(const mx::Device& d) {
  return mlxs_device{d.type == mx::Device::gpu ? MLXS_GPU : MLXS_CPU, d.index};
}
mx::StreamOrDevice S(mlxs_stream s) {
  switch (s.kind) {
    case 1: return to_device(s.device);
    case 2: return mx::Stream(s.index, to_device(s.device));
    default: return {};
  }
}
mlxs_stream from_stream(const mx::Stream& s) {
  return mlxs_stream{2, s.index, from_device(s.device)};
}

mx::Shape SH(const int32_t* p, size_t n) {
  return mx::Shape(p, p + n);
}
std::vector<int> AX(const int32_t* p, size_t n) {
  return std::vector<int>(p, p + n);
}
std::vector<int> all_axes(const mx::array& a) {
  std::vector<int> v(a.ndim());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(i);
  return v;
}
std::optional<int> OPTI(int v) {
  if (v <= 0) return std::nullopt;
  return v;
}

template <typename F>
int guard(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return 1;
  } catch (...) {
    g_last_error = "unknown C++ exception in MLX";
    return 1;
  }
}

mlxs_vec wrapv(std::vector<mx::array> v) {
  return new mlxs_vec_s{std::move(v)};
}

// Buffers for host data made into arrays (mlxs_array_from_data) on the CUDA backend.
// MLX's allocator serves a host allocation from any cached buffer of a close size, device
// memory included, and then swaps that buffer for new managed memory with a synchronous
// copy (cudaMallocManaged and cudaMemcpy, every time it happens): a batch's grammar masks
// (0.5 MB at 32 rows of a 128k vocabulary), uploaded at every decoding step, paid it on
// most steps (the sampling graph's host time 1.1-1.5 ms against 0.13-0.16 ms with this
// pool, H200, benchmarks/GPU.md session 20; a 128-byte upload at every step met the same
// swap). Host uploads keep buffers of their own instead: taken from MLX (managed memory
// from then on), given back to this pool when their array is freed (after the device is
// done with it: MLX holds each kernel's inputs until the kernel completes, and never
// donates a buffer it does not own), at most kHostPoolBytes kept. Scalars (8 bytes or
// less) stay MLX's: its allocator keeps them in managed memory anyway. Mode:
// MLX_HOST_BUFFER_POOL=0 off, 1 on every backend (for tests), else on where CUDA is
// available; `mlxs_set_host_buffer_pool` sets it.
//
// Managed memory migrates to whichever processor touched it last: a kept buffer the
// device read at one step sits in device memory when the host writes the next step's
// data into it, and the host's write faults the pages back one 64 KiB block at a time
// (the sampling graph of one constrained row, 16 KiB of mask, cost ~110 us of host time
// against ~20 us for its operations; 32 rows' 0.5 MB ~700 us: benchmarks/GPU.md session
// 22). So each buffer the pool takes from MLX is advised to live on the host and to be
// mapped for the device (`cuMemAdvise`: preferred location host, accessed by device 0,
// as MLX advises its own pool of scalars), and the advice is withdrawn before a buffer
// goes back to MLX, whose cache may hand it to the device's own outputs. Only buffers of
// up to kMaxBytes: larger host data (a tensor built on the host, a big batch) is read by
// the device more than once and is better moved there.
// MLX_HOST_BUFFER_ADVISE=0 leaves the pool's buffers to migrate (for A/B runs).
class ManagedAdvice {
 public:
  static constexpr size_t kMaxBytes = size_t{4} << 20;
  // Advises (or, with `on` false, stops advising) `nbytes` at `ptr` to stay on the host.
  void apply(void* ptr, size_t nbytes, bool on) {
    if (nbytes > kMaxBytes || !load()) return;
    auto dptr = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr));
    // CU_MEM_ADVISE_SET_PREFERRED_LOCATION 3 / UNSET 4, SET_ACCESSED_BY 5 / UNSET 6.
    const int preferred = on ? 3 : 4, accessed = on ? 5 : 6;
    int rc = 0;
    if (v2_ != nullptr) {
      // CUmemLocation: CU_MEM_LOCATION_TYPE_DEVICE 1, CU_MEM_LOCATION_TYPE_HOST 2.
      rc |= v2_(dptr, nbytes, preferred, Location{2, 0});
      rc |= v2_(dptr, nbytes, accessed, Location{1, 0});
    } else {
      // CU_DEVICE_CPU is -1.
      rc |= v1_(dptr, nbytes, preferred, -1);
      rc |= v1_(dptr, nbytes, accessed, 0);
    }
    if (rc == 0 && on) advised_.fetch_add(1, std::memory_order_relaxed);
  }
  unsigned long long advised() const { return advised_.load(std::memory_order_relaxed); }

 private:
  struct Location {
    int type;
    int id;
  };
  using V2 = int (*)(unsigned long long, size_t, int, Location);
  using V1 = int (*)(unsigned long long, size_t, int, int);
  // The driver's entry points, from the libcuda MLX has loaded (none on other backends).
  bool load() {
    std::call_once(once_, [this] {
      const char* e = std::getenv("MLX_HOST_BUFFER_ADVISE");
      if (e != nullptr && std::strcmp(e, "0") == 0) return;
      if (!mx::cu::is_available()) return;
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
      if (lib == nullptr) return;
      v2_ = reinterpret_cast<V2>(dlsym(lib, "cuMemAdvise_v2"));
      if (v2_ == nullptr) v1_ = reinterpret_cast<V1>(dlsym(lib, "cuMemAdvise"));
    });
    return v2_ != nullptr || v1_ != nullptr;
  }
  std::once_flag once_;
  V2 v2_ = nullptr;
  V1 v1_ = nullptr;
  std::atomic<unsigned long long> advised_{0};
};

ManagedAdvice& managed_advice() {
  static ManagedAdvice* advice = new ManagedAdvice;
  return *advice;
}

class HostPool {
 public:
  static constexpr size_t kHostPoolBytes = size_t{64} << 20;
  // Scalars (8 bytes or less) stay MLX's.
  static constexpr size_t kScalarBytes = 8;
  // MLX's rounding: powers of two below its 16 KiB page, whole pages above.
  static size_t size_class(size_t n) {
    constexpr size_t kPage = 16384;
    if (n >= kPage) return (n + kPage - 1) / kPage * kPage;
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
  }
  bool on() {
    int m = mode_.load(std::memory_order_relaxed);
    if (m < 0) {
      const char* e = std::getenv("MLX_HOST_BUFFER_POOL");
      m = e != nullptr && std::strcmp(e, "0") == 0   ? 0
          : e != nullptr && std::strcmp(e, "1") == 0 ? 1
                                                     : (mx::cu::is_available() ? 1 : 0);
      mode_.store(m, std::memory_order_relaxed);
    }
    return m == 1;
  }
  void set(int mode) { mode_.store(mode, std::memory_order_relaxed); }
  mx::allocator::Buffer take(size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        mx::allocator::Buffer b = it->second.back();
        it->second.pop_back();
        bytes_ -= cls;
        reuses_.fetch_add(1, std::memory_order_relaxed);
        return b;
      }
    }
    mx::allocator::Buffer b = mx::allocator::allocator().malloc(cls);
    // raw_ptr() first: a device buffer from MLX's cache becomes managed memory here.
    managed_advice().apply(b.raw_ptr(), cls, true);
    return b;
  }
  void give(mx::allocator::Buffer b, size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (bytes_ + cls <= kHostPoolBytes) {
        free_[cls].push_back(b);
        bytes_ += cls;
        return;
      }
    }
    release(b, cls);
  }
  unsigned long long reuses() const { return reuses_.load(std::memory_order_relaxed); }
  // Gives every kept buffer back to MLX.
  void drain() {
    std::map<size_t, std::vector<mx::allocator::Buffer>> kept;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kept.swap(free_);
      bytes_ = 0;
    }
    for (auto& [cls, bufs] : kept) {
      for (auto& b : bufs) release(b, cls);
    }
  }

 private:
  // Back to MLX, without the advice (its cache may give the buffer to the device).
  static void release(mx::allocator::Buffer b, size_t cls) {
    managed_advice().apply(b.raw_ptr(), cls, false);
    mx::allocator::allocator().free(b);
  }
  std::atomic<int> mode_{-1};
  std::mutex mu_;
  std::map<size_t, std::vector<mx::allocator::Buffer>> free_;
  size_t bytes_ = 0;
  std::atomic<unsigned long long> reuses_{0};
};

// Never destroyed: arrays freed while the process exits still give their buffers back.
HostPool& host_pool() {
  static HostPool* pool = new HostPool;
  return *pool;
}

// A buffer for `nbytes` of host data: from the pool where it is on, else MLX's malloc.
mx::allocator::Data host_buffer(size_t nbytes) {
  HostPool& pool = host_pool();
  if (nbytes <= HostPool::kScalarBytes || !pool.on()) return mx::allocator::malloc(nbytes);
  const size_t cls = HostPool::size_class(nbytes);
  return mx::allocator::Data(pool.take(cls),
                             [cls](mx::allocator::Buffer b) { host_pool().give(b, cls); });
}

// `shape` as MLX's, checked to hold `nbytes` bytes of `dt` (`what`: the bytes' name).
mx::Shape host_shape(const int32_t* shape, size_t ndim, mx::Dtype dt, size_t nbytes,
                            const char* what) {
  auto sh = SH(shape, ndim);
  size_t n = 1;
  for (auto d : sh) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape");
    n *= static_cast<size_t>(d);
  }
  if (n * dt.size() != nbytes) {
    throw std::invalid_argument(std::string(what) + " has " + std::to_string(nbytes) +
                                " bytes but shape needs " + std::to_string(n * dt.size()));
  }
  return sh;
}

}  // namespace

#define OUT1(expr) return guard([&] { *out = wrap(expr); })

extern "C" {

/* ---------- errors, version ---------- */
const char* mlxs_last_error(void) { return g_last_error.c_str(); }
void mlxs_set_last_error(const char* msg) { g_last_error = msg ? msg : ""; }
const char* mlxs_version(void) {
  static std::string v = mx::version();
  return v.c_str();
}

/* ---------- devices and streams ---------- */
int mlxs_default_device(mlxs_device* out) {
  return guard([&] { *out = from_device(mx::default_device()); });
}
int mlxs_set_default_device(mlxs_device d) {
  return guard([&] { mx::set_default_device(to_device(d)); });
}
int mlxs_device_is_available(mlxs_device d, bool* out) {
  return guard([&] { *out = mx::is_available(to_device(d)); });
}
int mlxs_device_count(int32_t type, int* out) {
  return guard([&] {
    *out = mx::device_count(type == MLXS_GPU ? mx::Device::gpu : mx::Device::cpu);
  });
}
int mlxs_default_stream(mlxs_device d, mlxs_stream* out) {
  return guard([&] { *out = from_stream(mx::default_stream(to_device(d))); });
}
int mlxs_new_stream(mlxs_device d, mlxs_stream* out) {
  return guard([&] { *out = from_stream(mx::new_stream(to_device(d))); });
}
int mlxs_set_default_stream(mlxs_stream s) {
  return guard([&] { mx::set_default_stream(mx::Stream(s.index, to_device(s.device))); });
}
int mlxs_synchronize(mlxs_stream s) {
  return guard([&] {
    if (s.kind == 2) {
      mx::synchronize(mx::Stream(s.index, to_device(s.device)));
    } else {
      mx::synchronize();
    }
  });
}

/* ---------- array lifecycle and data ---------- */
void mlxs_array_free(mlxs_array a) { delete a; }
mlxs_array mlxs_array_clone(mlxs_array a) {
  mlxs_array out = nullptr;
  if (a && guard([&] { out = wrap(a->a); }) != 0) return nullptr;
  return out;
}
void mlxs_array_assign(mlxs_array dst, mlxs_array src) {
  if (dst && src) dst->a = src->a;
}

int mlxs_array_from_data(mlxs_array* out, const void* data, size_t nbytes, const int32_t* shape,
                         size_t ndim, int32_t dtype) {
  return guard([&] {
    auto dt = to_dtype(dtype);
    auto sh = host_shape(shape, ndim, dt, nbytes, "data");
    auto buf = host_buffer(std::max<size_t>(nbytes, 1));
    if (nbytes > 0) std::memcpy(buf.buffer().raw_ptr(), data, nbytes);
    *out = wrap(mx::array(std::move(buf), std::move(sh), dt));
  });
}
int mlxs_array_from_fill(mlxs_array* out, size_t nbytes, const int32_t* shape, size_t ndim,
                         int32_t dtype, void** data) {
  return guard([&] {
    auto dt = to_dtype(dtype);
    auto sh = host_shape(shape, ndim, dt, nbytes, "buffer");
    auto buf = host_buffer(std::max<size_t>(nbytes, 1));
    void* ptr = buf.buffer().raw_ptr();
    std::memset(ptr, 0, nbytes);
    *out = wrap(mx::array(std::move(buf), std::move(sh), dt));
    *data = ptr;
  });
}
int mlxs_array_from_f64(mlxs_array* out, double v, int32_t dtype) {
  OUT1(mx::array(v, to_dtype(dtype)));
}
int mlxs_array_from_i64(mlxs_array* out, int64_t v, int32_t dtype) {
  OUT1(mx::array(v, to_dtype(dtype)));
}
int mlxs_array_from_bool(mlxs_array* out, bool v) { OUT1(mx::array(v)); }
size_t mlxs_array_ndim(mlxs_array a) { return a->a.ndim(); }
const int32_t* mlxs_array_shape(mlxs_array a) { return a->a.shape().data(); }
int32_t mlxs_array_dtype(mlxs_array a) { return from_dtype(a->a.dtype()); }
size_t mlxs_array_size(mlxs_array a) { return a->a.size(); }
bool mlxs_array_is_available(mlxs_array a) { return a->a.is_available(); }
size_t mlxs_array_nbytes(mlxs_array a) { return a->a.nbytes(); }
size_t mlxs_array_itemsize(mlxs_array a) { return a->a.itemsize(); }
int mlxs_array_eval(mlxs_array a) {
  return guard([&] { a->a.eval(); });
}
int mlxs_array_read(mlxs_array a, void* dst, size_t nbytes) {
  return guard([&] {
    // Fast path: an evaluated row-contiguous array is read in place, with no new op
    // (a new op would run on the default stream and wait on the array's own stream).
    mx::array arr = A(a);
    arr.eval();
    auto c = arr.flags().row_contiguous ? arr : mx::contiguous(arr);
    c.eval();
    if (c.nbytes() != nbytes) {
      throw std::invalid_argument("read buffer has " + std::to_string(nbytes) +
                                  " bytes, array has " + std::to_string(c.nbytes()));
    }
    if (nbytes > 0) std::memcpy(dst, c.data<char>(), nbytes);
  });
}
int mlxs_array_repr(mlxs_array a, char** out) {
  return guard([&] {
    std::ostringstream os;
    os << A(a);
    auto s = os.str();
    char* p = static_cast<char*>(std::malloc(s.size() + 1));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, s.c_str(), s.size() + 1);
    *out = p;
  });
}
void mlxs_string_free(char* s) { std::free(s); }

/* ---------- vectors ---------- */
int mlxs_vec_new(mlxs_vec* out) {
  return guard([&] { *out = new mlxs_vec_s{}; });
}
void mlxs_vec_free(mlxs_vec v) { delete v; }
int mlxs_vec_push(mlxs_vec v, mlxs_array a) {
  return guard([&] { v->v.push_back(a->a); });
}
size_t mlxs_vec_len(mlxs_vec v) { return v->v.size(); }
int mlxs_vec_get(mlxs_vec v, size_t i, mlxs_array* out) {
  return guard([&] {
    if (i >= v->v.size()) throw std::out_of_range("array list index out of range");
    *out = wrap(v->v[i]);
  });
}

/* ---------- maps ---------- */
int mlxs_map_new(mlxs_map* out) {
  return guard([&] { *out = new mlxs_map_s{}; });
}
void mlxs_map_free(mlxs_map m) { delete m; }
int mlxs_map_insert(mlxs_map m, const char* key, mlxs_array a) {
  return guard([&] { m->items.emplace_back(key, a->a); });
}
size_t mlxs_map_len(mlxs_map m) { return m->items.size(); }
const char* mlxs_map_key(mlxs_map m, size_t i) { return m->items[i].first.c_str(); }
int mlxs_map_value(mlxs_map m, size_t i, mlxs_array* out) {
  return guard([&] {
    if (i >= m->items.size()) throw std::out_of_range("array map index out of range");
    *out = wrap(m->items[i].second);
  });
}
int mlxs_strmap_new(mlxs_strmap* out) {
  return guard([&] { *out = new mlxs_strmap_s{}; });
}
void mlxs_strmap_free(mlxs_strmap m) { delete m; }
int mlxs_strmap_insert(mlxs_strmap m, const char* key, const char* value) {
  return guard([&] { m->items.emplace_back(key, value); });
}
size_t mlxs_strmap_len(mlxs_strmap m) { return m->items.size(); }
const char* mlxs_strmap_key(mlxs_strmap m, size_t i) { return m->items[i].first.c_str(); }
const char* mlxs_strmap_value(mlxs_strmap m, size_t i) { return m->items[i].second.c_str(); }

/* ---------- gguf metadata ---------- */
void mlxs_gguf_meta_free(mlxs_gguf_meta m) { delete m; }
size_t mlxs_gguf_meta_len(mlxs_gguf_meta m) { return m->items.size(); }
const char* mlxs_gguf_meta_key(mlxs_gguf_meta m, size_t i) { return m->items[i].first.c_str(); }
int32_t mlxs_gguf_meta_kind(mlxs_gguf_meta m, size_t i) {
  const auto& v = m->items[i].second;
  if (std::holds_alternative<mx::array>(v)) return 1;
  if (std::holds_alternative<std::string>(v)) return 2;
  if (std::holds_alternative<std::vector<std::string>>(v)) return 3;
  return 0;
}
int mlxs_gguf_meta_array(mlxs_gguf_meta m, size_t i, mlxs_array* out) {
  return guard([&] {
    const auto* p = std::get_if<mx::array>(&m->items.at(i).second);
    if (!p) throw std::invalid_argument("GGUF metadata value is not an array");
    *out = wrap(*p);
  });
}
const char* mlxs_gguf_meta_string(mlxs_gguf_meta m, size_t i) {
  const auto* p = std::get_if<std::string>(&m->items[i].second);
  return p ? p->c_str() : nullptr;
}
size_t mlxs_gguf_meta_strings_len(mlxs_gguf_meta m, size_t i) {
  const auto* p = std::get_if<std::vector<std::string>>(&m->items[i].second);
  return p ? p->size() : 0;
}
const char* mlxs_gguf_meta_strings_get(mlxs_gguf_meta m, size_t i, size_t j) {
  const auto* p = std::get_if<std::vector<std::string>>(&m->items[i].second);
  return (p && j < p->size()) ? (*p)[j].c_str() : nullptr;
}

int mlxs_gguf_meta_new(mlxs_gguf_meta* out) {
  return guard([&] { *out = new mlxs_gguf_meta_s{}; });
}
int mlxs_gguf_meta_push_array(mlxs_gguf_meta m, const char* key, mlxs_array a) {
  return guard([&] { m->items.emplace_back(key, mx::GGUFMetaData(a->a)); });
}
int mlxs_gguf_meta_push_string(mlxs_gguf_meta m, const char* key, const char* s, size_t len) {
  return guard([&] { m->items.emplace_back(key, mx::GGUFMetaData(std::string(s, len))); });
}
int mlxs_gguf_meta_push_strings(mlxs_gguf_meta m, const char* key, const char* const* strs,
                                const size_t* lens, size_t n) {
  return guard([&] {
    std::vector<std::string> v;
    v.reserve(n);
    for (size_t i = 0; i < n; ++i) v.emplace_back(strs[i], lens[i]);
    m->items.emplace_back(key, mx::GGUFMetaData(std::move(v)));
  });
}

/* ---------- io ---------- */
int mlxs_load_safetensors(const char* path, mlxs_stream s, mlxs_map* arrays, mlxs_strmap* meta) {
  return guard([&] {
    auto [arrs, md] = mx::load_safetensors(std::string(path), S(s));
    auto m = std::make_unique<mlxs_map_s>();
    for (auto& kv : arrs) m->items.emplace_back(kv.first, kv.second);
    std::sort(m->items.begin(), m->items.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    auto sm = std::make_unique<mlxs_strmap_s>();
    for (auto& kv : md) sm->items.emplace_back(kv.first, kv.second);
    std::sort(sm->items.begin(), sm->items.end());
    *arrays = m.release();
    *meta = sm.release();
  });
}
int mlxs_save_safetensors(const char* path, mlxs_map arrays, mlxs_strmap meta) {
  return guard([&] {
    std::unordered_map<std::string, mx::array> arrs;
    for (auto& kv : arrays->items) arrs.insert_or_assign(kv.first, kv.second);
    std::unordered_map<std::string, std::string> md;
    if (meta) {
      for (auto& kv : meta->items) md[kv.first] = kv.second;
    }
    mx::save_safetensors(std::string(path), std::move(arrs), std::move(md));
  });
}
int mlxs_load_gguf(const char* path, mlxs_stream s, mlxs_map* arrays, mlxs_gguf_meta* meta) {
  return guard([&] {
    auto [arrs, md] = mx::load_gguf(std::string(path), S(s));
    auto m = std::make_unique<mlxs_map_s>();
    for (auto& kv : arrs) m->items.emplace_back(kv.first, kv.second);
    std::sort(m->items.begin(), m->items.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    auto gm = std::make_unique<mlxs_gguf_meta_s>();
    for (auto& kv : md) gm->items.emplace_back(kv.first, kv.second);
    std::sort(gm->items.begin(), gm->items.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    *arrays = m.release();
    *meta = gm.release();
  });
}
int mlxs_save_gguf(const char* path, mlxs_map arrays, mlxs_gguf_meta meta) {
  return guard([&] {
    // emplace in order, like nanobind's dict caster in mx.save_gguf: the iteration order
    // of the unordered maps (and so the file's layout) follows from the insertion order.
    std::unordered_map<std::string, mx::array> arrs;
    for (auto& kv : arrays->items) arrs.emplace(kv.first, kv.second);
    std::unordered_map<std::string, mx::GGUFMetaData> md;
    if (meta) {
      for (auto& kv : meta->items) md.emplace(kv.first, kv.second);
    }
    mx::save_gguf(std::string(path), arrs, md);
  });
}
int mlxs_load_npy(const char* path, mlxs_stream s, mlxs_array* out) {
  OUT1(mx::load(std::string(path), S(s)));
}
int mlxs_save_npy(const char* path, mlxs_array a) {
  return guard([&] { mx::save(std::string(path), A(a)); });
}

/* ---------- memory ---------- */
size_t mlxs_get_active_memory(void) { return mx::get_active_memory(); }
size_t mlxs_get_peak_memory(void) { return mx::get_peak_memory(); }
size_t mlxs_get_cache_memory(void) { return mx::get_cache_memory(); }
void mlxs_reset_peak_memory(void) { mx::reset_peak_memory(); }
int mlxs_set_memory_limit(size_t limit, size_t* previous) {
  return guard([&] { *previous = mx::set_memory_limit(limit); });
}
int mlxs_set_cache_limit(size_t limit, size_t* previous) {
  return guard([&] { *previous = mx::set_cache_limit(limit); });
}
int mlxs_set_wired_limit(size_t limit, size_t* previous) {
  return guard([&] { *previous = mx::set_wired_limit(limit); });
}
void mlxs_clear_cache(void) {
  host_pool().drain();
  mx::clear_cache();
}

/* ---------- element-wise ---------- */
int mlxs_unary(mlxs_array* out, int32_t op, mlxs_array a_, mlxs_stream s_) {
  return guard([&] {
    const auto& a = A(a_);
    auto s = S(s_);
    mx::array r = [&]() -> mx::array {
      switch (op) {
        case MLXS_ABS: return mx::abs(a, s);
        case MLXS_NEGATIVE: return mx::negative(a, s);
        case MLXS_SIGN: return mx::sign(a, s);
        case MLXS_FLOOR: return mx::floor(a, s);
        case MLXS_CEIL: return mx::ceil(a, s);
        case MLXS_SQRT: return mx::sqrt(a, s);
        case MLXS_RSQRT: return mx::rsqrt(a, s);
        case MLXS_SQUARE: return mx::square(a, s);
        case MLXS_RECIPROCAL: return mx::reciprocal(a, s);
        case MLXS_EXP: return mx::exp(a, s);
        case MLXS_EXPM1: return mx::expm1(a, s);
        case MLXS_LOG: return mx::log(a, s);
        case MLXS_LOG1P: return mx::log1p(a, s);
        case MLXS_LOG2: return mx::log2(a, s);
        case MLXS_LOG10: return mx::log10(a, s);
        case MLXS_SIN: return mx::sin(a, s);
        case MLXS_COS: return mx::cos(a, s);
        case MLXS_TAN: return mx::tan(a, s);
        case MLXS_ARCSIN: return mx::arcsin(a, s);
        case MLXS_ARCCOS: return mx::arccos(a, s);
        case MLXS_ARCTAN: return mx::arctan(a, s);
        case MLXS_SINH: return mx::sinh(a, s);
        case MLXS_COSH: return mx::cosh(a, s);
        case MLXS_TANH: return mx::tanh(a, s);
        case MLXS_ARCSINH: return mx::arcsinh(a, s);
        case MLXS_ARCCOSH: return mx::arccosh(a, s);
        case MLXS_ARCTANH: return mx::arctanh(a, s);
        case MLXS_SIGMOID: return mx::sigmoid(a, s);
        case MLXS_ERF: return mx::erf(a, s);
        case MLXS_ERFINV: return mx::erfinv(a, s);
        case MLXS_LOGICAL_NOT: return mx::logical_not(a, s);
        case MLXS_BITWISE_INVERT: return mx::bitwise_invert(a, s);
        case MLXS_ISNAN: return mx::isnan(a, s);
        case MLXS_ISINF: return mx::isinf(a, s);
        case MLXS_ISFINITE: return mx::isfinite(a, s);
        case MLXS_ISPOSINF: return mx::isposinf(a, s);
        case MLXS_ISNEGINF: return mx::isneginf(a, s);
        case MLXS_STOP_GRADIENT: return mx::stop_gradient(a, s);
        case MLXS_COPY: return mx::copy(a, s);
        case MLXS_REAL: return mx::real(a, s);
        case MLXS_IMAG: return mx::imag(a, s);
        case MLXS_CONJUGATE: return mx::conjugate(a, s);
        case MLXS_DEGREES: return mx::degrees(a, s);
        case MLXS_RADIANS: return mx::radians(a, s);
        case MLXS_TRUNC: return mx::trunc(a, s);
        case MLXS_CONTIGUOUS: return mx::contiguous(a, false, s);
        default: throw std::invalid_argument("unknown unary op " + std::to_string(op));
      }
    }();
    *out = wrap(std::move(r));
  });
}

namespace {
// `a @ b` as the shim builds every matmul: our CPU product of MLX's arithmetic where it
// applies (cpu_gemv.cpp), else MLX's.
mx::array matmul_of(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  auto fast = mlxs_detail::try_cpu_gemv(a, b, std::nullopt, s);
  if (!fast) fast = mlxs_detail::try_fast_gemv_rows(a, b, s);
  return fast ? std::move(*fast) : mx::matmul(a, b, s);
}
}  // namespace

int mlxs_binary(mlxs_array* out, int32_t op, mlxs_array a_, mlxs_array b_, mlxs_stream s_) {
  return guard([&] {
    const auto& a = A(a_);
    const auto& b = A(b_);
    auto s = S(s_);
    mx::array r = [&]() -> mx::array {
      switch (op) {
        case MLXS_ADD: return mx::add(a, b, s);
        case MLXS_SUBTRACT: return mx::subtract(a, b, s);
        case MLXS_MULTIPLY: return mx::multiply(a, b, s);
        case MLXS_DIVIDE: return mx::divide(a, b, s);
        case MLXS_FLOOR_DIVIDE: return mx::floor_divide(a, b, s);
        case MLXS_REMAINDER: return mx::remainder(a, b, s);
        case MLXS_POWER: return mx::power(a, b, s);
        case MLXS_MAXIMUM: return mx::maximum(a, b, s);
        case MLXS_MINIMUM: return mx::minimum(a, b, s);
        case MLXS_EQUAL: return mx::equal(a, b, s);
        case MLXS_NOT_EQUAL: return mx::not_equal(a, b, s);
        case MLXS_GREATER: return mx::greater(a, b, s);
        case MLXS_GREATER_EQUAL: return mx::greater_equal(a, b, s);
        case MLXS_LESS: return mx::less(a, b, s);
        case MLXS_LESS_EQUAL: return mx::less_equal(a, b, s);
        case MLXS_LOGICAL_AND: return mx::logical_and(a, b, s);
        case MLXS_LOGICAL_OR: return mx::logical_or(a, b, s);
        case MLXS_BITWISE_AND: return mx::bitwise_and(a, b, s);
        case MLXS_BITWISE_OR: return mx::bitwise_or(a, b, s);
        case MLXS_BITWISE_XOR: return mx::bitwise_xor(a, b, s);
        case MLXS_LEFT_SHIFT: return mx::left_shift(a, b, s);
        case MLXS_RIGHT_SHIFT: return mx::right_shift(a, b, s);
        case MLXS_ARCTAN2: return mx::arctan2(a, b, s);
        case MLXS_LOGADDEXP: return mx::logaddexp(a, b, s);
        case MLXS_MATMUL: return matmul_of(a, b, s);
        case MLXS_INNER: return mx::inner(a, b, s);
        case MLXS_OUTER: return mx::outer(a, b, s);
        case MLXS_KRON: return mx::kron(a, b, s);
        default: throw std::invalid_argument("unknown binary op " + std::to_string(op));
      }
    }();
    *out = wrap(std::move(r));
  });
}

int mlxs_round(mlxs_array* out, mlxs_array a, int decimals, mlxs_stream s) {
  OUT1(mx::round(A(a), decimals, S(s)));
}
int mlxs_where(mlxs_array* out, mlxs_array c, mlxs_array x, mlxs_array y, mlxs_stream s) {
  OUT1(mx::where(A(c), A(x), A(y), S(s)));
}
int mlxs_clip(mlxs_array* out, mlxs_array a, mlxs_array lo, mlxs_array hi, mlxs_stream s) {
  OUT1(mx::clip(A(a), OPT(lo), OPT(hi), S(s)));
}
int mlxs_nan_to_num(mlxs_array* out, mlxs_array a, float nan, bool has_posinf, float posinf,
                    bool has_neginf, float neginf, mlxs_stream s) {
  OUT1(mx::nan_to_num(A(a), nan, has_posinf ? std::optional<float>(posinf) : std::nullopt,
                      has_neginf ? std::optional<float>(neginf) : std::nullopt, S(s)));
}
int mlxs_isclose(mlxs_array* out, mlxs_array a, mlxs_array b, double rtol, double atol,
                 bool equal_nan, mlxs_stream s) {
  OUT1(mx::isclose(A(a), A(b), rtol, atol, equal_nan, S(s)));
}
int mlxs_allclose(mlxs_array* out, mlxs_array a, mlxs_array b, double rtol, double atol,
                  bool equal_nan, mlxs_stream s) {
  OUT1(mx::allclose(A(a), A(b), rtol, atol, equal_nan, S(s)));
}
int mlxs_array_equal(mlxs_array* out, mlxs_array a, mlxs_array b, bool equal_nan, mlxs_stream s) {
  OUT1(mx::array_equal(A(a), A(b), equal_nan, S(s)));
}
int mlxs_addmm(mlxs_array* out, mlxs_array c, mlxs_array a, mlxs_array b, float alpha, float beta,
               mlxs_stream s) {
  return guard([&] {
    std::optional<mx::array> fast;
    if (alpha == 1.0f && beta == 1.0f) fast = mlxs_detail::try_cpu_gemv(A(a), A(b), A(c), S(s));
    *out = wrap(fast ? std::move(*fast) : mx::addmm(A(c), A(a), A(b), alpha, beta, S(s)));
  });
}
void mlxs_set_fast_cpu_gemv(bool on) { mlxs_detail::set_fast_cpu_gemv(on); }
bool mlxs_fast_cpu_gemv_enabled(void) { return mlxs_detail::fast_cpu_gemv_enabled(); }
uint64_t mlxs_fast_cpu_gemv_uses(void) { return mlxs_detail::fast_cpu_gemv_uses(); }
int mlxs_matmul_add(mlxs_array* out, mlxs_array x, mlxs_array wt, mlxs_array residual,
                    mlxs_stream s) {
  return guard([&] {
    auto fast = mlxs_detail::try_fast_gemv_add(A(x), A(wt), A(residual), S(s));
    // Else as mlxs_binary's MLXS_MATMUL and MLXS_ADD build them.
    if (!fast) fast = mx::add(A(residual), matmul_of(A(x), A(wt), S(s)), S(s));
    *out = wrap(std::move(*fast));
  });
}
int mlxs_matmul_swiglu(mlxs_array* out, bool* taken, mlxs_array x, mlxs_array wt,
                       mlxs_stream s) {
  return guard([&] {
    auto fast = mlxs_detail::try_fast_gemv_swiglu(A(x), A(wt), S(s));
    *taken = fast.has_value();
    if (fast) *out = wrap(std::move(*fast));
  });
}
void mlxs_set_fast_gemv(bool on) { mlxs_detail::set_fast_gemv(on); }
void mlxs_set_fast_gemv_rows(int32_t mode) { mlxs_detail::set_fast_gemv_rows(mode); }
int32_t mlxs_fast_gemv_rows_mode(void) { return mlxs_detail::fast_gemv_rows_mode(); }
bool mlxs_fast_gemv_enabled(void) { return mlxs_detail::fast_gemv_enabled(); }
uint64_t mlxs_fast_gemv_launches(void) { return mlxs_detail::fast_gemv_launches(); }
int mlxs_sdpa_padded(mlxs_array* out, bool* taken, mlxs_array q, mlxs_array k, mlxs_array v,
                     float scale, mlxs_array left_padding, mlxs_stream s) {
  return guard([&] {
    auto fast = mlxs_detail::try_sdpa_padded(A(q), A(k), A(v), scale, A(left_padding), S(s));
    *taken = fast.has_value();
    if (fast) *out = wrap(std::move(*fast));
  });
}
uint64_t mlxs_sdpa_padded_launches(void) { return mlxs_detail::sdpa_padded_launches(); }
int mlxs_masked_logits(mlxs_array* out, bool* taken, mlxs_array words, mlxs_array logits,
                       mlxs_stream s) {
  return guard([&] {
    auto fast = mlxs_detail::try_masked_logits(A(words), A(logits), S(s));
    *taken = fast.has_value();
    if (fast) *out = wrap(std::move(*fast));
  });
}
void mlxs_set_fast_mask(bool on) { mlxs_detail::set_fast_mask(on); }
bool mlxs_fast_mask_enabled(void) { return mlxs_detail::fast_mask_enabled(); }
uint64_t mlxs_fast_mask_launches(void) { return mlxs_detail::fast_mask_launches(); }
int mlxs_astype(mlxs_array* out, mlxs_array a, int32_t dtype, mlxs_stream s) {
  OUT1(mx::astype(A(a), to_dtype(dtype), S(s)));
}
int mlxs_view(mlxs_array* out, mlxs_array a, int32_t dtype, mlxs_stream s) {
  OUT1(mx::view(A(a), to_dtype(dtype), S(s)));
}

/* ---------- reductions ---------- */
int mlxs_reduce(mlxs_array* out, int32_t op, mlxs_array a_, const int32_t* axes_, size_t naxes,
                bool keepdims, mlxs_stream s_) {
  return guard([&] {
    const auto& a = A(a_);
    auto axes = axes_ ? AX(axes_, naxes) : all_axes(a);
    auto s = S(s_);
    mx::array r = [&]() -> mx::array {
      switch (op) {
        case MLXS_SUM: return mx::sum(a, axes, keepdims, s);
        case MLXS_MEAN: return mx::mean(a, axes, keepdims, s);
        case MLXS_MAX: return mx::max(a, axes, keepdims, s);
        case MLXS_MIN: return mx::min(a, axes, keepdims, s);
        case MLXS_PROD: return mx::prod(a, axes, keepdims, s);
        case MLXS_ALL: return mx::all(a, axes, keepdims, s);
        case MLXS_ANY: return mx::any(a, axes, keepdims, s);
        case MLXS_LOGSUMEXP: return mx::logsumexp(a, axes, keepdims, s);
        default: throw std::invalid_argument("unknown reduction " + std::to_string(op));
      }
    }();
    *out = wrap(std::move(r));
  });
}
int mlxs_var(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool keepdims,
             int ddof, mlxs_stream s) {
  OUT1(mx::var(A(a), axes ? AX(axes, naxes) : all_axes(A(a)), keepdims, ddof, S(s)));
}
int mlxs_std(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool keepdims,
             int ddof, mlxs_stream s) {
  OUT1(mx::std(A(a), axes ? AX(axes, naxes) : all_axes(A(a)), keepdims, ddof, S(s)));
}
int mlxs_argmax(mlxs_array* out, mlxs_array a, bool has_axis, int axis, bool keepdims, mlxs_stream s) {
  OUT1(has_axis ? mx::argmax(A(a), axis, keepdims, S(s)) : mx::argmax(A(a), keepdims, S(s)));
}
int mlxs_argmin(mlxs_array* out, mlxs_array a, bool has_axis, int axis, bool keepdims, mlxs_stream s) {
  OUT1(has_axis ? mx::argmin(A(a), axis, keepdims, S(s)) : mx::argmin(A(a), keepdims, S(s)));
}
int mlxs_softmax(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool precise,
                 mlxs_stream s) {
  OUT1(mx::softmax(A(a), axes ? AX(axes, naxes) : all_axes(A(a)), precise, S(s)));
}
int mlxs_scan(mlxs_array* out, int32_t op, mlxs_array a, int axis, bool reverse, bool inclusive,
              mlxs_stream s) {
  return guard([&] {
    switch (op) {
      case MLXS_CUMSUM: *out = wrap(mx::cumsum(A(a), axis, reverse, inclusive, S(s))); break;
      case MLXS_CUMPROD: *out = wrap(mx::cumprod(A(a), axis, reverse, inclusive, S(s))); break;
      case MLXS_CUMMAX: *out = wrap(mx::cummax(A(a), axis, reverse, inclusive, S(s))); break;
      case MLXS_CUMMIN: *out = wrap(mx::cummin(A(a), axis, reverse, inclusive, S(s))); break;
      case MLXS_LOGCUMSUMEXP:
        *out = wrap(mx::logcumsumexp(A(a), axis, reverse, inclusive, S(s)));
        break;
      default: throw std::invalid_argument("unknown scan " + std::to_string(op));
    }
  });
}

/* ---------- sorting ---------- */
int mlxs_sort(mlxs_array* out, mlxs_array a, bool has_axis, int axis, mlxs_stream s) {
  OUT1(has_axis ? mx::sort(A(a), axis, S(s)) : mx::sort(A(a), S(s)));
}
int mlxs_argsort(mlxs_array* out, mlxs_array a, bool has_axis, int axis, mlxs_stream s) {
  OUT1(has_axis ? mx::argsort(A(a), axis, S(s)) : mx::argsort(A(a), S(s)));
}
int mlxs_partition(mlxs_array* out, mlxs_array a, int kth, bool has_axis, int axis, mlxs_stream s) {
  OUT1(has_axis ? mx::partition(A(a), kth, axis, S(s)) : mx::partition(A(a), kth, S(s)));
}
int mlxs_argpartition(mlxs_array* out, mlxs_array a, int kth, bool has_axis, int axis,
                      mlxs_stream s) {
  OUT1(has_axis ? mx::argpartition(A(a), kth, axis, S(s)) : mx::argpartition(A(a), kth, S(s)));
}
int mlxs_topk(mlxs_array* out, mlxs_array a, int k, bool has_axis, int axis, mlxs_stream s) {
  OUT1(has_axis ? mx::topk(A(a), k, axis, S(s)) : mx::topk(A(a), k, S(s)));
}

/* ---------- shapes ---------- */
int mlxs_reshape(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim, mlxs_stream s) {
  OUT1(mx::reshape(A(a), SH(shape, ndim), S(s)));
}
int mlxs_transpose(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s) {
  OUT1(axes ? mx::transpose(A(a), AX(axes, naxes), S(s)) : mx::transpose(A(a), S(s)));
}
int mlxs_swapaxes(mlxs_array* out, mlxs_array a, int a1, int a2, mlxs_stream s) {
  OUT1(mx::swapaxes(A(a), a1, a2, S(s)));
}
int mlxs_moveaxis(mlxs_array* out, mlxs_array a, int src, int dst, mlxs_stream s) {
  OUT1(mx::moveaxis(A(a), src, dst, S(s)));
}
int mlxs_expand_dims(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s) {
  OUT1(mx::expand_dims(A(a), AX(axes, naxes), S(s)));
}
int mlxs_squeeze(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s) {
  OUT1(axes ? mx::squeeze(A(a), AX(axes, naxes), S(s)) : mx::squeeze(A(a), S(s)));
}
int mlxs_flatten(mlxs_array* out, mlxs_array a, int start, int end, mlxs_stream s) {
  OUT1(mx::flatten(A(a), start, end, S(s)));
}
int mlxs_unflatten(mlxs_array* out, mlxs_array a, int axis, const int32_t* shape, size_t ndim,
                   mlxs_stream s) {
  OUT1(mx::unflatten(A(a), axis, SH(shape, ndim), S(s)));
}
int mlxs_concatenate(mlxs_array* out, mlxs_vec arrays, int axis, mlxs_stream s) {
  OUT1(mx::concatenate(arrays->v, axis, S(s)));
}
int mlxs_stack(mlxs_array* out, mlxs_vec arrays, int axis, mlxs_stream s) {
  OUT1(mx::stack(arrays->v, axis, S(s)));
}
int mlxs_split_sections(mlxs_vec* out, mlxs_array a, int n, int axis, mlxs_stream s) {
  return guard([&] { *out = wrapv(mx::split(A(a), n, axis, S(s))); });
}
int mlxs_split_indices(mlxs_vec* out, mlxs_array a, const int32_t* idx, size_t n, int axis,
                       mlxs_stream s) {
  return guard([&] { *out = wrapv(mx::split(A(a), SH(idx, n), axis, S(s))); });
}
int mlxs_pad(mlxs_array* out, mlxs_array a, const int32_t* axes, const int32_t* low,
             const int32_t* high, size_t n, mlxs_array pad_value, const char* mode, mlxs_stream s) {
  return guard([&] {
    mx::array v = pad_value ? A(pad_value) : mx::array(0);
    *out = wrap(mx::pad(A(a), AX(axes, n), SH(low, n), SH(high, n), v,
                        mode ? std::string(mode) : std::string("constant"), S(s)));
  });
}
int mlxs_repeat(mlxs_array* out, mlxs_array a, int repeats, bool has_axis, int axis, mlxs_stream s) {
  OUT1(has_axis ? mx::repeat(A(a), repeats, axis, S(s)) : mx::repeat(A(a), repeats, S(s)));
}
int mlxs_tile(mlxs_array* out, mlxs_array a, const int32_t* reps, size_t n, mlxs_stream s) {
  OUT1(mx::tile(A(a), AX(reps, n), S(s)));
}
int mlxs_broadcast_to(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim, mlxs_stream s) {
  OUT1(mx::broadcast_to(A(a), SH(shape, ndim), S(s)));
}
int mlxs_broadcast_arrays(mlxs_vec* out, mlxs_vec arrays, mlxs_stream s) {
  return guard([&] { *out = wrapv(mx::broadcast_arrays(arrays->v, S(s))); });
}
int mlxs_flip(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s) {
  OUT1(mx::flip(A(a), axes ? AX(axes, naxes) : all_axes(A(a)), S(s)));
}
int mlxs_roll(mlxs_array* out, mlxs_array a, int shift, bool has_axis, int axis, mlxs_stream s) {
  OUT1(has_axis ? mx::roll(A(a), shift, axis, S(s)) : mx::roll(A(a), shift, S(s)));
}
int mlxs_as_strided(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim,
                    const int64_t* strides, size_t offset, mlxs_stream s) {
  OUT1(mx::as_strided(A(a), SH(shape, ndim), mx::Strides(strides, strides + ndim), offset, S(s)));
}

/* ---------- indexing ---------- */
int mlxs_slice(mlxs_array* out, mlxs_array a, const int32_t* start, const int32_t* stop,
               const int32_t* strides, size_t ndim, mlxs_stream s) {
  OUT1(mx::slice(A(a), SH(start, ndim), SH(stop, ndim), SH(strides, ndim), S(s)));
}
int mlxs_slice_dynamic(mlxs_array* out, mlxs_array a, mlxs_array start, const int32_t* axes,
                       size_t naxes, const int32_t* size, size_t ndim, mlxs_stream s) {
  OUT1(mx::slice(A(a), A(start), AX(axes, naxes), SH(size, ndim), S(s)));
}
int mlxs_slice_update(mlxs_array* out, mlxs_array src, mlxs_array upd, const int32_t* start,
                      const int32_t* stop, const int32_t* strides, size_t ndim, mlxs_stream s) {
  OUT1(mx::slice_update(A(src), A(upd), SH(start, ndim), SH(stop, ndim), SH(strides, ndim), S(s)));
}
int mlxs_slice_update_dynamic(mlxs_array* out, mlxs_array src, mlxs_array upd, mlxs_array start,
                              const int32_t* axes, size_t naxes, mlxs_stream s) {
  OUT1(mx::slice_update(A(src), A(upd), A(start), AX(axes, naxes), S(s)));
}
int mlxs_take(mlxs_array* out, mlxs_array a, mlxs_array idx, bool has_axis, int axis, mlxs_stream s) {
  OUT1(has_axis ? mx::take(A(a), A(idx), axis, S(s)) : mx::take(A(a), A(idx), S(s)));
}
int mlxs_take_along_axis(mlxs_array* out, mlxs_array a, mlxs_array idx, int axis, mlxs_stream s) {
  OUT1(mx::take_along_axis(A(a), A(idx), axis, S(s)));
}
int mlxs_put_along_axis(mlxs_array* out, mlxs_array a, mlxs_array idx, mlxs_array values, int axis,
                        mlxs_stream s) {
  OUT1(mx::put_along_axis(A(a), A(idx), A(values), axis, S(s)));
}
int mlxs_gather(mlxs_array* out, mlxs_array a, mlxs_vec indices, const int32_t* axes, size_t naxes,
                const int32_t* sizes, size_t nsizes, mlxs_stream s) {
  OUT1(mx::gather(A(a), indices->v, AX(axes, naxes), SH(sizes, nsizes), S(s)));
}
int mlxs_scatter(mlxs_array* out, int32_t op, mlxs_array a, mlxs_vec indices, mlxs_array updates,
                 const int32_t* axes, size_t naxes, mlxs_stream s) {
  return guard([&] {
    auto ax = AX(axes, naxes);
    switch (op) {
      case MLXS_SCATTER: *out = wrap(mx::scatter(A(a), indices->v, A(updates), ax, S(s))); break;
      case MLXS_SCATTER_ADD:
        *out = wrap(mx::scatter_add(A(a), indices->v, A(updates), ax, S(s)));
        break;
      case MLXS_SCATTER_PROD:
        *out = wrap(mx::scatter_prod(A(a), indices->v, A(updates), ax, S(s)));
        break;
      case MLXS_SCATTER_MAX:
        *out = wrap(mx::scatter_max(A(a), indices->v, A(updates), ax, S(s)));
        break;
      case MLXS_SCATTER_MIN:
        *out = wrap(mx::scatter_min(A(a), indices->v, A(updates), ax, S(s)));
        break;
      default: throw std::invalid_argument("unknown scatter op " + std::to_string(op));
    }
  });
}
int mlxs_masked_scatter(mlxs_array* out, mlxs_array a, mlxs_array mask, mlxs_array src, mlxs_stream s) {
  OUT1(mx::masked_scatter(A(a), A(mask), A(src), S(s)));
}

/* ---------- construction ---------- */
int mlxs_arange(mlxs_array* out, double start, double stop, double step, int32_t dtype, mlxs_stream s) {
  OUT1(mx::arange(start, stop, step, to_dtype(dtype), S(s)));
}
int mlxs_zeros(mlxs_array* out, const int32_t* shape, size_t ndim, int32_t dtype, mlxs_stream s) {
  OUT1(mx::zeros(SH(shape, ndim), to_dtype(dtype), S(s)));
}
int mlxs_ones(mlxs_array* out, const int32_t* shape, size_t ndim, int32_t dtype, mlxs_stream s) {
  OUT1(mx::ones(SH(shape, ndim), to_dtype(dtype), S(s)));
}
int mlxs_full(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_array v, int32_t dtype,
              mlxs_stream s) {
  OUT1(mx::full(SH(shape, ndim), A(v), to_dtype(dtype), S(s)));
}
int mlxs_eye(mlxs_array* out, int n, int m, int k, int32_t dtype, mlxs_stream s) {
  OUT1(mx::eye(n, m, k, to_dtype(dtype), S(s)));
}
int mlxs_tri(mlxs_array* out, int n, int m, int k, int32_t dtype, mlxs_stream s) {
  OUT1(mx::tri(n, m, k, to_dtype(dtype), S(s)));
}
int mlxs_tril(mlxs_array* out, mlxs_array a, int k, mlxs_stream s) { OUT1(mx::tril(A(a), k, S(s))); }
int mlxs_triu(mlxs_array* out, mlxs_array a, int k, mlxs_stream s) { OUT1(mx::triu(A(a), k, S(s))); }
int mlxs_linspace(mlxs_array* out, double start, double stop, int num, int32_t dtype, mlxs_stream s) {
  OUT1(mx::linspace(start, stop, num, to_dtype(dtype), S(s)));
}
int mlxs_diag(mlxs_array* out, mlxs_array a, int k, mlxs_stream s) { OUT1(mx::diag(A(a), k, S(s))); }
int mlxs_diagonal(mlxs_array* out, mlxs_array a, int offset, int a1, int a2, mlxs_stream s) {
  OUT1(mx::diagonal(A(a), offset, a1, a2, S(s)));
}
int mlxs_trace(mlxs_array* out, mlxs_array a, int offset, int a1, int a2, int32_t dtype, mlxs_stream s) {
  OUT1(mx::trace(A(a), offset, a1, a2, to_dtype(dtype), S(s)));
}
int mlxs_einsum(mlxs_array* out, const char* subscripts, mlxs_vec operands, mlxs_stream s) {
  OUT1(mx::einsum(std::string(subscripts), operands->v, S(s)));
}
int mlxs_hadamard_transform(mlxs_array* out, mlxs_array a, bool has_scale, float scale, mlxs_stream s) {
  OUT1(mx::hadamard_transform(A(a), has_scale ? std::optional<float>(scale) : std::nullopt, S(s)));
}
int mlxs_conv1d(mlxs_array* out, mlxs_array input, mlxs_array weight, int stride, int padding,
                int dilation, int groups, mlxs_stream s) {
  OUT1(mx::conv1d(A(input), A(weight), stride, padding, dilation, groups, S(s)));
}
int mlxs_conv2d(mlxs_array* out, mlxs_array input, mlxs_array weight, const int32_t* stride,
                const int32_t* padding, const int32_t* dilation, int groups, mlxs_stream s) {
  OUT1(mx::conv2d(A(input), A(weight), {stride[0], stride[1]}, {padding[0], padding[1]},
                  {dilation[0], dilation[1]}, groups, S(s)));
}

int mlxs_depends(mlxs_vec* out, mlxs_vec inputs, mlxs_vec dependencies) {
  return guard([&] { *out = wrapv(mx::depends(inputs->v, dependencies->v)); });
}
int mlxs_export_to_dot(const char* path, mlxs_vec outputs) {
  return guard([&] {
    std::ofstream f(path);
    if (!f) throw std::runtime_error(std::string("cannot open ") + path + " for writing");
    mx::export_to_dot(f, outputs->v);
    f.flush();
    if (!f) throw std::runtime_error(std::string("cannot write ") + path);
  });
}

/* ---------- fast ---------- */
int mlxs_fast_rms_norm(mlxs_array* out, mlxs_array x, mlxs_array w, float eps, mlxs_stream s) {
  OUT1(mx::fast::rms_norm(A(x), OPT(w), eps, S(s)));
}
int mlxs_fast_cross_entropy(mlxs_array* out, mlxs_array logits, mlxs_array targets, mlxs_stream s) {
  OUT1(mx::fast::cross_entropy(A(logits), A(targets), S(s)));
}
int mlxs_fast_layer_norm(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array b, float eps,
                         mlxs_stream s) {
  OUT1(mx::fast::layer_norm(A(x), OPT(w), OPT(b), eps, S(s)));
}
int mlxs_fast_rope(mlxs_array* out, mlxs_array x, int dims, bool traditional, bool has_base,
                   float base, float scale, int offset, mlxs_array freqs, mlxs_stream s) {
  OUT1(mx::fast::rope(A(x), dims, traditional, has_base ? std::optional<float>(base) : std::nullopt,
                      scale, offset, OPT(freqs), S(s)));
}
int mlxs_fast_rope_dynamic(mlxs_array* out, mlxs_array x, int dims, bool traditional, bool has_base,
                           float base, float scale, mlxs_array offset, mlxs_array freqs,
                           mlxs_stream s) {
  OUT1(mx::fast::rope(A(x), dims, traditional, has_base ? std::optional<float>(base) : std::nullopt,
                      scale, A(offset), OPT(freqs), S(s)));
}
int mlxs_fast_sdpa(mlxs_array* out, mlxs_array q, mlxs_array k, mlxs_array v, float scale,
                   const char* mask_mode, mlxs_array mask, mlxs_array sinks, mlxs_stream s) {
  OUT1(mx::fast::scaled_dot_product_attention(A(q), A(k), A(v), scale,
                                              mask_mode ? std::string(mask_mode) : std::string(),
                                              OPT(mask), OPT(sinks), false, S(s)));
}

int mlxs_kernel_new(mlxs_kernel* out, int backend, const char* name, const char* const* input_names,
                    size_t n_inputs, const char* const* output_names, size_t n_outputs,
                    const char* source, const char* header, bool ensure_row_contiguous,
                    bool atomic_outputs, int shared_memory) {
  return guard([&] {
    std::vector<std::string> ins(input_names, input_names + n_inputs);
    std::vector<std::string> outs(output_names, output_names + n_outputs);
    std::string hdr = header ? header : "";
    mx::fast::CustomKernelFunction fn;
    if (backend == 0) {
      fn = mx::fast::metal_kernel(name, ins, outs, source, hdr, ensure_row_contiguous,
                                  atomic_outputs);
    } else {
      fn = mx::fast::cuda_kernel(name, ins, outs, source, hdr, ensure_row_contiguous,
                                 shared_memory);
    }
    *out = new mlxs_kernel_s{std::move(fn)};
  });
}
void mlxs_kernel_free(mlxs_kernel k) { delete k; }
int mlxs_kernel_apply(mlxs_vec* out, mlxs_kernel k, mlxs_vec inputs, const int32_t* output_shapes,
                      const size_t* output_ndims, const int32_t* output_dtypes, size_t n_outputs,
                      const int32_t* grid, const int32_t* tg, const char* const* tmpl_names,
                      const int32_t* tmpl_kinds, const int32_t* tmpl_values, size_t n_tmpl,
                      bool has_init, float init_value, bool verbose, mlxs_stream s) {
  return guard([&] {
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    size_t off = 0;
    for (size_t i = 0; i < n_outputs; ++i) {
      shapes.push_back(SH(output_shapes + off, output_ndims[i]));
      off += output_ndims[i];
      dtypes.push_back(to_dtype(output_dtypes[i]));
    }
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs;
    for (size_t i = 0; i < n_tmpl; ++i) {
      mx::fast::TemplateArg v;
      switch (tmpl_kinds[i]) {
        case 0: v = static_cast<int>(tmpl_values[i]); break;
        case 1: v = tmpl_values[i] != 0; break;
        default: v = to_dtype(tmpl_values[i]); break;
      }
      targs.emplace_back(tmpl_names[i], v);
    }
    auto res = k->fn(inputs->v, shapes, dtypes, {grid[0], grid[1], grid[2]}, {tg[0], tg[1], tg[2]},
                     targs, has_init ? std::optional<float>(init_value) : std::nullopt, verbose,
                     S(s));
    *out = wrapv(std::move(res));
  });
}

/* ---------- quantization ---------- */
int mlxs_quantize(mlxs_vec* out, mlxs_array w, int group_size, int bits, const char* mode,
                  mlxs_array global_scale, mlxs_stream s) {
  return guard([&] {
    *out = wrapv(mx::quantize(A(w), OPTI(group_size), OPTI(bits), mode ? mode : "affine",
                              OPT(global_scale), S(s)));
  });
}
namespace {
// One dequantize: MLX's values through our CUDA kernel where it covers the call
// (fast_qmv.cpp), else MLX's.
mx::array dequantize_one(const mx::array& w, const mx::array& scales,
                         const std::optional<mx::array>& biases, std::optional<int> group_size,
                         std::optional<int> bits, const std::string& mode,
                         const std::optional<mx::array>& global_scale,
                         std::optional<mx::Dtype> dtype, mx::StreamOrDevice s) {
  if (!global_scale) {
    if (auto f = mlxs_detail::try_fast_dequantize(w, scales, biases, group_size, bits, mode,
                                                  dtype.value_or(scales.dtype()), s)) {
      return std::move(*f);
    }
  }
  return mx::dequantize(w, scales, biases, group_size, bits, mode, global_scale, dtype, s);
}
}  // namespace
int mlxs_dequantize(mlxs_array* out, mlxs_array w, mlxs_array scales, mlxs_array biases,
                    int group_size, int bits, const char* mode, mlxs_array global_scale,
                    int32_t dtype, mlxs_stream s) {
  return guard([&] {
    std::optional<mx::Dtype> dt;
    if (dtype >= 0) dt = to_dtype(dtype);
    *out = wrap(dequantize_one(A(w), A(scales), OPT(biases), OPTI(group_size), OPTI(bits),
                               mode ? mode : "affine", OPT(global_scale), dt, S(s)));
  });
}
namespace {
// Quantized products of many rows (prefill chunks, batched decoding) on the GPU: MLX
// 0.32.4's CUDA quantized matmul for more than one row (qmm) runs far below its dense GEMM
// (Llama-3.1-8B 4-bit decodes ~12x slower than bf16 at batch 32 and prefills ~2.8x
// slower), so the weight is dequantized to the activations' dtype (MLX's own `dequantize`,
// the values MLX's kernels compute inside) and multiplied by MLX's dense matmul. The sums
// are accumulated in another order than qmm's, so results round differently; one-row
// products (batch-1 decoding) never take this path and keep mlx-lm's bits. The quality
// gate (bins/tests/dequant_gemm.rs, and benchmarks/gpu_quality.sh on the H200) holds it to
// perplexity within 0.1% of the exact path and the same greedy tokens.
// Settings (MLX_DEQUANT_GEMM):
//   unset      on a CUDA GPU, products inside a gradient (a QLoRA training step: x is a tracer)
//              of rows of several sequences (x [B, L, K] with B > 1); one sequence's rows
//              and every inference product keep MLX's quantized matmul;
//   1          also every inference product of many rows on the GPU (opt-in: prefill of
//              one prompt);
//   force      every product of many rows, on the CPU too (for the quality gates);
//   0          MLX's quantized matmul everywhere (the exact path).
//   MLX_DEQUANT_GEMM_MIN_ROWS (2), MLX_DEQUANT_GEMM_MIN_ELEMENTS (16 Mi weight elements for
//                           inference products, none inside a gradient): products with
//                           fewer rows, or smaller weights, stay with MLX.
enum class DequantGemm { kTrain, kGpu, kForce, kOff };

DequantGemm dequant_gemm_mode() {
  static const std::optional<DequantGemm> m = []() -> std::optional<DequantGemm> {
    const char* v = std::getenv("MLX_DEQUANT_GEMM");
    if (v == nullptr || *v == '\0') return DequantGemm::kTrain;
    if (std::strcmp(v, "0") == 0) return DequantGemm::kOff;
    if (std::strcmp(v, "1") == 0) return DequantGemm::kGpu;
    if (std::strcmp(v, "force") == 0) return DequantGemm::kForce;
    return std::nullopt;
  }();
  if (!m) {
    throw std::invalid_argument("MLX_DEQUANT_GEMM must be 0, 1 or force (or unset), not \"" +
                                std::string(std::getenv("MLX_DEQUANT_GEMM")) + "\"");
  }
  return *m;
}

std::optional<mx::array> try_dequant_gemm(const mx::array& x, const mx::array& w,
                                          const mx::array& scales,
                                          const std::optional<mx::array>& biases,
                                          bool transpose, std::optional<int> group_size,
                                          std::optional<int> bits, const std::string& mode,
                                          mx::StreamOrDevice s) {
  const DequantGemm m = dequant_gemm_mode();
  if (m == DequantGemm::kOff || !transpose || mode != "affine") return std::nullopt;
  if (mlxs_detail::quantized_operands_traced(w, scales, biases)) return std::nullopt;
  if (x.ndim() < 2 || w.ndim() != 2) return std::nullopt;
  const mx::Dtype dt = x.dtype();
  if (dt != mx::bfloat16 && dt != mx::float16 && dt != mx::float32) return std::nullopt;
  const bool cpu = mx::to_stream(s).device == mx::Device::cpu;
  if (m != DequantGemm::kForce && cpu) return std::nullopt;
  const long long k = x.shape(-1);
  if (k <= 0) return std::nullopt;
  const long long rows = static_cast<long long>(x.size()) / k;
  if (m == DequantGemm::kTrain) {
    // Measured on CUDA only (MLX's Metal quantized products are another story).
    if (!mx::cu::is_available()) return std::nullopt;
    const long long seq = x.ndim() >= 3 ? x.shape(-2) : rows;
    if (!x.is_tracer() || seq <= 0 || rows / seq < 2) return std::nullopt;
  }
  static const long long min_rows = mlxs_detail::env_count("MLX_DEQUANT_GEMM_MIN_ROWS", 2);
  static const long long min_elements =
      mlxs_detail::env_count("MLX_DEQUANT_GEMM_MIN_ELEMENTS", 16ll << 20);
  static const long long min_elements_traced =
      mlxs_detail::env_count("MLX_DEQUANT_GEMM_MIN_ELEMENTS", 0);
  const long long elements = static_cast<long long>(w.shape(0)) * k;
  const long long floor = x.is_tracer() ? min_elements_traced : min_elements;
  if (rows < std::max(min_rows, 2ll) || elements < floor) return std::nullopt;
  // The weight is dequantized only once `after` is computed: the dequantized copies do not
  // depend on the activations, so MLX would otherwise schedule all of a forward's early
  // and hold them at once (on the H200, 8B 4-bit at batch 32 peaked at 24.7 GB, against
  // 9.6 GB for mlx-lm).
  auto dequantized = [=](const mx::array& w, const mx::array& scales,
                         const std::optional<mx::array>& biases, const mx::array& after) {
    auto gated = mx::depends({w}, {after});
    return dequantize_one(gated[0], scales, biases, group_size, bits, mode, std::nullopt, dt, s);
  };
  if (!x.is_tracer()) {
    return mx::matmul(x, mx::swapaxes(dequantized(w, scales, biases, x), -1, -2, s), s);
  }
  // Inside a gradient (a QLoRA training step): MLX's own derivative of the dense product
  // would keep every layer's dequantized weight alive from the forward to the backward
  // pass (16 GB for an 8B model). The derivative is written here instead: the weight is
  // dequantized again for the backward product, once its cotangent exists. The quantized
  // operands are constants here (checked above), so their gradients are never asked for.
  std::vector<mx::array> primals{x, w, scales};
  if (biases) primals.push_back(*biases);
  auto split = [](const std::vector<mx::array>& in) {
    return std::make_tuple(in[0], in[1], in[2],
                           in.size() > 3 ? std::make_optional(in[3]) : std::nullopt);
  };
  auto forward = [=](const std::vector<mx::array>& in) -> std::vector<mx::array> {
    auto [xi, wi, si, bi] = split(in);
    return {mx::matmul(xi, mx::swapaxes(dequantized(wi, si, bi, xi), -1, -2, s), s)};
  };
  auto backward = [=](const std::vector<mx::array>& in, const std::vector<mx::array>& cotan,
                      const std::vector<mx::array>&) -> std::vector<mx::array> {
    auto [xi, wi, si, bi] = split(in);
    std::vector<mx::array> grads{mx::matmul(cotan[0], dequantized(wi, si, bi, cotan[0]), s)};
    for (size_t i = 1; i < in.size(); ++i) grads.push_back(mx::zeros_like(in[i], s));
    return grads;
  };
  return mx::custom_vjp(forward, backward)(primals)[0];
}

// One quantized_matmul: our CUDA or CPU kernel where it covers the product (one row: MLX's
// bits; on CUDA, rows of several sequences: the tensor-core form; other products of
// 2..MLX_FAST_QMM_MAX_ROWS rows: each row's one-row bits), the dequantized dense product
// for more rows on the GPU (above, opt-in), our tiled kernel of MLX's `qmm_sm80` bits for
// the other products of 33 or more rows (fast_qmm.cpp), else MLX's.
mx::array quantized_matmul_one(const mx::array& x, const mx::array& w, const mx::array& scales,
                               const std::optional<mx::array>& biases, bool transpose,
                               std::optional<int> group_size, std::optional<int> bits,
                               const std::string& mode, mx::StreamOrDevice s) {
  auto fast = mlxs_detail::try_fast_qmv(x, w, scales, biases, transpose, group_size, bits, mode, s);
  if (!fast) {
    fast = try_dequant_gemm(x, w, scales, biases, transpose, group_size, bits, mode, s);
  }
  if (!fast) {
    fast = mlxs_detail::try_fast_qgemm(x, w, scales, biases, transpose, group_size, bits, mode, s);
  }
  if (!fast) {
    fast = mlxs_detail::try_cpu_qmv(x, w, scales, biases, transpose, group_size, bits, mode, s);
  }
  return fast ? std::move(*fast)
              : mx::quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode, s);
}
}  // namespace

int mlxs_quantized_matmul(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                          mlxs_array biases, bool transpose, int group_size, int bits,
                          const char* mode, mlxs_stream s) {
  return guard([&] {
    *out = wrap(quantized_matmul_one(A(x), A(w), A(scales), OPT(biases), transpose,
                                     OPTI(group_size), OPTI(bits), mode ? mode : "affine", S(s)));
  });
}
int mlxs_quantized_matmul_add(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                              mlxs_array biases, mlxs_array residual, int group_size, int bits,
                              const char* mode, mlxs_stream s) {
  return guard([&] {
    const std::string m = mode ? mode : "affine";
    auto fused = mlxs_detail::try_fast_qmv_add(A(x), A(w), A(scales), OPT(biases), A(residual),
                                               OPTI(group_size), OPTI(bits), m, S(s));
    *out = wrap(fused ? std::move(*fused)
                      : mx::add(A(residual),
                                quantized_matmul_one(A(x), A(w), A(scales), OPT(biases), true,
                                                     OPTI(group_size), OPTI(bits), m, S(s)),
                                S(s)));
  });
}
namespace {
// The biases of `ws` for the many-weight products: one per weight, or none at all.
std::vector<std::optional<mx::array>> biases_of(mlxs_vec ws, mlxs_vec scales, mlxs_vec biases,
                                                const char* op) {
  const size_t n = ws->v.size();
  if (scales->v.size() != n || (biases->v.size() != n && !biases->v.empty())) {
    throw std::invalid_argument(std::string("[") + op +
                                "] expected as many scales (and biases, if any) as weights");
  }
  std::vector<std::optional<mx::array>> bs;
  for (size_t i = 0; i < n; ++i) {
    bs.push_back(biases->v.empty() ? std::nullopt : std::make_optional(biases->v[i]));
  }
  return bs;
}

// x by every weight: one launch of our kernels where it covers them, else one product each.
std::vector<mx::array> many_products(const mx::array& x, const std::vector<mx::array>& ws,
                                     const std::vector<mx::array>& scales,
                                     const std::vector<std::optional<mx::array>>& bs,
                                     std::optional<int> group_size, std::optional<int> bits,
                                     const std::string& m, mx::StreamOrDevice s) {
  if (auto many = mlxs_detail::try_fast_qmv_many(x, ws, scales, bs, group_size, bits, m, s)) {
    return std::move(*many);
  }
  std::vector<mx::array> outs;
  for (size_t i = 0; i < ws.size(); ++i) {
    outs.push_back(
        quantized_matmul_one(x, ws[i], scales[i], bs[i], true, group_size, bits, m, s));
  }
  return outs;
}
}  // namespace

int mlxs_quantized_matmul_many(mlxs_vec* out, mlxs_array x, mlxs_vec ws, mlxs_vec scales,
                               mlxs_vec biases, int group_size, int bits, const char* mode,
                               mlxs_stream s) {
  return guard([&] {
    const auto bs = biases_of(ws, scales, biases, "quantized_matmul_many");
    *out = wrapv(many_products(A(x), ws->v, scales->v, bs, OPTI(group_size), OPTI(bits),
                               mode ? mode : "affine", S(s)));
  });
}
int mlxs_quantized_swiglu(mlxs_vec* out, mlxs_array x, mlxs_vec ws, mlxs_vec scales,
                          mlxs_vec biases, int group_size, int bits, const char* mode,
                          mlxs_stream s) {
  return guard([&] {
    if (ws->v.size() != 2) {
      throw std::invalid_argument("[quantized_swiglu] expected two weights (gate, up)");
    }
    const auto bs = biases_of(ws, scales, biases, "quantized_swiglu");
    const std::string m = mode ? mode : "affine";
    auto y = mlxs_detail::try_fast_qmv_swiglu(A(x), ws->v, scales->v, bs, OPTI(group_size),
                                              OPTI(bits), m, S(s));
    *out = wrapv(y ? std::vector<mx::array>{std::move(*y)}
                   : many_products(A(x), ws->v, scales->v, bs, OPTI(group_size), OPTI(bits), m,
                                   S(s)));
  });
}
void mlxs_set_fast_qmv(bool on) { mlxs_detail::set_fast_qmv(on); }
void mlxs_set_fast_dequant(bool on) { mlxs_detail::set_fast_dequant(on); }
uint64_t mlxs_fast_dequant_launches(void) { return mlxs_detail::fast_dequant_launches(); }
void mlxs_set_host_buffer_pool(int32_t mode) { host_pool().set(mode == 1 ? 1 : 0); }
uint64_t mlxs_host_buffer_pool_reuses(void) { return host_pool().reuses(); }
uint64_t mlxs_host_buffer_pool_advised(void) { return managed_advice().advised(); }
void mlxs_set_kernel_cache(bool on) { mlxs_detail::set_kernel_cache(on); }
uint64_t mlxs_kernel_cache_compiles(void) { return mlxs_detail::kernel_cache_compiles(); }
uint64_t mlxs_kernel_cache_hits(void) { return mlxs_detail::kernel_cache_hits(); }
void mlxs_set_fast_qmv_swiglu(bool on) { mlxs_detail::set_fast_qmv_swiglu(on); }
void mlxs_set_fast_qmv_norm(bool on) { mlxs_detail::set_fast_qmv_norm(on); }
uint64_t mlxs_fast_qmv_norm_launches(void) { return mlxs_detail::fast_qmv_norm_launches(); }
void mlxs_set_fast_qmv_min_elements(int64_t n) { mlxs_detail::set_fast_qmv_min_elements(n); }
void mlxs_set_fast_qmv_many(bool on) { mlxs_detail::set_fast_qmv_many(on); }
void mlxs_set_fast_qmv_residual(bool on) { mlxs_detail::set_fast_qmv_residual(on); }
bool mlxs_fast_qmv_enabled(void) { return mlxs_detail::fast_qmv_enabled(); }
uint64_t mlxs_fast_qmv_launches(void) { return mlxs_detail::fast_qmv_launches(); }
void mlxs_set_fast_qmm(bool on) { mlxs_detail::set_fast_qmm(on); }
void mlxs_set_fast_qmm_max_rows(int64_t n) { mlxs_detail::set_fast_qmm_max_rows(n); }
void mlxs_set_fast_qmm_warp_rows(int n) { mlxs_detail::set_fast_qmm_warp_rows(n); }
bool mlxs_fast_qmm_enabled(void) { return mlxs_detail::fast_qmm_enabled(); }
uint64_t mlxs_fast_qmm_launches(void) { return mlxs_detail::fast_qmm_launches(); }
void mlxs_set_fast_qmm_mma(int mode) { mlxs_detail::set_fast_qmm_mma(mode); }
void mlxs_set_fast_qgemm(bool on) { mlxs_detail::set_fast_qgemm(on); }
uint64_t mlxs_fast_qgemm_launches(void) { return mlxs_detail::fast_qgemm_launches(); }
void mlxs_set_fast_gather_qgemm(bool on) { mlxs_detail::set_fast_gather_qgemm(on); }
uint64_t mlxs_fast_gather_qgemm_launches(void) {
  return mlxs_detail::fast_gather_qgemm_launches();
}
int mlxs_fast_qmm_mma_mode(void) { return mlxs_detail::fast_qmm_mma_mode(); }
uint64_t mlxs_fast_qmm_mma_launches(void) { return mlxs_detail::fast_qmm_mma_launches(); }
int mlxs_gather_qmm(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                    mlxs_array biases, mlxs_array lhs, mlxs_array rhs, bool transpose,
                    int group_size, int bits, const char* mode, bool sorted, mlxs_stream s) {
  return guard([&] {
    const std::string m = mode ? mode : "affine";
    auto fast = mlxs_detail::try_fast_gather_qgemm(A(x), A(w), A(scales), OPT(biases), OPT(lhs),
                                                   OPT(rhs), transpose, OPTI(group_size),
                                                   OPTI(bits), m, S(s));
    if (!fast) {
      fast = mlxs_detail::try_fast_gather_qmv(A(x), A(w), A(scales), OPT(biases), OPT(lhs),
                                              OPT(rhs), transpose, OPTI(group_size), OPTI(bits),
                                              m, S(s));
    }
    if (!fast) {
      fast = mlxs_detail::try_cpu_gather_qmm(A(x), A(w), A(scales), OPT(biases), OPT(lhs),
                                             OPT(rhs), transpose, OPTI(group_size), OPTI(bits),
                                             m, sorted, S(s));
    }
    *out = wrap(fast ? std::move(*fast)
                     : mx::gather_qmm(A(x), A(w), A(scales), OPT(biases), OPT(lhs), OPT(rhs),
                                      transpose, OPTI(group_size), OPTI(bits), m, std::nullopt,
                                      sorted, S(s)));
  });
}
int mlxs_gather_mm(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_array lhs, mlxs_array rhs,
                   bool sorted, mlxs_stream s) {
  OUT1(mx::gather_mm(A(a), A(b), OPT(lhs), OPT(rhs), sorted, S(s)));
}
int mlxs_to_fp8(mlxs_array* out, mlxs_array x, mlxs_stream s) { OUT1(mx::to_fp8(A(x), S(s))); }
int mlxs_from_fp8(mlxs_array* out, mlxs_array x, int32_t dtype, mlxs_stream s) {
  OUT1(mx::from_fp8(A(x), to_dtype(dtype), S(s)));
}

/* ---------- random ---------- */
int mlxs_random_seed(uint64_t seed) {
  return guard([&] { mx::random::seed(seed); });
}
int mlxs_random_key(mlxs_array* out, uint64_t seed) { OUT1(mx::random::key(seed)); }
int mlxs_random_split(mlxs_array* out, mlxs_array key, int num, mlxs_stream s) {
  OUT1(mx::random::split(A(key), num, S(s)));
}
int mlxs_random_bits(mlxs_array* out, const int32_t* shape, size_t ndim, int width, mlxs_array key,
                     mlxs_stream s) {
  OUT1(mx::random::bits(SH(shape, ndim), width, OPT(key), S(s)));
}
int mlxs_random_uniform(mlxs_array* out, mlxs_array low, mlxs_array high, const int32_t* shape,
                        size_t ndim, int32_t dtype, mlxs_array key, mlxs_stream s) {
  OUT1(mx::random::uniform(A(low), A(high), SH(shape, ndim), to_dtype(dtype), OPT(key), S(s)));
}
int mlxs_random_normal(mlxs_array* out, const int32_t* shape, size_t ndim, int32_t dtype,
                       mlxs_array loc, mlxs_array scale, mlxs_array key, mlxs_stream s) {
  OUT1(mx::random::normal(SH(shape, ndim), to_dtype(dtype), OPT(loc), OPT(scale), OPT(key), S(s)));
}
int mlxs_random_randint(mlxs_array* out, mlxs_array low, mlxs_array high, const int32_t* shape,
                        size_t ndim, int32_t dtype, mlxs_array key, mlxs_stream s) {
  OUT1(mx::random::randint(A(low), A(high), SH(shape, ndim), to_dtype(dtype), OPT(key), S(s)));
}
int mlxs_random_bernoulli(mlxs_array* out, mlxs_array p, const int32_t* shape, size_t ndim,
                          mlxs_array key, mlxs_stream s) {
  OUT1(mx::random::bernoulli(A(p), SH(shape, ndim), OPT(key), S(s)));
}
int mlxs_random_gumbel(mlxs_array* out, const int32_t* shape, size_t ndim, int32_t dtype,
                       mlxs_array key, mlxs_stream s) {
  OUT1(mx::random::gumbel(SH(shape, ndim), to_dtype(dtype), OPT(key), S(s)));
}
int mlxs_random_categorical(mlxs_array* out, mlxs_array logits, int axis, int num_samples,
                            mlxs_array key, mlxs_stream s) {
  OUT1(num_samples > 0 ? mx::random::categorical(A(logits), axis, num_samples, OPT(key), S(s))
                       : mx::random::categorical(A(logits), axis, OPT(key), S(s)));
}
int mlxs_random_truncated_normal(mlxs_array* out, mlxs_array lower, mlxs_array upper,
                                 const int32_t* shape, size_t ndim, int32_t dtype, mlxs_array key,
                                 mlxs_stream s) {
  OUT1(mx::random::truncated_normal(A(lower), A(upper), SH(shape, ndim), to_dtype(dtype), OPT(key),
                                    S(s)));
}
int mlxs_random_permutation(mlxs_array* out, mlxs_array x, int axis, mlxs_array key, mlxs_stream s) {
  OUT1(mx::random::permutation(A(x), axis, OPT(key), S(s)));
}

int mlxs_random_permutation_n(mlxs_array* out, int n, mlxs_array key, mlxs_stream s) {
  OUT1(mx::random::permutation(n, OPT(key), S(s)));
}

int mlxs_random_next_key(mlxs_array* out) { OUT1(mx::random::KeySequence::default_().next()); }
int mlxs_random_state_save(mlxs_keyseq* out) {
  return guard([&] { *out = new mlxs_keyseq_s{mx::random::KeySequence::default_()}; });
}
int mlxs_random_state_restore(mlxs_keyseq state) {
  return guard([&] {
    if (state == nullptr) throw std::invalid_argument("null key sequence handle");
    mx::random::KeySequence::default_() = state->ks;
  });
}
int mlxs_keyseq_clone(mlxs_keyseq* out, mlxs_keyseq state) {
  return guard([&] {
    if (state == nullptr) throw std::invalid_argument("null key sequence handle");
    *out = new mlxs_keyseq_s{state->ks};
  });
}
void mlxs_keyseq_free(mlxs_keyseq state) { delete state; }

/* ---------- linalg ---------- */
int mlxs_linalg_norm(mlxs_array* out, mlxs_array a, int ord_kind, double ord, const char* ord_str,
                     const int32_t* axes, size_t naxes, bool keepdims, mlxs_stream s) {
  return guard([&] {
    std::optional<std::vector<int>> ax;
    if (axes) ax = AX(axes, naxes);
    switch (ord_kind) {
      case 1: *out = wrap(mx::linalg::norm(A(a), ord, ax, keepdims, S(s))); break;
      case 2: *out = wrap(mx::linalg::norm(A(a), std::string(ord_str), ax, keepdims, S(s))); break;
      default: *out = wrap(mx::linalg::norm(A(a), ax, keepdims, S(s))); break;
    }
  });
}
int mlxs_linalg_qr(mlxs_array* q, mlxs_array* r, mlxs_array a, mlxs_stream s) {
  return guard([&] {
    auto [qq, rr] = mx::linalg::qr(A(a), S(s));
    *q = wrap(qq);
    *r = wrap(rr);
  });
}
int mlxs_linalg_svd(mlxs_vec* out, mlxs_array a, bool compute_uv, mlxs_stream s) {
  return guard([&] { *out = wrapv(mx::linalg::svd(A(a), compute_uv, S(s))); });
}
int mlxs_linalg_inv(mlxs_array* out, mlxs_array a, mlxs_stream s) { OUT1(mx::linalg::inv(A(a), S(s))); }
int mlxs_linalg_pinv(mlxs_array* out, mlxs_array a, mlxs_stream s) { OUT1(mx::linalg::pinv(A(a), S(s))); }
int mlxs_linalg_cholesky(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s) {
  OUT1(mx::linalg::cholesky(A(a), upper, S(s)));
}
int mlxs_linalg_cholesky_inv(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s) {
  OUT1(mx::linalg::cholesky_inv(A(a), upper, S(s)));
}
int mlxs_linalg_tri_inv(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s) {
  OUT1(mx::linalg::tri_inv(A(a), upper, S(s)));
}
int mlxs_linalg_solve(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_stream s) {
  OUT1(mx::linalg::solve(A(a), A(b), S(s)));
}
int mlxs_linalg_solve_triangular(mlxs_array* out, mlxs_array a, mlxs_array b, bool upper,
                                 mlxs_stream s) {
  OUT1(mx::linalg::solve_triangular(A(a), A(b), upper, S(s)));
}
int mlxs_linalg_eigh(mlxs_array* w, mlxs_array* v, mlxs_array a, const char* uplo, mlxs_stream s) {
  return guard([&] {
    auto [ww, vv] = mx::linalg::eigh(A(a), uplo ? std::string(uplo) : std::string("L"), S(s));
    *w = wrap(ww);
    *v = wrap(vv);
  });
}

/* ---------- transforms ---------- */
int mlxs_eval(mlxs_vec arrays) {
  return guard([&] { mx::eval(arrays->v); });
}
namespace {

// Work `async_eval` queued may still run on a stream's thread when the process exits
// (a generator dropped with its next step in flight, as mlx-lm's generate_step leaves
// one). MLX's statics (the allocator, the scheduler) are destroyed by `exit`, under that
// thread's feet: a crash after the program's last line. So the first `async_eval`
// registers an `atexit` handler that waits for every stream it has seen. It is
// registered after the scheduler and the allocator exist, so it runs before their
// destructors (handlers and destructors run in the reverse order of registration).
std::mutex g_async_streams_mtx;
std::vector<mx::Stream>* g_async_streams = new std::vector<mx::Stream>();  // never freed

void drain_async_streams() {
  std::vector<mx::Stream> streams;
  {
    std::lock_guard<std::mutex> lk(g_async_streams_mtx);
    streams = *g_async_streams;
  }
  for (const auto& s : streams) {
    try {
      mx::synchronize(s);
    } catch (...) {
      // An error a stream kept is the program's, reported where it waited (or not at all).
    }
  }
}

void note_async_streams(const std::vector<mx::array>& arrays) {
  static std::once_flag once;
  std::call_once(once, [] {
    mx::scheduler::scheduler();
    (void)mx::get_active_memory();
    std::atexit(drain_async_streams);
  });
  std::lock_guard<std::mutex> lk(g_async_streams_mtx);
  auto note = [](const mx::Stream& s) {
    if (std::find(g_async_streams->begin(), g_async_streams->end(), s) ==
        g_async_streams->end()) {
      g_async_streams->push_back(s);
    }
  };
  for (const auto& a : arrays) {
    if (a.has_primitive()) {
      note(a.primitive().stream());
    }
  }
}

}  // namespace

int mlxs_async_eval(mlxs_vec arrays) {
  return guard([&] {
    note_async_streams(arrays->v);
    mx::async_eval(arrays->v);
  });
}

int mlxs_closure_new(mlxs_closure* out, mlxs_closure_fn fn, void* payload, void (*dtor)(void*)) {
  return guard([&] {
    std::shared_ptr<void> keep(payload, [dtor](void* p) {
      if (dtor) dtor(p);
    });
    ArrayFn f = [fn, keep](const std::vector<mx::array>& inputs) {
      mlxs_vec_s in{inputs};
      mlxs_vec_s outv{};
      if (fn(keep.get(), &in, &outv) != 0) {
        throw std::runtime_error(g_last_error.empty() ? "closure failed" : g_last_error);
      }
      return std::move(outv.v);
    };
    *out = new mlxs_closure_s{std::move(f), false};
  });
}
void mlxs_closure_free(mlxs_closure c) {
  if (!c) return;
  if (c->compiled) {
    try {
      mx::detail::compile_erase(mx::detail::compile_cache(), reinterpret_cast<std::uintptr_t>(c));
    } catch (...) {
    }
  }
  delete c;
}
int mlxs_closure_apply(mlxs_vec* out, mlxs_closure c, mlxs_vec inputs) {
  return guard([&] { *out = wrapv(c->fn(inputs->v)); });
}
int mlxs_compile(mlxs_closure* out, mlxs_closure c, bool shapeless) {
  return guard([&] {
    auto res = std::make_unique<mlxs_closure_s>();
    res->fn = mx::detail::compile(c->fn, reinterpret_cast<std::uintptr_t>(res.get()), shapeless);
    res->compiled = true;
    *out = res.release();
  });
}
int mlxs_checkpoint(mlxs_closure* out, mlxs_closure c) {
  return guard([&] { *out = new mlxs_closure_s{mx::checkpoint(c->fn), false}; });
}
int mlxs_set_compile_mode(int mode) {
  return guard([&] {
    switch (mode) {
      case 0: mx::set_compile_mode(mx::CompileMode::disabled); break;
      case 1: mx::set_compile_mode(mx::CompileMode::no_simplify); break;
      case 2: mx::set_compile_mode(mx::CompileMode::no_fuse); break;
      default: mx::set_compile_mode(mx::CompileMode::enabled); break;
    }
  });
}
int mlxs_vjp(mlxs_vec* outputs, mlxs_vec* vjps, mlxs_closure c, mlxs_vec primals, mlxs_vec cotangents) {
  return guard([&] {
    auto [o, g] = mx::vjp(c->fn, primals->v, cotangents->v);
    *outputs = wrapv(std::move(o));
    *vjps = wrapv(std::move(g));
  });
}
int mlxs_jvp(mlxs_vec* outputs, mlxs_vec* jvps, mlxs_closure c, mlxs_vec primals, mlxs_vec tangents) {
  return guard([&] {
    auto [o, g] = mx::jvp(c->fn, primals->v, tangents->v);
    *outputs = wrapv(std::move(o));
    *jvps = wrapv(std::move(g));
  });
}
int mlxs_value_and_grad(mlxs_vec* values, mlxs_vec* grads, mlxs_closure c, mlxs_vec inputs,
                        const int32_t* argnums, size_t nargnums) {
  return guard([&] {
    auto fn = mx::value_and_grad(c->fn, AX(argnums, nargnums));
    auto [v, g] = fn(inputs->v);
    *values = wrapv(std::move(v));
    *grads = wrapv(std::move(g));
  });
}

}  // extern "C"
