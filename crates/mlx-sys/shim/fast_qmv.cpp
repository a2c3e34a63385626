// fast_qmv.cpp: faster CUDA kernels for 4-bit quantized matmuls of one row (the decoding
// step's projections), with the same arithmetic as MLX's own `qmv` kernel, and of 2..32
// rows, with that arithmetic for each row.
//
// MLX 0.32.4 runs `quantized_matmul(x, w, scales, biases, transpose=True)` with one row of
// x (M * batch == 1) through its CUDA `qmv` kernel (on the H200 for every shape seen, the
// 128256- and 151936-row vocabulary heads included): one warp per output row; lane l takes
// the 16 consecutive elements l*16 + r*512 of chunk r, dequantizes them in bfloat16
// (`w * scale + bias`) and accumulates x * w with bfloat16 fused multiply-adds into 16
// per-lane accumulators, chunk after chunk; then each lane sums its 16 accumulators in
// float32 in order, the warp reduces with `cg::reduce`, and lane 0 rounds the float sum to
// bfloat16. That kernel walks its chunks one after the other, so a warp has one load of
// weights in flight at a time: on an H200 it streams a 4096 x 14336 weight at ~0.8 TB/s.
//
// The kernels below keep every rounding step of that definition (same lanes, same order of
// accumulation, same reduction; the dequantize is MLX's expression verbatim: forming
// v * scale exactly by an FMA and then adding the bias changed results, so the compiler
// evidently contracts MLX's multiply-add) and change only how the loads are issued and how
// rows map to warps:
// - kBody: one row a warp, all of a lane's loads issued before its arithmetic, fully
//   unrolled for the (compile-time) K;
// - kBodyRows: several rows a warp (x read once for them) with a window of loads in
//   flight, for the long rows of down projections and the many rows of vocabulary heads.
// Outputs are bit-identical (checked on the H200 against MLX's kernel for every product
// shape of the benchmark models at group sizes 32/64/128, heads included, and for the
// logits of whole decoding runs: `fused_check MODEL ... qmv` in mlx-engine's examples,
// benchmarks/GPU.md runs 6 and 7). Under ncu (cold L2), kBody beat MLX's kernel at every
// shape measured (4096 x 14336 36 -> 18 us, the 8B head 287 -> 135 us, 512 x 2048
// 4.7 -> 3.8 us), and a prototype of kBodyRows did better still on down projections and
// heads (14336 x 4096 38 -> 21 us, the 8B head -> 118 us).
//
// The projections of one input (q/k/v, gate/up) can run as one launch
// (`try_fast_qmv_many`): each weight's rows run the same body as alone, so every output
// is the same as its own launch's; one launch fewer matters where the step is bound by the
// host (`kManyMaxElements` can bound a group's size).
//
// A projection's output can also come with its residual added (`try_fast_qmv_add`: MLX's
// bfloat16 add of the rounded product, in the same launch: an `add` node fewer twice a
// layer). On by default (`MLX_FAST_QMV_RESIDUAL=0` turns it off): `fused_check` found
// the logits identical to MLX's separate `add` on three models, and decoding 4-12%
// faster on the two small ones in one process (benchmarks/GPU.md run 9).
//
// A gate/up pair that would run as one launch can also give mlx-lm's swiglu of the two
// products instead (`try_fast_qmv_swiglu`): warps of one block compute row r of both
// weights, round each product to bfloat16 as MLX stores it, and one lane applies MLX's
// own `Sigmoid` and `Multiply` device functors in the order of MLX's compiled swiglu
// kernel. Identical on qwen2.5-0.5b's shapes and logits (run 9); `MLX_FAST_QMV_SWIGLU=0`
// turns it off.
//
// Products of 2..32 rows of x of several sequences (batched decoding and verification;
// x's batch dimensions flattened into rows as MLX does; one sequence's rows stay MLX's, see
// fast_rows), which MLX runs (by its
// CUDA dispatch, for these weights on an H200) through `qmv` once per row below 8 rows,
// reading the weights again for each, and through `qmm_sm80` from 8 rows (far slower than
// its dense GEMM: Llama-3.1-8B 4-bit decoded 293 tok/s in all at batch 32, against 267 at
// batch 1), run through kBodyM
// (`rows_m`): a warp takes 1, 2 or 4 rows of w (by default 2 where the grid stays large,
// else 1; `MLX_FAST_QMM_WARP_ROWS` fixes one) and a part of up to 8, 4 or 2 rows of x, and
// computes each pair of a row of w and a row of x with row_sum's arithmetic exactly (its
// own 16 accumulators a lane, the same bfloat16 FMAs in the same order, the same float
// sum, warp reduce and rounding); a chunk of w is loaded and dequantized once for the
// part's rows of x, a chunk of x loaded once for the warp's rows of w. So every output row
// has the bits of that row's one-row product, which are MLX's `qmv` bits, whatever the
// batch size or the layout: MLX's own bits below 8 rows, not those of its `qmm` from 8 rows
// (another order of sums), which mlx-lm on the GPU does not keep across batch sizes
// either (see docs/parity.md). Parts of
// x are as even as possible (9 rows by 8: 5 and 4), one a block of grid x, and the kernel
// reads the rows of x and of w from their shapes, so one kernel per (K, group size, part
// size, layout) serves every row count and weight. On by default for 2..MLX_FAST_QMM_MAX_ROWS (32) rows where the
// one-row kernels take the weight; `MLX_FAST_QMM=0` (or `set_fast_qmm(false)`) gives MLX's
// `qmm` back, and products of more rows go to fast_qmm.cpp's tiled kernel of MLX's own
// bits, or to MLX (or to the dequantized dense product of mlx_shim.cpp under
// MLX_DEQUANT_GEMM=1). `qmm_rows_check` in mlx-engine's
// examples checks every row against its one-row product, for each layout, and times them
// against MLX's `qmm`.
//
// Rows of several sequences take a tensor-core form of that product by default
// (`rows_mma`, `mma_rows`; docs/parity.md): w's nibbles dequantized in registers with MLX's
// expression and fed as the `a` operand of `mma.sync` m16n8k16 products (16 rows of w by
// 8 rows of x, float32 accumulators), the 8 warps of a block splitting K and their partial
// sums added in warp order. The sums run in another order than MLX's (not its bits at any
// batch size, and a row's result depends on its batch, as with MLX's `qmm`), so accuracy
// is what is checked (`qmm_mma_check`: RMS error against a float32 reference no larger
// than the exact kernel's or MLX's). kBodyM spends bfloat16 FMAs a row of x each (at 32
// rows the 8B model's decoding step took 39 ms against ~3.7 ms at one row: session 16);
// the tensor cores take the products. Rows of any count go in parts of 32 along grid x.
// `MLX_FAST_QMM_MMA=0` keeps kBodyM (up to 32 rows; MLX above), `force` sends every
// product of 2 or more rows here (one sequence's too: the quality gate's setting),
// `MLX_FAST_QMM_MMA_MIN_ROWS=N` (2) leaves fewer rows to kBodyM and
// `MLX_FAST_QMM_MMA_MAX_ROWS=N` (no bound by default) leaves more rows of several
// sequences to kBodyM (up to 32) or MLX.
//
// The kernels go through MLX's `fast::cuda_kernel` (compiled with NVRTC the first time a
// machine needs them, into MLX's disk cache: kernel_cache.h), with the device code in a header file (`device_kernel`) so each
// kernel's own source is one line: MLX's scheduling cost per call grows with the source.
// They are used only where MLX itself would run `qmv` (the conditions below), on the CUDA
// backend, for bfloat16 activations, 4-bit affine weights,
// group sizes 32, 64, 128 and K <= 16384. `MLX_FAST_QMV=0` or `mlxs_set_fast_qmv(false)`
// turns them all off (kBodyM too); `MLX_FAST_QMV_PIPELINED=0` keeps every shape on kBody;
// `MLX_FAST_QMV_MIN_ELEMENTS=N` leaves weights of fewer than N elements to MLX;
// `MLX_FAST_QMV_MANY=0` keeps one launch per weight, `MLX_FAST_QMV_MANY_MAX_ELEMENTS=N`
// sets the size bound of one launch for several.
#include "fast_qmv.h"

#include "affine_operands.h"
#include "fast_qmm.h"
#include "kernel_cache.h"
#include "kernel_switch.h"
#include "mlx/fast_primitives.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mlx/backend/cuda/cuda.h"
#include "mlx/mlx.h"

namespace mx = mlx::core;

