//! Mamba (and Falcon-Mamba, `falcon_mamba`), following `mlx_lm/models/mamba.py`: every
//! layer a selective-scan block run one token at a time, its convolution window and
//! state in a two-slot [`ArraysState`]. Like mlx-lm's, the block takes no padding mask,
//! so prompts of a batch must not be padded.
use super::recurrent::{recurrent_state, DepthwiseConv};
use super::{layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::activations::{silu, softplus, swiglu};
use mlx_nn::cache::ArraysState;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, Param, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

fn default_true() -> bool {
    true
}
fn default_mixer_eps() -> f64 {
    1e-6
}

/// config.json keys read by Mamba.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub state_size: i32,
    pub num_hidden_layers: i32,
    pub conv_kernel: i32,
    pub use_bias: bool,
    pub use_conv_bias: bool,
    pub time_step_rank: Value,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub use_bcdt_rms: bool,
    #[serde(default = "default_mixer_eps")]
    pub mixer_rms_eps: f64,
}

impl ModelArgs {
    /// `__post_init__`: `time_step_rank = "auto"` is `ceil(hidden_size / 16)`;
    /// `falcon_mamba` normalizes delta, B and C.
    fn resolve(mut self) -> crate::Result<(ModelArgs, i32)> {
        let rank = match &self.time_step_rank {
            Value::String(s) if s == "auto" => (self.hidden_size as f64 / 16.0).ceil() as i32,
            Value::Number(n) if n.as_i64().is_some() => n.as_i64().unwrap_or_default() as i32,
            other => {
                return Err(crate::Error::Config {
                    path: "config.json (mamba)".into(),
                    message: format!(
                        "key `time_step_rank`: expected an integer or \"auto\", got {other}"
                    ),
                })
            }
        };
        if self.model_type == "falcon_mamba" {
            self.use_bcdt_rms = true;
        }
        Ok((self, rank))
    }
}

/// The selective-scan block.
#[derive(Debug)]
struct MambaBlock {
    in_proj: LinearLayer,
    conv1d: DepthwiseConv,
    x_proj: LinearLayer,
    dt_proj: LinearLayer,
    a_log: Param,
    d: Param,
    out_proj: LinearLayer,
    rank: i32,
    state_size: i32,
    bcdt_eps: Option<f32>,
}
impl_module!(MambaBlock {
    in_proj,
    conv1d,
    x_proj,
    dt_proj,
    a_log as "A_log",
    d as "D",
    out_proj
});

impl MambaBlock {
    fn new(a: &ModelArgs, rank: i32) -> crate::Result<MambaBlock> {
        let (h, inner, st) = (a.hidden_size, a.intermediate_size, a.state_size);
        let f32z = |s: &[i32]| ops::zeros(s, Dtype::Float32);
        Ok(MambaBlock {
            in_proj: LinearLayer::new(h, inner * 2, a.use_bias)?,
            conv1d: DepthwiseConv::zeros(inner, a.conv_kernel, a.use_conv_bias)?,
            x_proj: LinearLayer::new(inner, rank + 2 * st, false)?,
            dt_proj: LinearLayer::new(rank, inner, true)?,
            a_log: Param::new(f32z(&[inner, st])?),
            d: Param::new(ops::ones(&[inner], Dtype::Float32)?),
            out_proj: LinearLayer::new(inner, h, a.use_bias)?,
            rank,
            state_size: st,
            bcdt_eps: a.use_bcdt_rms.then_some(a.mixer_rms_eps as f32),
        })
    }

