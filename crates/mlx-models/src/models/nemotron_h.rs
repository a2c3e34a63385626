//! Nemotron-H, following `mlx_lm/models/nemotron_h.py`: a stack described by
//! `hybrid_override_pattern` (or `layers_block_type` / `layer_types`) of Mamba-2 mixers
//! (mamba2's block, with the gated norm over channel groups), attention without RoPE
//! and squared-ReLU MLPs, each `x + block(norm(x))`; only mixers and attention layers
//! hold caches. The routed-expert layers (`E`, Nemotron 3 MoE checkpoints) are not
//! ported: such a config is refused at load.
use super::config_error;
use super::mamba2::{GateNorm, Mamba2Block, MixerDims};
use super::recurrent::recurrent_state;
use super::{batch_len, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Error, Result};
use mlx_nn::activations::relu2;
use mlx_nn::cache::{create_attention_mask, KvFetch};
use mlx_nn::{
    impl_module, scaled_dot_product_attention, AttnMask, EmbeddingLayer, KvCache, LinearLayer,
    Module, RmsNorm,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Nemotron-H.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub max_position_embeddings: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub attention_bias: bool,
    pub mamba_num_heads: i32,
    pub mamba_head_dim: i32,
    pub mamba_proj_bias: bool,
    pub ssm_state_size: i32,
    pub conv_kernel: i32,
    pub n_groups: i32,
    pub mlp_bias: bool,
    pub layer_norm_epsilon: f64,
    pub use_bias: bool,
    pub use_conv_bias: bool,
    /// A string (`"M-M*"`, as HF configs write it) or a list of one-character strings.
    #[serde(default)]
    pub hybrid_override_pattern: Option<Value>,
    #[serde(default)]
    pub layers_block_type: Option<Vec<String>>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub time_step_limit: Option<(f64, f64)>,
}

impl ModelArgs {
    /// `__post_init__`: the block pattern as one character per layer.
    fn pattern(&self) -> crate::Result<Vec<char>> {
        match &self.hybrid_override_pattern {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => return Ok(s.chars().collect()),
            Some(Value::Array(items)) => {
                return items
                    .iter()
                    .map(|v| {
                        let s = v.as_str().unwrap_or_default();
                        let mut c = s.chars();
                        match (c.next(), c.next()) {
                            (Some(ch), None) => Ok(ch),
                            _ => Err(config_error("nemotron_h", format!(
                                "key `hybrid_override_pattern`: {v} is not one character"
                            ))),
                        }
                    })
                    .collect();
            }
            Some(other) => {
                return Err(config_error("nemotron_h", format!(
                    "key `hybrid_override_pattern`: expected a string or a list, got {other}"
                )))
            }
        }
        let Some(types) = self
            .layers_block_type
            .as_ref()
            .or(self.layer_types.as_ref())
        else {
            return Err(config_error("nemotron_h", 
                "the config must have layers_block_type or hybrid_override_pattern to \
                 describe the layer stack"
                    .into(),
            ));
        };
        types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" | "attention" => Ok('*'),
                "linear_attention" | "mamba" | "conv" => Ok('M'),
                "moe" => Ok('E'),
                "mlp" => Ok('-'),
                other => Err(config_error("nemotron_h", format!(
                    "unsupported layers_block_type `{other}`, expected any of attention, \
                     conv, full_attention, linear_attention, mamba, mlp, moe"
                ))),
            })
            .collect()
    }

    fn mixer_dims(&self) -> MixerDims {
        let inner = self.mamba_num_heads * self.mamba_head_dim;
        MixerDims {
            hidden_size: self.hidden_size,
            num_heads: self.mamba_num_heads,
            head_dim: self.mamba_head_dim,
            n_groups: self.n_groups,
            state_size: self.ssm_state_size,
            conv_kernel: self.conv_kernel,
            conv_bias: self.use_conv_bias,
            proj_bias: self.mamba_proj_bias,
            norm_eps: self.layer_norm_epsilon,
            time_step_limit: self.time_step_limit.unwrap_or((0.0, f64::INFINITY)),
            cast_d: true,
            norm_group_size: Some(inner / self.n_groups.max(1)),
            scan_lengths: false,
            out_bias: self.mamba_proj_bias,
            gate_norm: GateNorm::GateThenNorm,
        }
    }
}

