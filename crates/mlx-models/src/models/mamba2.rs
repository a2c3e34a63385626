//! Mamba-2, following `mlx_lm/models/mamba2.py`: every layer a Mamba-2 block (gated
//! depthwise convolution, then the SSD scan of `mlx_nn::ssm`), its convolution window
//! and SSM state in a two-slot [`ArraysState`].
use super::config_error;
use super::recurrent::{recurrent_state, DepthwiseConv};
use super::{batch_len, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::activations::{silu, swiglu};
use mlx_nn::cache::ArraysState;
use mlx_nn::ssm::{ssm_attn, SsmParams};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, Param, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

fn default_max_pos() -> i32 {
    2056
}

/// config.json keys read by Mamba-2.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub num_heads: i32,
    pub head_dim: i32,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub state_size: i32,
    pub num_hidden_layers: i32,
    pub layer_norm_epsilon: f64,
    pub conv_kernel: i32,
    pub n_groups: i32,
    pub use_bias: bool,
    pub use_conv_bias: bool,
    pub tie_word_embeddings: bool,
    pub time_step_limit: (f64, f64),
    pub time_step_rank: Value,
    #[serde(default)]
    pub ssm_state_size: Option<i32>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: i32,
}

/// `MambaRMSNormGated`: `rms_norm(silu(gate) * x)`, over groups of channels where
/// `group_size` is set.
#[derive(Debug)]
struct GatedNorm {
    weight: Param,
    eps: f32,
    group_size: Option<i32>,
}
impl_module!(GatedNorm { weight });

/// The sizes and options of a [`Mamba2Block`] (every Mamba-2-style mixer of mlx-lm:
/// mamba2, granitemoehybrid, ...).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MixerDims {
    pub hidden_size: i32,
    pub num_heads: i32,
    pub head_dim: i32,
    pub n_groups: i32,
    pub state_size: i32,
    pub conv_kernel: i32,
    pub conv_bias: bool,
    pub proj_bias: bool,
    /// The gated norm's eps.
    pub norm_eps: f64,
    pub time_step_limit: (f64, f64),
    /// Casts `D` to the activations' dtype before the scan (granitemoehybrid).
    pub cast_d: bool,
    /// The gated norm normalizes groups of this many channels (nemotron_h) instead of
    /// all of them.
    pub norm_group_size: Option<i32>,
    /// Hands a batch's remaining lengths to the scan (nemotron_h does not).
    pub scan_lengths: bool,
    /// Bias on `out_proj` (falcon_h1's `projectors_bias`; elsewhere `proj_bias`).
    pub out_bias: bool,
    /// How the output meets its gate.
    pub gate_norm: GateNorm,
}

/// Where the mixer's output meets its gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateNorm {
    /// `rms_norm(silu(gate) * y)` (mlx-lm's `MambaRMSNormGated`).
    GateThenNorm,
    /// `silu(gate) * rms_norm(y)` (falcon_h1's `mamba_norm_before_gate`).
    NormThenGate,
    /// `silu(gate) * y`, no norm (falcon_h1 without `mamba_rms_norm`).
    GateOnly,
}

