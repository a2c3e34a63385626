//! Granite 4 hybrid (`granitemoehybrid`), following `mlx_lm/models/granitemoehybrid.py`:
//! Mamba-2 mixers (mamba2's block) and attention layers in the order of `layer_types`,
//! Granite's embedding / attention / residual / logits multipliers, and either routed
//! experts beside a shared MLP or a dense MLP.
use super::config_error;
use super::mamba2::{GateNorm, Mamba2Block, MixerDims};
use super::recurrent::recurrent_state;
use super::{batch_len, layer_caches, rope_cache, top_k_indices, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::activations::swiglu;
use mlx_nn::cache::{create_attention_mask, KvFetch};
use mlx_nn::{
    impl_module, initialize_rope, scaled_dot_product_attention, AttnMask, EmbeddingLayer, KvCache,
    LinearLayer, Module, RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

fn default_pos_type() -> String {
    "rope".into()
}
fn default_true() -> bool {
    true
}
fn default_limit() -> (f64, f64) {
    (0.001, 100.0)
}
fn default_theta() -> f64 {
    10000.0
}

/// config.json keys read by Granite 4 hybrid.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub max_position_embeddings: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub attention_bias: bool,
    pub embedding_multiplier: f64,
    pub attention_multiplier: f64,
    pub logits_scaling: f64,
    pub residual_multiplier: f64,
    pub layer_types: Vec<String>,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub num_local_experts: Option<i32>,
    #[serde(default)]
    pub num_experts_per_tok: Option<i32>,
    #[serde(default)]
    pub shared_intermediate_size: Option<i32>,
    #[serde(default)]
    pub mamba_n_heads: Option<i32>,
    #[serde(default)]
    pub mamba_d_head: Option<i32>,
    #[serde(default)]
    pub mamba_proj_bias: Option<bool>,
    #[serde(default)]
    pub mamba_d_state: Option<i32>,
    #[serde(default)]
    pub mamba_d_conv: Option<i32>,
    #[serde(default)]
    pub mamba_n_groups: Option<i32>,
    #[serde(default)]
    pub mamba_conv_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_pos_type")]
    pub position_embedding_type: String,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_limit")]
    pub time_step_limit: (f64, f64),
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
}

impl ModelArgs {
    fn use_moe(&self) -> bool {
        self.num_local_experts.is_some_and(|n| n != 0)
    }

    /// The Mamba-2 mixer's sizes; each `mamba_*` key is required once a layer is one.
    fn mixer_dims(&self) -> crate::Result<MixerDims> {
        let need = |v: Option<i32>, k: &str| {
            v.ok_or_else(|| config_error("granitemoehybrid", format!("key `{k}` is needed by the mamba layers")))
        };
        let needb = |v: Option<bool>, k: &str| {
            v.ok_or_else(|| config_error("granitemoehybrid", format!("key `{k}` is needed by the mamba layers")))
        };
        Ok(MixerDims {
            hidden_size: self.hidden_size,
            num_heads: need(self.mamba_n_heads, "mamba_n_heads")?,
            head_dim: need(self.mamba_d_head, "mamba_d_head")?,
            n_groups: need(self.mamba_n_groups, "mamba_n_groups")?,
            state_size: need(self.mamba_d_state, "mamba_d_state")?,
            conv_kernel: need(self.mamba_d_conv, "mamba_d_conv")?,
            conv_bias: needb(self.mamba_conv_bias, "mamba_conv_bias")?,
            proj_bias: needb(self.mamba_proj_bias, "mamba_proj_bias")?,
            norm_eps: self.rms_norm_eps,
            time_step_limit: self.time_step_limit,
            cast_d: true,
            norm_group_size: None,
            scan_lengths: true,
            out_bias: needb(self.mamba_proj_bias, "mamba_proj_bias")?,
            gate_norm: GateNorm::GateThenNorm,
        })
    }
}

/// Attention scaled by `attention_multiplier`, with RoPE unless the position embedding
/// is `nope`.
#[derive(Debug)]
struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    rope: Option<Rope>,
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
            return Err(config_error("granitemoehybrid", "num_attention_heads must be positive".into()));
        }
        let hd = dim / nh;
        let rope = if a.position_embedding_type != "nope" {
            Some(initialize_rope(
                hd,
                a.rope_theta,
                false,
                None,
                Some(a.max_position_embeddings),
            )?)
        } else {
            None
        };
        Ok(Attention {
            q_proj: LinearLayer::new(dim, nh * hd, bias)?,
            k_proj: LinearLayer::new(dim, nkv * hd, bias)?,
            v_proj: LinearLayer::new(dim, nkv * hd, bias)?,
            o_proj: LinearLayer::new(nh * hd, dim, bias)?,
            rope,
            n_heads: nh,
            n_kv_heads: nkv,
            scale: a.attention_multiplier,
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
        let (queries, fetch) = match &self.rope {
            Some(rope) => rope_cache(&queries, &keys, values, rope, cache)?,
            None => match cache {
                Some(c) => (
                    queries,
                    mlx_nn::pipeline::update_and_fetch(c, &keys, &values)?,
                ),
                None => (queries, KvFetch::Plain { keys, values }),
            },
        };
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        self.o_proj
            .forward(&out.transpose(Some(&[0, 2, 1, 3]))?.reshape(&[b, l, -1])?)
    }
}