namespace mlxs_detail {
namespace {

// Weights of fewer elements stay on MLX's kernel. All sizes by default: ours measured
// faster at every shape of the benchmark models (down to 512 x 2048), and the 8B model
// decodes 18% faster with its small k/v projections on it too (benchmarks/GPU.md run 7).
// MLX_FAST_QMV_MIN_ELEMENTS=N sets another floor (for A/B runs).
constexpr long long kMinElements = 0;
// The longest rows we take (the kernel is unrolled for its K; K up to this was checked).
constexpr int kMaxK = 16384;
// CUDA's limit on the blocks of a grid's y dimension.
constexpr long long kMaxBlocksY = 65535;

KernelSwitch g_switch("MLX_FAST_QMV");
KernelSwitch g_pipelined("MLX_FAST_QMV_PIPELINED");
KernelSwitch g_many("MLX_FAST_QMV_MANY");
// The residual add fused into the product (`try_fast_qmv_add`); MLX_FAST_QMV_RESIDUAL=0
// (or `set_fast_qmv_residual(false)`) leaves the add to MLX.
KernelSwitch g_residual("MLX_FAST_QMV_RESIDUAL");
// mlx-lm's swiglu of a gate/up pair computed in their launch (`try_fast_qmv_swiglu`);
// MLX_FAST_QMV_SWIGLU=0 (or `set_fast_qmv_swiglu(false)`) leaves it to MLX.
KernelSwitch g_swiglu("MLX_FAST_QMV_SWIGLU");
// The lean bodies: the one-row bodies (row_sum, rows_n) and kBodyM unpack nibbles by byte
// permutes and load from per-lane bases; ~25-40% fewer instructions a chunk (ptxas,
// sm_90a), every value the same (H100, session 37: every product shape and the 8B / 0.5B
// logits identical to MLX's qmv; the 8B 4-bit decodes 299 -> 340 tok/s at batch 1).
// MLX_FAST_QMV_LEAN=0 restores the earlier bodies.
KernelSwitch g_lean("MLX_FAST_QMV_LEAN");
// The one-row bodies with x's alignment decided once (row_sum's and rows_n's XS): an x view
// that is not 16-byte aligned goes to an out-of-line body (row_sum_any, rows_n_any), so the
// aligned body, which is what runs in practice, keeps its own registers: 64 -> 48 for the
// 8B's lean one-row, o_proj and gate/up swiglu launches, 168 -> 64 for its vocabulary
// head's two-row layout (ptxas for sm_90a, benchmarks/kernel_offline.py), 50% -> 62.5% of
// an H100's warps (the head: 18.75% -> 50%). Session 50's ncu found these launches bound by the warps
// and bytes in flight, not by instructions. Every value the same. Opt-in until measured on
// a device: MLX_FAST_QMV_ALIGNED_SPLIT=1.
KernelSwitch g_xsplit("MLX_FAST_QMV_ALIGNED_SPLIT", false);
// Gathered products of fewer than 8 rows (try_fast_gather_qmv) through the one-row body,
// MLX's gather_qmv bits (H100, session 37: identical; gpt-oss-20b shape batch-1 decode
// 450 -> 528 tok/s). MLX_FAST_GATHER_QMV=0 leaves them to MLX.
KernelSwitch g_gather_qmv("MLX_FAST_GATHER_QMV");
// A one-row product whose x is MLX's pending `rms_norm` of a row computes that norm in its
// own launch (rms_norm_x: MLX's values bit for bit) instead of after MLX's rms_norm
// kernel: a graph node and a launch fewer per norm (two a layer and the final norm in a
// decoding step). Its first form (the norm before the weight loads) had MLX's bits on an
// H100 and measured slower (8B 4-bit batch 1: 291 / 305 against 317 / 323 tok/s,
// benchmarks/GPU.md session 41); this form (NormPre: the norm after the row's loads are
// issued) has not run on a device. Off by default; MLX_FAST_QMV_NORM=1 (or
// `set_fast_qmv_norm(true)`) turns it on.
KernelSwitch g_norm("MLX_FAST_QMV_NORM", false);
// MLX's rms_norm runs rms_norm_small (whose order of sums rms_norm_x follows) up to this
// many bfloat16 values a row (8 a vector, 128 threads, 8 vectors a thread).
constexpr int kNormMaxK = 8 * 128 * 8;
// The most weights one launch takes (q/k/v).
constexpr size_t kMaxParts = 4;
// One launch for several weights only while they hold at most this many elements in all:
// no bound by default. Run 8 (H200, before the lean bodies and the swiglu in the launch)
// measured llama-3.1-8b-4bit 289 -> 265 tok/s with its 25M- and 117M-element groups as one
// launch, and a 16M bound kept them apart until session 40, whose H100s measured the
// reverse at batch 1 (q/k/v as one launch, gate/up with their swiglu as another: 128
// primitives fewer a step, whose encoding binds it): 238 / 232 -> 290 / 288 tok/s on one
// machine, 260 / 291 -> 307 / 301 and 300 / 310 -> 331 / 326 on two others; under ncu a
// layer's kernels took 111 us against 130 with the groups apart; logits identical
// (benchmarks/GPU.md session 40).
// MLX_FAST_QMV_MANY_MAX_ELEMENTS=N sets a bound (0: never one launch; 16777216: run 8's).
constexpr long long kManyMaxElements = std::numeric_limits<long long>::max();

// The products of 2..kQmmMaxRows rows of x (`fast_rows`): MLX_FAST_QMM=0 (or
// `set_fast_qmm(false)`) leaves them to MLX's own kernels, MLX_FAST_QMM_MAX_ROWS=N (or
// `set_fast_qmm_max_rows`) sets another bound.
KernelSwitch g_qmm("MLX_FAST_QMM");
constexpr long long kQmmMaxRows = 32;
// The weight of the dequantized dense product (`try_fast_dequantize`): MLX_FAST_DEQUANT=0
// leaves it to MLX's `dequantize`.
KernelSwitch g_dequant("MLX_FAST_DEQUANT");
// Rows of x times rows of w one warp takes at most: each pair holds 16 bfloat16
// accumulators a lane.
constexpr int kQmmPartRows = 8;
// Chunks of weights (of all its rows of w) a lane loads before their arithmetic.
constexpr int kQmmLoads = 8;
// Rows of w a warp: 1, 2 or 4. More rows share each load of x (the loads of x, not of w,
// bound the kernel at several rows of x: lane l reads 32 bytes at l * 32, so each 16-byte
// load of a warp costs 8 L1 wavefronts, 8 times the weight's per row of x) but leave
// fewer rows of x to a part (kQmmPartRows / rows), so w is read once per part (from L2
// after the first), and fewer warps in all. By default (0, "auto") 2 where that still
// leaves kQmmAutoMinBlocks blocks in the grid (about 4 a multiprocessor on an H200), else
// 1; MLX_FAST_QMM_WARP_ROWS=1|2|4 or `set_fast_qmm_warp_rows` fixes one (same bits).
constexpr int kQmmWarpRows = 0;
constexpr long long kQmmAutoMinBlocks = 512;
// The most rows the bound may be set to (a part of x per block of grid x).
constexpr long long kQmmRowsLimit = 1ll << 20;

// The tensor-core form of those products (`rows_mma`, docs/parity.md): MLX_FAST_QMM_MMA
// (or `set_fast_qmm_mma`) "0" off (each row keeps its one-row bits), "force" for every
// product of 2 or more rows (one sequence's rows and more than MLX_FAST_QMM_MAX_ROWS rows
// too: the quality gate's setting), else on for rows of several sequences from
// MLX_FAST_QMM_MMA_MIN_ROWS (kMmaMinRows) up to MLX_FAST_QMM_MAX_ROWS.
enum class MmaMode { kOff = 0, kOn = 1, kForce = 2 };
constexpr long long kMmaMinRows = 2;
// Warps a block (they split K), rows of x a part at most (8 a product).
constexpr int kMmaWarps = 8;
constexpr int kMmaMaxPartRows = 32;
// Blocks below which a weight takes 16 rows a block instead of 32 (about 2 a
// multiprocessor on an H200).
constexpr long long kMmaMinBlocks = 264;
// Experiments on the layout, read once (the defaults above otherwise; another split of K
// over the warps is another order of the partial sums, in the same accuracy class):
// MLX_FAST_QMM_MMA_WARPS (2, 4 or 8: the block's shared partial sums stay under 48 KB),
// MLX_FAST_QMM_MMA_MIN_BLOCKS (a huge value: 16 rows of w a block always) and
// MLX_FAST_QMM_MMA_RW=4 (64 rows of w a block where the grid keeps kMmaMinBlocks blocks
// and the partial sums fit 48 KB, i.e. with 4 or fewer warps at 32 rows of x). A warp
// reads its 8 * MF rows of x for each 16 rows of w it holds: at 32 rows of x and 32 rows
// of w (the default at batch 32) x's bytes from L2 are 4x the weight's, at 64 rows 2x
// (ptxas for sm_90a: 212 registers a thread, no spills; benchmarks/kernel_offline.py).
int mma_rw_max() {
  static const int v = env_count("MLX_FAST_QMM_MMA_RW", 2) == 4 ? 4 : 2;
  return v;
}
int mma_warps() {
  static const int v = [] {
    const long long w = env_count("MLX_FAST_QMM_MMA_WARPS", kMmaWarps);
    return (w == 2 || w == 4 || w == 8) ? static_cast<int>(w) : kMmaWarps;
  }();
  return v;
}
long long mma_min_blocks() {
  static const long long v = env_count("MLX_FAST_QMM_MMA_MIN_BLOCKS", kMmaMinBlocks);
  return v;
}
std::atomic<int> g_mma_mode{-1};
std::atomic<unsigned long long> g_mma_uses{0};

MmaMode mma_mode() {
  int v = g_mma_mode.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("MLX_FAST_QMM_MMA");
    v = static_cast<int>(MmaMode::kOn);
    if (e != nullptr && std::strcmp(e, "0") == 0) v = static_cast<int>(MmaMode::kOff);
    if (e != nullptr && std::strcmp(e, "force") == 0) v = static_cast<int>(MmaMode::kForce);
    g_mma_mode.store(v, std::memory_order_relaxed);
  }
  return static_cast<MmaMode>(v);
}

long long mma_min_rows() {
  static const long long v = std::max(env_count("MLX_FAST_QMM_MMA_MIN_ROWS", kMmaMinRows), 2ll);
  return v;
}

// The floor in force: MLX_FAST_QMV_MIN_ELEMENTS (or kMinElements) until
// `set_fast_qmv_min_elements` sets another.
std::atomic<long long> g_min_elements{-1};

long long min_elements() {
  long long v = g_min_elements.load(std::memory_order_relaxed);
  if (v < 0) {
    v = env_count("MLX_FAST_QMV_MIN_ELEMENTS", kMinElements);
    g_min_elements.store(v, std::memory_order_relaxed);
  }
  return v;
}

// The most rows of x the multi-row kernel takes: MLX_FAST_QMM_MAX_ROWS (or kQmmMaxRows)
// until `set_fast_qmm_max_rows` sets another.
std::atomic<long long> g_qmm_max_rows{-1};

long long qmm_max_rows() {
  long long v = g_qmm_max_rows.load(std::memory_order_relaxed);
  if (v < 0) {
    v = std::min(env_count("MLX_FAST_QMM_MAX_ROWS", kQmmMaxRows), kQmmRowsLimit);
    g_qmm_max_rows.store(v, std::memory_order_relaxed);
  }
  return v;
}

// An experiment, off by default: MLX_FAST_QMM_ONE_SEQ_ROWS=N sends one sequence's products
// of 2..N rows (a draft model's two-token catch-up in speculative decoding) to kBodyM, the
// weight read once for them, each row with its one-row bits. MLX runs `qmv` per row there
// below 8 rows on an A100 (the same bits) but `qmm_sm90` from 2 rows on an H100 / H200
// (other bits): see the note at `m / seq == 1` in fast_rows.
long long one_seq_rows() {
  static const long long v = std::min(env_count("MLX_FAST_QMM_ONE_SEQ_ROWS", 0), 7ll);
  return v;
}

// The most rows of several sequences it takes when on: MLX_FAST_QMM_MMA_MAX_ROWS, else
// every row count (kQmmRowsLimit). Above 32 rows it runs parts of 32 rows along grid x,
// each reading the weight again (from L2 after the first), where MLX runs `qmm`: on the
// H200 `qmm_mma_check --forced-m 64,128,512` timed it 2.8x-16x faster than MLX's `qmm`
// on Qwen2.5-0.5B's three projection shapes, with the same RMS error to four digits
// (benchmarks/GPU.md, session 17). Products of more than 32 rows go to the tiled kernel
// of fast_qmm.cpp first (MLX's bits, faster: session 24) where it applies.
long long mma_max_rows() {
  static const long long v = env_count("MLX_FAST_QMM_MMA_MAX_ROWS", kQmmRowsLimit);
  return std::min(v, kQmmRowsLimit);
}

// Rows of w a warp in force: MLX_FAST_QMM_WARP_ROWS (or kQmmWarpRows) until
// `set_fast_qmm_warp_rows` sets another; 1, 2, 4, or 0 for the automatic choice (anything
// else: kQmmWarpRows).
std::atomic<int> g_qmm_warp_rows{-1};

int valid_warp_rows(long long v) {
  return (v == 0 || v == 1 || v == 2 || v == 4) ? static_cast<int>(v) : kQmmWarpRows;
}

int qmm_warp_rows() {
  int v = g_qmm_warp_rows.load(std::memory_order_relaxed);
  if (v < 0) {
    v = valid_warp_rows(env_count("MLX_FAST_QMM_WARP_ROWS", kQmmWarpRows));
    g_qmm_warp_rows.store(v, std::memory_order_relaxed);
  }
  return v;
}

long long many_max_elements() {
  static const long long v = env_count("MLX_FAST_QMV_MANY_MAX_ELEMENTS", kManyMaxElements);
  return v;
}

// How a kernel lays the rows out: `rows` warps per block, `rw` rows per warp, loads issued
// `u` chunks ahead (`window`) or `u` chunks at a time (else); `body` picks the source.
struct Layout {
  int body;  // 0: kBody (one row a warp, all loads first), 1: kBodyRows, 2: kBodyM, 3: mma
  int rows;
  int rw;
  int u;
  bool window;
  bool operator<(const Layout& o) const {
    return std::tie(body, rows, rw, u, window) < std::tie(o.body, o.rows, o.rw, o.u, o.window);
  }
};

// Chosen on the H200 (benchmarks/GPU.md run 7): under ncu, a prototype of kBodyRows
// streamed long rows (down projections: 14336 x 4096 29.3 -> 21.3 us) and very many rows
// (vocabulary heads: 128256 x 4096 135 -> 118 us) faster than kBody, which stayed best
// elsewhere; end to end, these layouts took the 8B model from 264 to 304 tok/s.
// kBody: one row a warp, 4 warps a block, all of a row's loads issued first.
constexpr Layout kOneRow = {0, 4, 1, 32, false};
// kBodyM: `rw` rows of w a warp (qmm_warp_rows()) for up to kQmmPartRows / rw rows of x,
// 4 warps a block, kQmmLoads / rw chunks of each row loaded at a time.
Layout many_rows_layout(int rw) { return {2, 4, rw, kQmmLoads / rw, false}; }

Layout layout_for(int n, int k) {
  if (g_pipelined.on()) {
    if (n > 16384) return {1, 4, 2, 8, false};
    if (k >= 12288) return {1, 4, 1, 4, true};
  }
  return kOneRow;
}

// Blocks of `l` that cover n rows.
long long blocks_of(const Layout& l, long long n) {
  const long long rows_per_block = static_cast<long long>(l.rows) * l.rw;
  return (n + rows_per_block - 1) / rows_per_block;
}

// The device code of every kernel below: two row bodies as templates over the
// (compile-time) K, group size and layout, so their chunk loops unroll and loads can be
// issued ahead of the arithmetic. Each kernel's own source is one call of a body per
// weight it covers (`kernel_for`), and this text reaches NVRTC through an #include of a
// file holding it (kernel_cache.h's `device_kernel`): `async_eval` of a `cuda_kernel` call costs ~0.25 us
// more per KB of its source on the H200's host (10 KB of comments: 2.1 -> 4.6 us a call;
// the same 10 KB behind an #include: 2.1 us; benchmarks/GPU.md run 8), and a decoding
// step makes ~100 of these calls.
const char* const kDeviceCode = R"(// mlx-rs: the one-row 4-bit kernels of fast_qmv.cpp.
#pragma once
#include <cooperative_groups/reduce.h>

namespace mlxs_qmv {
namespace cg = cooperative_groups;

// One chunk's 16 activations: a view of x may start anywhere, so 16-byte loads only where
// it is aligned.
__device__ __forceinline__ void load_x16(const __nv_bfloat16* x, int idx, bool x_aligned,
                                         uint4& xa, uint4& xb) {
  if (x_aligned) {
    xa = *reinterpret_cast<const uint4*>(x + idx);
    xb = *reinterpret_cast<const uint4*>(x + idx + 8);
  } else {
    __nv_bfloat16* pa = reinterpret_cast<__nv_bfloat16*>(&xa);
    __nv_bfloat16* pb = reinterpret_cast<__nv_bfloat16*>(&xb);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      pa[e] = x[idx + e];
      pb[e] = x[idx + 8 + e];
    }
  }
}

// (t & 0x000F000F) | 0x43004300: the nibbles at bits 0 and 16 of t as the bfloat16 bits of
// 128 + v. One LOP3 (0xEA: (a & b) | c); written as two operations it is issued as two.
// (The expression itself where this is compiled for the host: benchmarks/qmv_host_check.cpp.)
__device__ __forceinline__ uint32_t magic_bits(uint32_t t) {
#ifdef __CUDA_ARCH__
  uint32_t bits;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(bits) : "r"(t), "n"(0x000F000F), "n"(0x43004300));
  return bits;
#else
  return (t & 0x000F000Fu) | 0x43004300u;
#endif
}

