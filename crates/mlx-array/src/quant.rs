//! Quantization: `quantize`, `dequantize`, `quantized_matmul`, `gather_qmm`, `gather_mm`.
//!
//! Modes are MLX's: `affine` (scales and biases, 2-8 bits, any group size), `mxfp4`,
//! `nvfp4` and `mxfp8` (scales only).
use crate::array::{opt, out1, outv, Array, VecHandle};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ops::cstr;
use mlx_sys as sys;

/// A quantization mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// Per-group scale and bias.
    Affine,
    /// Microscaling FP4 (group 32, e8m0 scales).
    Mxfp4,
    /// NVIDIA FP4 (group 16, e4m3 scales).
    Nvfp4,
    /// Microscaling FP8.
    Mxfp8,
}

impl QuantMode {
    /// MLX's name.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Nvfp4 => "nvfp4",
            QuantMode::Mxfp8 => "mxfp8",
        }
    }
    /// Parses MLX's name.
    pub fn parse(s: &str) -> Result<QuantMode> {
        Ok(match s {
            "affine" => QuantMode::Affine,
            "mxfp4" => QuantMode::Mxfp4,
            "nvfp4" => QuantMode::Nvfp4,
            "mxfp8" => QuantMode::Mxfp8,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown quantization mode `{other}` (expected affine, mxfp4, nvfp4 or mxfp8)"
                )))
            }
        })
    }
    /// MLX's default `(group_size, bits)` for the mode.
    pub fn defaults(self) -> (i32, i32) {
        match self {
            QuantMode::Affine => (64, 4),
            QuantMode::Mxfp4 => (32, 4),
            QuantMode::Nvfp4 => (16, 4),
            QuantMode::Mxfp8 => (32, 8),
        }
    }
}

/// The parts of a quantized matrix.
#[derive(Debug, Clone)]
pub struct Quantized {
    /// Packed weights (uint32).
    pub weight: Array,
    /// Per-group scales.
    pub scales: Array,
    /// Per-group biases (affine mode only).
    pub biases: Option<Array>,
}

/// Quantize `w` along its last axis. `group_size`/`bits` of `None` take the mode's default.
#[track_caller]
pub fn quantize(
    w: &Array,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
) -> Result<Quantized> {
    let m = cstr(mode.name())?;
    let mut parts = outv(|o| unsafe {
        sys::mlxs_quantize(
            o,
            w.as_raw(),
            group_size.unwrap_or(0),
            bits.unwrap_or(0),
            m.as_ptr(),
            std::ptr::null_mut(),
            Array::s(),
        )
    })?
    .into_iter();
    let (Some(weight), Some(scales)) = (parts.next(), parts.next()) else {
        return Err(Error::InvalidArgument(
            "quantize returned fewer than two arrays".into(),
        ));
    };
    Ok(Quantized {
        weight,
        scales,
        biases: parts.next(),
    })
}

/// Undo [`quantize`]; `dtype = None` gives the scales' dtype.
#[track_caller]
pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
    dtype: Option<Dtype>,
) -> Result<Array> {
    let m = cstr(mode.name())?;
    out1(|o| unsafe {
        sys::mlxs_dequantize(
            o,
            w.as_raw(),
            scales.as_raw(),
            opt(biases),
            group_size.unwrap_or(0),
            bits.unwrap_or(0),
            m.as_ptr(),
            std::ptr::null_mut(),
            dtype.map_or(-1, |d| d.to_raw()),
            Array::s(),
        )
    })
}

/// `x @ dequantize(w).T` (or without the transpose) in one kernel.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
) -> Result<Array> {
    let m = cstr(mode.name())?;
    out1(|o| unsafe {
        sys::mlxs_quantized_matmul(
            o,
            x.as_raw(),
            w.as_raw(),
            scales.as_raw(),
            opt(biases),
            transpose,
            group_size.unwrap_or(0),
            bits.unwrap_or(0),
            m.as_ptr(),
            Array::s(),
        )
    })
}