/// The top-k router (softmax over the chosen logits).
#[derive(Debug)]
struct Router {
    layer: LinearLayer,
    top_k: i32,
}
impl_module!(Router { layer });

/// Routed experts.
#[derive(Debug)]
struct Moe {
    switch_mlp: SwitchGlu,
    router: Router,
}
impl_module!(Moe { switch_mlp, router });

impl Moe {
    fn forward(&self, x: &Array) -> Result<Array> {
        let logits = self.router.layer.forward(x)?;
        let idx = top_k_indices(&logits, self.router.top_k)?;
        let gates = logits
            .take_along_axis(&idx, -1)?
            .softmax(Some(&[-1]), true)?;
        let y = self.switch_mlp.forward(x, &idx)?;
        y.multiply(&gates.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)
    }
}

/// The shared MLP: gate and up in one `input_linear`.
#[derive(Debug)]
struct SharedMlp {
    input_linear: LinearLayer,
    output_linear: LinearLayer,
}
impl_module!(SharedMlp {
    input_linear,
    output_linear
});

impl SharedMlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gu = self.input_linear.forward(x)?.split_sections(2, -1)?;
        self.output_linear.forward(&swiglu(&gu[0], &gu[1])?)
    }
}

/// The dense MLP of models without experts.
#[derive(Debug)]
struct Mlp {
    gate_proj: LinearLayer,
    down_proj: LinearLayer,
    up_proj: LinearLayer,
}
impl_module!(Mlp {
    gate_proj,
    down_proj,
    up_proj
});

/// A layer's mixer.
#[derive(Debug)]
enum Mixer {
    Mamba(Box<Mamba2Block>),
    Attention(Box<Attention>),
}

/// Routed experts beside the shared MLP.
#[derive(Debug)]
struct MoeFf {
    shared_mlp: SharedMlp,
    block_sparse_moe: Moe,
}
impl_module!(MoeFf {
    shared_mlp,
    block_sparse_moe
});

/// A layer's feed-forward part.
#[derive(Debug)]
enum FeedForward {
    Moe(Box<MoeFf>),
    Dense(Box<Mlp>),
}

enum_module!(Mixer { Mamba => "mamba", Attention => "self_attn" });
enum_module!(FeedForward { Moe => "", Dense => "mlp" });

impl FeedForward {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Moe(m) => m
                .block_sparse_moe
                .forward(x)?
                .add(&m.shared_mlp.forward(x)?),
            FeedForward::Dense(m) => m
                .down_proj
                .forward(&swiglu(&m.gate_proj.forward(x)?, &m.up_proj.forward(x)?)?),
        }
    }
}