// Nibbles 2i and 2i + 1 of `word` (low nibble first) as the bfloat16 bits of 128 + v in the
// low and high halves: byte i of `word` and byte i of `hi` (= word >> 4, shared by a
// word's four pairs) side by side, masked. Two instructions a pair where the shifts and
// masks of each nibble take six; the same bits.
__device__ __forceinline__ uint32_t nibble_pair(uint32_t word, uint32_t hi, int i) {
  return magic_bits(__byte_perm(word, hi, 0x4400u + 0x1111u * i));
}

// Nibble pair j (elements 2j, 2j + 1 of a chunk's 16) of the chunk's two words, as the
// bfloat16 bits of 128 + v: by nibble_pair under LEAN, else by the shifts and masks of each
// nibble (the same bits).
template <bool LEAN>
__device__ __forceinline__ uint32_t chunk_pair(uint2 wv, int j) {
  const uint32_t word = j < 4 ? wv.x : wv.y;
  if constexpr (LEAN) {
    return nibble_pair(word, word >> 4, j & 3);
  } else {
    const uint32_t byte = (word >> (8 * (j & 3))) & 0xFFu;
    return 0x43004300u | (byte & 0xFu) | ((byte >> 4) << 16);
  }
}

// MLX's `rms_norm` of the row x (K bfloat16 values, weight nw, eps) into the block's shared
// memory, every value as MLX's rms_norm_small<bfloat16, BS, NC, *, 8> stores it (the kernel
// MLX runs for K <= 8192): MLX thread t's sum of squares over its vectors BS * i + t (eight
// values each, in order, zero past K), the warps' sums by cg::reduce, the block's by
// cg::reduce over lanes holding the warps' sums; then rsqrt(sum / K + eps), each value
// float(x) * r rounded to bfloat16 and multiplied by its weight in bfloat16. The warps of
// this block stand in for MLX's BS / 32 warps (warp v's lanes are MLX's threads 32 v ..
// 32 v + 31), so every sum is added in MLX's order. Every thread of the block calls it.
template <int K, int BS, int NC>
__device__ __forceinline__ const __nv_bfloat16* rms_norm_x(const __nv_bfloat16* x,
                                                           const __nv_bfloat16* nw,
                                                           const float eps) {
  constexpr int NV = BS / 32;
  __shared__ __align__(16) __nv_bfloat16 xs[K];
  __shared__ float part[NV];
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = threadIdx.x;
  const bool x_aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const bool w_aligned = (reinterpret_cast<uintptr_t>(nw) & 15) == 0;
  // Eight values from p + o (K % 8 == 0, so a vector is all in or all out of the row).
  auto load8 = [](const __nv_bfloat16* p, int o, bool aligned, __nv_bfloat16* v) {
    if (aligned) {
      *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(p + o);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = p[o + j];
    }
  };
  for (int v = threadIdx.y; v < NV; v += blockDim.y) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int o = (BS * i + v * 32 + lane) * 8;
      if (o < K) {
        __align__(16) __nv_bfloat16 xv[8];
        load8(x, o, x_aligned, xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float t = __bfloat162float(xv[j]);
          s = fmaf(t, t, s);
        }
      }
    }
    s = cg::reduce(warp, s, cg::plus<float>());
    if (lane == 0) part[v] = s;
  }
  __syncthreads();
  float total = part[0];
  if constexpr (NV > 1) total = cg::reduce(warp, lane < NV ? part[lane] : 0.f, cg::plus<float>());
  const float r = rsqrtf(total / static_cast<float>(K) + eps);
  for (int e = (threadIdx.y * 32 + lane) * 8; e < K; e += blockDim.y * 32 * 8) {
    __align__(16) __nv_bfloat16 xv[8];
    __align__(16) __nv_bfloat16 wv[8];
    load8(x, e, x_aligned, xv);
    load8(nw, e, w_aligned, wv);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      xv[j] = __hmul(wv[j], __float2bfloat16_rn(__bfloat162float(xv[j]) * r));
    }
    *reinterpret_cast<uint4*>(xs + e) = *reinterpret_cast<const uint4*>(xv);
  }
  __syncthreads();
  return xs;
}

// The output of one row: the product rounded to bfloat16, plus `res`'s element in
// bfloat16 where RES (MLX's `add` of the residual, fused).
template <bool RES>
__device__ __forceinline__ void store(__nv_bfloat16* out, const __nv_bfloat16* res, int row,
                                      float sum) {
  const __nv_bfloat16 y = __float2bfloat16_rn(sum);
  if constexpr (RES) {
    out[row] = __hadd(res[row], y);
  } else {
    out[row] = y;
  }
}

// The float sum of row `row` of a warp (every lane gets it), all of a lane's loads issued
// before its arithmetic (`U` chunks at a time). LEAN (the default; not under
// MLX_FAST_QMV_LEAN=0): the nibbles unpacked by nibble_pair, and each chunk's loads at
// compile-time offsets from per-lane bases instead of addresses computed a chunk (a
// signed division and 64-bit arithmetic for each scale and bias): 816 -> 480
// instructions a warp for a 4096-long row (ptxas for sm_90a, benchmarks/kernel_offline.py).
// Every value the same.
// row_sum's x as given.
struct NoPre {
  static constexpr bool kActive = false;
  __device__ __forceinline__ const __nv_bfloat16* operator()() const { return nullptr; }
};

// row_sum's x computed by rms_norm_x once the row's first weight loads are in flight, so
// the norm's reads and sums run under their latency.
template <int K, int BS, int NC>
struct NormPre {
  static constexpr bool kActive = true;
  const __nv_bfloat16* xr;
  const __nv_bfloat16* nw;
  float eps;
  __device__ __forceinline__ const __nv_bfloat16* operator()() const {
    return rms_norm_x<K, BS, NC>(xr, nw, eps);
  }
};

template <int K, int GS, int U, bool LEAN, class Pre = NoPre, bool XS = false>
__device__ __forceinline__ float row_sum(const __nv_bfloat16* x, const uint32_t* w,
                                         const __nv_bfloat16* scales,
                                         const __nv_bfloat16* biases, const int row,
                                         const Pre pre = Pre{});

// row_sum of an x that is not 16-byte aligned (a view at another offset) under XS: the same
// chunks in the same order, one chunk's loads at a time, out of line, so that the aligned
// body's registers (and the warps an SM holds) are not those of the element-wise loads.
template <int K, int GS, bool LEAN>
__device__ __noinline__ float row_sum_any(const __nv_bfloat16* x, const uint32_t* w,
                                          const __nv_bfloat16* scales,
                                          const __nv_bfloat16* biases, const int row) {
  return row_sum<K, GS, 1, LEAN>(x, w, scales, biases, row);
}

// XS (MLX_FAST_QMV_ALIGNED_SPLIT): x's alignment decided once, an unaligned x handed to
// row_sum_any; every value the same (the same tiles in the same order).
template <int K, int GS, int U, bool LEAN, class Pre, bool XS>
__device__ __forceinline__ float row_sum(const __nv_bfloat16* x, const uint32_t* w,
                                         const __nv_bfloat16* scales,
                                         const __nv_bfloat16* biases, const int row,
                                         const Pre pre) {
  if constexpr (XS && !Pre::kActive) {
    if ((reinterpret_cast<uintptr_t>(x) & 15) != 0) {
      return row_sum_any<K, GS, LEAN>(x, w, scales, biases, row);
    }
  }
  constexpr int NCH = K / 512;
  constexpr int REST = K % 512;
  constexpr int G = K / GS;
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = threadIdx.x;
  const uint8_t* wr = reinterpret_cast<const uint8_t*>(w) + (size_t)row * (K / 2);
  const __nv_bfloat16* sr = scales + (size_t)row * G;
  const __nv_bfloat16* br = biases + (size_t)row * G;
  __nv_bfloat162 acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = __floats2bfloat162_rn(0.f, 0.f);
  // (Under XS an x that reaches here is aligned; a NormPre's is the block's aligned copy.)
  bool x_aligned = XS || (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
  // One chunk: 16 weights (8 bytes, low nibble first) against 16 activations.
  auto tile = [&](int idx, uint2 wv, __nv_bfloat16 s, __nv_bfloat16 b) {
    uint4 xa, xb;
    load_x16(x, idx, x_aligned, xa, xb);
    const __nv_bfloat162* x0 = reinterpret_cast<const __nv_bfloat162*>(&xa);
    const __nv_bfloat162* x1 = reinterpret_cast<const __nv_bfloat162*>(&xb);
    __nv_bfloat162 s2 = __bfloat162bfloat162(s);
    __nv_bfloat162 b2 = __bfloat162bfloat162(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t bits = chunk_pair<LEAN>(wv, j);
      // bfloat16 bits of 128 + v, minus 128: the nibble v, exactly.
      __nv_bfloat162 q = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&bits), k128);
      __nv_bfloat162 d = __hadd2(__hmul2(q, s2), b2);
      acc[j] = __hfma2(j < 4 ? x0[j] : x1[j - 4], d, acc[j]);
    }
  };
  // LEAN's bases: chunk r's 8 bytes of w at wl[32 r], its scale and bias at [r * 512 / GS]
  // (lane * 16 + r * 512 over GS, as GS divides 512).
  const unsigned ul = threadIdx.x;
  const uint2* wl = reinterpret_cast<const uint2*>(wr) + ul;
  const __nv_bfloat16* sl = sr + ul * 16 / GS;
  const __nv_bfloat16* bl = br + ul * 16 / GS;
