//! RecurrentGemma (`recurrent_gemma`, Griffin), following
//! `mlx_lm/models/recurrent_gemma.py`: embeddings times `sqrt(hidden_size)` (by
//! `embeddings_scale_by_sqrt_dim`); residual blocks of `1 + weight` RMS norms (epsilon
//! 1e-5; the final one `rms_norm_eps`), each a temporal block, by `block_types` (or
//! `_block_types`) cycled over the layers, then a `gelu_approx(gate) * up` MLP with
//! biases. A recurrent block is `linear_out(rg_lru(conv_1d(linear_x(x))) *
//! gelu_approx(linear_y(x)))`: a depthwise convolution of width 4 (mlx-lm's default; the
//! config's `conv1d_width` is not read) with a bias, then the Real-Gated Linear
//! Recurrent Unit (block-diagonal input and recurrence gates per head, `a = exp(-8 *
//! gate_a * softplus(recurrent_param))`, the input scaled by `sqrt(1 - a^2)` except at
//! the first position of a fresh state) scanned one position at a time, over an
//! `ArraysCache(2)`. An attention block is local attention with one key-value head, half
//! the head rotated by `nn.RoPE` (base 10000; `rope_theta` is not read) and a biased
//! `o_proj`, over a `RotatingKVCache(attention_window_size)` with the windowed mask.
//! The logits are `tanh(logits / logits_soft_cap) * logits_soft_cap` where the cap is
//! set; the head is `lm_head` where the checkpoint has one, else the embedding. Like
//! mlx-lm's, the recurrent blocks take no padding mask, so prompts of a batch must not be
//! padded.
use super::attention::{Attention, AttentionDims};
use super::config_error;
use super::gemma2::RmsNorm;
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::recurrent::{recurrent_state, DepthwiseConv};
use super::{batch_len, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result, Scalar};
use mlx_nn::activations::{gelu_approx, softplus};
use mlx_nn::cache::ArraysState;
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, Param, Rope};
use serde::Deserialize;
use serde_json::Value;

/// mlx-lm's `RecurrentBlock` default temporal convolution width (the one it builds).
const CONV_WIDTH: i32 = 4;

fn default_true() -> bool {
    true
}

/// config.json keys read by RecurrentGemma.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub attention_bias: bool,
    pub conv1d_width: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    /// Required, but may be null or zero (no soft cap).
    #[serde(deserialize_with = "Option::deserialize")]
    pub logits_soft_cap: Option<f64>,
    pub num_attention_heads: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub attention_window_size: i32,
    pub vocab_size: i32,
    #[serde(default = "default_true")]
    pub embeddings_scale_by_sqrt_dim: bool,
    #[serde(default)]
    pub block_types: Option<Vec<String>>,
    #[serde(default, rename = "_block_types")]
    pub block_types_alt: Option<Vec<String>>,
}

/// `RGLRU`.
#[derive(Debug)]
struct RgLru {
    recurrent_param: Param,
    input_gate_weight: Param,
    input_gate_bias: Param,
    recurrent_gate_weight: Param,
    recurrent_gate_bias: Param,
    heads: i32,
    head_dim: i32,
}
impl_module!(RgLru {
    recurrent_param,
    input_gate_weight,
    input_gate_bias,
    recurrent_gate_weight,
    recurrent_gate_bias
});

impl RgLru {
    /// `apply_block_linear`: per head `x_h @ w_h + b_h`, then the sigmoid.
    fn block_linear(&self, x: &Array, w: &Array, b: &Array) -> Result<Array> {
        let (bs, l) = batch_len(x)?;
        x.reshape(&[bs, l, self.heads, self.head_dim])?
            .swapaxes(1, 2)?
            .matmul(w)?
            .swapaxes(1, 2)?
            .add(b)?
            .flatten(2, 3)?
            .sigmoid()
    }

