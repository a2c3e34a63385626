// cpu_gemv.cpp: CPU matmuls and quantized matmuls with MLX's arithmetic, faster.
//
// MLX 0.32.4's CPU matmul gives every output element the float32 sum of its products in
// the order of k, one multiply and one add each (no FMA), starting from 0, then rounds it
// to the output dtype once; `addmm` (alpha = beta = 1) adds the bias to that float sum
// before the rounding (float32 with a weight not laid out as W.T: the sum starts from the
// bias instead, as the reference BLAS's loops do). Float32 goes to the bundled reference
// BLAS, bfloat16 / float16 to MLX's blocked `simd_gemm`, whose SIMD width is 1 on Linux:
// both sum in order, and both stream the weight at ~1-2 GFLOP/s, which is most of a small
// model's decoding step. Its quantized matmul (`_qmm_t`, below) is a scalar chain too.
//
// The primitives here keep exactly those operations (same products, same order, same
// roundings) and only vectorize across outputs: eight outputs' sums advance together, one
// k at a time (AVX2 + F16C where the CPU has them, the weight rows transposed in registers
// eight by eight); the quantized ones dequantize each weight once for up to 16 rows of x
// and split a large product's outputs between the CPU's threads (Pool; same bits).
// `tests/cpu_gemv.rs` in mlx-array checks them bit for bit against MLX's matmul, addmm and
// quantized_matmul (dtypes, weight layouts, ragged sizes, 1 to 300 rows, derivatives); the
// parity suites (`cargo xtask parity`) run every model through them.
//
// They are used on Linux x86-64, where MLX's arithmetic is the one described, for CPU
// matmuls x [..., M, K] @ b [K, N] (b any strides, any M) of float32, bfloat16 or float16
// operands of one dtype, and for 4- / 8-bit affine quantized matmuls (see try_cpu_qmv).
// MLX_FAST_CPU_GEMV=0 or mlxs_set_fast_cpu_gemv(false) turns them off.
#include "cpu_gemv.h"

#include "affine_operands.h"
#include "kernel_switch.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MLXS_X86 1
#endif

// Where the arithmetic above is MLX's: Linux x86-64 builds (bundled reference BLAS, SIMD
// width 1 in MLX's CPU kernels). macOS (Accelerate, 8-wide SIMD) and ARM (NEON) sum in
// other orders, so there MLX keeps its own kernels.
#if defined(__linux__) && defined(MLXS_X86)
constexpr bool kSameArithmetic = true;
#else
constexpr bool kSameArithmetic = false;
#endif

namespace mx = mlx::core;

namespace mlxs_detail {
namespace {

KernelSwitch g_switch("MLX_FAST_CPU_GEMV");
// The mixture-of-experts products (try_cpu_gather_qmm): also need g_switch;
// MLX_FAST_CPU_GATHER=0 leaves them to MLX.
KernelSwitch g_gather("MLX_FAST_CPU_GATHER");

// Splits one product's outputs between the CPU's cores. Each output is computed by the
// same code wherever it runs, so the bits do not depend on the split. Threads: the
// machine's (at most 16), or MLX_FAST_CPU_THREADS=N (1: every product on MLX's stream
// thread alone, as before). One product at a time: a product arriving while another runs
// (another CPU stream) runs alone on its own thread.
class Pool {
 public:
  static Pool& get() {
    // Leaked on purpose: its threads wait for work until the process ends.
    static Pool* pool = new Pool(threads_wanted());
    return *pool;
  }

  // The threads that run a job: the workers and the calling one.
  int threads() const { return threads_; }

  // f(i) for every i in [0, n), on the pool's threads and the calling one; returns when
  // all are done.
  void run(int n, const std::function<void(int)>& f) {
    std::unique_lock<std::mutex> submit(submit_, std::try_to_lock);
    if (threads_ == 1 || n < 2 || !submit.owns_lock()) {
      for (int i = 0; i < n; ++i) f(i);
      return;
    }
    auto job = std::make_shared<Job>();
    job->f = &f;
    job->total = n;
    {
      std::lock_guard<std::mutex> g(m_);
      job_ = job;
      ++gen_;
    }
    work_.notify_all();
    work_on(*job);
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [&] { return job->completed.load() == job->total; });
    job_.reset();
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  struct Job {
    const std::function<void(int)>* f = nullptr;
    int total = 0;
    std::atomic<int> next{0};
    std::atomic<int> completed{0};
    // The first item's exception (rethrown on the calling thread), set under m_.
    std::exception_ptr error;
  };

  static int threads_wanted() {
    const long long hw = std::max(1u, std::thread::hardware_concurrency());
    return static_cast<int>(std::clamp(env_count("MLX_FAST_CPU_THREADS", hw), 1ll, 16ll));
  }

  explicit Pool(int threads) : threads_(threads) {
    for (int i = 1; i < threads; ++i) std::thread([this] { loop(); }).detach();
  }

  // Claims and runs items of `job` until none is left. A worker late to a finished job
  // only finds its counters past the end: it never calls a finished job's function.
  void work_on(Job& job) {
    for (int i; (i = job.next.fetch_add(1)) < job.total;) {
      try {
        (*job.f)(i);
      } catch (...) {
        std::lock_guard<std::mutex> g(m_);
        if (!job.error) job.error = std::current_exception();
      }
      if (job.completed.fetch_add(1) + 1 == job.total) {
        std::lock_guard<std::mutex> g(m_);
        done_.notify_all();
      }
    }
  }