#pragma unroll
  for (int r0 = 0; r0 < NCH; r0 += U) {
    uint2 wv[U];
    __nv_bfloat16 sc[U], bi[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int r = r0 + u;
      if (r < NCH) {
        if constexpr (LEAN) {
          wv[u] = __ldg(wl + 32 * r);
          sc[u] = sl[r * (512 / GS)];
          bi[u] = bl[r * (512 / GS)];
        } else {
          const int idx = lane * 16 + r * 512;
          wv[u] = __ldg(reinterpret_cast<const uint2*>(wr + idx / 2));
          sc[u] = sr[idx / GS];
          bi[u] = br[idx / GS];
        }
      }
    }
    if constexpr (Pre::kActive) {
      if (r0 == 0) {
        x = pre();
        x_aligned = true;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int r = r0 + u;
      if (r < NCH) tile(lane * 16 + r * 512, wv[u], sc[u], bi[u]);
    }
  }
  if constexpr (Pre::kActive && NCH == 0) {
    x = pre();
    x_aligned = true;
  }
  if (REST > 0) {
    const int idx = lane * 16 + K - REST;
    if (idx < K) {
      uint2 wv = __ldg(reinterpret_cast<const uint2*>(wr + idx / 2));
      tile(idx, wv, sr[idx / GS], br[idx / GS]);
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sum += __low2float(acc[j]);
    sum += __high2float(acc[j]);
  }
  return cg::reduce(warp, sum, cg::plus<float>());
}

// One row a warp: row `block * ROWS + threadIdx.y` of n.
template <int K, int GS, int ROWS, int U, bool RES, bool LEAN = false, bool XS = false>
__device__ __forceinline__ void rows1(const __nv_bfloat16* x, const uint32_t* w,
                                      const __nv_bfloat16* scales,
                                      const __nv_bfloat16* biases, __nv_bfloat16* out,
                                      const int n, const int block,
                                      const __nv_bfloat16* res) {
  const int row = block * ROWS + threadIdx.y;
  if (row >= n) return;
  const float sum = row_sum<K, GS, U, LEAN, NoPre, XS>(x, w, scales, biases, row);
  if (threadIdx.x == 0) store<RES>(out, res, row, sum);
}

// rows1 where x is MLX's rms_norm of xr (weight nw, eps; MLX's block of BS threads, NC
// vectors each), computed by every block (NormPre): a warp past n runs its last row too,
// so every thread meets the norm's barriers, and stores nothing.
template <int K, int GS, int ROWS, int U, int BS, int NC, bool LEAN>
__device__ __forceinline__ void rows1_norm(const __nv_bfloat16* xr, const __nv_bfloat16* nw,
                                           const float eps, const uint32_t* w,
                                           const __nv_bfloat16* scales,
                                           const __nv_bfloat16* biases, __nv_bfloat16* out,
                                           const int n, const int block) {
  const int row = block * ROWS + threadIdx.y;
  const float sum = row_sum<K, GS, U, LEAN>(nullptr, w, scales, biases, min(row, n - 1),
                                            NormPre<K, BS, NC>{xr, nw, eps});
  if (row < n && threadIdx.x == 0) store<false>(out, nullptr, row, sum);
}

// Row i of a gathered product (MLX's `gather_qmv`, below 8 rows): rows1's body over expert
// idx[i]'s n rows of w [E, n, K / 8] (an index past the E experts reads the last one,
// where MLX would read past the stack), x's row i / xrep, out's row i. MLX's gather_qmv
// runs its qmv body on the same slices, so each output has MLX's bits.
template <int K, int GS, int ROWS, int U, bool LEAN, bool XS = false>
__device__ __forceinline__ void gather_rows1(const __nv_bfloat16* x, const uint32_t* w,
                                             const __nv_bfloat16* scales,
                                             const __nv_bfloat16* biases, const uint32_t* idx,
                                             __nv_bfloat16* out, const int n, const int xrep,
                                             const int experts, const int block, const int i) {
  const size_t rows = (size_t)min(idx[i], (uint32_t)(experts - 1)) * n;
  rows1<K, GS, ROWS, U, false, LEAN, XS>(x + (size_t)(i / xrep) * K, w + rows * (K / 8),
                                     scales + rows * (K / GS), biases + rows * (K / GS),
                                     out + (size_t)i * n, n, block, nullptr);
}

// Several rows of x by RW rows of w a warp: rows (block * ROWS + threadIdx.y) * RW .. of n
// (those past n skipped), against the rows part * MT .. (at most MT, fewer in the last
// part) of x [m, K]; out is [m, n]. For each pair of a row of w and a row of x this is
// row_sum's arithmetic exactly (the same lanes and chunks in the same order, the same
// dequantize expression, the same bfloat16 FMAs into their own 16 per-lane accumulators,
// their float sum in element order, the same warp reduce and rounding): every output row
// is bit-identical to the one-row kernel's for that x row alone. A chunk of a row of w is
// loaded and dequantized once for all the part's x rows, and a chunk of a row of x is
// loaded once for the warp's RW rows of w.
template <int K, int GS, int ROWS, int U, int MT, int RW, bool LEAN = false>
__device__ __forceinline__ void rows_m(const __nv_bfloat16* x, const uint32_t* w,
                                       const __nv_bfloat16* scales,
                                       const __nv_bfloat16* biases, __nv_bfloat16* out,
                                       const int n, const int m, const int block,
                                       const int part) {
  constexpr int NCH = K / 512;
  constexpr int REST = K % 512;
  constexpr int G = K / GS;
  const int row0 = (block * ROWS + threadIdx.y) * RW;
  const int m0 = part * MT;
  if (row0 >= n || m0 >= m) return;
  // The x rows of this part (warp-uniform).
  const int mt = min(MT, m - m0);
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = threadIdx.x;
  const __nv_bfloat16* xt = x + (size_t)m0 * K;
  const uint8_t* wr[RW];
  const __nv_bfloat16* sr[RW];
  const __nv_bfloat16* br[RW];
#pragma unroll
  for (int v = 0; v < RW; ++v) {
    // Rows past n read row n - 1 (in bounds) and store nothing.
    const int r = min(row0 + v, n - 1);
    wr[v] = reinterpret_cast<const uint8_t*>(w) + (size_t)r * (K / 2);
    sr[v] = scales + (size_t)r * G;
    br[v] = biases + (size_t)r * G;
  }
  __nv_bfloat162 acc[RW][MT][8];
#pragma unroll
  for (int v = 0; v < RW; ++v)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[v][i][j] = __floats2bfloat162_rn(0.f, 0.f);
  // Rows of x lie K elements (a multiple of 64 bytes) apart: all aligned as the first.
  const bool x_aligned = (reinterpret_cast<uintptr_t>(xt) & 15) == 0;
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
  // One chunk: for each row v of w, 16 weights (8 bytes, low nibble first) dequantized as
  // row_sum does; then each x row's 16 activations against every row's.
  auto tile = [&](int idx, const uint2* wv, const __nv_bfloat16* s, const __nv_bfloat16* b) {
    __nv_bfloat162 d[RW][8];
#pragma unroll
    for (int v = 0; v < RW; ++v) {
      __nv_bfloat162 s2 = __bfloat162bfloat162(s[v]);
      __nv_bfloat162 b2 = __bfloat162bfloat162(b[v]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t bits = chunk_pair<LEAN>(wv[v], j);
        // bfloat16 bits of 128 + the nibble, minus 128: the nibble, exactly.
        __nv_bfloat162 q = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&bits), k128);
        d[v][j] = __hadd2(__hmul2(q, s2), b2);
      }
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < mt) {
        uint4 xa, xb;
        load_x16(xt + (size_t)i * K, idx, x_aligned, xa, xb);
        const __nv_bfloat162* x0 = reinterpret_cast<const __nv_bfloat162*>(&xa);
        const __nv_bfloat162* x1 = reinterpret_cast<const __nv_bfloat162*>(&xb);
#pragma unroll
        for (int v = 0; v < RW; ++v)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            acc[v][i][j] = __hfma2(j < 4 ? x0[j] : x1[j - 4], d[v][j], acc[v][i][j]);
          }
      }
    }
  };
#pragma unroll
  for (int r0 = 0; r0 < NCH; r0 += U) {
    uint2 wv[U][RW];
    __nv_bfloat16 sc[U][RW], bi[U][RW];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int r = r0 + u;
      if (r < NCH) {
        const int idx = lane * 16 + r * 512;
#pragma unroll
        for (int v = 0; v < RW; ++v) {
          wv[u][v] = __ldg(reinterpret_cast<const uint2*>(wr[v] + idx / 2));
          sc[u][v] = sr[v][idx / GS];
          bi[u][v] = br[v][idx / GS];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int r = r0 + u;
      if (r < NCH) tile(lane * 16 + r * 512, wv[u], sc[u], bi[u]);
    }
  }
  if (REST > 0) {
    const int idx = lane * 16 + K - REST;
    if (idx < K) {
      uint2 wv[RW];
      __nv_bfloat16 sc[RW], bi[RW];
#pragma unroll
      for (int v = 0; v < RW; ++v) {
        wv[v] = __ldg(reinterpret_cast<const uint2*>(wr[v] + idx / 2));
        sc[v] = sr[v][idx / GS];
        bi[v] = br[v][idx / GS];
      }
      tile(idx, wv, sc, bi);
    }
  }
#pragma unroll
  for (int v = 0; v < RW; ++v) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < mt) {
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          sum += __low2float(acc[v][i][j]);
          sum += __high2float(acc[v][i][j]);
        }
        sum = cg::reduce(warp, sum, cg::plus<float>());
        if (lane == 0 && row0 + v < n) {
          out[(size_t)(m0 + i) * n + row0 + v] = __float2bfloat16_rn(sum);
        }
      }
    }
  }
}

// mlx-lm's `swiglu(gate, up)` of two products, compiled by MLX into one elementwise
// kernel over bfloat16 values: Multiply(Multiply(g, Sigmoid(g)), u) with MLX's own device
// functors. Rows `block * ROWS + i` of both weights: warp i the gate's, warp ROWS + i the
// up's, each the same row body as alone, its product rounded to bfloat16 as MLX stores it.
// (With a NormPre, x is MLX's rms_norm computed by the block: every warp runs a row, a
// warp past n its last one, and stores only rows of n.)
template <int K, int GS, int ROWS, int U, bool LEAN = false, class Pre = NoPre, bool XS = false>
__device__ __forceinline__ void swiglu_rows(const __nv_bfloat16* x, const uint32_t* wg,
                                            const __nv_bfloat16* sg,
                                            const __nv_bfloat16* bg, const uint32_t* wu,
                                            const __nv_bfloat16* su,
                                            const __nv_bfloat16* bu, __nv_bfloat16* out,
                                            const int n, const int block,
                                            const Pre pre = Pre{}) {
  __shared__ __nv_bfloat16 prod[2][ROWS];
  const int up = threadIdx.y >= ROWS;
  const int i = threadIdx.y - up * ROWS;
  const int row = block * ROWS + i;
  if (Pre::kActive || row < n) {
    const float sum = row_sum<K, GS, U, LEAN, Pre, XS>(x, up ? wu : wg, up ? su : sg,
                                                       up ? bu : bg, min(row, n - 1), pre);
    if (row < n && threadIdx.x == 0) prod[up][i] = __float2bfloat16_rn(sum);
  }
  __syncthreads();
  if (threadIdx.y == 0 && threadIdx.x < ROWS && block * ROWS + threadIdx.x < n) {
    namespace cu = mlx::core::cu;
    const __nv_bfloat16 g = prod[0][threadIdx.x];
    out[block * ROWS + threadIdx.x] =
        cu::Multiply{}(cu::Multiply{}(g, cu::Sigmoid{}(g)), prod[1][threadIdx.x]);
  }
}

// The same arithmetic, `RW` rows a warp (x is read once for them), the weights' nibbles
// unpacked as the pairs (e, e + 4) of each 32-bit word and x permuted to match (each
// element keeps its own accumulator, so the pairing changes no result), and the loads
// either issued `U` chunks ahead of their arithmetic (WIN) or `U` chunks at a time.
template <int K, int GS, int ROWS, int U, int RW, bool WIN, bool RES, bool LEAN = false,
          bool XS = false>
__device__ __forceinline__ void rows_n(const __nv_bfloat16* x, const uint32_t* w,
                                       const __nv_bfloat16* scales,
                                       const __nv_bfloat16* biases, __nv_bfloat16* out,
                                       const int n, const int block,
                                       const __nv_bfloat16* res);

// rows_n of an x that is not 16-byte aligned under XS: the same chunks in the same order
// into the same accumulators, one chunk's loads at a time, out of line (as row_sum_any).
template <int K, int GS, int ROWS, int RW, bool RES, bool LEAN>
__device__ __noinline__ void rows_n_any(const __nv_bfloat16* x, const uint32_t* w,
                                        const __nv_bfloat16* scales,
                                        const __nv_bfloat16* biases, __nv_bfloat16* out,
                                        const int n, const int block,
                                        const __nv_bfloat16* res) {
  rows_n<K, GS, ROWS, 1, RW, false, RES, LEAN>(x, w, scales, biases, out, n, block, res);
}

