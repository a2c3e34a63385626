// qmv_host_check.cpp: fast_qmv.cpp's one-row 4-bit bodies run on the CPU, lane by lane, to
// check that each form hands the bfloat16 operations the same operands as the other
// (MLX_FAST_QMV_LEAN=1 against the default, and the lean one-row body with x's alignment
// decided once, MLX_FAST_QMV_ALIGNED_SPLIT=1): built and run by
// `benchmarks/kernel_offline.py --host-check`, which writes the file's device code to
// `qmv_device.h` beside a stub `cooperative_groups/reduce.h`.
//
// The CUDA names the bodies use are emulated here: bfloat16 values and their arithmetic
// (each operation rounded to bfloat16, nearest even), __byte_perm (PTX prmt's default
// mode, selectors below 8), the thread and block indices, and cg::reduce, which records
// each lane's float sum (in call order) instead of adding across the warp. Two forms agree
// where every recorded sum and every stored output is bit-identical; the arithmetic
// itself is not the device's (no fused multiply-add where the device contracts one), and
// need not be: both forms run the same emulated operations, so equal records mean equal
// operands, and the device's operations on equal operands give equal results.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
static Dim3 threadIdx, blockIdx, blockDim;
using std::max;
using std::min;

struct uint2 {
  uint32_t x, y;
};
struct uint4 {
  uint32_t x, y, z, w;
};
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }

#define __align__(n) __attribute__((aligned(n)))

struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  explicit __nv_bfloat16(int v);
  static __nv_bfloat16 raw(uint16_t b) {
    __nv_bfloat16 r;
    r.bits = b;
    return r;
  }
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline float bf_to_f(__nv_bfloat16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 f_to_bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16::raw(static_cast<uint16_t>((u >> 16) | 0x40u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16::raw(static_cast<uint16_t>(u >> 16));
}
inline __nv_bfloat16 rn(double d) { return f_to_bf(static_cast<float>(d)); }
inline __nv_bfloat16::__nv_bfloat16(int v) : bits(f_to_bf(static_cast<float>(v)).bits) {}
inline __nv_bfloat16 operator*(__nv_bfloat16 a, __nv_bfloat16 b) {
  return rn(static_cast<double>(bf_to_f(a)) * bf_to_f(b));
}
inline __nv_bfloat16 operator+(__nv_bfloat16 a, __nv_bfloat16 b) {
  return rn(static_cast<double>(bf_to_f(a)) + bf_to_f(b));
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return f_to_bf(f); }
// What rms_norm_x (not run here) needs to compile.
inline float __bfloat162float(__nv_bfloat16 v) { return bf_to_f(v); }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
inline float __low2float(__nv_bfloat162 v) { return bf_to_f(v.x); }
inline float __high2float(__nv_bfloat162 v) { return bf_to_f(v.y); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {f_to_bf(a), f_to_bf(b)}; }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 v) { return {v, v}; }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) {
  return rn(static_cast<double>(bf_to_f(a)) + bf_to_f(b));
}
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {__hadd(a.x, b.x), __hadd(a.y, b.y)};
}
inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {rn(static_cast<double>(bf_to_f(a.x)) - bf_to_f(b.x)),
          rn(static_cast<double>(bf_to_f(a.y)) - bf_to_f(b.y))};
}
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {rn(static_cast<double>(bf_to_f(a.x)) * bf_to_f(b.x)),
          rn(static_cast<double>(bf_to_f(a.y)) * bf_to_f(b.y))};
}
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
  return {rn(static_cast<double>(bf_to_f(a.x)) * bf_to_f(b.x) + bf_to_f(c.x)),
          rn(static_cast<double>(bf_to_f(a.y)) * bf_to_f(b.y) + bf_to_f(c.y))};
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
// PTX prmt.b32's default mode: byte n of the result is byte (s >> 4n) & 7 of {y, x}
// (x bytes 0-3); a selector's bit 3 would replicate the byte's sign (unused here).
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const unsigned sel = (s >> (4 * n)) & 0xFu;
    if (sel > 7) std::abort();
    r |= static_cast<uint32_t>((v >> (8 * sel)) & 0xFFu) << (8 * n);
  }
  return r;
}
inline void __syncthreads() {}

namespace mlx::core::cu {
struct Multiply {
  template <class A, class B>
  A operator()(A a, B) const {
    return a;
  }
};
struct Sigmoid {
  template <class A>
  A operator()(A a) const {
    return a;
  }
};
}  // namespace mlx::core::cu