/// One layer.
#[derive(Debug)]
struct Layer {
    mixer: Mixer,
    ff: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(Layer {
    input_layernorm,
    mixer as "",
    ff as "",
    post_attention_layernorm
});

/// The decoder stack.
#[derive(Debug)]
pub struct GraniteMoeHybridModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<Layer>,
    norm: RmsNorm,
}
impl_module!(GraniteMoeHybridModel {
    embed_tokens,
    layers,
    norm
});

/// Granite 4 hybrid with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: GraniteMoeHybridModel,
    lm_head: Option<LinearLayer>,
    fa_idx: Option<usize>,
    ssm_idx: Option<usize>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(mut args: ModelArgs) -> crate::Result<Model> {
        if let Some(t) = args
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
        {
            args.rope_theta = t.as_f64().ok_or_else(|| {
                config_error("granitemoehybrid", "key `rope_parameters.rope_theta` is not a number".into())
            })?;
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = args
            .layer_types
            .iter()
            .map(|t| {
                let mixer = match t.as_str() {
                    "mamba" => Mixer::Mamba(Box::new(Mamba2Block::new(
                        &args.mixer_dims()?,
                        "granitemoehybrid",
                    )?)),
                    "attention" => Mixer::Attention(Box::new(Attention::new(&args)?)),
                    other => return Err(config_error("granitemoehybrid", format!("unknown layer type `{other}`"))),
                };
                let ff = if args.use_moe() {
                    let experts = args.num_local_experts.unwrap_or_default();
                    let shared = args.shared_intermediate_size.ok_or_else(|| {
                        config_error("granitemoehybrid", "key `shared_intermediate_size` is needed with experts".into())
                    })?;
                    let top_k = args.num_experts_per_tok.ok_or_else(|| {
                        config_error("granitemoehybrid", "key `num_experts_per_tok` is needed with experts".into())
                    })?;
                    FeedForward::Moe(Box::new(MoeFf {
                        shared_mlp: SharedMlp {
                            input_linear: LinearLayer::new(dim, shared * 2, false)?,
                            output_linear: LinearLayer::new(shared, dim, false)?,
                        },
                        block_sparse_moe: Moe {
                            switch_mlp: SwitchGlu::new(
                                dim,
                                args.intermediate_size,
                                experts,
                                false,
                            )?,
                            router: Router {
                                layer: LinearLayer::new(dim, experts, false)?,
                                top_k,
                            },
                        },
                    }))
                } else {
                    let (h, bias) = (args.intermediate_size, args.mlp_bias);
                    FeedForward::Dense(Box::new(Mlp {
                        gate_proj: LinearLayer::new(dim, h, bias)?,
                        down_proj: LinearLayer::new(h, dim, bias)?,
                        up_proj: LinearLayer::new(dim, h, bias)?,
                    }))
                };
                Ok(Layer {
                    mixer,
                    ff,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let fa_idx = args.layer_types.iter().position(|t| t == "attention");
        let ssm_idx = args.layer_types.iter().position(|t| t == "mamba");
        let model = GraniteMoeHybridModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        let lm_head = if args.tie_word_embeddings {
            None
        } else {
            Some(LinearLayer::new(dim, args.vocab_size, false)?)
        };
        Ok(Model {
            args,
            model,
            lm_head,
            fa_idx,
            ssm_idx,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(
        config,
        "granitemoehybrid",
    )?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let a = &self.args;
        let mut h = m
            .embed_tokens
            .forward(tokens)?
            .multiply(a.embedding_multiplier)?;
        let n = h.dim(1)?;
        let attn_mask = match self.fa_idx {
            Some(i) => create_attention_mask(n, caches.get(i).map(|c| c.as_ref()), None, false)?,
            None => AttnMask::None,
        };
        let ssm_mask = match self
            .ssm_idx
            .and_then(|i| caches.get(i))
            .and_then(|c| c.arrays())
        {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let (ssm_mask, multiplier) = (ssm_mask.clone(), a.residual_multiplier);
            let forward = move |layer: &Layer,
                                h: &Array,
                                attn_mask: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                let x = layer.input_layernorm.forward(h)?;
                let r = match &layer.mixer {
                    Mixer::Mamba(mx) => {
                        let state = recurrent_state(cache, i, "mamba")?;
                        mx.forward(&x, ssm_mask.as_ref(), state)?
                    }
                    Mixer::Attention(at) => at.forward(&x, attn_mask, cache)?,
                };
                let hh = h.add(&r.multiply(multiplier)?)?;
                let ff = layer
                    .ff
                    .forward(&layer.post_attention_layernorm.forward(&hh)?)?;
                hh.add(&ff.multiply(multiplier)?)
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &attn_mask, cache, forward)?;
        }
        let out = m.norm.forward(&h)?;
        let logits = match &self.lm_head {
            Some(head) => head.forward(&out)?,
            None => m.embed_tokens.as_linear(&out)?,
        };
        logits.divide(a.logits_scaling)
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Mamba(_) => CacheSpec::Arrays { size: 2 },
                Mixer::Attention(_) => CacheSpec::Standard,
            })
            .collect()
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
        self.model.layers.len()
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
}

fn take(weights: &mut Weights, key: &str) -> crate::Result<Array> {
    weights.remove(key).ok_or_else(|| crate::Error::Weights {
        path: "model weights".into(),
        message: format!("missing tensor `{key}`"),
    })
}

impl Architecture for Model {
    /// Each mamba mixer's `nn.Conv1d` draws one key for its weight.
    fn extra_init_key_draws(&self) -> usize {
        let layers = self.model.layers.iter();
        layers
            .filter(|l| matches!(l.mixer, Mixer::Mamba(_)))
            .count()
    }

    /// Convolutions to MLX's layout; HF's `input_linear` / `output_linear` experts to
    /// `switch_mlp` (or, without experts, the shared MLP to the dense `mlp`); a tied
    /// head dropped.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        for (k, v) in weights.iter_mut() {
            if k.contains("conv1d.weight") && v.dim(-1)? != 1 {
                *v = v.moveaxis(2, 1)?;
            }
        }
        let n = self.args.num_hidden_layers;
        if self.args.use_moe()
            && weights.contains_key("model.layers.0.block_sparse_moe.input_linear.weight")
        {
            for l in 0..n {
                let prefix = format!("model.layers.{l}.block_sparse_moe");
                let input = take(&mut weights, &format!("{prefix}.input_linear.weight"))?;
                let hidden = input.dim(1)?;
                let gate = input.slice_axis(1, 0, hidden / 2)?;
                let up = input.slice_axis(1, hidden / 2, hidden)?;
                weights.insert(format!("{prefix}.switch_mlp.gate_proj.weight"), gate);
                weights.insert(format!("{prefix}.switch_mlp.up_proj.weight"), up);
                let down = take(&mut weights, &format!("{prefix}.output_linear.weight"))?;
                weights.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
            }
        } else if !self.args.use_moe()
            && weights.contains_key("model.layers.0.shared_mlp.input_linear.weight")
        {
            for l in 0..n {
                let prefix = format!("model.layers.{l}.shared_mlp");
                let input = take(&mut weights, &format!("{prefix}.input_linear.weight"))?;
                let parts = input.split_sections(2, 0)?;
                let p = format!("model.layers.{l}.mlp");
                weights.insert(format!("{p}.gate_proj.weight"), parts[0].clone());
                weights.insert(format!("{p}.up_proj.weight"), parts[1].clone());
                let down = take(&mut weights, &format!("{prefix}.output_linear.weight"))?;
                weights.insert(format!("{p}.down_proj.weight"), down);
            }
        }
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        Ok(weights)
    }
}