template <int K, int GS, int ROWS, int U, int RW, bool WIN, bool RES, bool LEAN, bool XS>
__device__ __forceinline__ void rows_n(const __nv_bfloat16* x, const uint32_t* w,
                                       const __nv_bfloat16* scales,
                                       const __nv_bfloat16* biases, __nv_bfloat16* out,
                                       const int n, const int block,
                                       const __nv_bfloat16* res) {
  if constexpr (XS) {
    if ((reinterpret_cast<uintptr_t>(x) & 15) != 0) {
      rows_n_any<K, GS, ROWS, RW, RES, LEAN>(x, w, scales, biases, out, n, block, res);
      return;
    }
  }
  constexpr int NCH = K / 512;
  constexpr int REST = K % 512;
  constexpr int G = K / GS;
  constexpr int NB = NCH > 0 ? NCH : 1;
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = threadIdx.x;
  const int row0 = (block * ROWS + threadIdx.y) * RW;
  if (row0 >= n) return;
  const uint8_t* wr[RW];
  const __nv_bfloat16* sr[RW];
  const __nv_bfloat16* br[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int r = min(row0 + i, n - 1);
    wr[i] = reinterpret_cast<const uint8_t*>(w) + (size_t)r * (K / 2);
    sr[i] = scales + (size_t)r * G;
    br[i] = biases + (size_t)r * G;
  }
  __nv_bfloat162 acc[RW][8];
#pragma unroll
  for (int i = 0; i < RW; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = __floats2bfloat162_rn(0.f, 0.f);
  // (Under XS an x that reaches here is aligned.)
  const bool x_aligned = XS || (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
  auto bf2 = [](uint32_t u) { return *reinterpret_cast<__nv_bfloat162*>(&u); };
  // x of one chunk as the pairs (e, e + 4) and (8 + e, 12 + e), e = 0..3; under LEAN as
  // they lie (2j, 2j + 1), the pairs chunk_pair unpacks.
  auto xpairs = [&](int idx, __nv_bfloat162* xp) {
    uint4 xa, xb;
    load_x16(x, idx, x_aligned, xa, xb);
    if constexpr (LEAN) {
      const uint32_t v[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) xp[j] = bf2(v[j]);
      return;
    }
    xp[0] = bf2(__byte_perm(xa.x, xa.z, 0x5410));
    xp[1] = bf2(__byte_perm(xa.x, xa.z, 0x7632));
    xp[2] = bf2(__byte_perm(xa.y, xa.w, 0x5410));
    xp[3] = bf2(__byte_perm(xa.y, xa.w, 0x7632));
    xp[4] = bf2(__byte_perm(xb.x, xb.z, 0x5410));
    xp[5] = bf2(__byte_perm(xb.x, xb.z, 0x7632));
    xp[6] = bf2(__byte_perm(xb.y, xb.w, 0x5410));
    xp[7] = bf2(__byte_perm(xb.y, xb.w, 0x7632));
  };
  // One row's chunk: the nibble pair j of a word is (word >> 4j) & 0x000F000F (under LEAN
  // chunk_pair's (2j, 2j + 1)); as the bfloat16 bits of 128 + v, minus 128: v exactly.
  // Then MLX's dequantize and FMA.
  auto tile = [&](__nv_bfloat162* a, const __nv_bfloat162* xp, uint2 wv,
                  __nv_bfloat16 s, __nv_bfloat16 b) {
    const __nv_bfloat162 s2 = __bfloat162bfloat162(s);
    const __nv_bfloat162 b2 = __bfloat162bfloat162(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t bits;
      if constexpr (LEAN) {
        bits = chunk_pair<true>(wv, j);
      } else {
        const uint32_t word = j < 4 ? wv.x : wv.y;
        bits = ((word >> (4 * (j & 3))) & 0x000F000Fu) | 0x43004300u;
      }
      const __nv_bfloat162 q = __hsub2(bf2(bits), k128);
      const __nv_bfloat162 d = __hadd2(__hmul2(q, s2), b2);
      a[j] = __hfma2(xp[j], d, a[j]);
    }
  };
  // Chunk r of row i: under LEAN from per-lane bases (as row_sum's; made once here, the
  // window's barrier keeps the compiler from sharing them between chunks), else from its
  // index.
  const uint2* wl[RW];
  const __nv_bfloat16* sl[RW];
  const __nv_bfloat16* bl[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const unsigned ul = threadIdx.x;
    wl[i] = reinterpret_cast<const uint2*>(wr[i]) + ul;
    sl[i] = sr[i] + ul * 16 / GS;
    bl[i] = br[i] + ul * 16 / GS;
  }
  auto load = [&](int i, int r, uint2& wv, __nv_bfloat16& sc, __nv_bfloat16& bi) {
    if constexpr (LEAN) {
      wv = __ldg(wl[i] + 32 * r);
      sc = __ldg(sl[i] + r * (512 / GS));
      bi = __ldg(bl[i] + r * (512 / GS));
    } else {
      const int idx = lane * 16 + r * 512;
      wv = __ldg(reinterpret_cast<const uint2*>(wr[i] + idx / 2));
      sc = __ldg(sr[i] + idx / GS);
      bi = __ldg(br[i] + idx / GS);
    }
  };
  if (WIN) {
    uint2 wv[RW][NB];
    __nv_bfloat16 sc[RW][NB], bi[RW][NB];
#pragma unroll
    for (int r = 0; r < NCH + U; ++r) {
      if (r < NCH) {
#pragma unroll
        for (int i = 0; i < RW; ++i) load(i, r, wv[i][r], sc[i][r], bi[i][r]);
      }
      if (r >= U && r - U < NCH) {
        const int c = r - U;
        __nv_bfloat162 xp[8];
        xpairs(lane * 16 + c * 512, xp);
#pragma unroll
        for (int i = 0; i < RW; ++i) tile(acc[i], xp, wv[i][c], sc[i][c], bi[i][c]);
      }
      // Keeps the compiler from hoisting every load to the top (the window is the point).
      asm volatile("" ::: "memory");
    }
  } else {
#pragma unroll 1
    for (int r0 = 0; r0 < NCH; r0 += U) {
      uint2 wv[RW][U];
      __nv_bfloat16 sc[RW][U], bi[RW][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int r = r0 + u;
        if (r < NCH) {
#pragma unroll
          for (int i = 0; i < RW; ++i) load(i, r, wv[i][u], sc[i][u], bi[i][u]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int r = r0 + u;
        if (r < NCH) {
          __nv_bfloat162 xp[8];
          xpairs(lane * 16 + r * 512, xp);
#pragma unroll
          for (int i = 0; i < RW; ++i) tile(acc[i], xp, wv[i][u], sc[i][u], bi[i][u]);
        }
      }
    }
  }
  if (REST > 0) {
    const int idx = lane * 16 + K - REST;
    if (idx < K) {
      __nv_bfloat162 xp[8];
      xpairs(idx, xp);
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const uint2 wv = __ldg(reinterpret_cast<const uint2*>(wr[i] + idx / 2));
        tile(acc[i], xp, wv, sr[i][idx / GS], br[i][idx / GS]);
      }
    }
  }
  // Each lane's sum in element order 0..15, then the warp's, as MLX.
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    float sum = 0.f;
    if constexpr (LEAN) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sum += __low2float(acc[i][j]);
        sum += __high2float(acc[i][j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) sum += __low2float(acc[i][j]);
#pragma unroll
      for (int j = 0; j < 4; ++j) sum += __high2float(acc[i][j]);
#pragma unroll
      for (int j = 4; j < 8; ++j) sum += __low2float(acc[i][j]);
#pragma unroll
      for (int j = 4; j < 8; ++j) sum += __high2float(acc[i][j]);
    }
    sum = cg::reduce(warp, sum, cg::plus<float>());
    if (lane == 0 && row0 + i < n) store<RES>(out, res, row0 + i, sum);
  }
}

// One m16n8k16 tensor-core product (PTX `mma.sync`, bfloat16 operands, float32
// accumulators): c += a (16 x 16, rows) * b (16 x 8, columns). Lane l = 4 g + t holds a's
// rows g and g + 8 at columns 2t, 2t + 1 (a0: row g, a1: row g + 8) and 2t + 8, 2t + 9
// (a2, a3), b's rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1) of column g, and c's rows g
// (c[0], c[1]) and g + 8 (c[2], c[3]) at columns 2t, 2t + 1.
__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// U consecutive 32-bit words of packed nibbles.
template <int U>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t* v) {
  if constexpr (U == 4) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
  } else if constexpr (U == 2) {
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
    v[0] = a.x;
    v[1] = a.y;
  } else {
    v[0] = __ldg(reinterpret_cast<const uint32_t*>(p));
  }
}

// The tensor-core form (not MLX's arithmetic: the batched path of docs/parity.md). Rows
// block * 16R .. of w (those past n skipped) against the rows part * 8MF .. of x [m, K]
// (those past m skipped); out is [m, n]. w is the `a` operand (16 of its rows a product),
// x the `b` operand (8 of its rows a product). A lane takes 8U consecutive k of each of its
// rows (one load of U words of w, U of 16 bytes of x: k0 = step * 32U + 8U t) and feeds
// word u's nibbles to two products as the pairs (e, e + 4), e = 0..3, which it unpacks with
// one shift and mask; x's elements are paired the same way, so every product's k slots
// hold matching elements of w and x (the sum over k runs in another order, which is all
// this changes). Each weight is dequantized as MLX does (w * scale + bias in bfloat16, one
// FMA), the products accumulate in float32. The NW warps of a block split K (warp i takes
// steps i, i + NW, ...) and their partial sums are added in warp order through shared
// memory: the result does not depend on timing.
template <int K, int GS, int NW, int U, int R, int MF, bool LEAN = false>
__device__ __forceinline__ void rows_mma(const __nv_bfloat16* x, const uint32_t* w,
                                         const __nv_bfloat16* scales,
                                         const __nv_bfloat16* biases, __nv_bfloat16* out,
                                         const int n, const int m, const int block,
                                         const int part) {
  constexpr int STEP = 32 * U;
  constexpr int NSTEP = K / STEP;
  constexpr int G = K / GS;
  constexpr int TR = 16 * R;
  constexpr int TM = 8 * MF;
  // Partial sums of each warp, [warp][row of w][row of x] (one column of padding).
  __shared__ float red[NW][TR][TM + 1];
  const int lane = threadIdx.x;
  const int wi = threadIdx.y;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int row0 = block * TR;
  const int m0 = part * TM;
  const uint8_t* wr[R][2];
  const __nv_bfloat16* sr[R][2];
  const __nv_bfloat16* br[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Rows past n read row n - 1 (in bounds) and store nothing.
      const int row = min(row0 + 16 * r + 8 * h + g, n - 1);
      wr[r][h] = reinterpret_cast<const uint8_t*>(w) + (size_t)row * (K / 2);
      sr[r][h] = scales + (size_t)row * G;
      br[r][h] = biases + (size_t)row * G;
    }
  const __nv_bfloat16* xr[MF];
  bool xv[MF];
#pragma unroll
  for (int f = 0; f < MF; ++f) {
    const int xm = m0 + 8 * f + g;
    xv[f] = xm < m;
    xr[f] = x + (size_t)min(xm, m - 1) * K;
  }
  const bool x_aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  float acc[R][MF][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int f = 0; f < MF; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][f][i] = 0.f;
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
  auto bf2 = [](uint32_t u) { return *reinterpret_cast<__nv_bfloat162*>(&u); };
  auto u32 = [](__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); };
  // One step's weights, scales and biases (a lane's k0 lies inside one group: 8U <= 32).
  uint32_t wv[R][2][U];
  __nv_bfloat16 sc[R][2], bi[R][2];
  auto load_step = [&](int step, uint32_t (&v)[R][2][U], __nv_bfloat16 (&s)[R][2],
                       __nv_bfloat16 (&b)[R][2]) {
    const int k0 = step * STEP + t * 8 * U;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        load_words<U>(wr[r][h] + k0 / 2, v[r][h]);
        s[r][h] = __ldg(sr[r][h] + k0 / GS);
        b[r][h] = __ldg(br[r][h] + k0 / GS);
      }
  };
  if (wi < NSTEP) load_step(wi, wv, sc, bi);
