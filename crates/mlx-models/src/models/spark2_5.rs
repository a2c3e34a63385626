//! Spark 2.5 (`spark2_5`), following `mlx_lm/models/spark2_5.py`: pre-norm layers
//! (`nn.RMSNorm`) over `model.embedding`; attention from one `q_k_v_proj` (query, key,
//! value heads in turn; biases by `attention_bias`), `nn.RoPE` of
//! `head_dim * partial_rotary_factor` dimensions at `rope_theta`, both from the layer
//! type's entry of `rope_parameters`, each head of the output times its own
//! `sigmoid(g_proj(x))` (taken in float32) before `out_proj`; `layer_types` (default
//! three `sliding_attention` then a `full_attention`) choosing a
//! `RotatingKVCache(sliding_window)` and the windowed mask or a `KVCache`; a
//! `gelu(gate) * up` MLP (biases by `mlp_bias`); the head tied by `tie_word_embeddings`
//! (default). `sanitize` renames `model.embed_tokens` to `model.embedding` where only
//! the former is there, drops a tied `lm_head` and the rotary buffers. mlx-lm's
//! `quant_predicate` keeps `g_proj` dense (in mlx-quant).
use super::attention::{Attention, AttentionDims, OutGate};
use super::config_error;
use super::head::{self, LogitScale};
use super::lm::drop_tied_head;
use super::mlp::Mlp;
use super::{layer_caches, Architecture, LayerMasks, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::activations::gelu;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

const SLIDING: &str = "sliding_attention";
const FULL: &str = "full_attention";

/// config.json keys read by Spark 2.5.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub vocab_size: i32,
    pub sliding_window: i32,
    pub rope_parameters: BTreeMap<String, Map<String, Value>>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_gate_mode")]
    pub gate_attn_act_mode: String,
    #[serde(default = "default_true")]
    pub headwise_attn_output_gate: bool,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_act() -> String {
    "gelu".into()
}
fn default_gate_mode() -> String {
    "sigmoid".into()
}
fn default_true() -> bool {
    true
}

/// A layer type's RoPE: (dimensions, base).
type RopeSpec = (i32, f64);

/// `__post_init__`'s defaults and checks: the layer types (default three sliding, one
/// full) and each type's RoPE from `rope_parameters`.
fn layer_plan(args: &ModelArgs) -> crate::Result<Vec<(bool, RopeSpec)>> {
    let err = |m: String| config_error("spark2_5", m);
    let n = usize::try_from(args.num_hidden_layers)
        .map_err(|_| err("key `num_hidden_layers` must not be negative".into()))?;
    let types: Vec<String> = match &args.layer_types {
        Some(t) => t.clone(),
        None => (0..n)
            .map(|i| if i % 4 == 3 { FULL } else { SLIDING }.to_string())
            .collect(),
    };
    if types.len() != n {
        return Err(err(format!(
            "`layer_types` length must match `num_hidden_layers`: {} != {n}",
            types.len()
        )));
    }
    if let Some(t) = types.iter().find(|t| *t != SLIDING && *t != FULL) {
        return Err(err(format!("unsupported layer type {t:?} in `layer_types`")));
    }
    let (heads, kv_heads) = (args.num_attention_heads, args.num_key_value_heads);
    if kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(err(format!(
            "`num_attention_heads` ({heads}) must be divisible by `num_key_value_heads` \
             ({kv_heads})"
        )));
    }
    if heads <= 0 || args.head_dim <= 0 {
        return Err(err(
            "`num_attention_heads` * `head_dim` must be positive".into()
        ));
    }
    let number = |params: &Map<String, Value>, key: &str, default: f64, t: &str| match params
        .get(key)
    {
        None => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| {
            err(format!("key `rope_parameters.{t}.{key}` must be a number, got {v}"))
        }),
    };
    let mut ropes: BTreeMap<&str, RopeSpec> = BTreeMap::new();
    for t in &types {
        if ropes.contains_key(t.as_str()) {
            continue;
        }
        let params = args
            .rope_parameters
            .get(t)
            .ok_or_else(|| err(format!("`rope_parameters` has no entry for layer type {t:?}")))?;
        let factor = number(params, "partial_rotary_factor", 1.0, t)?;
        let dims = (f64::from(args.head_dim) * factor) as i32;
        if dims <= 0 || dims > args.head_dim || dims % 2 != 0 {
            return Err(err(format!(
                "invalid rotary dimension {dims} for {t} with head_dim={} \
                 (`rope_parameters.{t}.partial_rotary_factor`)",
                args.head_dim
            )));
        }
        ropes.insert(t, (dims, number(params, "rope_theta", 10000.0, t)?));
    }
    if args.hidden_act != "gelu" {
        return Err(err(format!(
            "`hidden_act` must be \"gelu\", got {:?}",
            args.hidden_act
        )));
    }
    if !args.headwise_attn_output_gate {
        return Err(err(
            "`headwise_attn_output_gate` must be true (head-wise attention output gates)".into(),
        ));
    }
    if args.gate_attn_act_mode != "sigmoid" {
        return Err(err(format!(
            "`gate_attn_act_mode` must be \"sigmoid\", got {:?}",
            args.gate_attn_act_mode
        )));
    }
    if args.sliding_window <= 0 && types.iter().any(|t| t == SLIDING) {
        return Err(err(format!(
            "key `sliding_window` ({}) must be positive",
            args.sliding_window
        )));
    }
    Ok(types
        .iter()
        .map(|t| (t == SLIDING, ropes[t.as_str()]))
        .collect())
}

