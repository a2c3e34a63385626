//! `mlx_lm.awq`: activation-aware weight quantization (Lin et al., 2023) as mlx-lm 0.32
//! does it.
//!
//! The embedding is quantized at the embedding setting and embeds the calibration rows.
//! Then, block by block: the block runs on its input (32 rows at a time) while every
//! projection's input is recorded (mlx-lm's `Catcher`, here [`mlx_nn::tap`]); a plain
//! quantization of the block gives the reference loss. For q/k/v (scaled through
//! `input_layernorm`), `down_proj` (through `up_proj`) and gate/up (through the norm
//! before the feed-forward) a grid of per-channel scales `mean|x| ^ (i / n_grid)` is
//! tried, each quantizing the scaled weights and measuring the sub-block's output error;
//! the best is folded into the previous operation. Each projection but q and k then gets
//! the per-group clipping of its weights that best keeps its output on a subsample of its
//! inputs. The block is quantized; if its loss is above the reference, the original
//! weights are quantized instead. The next block's input is this block's unquantized
//! output. The head (untied) is quantized at the embedding setting, and every leaf module
//! gets an entry in the config's `quantization` section as mlx-lm's `update_config` writes.
//!
//! Same operations in the same order as mlx-lm (Python scalars as MLX's weak scalars), so
//! the same calibration rows give the same weights bit for bit (`bins/tests/awq.rs`
//! against `mlx_lm.awq`). mlx-lm covers Llama / Mistral / Ministral 3 / Mistral 3 / Qwen2
//! / Qwen3 with one configuration and Gemma 3 with another (gate/up scaled through
//! `pre_feedforward_layernorm`, norms of `1 + weight`), both here; its DeepSeek-V2 one is
//! not ported ([`SUPPORTED`]).
use crate::dynamic::qdq;
use crate::error::{QuantError, Result};
use crate::model::{layer_specs, set_quantization, LoadedModel};
use mlx_array::quant::QuantMode;
use mlx_array::{ops, transforms, Array, Dtype, Scalar};
use mlx_models::awq::{AwqBlock, AwqParts};
use mlx_nn::{AttnMask, LinearLayer, Module, Param, QuantSpec, Quantizable};
use serde_json::{Map, Value};

/// The model types mlx-lm's AWQ configures with its Llama and Gemma 3 configurations
/// (`llava` is not an architecture here; `deepseek_v2`'s configuration is not ported).
pub const SUPPORTED: &[&str] = &[
    "llama",
    "mistral",
    "ministral3",
    "mistral3",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "gemma3",
];

/// AWQ's settings (`mlx_lm.awq`'s flags and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AwqOptions {
    /// Bits of the block projections (`--bits`).
    pub bits: i32,
    /// Group size of the block projections (`--group-size`).
    pub group_size: i32,
    /// Bits of the embedding and the head (`--embed-bits`).
    pub embed_bits: i32,
    /// Group size of the embedding and the head (`--embed-group-size`).
    pub embed_group_size: i32,
    /// Points of the scale and clipping searches (`--n-grid`).
    pub n_grid: usize,
}

impl Default for AwqOptions {
    fn default() -> Self {
        AwqOptions {
            bits: 4,
            group_size: 64,
            embed_bits: 4,
            embed_group_size: 32,
            n_grid: 20,
        }
    }
}

impl AwqOptions {
    /// Checks the settings (MLX's affine quantization takes 2 to 8 bits and group sizes
    /// of 32, 64 or 128).
    pub fn validate(&self) -> Result<()> {
        for (flag, bits) in [("--bits", self.bits), ("--embed-bits", self.embed_bits)] {
            if !(2..=8).contains(&bits) {
                return Err(QuantError::Options(format!(
                    "{flag} must be 2 to 8 bits, not {bits}"
                )));
            }
        }
        for (flag, gs) in [
            ("--group-size", self.group_size),
            ("--embed-group-size", self.embed_group_size),
        ] {
            if ![32, 64, 128].contains(&gs) {
                return Err(QuantError::Options(format!(
                    "{flag} must be 32, 64 or 128, not {gs}"
                )));
            }
        }
        if self.n_grid == 0 {
            return Err(QuantError::Options("--n-grid must be at least 1".into()));
        }
        Ok(())
    }
}

/// Reports progress: (block index, number of blocks, the block's loss ratio after /
/// before, whether it fell back to the plain quantization).
pub type AwqProgress<'a> = dyn FnMut(usize, usize, f32, bool) + 'a;

