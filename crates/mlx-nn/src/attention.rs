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

/// Attention scores under an array mask, as mlx-lm writes it out with plain ops: a
/// boolean mask keeps the scores where it is true and puts the dtype's most negative
/// value elsewhere (`mx.where(mask, scores, mx.finfo(scores.dtype).min)`), any other
/// mask is added.
#[track_caller]
pub fn mask_scores(scores: &Array, mask: &Array) -> Result<Array> {
    if mask.dtype() == Dtype::Bool {
        let min = Array::scalar_f64(finfo_min(scores.dtype())?, scores.dtype())?;
        ops::where_(mask, scores, &min)
    } else {
        scores.add(mask)
    }
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
            if let Some(out) = padded_rows(queries, keys, values, scale, mask, sinks)? {
                return Ok(out);
            }
            let m = match mask {
                AttnMask::None => SdpaMask::None,
                AttnMask::Causal => SdpaMask::Causal,
                AttnMask::Array(a) | AttnMask::LeftPadded { mask: a, .. } => SdpaMask::Array(a),
            };
            if let Some(out) = split_small_queries(queries, keys, values, scale, mask, sinks)? {
                return Ok(out);
            }
            if let Some(out) = bucketed_queries(queries, keys, values, scale, mask, sinks)? {
                return Ok(out);
            }
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

/// Whether [`padded_rows`] may take MLX's masked attention's place: `MLX_SDPA_PADDED=0`
/// (read once) keeps MLX's.
fn padded_kernel_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_SDPA_PADDED").as_deref() != Ok("0"))
}

/// Attention over left-padded rows as our kernel's one launch (`fast::sdpa_padded`: each
/// row's keys from its padding on, on a GPU in half precision) instead of MLX's masked
/// attention, which its CUDA backend runs unfused (five kernels a layer, ~2-3x the time
/// on an H100: GPU.md session 34): one query a row (a batch's decoding step), or, with a
/// row of the mask a query (the split's verification, [`splits_queries`]), each query
/// over the keys up to its position, the bits of a launch a query
/// (`MLX_SDPA_PADDED_QUERIES=0`: a launch a query, [`padded_query`]). `None` where the
/// kernel does not cover the call (the CPU, sinks, a mask not over these keys or with
/// another number of rows than queries). Another order of sums than MLX's, where mlx-lm's
/// batched decoding on a GPU is not reproducible either (docs/parity.md).
fn padded_rows(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f64,
    mask: &AttnMask,
    sinks: Option<&Array>,
) -> Result<Option<Array>> {
    let AttnMask::LeftPadded { mask, left_padding } = mask else {
        return Ok(None);
    };
    if sinks.is_some() || !padded_kernel_on() || keys.ndim() != 4 {
        return Ok(None);
    }
    let rows = mask.dim(-2)?;
    if mask.ndim() != 4 || mask.dim(-1)? != keys.dim(2)? || rows != queries.dim(2)? {
        return Ok(None);
    }
    if rows > 1 && !padded_queries_on() {
        return Ok(None);
    }
    fast::sdpa_padded(queries, keys, values, scale as f32, left_padding)
}

/// The bucket of [`bucketed_queries`] where `MLX_SDPA_BUCKET` is unset (0: off).
static BUCKET_BY_DEFAULT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Makes attention pad a prompt's queries, keys and values to multiples of `positions`
/// (on the GPU in half precision, so that cuDNN's plans repeat across prompt lengths) by
/// default in this process (0 or 1: off; `MLX_SDPA_BUCKET` still decides where it is
/// set). The serving engine sets 256: a server sees prompts of every length, and on an
/// H100 the time to a first token of a prompt of a new length fell from 84-92 ms to
/// 17-47 ms with it (0.5B / 8B shapes, benchmarks/GPU.md session 47). `mlx-generate`
/// leaves it off (one prompt a process builds one plan either way).
pub fn set_bucket_default(positions: i32) {
    BUCKET_BY_DEFAULT.store(positions, std::sync::atomic::Ordering::Relaxed);
}