    fn forward(&self, x: &Array, h0: Option<&Array>) -> Result<(Array, Array)> {
        let (bs, l) = batch_len(x)?;
        let gate_x = self.block_linear(x, &self.input_gate_weight, &self.input_gate_bias)?;
        let gate_a =
            self.block_linear(x, &self.recurrent_gate_weight, &self.recurrent_gate_bias)?;
        let log_a = gate_a
            .multiply(-8.0)?
            .multiply(&softplus(&self.recurrent_param)?)?;
        let a = log_a.exp()?;
        let a_square = log_a.multiply(2.0)?.exp()?;
        let gated_x = x.multiply(&gate_x)?;
        let one = Array::weak_scalar(Scalar::Float(1.0), a_square.dtype())?;
        let mut multiplier = one.subtract(&a_square)?.sqrt()?;
        if h0.is_none() {
            // `multiplier[:, 0, :] = 1.0`
            let w = multiplier.dim(-1)?;
            let first = ops::ones(&[bs, 1, w], multiplier.dtype())?;
            let rest = multiplier.slice_axis(1, 1, l)?;
            multiplier = ops::concatenate(&[&first, &rest], 1)?;
        }
        let normalized = gated_x.multiply(&multiplier.astype(x.dtype())?)?;
        rnn_scan(&normalized, &a, h0)
    }
}

/// `rnn_scan`: `h_t = a_t * h_{t-1} + x_t` (from zeros without `h0`), all positions
/// and the last state.
fn rnn_scan(x: &Array, a: &Array, h0: Option<&Array>) -> Result<(Array, Array)> {
    let (bs, l) = batch_len(x)?;
    if l == 1 {
        return match h0 {
            None => Ok((x.clone(), x.slice_axis(1, 0, 1)?.squeeze(Some(&[1]))?)),
            Some(h) => {
                let y = a.multiply(&h.expand_dims(&[1])?)?.add(x)?;
                let last = y.slice_axis(1, 0, 1)?.squeeze(Some(&[1]))?;
                Ok((y, last))
            }
        };
    }
    let mut h = match h0 {
        Some(h) => h.clone(),
        None => ops::zeros(&[bs, x.dim(-1)?], x.dtype())?,
    };
    let mut ys = Vec::with_capacity(l.max(0) as usize);
    for t in 0..l {
        let at = a.slice_axis(1, t, t + 1)?.squeeze(Some(&[1]))?;
        let xt = x.slice_axis(1, t, t + 1)?.squeeze(Some(&[1]))?;
        h = at.multiply(&h)?.add(&xt)?;
        ys.push(h.clone());
    }
    // `y = zeros_like(x); y[:, t] = h_t`: the states in x's dtype.
    let y = ops::stack(&ys.iter().collect::<Vec<_>>(), 1)?.astype(x.dtype())?;
    Ok((y, h))
}

/// `RecurrentBlock`.
#[derive(Debug)]
struct RecurrentBlock {
    linear_y: LinearLayer,
    linear_x: LinearLayer,
    linear_out: LinearLayer,
    conv_1d: DepthwiseConv,
    rg_lru: RgLru,
}
impl_module!(RecurrentBlock {
    linear_y,
    linear_x,
    linear_out,
    conv_1d,
    rg_lru
});

impl RecurrentBlock {
    fn new(width: i32, heads: i32) -> crate::Result<RecurrentBlock> {
        let hd = width / heads;
        let z = |s: &[i32]| -> crate::Result<Param> { Ok(Param::new(ops::zeros(s, Dtype::Float32)?)) };
        Ok(RecurrentBlock {
            linear_y: LinearLayer::new(width, width, true)?,
            linear_x: LinearLayer::new(width, width, true)?,
            linear_out: LinearLayer::new(width, width, true)?,
            conv_1d: DepthwiseConv::zeros(width, CONV_WIDTH, true)?,
            rg_lru: RgLru {
                recurrent_param: z(&[width])?,
                input_gate_weight: z(&[heads, hd, hd])?,
                input_gate_bias: z(&[heads, hd])?,
                recurrent_gate_weight: z(&[heads, hd, hd])?,
                recurrent_gate_bias: z(&[heads, hd])?,
                heads,
                head_dim: hd,
            },
        })
    }

