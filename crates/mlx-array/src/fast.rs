//! MLX's fused kernels (`mx.fast`).
use crate::array::{opt, out1, Array};
use crate::error::Result;
use crate::ops::cstr;
use mlx_sys as sys;

/// RMS normalization over the last axis, optionally scaled by `weight`.
#[track_caller]
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_fast_rms_norm(o, x.as_raw(), opt(weight), eps, Array::s()) })
}

/// Cross-entropy of `logits` `[..., V]` against integer class `targets` `[...]`, one loss
/// per target in the logits' dtype: a fused kernel (float32 accumulation) on the GPU;
/// MLX composes it from ops on the CPU. `mlx.nn.losses.cross_entropy` takes this path on
/// the GPU only (see `mlx_nn::losses::cross_entropy`).
#[track_caller]
pub fn cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_fast_cross_entropy(o, logits.as_raw(), targets.as_raw(), Array::s())
    })
}

/// Layer normalization over the last axis.
#[track_caller]
pub fn layer_norm(
    x: &Array,
    weight: Option<&Array>,
    bias: Option<&Array>,
    eps: f32,
) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_fast_layer_norm(o, x.as_raw(), opt(weight), opt(bias), eps, Array::s())
    })
}

/// Where a rotary embedding starts: a host integer, or an array (scalar or per batch).
pub enum RopeOffset<'a> {
    /// A fixed offset.
    Int(i32),
    /// An offset held in an array.
    Array(&'a Array),
}

/// Rotary position embedding on the last `dims` features. Exactly one of `base` and
/// `freqs` is given (custom frequencies for llama3 / yarn / longrope scaling).
#[track_caller]
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: RopeOffset<'_>,
    freqs: Option<&Array>,
) -> Result<Array> {
    let (hb, b) = (base.is_some(), base.unwrap_or(0.0));
    match offset {
        RopeOffset::Int(off) => out1(|o| unsafe {
            sys::mlxs_fast_rope(
                o,
                x.as_raw(),
                dims,
                traditional,
                hb,
                b,
                scale,
                off,
                opt(freqs),
                Array::s(),
            )
        }),
        RopeOffset::Array(off) => out1(|o| unsafe {
            sys::mlxs_fast_rope_dynamic(
                o,
                x.as_raw(),
                dims,
                traditional,
                hb,
                b,
                scale,
                off.as_raw(),
                opt(freqs),
                Array::s(),
            )
        }),
    }
}

/// The mask of [`scaled_dot_product_attention`].
pub enum SdpaMask<'a> {
    /// No mask.
    None,
    /// Causal mask (aligned to the end when keys are longer than queries).
    Causal,
    /// An additive (float) or boolean mask array, broadcastable to the scores.
    Array(&'a Array),
}

/// `softmax(q @ k.T * scale + mask) @ v` with MLX's fused kernel; `sinks` optional.
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: SdpaMask<'_>,
    sinks: Option<&Array>,
) -> Result<Array> {
    let (mode, arr) = match mask {
        SdpaMask::None => ("", None),
        SdpaMask::Causal => ("causal", None),
        SdpaMask::Array(a) => ("array", Some(a)),
    };
    let mode = cstr(mode)?;
    out1(|o| unsafe {
        sys::mlxs_fast_sdpa(
            o,
            q.as_raw(),
            k.as_raw(),
            v.as_raw(),
            scale,
            mode.as_ptr(),
            opt(arr),
            opt(sinks),
            Array::s(),
        )
    })
}

/// Turns our CPU matmul on or off (default on; the environment variable
/// `MLX_FAST_CPU_GEMV=0` starts it off). On the CPU of Linux x86-64 builds (elsewhere
/// MLX's CPU kernels sum in another order, and keep the products), `matmul` of a `[..., M, K]` by a
/// `[K, N]` (and `addmm` with alpha and beta 1) of float32, bfloat16 or float16 runs
/// through our primitive of MLX's CPU arithmetic (each output the float32 sum of its
/// products in order, rounded once; `crates/mlx-sys/shim/cpu_gemv.cpp`): the same bits as
/// MLX's matmul, ~2.5x faster for a decoding step of a small model, ~1.8x for its prefill.
/// The same switch covers CPU `quant::quantized_matmul` of 4- and 8-bit affine weights
/// (bfloat16 throughout, or float32 activations), through our primitive of MLX's CPU
/// quantized arithmetic (every bfloat16 rounding kept): same bits, ~6x faster on a 4-bit
/// small model; and `quant::gather_qmm` of mixture-of-experts layers (one expert index a
/// row of x, x / scales / biases all bfloat16 or all float32), the same arithmetic a row
/// with its expert. Elsewhere nothing changes.
pub fn set_cpu_gemv(on: bool) {
    unsafe { sys::mlxs_set_fast_cpu_gemv(on) }
}