/// The block's projections in AWQ's order of reference: q, k, v, o, gate, up, down.
const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const O: usize = 3;
const GATE: usize = 4;
const UP: usize = 5;
const DOWN: usize = 6;

/// mlx-lm's `run_layer` batch size.
const BATCH: i32 = 32;

/// A Python float next to `like` (MLX's weak scalar).
fn weak(v: f64, like: &Array) -> Result<Array> {
    Ok(Array::weak_scalar(Scalar::Float(v), like.dtype())?)
}

/// A Python int next to `like`.
fn weak_int(v: i64, like: &Array) -> Result<Array> {
    Ok(Array::weak_scalar(Scalar::Int(v), like.dtype())?)
}

/// `mse(x, y)`: `((x - y).astype(float32)) ** 2`.
fn mse(x: &Array, y: &Array) -> Result<Array> {
    let d = x.subtract(y)?.astype(Dtype::Float32)?;
    Ok(d.power(&weak_int(2, &d)?)?)
}

/// `mse(out, out_q).sum() / out.size`, as a host value.
fn loss(out: &Array, out_q: &Array) -> Result<f32> {
    let l = mse(out, out_q)?.sum(None, false)?;
    let l = l.divide(&weak_int(out.size() as i64, &l)?)?;
    transforms::eval(&[&l])?;
    Ok(l.item::<f32>()?)
}

fn linear<'p>(p: &'p mut AwqParts<'_>, i: usize) -> &'p mut LinearLayer {
    match i {
        Q => &mut *p.q,
        K => &mut *p.k,
        V => &mut *p.v,
        O => &mut *p.o,
        GATE => &mut *p.gate,
        UP => &mut *p.up,
        _ => &mut *p.down,
    }
}

/// A dense projection's weight.
fn weight(l: &LinearLayer) -> Result<Array> {
    match l {
        LinearLayer::Dense(d) => Ok(d.weight.value().clone()),
        _ => Err(QuantError::Unsupported(
            "AWQ needs a dense model (dequantize it first with mlx-convert -d)".into(),
        )),
    }
}

fn set_weight(l: &mut LinearLayer, w: Array) {
    if let LinearLayer::Dense(d) = l {
        d.weight.set(w);
    }
}

/// The block's parts, or an error naming what is not Llama-shaped.
fn parts<'a>(block: &'a mut dyn AwqBlock, index: usize) -> Result<AwqParts<'a>> {
    block.parts().ok_or_else(|| {
        QuantError::Unsupported(format!(
            "layer {index} is not shaped as mlx-lm's AWQ configuration expects (separate \
             q/k/v/o projections, a SwiGLU MLP)"
        ))
    })
}

/// A block's projections and norms as they stand (mlx-lm's `orig_leaves` and
/// `orig_params`).
#[derive(Clone)]
struct Snapshot {
    linears: Vec<LinearLayer>,
    norms: [Param; 2],
}

fn snapshot(block: &mut dyn AwqBlock, index: usize) -> Result<Snapshot> {
    let mut p = parts(block, index)?;
    let linears = (0..7).map(|i| linear(&mut p, i).clone()).collect();
    Ok(Snapshot {
        linears,
        norms: [p.input_norm.clone(), p.ff_norm.clone()],
    })
}

fn restore(block: &mut dyn AwqBlock, index: usize, s: &Snapshot) -> Result<()> {
    let mut p = parts(block, index)?;
    for (i, l) in s.linears.iter().enumerate() {
        *linear(&mut p, i) = l.clone();
    }
    *p.input_norm = s.norms[0].clone();
    *p.ff_norm = s.norms[1].clone();
    Ok(())
}

/// `nn.quantize(block, group_size, bits)`: every projection of the block.
fn quantize_block(block: &mut dyn AwqBlock, index: usize, spec: QuantSpec) -> Result<()> {
    let mut p = parts(block, index)?;
    for i in 0..7 {
        linear(&mut p, i).quantize(spec)?;
    }
    Ok(())
}