    fn forward(&self, x: &Array, cache: Option<&mut ArraysState>) -> Result<Array> {
        let y = gelu_approx(&self.linear_y.forward(x)?)?;
        let x = self.linear_x.forward(x)?;
        // Conv1d: over the cached window, else after K - 1 zeros.
        let conv_state = cache.as_deref().and_then(|c| c.get(0)).cloned();
        let (conv, window) = self.conv_1d.causal(&x, conv_state.as_ref())?;
        let h0 = cache.as_deref().and_then(|c| c.get(1)).cloned();
        let (x, last) = self.rg_lru.forward(&conv, h0.as_ref())?;
        if let Some(c) = cache {
            c.set(0, window)?;
            c.set(1, last)?;
        }
        self.linear_out.forward(&x.multiply(&y)?)
    }
}

/// A residual block's temporal block.
#[derive(Debug)]
enum Temporal {
    Recurrent(Box<RecurrentBlock>),
    Attention(Box<Attention>),
}
enum_module!(Temporal {
    Recurrent => "",
    Attention => "",
});

/// `ResidualBlock`.
#[derive(Debug)]
struct ResidualBlock {
    temporal_pre_norm: RmsNorm,
    temporal_block: Temporal,
    channel_pre_norm: RmsNorm,
    mlp_block: Mlp,
}
impl_module!(ResidualBlock {
    temporal_pre_norm,
    temporal_block,
    channel_pre_norm,
    mlp_block
});

impl ResidualBlock {
    fn is_recurrent(&self) -> bool {
        matches!(self.temporal_block, Temporal::Recurrent(_))
    }
}

/// `Griffin`.
#[derive(Debug)]
struct Griffin {
    embed_tokens: EmbeddingLayer,
    layers: Vec<ResidualBlock>,
    final_norm: RmsNorm,
}
impl_module!(Griffin {
    embed_tokens,
    layers,
    final_norm
});

/// RecurrentGemma with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Griffin,
    lm_head: Option<LinearLayer>,
}