  void loop() {
    unsigned long long seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(m_);
        work_.wait(lk, [&] { return gen_ != seen; });
        seen = gen_;
        job = job_;
      }
      if (job) work_on(*job);
    }
  }

  std::mutex submit_;
  std::mutex m_;
  std::condition_variable work_, done_;
  std::shared_ptr<Job> job_;
  unsigned long long gen_ = 0;
  const int threads_;
};

// Products with fewer multiply-adds than this stay on the calling thread (waking the
// pool costs more than it saves).
constexpr int64_t kParallelMin = 1 << 18;

template <typename T>
inline float to_f32(T v) {
  return static_cast<float>(v);
}

// One output element's sum, in order: the reference for every path below.
template <typename T>
float dot_in_order(float s, const float* x, const T* w, int64_t k_stride, int k) {
  for (int i = 0; i < k; ++i) {
    float p = x[i] * to_f32(w[i * k_stride]);
    s = s + p;
  }
  return s;
}

#ifdef MLXS_X86
// Eight consecutive elements as float32.
template <typename T>
__attribute__((target("avx2,f16c"))) inline __m256 load8(const T* p);

template <>
__attribute__((target("avx2,f16c"))) inline __m256 load8<float>(const float* p) {
  return _mm256_loadu_ps(p);
}

template <>
__attribute__((target("avx2,f16c"))) inline __m256 load8<mx::float16_t>(const mx::float16_t* p) {
  // Exact, as every float16 -> float32 conversion.
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <>
__attribute__((target("avx2,f16c"))) inline __m256 load8<mx::bfloat16_t>(const mx::bfloat16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,f16c"))) inline void transpose8(__m256* r) {
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
  __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
  __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
  __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
  __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Outputs n0..n0+7 of R rows of x (row r at x + r * xs, its sums at out + r * os), weight
// rows contiguous in k (w[n * ld + k]): each transposed block of weights serves all R rows.
template <typename T, int R>
__attribute__((target("avx2,f16c"))) void rows8_avx2(
    const float* x, int64_t xs, const T* w, int64_t ld, int k, float* out, int64_t os) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_loadu_ps(out + r * os);
  int kb = 0;
  for (; kb + 8 <= k; kb += 8) {
    __m256 v[8];
    for (int i = 0; i < 8; ++i) v[i] = load8<T>(w + i * ld + kb);
    transpose8(v);  // v[j] = the eight outputs' weights at k = kb + j
    for (int j = 0; j < 8; ++j) {
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_set1_ps(x[r * xs + kb + j]), v[j]));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float a[8];
    _mm256_store_ps(a, acc[r]);
    for (int i = 0; i < 8; ++i) {
      float s = a[i];
      for (int kk = kb; kk < k; ++kk) s = s + x[r * xs + kk] * to_f32(w[i * ld + kk]);
      out[r * os + i] = s;
    }
  }
}

// The same with the weight contiguous in n (b[k * ld + n]).
template <typename T, int R>
__attribute__((target("avx2,f16c"))) void cols8_avx2(
    const float* x, int64_t xs, const T* b, int64_t ld, int k, float* out, int64_t os) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_loadu_ps(out + r * os);
  for (int kk = 0; kk < k; ++kk) {
    __m256 v = load8<T>(b + kk * ld);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_set1_ps(x[r * xs + kk]), v));
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * os, acc[r]);
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

// All N sums of R rows of x (row r at x + r * k, its sums at out + r * os, each starting
// from its value there): b(k, n) at b[k * sk + n * sn].
template <typename T, int R>
void row_sums(const float* x, const T* b, int64_t sk, int64_t sn, int k, int n, float* out,
              int64_t os) {
  int j = 0;
#ifdef MLXS_X86
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, mx::bfloat16_t> ||
                std::is_same_v<T, mx::float16_t>) {
    if (has_avx2() && sk == 1) {
      for (; j + 8 <= n; j += 8) rows8_avx2<T, R>(x, k, b + j * sn, sn, k, out + j, os);
    } else if (has_avx2() && sn == 1) {
      for (; j + 8 <= n; j += 8) cols8_avx2<T, R>(x, k, b + j, sk, k, out + j, os);
    }
  }
#endif
  for (int r = 0; r < R; ++r) {
    for (int jj = j; jj < n; ++jj) {
      out[r * os + jj] = dot_in_order<T>(out[r * os + jj], x + r * k, b + jj * sn, sk, k);
    }
  }
}

// Rows of x taken together by the vectorized paths.
constexpr int kRowBlock = 4;

// The start of our primitives' CPU evaluation, as MLX's own CPU primitives do it: allocates
// `out` (before the work that captures it is made) and registers the arrays with the
// stream's encoder, which the caller then gives the work.
mx::cpu::CommandEncoder& cpu_encoder_for(mx::Stream stream, const std::vector<mx::array>& inputs,
                                         mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream);
  for (auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  return enc;
}