/// mlx-lm's `run_layer`: `f` over `x`'s rows 32 at a time, each batch evaluated.
fn run_layer(x: &Array, mut f: impl FnMut(&Array) -> mlx_array::Result<Array>) -> Result<Array> {
    let n = x.dim(0)?;
    let mut ys = Vec::new();
    for start in (0..n).step_by(BATCH as usize) {
        ys.push(f(&x.slice_axis(0, start, (start + BATCH).min(n))?)?);
        let refs: Vec<&Array> = ys.iter().collect();
        transforms::eval(&refs)?;
    }
    let refs: Vec<&Array> = ys.iter().collect();
    Ok(ops::concatenate(&refs, 0)?)
}

/// The block's output on `x` (32 rows at a time) and each projection's inputs over all
/// rows, in [`Q`]..[`DOWN`] order.
fn capture(
    block: &mut dyn AwqBlock,
    index: usize,
    x: &Array,
    mask: &AttnMask,
) -> Result<(Array, Vec<Array>)> {
    let ids: Vec<u64> = {
        let mut p = parts(block, index)?;
        let mut ids = Vec::new();
        for i in 0..7 {
            match linear(&mut p, i) {
                LinearLayer::Dense(d) => ids.push(d.weight.id()),
                _ => {
                    return Err(QuantError::Unsupported(format!(
                        "layer {index}: AWQ needs dense projections (dequantize the model \
                         first with mlx-convert -d)"
                    )))
                }
            }
        }
        ids
    };
    let mut feats: Vec<Vec<Array>> = vec![Vec::new(); 7];
    let out = run_layer(x, |xb| {
        let (y, seen) = mlx_nn::tap::record_inputs(|| block.forward_block(xb, mask));
        for (id, input) in seen {
            if let Some(i) = ids.iter().position(|&w| w == id) {
                feats[i].push(input);
            }
        }
        y
    })?;
    let mut inputs = Vec::with_capacity(7);
    for (i, f) in feats.iter().enumerate() {
        if f.is_empty() {
            return Err(QuantError::Unsupported(format!(
                "layer {index}: projection {i} received no input during calibration"
            )));
        }
        let refs: Vec<&Array> = f.iter().collect();
        inputs.push(ops::concatenate(&refs, 0)?);
    }
    Ok((out, inputs))
}

/// The sub-block a scale configuration searches with.
#[derive(Clone, Copy)]
enum Scope {
    /// `self_attn` over q/k/v, scaled through `input_layernorm`.
    Attention,
    /// `down_proj` alone, scaled through `up_proj`.
    Down,
    /// `mlp` over gate/up, scaled through `post_attention_layernorm`.
    Mlp,
}

impl Scope {
    fn layers(self) -> &'static [usize] {
        match self {
            Scope::Attention => &[Q, K, V],
            Scope::Down => &[DOWN],
            Scope::Mlp => &[GATE, UP],
        }
    }
}

fn run_scope(
    block: &mut dyn AwqBlock,
    index: usize,
    scope: Scope,
    x: &Array,
    mask: &AttnMask,
) -> mlx_array::Result<Array> {
    match scope {
        Scope::Attention => block.attention(x, mask),
        Scope::Mlp => block.feed_forward(x),
        Scope::Down => match block.parts() {
            Some(p) => p.down.forward(x),
            None => Err(mlx_array::Error::InvalidArgument(format!(
                "layer {index} has no down_proj"
            ))),
        },
    }
}

/// mlx-lm's `search_best_scale`: the per-channel scales of the grid whose quantized
/// weights keep the sub-block's output closest.
fn search_best_scale(
    block: &mut dyn AwqBlock,
    index: usize,
    scope: Scope,
    x: &Array,
    mask: &AttnMask,
    opts: &AwqOptions,
) -> Result<Array> {
    let out = run_scope(block, index, scope, x, mask)?;
    let x_max = x.abs()?.mean(Some(&[0, 1]), false)?;
    let layers = scope.layers();
    let originals: Vec<Array> = {
        let mut p = parts(block, index)?;
        layers
            .iter()
            .map(|&i| weight(linear(&mut p, i)))
            .collect::<Result<_>>()?
    };
    let mut best_error = f64::INFINITY;
    let mut best: Option<Array> = None;
    for r in 0..opts.n_grid {
        let ratio = r as f64 / opts.n_grid as f64;
        let s = x_max.power(&weak(ratio, &x_max)?)?;
        let s = s.maximum(&weak(1e-4, &s)?)?.reshape(&[-1])?;
        let norm = s.max(None, false)?.multiply(&s.min(None, false)?)?.sqrt()?;
        let s = s.divide(&norm)?;
        {
            let mut p = parts(block, index)?;
            for (&i, w) in layers.iter().zip(&originals) {
                set_weight(
                    linear(&mut p, i),
                    qdq(&w.multiply(&s)?, opts.bits, opts.group_size)?.divide(&s)?,
                );
            }
        }
        let out_q = run_layer(x, |xb| run_scope(block, index, scope, xb, mask))?;
        let l = f64::from(loss(&out, &out_q)?);
        if l < best_error {
            best_error = l;
            best = Some(s);
        }
        let mut p = parts(block, index)?;
        for (&i, w) in layers.iter().zip(&originals) {
            set_weight(linear(&mut p, i), w.clone());
        }
    }
    let best = best.ok_or_else(|| {
        QuantError::Unsupported(format!(
            "layer {index}: no scale of the search gave a finite loss (the model's \
             activations or weights hold NaN or infinity)"
        ))
    })?;
    let best = best.reshape(&[-1])?;
    transforms::eval(&[&best])?;
    Ok(best)
}