/// Attention without positional encoding.
#[derive(Debug)]
struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f64,
}
impl_module!(Attention {
    q_proj,
    k_proj,
    v_proj,
    o_proj
});

impl Attention {
    fn new(a: &ModelArgs) -> crate::Result<Attention> {
        let (dim, nh, nkv, bias) = (
            a.hidden_size,
            a.num_attention_heads,
            a.num_key_value_heads,
            a.attention_bias,
        );
        if nh <= 0 {
            return Err(config_error("nemotron_h", "num_attention_heads must be positive".into()));
        }
        let hd = a.head_dim.unwrap_or(dim / nh);
        Ok(Attention {
            q_proj: LinearLayer::new(dim, nh * hd, bias)?,
            k_proj: LinearLayer::new(dim, nkv * hd, bias)?,
            v_proj: LinearLayer::new(dim, nkv * hd, bias)?,
            o_proj: LinearLayer::new(nh * hd, dim, bias)?,
            n_heads: nh,
            n_kv_heads: nkv,
            scale: (hd as f64).powf(-0.5),
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let heads = |t: Array, n: i32| t.reshape(&[b, l, n, -1])?.transpose(Some(&[0, 2, 1, 3]));
        let queries = heads(self.q_proj.forward(x)?, self.n_heads)?;
        let keys = heads(self.k_proj.forward(x)?, self.n_kv_heads)?;
        let values = heads(self.v_proj.forward(x)?, self.n_kv_heads)?;
        let fetch = match cache {
            Some(c) => mlx_nn::pipeline::update_and_fetch(c, &keys, &values)?,
            None => KvFetch::Plain { keys, values },
        };
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        self.o_proj
            .forward(&out.transpose(Some(&[0, 2, 1, 3]))?.reshape(&[b, l, -1])?)
    }
}

/// `down(relu2(up(x)))`.
#[derive(Debug)]
struct Mlp {
    up_proj: LinearLayer,
    down_proj: LinearLayer,
}
impl_module!(Mlp { up_proj, down_proj });

/// A block's mixer (the module named `mixer` in every block).
#[derive(Debug)]
enum Mixer {
    Mamba(Box<Mamba2Block>),
    Attention(Box<Attention>),
    Mlp(Box<Mlp>),
}

enum_module!(Mixer { Mamba => "", Attention => "", Mlp => "" });

/// One block: `x + mixer(norm(x))`.
#[derive(Debug)]
struct Block {
    norm: RmsNorm,
    mixer: Mixer,
}
impl_module!(Block { norm, mixer });

/// The backbone.
#[derive(Debug)]
pub struct NemotronHModel {
    embeddings: EmbeddingLayer,
    layers: Vec<Block>,
    norm_f: RmsNorm,
}
impl_module!(NemotronHModel {
    embeddings,
    layers,
    norm_f
});

/// Nemotron-H with its (untied) head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    backbone: NemotronHModel,
    lm_head: LinearLayer,
    /// Cache index of the first attention layer and of the first mixer (mlx-lm's
    /// `fa_idx` / `ssm_idx`, counted over the layers that hold caches).
    fa_idx: usize,
    ssm_idx: usize,
}
impl_module!(Model { backbone, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let pattern = args.pattern()?;
        let eps = args.layer_norm_epsilon;
        let layers = pattern
            .iter()
            .map(|&c| {
                let mixer = match c {
                    'M' => Mixer::Mamba(Box::new(Mamba2Block::new(
                        &args.mixer_dims(),
                        "nemotron_h",
                    )?)),
                    '*' => Mixer::Attention(Box::new(Attention::new(&args)?)),
                    '-' => Mixer::Mlp(Box::new(Mlp {
                        up_proj: LinearLayer::new(
                            args.hidden_size,
                            args.intermediate_size,
                            args.mlp_bias,
                        )?,
                        down_proj: LinearLayer::new(
                            args.intermediate_size,
                            args.hidden_size,
                            args.mlp_bias,
                        )?,
                    })),
                    'E' => {
                        return Err(crate::Error::Config {
                            path: "config.json (nemotron_h)".into(),
                            message: "routed-expert layers (`E` / `moe`, Nemotron 3 MoE \
                                      checkpoints) are not supported yet; only mamba, \
                                      attention and MLP layers load"
                                .into(),
                        })
                    }
                    other => return Err(config_error("nemotron_h", format!("unknown block type `{other}`"))),
                };
                Ok(Block {
                    norm: RmsNorm::new(args.hidden_size, eps)?,
                    mixer,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let fa_idx = pattern
            .iter()
            .take_while(|&&c| c != '*')
            .filter(|&&c| c == 'M')
            .count();
        let ssm_idx = pattern
            .iter()
            .take_while(|&&c| c != 'M')
            .filter(|&&c| c == '*')
            .count();
        let backbone = NemotronHModel {
            embeddings: EmbeddingLayer::new(args.vocab_size, args.hidden_size)?,
            layers,
            norm_f: RmsNorm::new(args.hidden_size, eps)?,
        };
        Ok(Model {
            lm_head: LinearLayer::new(args.hidden_size, args.vocab_size, false)?,
            args,
            backbone,
            fa_idx,
            ssm_idx,
        })
    }

    fn cached_layers(&self) -> usize {
        let layers = self.backbone.layers.iter();
        layers.filter(|l| !matches!(l.mixer, Mixer::Mlp(_))).count()
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "nemotron_h")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.backbone;
        let mut h = m.embeddings.forward(tokens)?;
        let n = h.dim(1)?;
        let n_cached = self.cached_layers();
        if !caches.is_empty() && caches.len() != n_cached {
            return Err(Error::InvalidArgument(format!(
                "the model has {n_cached} layers with caches but {} caches were passed",
                caches.len()
            )));
        }
        let attn_mask =
            create_attention_mask(n, caches.get(self.fa_idx).map(|c| c.as_ref()), None, false)?;
        let ssm_mask = match caches.get(self.ssm_idx).and_then(|c| c.arrays()) {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        let mut next = caches.iter_mut();
        for (i, layer) in m.layers.iter().enumerate() {
            let cache = match &layer.mixer {
                Mixer::Mamba(_) | Mixer::Attention(_) => {
                    next.next().map(|c| c.as_mut() as &mut dyn KvCache)
                }
                Mixer::Mlp(_) => None,
            };
            let ssm_mask = ssm_mask.clone();
            let forward = move |layer: &Block,
                                h: &Array,
                                attn_mask: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                let x = layer.norm.forward(h)?;
                let r = match &layer.mixer {
                    Mixer::Mamba(mx) => {
                        mx.forward(&x, ssm_mask.as_ref(), recurrent_state(cache, i, "mamba")?)?
                    }
                    Mixer::Attention(a) => a.forward(&x, attn_mask, cache)?,
                    Mixer::Mlp(mlp) => mlp.down_proj.forward(&relu2(&mlp.up_proj.forward(&x)?)?)?,
                };
                h.add(&r)
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &attn_mask, cache, forward)?;
        }
        self.lm_head.forward(&m.norm_f.forward(&h)?)
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.backbone
            .layers
            .iter()
            .filter_map(|l| match l.mixer {
                Mixer::Mamba(_) => Some(CacheSpec::Arrays { size: 2 }),
                Mixer::Attention(_) => Some(CacheSpec::Standard),
                Mixer::Mlp(_) => None,
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The scan gets no batch lengths (as mlx-lm's): a short row's last padded chunk
    /// would be lost from its state.
    fn padded_prefill_is_exact(&self) -> bool {
        false
    }

    fn model_type(&self) -> &str {
        &self.args.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.args.vocab_size
    }
    /// The layers that hold a cache (mixers and attention; the MLP blocks hold none).
    fn num_layers(&self) -> usize {
        self.cached_layers()
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
}

impl Architecture for Model {
    /// Each mixer's `nn.Conv1d` draws one key for its weight.
    fn extra_init_key_draws(&self) -> usize {
        let layers = self.backbone.layers.iter();
        layers
            .filter(|l| matches!(l.mixer, Mixer::Mamba(_)))
            .count()
    }

    /// Drops `mtp.*` and moves convolutions to MLX's layout.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        weights
            .into_iter()
            .filter(|(k, _)| !k.starts_with("mtp."))
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