// Offset of element `i` of a row-major enumeration of `shape` with `strides`.
int64_t offset_of(int64_t i, const mx::Shape& shape, const mx::Strides& strides) {
  int64_t off = 0;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

template <typename T>
void run(const mx::array& a, const mx::array& b, const mx::array* c, mx::array& out) {
  const int k = b.shape(0);
  const int n = b.shape(1);
  const int rows = static_cast<int>(a.size() / k);
  const T* ap = a.data<T>();
  const T* bp = b.data<T>();
  T* op = out.data<T>();
  const int64_t sk = b.strides()[0];
  const int64_t sn = b.strides()[1];
  // Where the bias goes: MLX's bfloat16 / float16 gemm adds it to the finished sum; for
  // float32 the reference BLAS does too when it takes b as transposed (b's strides
  // [1, K], a linear layer's W.T), and otherwise starts each sum from it.
  const bool bias_first = std::is_same_v<T, float> && !(sk == 1 && sn == k);
  // The bias's strides broadcast to the output's shape.
  mx::Strides cs(out.ndim(), 0);
  if (c != nullptr) {
    const int lead = static_cast<int>(out.ndim()) - static_cast<int>(c->ndim());
    for (int d = 0; d < static_cast<int>(c->ndim()); ++d) {
      if (c->shape(d) != 1) cs[lead + d] = c->strides()[d];
    }
  }
  auto bias = [&](int m, int j) {
    return to_f32(c->data<T>()[offset_of(static_cast<int64_t>(m) * n + j, out.shape(), cs)]);
  };
  const bool adense = a.flags().row_contiguous;
  // Rows m0..m0+block of a as float at x, their sums' starting values at sums (row
  // stride n).
  auto start = [&](int m0, int block, float* x, float* sums) {
    for (int r = 0; r < block; ++r) {
      const int64_t m = m0 + r;
      for (int kk = 0; kk < k; ++kk) {
        const int64_t e = m * k + kk;
        x[r * k + kk] = to_f32(adense ? ap[e] : ap[offset_of(e, a.shape(), a.strides())]);
      }
      for (int j = 0; j < n; ++j) {
        sums[r * n + j] = (c != nullptr && bias_first) ? bias(m0 + r, j) : 0.0f;
      }
    }
  };
  // Columns j0..j1 of rows m0..m0+block: kRowBlock rows a pass, each output's sum the
  // same code (and bits) whichever rows and columns a call covers.
  auto sums_of = [&](int block, const float* x, float* sums, int j0, int j1) {
    if (block == kRowBlock) {
      row_sums<T, kRowBlock>(x, bp + j0 * sn, sk, sn, k, j1 - j0, sums + j0, n);
    } else {
      for (int r = 0; r < block; ++r) {
        row_sums<T, 1>(x + r * k, bp + j0 * sn, sk, sn, k, j1 - j0, sums + r * n + j0, n);
      }
    }
  };
  auto finish = [&](int m0, int block, const float* sums) {
    for (int r = 0; r < block; ++r) {
      for (int j = 0; j < n; ++j) {
        float s = sums[r * n + j];
        if (c != nullptr && !bias_first) s = s + bias(m0 + r, j);
        op[static_cast<int64_t>(m0 + r) * n + j] = static_cast<T>(s);
      }
    }
  };
  // The row blocks bb..be, one after another, with buffers of their own.
  auto row_blocks = [&](int bb, int be) {
    std::vector<float> x(static_cast<size_t>(kRowBlock) * k);
    std::vector<float> sums(static_cast<size_t>(kRowBlock) * n);
    for (int i = bb; i < be; ++i) {
      const int m0 = i * kRowBlock;
      const int block = std::min(kRowBlock, rows - m0);
      start(m0, block, x.data(), sums.data());
      sums_of(block, x.data(), sums.data(), 0, n);
      finish(m0, block, sums.data());
    }
  };
  const int nblocks = (rows + kRowBlock - 1) / kRowBlock;
  const int64_t macs = static_cast<int64_t>(rows) * n * k;
  Pool& pool = Pool::get();
  if (macs < kParallelMin || pool.threads() == 1) {
    row_blocks(0, nblocks);
    return;
  }
  if (nblocks >= 2 * pool.threads()) {
    // Many rows (a prefill): a few runs of row blocks a thread.
    const int parts = std::min(nblocks, 4 * pool.threads());
    pool.run(parts, [&](int i) {
      row_blocks(static_cast<int>(static_cast<int64_t>(nblocks) * i / parts),
                 static_cast<int>(static_cast<int64_t>(nblocks) * (i + 1) / parts));
    });
    return;
  }
  // Few rows (decoding): every row at once, its columns split in runs of eight.
  std::vector<float> x(static_cast<size_t>(rows) * k);
  std::vector<float> sums(static_cast<size_t>(rows) * n);
  start(0, rows, x.data(), sums.data());
  const int ncols = (n + 7) / 8;
  const int parts = std::min(ncols, 4 * pool.threads());
  pool.run(parts, [&](int i) {
    const int j0 = 8 * static_cast<int>(static_cast<int64_t>(ncols) * i / parts);
    const int j1 = std::min(n, 8 * static_cast<int>(static_cast<int64_t>(ncols) * (i + 1) / parts));
    for (int m0 = 0; m0 < rows; m0 += kRowBlock) {
      const int block = std::min(kRowBlock, rows - m0);
      sums_of(block, x.data() + static_cast<int64_t>(m0) * k, sums.data() + static_cast<int64_t>(m0) * n,
              j0, j1);
    }
  });
  finish(0, rows, sums.data());
}

class RowMatmul : public mx::UnaryPrimitive {
 public:
  RowMatmul(mx::Stream s, bool has_bias) : mx::UnaryPrimitive(s), has_bias_(has_bias) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto& enc = cpu_encoder_for(stream(), inputs, out);
    enc.dispatch([a = mx::array::unsafe_weak_copy(inputs[0]),
                  b = mx::array::unsafe_weak_copy(inputs[1]),
                  c = has_bias_ ? std::optional<mx::array>(mx::array::unsafe_weak_copy(inputs[2]))
                                : std::nullopt,
                  out = mx::array::unsafe_weak_copy(out)]() mutable {
      const mx::array* cp = c ? &*c : nullptr;
      switch (out.dtype().val()) {
        case mx::Dtype::Val::float32: run<float>(a, b, cp, out); break;
        case mx::Dtype::Val::bfloat16: run<mx::bfloat16_t>(a, b, cp, out); break;
        case mx::Dtype::Val::float16: run<mx::float16_t>(a, b, cp, out); break;
        default: throw std::runtime_error("[RowMatmul] unsupported dtype");
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[RowMatmul] runs on the CPU only");
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override {
    const auto& a = primals[0];
    const auto& b = primals[1];
    const auto& cot = cotangents[0];
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 0) {
        grads.push_back(mx::matmul(cot, mx::transpose(b, stream()), stream()));
      } else if (arg == 1) {
        int k = a.shape(-1);
        int n = b.shape(1);
        auto a2 = mx::reshape(a, {-1, k}, stream());
        auto c2 = mx::reshape(cot, {-1, n}, stream());
        grads.push_back(mx::matmul(mx::transpose(a2, stream()), c2, stream()));
      } else {
        // The bias was broadcast to the output: sum the cotangent back to its shape.
        const auto& c = primals[2];
        auto g = cot;
        while (g.ndim() > c.ndim()) g = mx::sum(g, 0, false, stream());
        for (int d = 0; d < static_cast<int>(c.ndim()); ++d) {
          if (c.shape(d) == 1 && g.shape(d) != 1) g = mx::sum(g, d, true, stream());
        }
        grads.push_back(g);
      }
    }
    return grads;
  }

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override {
    // MLX's own derivative of the same product (zero tangents for the other inputs).
    std::vector<mx::array> all;
    for (const auto& p : primals) all.push_back(mx::zeros_like(p, stream()));
    for (size_t i = 0; i < argnums.size(); ++i) all[argnums[i]] = tangents[i];
    const bool bias = has_bias_;
    auto s = stream();
    auto f = [bias, s](const std::vector<mx::array>& in) -> std::vector<mx::array> {
      return {bias ? mx::addmm(in[2], in[0], in[1], 1.0f, 1.0f, s) : mx::matmul(in[0], in[1], s)};
    };
    return mx::jvp(f, primals, all).second;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.back() = inputs[1].shape(1);
    return {s};
  }

  const char* name() const override { return "RowMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const RowMatmul*>(&other);
    return o != nullptr && o->has_bias_ == has_bias_;
  }

 private:
  bool has_bias_;
};


// ---- 4- and 8-bit quantized products in bfloat16 or float32 (MLX's CPU `_qmm_t`) ----
//
// MLX 0.32.4's CPU quantized matmul (transposed weight, SIMD width 1 on Linux) computes
// each output in bfloat16, element after element in the order of k (low bits first):
// `sum += x * (scale * q + bias)`, where every bfloat16 product and sum is a float32
// operation rounded to bfloat16 (MLX's `_MLX_BFloat16` operators): four roundings a
// weight (float32: the same operations without them). The kernel below does the same
// operations in the same order, eight outputs at a time.

inline float bf16_round(float f) {
  return static_cast<float>(static_cast<mx::bfloat16_t>(f));
}

// One output, as MLX computes it (the reference for the vectorized path); RND: the
// bfloat16 roundings of a bfloat16 product (float32 products have none).
template <bool RND, int BITS>
float qdot_in_order(const float* x, const uint8_t* w, const float* sc, const float* bi,
                    int k, int gs) {
  auto r = [](float f) { return RND ? bf16_round(f) : f; };
  float sum = 0.0f;
  for (int kk = 0; kk < k; ++kk) {
    const float q = BITS == 8 ? static_cast<float>(w[kk])
                              : static_cast<float>((w[kk / 2] >> (4 * (kk & 1))) & 0xF);
    const float t = r(r(sc[kk / gs] * q) + bi[kk / gs]);
    sum = r(sum + r(x[kk] * t));
  }
  return sum;
}

#ifdef MLXS_X86
// float32 -> bfloat16 -> float32 as MLX rounds (nearest even; NaN -> 0x7FC0).
__attribute__((target("avx2,f16c"))) inline __m256 bf16_round8(__m256 f) {
  __m256i u = _mm256_castps_si256(f);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), qnan, nan);
}

