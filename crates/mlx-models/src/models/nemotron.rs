//! Nemotron (Nemotron-3 / 4, Minitron), following `mlx_lm/models/nemotron.py`: pre-norm
//! layers with `1 + weight` layer norms, a partial RoPE (linear scaling only) and a
//! squared-ReLU feed-forward (`up_proj`, `down_proj`).
use super::config_error;
use super::lm::Stack;
use super::attention::{Attention, AttentionDims, Extras};
use super::head::{self, LogitScale};
use super::{project_out, Architecture};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::{
    activations, impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Param, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Nemotron.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    /// Required by mlx-lm, unused (the feed-forward is always squared ReLU).
    pub hidden_act: String,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_partial_rotary")]
    pub partial_rotary_factor: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_partial_rotary() -> f64 {
    0.5
}
fn default_rope_theta() -> f64 {
    10000.0
}

/// The RoPE position scale: `1 / factor` for mlx-lm's only accepted scaling, `linear`
/// (its `__post_init__` checks).
fn rope_scale(v: Option<&Value>) -> crate::Result<f64> {
    let Some(obj) = v.and_then(Value::as_object).filter(|o| !o.is_empty()) else {
        return Ok(1.0);
    };
    let factor = obj
        .get("factor")
        .ok_or_else(|| config_error("nemotron", "rope_scaling must contain 'factor'".into()))?;
    let ty = obj
        .get("type")
        .filter(|t| !t.is_null())
        .or_else(|| obj.get("rope_type").filter(|t| !t.is_null()))
        .ok_or_else(|| {
            config_error("nemotron", "rope_scaling must contain either 'type' or 'rope_type'".into())
        })?;
    if ty.as_str() != Some("linear") {
        return Err(config_error("nemotron", 
            "rope_scaling 'type' currently only supports 'linear'".into(),
        ));
    }
    if !factor.is_f64() {
        return Err(config_error("nemotron", "rope_scaling 'factor' must be a float".into()));
    }
    let f = factor.as_f64().unwrap_or(1.0);
    Ok(1.0 / f)
}

/// `NemotronLayerNorm1P`: `layer_norm(x, weight + 1, bias, eps)`.
#[derive(Debug)]
pub struct LayerNorm1P {
    weight: Param,
    bias: Param,
    eps: f32,
}
impl_module!(LayerNorm1P { weight, bias });

impl LayerNorm1P {
    fn new(dims: i32, eps: f64) -> crate::Result<LayerNorm1P> {
        Ok(LayerNorm1P {
            weight: Param::new(ops::ones(&[dims], Dtype::Float32)?),
            bias: Param::new(ops::zeros(&[dims], Dtype::Float32)?),
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let w = self.weight.add(1)?;
        fast::layer_norm(x, Some(&w), Some(&self.bias), self.eps)
    }
}

/// `down_proj(relu(up_proj(x))^2)`.
#[derive(Debug)]
pub struct Mlp {
    down_proj: LinearLayer,
    up_proj: LinearLayer,
}
impl_module!(Mlp { down_proj, up_proj });

/// One pre-norm layer.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: LayerNorm1P,
    post_attention_layernorm: LayerNorm1P,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            Some(x),
            Extras::default(),
        )?;
        let up = self
            .mlp
            .up_proj
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        project_out(&self.mlp.down_proj, &activations::relu2(&up)?, Some(&h))
    }
}

/// The decoder stack.
pub type NemotronModel = Stack<TransformerBlock, LayerNorm1P>;

/// Nemotron with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: NemotronModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        if args.vocab_size <= 0 {
            return Err(config_error("nemotron", "vocab_size must be positive".into()));
        }
        let scale = rope_scale(args.rope_scaling.as_ref())?;
        let (dim, eps) = (args.hidden_size, args.norm_eps);
        let n_heads = args.num_attention_heads;
        let head_dim = args
            .head_dim
            .filter(|&d| d != 0)
            .unwrap_or(dim / n_heads.max(1));
        let d = AttentionDims {
            dim,
            n_heads,
            n_kv_heads: args.num_key_value_heads,
            head_dim,
            qkv_bias: args.attention_bias,
            o_bias: args.attention_bias,
        };
        let rotary = (args.partial_rotary_factor * head_dim as f64) as i32;
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = Rope::new(rotary, false, args.rope_theta, scale);
                Ok(TransformerBlock {
                    self_attn: Attention::new(d, rope, (head_dim as f64).powf(-0.5))?,
                    mlp: Mlp {
                        down_proj: LinearLayer::new(args.intermediate_size, dim, args.mlp_bias)?,
                        up_proj: LinearLayer::new(dim, args.intermediate_size, args.mlp_bias)?,
                    },
                    input_layernorm: LayerNorm1P::new(dim, eps)?,
                    post_attention_layernorm: LayerNorm1P::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = NemotronModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: LayerNorm1P::new(dim, eps)?,
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
    Ok(Box::new(Model::new(parse_args(config, "nemotron")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let out = m.forward(tokens, caches, TransformerBlock::forward, LayerNorm1P::forward)?;
        head::logits(
            &m.embed_tokens,
            self.lm_head.as_ref(),
            &out,
            LogitScale::None,
        )
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
        }
        Ok(())
    }
}