/// `TransformerBlock`.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    sliding: bool,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            Some(x),
            Default::default(),
        )?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// `Spark2_5Model`.
#[derive(Debug)]
pub struct Spark2_5Model {
    embedding: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
}
impl_module!(Spark2_5Model {
    embedding,
    layers,
    norm
});

/// Spark 2.5 with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Spark2_5Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let plan = layer_plan(&args)?;
        let (dim, eps, head_dim) = (args.hidden_size, args.rms_norm_eps, args.head_dim);
        let bias = args.attention_bias;
        let layers = plan
            .into_iter()
            .map(|(sliding, (dims, base))| {
                let d = AttentionDims {
                    dim,
                    n_heads: args.num_attention_heads,
                    n_kv_heads: args.num_key_value_heads,
                    head_dim,
                    qkv_bias: bias,
                    o_bias: bias,
                };
                let rope = Rope::new(dims, false, base, 1.0);
                let scale = f64::from(head_dim).powf(-0.5);
                let self_attn = Attention::new_joint_qkv(d, "q_k_v_proj", rope, scale)?
                    .with_out_name("out_proj")
                    .with_output_gate("g_proj", dim, bias, OutGate::PerHeadF32)?;
                Ok(TransformerBlock {
                    self_attn,
                    mlp: Mlp::new(dim, args.intermediate_size, args.mlp_bias)?
                        .up_before_down()
                        .with_activation(gelu),
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    sliding,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Spark2_5Model {
            embedding: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
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
    Ok(Box::new(Model::new(parse_args(config, "spark2_5")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embedding.forward(tokens)?;
        let n = h.dim(1)?;
        let full_idx = m.layers.iter().position(|l| !l.sliding).unwrap_or(0);
        let swa_idx = m.layers.iter().position(|l| l.sliding);
        let masks = LayerMasks::new(n, caches, full_idx, swa_idx, Some(self.args.sliding_window))?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            let mask = masks.get(layer.sliding);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        let out = m.norm.forward(&h)?;
        head::logits(&m.embedding, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: a `RotatingKVCache(sliding_window)` for each sliding layer, a
    /// `KVCache` for each full one.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| l.sliding);
        super::window_cache_specs(sliding, self.args.sliding_window)
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if !weights.contains_key("model.embedding.weight") {
            if let Some(w) = weights.remove("model.embed_tokens.weight") {
                weights.insert("model.embedding.weight".into(), w);
            }
        }
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.contains("rotary_emb.inv_freq"))
            .collect())
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}