#include "qmv_device.h"

std::vector<float> g_record;

namespace {

struct Operands {
  std::vector<__nv_bfloat16> x;  // m rows of k, plus one element of slack (x may start at 1)
  std::vector<uint32_t> w;
  std::vector<__nv_bfloat16> s, b;
};

Operands make(int n, int k, int gs, int m, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<uint32_t> word;
  Operands o;
  o.x.resize(static_cast<size_t>(m) * k + 8);
  for (auto& v : o.x) v = f_to_bf(u(rng));
  o.w.resize(static_cast<size_t>(n) * k / 8);
  for (auto& v : o.w) v = word(rng);
  o.s.resize(static_cast<size_t>(n) * k / gs);
  o.b.resize(o.s.size());
  for (auto& v : o.s) v = f_to_bf(0.01f + 0.05f * std::fabs(u(rng)));
  for (auto& v : o.b) v = f_to_bf(0.1f * u(rng));
  return o;
}

// Runs `body(block)` for every lane of every warp of `blocks` blocks of `warps` warps; the
// recorded sums and the outputs.
template <class F>
std::pair<std::vector<float>, std::vector<uint16_t>> run(int blocks, int warps,
                                                         std::vector<__nv_bfloat16>& out,
                                                         F body) {
  g_record.clear();
  for (auto& v : out) v.bits = 0xffff;
  for (int blk = 0; blk < blocks; ++blk)
    for (unsigned wy = 0; wy < static_cast<unsigned>(warps); ++wy)
      for (unsigned lane = 0; lane < 32; ++lane) {
        threadIdx.x = lane;
        threadIdx.y = wy;
        body(blk);
      }
  std::vector<uint16_t> o;
  for (auto v : out) o.push_back(v.bits);
  return {g_record, o};
}

int failures = 0;

template <class R>
void compare(const char* what, const R& a, const R& b) {
  const bool same = a.first.size() == b.first.size() && a.second == b.second &&
                    std::memcmp(a.first.data(), b.first.data(), a.first.size() * sizeof(float)) == 0;
  std::printf("%-44s %zu sums, %zu outputs: %s\n", what, a.first.size(), a.second.size(),
              same ? "identical" : "DIFFER");
  if (!same) ++failures;
}

template <int K, int GS>
void check(std::mt19937& rng) {
  const int n = 12;  // three blocks of four rows; rows_n's two-row warps end past n
  const int m = 3;
  Operands o = make(n, K, GS, m, rng);
  for (int off : {0, 1}) {  // x aligned, and one element in (the unaligned loads)
    const __nv_bfloat16* x = o.x.data() + off;
    std::vector<__nv_bfloat16> out(n);
    char what[96];
    // xs: XS (MLX_FAST_QMV_ALIGNED_SPLIT), an unaligned x (off 1) through row_sum_any.
    auto rows1 = [&](auto lean, auto xs) {
      return run(3, 4, out, [&](int blk) {
        mlxs_qmv::rows1<K, GS, 4, 32, false, decltype(lean)::value, decltype(xs)::value>(
            x, o.w.data(), o.s.data(), o.b.data(), out.data(), n, blk, nullptr);
      });
    };
    const auto first = rows1(std::false_type{}, std::false_type{});
    std::snprintf(what, sizeof(what), "rows1 K %d GS %d x+%d", K, GS, off);
    compare(what, first, rows1(std::true_type{}, std::false_type{}));
    std::snprintf(what, sizeof(what), "rows1 (aligned split) K %d GS %d x+%d", K, GS, off);
    compare(what, first, rows1(std::true_type{}, std::true_type{}));
    // xs as rows1's: an unaligned x (off 1) through rows_n_any.
    auto heads = [&](auto lean, auto xs) {
      return run(2, 4, out, [&](int blk) {
        mlxs_qmv::rows_n<K, GS, 4, 8, 2, false, false, decltype(lean)::value,
                         decltype(xs)::value>(x, o.w.data(), o.s.data(), o.b.data(),
                                              out.data(), n - 1, blk, nullptr);
      });
    };
    const auto heads0 = heads(std::false_type{}, std::false_type{});
    std::snprintf(what, sizeof(what), "rows_n (2 rows a warp) K %d GS %d x+%d", K, GS, off);
    compare(what, heads0, heads(std::true_type{}, std::false_type{}));
    std::snprintf(what, sizeof(what), "rows_n (2 rows a warp, aligned split) K %d GS %d x+%d",
                  K, GS, off);
    compare(what, heads0, heads(std::true_type{}, std::true_type{}));
    auto longr = [&](auto lean, auto xs) {
      return run(3, 4, out, [&](int blk) {
        mlxs_qmv::rows_n<K, GS, 4, 4, 1, true, false, decltype(lean)::value,
                         decltype(xs)::value>(x, o.w.data(), o.s.data(), o.b.data(),
                                              out.data(), n, blk, nullptr);
      });
    };
    const auto long0 = longr(std::false_type{}, std::false_type{});
    std::snprintf(what, sizeof(what), "rows_n (window) K %d GS %d x+%d", K, GS, off);
    compare(what, long0, longr(std::true_type{}, std::false_type{}));
    std::snprintf(what, sizeof(what), "rows_n (window, aligned split) K %d GS %d x+%d", K, GS,
                  off);
    compare(what, long0, longr(std::true_type{}, std::true_type{}));
    std::vector<__nv_bfloat16> outm(static_cast<size_t>(m) * n);
    auto rowsm = [&](auto lean) {
      return run(2, 4, outm, [&](int blk) {
        mlxs_qmv::rows_m<K, GS, 4, 4, 4, 2, decltype(lean)::value>(
            x, o.w.data(), o.s.data(), o.b.data(), outm.data(), n - 1, m, blk, 0);
      });
    };
    std::snprintf(what, sizeof(what), "rows_m (%d rows of x) K %d GS %d x+%d", m, K, GS, off);
    compare(what, rowsm(std::false_type{}), rowsm(std::true_type{}));
  }
}

// The gathered form (MLX_FAST_GATHER_QMV=1, both LEAN forms): row i of the product must be
// rows1's on expert idx[i]'s slice of the stack and x's row i / xrep, bit for bit.
template <int K, int GS>
void check_gather(std::mt19937& rng) {
  const int n = 8, experts = 5, xrows = 2, xrep = 3, m = xrows * xrep;
  Operands o = make(n * experts, K, GS, xrows, rng);
  const std::vector<uint32_t> idx = {3, 0, 4, 4, 1, 7};  // 7: past the stack, reads the last
  for (bool lean : {false, true}) {
    std::vector<__nv_bfloat16> out(static_cast<size_t>(m) * n);
    auto gathered = run(2, 4, out, [&](int blk) {
      for (int i = 0; i < m; ++i) {
        if (lean) {
          mlxs_qmv::gather_rows1<K, GS, 4, 32, true>(o.x.data(), o.w.data(), o.s.data(),
                                                     o.b.data(), idx.data(), out.data(), n,
                                                     xrep, experts, blk, i);
        } else {
          mlxs_qmv::gather_rows1<K, GS, 4, 32, false>(o.x.data(), o.w.data(), o.s.data(),
                                                      o.b.data(), idx.data(), out.data(), n,
                                                      xrep, experts, blk, i);
        }
      }
    });
    std::vector<__nv_bfloat16> one(static_cast<size_t>(m) * n);
    auto alone = run(2, 4, one, [&](int blk) {
      for (int i = 0; i < m; ++i) {
        const size_t rows = static_cast<size_t>(std::min<uint32_t>(idx[i], experts - 1)) * n;
        mlxs_qmv::rows1<K, GS, 4, 32, false, false>(
            o.x.data() + static_cast<size_t>(i / xrep) * K, o.w.data() + rows * (K / 8),
            o.s.data() + rows * (K / GS), o.b.data() + rows * (K / GS),
            one.data() + static_cast<size_t>(i) * n, n, blk, nullptr);
      }
    });
    char what[96];
    std::snprintf(what, sizeof(what), "gather_rows1%s K %d GS %d", lean ? " (lean)" : "", K, GS);
    compare(what, gathered, alone);
  }
}

}  // namespace

int main() {
  std::mt19937 rng(35);
  check<4096, 64>(rng);
  check<4096, 32>(rng);
  check<4096, 128>(rng);
  check<896, 64>(rng);  // K % 512 != 0: the last partial chunk
  check<1536, 32>(rng);
  check_gather<4096, 64>(rng);
  check_gather<2880, 64>(rng);  // gpt-oss-20b's experts: K % 512 != 0
  check_gather<2048, 32>(rng);
  std::printf(failures ? "%d form(s) differ\n" : "every form identical\n", failures);
  return failures ? 1 : 0;
}