/// `MLX_SDPA_BUCKET` (read once): the multiple of positions [`bucketed_queries`] pads a
/// prompt's attention to (e.g. `256`); `0` (or `1`, or not a number): off; unset, the
/// process's default ([`set_bucket_default`]: off unless a caller set one).
fn bucket_setting() -> Option<i32> {
    static SETTING: std::sync::OnceLock<Option<Option<i32>>> = std::sync::OnceLock::new();
    let set = *SETTING.get_or_init(|| {
        std::env::var("MLX_SDPA_BUCKET")
            .ok()
            .map(|v| v.parse::<i32>().ok().filter(|&n| n > 1))
    });
    set.unwrap_or_else(|| {
        Some(BUCKET_BY_DEFAULT.load(std::sync::atomic::Ordering::Relaxed)).filter(|&n| n > 1)
    })
}

/// A prompt's attention (more than one query, not split) on the GPU in half precision
/// with its queries, keys and values padded at the end by the same number of positions,
/// up to a multiple of `MLX_SDPA_BUCKET` queries (the serving engine's default, 256:
/// [`set_bucket_default`]), the padded queries' rows dropped. MLX's CUDA backend sends
/// such attention to cuDNN, which builds an execution plan for every new (rows, heads,
/// queries, keys) shape (~35 ms on an H100, ~45 on the H200, benchmarks/GPU.md sessions
/// 13 and 47): a server pays it for every prompt length it has not seen, where padded
/// lengths repeat. Under the causal mask (aligned to the last key, as MLX's is; the
/// padded call's rows bit for bit the unpadded call's on an H100, `sdpa_graph_probe.py
/// --prefill`) keys padded as the queries are come after every real
/// query's last visible key, so no mask array is needed where that makes the keys a
/// multiple too (no keys before the queries, or a multiple of them); otherwise (a cached
/// prefix of another length) the keys are padded to the next multiple under a boolean
/// mask of the same causal pattern. Under an array mask (a batch's left-padded prefill)
/// the padded keys are hidden from the real rows and the padded rows see every key (no
/// row without a key). `None` where it is off or does not apply (the CPU, single
/// precision, one query, no mask, lengths already multiples, a mask of another shape).
fn bucketed_queries(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f64,
    mask: &AttnMask,
    sinks: Option<&Array>,
) -> Result<Option<Array>> {
    let Some(bucket) = bucket_setting() else {
        return Ok(None);
    };
    padded_to_bucket(bucket, true, queries, keys, values, scale, mask, sinks)
}

/// The most elements of the causal mask [`bucketed_queries`] builds where keys before
/// the queries leave the keys off a multiple (a 2,048-position prompt chunk after 6,000
/// cached positions); larger ones go unpadded.
const MAX_BUCKET_MASK: i64 = 1 << 24;

