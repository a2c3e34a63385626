//! MiniCPM, following `mlx_lm/models/minicpm.py`: Granite's scaled layers (granite.rs:
//! embedding times `scale_emb`, each residual branch times
//! `scale_depth / sqrt(num_hidden_layers)`), the untied head reading the hidden states
//! divided by `hidden_size / dim_model_base`.
use super::config_error;
use super::decoder::Decoder;
use super::granite;
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, LinearLayer};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by MiniCPM.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub dim_model_base: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub scale_depth: f64,
    pub scale_emb: f64,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    1000000.0
}

impl ModelArgs {
    /// Granite's arguments for the same layers.
    fn as_granite(&self) -> crate::Result<granite::ModelArgs> {
        let scaling = rope_scaling(self.rope_scaling.as_ref())?;
        let needs_max = scaling
            .as_ref()
            .is_some_and(|s| matches!(s.rope_type.as_str(), "dynamic" | "longrope"));
        let max_pos = match self.max_position_embeddings {
            Some(m) => m,
            None if needs_max => {
                return Err(config_error("minicpm", 
                    "key `max_position_embeddings` is needed by its rope_scaling".into(),
                ))
            }
            None => 0,
        };
        let head_dim = self.hidden_size / self.num_attention_heads.max(1);
        Ok(granite::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            logits_scaling: self.hidden_size as f64 / self.dim_model_base as f64,
            attention_multiplier: (head_dim as f64).powf(-0.5),
            embedding_multiplier: self.scale_emb,
            residual_multiplier: self.scale_depth / (self.num_hidden_layers as f64).powf(0.5),
            max_position_embeddings: max_pos,
            num_key_value_heads: self.num_key_value_heads,
            attention_bias: false,
            mlp_bias: false,
            rope_theta: self.rope_theta,
            rope_scaling: self.rope_scaling.clone(),
            tie_word_embeddings: self.tie_word_embeddings,
            rope_traditional: self.rope_traditional,
        })
    }
}

/// MiniCPM with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    head_divisor: f64,
    model: Decoder<Mlp>,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        if args.vocab_size <= 0 {
            return Err(config_error("minicpm", "vocab_size must be positive".into()));
        }
        let g = args.as_granite()?;
        let (dim, hidden) = (args.hidden_size, args.intermediate_size);
        let model = granite::decoder(&g, || Ok(Mlp::new(dim, hidden, false)?.up_before_down()), "mlp")?;
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            head_divisor: g.logits_scaling,
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "minicpm")?)?))
}

impl LanguageModel for Model {
    /// Untied: `lm_head(out / (hidden_size / dim_model_base))`; tied:
    /// `out @ embed_tokens.weight.T` (the embedding read as a linear layer).
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        match &self.lm_head {
            Some(head) => head.forward(&out.divide(self.head_divisor)?),
            None => head::logits(&self.model.embed_tokens, None, &out, LogitScale::None),
        }
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// mlx-lm copies the embedding into a missing `lm_head.weight` (so a tied checkpoint,
    /// whose model has no `lm_head`, is refused at load as in mlx-lm's strict loading).
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if !weights.contains_key("lm_head.weight") {
            if let Some(e) = weights.get("model.embed_tokens.weight").cloned() {
                weights.insert("lm_head.weight".into(), e);
            }
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