/// mlx-lm's `apply_scale`: the scales folded into the previous operation and the
/// layers, and the layers' recorded inputs divided by them.
fn apply_scale(
    block: &mut dyn AwqBlock,
    index: usize,
    scope: Scope,
    s: &Array,
    feats: &mut [Array],
) -> Result<()> {
    let mut p = parts(block, index)?;
    match scope {
        Scope::Attention | Scope::Mlp => {
            let offset = p.norm_offset;
            let norm = if matches!(scope, Scope::Attention) {
                &mut *p.input_norm
            } else {
                &mut *p.ff_norm
            };
            let w = norm.value();
            let w = if offset {
                // Gemma's RMSNorm: ((1 + w.astype(float32)) / s - 1).astype(w.dtype).
                let wf = w.astype(Dtype::Float32)?;
                let scaled = weak(1.0, &wf)?.add(&wf)?.divide(s)?;
                scaled.subtract(&weak(1.0, &scaled)?)?.astype(w.dtype())?
            } else {
                w.divide(s)?
            };
            norm.set(w);
        }
        Scope::Down => {
            let LinearLayer::Dense(up) = &mut *p.up else {
                return Err(QuantError::Unsupported("a quantized up_proj".into()));
            };
            let w = up.weight.value().divide(&s.expand_dims(&[1])?)?;
            up.weight.set(w);
            if let Some(b) = up.bias.as_mut() {
                let v = b.value().divide(s)?;
                b.set(v);
            }
        }
    }
    for &i in scope.layers() {
        let l = linear(&mut p, i);
        let w = weight(l)?.multiply(s)?;
        set_weight(l, w);
        feats[i] = feats[i].divide(s)?;
    }
    Ok(())
}

/// mlx-lm's `search_best_clip` (`max_shrink` 0.5, 64 output rows at a time, at most 512
/// input rows): the weight clipped per group where that keeps the product closest.
fn search_best_clip(feat: &Array, w: &Array, opts: &AwqOptions) -> Result<Array> {
    let gs = opts.group_size;
    let x = feat.flatten(0, 1)?;
    let rows = x.dim(0)?;
    let dims = x.dim(1)?;
    let stride = (rows + 511) / 512;
    let x = x.slice(&[0, 0], &[rows, dims], Some(&[stride, 1]))?;
    let x = x.reshape(&[x.dim(0)?, -1, gs])?;
    let w_shape = w.shape();
    let w_all = w.flatten(0, w.ndim() as i32 - 2)?;
    let out_rows = w_all.dim(0)?;
    let mut maxes = Vec::new();
    let shrink_steps = (0.5 * opts.n_grid as f64) as usize;
    for b in (0..out_rows).step_by(64) {
        let wb = w_all.slice_axis(0, b, (b + 64).min(out_rows))?;
        let wb_shape = wb.shape();
        let groups = wb_shape[1] / gs;
        let mut best_error = ops::full(
            &[wb_shape[0], groups],
            &Array::scalar(f32::INFINITY)?,
            Dtype::Float32,
        )?;
        let mut best_w_max = ops::zeros(&[wb_shape[0], groups, 1], x.dtype())?;
        let wg = wb.reshape(&[wb_shape[0], -1, gs])?;
        let out = ops::einsum("bdg,odg->bod", &[&x, &wg])?;
        let init_max = wg.abs()?.max(Some(&[-1]), true)?;
        for i in 0..shrink_steps {
            let p = 1.0 - i as f64 / opts.n_grid as f64;
            let w_max = weak(p, &init_max)?.multiply(&init_max)?;
            let w_m = wg
                .clip(Some(&w_max.negative()?), Some(&w_max))?
                .reshape(&wb_shape)?;
            // quantize_func
            let w_q = qdq(&w_m, opts.bits, opts.group_size)?;
            let w_q = w_q.reshape(&[wb_shape[0], -1, gs])?;
            let out_q = ops::einsum("bdg,odg->bod", &[&x, &w_q])?;
            let l = mse(&out, &out_q)?.sum(Some(&[0]), false)?;
            let l = l.divide(&weak_int(i64::from(out.dim(0)?), &l)?)?;
            let better = l.less(&best_error)?;
            best_error = ops::where_(&better, &l, &best_error)?;
            best_w_max = ops::where_(&better.expand_dims(&[-1])?, &w_max, &best_w_max)?;
            transforms::eval(&[&best_w_max, &best_error])?;
        }
        maxes.push(best_w_max);
    }
    let refs: Vec<&Array> = maxes.iter().collect();
    let best_w_max = ops::concatenate(&refs, 0)?;
    let w_r = w_all.reshape(&[out_rows, -1, gs])?;
    let best = w_r
        .clip(Some(&best_w_max.negative()?), Some(&best_w_max))?
        .reshape(&w_shape)?;
    transforms::eval(&[&best])?;
    Ok(best)
}