impl Module for Model {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.model.visit_params(&join(prefix, "model"), f);
        self.lm_head.visit_params(&join(prefix, "lm_head"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.model.visit_params_mut(&join(prefix, "model"), f);
        self.lm_head.visit_params_mut(&join(prefix, "lm_head"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.model.visit_quantizable_mut(&join(prefix, "model"), f)?;
        self.lm_head.visit_quantizable_mut(&join(prefix, "lm_head"), f)
    }
}

impl Model {
    /// Builds the model (zero placeholders) from config.json; the head is there until
    /// `sanitize` finds the checkpoint has none.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |m: String| config_error("recurrent_gemma", m);
        let types = args
            .block_types
            .clone()
            .or_else(|| args.block_types_alt.clone())
            .ok_or_else(|| err("key `block_types` (or `_block_types`) is required".into()))?;
        if types.is_empty() {
            return Err(err("key `block_types` must not be empty".into()));
        }
        if !types.iter().any(|t| t == "attention") {
            return Err(err("key `block_types`: no \"attention\" block".into()));
        }
        let (width, heads) = (args.hidden_size, args.num_attention_heads);
        if heads <= 0 || width % heads != 0 || (width / heads) % 4 != 0 {
            return Err(err(format!(
                "`num_attention_heads` ({heads}) must divide `hidden_size` ({width}) into \
                 heads of a multiple of 4 features"
            )));
        }
        if args.attention_window_size <= 0 {
            return Err(err(format!(
                "key `attention_window_size` ({}) must be positive",
                args.attention_window_size
            )));
        }
        if args.num_hidden_layers < 0 {
            return Err(err("key `num_hidden_layers` must not be negative".into()));
        }
        let head_dim = width / heads;
        let layers = (0..args.num_hidden_layers as usize)
            .map(|i| {
                let temporal = if types[i % types.len()] == "recurrent" {
                    Temporal::Recurrent(Box::new(RecurrentBlock::new(width, heads)?))
                } else {
                    let d = AttentionDims {
                        dim: width,
                        n_heads: heads,
                        n_kv_heads: 1,
                        head_dim,
                        qkv_bias: false,
                        o_bias: true,
                    };
                    let rope = Rope::new(head_dim / 2, false, 10000.0, 1.0);
                    Temporal::Attention(Box::new(Attention::new(
                        d,
                        rope,
                        f64::from(head_dim).powf(-0.5),
                    )?))
                };
                Ok(ResidualBlock {
                    temporal_pre_norm: RmsNorm::new(width, 1e-5)?,
                    temporal_block: temporal,
                    channel_pre_norm: RmsNorm::new(width, 1e-5)?,
                    mlp_block: Mlp::new(width, args.intermediate_size / 2, true)?
                        .with_activation(gelu_approx),
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Griffin {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, width)?,
            layers,
            final_norm: RmsNorm::new(width, args.rms_norm_eps)?,
        };
        let lm_head = Some(LinearLayer::new(width, args.vocab_size, false)?);
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }

    fn swa_idx(&self) -> usize {
        self.model
            .layers
            .iter()
            .position(|l| !l.is_recurrent())
            .unwrap_or(0)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "recurrent_gemma")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut x = m.embed_tokens.forward(tokens)?;
        if self.args.embeddings_scale_by_sqrt_dim {
            x = x.multiply(f64::from(x.dim(-1)?).sqrt())?;
        }
        let n = x.dim(1)?;
        let mask = mlx_nn::cache::create_attention_mask(
            n,
            super::cache_at(caches, self.swa_idx()),
            Some(self.args.attention_window_size),
            false,
        )?;
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let forward = move |layer: &ResidualBlock,
                                x: &Array,
                                mask: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                let normed = layer.temporal_pre_norm.forward(x)?;
                let t = match &layer.temporal_block {
                    Temporal::Recurrent(r) => {
                        r.forward(&normed, recurrent_state(cache, i, "recurrent")?)?
                    }
                    Temporal::Attention(at) => {
                        at.forward(&normed, mask, cache, None, Default::default())?
                    }
                };
                let residual = t.add(x)?;
                let h = layer
                    .mlp_block
                    .forward(&layer.channel_pre_norm.forward(&residual)?, None)?;
                h.add(&residual)
            };
            x = mlx_nn::checkpoint::layer(layer, &x, &mask, cache, forward)?;
        }
        let out = m.final_norm.forward(&x)?;
        let scale = match self.args.logits_soft_cap {
            Some(c) if c != 0.0 => LogitScale::SoftCap(c),
            _ => LogitScale::None,
        };
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, scale)
    }

    /// `make_cache`: an `ArraysCache(2)` per recurrent block, a
    /// `RotatingKVCache(attention_window_size)` per attention block.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model
            .layers
            .iter()
            .map(|l| {
                if l.is_recurrent() {
                    CacheSpec::Arrays { size: 2 }
                } else {
                    CacheSpec::Rotating {
                        max_size: self.args.attention_window_size,
                        keep: 0,
                    }
                }
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The recurrent blocks take no padding mask (as mlx-lm's).
    fn padded_prefill_is_exact(&self) -> bool {
        false
    }

    decoder_accessors!();
}

impl Architecture for Model {
    /// Moves HF's `[C, 1, K]` convolution weights to MLX's layout; without
    /// `lm_head.weight` in the checkpoint the head is dropped (the embedding serves).
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let weights = weights
            .into_iter()
            .map(|(k, v)| {
                let v = if k.contains("conv_1d.weight") && v.dim(-1)? != 1 {
                    v.moveaxis(2, 1)?
                } else {
                    v
                };
                Ok((k, v))
            })
            .collect::<crate::Result<Weights>>()?;
        if !weights.contains_key("lm_head.weight") {
            self.lm_head = None;
        }
        Ok(weights)
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            if let Temporal::Attention(at) = &mut layer.temporal_block {
                at.fuse()?;
            }
            layer.mlp_block.fuse()?;
        }
        Ok(())
    }
}
