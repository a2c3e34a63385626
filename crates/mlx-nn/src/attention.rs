//! mlx-lm's attention helper (`models/base.py`): fused SDPA for plain caches, the
//! quantized-matmul path for quantized caches.
use crate::cache::{AttnMask, KvFetch};
use mlx_array::fast::{self, SdpaMask};
use mlx_array::quant::{quantized_matmul, QuantMode};
use mlx_array::{ops, Array, Dtype, Error, Result};

/// The most negative finite value of a floating dtype (`mx.finfo(dtype).min`).
pub fn finfo_min(dtype: Dtype) -> Result<f64> {
    Ok(match dtype {
        Dtype::Float32 => f32::MIN as f64,
        Dtype::Float16 => half::f16::MIN.to_f64(),
        Dtype::Bfloat16 => half::bf16::MIN.to_f64(),
        Dtype::Float64 => f64::MIN,
        other => {
            return Err(Error::InvalidArgument(format!(
                "finfo: {other} is not a floating dtype"
            )))
        }
    })
}

/// `scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks)` of
/// mlx-lm: `fetch` is what the cache returned (or the fresh keys/values without cache).
#[track_caller]
pub fn scaled_dot_product_attention(
    queries: &Array,
    fetch: &KvFetch,
    scale: f64,
    mask: &AttnMask,
    sinks: Option<&Array>,
) -> Result<Array> {
    match fetch {
        KvFetch::Plain { keys, values } => {
            let m = match mask {
                AttnMask::None => SdpaMask::None,
                AttnMask::Causal => SdpaMask::Causal,
                AttnMask::Array(a) => SdpaMask::Array(a),
            };
            fast::scaled_dot_product_attention(queries, keys, values, scale as f32, m, sinks)
        }
        KvFetch::Quantized {
            keys,
            values,
            group_size,
            bits,
        } => {
            if sinks.is_some() {
                return Err(Error::InvalidArgument(
                    "Quantized SDPA does not support attention sinks.".into(),
                ));
            }
            quantized_sdpa(queries, keys, values, scale, mask, *group_size, *bits)
        }
    }
}

type Triple = (Array, Array, Array);

/// mlx-lm's `quantized_scaled_dot_product_attention`.
#[track_caller]
pub fn quantized_sdpa(
    queries: &Array,
    q_keys: &Triple,
    q_values: &Triple,
    scale: f64,
    mask: &AttnMask,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let shape = queries.shape();
    if shape.len() != 4 {
        return Err(Error::InvalidArgument(format!(
            "quantized SDPA expects [B, heads, L, D] queries, got {shape:?}"
        )));
    }
    let (b, n_q_heads, l, d) = (shape[0], shape[1], shape[2], shape[3]);
    let n_kv_heads = q_keys.0.dim(-3)?;
    let n_repeats = n_q_heads / n_kv_heads;

    let mut queries = queries.multiply(scale)?;
    let expand = |t: &Triple| -> Result<Triple> {
        Ok((
            t.0.expand_dims(&[-3])?,
            t.1.expand_dims(&[-3])?,
            t.2.expand_dims(&[-3])?,
        ))
    };
    let (k, v) = if n_repeats > 1 {
        queries = queries.reshape(&[b, n_kv_heads, n_repeats, l, d])?;
        (expand(q_keys)?, expand(q_values)?)
    } else {
        (q_keys.clone(), q_values.clone())
    };
    let qmm = |x: &Array, t: &Triple, transpose: bool| {
        quantized_matmul(
            x,
            &t.0,
            &t.1,
            Some(&t.2),
            transpose,
            Some(group_size),
            Some(bits),
            QuantMode::Affine,
        )
    };
    let mut scores = qmm(&queries, &k, true)?;
    let mask_array = match mask {
        AttnMask::None => None,
        AttnMask::Causal => {
            let (ql, kl) = (scores.dim(-2)?, scores.dim(-1)?);
            let q_idx = ops::arange((kl - ql) as f64, kl as f64, 1.0, Dtype::Int32)?;
            let k_idx = ops::arange(0.0, kl as f64, 1.0, Dtype::Int32)?;
            Some(
                q_idx
                    .expand_dims(&[1])?
                    .greater_equal(&k_idx.expand_dims(&[0])?)?,
            )
        }
        AttnMask::Array(a) => Some(a.clone()),
    };
    if let Some(mut m) = mask_array {
        if n_repeats > 1 && m.ndim() > 3 {
            m = m.expand_dims(&[-3])?;
        }
        scores = if m.dtype() == Dtype::Bool {
            let min = Array::scalar_f64(finfo_min(scores.dtype())?, scores.dtype())?;
            ops::where_(&m, &scores, &min)?
        } else {
            scores.add(&m)?
        };
    }
    let scores = scores.softmax(Some(&[-1]), true)?;
    let out = qmm(&scores, &v, false)?;
    if n_repeats > 1 {
        out.reshape(&[b, n_q_heads, l, d])
    } else {
        Ok(out)
    }
}
