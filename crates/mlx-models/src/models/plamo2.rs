//! PLaMo 2 (`plamo2`), following `mlx_lm/models/plamo2.py`: layers under
//! `model.layers.layers`, each `h + post_mixer_norm(mixer(pre_mixer_norm(h)))` then
//! `h + post_mlp_norm(mlp(pre_mlp_norm(h)))`, every RMS norm applied as `rms_norm(x,
//! weight + offset)` (1; the post-norms 1/5 and 1/5^1.5); the mixer a Mamba-2 block
//! (`mamba_enabled`; every layer but those where `i % mamba_step == mamba_step / 2`, or
//! all but the last with fewer layers than `mamba_step / 2`) or attention. The Mamba
//! block: `in_proj` split per head into z and x, a bias-free depthwise convolution over
//! the masked input and the cached window, SiLU, `bcdt_proj` into B, C and dt each
//! through its own weighted RMS norm, `dt_proj`, mlx-lm's SSD scan (`ssm_attn`, one
//! group, `time_step_limit` (0.001, 100)), `out_proj(silu(z) * y)`, over an
//! `ArraysCache(2)`. The attention: one `qkv_proj`, weightless RMS norms of q and k per
//! head times `q_weight` / `k_weight`, `nn.RoPE` over the head (base 10000), a `KVCache`.
//! SwiGLU MLPs from one `gate_up_proj`; the head tied by `tie_word_embeddings`
//! (default). `sanitize` moves HF's convolution weights to MLX's layout.
use super::config_error;
use super::decoder::FeedForward;
use super::gemma2::RmsNorm;
use super::head::{self, LogitScale};
use super::mlp::GateUpMlp;
use super::recurrent::{recurrent_state, DepthwiseConv};
use super::{batch_len, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::activations::{silu, swiglu};
use mlx_nn::cache::ArraysState;
use mlx_nn::ssm::{ssm_attn, SsmParams};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Param, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by PLaMo 2 (mlx-lm's defaults for the others).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
#[serde(default)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub hidden_size_per_head: i32,
    pub max_position_embeddings: i32,
    pub attention_window_size: i32,
    pub full_attention_idx: Option<Vec<i32>>,
    pub mamba_d_state: i32,
    pub mamba_d_conv: i32,
    pub mamba_num_heads: i32,
    pub mamba_step: i32,
    pub mamba_chunk_size: i32,
    pub mamba_enabled: bool,
    pub intermediate_size: i32,
    pub vocab_size: i32,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "plamo2".into(),
            hidden_size: 4096,
            num_hidden_layers: 32,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            num_attention_heads: 32,
            num_key_value_heads: 4,
            hidden_size_per_head: 128,
            max_position_embeddings: 2048,
            attention_window_size: 2048,
            full_attention_idx: None,
            mamba_d_state: 64,
            mamba_d_conv: 4,
            mamba_num_heads: 64,
            mamba_step: 2,
            mamba_chunk_size: 256,
            mamba_enabled: true,
            intermediate_size: 13312,
            vocab_size: 32000,
        }
    }
}

/// `is_mamba(config, i)`.
fn is_mamba(a: &ModelArgs, i: i32) -> bool {
    if !a.mamba_enabled {
        return false;
    }
    if a.num_hidden_layers <= a.mamba_step / 2 {
        return i != a.num_hidden_layers - 1;
    }
    i % a.mamba_step != a.mamba_step / 2
}

/// The Mamba mixer.
#[derive(Debug)]
struct Mamba {
    in_proj: LinearLayer,
    conv1d: DepthwiseConv,
    bcdt_proj: LinearLayer,
    dt_proj: LinearLayer,
    dt_bias: Param,
    a_log: Param,
    d: Param,
    dt_norm_weight: Param,
    b_norm_weight: Param,
    c_norm_weight: Param,
    out_proj: LinearLayer,
    heads: i32,
    head_dim: i32,
    d_state: i32,
    eps: f32,
}
impl_module!(Mamba {
    in_proj,
    conv1d,
    bcdt_proj,
    dt_proj,
    dt_bias,
    a_log as "A_log",
    d as "D",
    dt_norm_weight,
    b_norm_weight as "B_norm_weight",
    c_norm_weight as "C_norm_weight",
    out_proj
});

