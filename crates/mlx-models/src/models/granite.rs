//! Granite, following `mlx_lm/models/granite.py`: Llama's blocks with a scaled
//! embedding, attention scale, residual branches and logits.
use super::decoder::{Decoder, DecoderLayer, FeedForward};
use super::head::{self, LogitScale};
use super::llama;
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, LinearLayer};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Granite (all but `rope_scaling` and `tie_word_embeddings`
/// required, as in mlx-lm).
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
    pub logits_scaling: f64,
    pub attention_multiplier: f64,
    pub embedding_multiplier: f64,
    pub residual_multiplier: f64,
    pub max_position_embeddings: i32,
    pub num_key_value_heads: i32,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "crate::config::default_true")]
    pub tie_word_embeddings: bool,
    /// Not a Granite key (its RoPE is never traditional): set by models built on
    /// Granite's layers whose own config has it (MiniCPM).
    #[serde(skip)]
    pub rope_traditional: bool,
}

impl ModelArgs {
    /// The Llama arguments that build the same attention and feed-forward layers (head
    /// size `hidden_size / num_attention_heads`, rotations not traditional).
    fn as_llama(&self) -> llama::ModelArgs {
        llama::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            head_dim: None,
            max_position_embeddings: Some(self.max_position_embeddings),
            num_key_value_heads: Some(self.num_key_value_heads),
            attention_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            rope_theta: self.rope_theta,
            rope_traditional: self.rope_traditional,
            rope_scaling: self.rope_scaling.clone(),
            tie_word_embeddings: self.tie_word_embeddings,
            layer_types: None,
            sliding_window: None,
        }
    }
}

/// Granite's stack on the shared [`Decoder`]: embeddings times
/// `embedding_multiplier`, each residual branch times `residual_multiplier`, attention
/// scaled by `attention_multiplier`; each layer's feed-forward block (the SwiGLU `mlp`,
/// or GraniteMoE's experts) made by `ff` and named `ff_name`.
pub(crate) fn decoder<F: FeedForward + 'static>(
    args: &ModelArgs,
    ff: impl Fn() -> crate::Result<F>,
    ff_name: &'static str,
) -> crate::Result<Decoder<F>> {
    let base = args.as_llama();
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let layers = (0..args.num_hidden_layers)
        .map(|_| {
            let attn = llama::attention(&base, Some(args.attention_multiplier), None)?;
            Ok(DecoderLayer::new(attn, ff()?, ff_name, dim, eps)?
                .with_residual_scale(args.residual_multiplier))
        })
        .collect::<crate::Result<Vec<_>>>()?;
    Ok(Decoder::new(args.vocab_size, dim, eps, layers)?
        .with_embedding_scale(args.embedding_multiplier))
}

/// Granite with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Decoder<Mlp>,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, hidden) = (args.hidden_size, args.intermediate_size);
        let model = decoder(&args, || Mlp::new(dim, hidden, args.mlp_bias), "mlp")?;
        let lm_head = head::untied(args.tie_word_embeddings, args.hidden_size, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "granite")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let scale = LogitScale::Over(self.args.logits_scaling);
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, scale)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