template <bool RND>
__attribute__((target("avx2,f16c"))) inline __m256 round8(__m256 f) {
  if constexpr (RND) {
    return bf16_round8(f);
  } else {
    return f;
  }
}

// Outputs n0..n0+7 of R rows of x (row r at x[r], its eight sums to out[r]): row i's packed
// weight at w + i * wld (bytes), its scales / biases (as float) at sc / bi + i * g. Each
// weight is dequantized once for the R rows; every row's products and sums run in MLX's
// order, so each row's bits are those it gets alone.
template <bool RND, int BITS, int R>
__attribute__((target("avx2,f16c"))) void qrows8_avx2(const float* const* x, const uint8_t* w,
                                                 int64_t wld, const float* sc,
                                                 const float* bi, int g, int k, int gs,
                                                 float* const* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  // Lane i reads row i's scale and bias: g floats apart.
  const __m256i rows = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(g));
  for (int gi = 0; gi < k / gs; ++gi) {
    const __m256 s = _mm256_i32gather_ps(sc + gi, rows, 4);
    const __m256 b = _mm256_i32gather_ps(bi + gi, rows, 4);
    for (int k0 = gi * gs; k0 < (gi + 1) * gs; k0 += 8) {
      // Each row's next eight weights: one word (4-bit) or two (8-bit), lane = row.
      uint32_t lo[8], hi[8] = {};
      for (int i = 0; i < 8; ++i) {
        std::memcpy(&lo[i], w + i * wld + k0 * BITS / 8, 4);
        if (BITS == 8) std::memcpy(&hi[i], w + i * wld + k0 + 4, 4);
      }
      const __m256i wlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo));
      const __m256i whi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi));
      const __m256i mask = _mm256_set1_epi32((1 << BITS) - 1);
      for (int j = 0; j < 8; ++j) {
        const __m256i word = (BITS == 8 && j >= 4) ? whi : wlo;
        const int shift = BITS == 8 ? 8 * (j & 3) : 4 * j;
        const __m256 q = _mm256_cvtepi32_ps(
            _mm256_and_si256(_mm256_srl_epi32(word, _mm_cvtsi32_si128(shift)), mask));
        __m256 t = round8<RND>(_mm256_mul_ps(s, q));
        t = round8<RND>(_mm256_add_ps(t, b));
        for (int r = 0; r < R; ++r) {
          const __m256 p = round8<RND>(_mm256_mul_ps(_mm256_set1_ps(x[r][k0 + j]), t));
          acc[r] = round8<RND>(_mm256_add_ps(acc[r], p));
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

// qrows8_avx2 for nr (1..R) rows of x.
template <bool RND, int BITS, int R>
__attribute__((target("avx2,f16c"))) void qrows8_avx2_up_to(int nr, const float* const* x,
                                                       const uint8_t* w, int64_t wld,
                                                       const float* sc, const float* bi,
                                                       int g, int k, int gs,
                                                       float* const* out) {
  if constexpr (R > 1) {
    if (nr < R) return qrows8_avx2_up_to<RND, BITS, R - 1>(nr, x, w, wld, sc, bi, g, k, gs, out);
  }
  qrows8_avx2<RND, BITS, R>(x, w, wld, sc, bi, g, k, gs, out);
}
#endif

// Rows of x the vectorized kernel takes at once, each dequantized weight serving all of
// them. Prefill of the real default model (float32 activations, -p 256, this repository's
// 2-core CI-class machine): 24.6 tok/s one row at a time, 41.0 four, 63.8 eight, 71.6
// sixteen; its bfloat16 4-bit requantization 11.5 -> 25.6 (eight) -> 28.8 (sixteen).
constexpr int kQRows = 16;

// The outputs of `rows` rows of x (row r's k floats at xrow(r)) by the packed weight at wp
// (n rows of wld bytes), row r's n outputs written at orow(r); sb(i, &scale, &bias) reads
// element i of the weight's [n, k / gs] scales and biases as float (exact). Eight weight
// rows at a time: their scales and biases converted once, then their outputs for every row
// (kQRows rows of x at a time, each weight dequantized once for them).
template <typename T, int BITS, typename XRow, typename ORow, typename SB>
void q_rows(int rows, XRow xrow, ORow orow, const uint8_t* wp, int n, int k, int gs, SB sb) {
  constexpr bool RND = std::is_same_v<T, mx::bfloat16_t>;
  const int g = k / gs;
  const int64_t wld = static_cast<int64_t>(k) * BITS / 8;  // bytes a row
  constexpr int kBlock = 8;
  // The blocks of eight weight rows from jb to je (exclusive, in weight rows).
  auto blocks = [&](int jb, int je) {
    std::vector<float> sc(static_cast<size_t>(kBlock) * g), bi(static_cast<size_t>(kBlock) * g);
    for (int j0 = jb; j0 < je; j0 += kBlock) {
      const int block = std::min(kBlock, n - j0);
      for (int64_t e = 0; e < static_cast<int64_t>(block) * g; ++e) {
        sb(static_cast<int64_t>(j0) * g + e, &sc[e], &bi[e]);
      }
      for (int m = 0; m < rows;) {
#ifdef MLXS_X86
        if (has_avx2() && block == kBlock) {
          // Up to kQRows rows of x against these eight weight rows, each weight dequantized
          // once for them.
          const int nr = std::min(kQRows, rows - m);
          const float* xs[kQRows];
          float sums[kQRows][kBlock];
          float* outs[kQRows];
          for (int r = 0; r < nr; ++r) {
            xs[r] = xrow(m + r);
            outs[r] = sums[r];
          }
          const uint8_t* wb = wp + j0 * wld;
          qrows8_avx2_up_to<RND, BITS, kQRows>(nr, xs, wb, wld, sc.data(), bi.data(), g, k, gs,
                                                outs);
          for (int r = 0; r < nr; ++r) {
            T* o = orow(m + r);
            for (int j = 0; j < kBlock; ++j) o[j0 + j] = static_cast<T>(sums[r][j]);
          }
          m += nr;
          continue;
        }
#endif
        const float* xr = xrow(m);
        float sums[kBlock];
        for (int j = 0; j < block; ++j) {
          sums[j] = qdot_in_order<RND, BITS>(xr, wp + (j0 + j) * wld, sc.data() + j * g,
                                             bi.data() + j * g, k, gs);
        }
        T* o = orow(m);
        for (int j = 0; j < block; ++j) o[j0 + j] = static_cast<T>(sums[j]);
        ++m;
      }
    }
  };
  // A few parts a thread, so that a thread slowed by other work delays little.
  const int nblocks = (n + kBlock - 1) / kBlock;
  const int64_t macs = static_cast<int64_t>(rows) * n * k;
  Pool& pool = Pool::get();
  const int parts =
      macs < kParallelMin || pool.threads() == 1 ? 1 : std::min(nblocks, 4 * pool.threads());
  if (parts <= 1) {
    blocks(0, n);
    return;
  }
  pool.run(parts, [&](int i) {
    const int b0 = static_cast<int>(static_cast<int64_t>(nblocks) * i / parts);
    const int b1 = static_cast<int>(static_cast<int64_t>(nblocks) * (i + 1) / parts);
    blocks(b0 * kBlock, std::min(n, b1 * kBlock));
  });
}

// Every row of x [..., k] as float (exact), row after row.
template <typename T>
std::vector<float> rows_as_float(const mx::array& x) {
  const auto* xp = x.data<T>();
  std::vector<float> xs(x.size());
  const bool dense = x.flags().row_contiguous;
  for (int64_t e = 0; e < static_cast<int64_t>(x.size()); ++e) {
    xs[e] = static_cast<float>(dense ? xp[e] : xp[offset_of(e, x.shape(), x.strides())]);
  }
  return xs;
}

template <typename T, int BITS>
void run_q(const mx::array& x, const mx::array& w, const mx::array& scales,
           const mx::array& biases, int gs, mx::array& out) {
  const int k = x.shape(-1);
  const int n = w.shape(0);
  const int rows = static_cast<int>(x.size() / k);
  const auto* wp = reinterpret_cast<const uint8_t*>(w.data<uint32_t>());
  const auto* sp = scales.data<T>();
  const auto* bp = biases.data<T>();
  auto* op = out.data<T>();
  const std::vector<float> xs = rows_as_float<T>(x);
  const bool dense = scales.flags().row_contiguous && biases.flags().row_contiguous;
  q_rows<T, BITS>(
      rows, [&](int m) { return xs.data() + static_cast<int64_t>(m) * k; },
      [&](int m) { return op + static_cast<int64_t>(m) * n; }, wp, n, k, gs,
      [&](int64_t at, float* s, float* b) {
        *s = static_cast<float>(dense ? sp[at] : sp[offset_of(at, scales.shape(), scales.strides())]);
        *b = static_cast<float>(dense ? bp[at] : bp[offset_of(at, biases.shape(), biases.strides())]);
      });
}

// gather_qmm with one expert index a row (MLX's CPU `GatherQMM`: `_qmm_t` of each row of x
// by its expert's weight): output row r is row r / xrep of x [rows / xrep, k] by expert
// idx[r] of w [experts, n, k * BITS / 32] (row-contiguous, as are scales and biases
// [experts, n, k / gs]). Rows of one expert go together, so its scales are converted once.
template <typename T, int BITS>
void run_gather_q(const mx::array& x, const mx::array& w, const mx::array& scales,
                  const mx::array& biases, const mx::array& idx, int gs, int xrep,
                  mx::array& out) {
  const int k = x.shape(-1);
  const int n = w.shape(1);
  const int g = k / gs;
  const int64_t rows = static_cast<int64_t>(idx.size());
  const int64_t wsize = static_cast<int64_t>(n) * k * BITS / 8;  // bytes an expert
  const auto* wp = reinterpret_cast<const uint8_t*>(w.data<uint32_t>());
  const auto* sp = scales.data<T>();
  const auto* bp = biases.data<T>();
  const auto* ip = idx.data<uint32_t>();
  auto* op = out.data<T>();
  const std::vector<float> xs = rows_as_float<T>(x);
  std::vector<int64_t> order(rows);
  std::vector<uint32_t> experts(rows);
  const bool idense = idx.flags().row_contiguous;
  for (int64_t r = 0; r < rows; ++r) {
    order[r] = r;
    experts[r] = idense ? ip[r] : ip[offset_of(r, idx.shape(), idx.strides())];
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return experts[a] < experts[b]; });
  for (int64_t lo = 0; lo < rows;) {
    const uint32_t e = experts[order[lo]];
    int64_t hi = lo + 1;
    while (hi < rows && experts[order[hi]] == e) ++hi;
    const int64_t s0 = static_cast<int64_t>(e) * n * g;
    q_rows<T, BITS>(
        static_cast<int>(hi - lo),
        [&](int m) { return xs.data() + (order[lo + m] / xrep) * k; },
        [&](int m) { return op + order[lo + m] * n; }, wp + e * wsize, n, k, gs,
        [&](int64_t at, float* s, float* b) {
          *s = static_cast<float>(sp[s0 + at]);
          *b = static_cast<float>(bp[s0 + at]);
        });
    lo = hi;
  }
}

template <typename T>
struct TypeTag {
  using type = T;
};

// f(TypeTag<T>, integral_constant<int, BITS>) for bfloat16 (`b16`) or float32 outputs and 4
// or 8 bits: the instantiations the quantized primitives run.
template <typename F>
void by_type(bool b16, int bits, F&& f) {
  using B4 = std::integral_constant<int, 4>;
  using B8 = std::integral_constant<int, 8>;
  if (b16) {
    bits == 4 ? f(TypeTag<mx::bfloat16_t>{}, B4{}) : f(TypeTag<mx::bfloat16_t>{}, B8{});
  } else {
    bits == 4 ? f(TypeTag<float>{}, B4{}) : f(TypeTag<float>{}, B8{});
  }
}

class RowQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  RowQuantizedMatmul(mx::Stream s, int group_size, int bits)
      : mx::UnaryPrimitive(s), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto& enc = cpu_encoder_for(stream(), inputs, out);
    enc.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                  w = mx::array::unsafe_weak_copy(inputs[1]),
                  sc = mx::array::unsafe_weak_copy(inputs[2]),
                  bi = mx::array::unsafe_weak_copy(inputs[3]),
                  out = mx::array::unsafe_weak_copy(out), gs = group_size_,
                  bits = bits_]() mutable {
      if (!w.flags().row_contiguous) {
        throw std::runtime_error("[RowQuantizedMatmul] the packed weight must be row-contiguous");
      }
      by_type(out.dtype() == mx::bfloat16, bits, [&](auto t, auto b) {
        run_q<typename decltype(t)::type, decltype(b)::value>(x, w, sc, bi, gs, out);
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[RowQuantizedMatmul] runs on the CPU only");
  }

  // Gradients with respect to x, as MLX's QuantizedMatmul gives them (the weight is
  // constant): cotangent @ dequantize(w).
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg != 0) {
        throw std::invalid_argument("[RowQuantizedMatmul] no gradient for the quantized weight");
      }
      grads.push_back(mx::quantized_matmul(cotangents[0], primals[1], primals[2], primals[3],
                                           false, group_size_, bits_, "affine", stream()));
    }
    return grads;
  }

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override {
    if (argnums.size() != 1 || argnums[0] != 0) {
      throw std::invalid_argument("[RowQuantizedMatmul] no derivative for the quantized weight");
    }
    return {mx::quantized_matmul(tangents[0], primals[1], primals[2], primals[3], true,
                                 group_size_, bits_, "affine", stream())};
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.back() = inputs[1].shape(0);
    return {s};
  }

  const char* name() const override { return "RowQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const RowQuantizedMatmul*>(&other);
    return o != nullptr && o->group_size_ == group_size_ && o->bits_ == bits_;
  }

 private:
  int group_size_;
  int bits_;
};

