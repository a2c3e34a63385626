//! Granite, following `mlx_lm/models/granite.py`: Llama's blocks with a scaled
//! embedding, attention scale, residual branches and logits.
use super::attention::{Attention, Extras};
use super::decoder::FeedForward;
use super::head::{self, LogitScale};
use super::llama;
use super::mlp::Mlp;
use super::{cache_at, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, Param, RmsNorm};
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

/// One decoder layer: `h = x + attn(norm(x)) * m`, `out = h + ff(norm(h)) * m`; the
/// feed-forward block (the SwiGLU `mlp`, or GraniteMoE's experts) is named `ff_name`.
#[derive(Debug)]
pub struct TransformerBlock<F> {
    self_attn: Attention,
    ff: F,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    residual_multiplier: f64,
    ff_name: &'static str,
}

impl<F: FeedForward> Module for TransformerBlock<F> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.self_attn.visit_params(&join(prefix, "self_attn"), f);
        self.ff.visit_params(&join(prefix, self.ff_name), f);
        self.input_layernorm
            .visit_params(&join(prefix, "input_layernorm"), f);
        self.post_attention_layernorm
            .visit_params(&join(prefix, "post_attention_layernorm"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.self_attn
            .visit_params_mut(&join(prefix, "self_attn"), f);
        self.ff.visit_params_mut(&join(prefix, self.ff_name), f);
        self.input_layernorm
            .visit_params_mut(&join(prefix, "input_layernorm"), f);
        self.post_attention_layernorm
            .visit_params_mut(&join(prefix, "post_attention_layernorm"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.self_attn
            .visit_quantizable_mut(&join(prefix, "self_attn"), f)?;
        self.ff
            .visit_quantizable_mut(&join(prefix, self.ff_name), f)
    }
}

impl<F: FeedForward> TransformerBlock<F> {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let r = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            None,
            Extras::default(),
        )?;
        let h = x.add(&r.multiply(self.residual_multiplier)?)?;
        let r = self
            .ff
            .forward(&self.post_attention_layernorm.forward(&h)?, None)?;
        h.add(&r.multiply(self.residual_multiplier)?)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct GraniteModel<F> {
    embed_tokens: EmbeddingLayer,
    pub(crate) layers: Vec<TransformerBlock<F>>,
    norm: RmsNorm,
    embedding_multiplier: f64,
}
impl<F: FeedForward> Module for GraniteModel<F> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.embed_tokens
            .visit_params(&join(prefix, "embed_tokens"), f);
        self.layers.visit_params(&join(prefix, "layers"), f);
        self.norm.visit_params(&join(prefix, "norm"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.embed_tokens
            .visit_params_mut(&join(prefix, "embed_tokens"), f);
        self.layers.visit_params_mut(&join(prefix, "layers"), f);
        self.norm.visit_params_mut(&join(prefix, "norm"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.embed_tokens
            .visit_quantizable_mut(&join(prefix, "embed_tokens"), f)?;
        self.layers
            .visit_quantizable_mut(&join(prefix, "layers"), f)
    }
}

impl<F: FeedForward> GraniteModel<F> {
    /// Granite's stack for `args`, each layer's feed-forward block made by `ff` and
    /// named `ff_name`.
    pub(crate) fn new(
        args: &ModelArgs,
        ff: impl Fn() -> crate::Result<F>,
        ff_name: &'static str,
    ) -> crate::Result<GraniteModel<F>> {
        let base = args.as_llama();
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: llama::attention(&base, Some(args.attention_multiplier), None)?,
                    ff: ff()?,
                    input_layernorm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
                    post_attention_layernorm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
                    residual_multiplier: args.residual_multiplier,
                    ff_name,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(GraniteModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, args.hidden_size)?,
            layers,
            norm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
            embedding_multiplier: args.embedding_multiplier,
        })
    }

    /// The normed hidden states of `inputs`.
    pub(crate) fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self
            .embed_tokens
            .forward(inputs)?
            .multiply(self.embedding_multiplier)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            h = layer.forward(&h, &mask, cache)?;
        }
        self.norm.forward(&h)
    }

    /// The head's logits for the normed hidden states `out`, over `logits_scaling`.
    pub(crate) fn logits(
        &self,
        lm_head: Option<&LinearLayer>,
        out: &Array,
        logits_scaling: f64,
    ) -> Result<Array> {
        head::logits(
            &self.embed_tokens,
            lm_head,
            out,
            LogitScale::Over(logits_scaling),
        )
    }

    /// Fuses every layer's q/k/v and feed-forward projections.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        for layer in &mut self.layers {
            layer.self_attn.fuse()?;
            layer.ff.fuse()?;
        }
        Ok(())
    }
}

/// Granite with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: GraniteModel<Mlp>,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, hidden) = (args.hidden_size, args.intermediate_size);
        let model = GraniteModel::new(&args, || Mlp::new(dim, hidden, args.mlp_bias), "mlp")?;
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
        self.model
            .logits(self.lm_head.as_ref(), &out, self.args.logits_scaling)
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