/// `residual + quantized_matmul(x, w, scales, biases, transpose = true)`: the same array
/// as the two ops. With [`set_fast_qmv_residual`] on (the default) and a one-row
/// product our CUDA kernels take, the add runs in the product's launch.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn quantized_matmul_add(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    residual: &Array,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
) -> Result<Array> {
    let m = cstr(mode.name())?;
    out1(|o| unsafe {
        sys::mlxs_quantized_matmul_add(
            o,
            x.as_raw(),
            w.as_raw(),
            scales.as_raw(),
            opt(biases),
            residual.as_raw(),
            group_size.unwrap_or(0),
            bits.unwrap_or(0),
            m.as_ptr(),
            Array::s(),
        )
    })
}

/// One packed weight for [`quantized_matmul_many`]: `weight`, `scales` and the affine
/// `biases` (`None` in the other modes), as [`quantize`] returns them.
#[derive(Debug, Clone, Copy)]
pub struct QuantizedWeight<'a> {
    /// Packed weight, uint32 `[N, K * bits / 32]`.
    pub weight: &'a Array,
    /// Per-group scales.
    pub scales: &'a Array,
    /// Per-group biases (affine mode).
    pub biases: Option<&'a Array>,
}

impl<'a> From<&'a Quantized> for QuantizedWeight<'a> {
    /// The three arrays of [`quantize`]'s result as one weight.
    fn from(q: &'a Quantized) -> QuantizedWeight<'a> {
        QuantizedWeight {
            weight: &q.weight,
            scales: &q.scales,
            biases: q.biases.as_ref(),
        }
    }
}

