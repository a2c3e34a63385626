//! Nemotron-NAS (`nemotron-nas`: Llama-3.1-Nemotron Nano / Super / Ultra), following
//! `mlx_lm/models/nemotron-nas.py`: Llama-shaped pre-norm layers whose shape each layer's
//! `block_configs` entry decides. Its attention is a GQA self-attention with
//! `num_attention_heads / n_heads_in_group` key-value heads, one `dim -> dim` linear
//! layer (`replace_with_linear`, `self_attn.linear`), or absent (`no_op`, with its
//! `input_layernorm`); its FFN likewise a gated MLP `ffn_mult` wide (`_ACT2FN`'s
//! activation), `mlp.linear`, or absent (with its `post_attention_layernorm`). Every
//! layer that has an attention block, a linear one too, has a cache (mlx-lm's
//! `make_cache`), the mask made from the first of them.
use super::config_error;
use super::attention::{Attention, AttentionDims, Extras};
use super::decoder::FeedForward;
use super::head::{self, LogitScale};
use super::lm::{drop_tied_head, Stack};
use super::mlp::Mlp;
use super::{cache_at, layer_caches, project_out, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::activations::{gelu, gelu_approx, relu, silu};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Nemotron-NAS, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub block_configs: Vec<BlockConfig>,
    pub hidden_act: String,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub rope_theta: f64,
    pub rope_scaling: Option<Value>,
    pub max_position_embeddings: i32,
    pub tie_word_embeddings: bool,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "nemotron-nas".into(),
            hidden_size: 8192,
            num_hidden_layers: 80,
            num_attention_heads: 64,
            rms_norm_eps: 1e-5,
            vocab_size: 128256,
            block_configs: Vec::new(),
            hidden_act: "silu".into(),
            attention_bias: false,
            mlp_bias: false,
            rope_theta: 500000.0,
            rope_scaling: None,
            max_position_embeddings: 131072,
            tie_word_embeddings: false,
        }
    }
}

/// One layer's shape (`BlockConfig.from_dict`: its `attention` and `ffn`, each `{}`
/// when missing; other keys ignored).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct BlockConfig {
    pub attention: AttentionConfig,
    pub ffn: FfnConfig,
}

/// A layer's attention (`AttentionConfig(**data)`: an unknown key is an error). Only
/// `no_op`, `replace_with_linear` and `n_heads_in_group` shape the model.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[allow(missing_docs)]
pub struct AttentionConfig {
    pub no_op: bool,
    pub replace_with_linear: bool,
    pub sparsify: Option<Vec<String>>,
    pub n_heads_in_group: Option<i32>,
    pub window_length: Option<i32>,
    pub num_sink_tokens: Option<i32>,
    pub use_prefill_window_in_sink_attention: bool,
    pub unshifted_sink: bool,
}

/// A layer's FFN (`FFNConfig(**data)`: an unknown key is an error).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[allow(missing_docs)]
pub struct FfnConfig {
    pub no_op: bool,
    pub replace_with_linear: bool,
    pub sparsify: Option<Vec<String>>,
    pub ffn_mult: Option<f64>,
}

impl ModelArgs {
    /// `__post_init__`'s checks (and `AttentionConfig` / `FFNConfig`'s).
    fn check(&self) -> crate::Result<()> {
        if self.block_configs.len() as i64 != i64::from(self.num_hidden_layers) {
            return Err(config_error("nemotron-nas", format!(
                "Number of block_configs ({}) must match num_hidden_layers ({})",
                self.block_configs.len(),
                self.num_hidden_layers
            )));
        }
        if let Some(Value::Object(s)) = &self.rope_scaling {
            if !s.is_empty() {
                if !s.contains_key("factor") {
                    return Err(config_error("nemotron-nas", "rope_scaling must contain 'factor'".into()));
                }
                if s.get("rope_type").is_none_or(Value::is_null) {
                    return Err(config_error("nemotron-nas", "rope_scaling must contain 'rope_type'".into()));
                }
            }
        }
        for (i, b) in self.block_configs.iter().enumerate() {
            let a = &b.attention;
            if !a.no_op && !a.replace_with_linear {
                let group = a.n_heads_in_group.ok_or_else(|| {
                    config_error("nemotron-nas", format!(
                        "layer {i}: n_heads_in_group must be specified for active attention \
                         blocks"
                    ))
                })?;
                if group <= 0 {
                    return Err(config_error("nemotron-nas", format!(
                        "layer {i}: n_heads_in_group must be positive, got {group}"
                    )));
                }
                if self.num_attention_heads % group != 0 {
                    return Err(config_error("nemotron-nas", format!(
                        "Layer {i}: num_attention_heads ({}) must be divisible by \
                         n_heads_in_group ({group})",
                        self.num_attention_heads
                    )));
                }
            }
            let f = &b.ffn;
            if !f.no_op && !f.replace_with_linear && f.ffn_mult.is_none() {
                return Err(config_error("nemotron-nas", format!(
                    "layer {i}: ffn_mult must be specified for active FFN blocks"
                )));
            }
        }
        Ok(())
    }
}