#pragma unroll 1
  for (int step = wi; step < NSTEP; step += NW) {
    // The next step's weights load while this one's are used.
    uint32_t nv[R][2][U];
    __nv_bfloat16 ns[R][2], nb[R][2];
    const bool more = step + NW < NSTEP;
    if (more) load_step(step + NW, nv, ns, nb);
    const int k0 = step * STEP + t * 8 * U;
    __nv_bfloat162 s2[R][2], b2[R][2];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s2[r][h] = __bfloat162bfloat162(sc[r][h]);
        b2[r][h] = __bfloat162bfloat162(bi[r][h]);
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // x's 8 elements k0 + 8u .. of each row of the part, as the pairs (e, e + 4).
      uint32_t xp[MF][4];
#pragma unroll
      for (int f = 0; f < MF; ++f) {
        // Rows of x past m read row m - 1 (xr is clamped) into outputs that are not
        // stored: each row of x is its own column of the products. LEAN loads them so,
        // without zeroing and selecting (584 -> 546 instructions a step of 64 products at
        // 32 rows of x, ptxas).
        uint4 xa = make_uint4(0u, 0u, 0u, 0u);
        if (LEAN || xv[f]) {
          const __nv_bfloat16* p = xr[f] + k0 + 8 * u;
          if (x_aligned) {
            xa = *reinterpret_cast<const uint4*>(p);
          } else {
            __nv_bfloat16* pa = reinterpret_cast<__nv_bfloat16*>(&xa);
#pragma unroll
            for (int e = 0; e < 8; ++e) pa[e] = p[e];
          }
        }
        xp[f][0] = __byte_perm(xa.x, xa.z, 0x5410);
        xp[f][1] = __byte_perm(xa.x, xa.z, 0x7632);
        xp[f][2] = __byte_perm(xa.y, xa.w, 0x5410);
        xp[f][3] = __byte_perm(xa.y, xa.w, 0x7632);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          // a[h][p]: row g + 8h, the nibble pair e = 2j + p of word u, dequantized.
          uint32_t a[2][2];
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int p = 0; p < 2; ++p) {
              const int e = 2 * j + p;
              const __nv_bfloat162 q =
                  __hsub2(bf2(((wv[r][h][u] >> (4 * e)) & 0x000F000Fu) | 0x43004300u), k128);
              a[h][p] = u32(__hfma2(q, s2[r][h], b2[r][h]));
            }
#pragma unroll
          for (int f = 0; f < MF; ++f) {
            mma16816(acc[r][f], a[0][0], a[1][0], a[0][1], a[1][1], xp[f][2 * j],
                     xp[f][2 * j + 1]);
          }
        }
      }
    }
    if (more) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int u = 0; u < U; ++u) wv[r][h][u] = nv[r][h][u];
          sc[r][h] = ns[r][h];
          bi[r][h] = nb[r][h];
        }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int f = 0; f < MF; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        red[wi][16 * r + g + 8 * (i >> 1)][8 * f + 2 * t + (i & 1)] = acc[r][f][i];
      }
  __syncthreads();
  // Each output: the warps' partial sums in warp order, rounded to bfloat16; consecutive
  // threads take consecutive rows of w (consecutive outputs of a row of out).
  for (int idx = wi * 32 + lane; idx < TR * TM; idx += NW * 32) {
    const int col = idx / TR;
    const int rl = idx % TR;
    if (row0 + rl < n && m0 + col < m) {
      float sum = 0.f;
#pragma unroll
      for (int v = 0; v < NW; ++v) sum += red[v][rl][col];
      out[(size_t)(m0 + col) * n + row0 + rl] = __float2bfloat16_rn(sum);
    }
  }
}

// The dequantized dense product's weight (`try_fast_dequantize`): 4-bit affine words to
// bfloat16, each value as MLX's `affine_dequantize` computes it, `bf16(q) * scale + bias`
// in bfloat16 arithmetic, so the result is MLX's bit for bit. A block of 256 threads takes
// 1024 consecutive words, a thread the words t, t + 256, t + 512, t + 768: each load of a
// warp is 128 consecutive bytes and each store (a word's 8 values, 16 bytes) 512, where
// MLX's kernel moves a byte in and two values out per thread.
template <int GS>
__device__ __forceinline__ void dequant4(const uint32_t* w, const __nv_bfloat16* scales,
                                         const __nv_bfloat16* biases, __nv_bfloat16* out,
                                         long long words) {
  const long long base = static_cast<long long>(blockIdx.x) * 1024 + threadIdx.x;
  uint32_t q[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const long long i = base + u * 256;
    q[u] = i < words ? __ldg(w + i) : 0u;
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const long long i = base + u * 256;
    if (i >= words) return;
    const long long g = (i * 8) / GS;
    const __nv_bfloat16 s = scales[g], b = biases[g];
    __align__(16) __nv_bfloat16 v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = static_cast<__nv_bfloat16>(static_cast<int>((q[u] >> (4 * e)) & 0xf)) * s + b;
    }
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(v);
  }
}

}  // namespace mlxs_qmv
)";

// A kernel of ours with the device code above (kernel_cache.h's `device_kernel`); outputs
// are bfloat16.
mx::fast::CustomKernelFunction tagged_kernel(std::string name,
                                             const std::vector<KernelParam>& inputs,
                                             const std::vector<std::string>& outputs,
                                             const std::string& src, int device) {
  std::vector<KernelParam> output_params;
  for (const auto& o : outputs) output_params.emplace_back(o, mx::bfloat16);
  return device_kernel(std::move(name), inputs, output_params, src,
                       DeviceCode{kDeviceCode, "mlxs_qmv"}, device);
}

// One kernel: the products of x by `ns.size()` weights of the same K and group size,
// `ns[i]` rows each, in one launch (block b belongs to the first weight whose blocks have
// not all been counted before b). Every weight's rows run the same body as alone.
struct KernelKey {
  int k;
  int gs;
  Layout layout;
  std::vector<int> ns;
  bool res = false;     // one weight, its output added to an input `res` (same shape)
  bool swiglu = false;  // two weights (gate, up) of one size, one output: their swiglu
  int mt = 0;           // kBodyM (one weight): rows of x a part (grid x), else 0
  bool gather = false;  // gather_rows1: an expert stack, a row of the product a part
  // x is MLX's rms_norm of the inputs `xr`, `nw` (rms_norm_x: MLX's block of norm_bs
  // threads, norm_nc vectors each; eps as its float bits) where norm_bs > 0.
  int norm_bs = 0;
  int norm_nc = 0;
  uint32_t norm_eps = 0;
  bool operator<(const KernelKey& o) const {
    return std::tie(k, gs, layout, ns, res, swiglu, mt, gather, norm_bs, norm_nc, norm_eps) <
           std::tie(o.k, o.gs, o.layout, o.ns, o.res, o.swiglu, o.mt, o.gather, o.norm_bs,
                    o.norm_nc, o.norm_eps);
  }
  // Warps a block: the swiglu form runs each row of both weights in one block.
  int warps() const { return swiglu ? 2 * layout.rows : layout.rows; }
};

// The three inputs of one quantized weight: its words, scales and biases.
std::vector<KernelParam> weight_params(const std::string& w, const std::string& s,
                                       const std::string& b) {
  return {{w, mx::uint32}, {s, mx::bfloat16}, {b, mx::bfloat16}};
}

const mx::fast::CustomKernelFunction& kernel_for(const KernelKey& key, int device) {
  static std::mutex mu;
  static std::map<std::tuple<KernelKey, bool, bool>, mx::fast::CustomKernelFunction> kernels;
  std::lock_guard<std::mutex> lock(mu);
  const bool lean = g_lean.on();
  // XS of the one-row bodies without a norm in the launch (rows1, gather_rows1,
  // swiglu_rows, rows_n).
  const bool xs = lean && g_xsplit.on() && key.norm_bs == 0 &&
                  (key.swiglu || key.gather || (key.layout.body <= 1 && key.mt == 0));
  auto it = kernels.find({key, lean, xs});
  if (it != kernels.end()) return it->second;
  // The bodies' last template argument (LEAN), where they have it.
  const std::string lean_arg = lean ? ", true" : ", false";
  const Layout& l = key.layout;
  const int parts = static_cast<int>(key.ns.size());
  // The body's template arguments: K, group size, warps a block, chunks a load.
  const std::string targs = std::to_string(key.k) + ", " + std::to_string(key.gs) + ", " +
                            std::to_string(l.rows) + ", " + std::to_string(l.u);
  std::string name = "mlxs_qmv_k" + std::to_string(key.k) + "_g" + std::to_string(key.gs);
  if (l.body == 1) {
    name += "_r" + std::to_string(l.rows) + "x" + std::to_string(l.rw) + (l.window ? "w" : "u") +
            std::to_string(l.u);
  }
  // The norm's block shape as NormPre's type, and eps exactly (its bits).
  const bool norm = key.norm_bs > 0;
  std::string norm_pre, norm_eps;
  std::vector<KernelParam> inputs;
  if (norm) {
    inputs = {{"xr", mx::bfloat16}, {"nw", mx::bfloat16}};
    char bits[16];
    std::snprintf(bits, sizeof bits, "0x%08xu", key.norm_eps);
    norm_pre = "mlxs_qmv::NormPre<" + std::to_string(key.k) + ", " +
               std::to_string(key.norm_bs) + ", " + std::to_string(key.norm_nc) + ">";
    norm_eps = std::string("__uint_as_float(") + bits + ")";
    name += "_rms" + std::to_string(key.norm_bs) + "x" + std::to_string(key.norm_nc) + "e" +
            std::string(bits + 2, 8);
  } else {
    inputs = {{"x", mx::bfloat16}};
  }
  auto add = [&inputs](std::vector<KernelParam> ps) {
    inputs.insert(inputs.end(), ps.begin(), ps.end());
  };
  std::vector<std::string> outputs;
  std::string src;
  if (key.gather) {
    // The expert stack's rows from its shape, the rows of x a repeat from idx's and x's.
    add(weight_params("w", "scales", "biases"));
    inputs.emplace_back("idx", mx::uint32);
    outputs.push_back("out");
    name += "_gather";
    src = "  mlxs_qmv::gather_rows1<" + targs + lean_arg + (xs ? ", true" : "") +
          ">(x, w, scales, biases, idx, out, w_shape[1], idx_shape[0] / x_shape[0], "
          "w_shape[0], blockIdx.y, blockIdx.x);\n";
  } else if (l.body == 3) {
    // rows_mma: `rows` warps a block, 16 * `rw` rows of w, `mt` rows of x a part, loads of
    // `u` words; rows of x and of w from their shapes, as kBodyM's.
    add(weight_params("w", "scales", "biases"));
    outputs.push_back("out");
    name += "_mma" + std::to_string(l.rows) + "x" + std::to_string(l.rw) + "m" +
            std::to_string(key.mt) + "u" + std::to_string(l.u);
    src = "  mlxs_qmv::rows_mma<" + std::to_string(key.k) + ", " + std::to_string(key.gs) +
          ", " + std::to_string(l.rows) + ", " + std::to_string(l.u) + ", " +
          std::to_string(l.rw) + ", " + std::to_string(key.mt / 8) + lean_arg +
          ">(x, w, scales, biases, out, w_shape[0], x_shape[0], blockIdx.y, blockIdx.x);\n";
  } else if (key.mt > 0) {
    // The rows of x and of w come from their shapes (x is passed as [m, K]), so one compiled
    // kernel (MLX keys them by name and source) serves every m with this part size and
    // every weight of this K.
    add(weight_params("w", "scales", "biases"));
    outputs.push_back("out");
    name += "_m" + std::to_string(key.mt) + "x" + std::to_string(l.rw);
    src = "  mlxs_qmv::rows_m<" + targs + ", " + std::to_string(key.mt) + ", " +
          std::to_string(l.rw) + lean_arg +
          ">(x, w, scales, biases, out, w_shape[0], x_shape[0], blockIdx.y, blockIdx.x);\n";
  } else if (key.swiglu) {
    add(weight_params("w0", "s0", "b0"));
    add(weight_params("w1", "s1", "b1"));
    outputs.push_back("out");
    name += "_n" + std::to_string(key.ns[0]) + "_swiglu";
    if (norm) {
      src = "  mlxs_qmv::swiglu_rows<" + targs + lean_arg + ", " + norm_pre +
            ">(nullptr, w0, s0, b0, w1, s1, b1, out, " + std::to_string(key.ns[0]) +
            ", blockIdx.y, " + norm_pre + "{xr, nw, " + norm_eps + "});\n";
    } else {
      src = "  mlxs_qmv::swiglu_rows<" + targs + lean_arg +
            (xs ? ", mlxs_qmv::NoPre, true" : "") + ">(x, w0, s0, b0, w1, s1, b1, out, " +
            std::to_string(key.ns[0]) + ", blockIdx.y);\n";
    }
  } else {
    std::string body = l.body == 1 ? "mlxs_qmv::rows_n<" : "mlxs_qmv::rows1<";
    body += targs;
    if (l.body == 1) body += ", " + std::to_string(l.rw) + (l.window ? ", true" : ", false");
    body += (key.res ? ", true" : ", false") + lean_arg + (xs ? ", true" : "") + ">";
    if (norm) {
      // rows1 with the norm (the caller takes it only with kOneRow and no residual).
      body = "mlxs_qmv::rows1_norm<" + targs + ", " + std::to_string(key.norm_bs) + ", " +
             std::to_string(key.norm_nc) + lean_arg + ">";
    }
    int first = 0;  // the first block of part i
    for (int i = 0; i < parts; ++i) {
      const std::string sfx = parts == 1 ? "" : std::to_string(i);
      const std::string w = "w" + sfx, s = parts == 1 ? "scales" : "s" + sfx,
                        b = parts == 1 ? "biases" : "b" + sfx, o = "out" + sfx;
      add(weight_params(w, s, b));
      outputs.push_back(o);
      name += "_n" + std::to_string(key.ns[i]);
      const int blocks = static_cast<int>(blocks_of(l, key.ns[i]));
      const std::string call =
          norm ? body + "(xr, nw, " + norm_eps + ", " + w + ", " + s + ", " + b + ", " + o + ", " +
                     std::to_string(key.ns[i]) + ", blockIdx.y - " + std::to_string(first) + ");"
               : body + "(x, " + w + ", " + s + ", " + b + ", " + o + ", " +
                     std::to_string(key.ns[i]) + ", blockIdx.y - " + std::to_string(first) +
                     (key.res ? ", res);" : ", nullptr);");
      if (i + 1 < parts) {
        src += "  if (blockIdx.y < " + std::to_string(first + blocks) + ") {\n    " + call +
               "\n    return;\n  }\n";
      } else {
        src += "  " + call + "\n";
      }
      first += blocks;
    }
  }
  if (key.res) {
    inputs.emplace_back("res", mx::bfloat16);
    name += "_res";
  }
  if (lean) name += "_lean";
  if (xs) name += "_xs";
  return kernels
      .emplace(std::make_tuple(key, lean, xs), tagged_kernel(name, inputs, outputs, src, device))
      .first->second;
}