/// Whether [`set_cpu_gemv`] is on.
pub fn cpu_gemv_enabled() -> bool {
    unsafe { sys::mlxs_fast_cpu_gemv_enabled() }
}

/// How many matmuls of this process were built with our CPU primitive.
pub fn cpu_gemv_uses() -> u64 {
    unsafe { sys::mlxs_fast_cpu_gemv_uses() }
}

/// `residual + x @ wt`, the same array as `residual.add(&x.matmul(wt)?)`, where `wt` is
/// the transposed view of a weight `W [N, K]` (a linear layer's product and its residual
/// add). On the CUDA backend, for one row of `x` (`[..., 1, K]`; bfloat16, float16 or
/// float32, `K` a multiple of 128, at least `MLX_FAST_GEMV_MIN_ELEMENTS` weight
/// elements, default 4M) it is one launch of our kernel with the arithmetic of MLX's
/// `gemv` and `add` (`crates/mlx-sys/shim/fast_gemv.cpp`): the same bits, one kernel
/// fewer. Elsewhere MLX's ops run.
#[track_caller]
pub fn matmul_add(x: &Array, wt: &Array, residual: &Array) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_matmul_add(o, x.as_raw(), wt.as_raw(), residual.as_raw(), Array::s())
    })
}

/// mlx-lm's `swiglu(g, u)` of `[g, u] = split(x @ wt, 2, -1)`, where `wt` is the
/// transposed view of a fused `[gate; up]` weight, as one launch of our kernel (the
/// products with MLX's `gemv` arithmetic, then MLX's compiled swiglu arithmetic on the
/// stored products: the same bits) where it covers the call, as [`matmul_add`] does;
/// `None` elsewhere (the caller runs the product, the split and the swiglu).
#[track_caller]
pub fn matmul_swiglu(x: &Array, wt: &Array) -> Result<Option<Array>> {
    let mut taken = false;
    let mut p: sys::mlxs_array = std::ptr::null_mut();
    crate::error::check(unsafe {
        sys::mlxs_matmul_swiglu(&mut p, &mut taken, x.as_raw(), wt.as_raw(), Array::s())
    })?;
    // SAFETY: where it took the call, the shim wrote a new owned handle.
    Ok(taken.then(|| unsafe { Array::from_raw(p) }))
}

/// Attention of `N` queries a row, `q` `[B, Hq, N, D]` over `k` / `v` `[B, Hkv, L, D]`
/// (`N <= L`), query `i` of row `b` seeing the keys from `left_padding[b]` (`[B]`, int32)
/// up to `L - N + i`, scaled by `scale`: what MLX's attention gives with the boolean mask
/// `left_padding[b] <= position <= L - N + i` (one query: `position >= left_padding[b]`),
/// as one launch of our CUDA kernel (`crates/mlx-sys/shim/fast_sdpa.cpp`: bfloat16 or
/// float16, `D` of 64 or 128) where it covers the call; `None` elsewhere. Each query gets
/// the bits a call with that query alone over its visible keys gives. `mlx_nn::attention`
/// takes it for a batch's decoding step of padded rows (`AttnMask::LeftPadded`) and, while
/// its split of a few queries is on, for a batch's verification over padded rows.
#[track_caller]
pub fn sdpa_padded(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    left_padding: &Array,
) -> Result<Option<Array>> {
    let mut taken = false;
    let mut p: sys::mlxs_array = std::ptr::null_mut();
    crate::error::check(unsafe {
        sys::mlxs_sdpa_padded(
            &mut p,
            &mut taken,
            q.as_raw(),
            k.as_raw(),
            v.as_raw(),
            scale,
            left_padding.as_raw(),
            Array::s(),
        )
    })?;
    // SAFETY: where it took the call, the shim wrote a new owned handle.
    Ok(taken.then(|| unsafe { Array::from_raw(p) }))
}