/// `quantized_matmul(x, w, scales, biases, transpose = true)` for every weight of
/// `weights`, all of the same group size, bits and mode: the same arrays as one call each.
/// The projections of one input (q/k/v, gate/up) in a decoding step run as one launch of
/// our CUDA kernels where each of them would take those kernels alone (on the CUDA
/// backend, one bfloat16 row by 4-bit affine weights); `MLX_FAST_QMV_MANY=0` keeps one
/// launch each.
#[track_caller]
pub fn quantized_matmul_many(
    x: &Array,
    weights: &[QuantizedWeight<'_>],
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
) -> Result<Vec<Array>> {
    many_call(
        "quantized_matmul_many",
        sys::mlxs_quantized_matmul_many,
        x,
        weights,
        group_size,
        bits,
        mode,
    )
}

/// What [`quantized_matmul_swiglu`] gives back.
#[derive(Debug)]
pub enum GateUp {
    /// mlx-lm's `swiglu(gate, up)` of the two products, from one launch of our kernels.
    Swiglu(Array),
    /// The two products (as [`quantized_matmul_many`] gives them), for the caller's swiglu.
    Products(Array, Array),
}

/// mlx-lm's `swiglu(x @ gate.T, x @ up.T)` of a gate/up pair of one group size, bits and
/// mode: as one launch of our CUDA kernels where that launch covers the call (both products
/// and MLX's compiled swiglu arithmetic in bfloat16: the same bits as [`quantized_matmul`]
/// twice and `mlx_nn::activations::swiglu`; the CUDA backend, one bfloat16 row, two 4-bit
/// affine weights of one shape that [`quantized_matmul_many`] would run as one launch),
/// else the two products ([`GateUp::Products`]), in one call either way.
/// [`set_fast_qmv_swiglu`] or `MLX_FAST_QMV_SWIGLU=0` turns the launch off.
#[track_caller]
pub fn quantized_matmul_swiglu(
    x: &Array,
    gate: QuantizedWeight<'_>,
    up: QuantizedWeight<'_>,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
) -> Result<GateUp> {
    let mut outs = many_call(
        "quantized_matmul_swiglu",
        sys::mlxs_quantized_swiglu,
        x,
        &[gate, up],
        group_size,
        bits,
        mode,
    )?
    .into_iter();
    match (outs.next(), outs.next(), outs.next()) {
        (Some(y), None, None) => Ok(GateUp::Swiglu(y)),
        (Some(g), Some(u), None) => Ok(GateUp::Products(g, u)),
        _ => Err(Error::InvalidArgument(
            "quantized_matmul_swiglu: expected one or two outputs".into(),
        )),
    }
}

/// The shim's many-weight calls (weights, scales and biases as three vectors).
type ManyFn = unsafe extern "C" fn(
    *mut sys::mlxs_vec,
    sys::mlxs_array,
    sys::mlxs_vec,
    sys::mlxs_vec,
    sys::mlxs_vec,
    std::os::raw::c_int,
    std::os::raw::c_int,
    *const std::os::raw::c_char,
    sys::mlxs_stream,
) -> std::os::raw::c_int;

#[track_caller]
fn many_call(
    op: &str,
    f: ManyFn,
    x: &Array,
    weights: &[QuantizedWeight<'_>],
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
) -> Result<Vec<Array>> {
    let with_biases = weights.iter().filter(|w| w.biases.is_some()).count();
    if with_biases != 0 && with_biases != weights.len() {
        return Err(Error::InvalidArgument(format!(
            "{op}: either every weight has biases or none has"
        )));
    }
    let m = cstr(mode.name())?;
    let ws = VecHandle::from_arrays(weights.iter().map(|w| w.weight))?;
    let scales = VecHandle::from_arrays(weights.iter().map(|w| w.scales))?;
    let biases = VecHandle::from_arrays(weights.iter().filter_map(|w| w.biases))?;
    outv(|o| unsafe {
        f(
            o,
            x.as_raw(),
            ws.0,
            scales.0,
            biases.0,
            group_size.unwrap_or(0),
            bits.unwrap_or(0),
            m.as_ptr(),
            Array::s(),
        )
    })
}

/// Quantized matmul with matrix-level gather (mixture-of-experts).
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    transpose: bool,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
    sorted_indices: bool,
) -> Result<Array> {
    let m = cstr(mode.name())?;
    out1(|o| unsafe {
        sys::mlxs_gather_qmm(
            o,
            x.as_raw(),
            w.as_raw(),
            scales.as_raw(),
            opt(biases),
            opt(lhs_indices),
            opt(rhs_indices),
            transpose,
            group_size.unwrap_or(0),
            bits.unwrap_or(0),
            m.as_ptr(),
            sorted_indices,
            Array::s(),
        )
    })
}

/// Matmul with matrix-level gather (mixture-of-experts).
#[track_caller]
pub fn gather_mm(
    a: &Array,
    b: &Array,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    sorted_indices: bool,
) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_gather_mm(
            o,
            a.as_raw(),
            b.as_raw(),
            opt(lhs_indices),
            opt(rhs_indices),
            sorted_indices,
            Array::s(),
        )
    })
}

/// Convert to E4M3 float8 (stored as uint8).
#[track_caller]
pub fn to_fp8(x: &Array) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_to_fp8(o, x.as_raw(), Array::s()) })
}

/// Convert E4M3 float8 (uint8) to `dtype`.
#[track_caller]
pub fn from_fp8(x: &Array, dtype: Dtype) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_from_fp8(o, x.as_raw(), dtype.to_raw(), Array::s()) })
}

/// Turns our one-row CUDA kernels for 4-bit [`quantized_matmul`] on or off (default on;
/// the environment variable `MLX_FAST_QMV=0` starts them off). On the CUDA backend, products
/// of one bfloat16 row with a 4-bit affine weight (K <= 16384), which MLX runs through its
/// `qmv` kernel, run through ours instead: the same arithmetic in the same order
/// (bit-identical results), with the weight loads issued ahead: about 2x faster on an
/// H200 for large weights and vocabulary heads, a few % for the smallest. Elsewhere (CPU,
/// Metal, other shapes) nothing changes.
pub fn set_fast_qmv(on: bool) {
    unsafe { sys::mlxs_set_fast_qmv(on) }
}