// K and N of a 4-bit product (any number of rows of x) whose rows our kernels take (the
// stream already checked to be a GPU one), or nullopt.
std::optional<std::pair<int, int>> eligible_rows(const mx::array& x, const mx::array& w,
                                                 const mx::array& scales,
                                                 const std::optional<mx::array>& biases,
                                                 bool transpose, int gs,
                                                 const std::string& mode) {
  auto kn = affine_operands(x, w, scales, biases, transpose, mode, gs, 4);
  if (!kn || x.dtype() != mx::bfloat16 || scales.dtype() != mx::bfloat16 ||
      biases->dtype() != mx::bfloat16) {
    return std::nullopt;
  }
  const auto [k, n] = *kn;
  if (k % 32 != 0) return std::nullopt;
  if (k > kMaxK || static_cast<long long>(n) * k < min_elements()) return std::nullopt;
  // MLX's sm90 `qmm` is eligible only for rows no longer than a group (K % 64 == 0,
  // group size >= K); there MLX keeps `qmv` only up to 16384 outputs, so leave it those.
  if (k % 64 == 0 && gs >= k && n > 16384) return std::nullopt;
  return kn;
}

// The same for one row of x (what MLX runs through `qmv`).
std::optional<std::pair<int, int>> eligible(const mx::array& x, const mx::array& w,
                                            const mx::array& scales,
                                            const std::optional<mx::array>& biases,
                                            bool transpose, int gs, const std::string& mode) {
  auto kn = eligible_rows(x, w, scales, biases, transpose, gs, mode);
  if (!kn || static_cast<long long>(x.size()) != kn->first) return std::nullopt;
  return kn;
}

// The inputs of MLX's `rms_norm` that gave x, where x is that norm of rows of K bfloat16
// values not yet scheduled (so our launch can compute it instead), with the block shape
// of MLX's kernel for K (`dispatch_num_chunks` of MLX's rms_norm.cu: 64 threads of one
// vector up to 512 values, else 128 threads where they cover K evenly in at most 8
// vectors each, else 64 where those do, else 128 with the vectors rounded up).
struct PendingNorm {
  mx::array x;
  mx::array w;
  int bs;
  int nc;
  uint32_t eps;
};

std::optional<PendingNorm> pending_rms_norm(const mx::array& h, int k) {
  if (!g_norm.on() || !h.has_primitive() || h.status() != mx::array::unscheduled ||
      h.is_tracer() || k > kNormMaxK || k % 8 != 0 ||
      std::strcmp(h.primitive().name(), "RMSNorm") != 0) {
    return std::nullopt;
  }
  const auto& in = h.inputs();
  if (in.size() != 2 || in[0].dtype() != mx::bfloat16 || in[0].shape() != h.shape() ||
      in[1].dtype() != mx::bfloat16 || in[1].ndim() != 1 || in[1].size() != static_cast<size_t>(k)) {
    return std::nullopt;
  }
  const float eps = static_cast<const mx::fast::RMSNorm&>(h.primitive()).state().second;
  uint32_t bits;
  std::memcpy(&bits, &eps, sizeof bits);
  const int nvec = k / 8;
  int bs = 128;
  int nc = (nvec + 127) / 128;
  if (k <= 8 * 64) {
    bs = 64;
    nc = 1;
  } else if (nvec % 128 == 0 && nvec / 128 <= 8) {
    nc = nvec / 128;
  } else if (nvec % 64 == 0 && nvec / 64 <= 8) {
    bs = 64;
    nc = nvec / 64;
  }
  return PendingNorm{in[0], in[1], bs, nc, bits};
}

// Launches the kernel of `key` over x and `weights` (w, scales, biases per part), with
// `res` as its last input where `key.res`; where x is a pending rms_norm that a form of
// `key` can take in (rows1_norm, or swiglu_rows with a NormPre: kOneRow, no residual),
// over the norm's inputs instead of x, the norm computed in the launch.
std::vector<mx::array> launch(KernelKey key, const mx::array& x,
                              const std::vector<mx::array>& weights, const mx::Stream& st,
                              const mx::array* res = nullptr) {
  const Layout& l = key.layout;
  long long blocks = 0;
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < (key.swiglu ? 1 : key.ns.size()); ++i) {
    blocks += blocks_of(l, key.ns[i]);
    mx::Shape sh = x.shape();
    sh.back() = key.ns[i];
    shapes.push_back(std::move(sh));
  }
  const bool norm_form = !key.res && key.layout.body == kOneRow.body &&
                         key.layout.rows == kOneRow.rows && key.mt == 0 && !key.gather;
  const auto norm = norm_form ? pending_rms_norm(x, key.k) : std::nullopt;
  std::vector<mx::array> inputs;
  if (norm) {
    key.norm_bs = norm->bs;
    key.norm_nc = norm->nc;
    key.norm_eps = norm->eps;
    inputs = {norm->x, norm->w};
    g_norm.count();
  } else {
    inputs = {x};
  }
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  if (key.res) inputs.push_back(*res);
  const int warps = key.warps();
  auto outs = kernel_for(key, st.device.index)(inputs, shapes, std::vector<mx::Dtype>(shapes.size(), mx::bfloat16),
                              std::make_tuple(32, static_cast<int>(blocks * warps), 1),
                              std::make_tuple(32, warps, 1), {}, std::nullopt, false, st);
  g_switch.count();
  return outs;
}

// One weight's product through our kernels, with `residual` added in the kernel when
// given (only where MLX's add would give the product's shape and dtype back unchanged).
std::optional<mx::array> fast_one(const mx::array& x, const mx::array& w,
                                  const mx::array& scales,
                                  const std::optional<mx::array>& biases, bool transpose,
                                  std::optional<int> group_size, std::optional<int> bits,
                                  const std::string& mode, mx::StreamOrDevice s,
                                  const mx::array* residual) {
  if (!g_switch.on() || bits.value_or(4) != 4) return std::nullopt;
  // First the stream: on other devices the caller goes on to the CPU kernel, which checks
  // the operands itself.
  const mx::Stream st = mx::to_stream(s);
  if (!on_gpu(st, x) || quantized_operands_traced(w, scales, biases)) return std::nullopt;
  if (residual != nullptr && residual->is_tracer()) return std::nullopt;
  const int gs = group_size.value_or(64);
  auto kn = eligible(x, w, scales, biases, transpose, gs, mode);
  if (!kn) return std::nullopt;
  const auto [k, n] = *kn;
  if (residual != nullptr) {
    mx::Shape out_shape = x.shape();
    out_shape.back() = n;
    if (residual->dtype() != mx::bfloat16 || residual->shape() != out_shape) {
      return std::nullopt;
    }
  }
  const Layout l = layout_for(n, k);
  if (blocks_of(l, n) > kMaxBlocksY) return std::nullopt;
  KernelKey key{k, gs, l, {n}};
  key.res = residual != nullptr;
  return launch(key, x, {w, scales, *biases}, st, residual)[0];
}

// Launches the multi-row kernel of `key` (kBodyM or rows_mma, which read the rows of x and
// of w from their shapes) over x as [m, K]: `parts` parts of x along grid x, `blocks`
// blocks of w's rows along grid y; the output has x's shape with n columns.
mx::array launch_rows(const KernelKey& key, const mx::array& x, const mx::array& w,
                      const mx::array& scales, const mx::array& biases, int k, int n,
                      long long m, long long parts, long long blocks, const mx::Stream& st) {
  mx::Shape out_shape = x.shape();
  out_shape.back() = n;
  const mx::array x2 = mx::reshape(x, {static_cast<int>(m), k}, st);
  const int warps = key.warps();
  auto outs = kernel_for(key, st.device.index)(
      {x2, w, scales, biases}, {out_shape}, {mx::bfloat16},
      std::make_tuple(static_cast<int>(32 * parts), static_cast<int>(blocks * warps), 1),
      std::make_tuple(32, warps, 1), {}, std::nullopt, false, st);
  return outs[0];
}

// The product of x's m rows (its batch dimensions flattened into rows) by an eligible
// weight through rows_mma: parts of up to kMmaMaxPartRows rows of x (as even as 8-row
// products allow) along grid x, 16 or 32 rows of w a block along grid y.
std::optional<mx::array> mma_rows(const mx::array& x, const mx::array& w, const mx::array& scales,
                                  const mx::array& biases, int k, int n, long long m, int gs,
                                  const mx::Stream& st) {
  // Words of w a lane loads a step: 4 (16 bytes) where K allows, else 2 or 1.
  const int u = k % 128 == 0 ? 4 : (k % 64 == 0 ? 2 : 1);
  const long long parts = (m + kMmaMaxPartRows - 1) / kMmaMaxPartRows;
  const long long per_part = (m + parts - 1) / parts;
  const int mt = static_cast<int>((per_part + 7) / 8 * 8);
  int rw = (n + 31) / 32 * parts >= mma_min_blocks() ? 2 : 1;
  if (rw == 2 && mma_rw_max() == 4 && (n + 63) / 64 * parts >= mma_min_blocks() &&
      mma_warps() * 64 * (mt + 1) * 4 <= 48 * 1024) {
    rw = 4;
  }
  const Layout l{3, mma_warps(), rw, u, false};
  const long long blocks = (n + 16ll * rw - 1) / (16ll * rw);
  if (blocks > kMaxBlocksY || parts * 32 > std::numeric_limits<int>::max()) return std::nullopt;
  KernelKey key{k, gs, l, {0}};
  key.mt = mt;
  auto y = launch_rows(key, x, w, scales, biases, k, n, m, parts, blocks, st);
  g_mma_uses.fetch_add(1, std::memory_order_relaxed);
  return y;
}

// The product of 2..qmm_max_rows() rows of x (its batch dimensions flattened into the rows,
// as MLX does) through kBodyM: each output row bit-identical to the one-row kernel's for
// that row of x alone; nullopt where it does not apply.
std::optional<mx::array> fast_rows(const mx::array& x, const mx::array& w,
                                   const mx::array& scales,
                                   const std::optional<mx::array>& biases, bool transpose,
                                   std::optional<int> group_size, std::optional<int> bits,
                                   const std::string& mode, mx::StreamOrDevice s) {
  if (!g_switch.on() || !g_qmm.on() || bits.value_or(4) != 4) return std::nullopt;
  const mx::Stream st = mx::to_stream(s);
  if (!on_gpu(st, x) || quantized_operands_traced(w, scales, biases)) return std::nullopt;
  const int gs = group_size.value_or(64);
  auto kn = eligible_rows(x, w, scales, biases, transpose, gs, mode);
  if (!kn) return std::nullopt;
  const auto [k, n] = *kn;
  const long long m = static_cast<long long>(x.size()) / k;
  if (m < 2) return std::nullopt;
  const MmaMode mma = mma_mode();
  if (mma == MmaMode::kForce) return mma_rows(x, w, scales, *biases, k, n, m, gs, st);
  const long long seq = x.ndim() >= 2 ? x.shape(-2) : 1;
  // More than 32 rows (a batch's prefill chunks): the tiled kernel of MLX's own bits
  // (fast_qmm.cpp) where it applies, which took the 8B 4-bit model's prefill of 32 prompts
  // of 128 tokens from 8,707 to 13,224 tok/s against the tensor-core form (GPU.md session
  // 24); the tensor-core form elsewhere.
  if (m > kQmmMaxRows && mma == MmaMode::kOn) {
    if (auto y = try_fast_qgemm(x, w, scales, biases, transpose, group_size, bits, mode, s)) {
      return y;
    }
  }
  if (mma == MmaMode::kOn && m / seq > 1 && m >= mma_min_rows() && m <= mma_max_rows()) {
    return mma_rows(x, w, scales, *biases, k, n, m, gs, st);
  }
  if (m > qmm_max_rows()) return std::nullopt;
  // One sequence's rows (x without a batch dimension over 1: a prompt at batch 1, its last
  // prefill chunk, a speculative verification, a draft model's catch-up) stay MLX's: MLX
  // runs `qmv` per row below 8 rows of x (our bits; QuantizedMatmul::eval_gpu, MLX 0.32.4)
  // and `qmm` from there
  // (other bits, mlx-lm's at batch 1). Below that count this kernel would give the same
  // bits, but in speculative decoding (echo 8B bf16 with its 4-bit copy as the draft,
  // whose catch-up forward is [1, 2, K]) it made each round's draft steps wait ~230 ms in
  // MLX's `async_eval` (16.7 against 170.7 tok/s with MLX's product, H200, session 19;
  // not understood: the product alone times at 12-200 us). Rows of several sequences
  // (batched decoding, [B, 1, K]) are where mlx-lm is not reproducible across batch sizes;
  // they took rows_mma above unless it is off, and here each row gets its one-row bits.
  if (m / seq == 1 && m > one_seq_rows()) return std::nullopt;
  // Parts of x of as even a size as part_rows allows (9 rows by 8: 5 and 4), one a block of
  // grid x: CUDA hands out blocks x first, so the parts of one block of w's rows run close
  // together and the later ones find its weights in L2.
  int rw = qmm_warp_rows();
  if (rw == 0) {
    const long long parts2 = (m + kQmmPartRows / 2 - 1) / (kQmmPartRows / 2);
    rw = blocks_of(many_rows_layout(2), n) * parts2 >= kQmmAutoMinBlocks ? 2 : 1;
  }
  const int part_rows = kQmmPartRows / rw;
  const long long parts = (m + part_rows - 1) / part_rows;
  const int mt = static_cast<int>((m + parts - 1) / parts);
  const Layout l = many_rows_layout(rw);
  const long long blocks = blocks_of(l, n);
  if (blocks > kMaxBlocksY) return std::nullopt;
  // The kernel takes n from w's shape: the key's row count is 0 for every weight.
  KernelKey key{k, gs, l, {0}};
  key.mt = mt;
  auto y = launch_rows(key, x, w, scales, *biases, k, n, m, parts, blocks, st);
  g_qmm.count();
  return y;
}

}  // namespace