/// How many attentions of this process were built with [`sdpa_padded`]'s kernel.
pub fn sdpa_padded_launches() -> u64 {
    unsafe { sys::mlxs_sdpa_padded_launches() }
}

/// `logits` (`[R, V]`) with every token whose bit is clear in `words` (`uint32`
/// `[R, V.div_ceil(32)]` or `[R, V.div_ceil(32), 1]`: bit `v % 32` of word `v / 32`
/// allows token `v`) set to `-inf` and every other logit's bits kept, which is MLX's
/// `where` over the bits expanded to one flag a token, as one launch of our CUDA kernel
/// (`crates/mlx-sys/shim/fast_mask.cpp`: a float dtype, the CUDA backend) where it covers
/// the call and is on (the default; `MLX_FAST_MASK=0` or [`set_fast_mask`] turns it off); `None`
/// elsewhere.
#[track_caller]
pub fn masked_logits(words: &Array, logits: &Array) -> Result<Option<Array>> {
    let mut taken = false;
    let mut p: sys::mlxs_array = std::ptr::null_mut();
    // SAFETY: both handles are live arrays; the shim writes `taken` and, where it took
    // the call, a new owned handle into `p`.
    crate::error::check(unsafe {
        sys::mlxs_masked_logits(
            &mut p,
            &mut taken,
            words.as_raw(),
            logits.as_raw(),
            Array::s(),
        )
    })?;
    // SAFETY: where it took the call, the shim wrote a new owned handle.
    Ok(taken.then(|| unsafe { Array::from_raw(p) }))
}

/// Turns the kernel of [`masked_logits`] on or off (default on, `MLX_FAST_MASK=0` off).
pub fn set_fast_mask(on: bool) {
    // SAFETY: sets an atomic switch in the shim.
    unsafe { sys::mlxs_set_fast_mask(on) }
}

/// Whether [`masked_logits`]'s kernel is on (it still runs only on the CUDA backend).
pub fn fast_mask_enabled() -> bool {
    // SAFETY: reads an atomic switch in the shim.
    unsafe { sys::mlxs_fast_mask_enabled() }
}

/// How many masks of this process were applied with [`masked_logits`]'s kernel.
pub fn fast_mask_launches() -> u64 {
    // SAFETY: reads an atomic counter in the shim.
    unsafe { sys::mlxs_fast_mask_launches() }
}

/// Turns the kernel of [`matmul_add`] and [`matmul_swiglu`] on or off (default on; the
/// environment variable `MLX_FAST_GEMV=0` starts it off).
pub fn set_gemv(on: bool) {
    unsafe { sys::mlxs_set_fast_gemv(on) }
}

/// Which products of 2 to 8 rows of x take the rows form of that kernel (each row with the
/// one-row kernel's bits, MLX's `gemv`, the weight read once), on the CUDA backend:
/// [`GemvRows::Off`] (the default) leaves them to MLX's gemm (cuBLAS), whose bits differ;
/// the environment variable `MLX_FAST_GEMV_ROWS` (`1`: [`GemvRows::All`], `batch`:
/// [`GemvRows::Batch`]) starts it on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvRows {
    /// MLX's products.
    Off,
    /// Every product of 2..8 rows (one sequence's too: a speculative verification).
    All,
    /// Rows of several sequences only (x `[B, 1, K]`: a batch's decoding step).
    Batch,
}

/// Sets which products take the rows form ([`GemvRows`]).
pub fn set_gemv_rows(mode: GemvRows) {
    let m = match mode {
        GemvRows::Off => 0,
        GemvRows::All => 1,
        GemvRows::Batch => 2,
    };
    unsafe { sys::mlxs_set_fast_gemv_rows(m) }
}

/// The current [`GemvRows`] setting.
pub fn gemv_rows() -> GemvRows {
    match unsafe { sys::mlxs_fast_gemv_rows_mode() } {
        1 => GemvRows::All,
        2 => GemvRows::Batch,
        _ => GemvRows::Off,
    }
}

/// Whether [`set_gemv`] is on.
pub fn gemv_enabled() -> bool {
    unsafe { sys::mlxs_fast_gemv_enabled() }
}

/// How many products of this process were built with that kernel.
pub fn gemv_launches() -> u64 {
    unsafe { sys::mlxs_fast_gemv_launches() }
}