// gather_qmm(x, w, scales, biases, rhs_indices=idx, transpose=True) on the CPU: inputs x,
// w, scales, biases (row-contiguous), idx; output idx.shape + [1, n].
class RowGatherQmm : public mx::UnaryPrimitive {
 public:
  RowGatherQmm(mx::Stream s, int group_size, int bits, bool sorted)
      : mx::UnaryPrimitive(s), group_size_(group_size), bits_(bits), sorted_(sorted) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto& enc = cpu_encoder_for(stream(), inputs, out);
    enc.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                  w = mx::array::unsafe_weak_copy(inputs[1]),
                  sc = mx::array::unsafe_weak_copy(inputs[2]),
                  bi = mx::array::unsafe_weak_copy(inputs[3]),
                  idx = mx::array::unsafe_weak_copy(inputs[4]),
                  out = mx::array::unsafe_weak_copy(out), gs = group_size_,
                  bits = bits_]() mutable {
      if (!w.flags().row_contiguous || !sc.flags().row_contiguous ||
          !bi.flags().row_contiguous) {
        throw std::runtime_error("[RowGatherQmm] the experts must be row-contiguous");
      }
      const int xrep = static_cast<int>(idx.size() / (x.size() / x.shape(-1)));
      by_type(out.dtype() == mx::bfloat16, bits, [&](auto t, auto b) {
        run_gather_q<typename decltype(t)::type, decltype(b)::value>(x, w, sc, bi, idx, gs,
                                                                     xrep, out);
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[RowGatherQmm] runs on the CPU only");
  }

  // Derivatives with respect to x: MLX's own, of the gather_qmm this primitive computes.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    for (int arg : argnums) {
      if (arg != 0) {
        throw std::invalid_argument("[RowGatherQmm] no gradient for the quantized experts");
      }
    }
    return {mx::vjp(mlx_op(primals), {primals[0]}, cotangents).second[0]};
  }

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override {
    if (argnums.size() != 1 || argnums[0] != 0) {
      throw std::invalid_argument("[RowGatherQmm] no derivative for the quantized experts");
    }
    return mx::jvp(mlx_op(primals), {primals[0]}, {tangents[0]}).second;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[4].shape();
    s.push_back(1);
    s.push_back(inputs[1].shape(1));
    return {s};
  }

  const char* name() const override { return "RowGatherQmm"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const RowGatherQmm*>(&other);
    return o != nullptr && o->group_size_ == group_size_ && o->bits_ == bits_ &&
           o->sorted_ == sorted_;
  }

 private:
  // MLX's gather_qmm of x by the primals' experts and indices.
  std::function<std::vector<mx::array>(const std::vector<mx::array>&)> mlx_op(
      const std::vector<mx::array>& primals) {
    return [p = primals, gs = group_size_, bits = bits_, sorted = sorted_,
            s = stream()](const std::vector<mx::array>& in) -> std::vector<mx::array> {
      return {mx::gather_qmm(in[0], p[1], p[2], p[3], std::nullopt, p[4], true, gs, bits,
                             "affine", std::nullopt, sorted, s)};
    };
  }

  int group_size_;
  int bits_;
  bool sorted_;
};

}  // namespace