/// [`bucketed_queries`] with `bucket`; on any device and dtype unless `gpu_half_only`
/// (asked after the shapes, so that a decoding step's one query costs no device query).
#[allow(clippy::too_many_arguments)]
fn padded_to_bucket(
    bucket: i32,
    gpu_half_only: bool,
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f64,
    mask: &AttnMask,
    sinks: Option<&Array>,
) -> Result<Option<Array>> {
    let (qs, ks) = (queries.shape(), keys.shape());
    if qs.len() != 4 || ks.len() != 4 || values.ndim() != 4 {
        return Ok(None);
    }
    let (l, kl) = (qs[2], ks[2]);
    if l < 2 || kl < l {
        return Ok(None);
    }
    if gpu_half_only
        && (!matches!(queries.dtype(), Dtype::Float16 | Dtype::Bfloat16)
            || !mlx_array::current_device().is_ok_and(|d| d.kind == mlx_array::DeviceType::Gpu))
    {
        return Ok(None);
    }
    let up = |n: i32| (n + bucket - 1) / bucket * bucket;
    // Queries padded by `p`; keys by `p` too where that lands on a multiple (causal alone
    // then hides them), else up to the next multiple under a mask.
    let p = up(l) - l;
    let pad_end = |a: &Array, axis: i32, by: i32, value: Option<&Array>| {
        a.pad(&[axis], &[0], &[by], value, "constant")
    };
    let padded_mask;
    let (pk, m) = match mask {
        AttnMask::Causal if (kl + p) % bucket == 0 => {
            if p == 0 {
                return Ok(None);
            }
            (p, SdpaMask::Causal)
        }
        AttnMask::Causal => {
            // Query i (of the padded queries) sees the keys up to kl - l + i: the real
            // rows exactly theirs, the padded rows every real key and some padded ones.
            // A mask of at most MAX_BUCKET_MASK elements: past it (a long cached prefix)
            // the mask costs more than the plan it saves.
            let kb = up(kl);
            if (l + p) as i64 * kb as i64 > MAX_BUCKET_MASK {
                return Ok(None);
            }
            let rows = ops::arange((kl - l) as f64, (kl + p) as f64, 1.0, Dtype::Int32)?
                .reshape(&[l + p, 1])?;
            let cols = ops::arange(0.0, kb as f64, 1.0, Dtype::Int32)?.reshape(&[1, kb])?;
            padded_mask = cols.less_equal(&rows)?;
            (kb - kl, SdpaMask::Array(&padded_mask))
        }
        AttnMask::Array(a) | AttnMask::LeftPadded { mask: a, .. } => {
            let n = a.ndim() as i32;
            if n < 2 || a.dim(-2)? != l || a.dim(-1)? != kl {
                return Ok(None);
            }
            let pk = up(kl) - kl;
            if p == 0 && pk == 0 {
                return Ok(None);
            }
            let (hide, show) = if a.dtype() == Dtype::Bool {
                (Array::scalar(false)?, Array::scalar(true)?)
            } else {
                (
                    Array::scalar_f64(finfo_min(a.dtype())?, a.dtype())?,
                    Array::scalar_f64(0.0, a.dtype())?,
                )
            };
            let hidden = pad_end(a, n - 1, pk, Some(&hide))?;
            padded_mask = pad_end(&hidden, n - 2, p, Some(&show))?;
            (pk, SdpaMask::Array(&padded_mask))
        }
        AttnMask::None => return Ok(None),
    };
    let out = fast::scaled_dot_product_attention(
        &pad_end(queries, 2, p, None)?,
        &pad_end(keys, 2, pk, None)?,
        &pad_end(values, 2, pk, None)?,
        scale as f32,
        m,
        sinks,
    )?;
    out.slice_axis(2, 0, l).map(Some)
}

/// `MLX_SDPA_SPLIT_QUERIES` (read once): `1` turns the split on for the GPU; `force`
/// applies it on any device and dtype (the CPU quality gate, bins/tests/sdpa_split.rs);
/// `0` (or any other value) turns it off; unset, the process's default
/// ([`set_split_queries_default`]: off unless a caller turned it on).
#[derive(Clone, Copy, PartialEq, Eq)]
enum SplitQueries {
    Off,
    Gpu,
    Force,
}