impl Mamba {
    fn new(a: &ModelArgs) -> crate::Result<Mamba> {
        let (h, hd, ds) = (a.mamba_num_heads, a.hidden_size_per_head, a.mamba_d_state);
        let inner = h * hd;
        let dt_dim = 64.max(a.hidden_size / 16);
        let ones = |n: i32| -> crate::Result<Param> { Ok(Param::new(ops::ones(&[n], Dtype::Float32)?)) };
        Ok(Mamba {
            in_proj: LinearLayer::new(a.hidden_size, 2 * inner, false)?,
            conv1d: DepthwiseConv::zeros(inner, a.mamba_d_conv, false)?,
            bcdt_proj: LinearLayer::new(inner, dt_dim + 2 * ds, false)?,
            dt_proj: LinearLayer::new(dt_dim, h, false)?,
            dt_bias: Param::new(ops::zeros(&[h], Dtype::Float32)?),
            a_log: Param::new(ops::zeros(&[h], Dtype::Float32)?),
            d: ones(h)?,
            dt_norm_weight: ones(dt_dim)?,
            b_norm_weight: ones(ds)?,
            c_norm_weight: ones(ds)?,
            out_proj: LinearLayer::new(inner, a.hidden_size, false)?,
            heads: h,
            head_dim: hd,
            d_state: ds,
            eps: a.rms_norm_eps as f32,
        })
    }

    /// `_conv`: the masked input after the cached window (zeros without one; the last
    /// `kernel - 1` real positions kept), or after `kernel - 1` zeros without a cache.
    fn conv(&self, input: &Array, cache: Option<&mut ArraysState>, mask: Option<&Array>) -> Result<Array> {
        silu(&self.conv1d.masked_causal(input, cache, mask)?)
    }

    fn forward(&self, x: &Array, mask: Option<&Array>, mut cache: Option<&mut ArraysState>) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let (h, hd, ds) = (self.heads, self.head_dim, self.d_state);
        let zx = self.in_proj.forward(x)?.reshape(&[b, l, h, -1])?;
        let parts = zx.split_at(&[hd], -1)?;
        let (z, xs) = (&parts[0], &parts[1]);
        let xs = xs.reshape(&[b, -1, h * hd])?;
        let xs = self.conv(&xs, cache.as_deref_mut(), mask)?;
        let bcdt = self.bcdt_proj.forward(&xs)?.split_at(&[ds, 2 * ds], -1)?;
        let dt = fast::rms_norm(&bcdt[2], Some(&self.dt_norm_weight), self.eps)?;
        let bb = fast::rms_norm(&bcdt[0], Some(&self.b_norm_weight), self.eps)?;
        let cc = fast::rms_norm(&bcdt[1], Some(&self.c_norm_weight), self.eps)?;
        let dt = self.dt_proj.forward(&dt)?;
        // `_ssm`
        let xh = xs.reshape(&[b, l, h, hd])?;
        let bb = bb.reshape(&[b, l, 1, ds])?;
        let cc = cc.reshape(&[b, l, 1, ds])?;
        let (state, lengths) = match cache.as_deref() {
            Some(c) => (c.get(1).cloned(), c.lengths.clone()),
            None => (None, None),
        };
        let params = SsmParams {
            a_log: &self.a_log,
            d: &self.d,
            dt_bias: &self.dt_bias,
            time_step_limit: (0.001, 100.0),
        };
        let (y, state) = ssm_attn(&xh, &bb, &cc, &dt, &params, state.as_ref(), mask, lengths.as_ref())?;
        let y = y.reshape(&[b, l, h * hd])?;
        if let Some(c) = cache {
            if let Some(s) = state {
                c.set(1, s)?;
            }
            c.advance(y.dim(1)?)?;
        }
        let out = swiglu(&z.flatten(-2, -1)?, &y)?;
        self.out_proj.forward(&out)
    }
}

/// The attention mixer.
#[derive(Debug)]
struct Attention {
    qkv_proj: LinearLayer,
    o_proj: LinearLayer,
    q_weight: Param,
    k_weight: Param,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
}
impl_module!(Attention {
    qkv_proj,
    o_proj,
    q_weight,
    k_weight
});