/// `_ffn_mult_to_intermediate_size`: `int(2 * ffn_mult * n_embd / 3)` (with `ffn_mult`
/// rounded to 6 decimals first, as `FFNConfig` does) up to a multiple of 256.
fn ffn_width(ffn_mult: f64, dim: i32) -> crate::Result<i32> {
    let rounded: f64 = format!("{ffn_mult:.6}")
        .parse()
        .map_err(|_| config_error("nemotron-nas", format!("ffn_mult {ffn_mult} is not a number")))?;
    let width = (2.0 * rounded * f64::from(dim) / 3.0) as i64;
    let width = if width % 256 == 0 {
        width
    } else {
        width + 256 - width.rem_euclid(256)
    };
    i32::try_from(width)
        .ok()
        .filter(|&w| w > 0)
        .ok_or_else(|| config_error("nemotron-nas", format!("ffn_mult {ffn_mult} gives an MLP {width} wide")))
}

/// `_ACT2FN`.
fn activation(name: &str) -> crate::Result<fn(&Array) -> Result<Array>> {
    Ok(match name {
        "silu" => silu,
        "relu" => relu,
        "gelu" => gelu,
        "gelu_new" | "gelu_fast" => gelu_approx,
        _ => {
            return Err(config_error("nemotron-nas", format!(
                "Unknown activation function: {name}"
            )))
        }
    })
}

/// `LinearSubblockReplacement`: one `dim x dim` linear layer (under `linear`) in place of
/// a layer's attention or FFN, which ignores the mask and the cache.
#[derive(Debug)]
struct LinearSub {
    linear: LinearLayer,
}
impl_module!(LinearSub { linear });

impl FeedForward for LinearSub {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        project_out(&self.linear, x, residual)
    }
}

/// A layer's attention block: the full attention or a [`LinearSub`].
trait Mixer: Module + std::fmt::Debug + Send {
    /// `residual + block(x)`.
    fn mix(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>, residual: &Array)
        -> Result<Array>;
    /// Fuses q/k/v (the full attention).
    fn fuse(&mut self) -> crate::Result<()> {
        Ok(())
    }
}

impl Mixer for Attention {
    fn mix(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>, residual: &Array)
        -> Result<Array> {
        self.forward(x, mask, cache, Some(residual), Extras::default())
    }
    fn fuse(&mut self) -> crate::Result<()> {
        Attention::fuse(self)
    }
}

impl Mixer for LinearSub {
    fn mix(&self, x: &Array, _: &AttnMask, _: Option<&mut dyn KvCache>, residual: &Array)
        -> Result<Array> {
        FeedForward::forward(self, x, Some(residual))
    }
}

/// `TransformerBlock`: each half present unless its config is `no_op`.
#[derive(Debug)]
pub struct TransformerBlock {
    input_layernorm: Option<RmsNorm>,
    self_attn: Option<Box<dyn Mixer>>,
    post_attention_layernorm: Option<RmsNorm>,
    mlp: Option<Box<dyn FeedForward>>,
}
impl_module!(TransformerBlock {
    input_layernorm,
    self_attn,
    post_attention_layernorm,
    mlp
});

