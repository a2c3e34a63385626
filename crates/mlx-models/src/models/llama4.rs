//! Llama 4 (`llama4`), text model only, following `mlx_lm/models/llama4.py`: the
//! `text_config` model under `language_model`. Every fourth layer is global (no RoPE,
//! attention temperature tuning, a plain `KVCache`); the others rotate q/k, may
//! rms-normalize them, and attend within chunks of `attention_chunk_size` positions
//! (a `ChunkedKVCache`). Every `interleave_moe_layer_step`-th layer is a top-1
//! sigmoid-gated MoE with a shared expert; the others a SwiGLU MLP.
use super::{batch_len, cache_at, layer_caches, merge_heads, project, split_heads};
use super::{mlp::Mlp, top_k_indices_of_negated, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, initialize_rope, scaled_dot_product_attention, AttnMask, EmbeddingLayer,
    KvCache, KvFetch, LinearLayer, Module, RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// `text_config` keys read by Llama 4 (those without a default are required, as in
/// mlx-lm's `TextArgs`).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct TextArgs {
    pub attention_bias: bool,
    pub attention_chunk_size: i32,
    pub head_dim: Option<i32>,
    pub hidden_size: i32,
    pub interleave_moe_layer_step: i32,
    pub intermediate_size: i32,
    pub intermediate_size_mlp: i32,
    pub max_position_embeddings: i32,
    pub model_type: String,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub num_local_experts: i32,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    pub rope_theta: f64,
    pub use_qk_norm: bool,
    pub vocab_size: i32,
    /// An int (mlx-lm's default 4) or a bool in HF configs: only its truth counts.
    #[serde(default = "default_tuning")]
    pub attn_temperature_tuning: Value,
    #[serde(default = "default_floor_scale")]
    pub floor_scale: f64,
    #[serde(default = "default_attn_scale")]
    pub attn_scale: f64,
}

fn default_tuning() -> Value {
    Value::from(4)
}
fn default_floor_scale() -> f64 {
    8192.0
}
fn default_attn_scale() -> f64 {
    0.1
}

/// Python's truth value of a JSON config entry.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// config.json keys of the multimodal checkpoint.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub text_config: TextArgs,
}

fn config_err(message: String) -> crate::Error {
    crate::Error::Config {
        path: "config.json (llama4)".into(),
        message,
    }
}

/// Whether layer `i` uses RoPE and chunked attention (mlx-lm: `(i + 1) % 4 != 0`).
fn is_local(i: usize) -> bool {
    !(i + 1).is_multiple_of(4)
}

/// Self-attention of one layer.
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    /// `None` on the global (NoPE) layers.
    rope: Option<Rope>,
    use_qk_norm: bool,
    /// `attn_temperature_tuning` is set and the layer has no RoPE.
    tune: bool,
    floor_scale: f64,
    attn_scale: f64,
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
    fn new(a: &TextArgs, layer: usize) -> crate::Result<Attention> {
        let (dim, n, nkv) = (a.hidden_size, a.num_attention_heads, a.num_key_value_heads);
        let hd = a.head_dim.filter(|&d| d > 0).unwrap_or(dim / n);
        let bias = a.attention_bias;
        let use_rope = is_local(layer);
        let rope = if use_rope {
            Some(initialize_rope(
                hd,
                a.rope_theta,
                true,
                rope_scaling(a.rope_scaling.as_ref())?.as_ref(),
                Some(a.max_position_embeddings),
            )?)
        } else {
            None
        };
        Ok(Attention {
            q_proj: LinearLayer::new(dim, n * hd, bias)?,
            k_proj: LinearLayer::new(dim, nkv * hd, bias)?,
            v_proj: LinearLayer::new(dim, nkv * hd, bias)?,
            o_proj: LinearLayer::new(n * hd, dim, bias)?,
            rope,
            use_qk_norm: a.use_qk_norm && use_rope,
            tune: truthy(&a.attn_temperature_tuning) && !use_rope,
            floor_scale: a.floor_scale,
            attn_scale: a.attn_scale,
            n_heads: n,
            n_kv_heads: nkv,
            scale: (hd as f64).powf(-0.5),
        })
    }

    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let [q, k, v] = project(None, [&self.q_proj, &self.k_proj, &self.v_proj], x)?;
        let mut queries = split_heads(&q, b, l, self.n_heads)?;
        let mut keys = split_heads(&k, b, l, self.n_kv_heads)?;
        let values = split_heads(&v, b, l, self.n_kv_heads)?;
        let offset = cache.as_ref().map_or(0, |c| c.offset());
        if let Some(rope) = &self.rope {
            queries = rope.forward(&queries, offset)?;
            keys = rope.forward(&keys, offset)?;
        }
        if self.use_qk_norm {
            queries = fast::rms_norm(&queries, None, 1e-6)?;
            keys = fast::rms_norm(&keys, None, 1e-6)?;
        }
        if self.tune {
            // log(floor(arange(offset + 1, offset + L + 1) / floor_scale) + 1) * attn_scale + 1
            let pos = ops::arange((offset + 1) as f64, (offset + l + 1) as f64, 1.0, Dtype::Int32)?;
            let scales = pos
                .divide(self.floor_scale)?
                .floor()?
                .add(1.0)?
                .log()?
                .multiply(self.attn_scale)?
                .add(1.0)?
                .expand_dims(&[1])?;
            queries = queries.multiply(&scales)?.astype(queries.dtype())?;
        }
        let fetch = match cache {
            Some(c) => mlx_nn::pipeline::update_and_fetch(c, &keys, &values)?,
            None => KvFetch::Plain { keys, values },
        };
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        self.o_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// Top-1 sigmoid-gated experts plus a shared expert.
#[derive(Debug)]
pub struct MoE {
    experts: SwitchGlu,
    router: LinearLayer,
    shared_expert: Mlp,
}
impl_module!(MoE {
    experts,
    router,
    shared_expert
});