impl Attention {
    fn new(a: &ModelArgs) -> crate::Result<Attention> {
        let (h, kv, hd) = (a.num_attention_heads, a.num_key_value_heads, a.hidden_size_per_head);
        Ok(Attention {
            qkv_proj: LinearLayer::new(a.hidden_size, (h + 2 * kv) * hd, false)?,
            o_proj: LinearLayer::new(h * hd, a.hidden_size, false)?,
            q_weight: Param::new(ops::ones(&[h, hd], Dtype::Float32)?),
            k_weight: Param::new(ops::ones(&[kv, hd], Dtype::Float32)?),
            rope: Rope::new(hd, false, 10000.0, 1.0),
            heads: h,
            kv_heads: kv,
            head_dim: hd,
        })
    }

    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let (b, t) = batch_len(x)?;
        let (h, kv, hd) = (self.heads, self.kv_heads, self.head_dim);
        let qkv = self.qkv_proj.forward(x)?.split_at(&[h * hd, (h + kv) * hd], -1)?;
        let heads = |a: &Array, n: i32| a.reshape(&[b, t, n, hd])?.transpose(Some(&[0, 2, 1, 3]));
        let q = fast::rms_norm(&heads(&qkv[0], h)?, None, 1e-6)?
            .multiply(&self.q_weight.expand_dims(&[1])?)?;
        let k = fast::rms_norm(&heads(&qkv[1], kv)?, None, 1e-6)?
            .multiply(&self.k_weight.expand_dims(&[1])?)?;
        let v = heads(&qkv[2], kv)?;
        let (q, fetch) = super::rope_cache(&q, &k, v, &self.rope, cache)?;
        let out = mlx_nn::scaled_dot_product_attention(
            &q,
            &fetch,
            f64::from(hd).powf(-0.5),
            mask,
            None,
        )?;
        let out = out.transpose(Some(&[0, 2, 1, 3]))?.reshape(&[b, t, h * hd])?;
        self.o_proj.forward(&out)
    }
}

/// A layer's mixer.
#[derive(Debug)]
enum Mixer {
    Mamba(Box<Mamba>),
    Attention(Box<Attention>),
}
enum_module!(Mixer {
    Mamba => "",
    Attention => "",
});

/// `PlamoDecoderLayer`.
#[derive(Debug)]
struct DecoderLayer {
    mixer: Mixer,
    mlp: GateUpMlp,
    pre_mixer_norm: RmsNorm,
    post_mixer_norm: RmsNorm,
    pre_mlp_norm: RmsNorm,
    post_mlp_norm: RmsNorm,
}
impl_module!(DecoderLayer {
    mixer,
    mlp,
    pre_mixer_norm,
    post_mixer_norm,
    pre_mlp_norm,
    post_mlp_norm
});

impl DecoderLayer {
    fn is_mamba(&self) -> bool {
        matches!(self.mixer, Mixer::Mamba(_))
    }
}

/// `PlamoDecoder`: the list of layers (`model.layers.layers`).
#[derive(Debug)]
struct Decoder {
    layers: Vec<DecoderLayer>,
}
impl_module!(Decoder { layers });

/// `PlamoModel`.
#[derive(Debug)]
struct PlamoModel {
    embed_tokens: EmbeddingLayer,
    layers: Decoder,
    norm: RmsNorm,
}
impl_module!(PlamoModel {
    embed_tokens,
    layers,
    norm
});