/// AWQ over the model (`awq_quantize`), then the config's `quantization` section
/// (`update_config`).
pub fn awq_quantize(
    model: &mut LoadedModel,
    data: &Array,
    opts: &AwqOptions,
    progress: &mut AwqProgress<'_>,
) -> Result<()> {
    opts.validate()?;
    let model_type = model.model.model_type().to_string();
    if !SUPPORTED.contains(&model_type.as_str()) {
        return Err(QuantError::Unsupported(format!(
            "AWQ support for {model_type} models is not implemented (mlx-lm's AWQ \
             configurations here: {}; mlx-lm also has deepseek_v2, not yet here)",
            SUPPORTED.join(", ")
        )));
    }
    if let Some((path, _)) = layer_specs(model.module_mut()?)?
        .into_iter()
        .find(|(_, s)| s.is_some())
    {
        return Err(QuantError::Unsupported(format!(
            "the model is already quantized (layer `{path}`): AWQ needs a dense model \
             (dequantize it first with mlx-convert -d)"
        )));
    }
    if data.ndim() != 2 {
        return Err(QuantError::Options(format!(
            "calibration data must be [rows, length] token ids, got shape {:?}",
            data.shape()
        )));
    }
    let spec = QuantSpec::new(Some(opts.group_size), Some(opts.bits), QuantMode::Affine);
    let embed_spec = QuantSpec::new(
        Some(opts.embed_group_size),
        Some(opts.embed_bits),
        QuantMode::Affine,
    );
    let awq = model.model.as_awq_mut().ok_or_else(|| {
        QuantError::Unsupported(format!("the {model_type} model gives AWQ no layer access"))
    })?;
    check_group_sizes(awq, opts)?;
    let embed = awq.embed_tokens_mut();
    embed.quantize(embed_spec)?;
    let mut inputs = embed.forward(data)?;
    // create_attention_mask(inputs) on the token ids: "causal" past one position.
    let mask = if data.dim(1)? > 1 {
        AttnMask::Causal
    } else {
        AttnMask::None
    };
    let mut blocks = awq.awq_blocks();
    let total = blocks.len();
    for (index, block) in blocks.iter_mut().enumerate() {
        let block: &mut dyn AwqBlock = &mut **block;
        let (outputs, mut feats) = capture(block, index, &inputs, &mask)?;
        let orig = snapshot(block, index)?;
        quantize_block(block, index, spec)?;
        let outputs_q = run_layer(&inputs, |x| block.forward_block(x, &mask))?;
        let before = loss(&outputs, &outputs_q)?;
        restore(block, index, &orig)?;

        for scope in [Scope::Attention, Scope::Down, Scope::Mlp] {
            let x = feats[scope.layers()[0]].clone();
            let s = search_best_scale(block, index, scope, &x, &mask, opts)?;
            apply_scale(block, index, scope, &s, &mut feats)?;
        }
        {
            let mut p = parts(block, index)?;
            // no_clip: q_proj, k_proj.
            for i in [V, O, GATE, UP, DOWN] {
                let l = linear(&mut p, i);
                let w = search_best_clip(&feats[i], &weight(l)?, opts)?;
                set_weight(l, w);
            }
        }

        quantize_block(block, index, spec)?;
        let outputs_q = run_layer(&inputs, |x| block.forward_block(x, &mask))?;
        let after = loss(&outputs, &outputs_q)?;
        let fell_back = after > before;
        if fell_back {
            restore(block, index, &orig)?;
            quantize_block(block, index, spec)?;
        }
        progress(index + 1, total, after / before, fell_back);
        inputs = outputs;
        let mut params = Vec::new();
        block.visit_params("", &mut |_, p| params.push(p.value().clone()));
        let refs: Vec<&Array> = params.iter().collect();
        transforms::eval(&refs)?;
    }
    drop(blocks);
    if let Some(head) = awq.lm_head_mut() {
        head.quantize(embed_spec)?;
    }
    let specs = layer_specs(model.module_mut()?)?;
    let section = quantization_section(model.module()?, specs)?;
    set_quantization(model, section);
    Ok(())
}