std::optional<mx::array> try_cpu_gemv(const mx::array& a, const mx::array& b,
                                      const std::optional<mx::array>& c, mx::StreamOrDevice s) {
  if (!kSameArithmetic || !g_switch.on() || a.ndim() < 2 || b.ndim() != 2 ||
      a.dtype() != b.dtype()) {
    return std::nullopt;
  }
  const auto dt = a.dtype();
  if (dt != mx::float32 && dt != mx::bfloat16 && dt != mx::float16) return std::nullopt;
  const int k = a.shape(-1);
  const int n = b.shape(1);
  if (k <= 0 || n <= 0 || b.shape(0) != k) return std::nullopt;
  mx::Stream st = mx::to_stream(s);
  if (st.device != mx::Device::cpu) return std::nullopt;
  mx::Shape out_shape = a.shape();
  out_shape.back() = n;
  std::vector<mx::array> inputs = {a, b};
  if (c) {
    if (c->dtype() != dt) return std::nullopt;
    // addmm broadcasts c to the output; anything else is MLX's to report.
    if (c->ndim() > out_shape.size()) return std::nullopt;
    const int lead = static_cast<int>(out_shape.size()) - static_cast<int>(c->ndim());
    for (int d = 0; d < static_cast<int>(c->ndim()); ++d) {
      if (c->shape(d) != 1 && c->shape(d) != out_shape[lead + d]) return std::nullopt;
    }
    inputs.push_back(*c);
  }
  g_switch.count();
  return mx::array(out_shape, dt, std::make_shared<RowMatmul>(st, c.has_value()), inputs);
}