/// PLaMo 2 with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: PlamoModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |m: String| config_error("plamo2", m);
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        if args.num_hidden_layers < 0 {
            return Err(err("key `num_hidden_layers` must not be negative".into()));
        }
        if args.mamba_enabled && args.mamba_step <= 1 {
            return Err(err(format!(
                "key `mamba_step` ({}) must be above 1 (mlx-lm asserts it)",
                args.mamba_step
            )));
        }
        let (h, kv, hd) = (args.num_attention_heads, args.num_key_value_heads, args.hidden_size_per_head);
        if h <= 0 || kv <= 0 || h % kv != 0 || hd <= 0 || hd % 2 != 0 {
            return Err(err(format!(
                "`num_attention_heads` ({h}) must be a positive multiple of \
                 `num_key_value_heads` ({kv}) and `hidden_size_per_head` ({hd}) positive and even"
            )));
        }
        if args.mamba_enabled && (args.mamba_num_heads <= 0 || args.mamba_d_state <= 0 || args.mamba_d_conv < 2) {
            return Err(err(format!(
                "`mamba_num_heads` ({}) and `mamba_d_state` ({}) must be positive, \
                 `mamba_d_conv` ({}) at least 2",
                args.mamba_num_heads, args.mamba_d_state, args.mamba_d_conv
            )));
        }
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let mixer = if is_mamba(&args, i) {
                    Mixer::Mamba(Box::new(Mamba::new(&args)?))
                } else {
                    Mixer::Attention(Box::new(Attention::new(&args)?))
                };
                Ok(DecoderLayer {
                    mixer,
                    mlp: GateUpMlp::new(dim, args.intermediate_size, ["gate_up_proj", "down_proj"])?,
                    pre_mixer_norm: RmsNorm::with_offset(dim, eps, 1.0)?,
                    post_mixer_norm: RmsNorm::with_offset(dim, eps, 1.0 / 5.0)?,
                    pre_mlp_norm: RmsNorm::with_offset(dim, eps, 1.0)?,
                    post_mlp_norm: RmsNorm::with_offset(dim, eps, 1.0 / 5f64.powf(1.5))?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        // `fa_idx = mamba_step // 2`: the cache the attention mask is made from.
        let fa_idx = usize::try_from(args.mamba_step / 2).unwrap_or(0);
        if args.num_hidden_layers > 0 && fa_idx >= layers.len() {
            return Err(err(format!(
                "key `mamba_step` ({}): layer {fa_idx} (mlx-lm's attention-mask cache) does not exist",
                args.mamba_step
            )));
        }
        let model = PlamoModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers: Decoder { layers },
            norm: RmsNorm::with_offset(dim, eps, 1.0)?,
        };
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "plamo2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let layers = &m.layers.layers;
        let h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let fa_idx = usize::try_from(self.args.mamba_step / 2).unwrap_or(0);
        let attn_mask = mlx_nn::cache::create_attention_mask(n, super::cache_at(caches, fa_idx), None, false)?;
        let ssm_mask = match self
            .args
            .mamba_enabled
            .then(|| caches.first())
            .flatten()
            .and_then(|c| c.arrays())
        {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        let mut x = h;
        for (i, (layer, cache)) in layers.iter().zip(layer_caches(caches, layers.len())?).enumerate() {
            let ssm_mask = ssm_mask.clone();
            let forward = move |layer: &DecoderLayer, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>| {
                let normed = layer.pre_mixer_norm.forward(x)?;
                let mixed = match &layer.mixer {
                    Mixer::Mamba(mb) => mb.forward(&normed, ssm_mask.as_ref(), recurrent_state(cache, i, "mamba")?)?,
                    Mixer::Attention(at) => at.forward(&normed, mask, cache)?,
                };
                let h = x.add(&layer.post_mixer_norm.forward(&mixed)?)?;
                let f = layer.mlp.forward(&layer.pre_mlp_norm.forward(&h)?, None)?;
                h.add(&layer.post_mlp_norm.forward(&f)?)
            };
            x = mlx_nn::checkpoint::layer(layer, &x, &attn_mask, cache, forward)?;
        }
        let out = m.norm.forward(&x)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: an `ArraysCache(2)` per Mamba layer, a `KVCache` per attention one.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model
            .layers
            .layers
            .iter()
            .map(|l| {
                if l.is_mamba() {
                    CacheSpec::Arrays { size: 2 }
                } else {
                    CacheSpec::Standard
                }
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!(model.layers.layers);
}

impl Architecture for Model {
    /// Each Mamba layer's `nn.Conv1d` draws one key for its weight.
    fn extra_init_key_draws(&self) -> usize {
        self.model.layers.layers.iter().filter(|l| l.is_mamba()).count()
    }

    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        weights
            .into_iter()
            .map(|(k, v)| {
                let v = if k.contains("conv1d.weight") && v.dim(-1)? != 1 {
                    v.moveaxis(2, 1)?
                } else {
                    v
                };
                Ok((k, v))
            })
            .collect()
    }
}