/// Every layer AWQ quantizes has an input size its group size divides (mlx-lm fails
/// inside `mx.quantize` without naming the layer).
fn check_group_sizes(awq: &mut dyn mlx_models::awq::AwqModel, opts: &AwqOptions) -> Result<()> {
    const NAMES: [&str; 7] = [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ];
    let bad = |what: String, dims: i32, gs: i32, flag: &str| {
        QuantError::Options(format!(
            "{what}: input dimension {dims} is not a multiple of the group size {gs} ({flag})"
        ))
    };
    let embed_dims = awq
        .embed_tokens_mut()
        .dense_weight_shape()
        .last()
        .copied()
        .unwrap_or(0);
    if embed_dims % opts.embed_group_size != 0 {
        return Err(bad(
            "embed_tokens".into(),
            embed_dims,
            opts.embed_group_size,
            "--embed-group-size",
        ));
    }
    for (index, block) in awq.awq_blocks().into_iter().enumerate() {
        let mut p = parts(block, index)?;
        for (i, name) in NAMES.iter().enumerate() {
            let dims = linear(&mut p, i)
                .dense_weight_shape()
                .last()
                .copied()
                .unwrap_or(0);
            if dims % opts.group_size != 0 {
                return Err(bad(
                    format!("layer {index} {name}"),
                    dims,
                    opts.group_size,
                    "--group-size",
                ));
            }
        }
    }
    Ok(())
}

/// mlx-lm's `update_config`: `{"group_size": 64, "bits": 4}` (fixed, whatever the
/// flags), then every leaf module of the model in order: a quantized one's group size and
/// bits, `false` for the others (norms, and the parameterless `rope` of each attention
/// block, which mlx-lm's modules hold as a leaf after their other children).
fn quantization_section(
    module: &dyn Module,
    layer_specs: Vec<(String, Option<QuantSpec>)>,
) -> Result<Map<String, Value>> {
    let mut leaves: Vec<String> = Vec::new();
    module.visit_params("", &mut |name, _| {
        let path = name.rsplit_once('.').map_or("", |(p, _)| p).to_string();
        if leaves.last() != Some(&path) {
            leaves.push(path);
        }
    });
    let specs: std::collections::HashMap<String, Option<QuantSpec>> =
        layer_specs.into_iter().collect();
    let mut section = Map::new();
    section.insert("group_size".into(), 64.into());
    section.insert("bits".into(), 4.into());
    let attention_of = |p: &str| -> Option<String> {
        let (parent, _) = p.rsplit_once('.')?;
        parent.ends_with(".self_attn").then(|| parent.to_string())
    };
    for (i, path) in leaves.iter().enumerate() {
        let entry = match specs.get(path) {
            Some(Some(s)) => {
                let mut m = Map::new();
                m.insert("group_size".into(), s.group_size.into());
                m.insert("bits".into(), s.bits.into());
                Value::Object(m)
            }
            _ => Value::Bool(false),
        };
        section.insert(path.clone(), entry);
        // After an attention block's last leaf, its rope.
        if let Some(attn) = attention_of(path) {
            if leaves.get(i + 1).and_then(|n| attention_of(n)) != Some(attn.clone()) {
                section.insert(format!("{attn}.rope"), Value::Bool(false));
            }
        }
    }
    Ok(section)
}