    /// mlx-lm's `ssm_step`: one token `[B, inner]` through the selective scan.
    fn ssm_step(&self, x: &Array, a: &Array, state: Option<&Array>) -> Result<(Array, Array)> {
        let parts = self
            .x_proj
            .forward(x)?
            .split_at(&[self.rank, self.rank + self.state_size], -1)?;
        let (mut delta, mut b, mut c) = (parts[0].clone(), parts[1].clone(), parts[2].clone());
        if let Some(eps) = self.bcdt_eps {
            delta = fast::rms_norm(&delta, None, eps)?;
            b = fast::rms_norm(&b, None, eps)?;
            c = fast::rms_norm(&c, None, eps)?;
        }
        let delta = softplus(&self.dt_proj.forward(&delta)?)?;
        let mut new_state = delta
            .multiply(x)?
            .expand_dims(&[-1])?
            .multiply(&b.expand_dims(&[1])?)?;
        if let Some(s) = state {
            let decay = delta.expand_dims(&[-1])?.multiply(a)?.exp()?;
            new_state = new_state.add(&s.multiply(&decay)?)?;
        }
        let y = new_state
            .matmul(&c.expand_dims(&[-1])?)?
            .squeeze(Some(&[2]))?;
        Ok((y.add(&self.d.multiply(x)?)?, new_state))
    }

    fn forward(&self, x: &Array, cache: Option<&mut ArraysState>) -> Result<Array> {
        let t = x.dim(1)?;
        let xz = self.in_proj.forward(x)?.split_sections(2, -1)?;
        let (x, z) = (&xz[0], &xz[1]);
        let conv_cache = cache.as_deref().and_then(|c| c.get(0)).cloned();
        let (conv_out, new_conv_cache) = self.conv1d.causal(x, conv_cache.as_ref())?;
        let xs = silu(&conv_out)?;
        let a = self.a_log.exp()?.negative()?;
        let mut state = cache.as_deref().and_then(|c| c.get(1)).cloned();
        let mut ys = Vec::with_capacity(t.max(0) as usize);
        for i in 0..t {
            let xt = xs.slice_axis(1, i, i + 1)?.squeeze(Some(&[1]))?;
            let (y, s) = self.ssm_step(&xt, &a, state.as_ref())?;
            ys.push(y);
            state = Some(s);
        }
        let y = ops::stack(&ys.iter().collect::<Vec<_>>(), 1)?;
        if let Some(c) = cache {
            c.set(0, new_conv_cache)?;
            if let Some(s) = state {
                c.set(1, s)?;
            }
        }
        self.out_proj.forward(&swiglu(z, &y)?)
    }
}

/// `x + mixer(norm(x))`.
#[derive(Debug)]
struct ResidualBlock {
    mixer: MambaBlock,
    norm: RmsNorm,
}
impl_module!(ResidualBlock { mixer, norm });

/// The backbone.
#[derive(Debug)]
pub struct Mamba {
    embeddings: EmbeddingLayer,
    layers: Vec<ResidualBlock>,
    norm_f: RmsNorm,
}
impl_module!(Mamba {
    embeddings,
    layers,
    norm_f
});

/// Mamba with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    backbone: Mamba,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { backbone, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (args, rank) = args.resolve()?;
        let h = args.hidden_size;
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(ResidualBlock {
                    mixer: MambaBlock::new(&args, rank)?,
                    // mlx-lm builds both norms with RMSNorm's default eps.
                    norm: RmsNorm::new(h, 1e-5)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let backbone = Mamba {
            embeddings: EmbeddingLayer::new(args.vocab_size, h)?,
            layers,
            norm_f: RmsNorm::new(h, 1e-5)?,
        };
        let lm_head = if args.tie_word_embeddings {
            None
        } else {
            Some(LinearLayer::new(h, args.vocab_size, false)?)
        };
        Ok(Model {
            args,
            backbone,
            lm_head,
        })
    }
}

/// Registry entry (also `falcon_mamba`).
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "mamba")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.backbone;
        let mut x = m.embeddings.forward(tokens)?;
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let forward = move |layer: &ResidualBlock,
                                x: &Array,
                                _: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                let state = recurrent_state(cache, i, "state-space")?;
                layer
                    .mixer
                    .forward(&layer.norm.forward(x)?, state)?
                    .add(x)
            };
            x = mlx_nn::checkpoint::layer(layer, &x, &AttnMask::None, cache, forward)?;
        }
        let out = m.norm_f.forward(&x)?;
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

    /// The block takes no padding mask (as mlx-lm's): padded rows would scan it.
    fn padded_prefill_is_exact(&self) -> bool {
        false
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
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
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
