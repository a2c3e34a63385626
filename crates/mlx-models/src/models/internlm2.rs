//! InternLM2, following `mlx_lm/models/internlm2.py`: Llama-shaped layers whose q, k
//! and v come from one `wqkv` projection laid out per key-value group
//! (`[q x groups, k, v]` for each group), named `attention` / `feed_forward`
//! (`w1`, `w3`, `w2`) with `tok_embeddings` and an `output` head.
use super::config_error;
use super::mlp::Mlp;
use super::{cache_at, layer_caches, merge_heads, rope_attend, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by InternLM2.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default = "crate::config::default_true")]
    pub bias: bool,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: i32,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_max_pos() -> i32 {
    32768
}
fn default_rope_theta() -> f64 {
    10000.0
}

/// mlx-lm's `__post_init__` check: a non-empty `rope_scaling` has `factor` and a
/// `type` of `linear` or `dynamic`.
fn check_rope_scaling(v: Option<&Value>) -> crate::Result<()> {
    let Some(obj) = v.and_then(Value::as_object).filter(|o| !o.is_empty()) else {
        return Ok(());
    };
    if !obj.contains_key("factor") || !obj.contains_key("type") {
        return Err(config_error("internlm2", 
            "rope_scaling must contain keys {'factor', 'type'}".into(),
        ));
    }
    match obj["type"].as_str() {
        Some("linear" | "dynamic") => Ok(()),
        _ => Err(config_error("internlm2", 
            "rope_scaling 'type' currently only supports 'linear' or 'dynamic'".into(),
        )),
    }
}

/// Attention over the grouped `wqkv` projection.
#[derive(Debug)]
pub struct Attention {
    wqkv: LinearLayer,
    wo: LinearLayer,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f64,
}
impl_module!(Attention { wqkv, wo });

impl Attention {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let groups = self.n_heads / self.n_kv_heads;
        let qkv = self
            .wqkv
            .forward(x)?
            .reshape(&[b, l, -1, 2 + groups, self.head_dim])?;
        let queries = qkv
            .slice_axis(3, 0, groups)?
            .reshape(&[b, l, -1, self.head_dim])?;
        let keys = qkv.slice_axis(3, groups, groups + 1)?.squeeze(Some(&[3]))?;
        let values = qkv
            .slice_axis(3, groups + 1, groups + 2)?
            .squeeze(Some(&[3]))?;
        let t = |a: &Array, n: i32| a.reshape(&[b, l, n, -1])?.transpose(Some(&[0, 2, 1, 3]));
        let queries = t(&queries, self.n_heads)?;
        let keys = t(&keys, self.n_kv_heads)?;
        let values = t(&values, self.n_kv_heads)?;
        let out = rope_attend(&queries, &keys, values, &self.rope, cache, self.scale, mask)?;
        self.wo.forward(&merge_heads(&out, b, l)?)
    }
}

/// One pre-norm layer.
#[derive(Debug)]
pub struct TransformerBlock {
    attention: Attention,
    feed_forward: Mlp,
    attention_norm: RmsNorm,
    ffn_norm: RmsNorm,
}
impl_module!(TransformerBlock {
    attention,
    feed_forward,
    attention_norm,
    ffn_norm
});

/// The decoder stack.
#[derive(Debug)]
pub struct InternLm2Model {
    tok_embeddings: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
}
impl_module!(InternLm2Model {
    tok_embeddings,
    layers,
    norm
});

/// InternLM2 with its `output` head (or the tied embedding).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: InternLm2Model,
    output: Option<LinearLayer>,
}
impl_module!(Model { model, output });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        check_rope_scaling(args.rope_scaling.as_ref())?;
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        if args.vocab_size <= 0 {
            return Err(config_error("internlm2", "vocab_size must be positive".into()));
        }
        let n_heads = args.num_attention_heads;
        let n_kv_heads = args.num_key_value_heads.unwrap_or(n_heads);
        if n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads != 0 {
            return Err(config_error("internlm2", format!(
                "num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads \
                 ({n_kv_heads})"
            )));
        }
        let head_dim = dim / n_heads;
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = initialize_rope(
                    head_dim,
                    args.rope_theta,
                    args.rope_traditional,
                    rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
                    Some(args.max_position_embeddings),
                )?;
                Ok(TransformerBlock {
                    attention: Attention {
                        wqkv: LinearLayer::new(
                            dim,
                            (n_heads + 2 * n_kv_heads) * head_dim,
                            args.bias,
                        )?,
                        wo: LinearLayer::new(n_heads * head_dim, dim, args.bias)?,
                        rope,
                        n_heads,
                        n_kv_heads,
                        head_dim,
                        scale: (head_dim as f64).powf(-0.5),
                    },
                    feed_forward: Mlp::new(dim, args.intermediate_size, false)?
                        .with_names("w1", "w3", "w2"),
                    attention_norm: RmsNorm::new(dim, eps)?,
                    ffn_norm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = InternLm2Model {
            tok_embeddings: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        let output = super::head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            output,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "internlm2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.tok_embeddings.forward(tokens)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |layer, h, mask, cache| {
                let r = layer
                    .attention
                    .forward(&layer.attention_norm.forward(h)?, mask, cache)?;
                let hh = h.add(&r)?;
                layer
                    .feed_forward
                    .forward(&layer.ffn_norm.forward(&hh)?, Some(&hh))
            })?;
        }
        let out = m.norm.forward(&h)?;
        super::head::logits(
            &m.tok_embeddings,
            self.output.as_ref(),
            &out,
            super::head::LogitScale::None,
        )
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Drops the precomputed rotary frequencies (`attention.rope.inv_freq`).
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.contains("attention.rope.inv_freq"))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.feed_forward.fuse()?;
        }
        Ok(())
    }
}