/// Our CUDA kernel for [`dequantize`] on or off (default on; `MLX_FAST_DEQUANT=0` at start
/// turns it off). On the CUDA backend, 4-bit affine weights `[n, K / 8]` dequantized to
/// bfloat16 (and the weight of the dequantized dense product, `MLX_DEQUANT_GEMM`) go
/// through it: the values of MLX's kernel bit for bit, with wide loads and stores.
/// Elsewhere nothing changes.
pub fn set_fast_dequant(on: bool) {
    unsafe { sys::mlxs_set_fast_dequant(on) }
}

/// How many [`dequantize`] calls (and dequantized products) of this process took our
/// kernel.
pub fn fast_dequant_launches() -> u64 {
    unsafe { sys::mlxs_fast_dequant_launches() }
}

/// Our CUDA kernels compiled once per machine on or off (default on;
/// `MLX_FAST_KERNEL_CACHE=0` at start turns it off). MLX 0.32 compiles a custom kernel
/// with NVRTC in every process that runs it (about a second each on an H200: a 4-bit
/// model's first token waited ~8 s for ours) and never writes the result to its PTX disk
/// cache, though it reads that cache first. On, each of our kernels is compiled the way
/// MLX would compile it (the same source, NVRTC library, headers and options) into that
/// cache (`MLX_PTX_CACHE_DIR`, else `<tmp>/mlx/<version>/ptx`) the first time it is
/// needed, and every process after loads it from there. Off, or wherever that fails, MLX
/// compiles it as before. The kernels are the same either way.
pub fn set_kernel_cache(on: bool) {
    unsafe { sys::mlxs_set_kernel_cache(on) }
}

/// How many of our kernels this process compiled into MLX's disk cache, and how many it
/// found there already: `(compiled, found)`.
pub fn kernel_cache_counts() -> (u64, u64) {
    unsafe {
        (
            sys::mlxs_kernel_cache_compiles(),
            sys::mlxs_kernel_cache_hits(),
        )
    }
}

/// One launch of those kernels for several weights in [`quantized_matmul_many`] on or off
/// (default on; `MLX_FAST_QMV_MANY=0` at start turns it off): off, each weight gets its
/// own launch, with the same results.
pub fn set_fast_qmv_many(on: bool) {
    unsafe { sys::mlxs_set_fast_qmv_many(on) }
}

/// The residual add of [`quantized_matmul_add`] inside our kernel on or off (default on;
/// `MLX_FAST_QMV_RESIDUAL=0` at start turns it off): the same bits as MLX's `add` of the
/// rounded product (checked on an H200 with `fused_check MODEL ... qmv`), an `add` node
/// fewer per product.
pub fn set_fast_qmv_residual(on: bool) {
    unsafe { sys::mlxs_set_fast_qmv_residual(on) }
}

/// The swiglu launch of [`quantized_matmul_swiglu`] on or off (default on;
/// `MLX_FAST_QMV_SWIGLU=0` at start turns it off). It also needs [`set_fast_qmv_many`] on.
pub fn set_fast_qmv_swiglu(on: bool) {
    unsafe { sys::mlxs_set_fast_qmv_swiglu(on) }
}

/// A one-row product whose input is MLX's pending `rms_norm` of a bfloat16 row (up to 8,192
/// values) computes that norm in its own launch of our kernels, with MLX's values bit for
/// bit, instead of after MLX's rms_norm kernel: a graph node and a launch fewer per norm
/// (the products through [`quantized_matmul`], [`quantized_matmul_many`] and
/// [`quantized_matmul_swiglu`]). Off by default; `MLX_FAST_QMV_NORM=1` at start turns it
/// on.
pub fn set_fast_qmv_norm(on: bool) {
    unsafe { sys::mlxs_set_fast_qmv_norm(on) }
}