/// The split's setting where `MLX_SDPA_SPLIT_QUERIES` is unset: on for the GPU.
static SPLIT_BY_DEFAULT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the split of a few queries' attention one query at a time the default of this
/// process on the GPU (`MLX_SDPA_SPLIT_QUERIES` still decides where it is set). The
/// serving engine turns it on: its batches are not mlx-lm's bits on a GPU anyway, and
/// without it every speculative verification builds a cuDNN plan (~45 ms on the H200).
/// `mlx-generate` keeps mlx-lm's attention by default.
pub fn set_split_queries_default(on: bool) {
    SPLIT_BY_DEFAULT.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn split_queries_setting() -> SplitQueries {
    static SETTING: std::sync::OnceLock<Option<SplitQueries>> = std::sync::OnceLock::new();
    let set = *SETTING.get_or_init(
        || match std::env::var("MLX_SDPA_SPLIT_QUERIES").as_deref() {
            Ok("1") => Some(SplitQueries::Gpu),
            Ok("force") => Some(SplitQueries::Force),
            Ok(_) => Some(SplitQueries::Off),
            Err(_) => None,
        },
    );
    set.unwrap_or(
        if SPLIT_BY_DEFAULT.load(std::sync::atomic::Ordering::Relaxed) {
            SplitQueries::Gpu
        } else {
            SplitQueries::Off
        },
    )
}

/// Most queries the split takes: a verification of 64 drafts.
const SPLIT_MAX_QUERIES: i32 = 65;

/// Whether attention over `queries` positions is split one query at a time on the
/// current device (`MLX_SDPA_SPLIT_QUERIES`, whatever the dtype): a batch cache then
/// hands its rows' padding alongside the mask (or a causal mask where no row is padded)
/// so that each query runs a decoding kernel instead of MLX's masked attention.
pub fn splits_queries(queries: i32) -> bool {
    split_applies(split_queries_setting(), queries)
}

/// Whether `setting` splits `queries` positions on the current device (the dtype aside).
fn split_applies(setting: SplitQueries, queries: i32) -> bool {
    if !(2..=SPLIT_MAX_QUERIES).contains(&queries) {
        return false;
    }
    match setting {
        SplitQueries::Off => false,
        SplitQueries::Force => true,
        SplitQueries::Gpu => {
            mlx_array::current_device().is_ok_and(|d| d.kind == mlx_array::DeviceType::Gpu)
        }
    }
}

/// GPU path for attention over a few queries (2 to 65: speculative verification, short
/// prompts), opt-in for a single sequence (`MLX_SDPA_SPLIT_QUERIES=1`) and the serving
/// engine's default ([`set_split_queries_default`]). MLX's CUDA backend sends every
/// half-precision attention over more than one query to cuDNN, whose execution plan is
/// built for each (queries, keys) shape: ~45 ms on the H200, paid on every round of
/// speculative decoding since the KV cache grows between rounds
/// (benchmarks/verify_shapes_probe.py). One query at a time takes MLX's decoding kernels
/// instead, whose plans do not depend on the key length; with a causal mask query `i`
/// sees the keys up to its own position, exactly what decoding that token alone sees; an
/// array mask (batched rows) gives each query its own row. A batch's left-padded rows
/// (`AttnMask::LeftPadded` with a row of the mask a query, which a batch cache hands
/// out while the split is on: [`splits_queries`]) take our padded-rows kernel for each
/// query over the keys up to its position (`fast::sdpa_padded`) rather than MLX's masked
/// attention, which its CUDA backend runs unfused for one query (five kernels a layer
/// and query: the ~4 ms more a one-row drafting step of the 8B pair waited on its
/// verification than `mlx-generate`'s round, GPU.md session 45). Rows come from another
/// kernel than mlx-lm's, so the bits differ (docs/parity.md). `None` when the path does not
/// apply (off, not on the GPU in half precision, one query, more than
/// [`SPLIT_MAX_QUERIES`], a mask of another shape).
fn split_small_queries(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f64,
    mask: &AttnMask,
    sinks: Option<&Array>,
) -> Result<Option<Array>> {
    split_small_queries_as(
        split_queries_setting(),
        queries,
        keys,
        values,
        scale,
        mask,
        sinks,
    )
}

fn split_small_queries_as(
    setting: SplitQueries,
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f64,
    mask: &AttnMask,
    sinks: Option<&Array>,
) -> Result<Option<Array>> {
    let (qs, ks) = (queries.shape(), keys.shape());
    if qs.len() != 4 || ks.len() != 4 {
        return Ok(None);
    }
    let (l, kl) = (qs[2], ks[2]);
    if !split_applies(setting, l) || kl < l {
        return Ok(None);
    }
    let half = matches!(queries.dtype(), Dtype::Float16 | Dtype::Bfloat16);
    if setting == SplitQueries::Gpu && !half {
        return Ok(None);
    }
    if let AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } = mask {
        // A mask of one row per query (batched rows' padding): query `i` takes its row.
        if m.ndim() < 2 || (m.dim(-2)? != 1 && m.dim(-2)? != l) {
            return Ok(None);
        }
    }
    if let Some(all) = causal_queries(queries, keys, values, scale, mask, sinks)? {
        return Ok(Some(all));
    }
    let mut rows = Vec::with_capacity(l as usize);
    for i in 0..l {
        let q = queries.slice_axis(2, i, i + 1)?;
        if let Some(row) = padded_query(&q, keys, values, scale, mask, sinks, kl - l + i + 1)? {
            rows.push(row);
            continue;
        }
        let row = match mask {
            AttnMask::Causal => {
                let visible = kl - l + i + 1;
                fast::scaled_dot_product_attention(
                    &q,
                    &keys.slice_axis(2, 0, visible)?,
                    &values.slice_axis(2, 0, visible)?,
                    scale as f32,
                    SdpaMask::None,
                    sinks,
                )?
            }
            AttnMask::None => fast::scaled_dot_product_attention(
                &q,
                keys,
                values,
                scale as f32,
                SdpaMask::None,
                sinks,
            )?,
            AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } => {
                let axis = m.ndim() as i32 - 2;
                let m = if m.dim(-2)? == 1 {
                    m.clone()
                } else {
                    m.slice_axis(axis, i, i + 1)?
                };
                fast::scaled_dot_product_attention(
                    &q,
                    keys,
                    values,
                    scale as f32,
                    SdpaMask::Array(&m),
                    sinks,
                )?
            }
        };
        rows.push(row);
    }
    let refs: Vec<&Array> = rows.iter().collect();
    ops::concatenate(&refs, 2).map(Some)
}