impl MoE {
    fn forward(&self, x: &Array) -> Result<Array> {
        let logits = self.router.forward(x)?;
        let indices = top_k_indices_of_negated(&logits, 1)?;
        let scores = logits
            .take_along_axis(&indices, -1)?
            .astype(Dtype::Float32)?
            .sigmoid()?
            .astype(x.dtype())?;
        let out = self
            .experts
            .forward(&x.multiply(&scores)?, &indices)?
            .squeeze(Some(&[2]))?;
        out.add(&self.shared_expert.forward(x, None)?)
    }
}

/// A layer's feed-forward block: the MoE or a dense MLP.
#[derive(Debug)]
pub enum FeedForward {
    /// `MoE(args)`.
    Moe(Box<MoE>),
    /// `MLP(args, intermediate_size_mlp)`.
    Dense(Box<Mlp>),
}

enum_module!(FeedForward {
    Moe => "",
    Dense => "",
});

/// One decoder layer.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    feed_forward: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(TransformerBlock {
    self_attn,
    feed_forward,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        let h = x.add(&r)?;
        let n = self.post_attention_layernorm.forward(&h)?;
        let r = match &self.feed_forward {
            FeedForward::Moe(m) => m.forward(&n)?,
            FeedForward::Dense(m) => m.forward(&n, None)?,
        };
        h.add(&r)
    }
}

/// The decoder stack (`language_model.model`).
#[derive(Debug)]
pub struct LlamaModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
}
impl_module!(LlamaModel {
    embed_tokens,
    layers,
    norm
});

/// The text model with its head (`language_model`).
#[derive(Debug)]
pub struct TextModel {
    model: LlamaModel,
    lm_head: LinearLayer,
}
impl_module!(TextModel { model, lm_head });