/// How many launches of our one-row kernels computed their input's rms_norm
/// ([`set_fast_qmv_norm`]).
pub fn fast_qmv_norm_launches() -> u64 {
    unsafe { sys::mlxs_fast_qmv_norm_launches() }
}

/// Weights of fewer than `n` elements stay on MLX's own kernels (default 0: every size;
/// `MLX_FAST_QMV_MIN_ELEMENTS=N` at start sets another).
pub fn set_fast_qmv_min_elements(n: u64) {
    unsafe { sys::mlxs_set_fast_qmv_min_elements(i64::try_from(n).unwrap_or(i64::MAX)) }
}

/// Whether [`set_fast_qmv`] is on.
pub fn fast_qmv_enabled() -> bool {
    unsafe { sys::mlxs_fast_qmv_enabled() }
}

/// How many [`quantized_matmul`] calls of this process took our kernel.
pub fn fast_qmv_launches() -> u64 {
    unsafe { sys::mlxs_fast_qmv_launches() }
}

/// Turns our multi-row CUDA kernel for 4-bit [`quantized_matmul`] on or off (default on;
/// `MLX_FAST_QMM=0` at start turns it off; it also needs [`set_fast_qmv`] on). On the CUDA
/// backend, products of 2 or more bfloat16 rows (the batch dimensions of x flattened into
/// rows) with a weight the one-row kernels take run through it. Rows of several sequences
/// take its tensor-core form by default, at any row count ([`set_fast_qmm_mma`]: float32
/// sums, other bits than MLX's); otherwise, up to 32 rows (`MLX_FAST_QMM_MAX_ROWS` or
/// [`set_fast_qmm_max_rows`] sets the bound), every output row is bit-identical to that
/// row's product alone (batch-invariant), which MLX's own kernel for many rows (`qmm`) is
/// not. Off, MLX's runs and its bits come back.
pub fn set_fast_qmm(on: bool) {
    unsafe { sys::mlxs_set_fast_qmm(on) }
}

/// The most rows of x [`set_fast_qmm`]'s exact kernel takes (default 32); products of more
/// rows go to MLX, unless they are rows of several sequences under [`QmmMma::On`].
pub fn set_fast_qmm_max_rows(n: u64) {
    unsafe { sys::mlxs_set_fast_qmm_max_rows(i64::try_from(n).unwrap_or(i64::MAX)) }
}

/// Rows of the weight one warp of [`set_fast_qmm`]'s kernel computes: 0 (the default, or
/// `MLX_FAST_QMM_WARP_ROWS` at start) picks 2 where the grid stays large enough, else 1;
/// 1, 2 or 4 fix it (other values: 0). The same bits for every choice (each row of w and
/// of x keeps its own arithmetic); more rows share each load of x, fewer rows of x share
/// each load of w.
pub fn set_fast_qmm_warp_rows(n: u32) {
    unsafe { sys::mlxs_set_fast_qmm_warp_rows(i32::try_from(n).unwrap_or(0)) }
}

/// Whether [`set_fast_qmm`] is on.
pub fn fast_qmm_enabled() -> bool {
    unsafe { sys::mlxs_fast_qmm_enabled() }
}

/// How many [`quantized_matmul`] calls of this process took the multi-row kernel.
pub fn fast_qmm_launches() -> u64 {
    unsafe { sys::mlxs_fast_qmm_launches() }
}

/// Which form [`set_fast_qmm`]'s products of several rows take on the CUDA backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QmmMma {
    /// Every output row keeps its one-row product's bits (batch-invariant).
    Off,
    /// The default: rows of several sequences (batched decoding and prefill, x as
    /// `[B, 1, K]` or `[B, L, K]` with B > 1) from `MLX_FAST_QMM_MMA_MIN_ROWS` (2) rows, up
    /// to `MLX_FAST_QMM_MMA_MAX_ROWS` (no bound by default), run on tensor cores, with
    /// float32 sums in another order: other bits than MLX's, batch-dependent as MLX's own
    /// `qmm` is (docs/parity.md). One sequence's rows keep their bits as under `Off`.
    On,
    /// Every product of 2 or more rows takes the tensor-core form, one sequence's rows
    /// too: the setting of the quality gate, not of serving.
    Force,
}