impl TransformerBlock {
    fn new(args: &ModelArgs, block: &BlockConfig) -> crate::Result<TransformerBlock> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let a = &block.attention;
        let self_attn: Option<Box<dyn Mixer>> = if a.no_op {
            None
        } else if a.replace_with_linear {
            let linear = LinearLayer::new(dim, dim, args.attention_bias)?;
            Some(Box::new(LinearSub { linear }))
        } else {
            Some(Box::new(attention(args, a.n_heads_in_group.unwrap_or(1))?))
        };
        let f = &block.ffn;
        let mlp: Option<Box<dyn FeedForward>> = if f.no_op {
            None
        } else if f.replace_with_linear {
            let linear = LinearLayer::new(dim, dim, args.mlp_bias)?;
            Some(Box::new(LinearSub { linear }))
        } else {
            let hidden = ffn_width(f.ffn_mult.unwrap_or_default(), dim)?;
            let act = activation(&args.hidden_act)?;
            Some(Box::new(
                Mlp::new(dim, hidden, args.mlp_bias)?.with_activation(act),
            ))
        };
        Ok(TransformerBlock {
            input_layernorm: (!a.no_op).then(|| RmsNorm::new(dim, eps)).transpose()?,
            self_attn,
            post_attention_layernorm: (!f.no_op).then(|| RmsNorm::new(dim, eps)).transpose()?,
            mlp,
        })
    }

    /// `x + self_attn(input_layernorm(x))`, then `+ mlp(post_attention_layernorm(..))`,
    /// each where the layer has it.
    fn run(layer: &Self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let mut x = x.clone();
        if let (Some(attn), Some(norm)) = (&layer.self_attn, &layer.input_layernorm) {
            x = attn.mix(&norm.forward(&x)?, mask, cache, &x)?;
        }
        if let (Some(mlp), Some(norm)) = (&layer.mlp, &layer.post_attention_layernorm) {
            x = mlp.forward(&norm.forward(&x)?, Some(&x))?;
        }
        Ok(x)
    }
}

/// The GQA attention of a layer whose group is `n_heads_in_group` query heads per
/// key-value head (RoPE never traditional, `initialize_rope` with `rope_scaling`).
fn attention(args: &ModelArgs, n_heads_in_group: i32) -> crate::Result<Attention> {
    let (dim, n_heads) = (args.hidden_size, args.num_attention_heads);
    let head_dim = dim / n_heads;
    if head_dim * n_heads != dim {
        return Err(config_error("nemotron-nas", format!(
            "hidden_size ({dim}) must be divisible by num_attention_heads ({n_heads})"
        )));
    }
    let d = AttentionDims {
        dim,
        n_heads,
        n_kv_heads: n_heads / n_heads_in_group,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: args.attention_bias,
    };
    let scaling = args.rope_scaling.as_ref();
    let max_positions = Some(args.max_position_embeddings);
    Attention::with_scaled_rope(d, args.rope_theta, scaling, max_positions)
}

/// Nemotron-NAS with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Stack<TransformerBlock, RmsNorm>,
    lm_head: Option<LinearLayer>,
    /// How many layers have an attention block (and so a cache).
    num_attn_layers: usize,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from parsed arguments.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        args.check()?;
        let (dim, vocab) = (args.hidden_size, args.vocab_size);
        let layers = args
            .block_configs
            .iter()
            .map(|b| TransformerBlock::new(&args, b))
            .collect::<crate::Result<Vec<_>>>()?;
        let num_attn_layers = layers.iter().filter(|l| l.self_attn.is_some()).count();
        if num_attn_layers == 0 {
            // mlx-lm's forward reads `cache[0]`, which does not exist then.
            return Err(config_error("nemotron-nas", 
                "every layer's attention is no_op: mlx-lm's forward needs at least one".into(),
            ));
        }
        let model = Stack {
            embed_tokens: EmbeddingLayer::new(vocab, dim)?,
            layers,
            norm: RmsNorm::new(dim, args.rms_norm_eps)?,
        };
        let lm_head = head::untied(args.tie_word_embeddings, dim, vocab)?;
        Ok(Model {
            args,
            model,
            lm_head,
            num_attn_layers,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "nemotron-nas")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        let mut slots = layer_caches(caches, self.num_attn_layers)?.into_iter();
        for layer in &m.layers {
            let cache = match layer.self_attn {
                Some(_) => slots.next().flatten(),
                None => None,
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, TransformerBlock::run)?;
        }
        let out = m.norm.forward(&h)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: a `KVCache` for every layer with an attention block.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.num_attn_layers]
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    /// Drops `lm_head.weight` when the head is tied.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(weights)
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            if let Some(a) = &mut layer.self_attn {
                a.fuse()?;
            }
            if let Some(m) = &mut layer.mlp {
                m.fuse()?;
            }
        }
        Ok(())
    }
}