/// Llama 4's text model as mlx-lm loads it.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    language_model: TextModel,
}
impl_module!(Model { language_model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let a = &args.text_config;
        if a.vocab_size <= 0 {
            return Err(config_err(format!("key `text_config.vocab_size` must be positive, got {}", a.vocab_size)));
        }
        if a.num_hidden_layers < 4 {
            // mlx-lm takes the global mask from layer 3's cache (an IndexError below 4).
            return Err(config_err(format!(
                "key `text_config.num_hidden_layers`: Llama 4 needs at least 4 layers (its global \
                 attention mask comes from layer 3), got {}",
                a.num_hidden_layers
            )));
        }
        if a.num_experts_per_tok != 1 {
            return Err(config_err(format!(
                "key `text_config.num_experts_per_tok`: only 1 expert per token is supported \
                 (as in mlx-lm), got {}",
                a.num_experts_per_tok
            )));
        }
        if a.interleave_moe_layer_step <= 0 || a.attention_chunk_size <= 0 {
            return Err(config_err(format!(
                "keys `text_config.interleave_moe_layer_step` ({}) and `attention_chunk_size` ({}) \
                 must be positive",
                a.interleave_moe_layer_step, a.attention_chunk_size
            )));
        }
        let (dim, eps) = (a.hidden_size, a.rms_norm_eps);
        let step = a.interleave_moe_layer_step as usize;
        let layers = (0..a.num_hidden_layers as usize)
            .map(|i| {
                let feed_forward = if i % step == step - 1 {
                    FeedForward::Moe(Box::new(MoE {
                        experts: SwitchGlu::new(dim, a.intermediate_size, a.num_local_experts, false)?,
                        router: LinearLayer::new(dim, a.num_local_experts, false)?,
                        shared_expert: Mlp::new(dim, a.intermediate_size, false)?,
                    }))
                } else {
                    FeedForward::Dense(Box::new(Mlp::new(dim, a.intermediate_size_mlp, false)?))
                };
                Ok(TransformerBlock {
                    self_attn: Attention::new(a, i)?,
                    feed_forward,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let language_model = TextModel {
            model: LlamaModel {
                embed_tokens: EmbeddingLayer::new(a.vocab_size, dim)?,
                layers,
                norm: RmsNorm::new(dim, eps)?,
            },
            lm_head: LinearLayer::new(dim, a.vocab_size, false)?,
        };
        Ok(Model {
            args,
            language_model,
        })
    }

    /// mlx-lm's chunk mask: key positions `start..end` against query positions
    /// `offset..end`, true within the query's chunk and not in its future.
    fn chunk_mask(&self, start: i32, offset: i32, end: i32) -> Result<Array> {
        let cs = self.args.text_config.attention_chunk_size;
        let linds = ops::arange(start as f64, end as f64, 1.0, Dtype::Int32)?;
        let rinds = ops::arange(offset as f64, end as f64, 1.0, Dtype::Int32)?.expand_dims(&[1])?;
        let block_pos = linds
            .floor_divide(cs)?
            .subtract(&rinds.floor_divide(cs)?)?
            .abs()?;
        let token_pos = linds.less_equal(&rinds)?;
        block_pos.equal(0)?.logical_and(&token_pos)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "llama4")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.language_model.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let (start, offset) = match caches.first() {
            Some(_) => {
                for (i, c) in caches.iter_mut().enumerate() {
                    if is_local(i) {
                        c.maybe_trim_front()?;
                    }
                }
                (caches[0].start_position(), caches[0].offset())
            }
            None => (0, 0),
        };
        let end = offset + h.dim(1)?;
        let chunk_mask = AttnMask::Array(self.chunk_mask(start, offset, end)?);
        let global_mask = create_attention_mask(h.dim(1)?, cache_at(caches, 3), None, false)?;
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let mask = if is_local(i) { &chunk_mask } else { &global_mask };
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        let out = m.norm.forward(&h)?;
        self.language_model.lm_head.forward(&out)
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        let chunk_size = self.args.text_config.attention_chunk_size;
        (0..self.language_model.model.layers.len())
            .map(|i| {
                if is_local(i) {
                    CacheSpec::Chunked { chunk_size }
                } else {
                    CacheSpec::Standard
                }
            })
            .collect()
    }
    fn model_type(&self) -> &str {
        &self.args.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.args.text_config.vocab_size
    }
    fn num_layers(&self) -> usize {
        self.language_model.model.layers.len()
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
}

impl Architecture for Model {
    /// Drops the vision weights and splits each layer's HF expert tensors
    /// (`experts.gate_up_proj` `[E, D, 2I]`, `experts.down_proj` `[E, I, D]`) into
    /// SwitchGLU's `[E, out, in]` weights.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights: Weights = weights
            .into_iter()
            .filter(|(k, _)| !k.contains("vision_model") && !k.contains("multi_modal_projector"))
            .collect();
        for l in 0..self.args.text_config.num_hidden_layers {
            let prefix = format!("language_model.model.layers.{l}.feed_forward.experts");
            if let Some(v) = weights.remove(&format!("{prefix}.gate_up_proj")) {
                let parts = v.split_sections(2, -1)?;
                let [gate, up] = <[Array; 2]>::try_from(parts).map_err(|_| crate::Error::Weights {
                    path: "model weights".into(),
                    message: format!("`{prefix}.gate_up_proj` does not split in two"),
                })?;
                weights.insert(format!("{prefix}.gate_proj.weight"), gate.swapaxes(1, 2)?);
                weights.insert(format!("{prefix}.up_proj.weight"), up.swapaxes(1, 2)?);
            }
            if let Some(v) = weights.remove(&format!("{prefix}.down_proj")) {
                weights.insert(format!("{prefix}.down_proj.weight"), v.swapaxes(1, 2)?);
            }
        }
        Ok(weights)
    }
}