/// Sets the form of products of several rows (`MLX_FAST_QMM_MMA=0` / `force` at start
/// set [`QmmMma::Off`] / [`QmmMma::Force`]; anything else keeps [`QmmMma::On`]).
pub fn set_fast_qmm_mma(mode: QmmMma) {
    let m = match mode {
        QmmMma::Off => 0,
        QmmMma::On => 1,
        QmmMma::Force => 2,
    };
    unsafe { sys::mlxs_set_fast_qmm_mma(m) }
}

/// The form in force (see [`set_fast_qmm_mma`]).
pub fn fast_qmm_mma() -> QmmMma {
    match unsafe { sys::mlxs_fast_qmm_mma_mode() } {
        0 => QmmMma::Off,
        2 => QmmMma::Force,
        _ => QmmMma::On,
    }
}

/// How many [`quantized_matmul`] calls of this process took the tensor-core form.
pub fn fast_qmm_mma_launches() -> u64 {
    unsafe { sys::mlxs_fast_qmm_mma_launches() }
}

/// Turns our tiled CUDA kernel for 4-bit [`quantized_matmul`] of 33 or more rows on or
/// off (default on; `MLX_FAST_QGEMM=0` at start turns it off, `MLX_FAST_QGEMM_MIN_ROWS=N`
/// moves the floor). On the CUDA backend it takes the products MLX runs through its
/// `qmm_sm80` kernel (bfloat16 x of 8 or more rows in all, a 4-bit affine weight of
/// N % 128 == 0 and K a multiple of max(64, group size)) or, for other N (a multiple of 8;
/// `MLX_FAST_QGEMM_NMASK=0` leaves them to MLX), its `qmm_naive`, that none of the kernels
/// above takes, such as a prompt's prefill at batch 1, and gives MLX's bits for them: the
/// same tensor-core products over K in the same order, tiled differently. Off, MLX's
/// kernels run.
pub fn set_fast_qgemm(on: bool) {
    unsafe { sys::mlxs_set_fast_qgemm(on) }
}

/// How many [`quantized_matmul`] calls of this process took the tiled kernel.
pub fn fast_qgemm_launches() -> u64 {
    unsafe { sys::mlxs_fast_qgemm_launches() }
}

/// Turns the gathered form of [`set_fast_qgemm`]'s kernel on or off (default on;
/// `MLX_FAST_QGEMM_GATHER=0` at start turns it off; it also needs [`set_fast_qgemm`] on).
/// On the CUDA backend it takes [`gather_qmm`] with one expert index a row of x (x
/// `[..., 1, K]` bfloat16 with `rhs_indices` of x's batch shape, or of that shape with 1
/// on the last axis of the indices, uint32, no `lhs_indices`: mlx-lm's sorted and unsorted
/// mixture-of-experts products) of 8 or more rows (prefill and decoding; below 8 MLX runs
/// its `gather_qmv`), 4-bit affine experts as [`set_fast_qgemm`]'s weights, and gives MLX's
/// bits for them. From 32 rows an expert on average (`MLX_FAST_QGEMM_CHUNK_ROWS`) it runs
/// chunks of 64 rows, below that a block for each run of one expert.
pub fn set_fast_gather_qgemm(on: bool) {
    unsafe { sys::mlxs_set_fast_gather_qgemm(on) }
}

/// How many [`gather_qmm`] calls of this process took the gathered form.
pub fn fast_gather_qgemm_launches() -> u64 {
    unsafe { sys::mlxs_fast_gather_qgemm_launches() }
}