/// Whether a verification over left-padded rows runs its queries in one launch of our
/// padded-rows kernel ([`padded_rows`]) rather than a launch a query (read once;
/// `MLX_SDPA_PADDED_QUERIES=0` turns it off). On an H100 (`sdpa_pad_check`, GPU.md session
/// 47) every bit equal to a launch a query, 1.3-3x faster a call.
fn padded_queries_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_SDPA_PADDED_QUERIES").as_deref() != Ok("0"))
}

/// Whether a split causal verification (no row padded) runs as one launch of our
/// padded-rows kernel with no padding instead of MLX's one-query kernel a query
/// (`MLX_SPLIT_CAUSAL_KERNEL=padded`, read once; an experiment, session 47: another
/// order of sums than MLX's, so a verification's attention is no longer bit for bit
/// what decoding its tokens gives). `sdpa_pad_check` on an H100 timed a launch a query
/// at 50.6 us for one row of 4 queries over 600 keys and 565.1 for 8 rows of 8 over
/// 1,100 (MLX's two-pass form), where the padded rows' single launch took 21.1 and 275.8.
fn causal_kernel_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_SPLIT_CAUSAL_KERNEL").as_deref() == Ok("padded"))
}

/// Every query of a few under the causal mask as one launch of our padded-rows kernel,
/// no row padded (`MLX_SPLIT_CAUSAL_KERNEL=padded`); `None` where it is off or the kernel
/// declines (the CPU, sinks).
fn causal_queries(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f64,
    mask: &AttnMask,
    sinks: Option<&Array>,
) -> Result<Option<Array>> {
    if !matches!(mask, AttnMask::Causal) || sinks.is_some() || !causal_kernel_on() {
        return Ok(None);
    }
    let rows = queries.dim(0)?;
    let none = ops::zeros(&[rows], Dtype::Int32)?;
    fast::sdpa_padded(queries, keys, values, scale as f32, &none)
}