/// The Mamba-2 mixer.
#[derive(Debug)]
pub(crate) struct Mamba2Block {
    conv1d: DepthwiseConv,
    in_proj: LinearLayer,
    dt_bias: Param,
    a_log: Param,
    d: Param,
    norm: Option<GatedNorm>,
    out_proj: LinearLayer,
    gate_norm: GateNorm,
    num_heads: i32,
    head_dim: i32,
    n_groups: i32,
    state_size: i32,
    limit: (f64, f64),
    cast_d: bool,
    scan_lengths: bool,
    /// falcon_h1's parameter order (see the `Module` impl).
    norm_before_d: bool,
}
/// The parameters in mlx-lm's declaration order: `conv1d, in_proj, dt_bias, A_log, D,
/// norm, out_proj`, falcon_h1's mixer declaring `norm` before `D` (mlx.nn's
/// `parameters()` keeps it, which lays out a saved full fine-tune).
impl Module for Mamba2Block {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.conv1d.visit_params(&join(prefix, "conv1d"), f);
        self.in_proj.visit_params(&join(prefix, "in_proj"), f);
        self.dt_bias.visit_params(&join(prefix, "dt_bias"), f);
        self.a_log.visit_params(&join(prefix, "A_log"), f);
        if self.norm_before_d {
            self.norm.visit_params(&join(prefix, "norm"), f);
            self.d.visit_params(&join(prefix, "D"), f);
        } else {
            self.d.visit_params(&join(prefix, "D"), f);
            self.norm.visit_params(&join(prefix, "norm"), f);
        }
        self.out_proj.visit_params(&join(prefix, "out_proj"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.conv1d.visit_params_mut(&join(prefix, "conv1d"), f);
        self.in_proj.visit_params_mut(&join(prefix, "in_proj"), f);
        self.dt_bias.visit_params_mut(&join(prefix, "dt_bias"), f);
        self.a_log.visit_params_mut(&join(prefix, "A_log"), f);
        if self.norm_before_d {
            self.norm.visit_params_mut(&join(prefix, "norm"), f);
            self.d.visit_params_mut(&join(prefix, "D"), f);
        } else {
            self.d.visit_params_mut(&join(prefix, "D"), f);
            self.norm.visit_params_mut(&join(prefix, "norm"), f);
        }
        self.out_proj.visit_params_mut(&join(prefix, "out_proj"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.conv1d.visit_quantizable_mut(&join(prefix, "conv1d"), f)?;
        self.in_proj.visit_quantizable_mut(&join(prefix, "in_proj"), f)?;
        self.dt_bias.visit_quantizable_mut(&join(prefix, "dt_bias"), f)?;
        self.a_log.visit_quantizable_mut(&join(prefix, "A_log"), f)?;
        self.d.visit_quantizable_mut(&join(prefix, "D"), f)?;
        self.norm.visit_quantizable_mut(&join(prefix, "norm"), f)?;
        self.out_proj.visit_quantizable_mut(&join(prefix, "out_proj"), f)
    }
}

impl ModelArgs {
    fn mixer_dims(&self) -> MixerDims {
        MixerDims {
            hidden_size: self.hidden_size,
            num_heads: self.num_heads,
            head_dim: self.head_dim,
            n_groups: self.n_groups,
            state_size: self.ssm_state_size.unwrap_or(self.state_size),
            conv_kernel: self.conv_kernel,
            conv_bias: self.use_conv_bias,
            proj_bias: self.use_bias,
            norm_eps: self.layer_norm_epsilon,
            time_step_limit: self.time_step_limit,
            cast_d: false,
            norm_group_size: None,
            scan_lengths: true,
            out_bias: self.use_bias,
            gate_norm: GateNorm::GateThenNorm,
        }
    }
}

impl Mamba2Block {
    pub(crate) fn new(a: &MixerDims, model: &str) -> crate::Result<Mamba2Block> {
        let state = a.state_size;
        let inner = a.num_heads * a.head_dim;
        let conv_dim = inner + 2 * a.n_groups * state;
        if a.n_groups <= 0 || a.num_heads % a.n_groups != 0 {
            return Err(crate::Error::Config {
                path: format!("config.json ({model})"),
                message: format!(
                    "the mamba groups ({}) must divide the mamba heads ({})",
                    a.n_groups, a.num_heads
                ),
            });
        }
        let f32z = |s: &[i32]| ops::zeros(s, Dtype::Float32);
        Ok(Mamba2Block {
            conv1d: DepthwiseConv::zeros(conv_dim, a.conv_kernel, a.conv_bias)?,
            in_proj: LinearLayer::new(a.hidden_size, inner + conv_dim + a.num_heads, a.proj_bias)?,
            dt_bias: Param::new(ops::ones(&[a.num_heads], Dtype::Float32)?),
            a_log: Param::new(f32z(&[a.num_heads])?),
            d: Param::new(ops::ones(&[a.num_heads], Dtype::Float32)?),
            norm: (a.gate_norm != GateNorm::GateOnly)
                .then(|| -> crate::Result<GatedNorm> {
                    Ok(GatedNorm {
                        weight: Param::new(ops::ones(&[inner], Dtype::Float32)?),
                        eps: a.norm_eps as f32,
                        group_size: a.norm_group_size,
                    })
                })
                .transpose()?,
            out_proj: LinearLayer::new(inner, a.hidden_size, a.out_bias)?,
            gate_norm: a.gate_norm,
            num_heads: a.num_heads,
            head_dim: a.head_dim,
            n_groups: a.n_groups,
            state_size: state,
            limit: a.time_step_limit,
            cast_d: a.cast_d,
            scan_lengths: a.scan_lengths,
            norm_before_d: model == "falcon_h1",
        })
    }

    fn conv(
        &self,
        input: &Array,
        cache: Option<&mut ArraysState>,
        mask: Option<&Array>,
    ) -> Result<Array> {
        silu(&self.conv1d.masked_causal(input, cache, mask)?)
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: Option<&Array>,
        mut cache: Option<&mut ArraysState>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let inner = self.num_heads * self.head_dim;
        let gs = self.n_groups * self.state_size;
        let conv_dim = inner + 2 * gs;
        let p = self
            .in_proj
            .forward(x)?
            .split_at(&[inner, inner + conv_dim], -1)?;
        let (gate, conv_in, dt) = (&p[0], &p[1], &p[2]);
        let conv_out = self.conv(conv_in, cache.as_deref_mut(), mask)?;
        let parts = conv_out.split_at(&[inner, inner + gs], -1)?;
        let hs = parts[0].reshape(&[b, l, self.num_heads, self.head_dim])?;
        let bb = parts[1].reshape(&[b, l, self.n_groups, self.state_size])?;
        let cc = parts[2].reshape(&[b, l, self.n_groups, self.state_size])?;
        let (state, lengths) = match cache.as_deref() {
            Some(c) => (
                c.get(1).cloned(),
                c.lengths.clone().filter(|_| self.scan_lengths),
            ),
            None => (None, None),
        };
        let d = if self.cast_d {
            self.d.astype(hs.dtype())?
        } else {
            self.d.value().clone()
        };
        let params = SsmParams {
            a_log: &self.a_log,
            d: &d,
            dt_bias: &self.dt_bias,
            time_step_limit: self.limit,
        };
        let (y, state) = ssm_attn(
            &hs,
            &bb,
            &cc,
            dt,
            &params,
            state.as_ref(),
            mask,
            lengths.as_ref(),
        )?;
        if let Some(c) = cache {
            if let Some(s) = state {
                c.set(1, s)?;
            }
            c.advance(l)?;
        }
        let y = y.reshape(&[b, l, inner])?;
        let y = match (self.gate_norm, &self.norm) {
            (GateNorm::GateThenNorm, Some(n)) => n.forward(&swiglu(gate, &y)?)?,
            (GateNorm::NormThenGate, Some(n)) => swiglu(gate, &n.forward(&y)?)?,
            _ => swiglu(gate, &y)?,
        };
        self.out_proj.forward(&y)
    }
}

impl GatedNorm {
    /// `rms_norm` over all channels, or over groups of `group_size` (then scaled).
    fn forward(&self, y: &Array) -> Result<Array> {
        match self.group_size {
            None => mlx_array::fast::rms_norm(y, Some(&self.weight), self.eps),
            Some(g) => {
                let y = mlx_array::fast::rms_norm(&y.unflatten(-1, &[-1, g])?, None, self.eps)?;
                self.weight.multiply(&y.flatten(-2, -1)?)
            }
        }
    }
}

/// A residual block: `x + mixer(norm(x))`.
#[derive(Debug)]
struct ResidualBlock {
    mixer: Mamba2Block,
    norm: RmsNorm,
}
impl_module!(ResidualBlock { mixer, norm });

/// The backbone.
#[derive(Debug)]
pub struct Mamba2 {
    embeddings: EmbeddingLayer,
    layers: Vec<ResidualBlock>,
    norm_f: RmsNorm,
}
impl_module!(Mamba2 {
    embeddings,
    layers,
    norm_f
});

/// Mamba-2 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    backbone: Mamba2,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { backbone, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        match &args.time_step_rank {
            Value::Number(_) => {}
            Value::String(s) if s == "auto" => {}
            other => {
                return Err(config_error("mamba2", format!(
                    "key `time_step_rank`: expected an integer or \"auto\", got {other}"
                )))
            }
        }
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(ResidualBlock {
                    mixer: Mamba2Block::new(&args.mixer_dims(), "mamba2")?,
                    // mlx-lm builds this norm with RMSNorm's default eps.
                    norm: RmsNorm::new(args.hidden_size, 1e-5)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let backbone = Mamba2 {
            embeddings: EmbeddingLayer::new(args.vocab_size, args.hidden_size)?,
            layers,
            norm_f: RmsNorm::new(args.hidden_size, args.layer_norm_epsilon)?,
        };
        let lm_head = if args.tie_word_embeddings {
            None
        } else {
            Some(LinearLayer::new(args.hidden_size, args.vocab_size, false)?)
        };
        Ok(Model {
            args,
            backbone,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "mamba2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.backbone;
        let mut h = m.embeddings.forward(tokens)?;
        let n = h.dim(1)?;
        let mask = match caches.first().and_then(|c| c.arrays()) {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let mask = mask.clone();
            let forward = move |layer: &ResidualBlock,
                                h: &Array,
                                _: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                let state = recurrent_state(cache, i, "state-space")?;
                let out = layer
                    .mixer
                    .forward(&layer.norm.forward(h)?, mask.as_ref(), state)?;
                out.add(h)
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &AttnMask::None, cache, forward)?;
        }
        let out = m.norm_f.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&out),
            None => m.embeddings.as_linear(&out),
        }
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Arrays { size: 2 }; self.backbone.layers.len()]
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    fn model_type(&self) -> &str {
        &self.args.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.args.vocab_size
    }
    fn num_layers(&self) -> usize {
        self.backbone.layers.len()
    }
    fn as_module(&self) -> Option<&dyn mlx_nn::Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn mlx_nn::Module> {
        Some(self)
    }
}

impl Architecture for Model {
    /// Each block's `nn.Conv1d` draws one key for its weight.
    fn extra_init_key_draws(&self) -> usize {
        self.backbone.layers.len()
    }

    /// Convolution weights stored `[channels, 1, kernel]` move to MLX's layout.
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