std::optional<mx::array> try_cpu_qmv(const mx::array& x, const mx::array& w,
                                     const mx::array& scales,
                                     const std::optional<mx::array>& biases, bool transpose,
                                     std::optional<int> group_size, std::optional<int> bits,
                                     const std::string& mode, mx::StreamOrDevice s) {
  if (!kSameArithmetic || !g_switch.on()) return std::nullopt;
  const int gs = group_size.value_or(64);
  const int nbits = bits.value_or(4);
  auto kn = affine_operands(x, w, scales, biases, transpose, mode, gs, nbits);
  if (!kn) return std::nullopt;
  if (quantized_operands_traced(w, scales, biases)) return std::nullopt;
  const int n = kn->second;
  // bfloat16 throughout, or float32 activations with scales of any float type (MLX
  // casts them to float32 first, as done below).
  const bool bf16 = x.dtype() == mx::bfloat16 && scales.dtype() == mx::bfloat16 &&
                    biases->dtype() == mx::bfloat16;
  auto floating = [](mx::Dtype d) {
    return d == mx::float32 || d == mx::float16 || d == mx::bfloat16;
  };
  const bool f32 = x.dtype() == mx::float32 && floating(scales.dtype()) &&
                   floating(biases->dtype());
  if (!bf16 && !f32) return std::nullopt;
  mx::Stream st = mx::to_stream(s);
  if (st.device != mx::Device::cpu) return std::nullopt;
  mx::Shape out_shape = x.shape();
  out_shape.back() = n;
  g_switch.count();
  // The packed weight is read row by row: make sure it is row-contiguous.
  const mx::Dtype dt = x.dtype();
  return mx::array(out_shape, dt, std::make_shared<RowQuantizedMatmul>(st, gs, nbits),
                   {x, mx::contiguous(w, false, st), mx::astype(scales, dt, st),
                    mx::astype(*biases, dt, st)});
}