/// One query of a few over left-padded rows (`LeftPadded`, the mask a row a query), seeing
/// the first `visible` keys from each row's padding on, as one launch of our padded-rows
/// kernel; `None` where the mask is another or the kernel declines (the CPU, sinks).
fn padded_query(
    q: &Array,
    keys: &Array,
    values: &Array,
    scale: f64,
    mask: &AttnMask,
    sinks: Option<&Array>,
    visible: i32,
) -> Result<Option<Array>> {
    let AttnMask::LeftPadded { mask, left_padding } = mask else {
        return Ok(None);
    };
    if sinks.is_some() || !padded_kernel_on() || mask.dim(-2)? == 1 {
        return Ok(None);
    }
    fast::sdpa_padded(
        q,
        &keys.slice_axis(2, 0, visible)?,
        &values.slice_axis(2, 0, visible)?,
        scale as f32,
        left_padding,
    )
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
        AttnMask::Array(a) | AttnMask::LeftPadded { mask: a, .. } => Some(a.clone()),
    };
    if let Some(mut m) = mask_array {
        if n_repeats > 1 && m.ndim() > 3 {
            m = m.expand_dims(&[-3])?;
        }
        scores = mask_scores(&scores, &m)?;
    }
    let scores = scores.softmax(Some(&[-1]), true)?;
    let out = qmm(&scores, &v, false)?;
    if n_repeats > 1 {
        out.reshape(&[b, n_q_heads, l, d])
    } else {
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_array::random;

    fn close(a: &Array, b: &Array) -> bool {
        a.allclose(b, 1e-5, 1e-6, false)
            .unwrap()
            .item::<bool>()
            .unwrap()
    }

    /// Where `MLX_SDPA_BUCKET` is unset, the process's default decides (the server sets
    /// 256); 0 turns it off again.
    #[test]
    fn the_bucket_default_applies_where_the_variable_is_unset() {
        if std::env::var_os("MLX_SDPA_BUCKET").is_some() {
            return;
        }
        assert_eq!(bucket_setting(), None);
        set_bucket_default(256);
        assert_eq!(bucket_setting(), Some(256));
        set_bucket_default(0);
        assert_eq!(bucket_setting(), None);
    }

    /// A prompt's attention padded to a bucket of positions (`MLX_SDPA_BUCKET`'s path, run
    /// here on the CPU in float32): under the causal mask, with and without keys before the
    /// queries, and under a batch's boolean and additive masks of left-padded rows, the
    /// real queries' rows equal the unpadded attention's.
    #[test]
    fn bucketed_queries_match_the_unpadded_attention() {
        random::seed(5).unwrap();
        let (b, hq, hkv, d) = (2, 4, 2, 32);
        let normal =
            |shape: &[i32]| random::normal(shape, Dtype::Float32, None, None, None).unwrap();
        for (l, offset) in [(7, 0), (13, 5), (2, 30), (8, 3), (5, 11)] {
            let kl = l + offset;
            let q = normal(&[b, hq, l, d]);
            let (k, v) = (normal(&[b, hkv, kl, d]), normal(&[b, hkv, kl, d]));
            // `seeing`: the rows that see a key (a left-padded row's queries inside its
            // padding see none: what they give is nobody's, padded or not).
            let run = |mask: &AttnMask, seeing: Option<&Array>| {
                let m = match mask {
                    AttnMask::Causal => SdpaMask::Causal,
                    AttnMask::Array(a) => SdpaMask::Array(a),
                    _ => unreachable!(),
                };
                let want = fast::scaled_dot_product_attention(&q, &k, &v, 0.2, m, None).unwrap();
                let got = padded_to_bucket(8, false, &q, &k, &v, 0.2, mask, None)
                    .unwrap()
                    .expect("the bucket applies");
                assert_eq!(got.shape(), want.shape());
                let only = |a: &Array| match seeing {
                    Some(rows) => ops::where_(rows, a, &Array::scalar(0f32).unwrap()).unwrap(),
                    None => a.clone(),
                };
                assert!(close(&only(&got), &only(&want)), "l {l} offset {offset}");
            };
            run(&AttnMask::Causal, None);
            // mlx-lm's mask for left-padded rows: row r padded by 2 r positions.
            let rows = ops::arange(offset as f64, kl as f64, 1.0, Dtype::Int32)
                .unwrap()
                .reshape(&[1, 1, l, 1])
                .unwrap();
            let cols = ops::arange(0.0, kl as f64, 1.0, Dtype::Int32)
                .unwrap()
                .reshape(&[1, 1, 1, kl])
                .unwrap();
            let pads = Array::from_slice(&[0i32, 2], &[b, 1, 1, 1]).unwrap();
            let seen = cols
                .less_equal(&rows)
                .unwrap()
                .logical_and(&cols.greater_equal(&pads).unwrap())
                .unwrap();
            let seeing = seen.any(Some(&[-1]), true).unwrap();
            run(&AttnMask::Array(seen.clone()), Some(&seeing));
            let additive = ops::where_(
                &seen,
                &Array::scalar(0f32).unwrap(),
                &Array::scalar(f32::MIN).unwrap(),
            )
            .unwrap();
            run(&AttnMask::Array(additive), Some(&seeing));
        }
        // A causal mask past MAX_BUCKET_MASK elements: the path declines.
        let (q1, k1) = (normal(&[1, 1, 64, 1]), normal(&[1, 1, 300_000, 1]));
        assert!(
            padded_to_bucket(256, false, &q1, &k1, &k1, 1.0, &AttnMask::Causal, None)
                .unwrap()
                .is_none()
        );
        // Already a multiple, or one query: the path declines.
        let q = normal(&[1, 4, 8, 32]);
        let k = normal(&[1, 2, 8, 32]);
        assert!(
            padded_to_bucket(8, false, &q, &k, &k, 0.2, &AttnMask::Causal, None)
                .unwrap()
                .is_none()
        );
    }

    /// A decoding step of left-padded rows on the CPU: the padded-rows kernel declines and
    /// attention is MLX's masked one, bit for bit (bfloat16, grouped heads, the keys a
    /// view of a longer buffer, as the batch cache hands them out).
    #[test]
    fn left_padded_rows_on_the_cpu_attend_under_the_mask() {
        random::seed(11).unwrap();
        let (b, hq, hkv, l, d) = (3, 8, 2, 9, 64);
        let bf = |shape: &[i32]| {
            random::normal(shape, Dtype::Float32, None, None, None)
                .unwrap()
                .astype(Dtype::Bfloat16)
                .unwrap()
        };
        let q = bf(&[b, hq, 1, d]);
        let kbuf = bf(&[b, hkv, l + 5, d]);
        let vbuf = bf(&[b, hkv, l + 5, d]);
        let keys = kbuf.slice_axis(2, 0, l).unwrap();
        let values = vbuf.slice_axis(2, 0, l).unwrap();
        let pads = [0i32, 4, 8];
        let ki = ops::arange(0.0, l as f64, 1.0, Dtype::Int32).unwrap();
        let lp = Array::from_slice(&pads, &[b, 1, 1, 1]).unwrap();
        let mask = ki.greater_equal(&lp).unwrap();
        let fetch = KvFetch::Plain { keys, values };
        let padded = AttnMask::LeftPadded {
            mask: mask.clone(),
            left_padding: Array::from_slice(&pads, &[b]).unwrap(),
        };
        let got = scaled_dot_product_attention(&q, &fetch, 0.125, &padded, None).unwrap();
        let want =
            scaled_dot_product_attention(&q, &fetch, 0.125, &AttnMask::Array(mask), None).unwrap();
        assert_eq!(got.shape(), vec![b, hq, 1, d]);
        let eq = got
            .array_equal(&want, false)
            .unwrap()
            .item::<bool>()
            .unwrap();
        assert!(
            eq,
            "left-padded attention differs from the masked one on the CPU"
        );
        assert_eq!(fast::sdpa_padded_launches(), 0);
    }

    /// The split (forced, on the CPU) computes the same attention as one fused call, for
    /// a causal mask over a longer cache, no mask, and a batched padding mask.
    #[test]
    fn split_queries_match_the_fused_attention() {
        random::seed(7).unwrap();
        let (b, h, l, kl, d) = (2, 4, 6, 11, 16);
        let q = random::normal(&[b, h, l, d], Dtype::Float32, None, None, None).unwrap();
        let k = random::normal(&[b, h, kl, d], Dtype::Float32, None, None, None).unwrap();
        let v = random::normal(&[b, h, kl, d], Dtype::Float32, None, None, None).unwrap();
        // Row 0 pads its first 3 keys; both rows causal over the last `l` positions.
        let qi = ops::arange((kl - l) as f64, kl as f64, 1.0, Dtype::Int32).unwrap();
        let ki = ops::arange(0.0, kl as f64, 1.0, Dtype::Int32).unwrap();
        let causal = qi
            .expand_dims(&[1])
            .unwrap()
            .greater_equal(&ki.expand_dims(&[0]).unwrap())
            .unwrap();
        let pad = Array::from_slice(&[3i32, 0], &[b, 1, 1, 1]).unwrap();
        let mask = causal
            .logical_and(&ki.greater_equal(&pad).unwrap())
            .unwrap();
        for m in [AttnMask::Causal, AttnMask::None, AttnMask::Array(mask)] {
            let fused = match &m {
                AttnMask::None => {
                    fast::scaled_dot_product_attention(&q, &k, &v, 0.25, SdpaMask::None, None)
                }
                AttnMask::Causal => {
                    fast::scaled_dot_product_attention(&q, &k, &v, 0.25, SdpaMask::Causal, None)
                }
                AttnMask::Array(a) | AttnMask::LeftPadded { mask: a, .. } => {
                    fast::scaled_dot_product_attention(&q, &k, &v, 0.25, SdpaMask::Array(a), None)
                }
            }
            .unwrap();
            let split = split_small_queries_as(SplitQueries::Force, &q, &k, &v, 0.25, &m, None)
                .unwrap()
                .expect("the split applies");
            assert_eq!(split.shape(), fused.shape());
            assert!(close(&split, &fused));
        }
        // One query, or the split off: not taken.
        let q1 = q.slice_axis(2, 0, 1).unwrap();
        assert!(split_small_queries_as(
            SplitQueries::Force,
            &q1,
            &k,
            &v,
            0.25,
            &AttnMask::None,
            None
        )
        .unwrap()
        .is_none());
        assert!(
            split_small_queries_as(SplitQueries::Off, &q, &k, &v, 0.25, &AttnMask::None, None)
                .unwrap()
                .is_none()
        );
    }
}