std::optional<mx::array> try_fast_dequantize(const mx::array& w, const mx::array& scales,
                                             const std::optional<mx::array>& biases,
                                             std::optional<int> group_size,
                                             std::optional<int> bits, const std::string& mode,
                                             mx::Dtype dtype, mx::StreamOrDevice s) {
  if (!g_dequant.on() || bits.value_or(4) != 4 || mode != "affine" || !biases) {
    return std::nullopt;
  }
  const mx::Stream st = mx::to_stream(s);
  if (st.device.type != mx::Device::gpu || !mx::cu::is_available()) return std::nullopt;
  if (quantized_operands_traced(w, scales, biases)) return std::nullopt;
  const int gs = group_size.value_or(64);
  if (gs != 32 && gs != 64 && gs != 128) return std::nullopt;
  if (dtype != mx::bfloat16 || w.dtype() != mx::uint32 || scales.dtype() != mx::bfloat16 ||
      biases->dtype() != mx::bfloat16 || w.ndim() != 2) {
    return std::nullopt;
  }
  const long long n = w.shape(0), k = static_cast<long long>(w.shape(1)) * 8;
  const mx::Shape groups{w.shape(0), static_cast<int>(k / gs)};
  if (n <= 0 || k % gs != 0 || scales.shape() != groups || biases->shape() != groups) {
    return std::nullopt;
  }
  // (K % GS == 0 with GS >= 32: each word's 8 values lie in one group.)
  // 256 threads a block of 1024 words; MLX's grid is counted in threads (an int).
  constexpr long long kThreads = 256;
  const long long words = n * (k / 8);
  const long long threads = (words + 4 * kThreads - 1) / (4 * kThreads) * kThreads;
  if (threads > std::numeric_limits<int>::max()) return std::nullopt;
  static std::mutex mu;
  static std::map<int, mx::fast::CustomKernelFunction> kernels;
  const mx::fast::CustomKernelFunction* fn;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = kernels.find(gs);
    if (it == kernels.end()) {
      const std::string src = "  mlxs_qmv::dequant4<" + std::to_string(gs) +
                              ">(w, scales, biases, out, w_shape[0] * w_shape[1]);\n";
      it = kernels
               .emplace(gs, tagged_kernel("mlxs_dequant4_g" + std::to_string(gs),
                                          weight_params("w", "scales", "biases"), {"out"},
                                          src, st.device.index))
               .first;
    }
    fn = &it->second;
  }
  auto outs = (*fn)({w, scales, *biases}, {mx::Shape{w.shape(0), static_cast<int>(k)}},
                    {mx::bfloat16}, std::make_tuple(static_cast<int>(threads), 1, 1),
                    std::make_tuple(static_cast<int>(kThreads), 1, 1), {}, std::nullopt, false,
                    st);
  g_dequant.count();
  return outs[0];
}

std::optional<mx::array> try_fast_qmv(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    bool transpose,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mx::StreamOrDevice s) {
  if (auto y = fast_one(x, w, scales, biases, transpose, group_size, bits, mode, s, nullptr)) {
    return y;
  }
  return fast_rows(x, w, scales, biases, transpose, group_size, bits, mode, s);
}

std::optional<mx::array> try_fast_gather_qmv(
    const mx::array& x, const mx::array& w, const mx::array& scales,
    const std::optional<mx::array>& biases, const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices, bool transpose, std::optional<int> group_size,
    std::optional<int> bits, const std::string& mode, mx::StreamOrDevice s) {
  if (!g_switch.on() || !g_gather_qmv.on()) return std::nullopt;
  const mx::Stream st = mx::to_stream(s);
  const int gs = group_size.value_or(64);
  const auto g = gpu_gather_operands(x, w, scales, biases, lhs_indices, rhs_indices, transpose,
                                     gs, bits, mode, st);
  if (!g) return std::nullopt;
  const auto [k, n, experts, m, xrep, out_shape] = *g;
  // From 8 rows MLX runs `qmm_sm80` (fast_qmm.cpp's gathered forms keep its bits).
  if (m >= 8 || k % 32 != 0 || k > kMaxK) return std::nullopt;
  const Layout l = kOneRow;
  const long long blocks = blocks_of(l, n);
  if (blocks > kMaxBlocksY) return std::nullopt;
  KernelKey key{static_cast<int>(k), gs, l, {static_cast<int>(n)}};
  key.gather = true;
  const mx::array x2 = mx::reshape(x, {static_cast<int>(m / xrep), static_cast<int>(k)}, st);
  const mx::array idx = mx::reshape(*rhs_indices, {static_cast<int>(m)}, st);
  const int warps = key.warps();
  auto outs = kernel_for(key, st.device.index)(
      {x2, w, scales, *biases, idx}, {out_shape}, {mx::bfloat16},
      std::make_tuple(static_cast<int>(32 * m), static_cast<int>(blocks * warps), 1),
      std::make_tuple(32, warps, 1), {}, std::nullopt, false, st);
  g_gather_qmv.count();
  g_switch.count();
  return outs[0];
}

unsigned long long fast_gather_qmv_launches() { return g_gather_qmv.uses(); }

std::optional<mx::array> try_fast_qmv_add(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    const mx::array& residual,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mx::StreamOrDevice s) {
  if (!g_residual.on()) return std::nullopt;
  return fast_one(x, w, scales, biases, true, group_size, bits, mode, s, &residual);
}

namespace {

// Weights of one K and group size that all run kBody alone, for one launch over x: their
// row counts and operands (w, scales, biases per weight); nullopt otherwise, or over the
// bounds of one launch.
struct OneRowGroup {
  int k = 0;
  std::vector<int> ns;
  std::vector<mx::array> operands;
};

std::optional<OneRowGroup> one_row_group(const mx::array& x, const std::vector<mx::array>& ws,
                                         const std::vector<mx::array>& scales,
                                         const std::vector<std::optional<mx::array>>& biases,
                                         int gs, const std::string& mode) {
  if (ws.size() < 2 || ws.size() > kMaxParts || scales.size() != ws.size() ||
      biases.size() != ws.size()) {
    return std::nullopt;
  }
  OneRowGroup g;
  long long blocks = 0;
  long long elements = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    auto kn = eligible(x, ws[i], scales[i], biases[i], true, gs, mode);
    if (!kn || quantized_operands_traced(ws[i], scales[i], biases[i])) return std::nullopt;
    const auto [k, n] = *kn;
    // One launch shares one layout: only weights that run kBody alone.
    const Layout l = layout_for(n, k);
    if (l.body != kOneRow.body || l.rows != kOneRow.rows || (i > 0 && k != g.k)) {
      return std::nullopt;
    }
    g.k = k;
    g.ns.push_back(n);
    blocks += blocks_of(kOneRow, n);
    elements += static_cast<long long>(n) * k;
    g.operands.insert(g.operands.end(), {ws[i], scales[i], *biases[i]});
  }
  if (blocks > kMaxBlocksY || elements > many_max_elements()) return std::nullopt;
  return g;
}

// The stream of `s` where our kernels can run with these settings, else nullopt.
std::optional<mx::Stream> gpu_stream(const mx::array& x, mx::StreamOrDevice s,
                                     std::optional<int> bits) {
  if (!g_switch.on() || !g_many.on() || bits.value_or(4) != 4) return std::nullopt;
  const mx::Stream st = mx::to_stream(s);
  if (!on_gpu(st, x)) return std::nullopt;
  return st;
}

}  // namespace

std::optional<std::vector<mx::array>> try_fast_qmv_many(
    const mx::array& x,
    const std::vector<mx::array>& ws,
    const std::vector<mx::array>& scales,
    const std::vector<std::optional<mx::array>>& biases,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mx::StreamOrDevice s) {
  const auto st = gpu_stream(x, s, bits);
  if (!st) return std::nullopt;
  const int gs = group_size.value_or(64);
  auto g = one_row_group(x, ws, scales, biases, gs, mode);
  if (!g) return std::nullopt;
  return launch(KernelKey{g->k, gs, kOneRow, g->ns}, x, g->operands, *st);
}

std::optional<mx::array> try_fast_qmv_swiglu(
    const mx::array& x,
    const std::vector<mx::array>& ws,
    const std::vector<mx::array>& scales,
    const std::vector<std::optional<mx::array>>& biases,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mx::StreamOrDevice s) {
  if (!g_swiglu.on() || ws.size() != 2) return std::nullopt;
  const auto st = gpu_stream(x, s, bits);
  if (!st) return std::nullopt;
  const int gs = group_size.value_or(64);
  auto g = one_row_group(x, ws, scales, biases, gs, mode);
  if (!g || g->ns[0] != g->ns[1]) return std::nullopt;
  KernelKey key{g->k, gs, kOneRow, g->ns};
  key.swiglu = true;
  return launch(key, x, g->operands, *st)[0];
}

void set_fast_qmv(bool on) { g_switch.set(on); }
void set_fast_dequant(bool on) { g_dequant.set(on); }
unsigned long long fast_dequant_launches() { return g_dequant.uses(); }
void set_fast_qmv_many(bool on) { g_many.set(on); }
void set_fast_qmv_residual(bool on) { g_residual.set(on); }
void set_fast_qmv_swiglu(bool on) { g_swiglu.set(on); }
void set_fast_qmv_norm(bool on) { g_norm.set(on); }
unsigned long long fast_qmv_norm_launches() { return g_norm.uses(); }
void set_fast_qmv_min_elements(long long n) {
  g_min_elements.store(n < 0 ? 0 : n, std::memory_order_relaxed);
}
bool fast_qmv_enabled() { return g_switch.on(); }
unsigned long long fast_qmv_launches() { return g_switch.uses(); }
void set_fast_qmm(bool on) { g_qmm.set(on); }
void set_fast_qmm_warp_rows(int n) {
  g_qmm_warp_rows.store(valid_warp_rows(n), std::memory_order_relaxed);
}
void set_fast_qmm_max_rows(long long n) {
  g_qmm_max_rows.store(std::clamp(n, 0ll, kQmmRowsLimit), std::memory_order_relaxed);
}
bool fast_qmm_enabled() { return g_qmm.on(); }
unsigned long long fast_qmm_launches() { return g_qmm.uses(); }
void set_fast_qmm_mma(int mode) {
  g_mma_mode.store(std::clamp(mode, 0, 2), std::memory_order_relaxed);
}
int fast_qmm_mma_mode() { return static_cast<int>(mma_mode()); }
unsigned long long fast_qmm_mma_launches() {
  return g_mma_uses.load(std::memory_order_relaxed);
}

}  // namespace mlxs_detail