std::optional<mx::array> try_cpu_gather_qmm(
    const mx::array& x, const mx::array& w, const mx::array& scales,
    const std::optional<mx::array>& biases, const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices, bool transpose, std::optional<int> group_size,
    std::optional<int> bits, const std::string& mode, bool sorted, mx::StreamOrDevice s) {
  if (!kSameArithmetic || !g_switch.on() || !g_gather.on()) return std::nullopt;
  const int gs = group_size.value_or(64);
  const int nbits = bits.value_or(4);
  const auto g =
      gather_operands(x, w, scales, biases, lhs_indices, rhs_indices, transpose, mode, gs, nbits);
  if (!g || quantized_operands_traced(w, scales, biases)) return std::nullopt;
  // x, scales and biases of one dtype, bfloat16 or float32 (MLX reads the scales in x's).
  const mx::Dtype dt = x.dtype();
  if ((dt != mx::bfloat16 && dt != mx::float32) || scales.dtype() != dt ||
      biases->dtype() != dt) {
    return std::nullopt;
  }
  mx::Stream st = mx::to_stream(s);
  if (st.device != mx::Device::cpu) return std::nullopt;
  g_switch.count();
  return mx::array(g->out_shape, dt, std::make_shared<RowGatherQmm>(st, gs, nbits, sorted),
                   {x, mx::contiguous(w, false, st), mx::contiguous(scales, false, st),
                    mx::contiguous(*biases, false, st), *rhs_indices});
}

void set_fast_cpu_gemv(bool on) { g_switch.set(on); }
bool fast_cpu_gemv_enabled() { return g_switch.on(); }
unsigned long long fast_cpu_gemv_uses() { return g_switch.uses(); }

}  // namespace mlxs_detail
