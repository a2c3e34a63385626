//! GraniteMoE, following `mlx_lm/models/granitemoe.py`: Granite's scaled layers
//! (granite.rs) with a `block_sparse_moe` of SwitchGLU experts instead of the MLP,
//! softmax over the top-k router logits in float32.
use super::decoder::Decoder;
use super::decoder::{add_residual, FeedForward};
use super::granite;
use super::head::{self, LogitScale};
use super::{top_k_indices, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::{impl_module, KvCache, LinearLayer, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GraniteMoE (all but `rope_scaling` and
/// `tie_word_embeddings` required, as in mlx-lm).
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
    pub rope_theta: f64,
    pub num_local_experts: i32,
    pub num_experts_per_tok: i32,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "crate::config::default_true")]
    pub tie_word_embeddings: bool,
}

impl ModelArgs {
    /// The Granite arguments of the same attention, norms and multipliers.
    fn as_granite(&self) -> granite::ModelArgs {
        granite::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            logits_scaling: self.logits_scaling,
            attention_multiplier: self.attention_multiplier,
            embedding_multiplier: self.embedding_multiplier,
            residual_multiplier: self.residual_multiplier,
            max_position_embeddings: self.max_position_embeddings,
            num_key_value_heads: self.num_key_value_heads,
            attention_bias: self.attention_bias,
            mlp_bias: false,
            rope_theta: self.rope_theta,
            rope_scaling: self.rope_scaling.clone(),
            tie_word_embeddings: self.tie_word_embeddings,
            rope_traditional: false,
        }
    }
}

/// The top-k gating layer.
#[derive(Debug)]
pub struct Router {
    layer: LinearLayer,
}
impl_module!(Router { layer });

/// Routed SwitchGLU experts.
#[derive(Debug)]
pub struct GraniteMoeMoe {
    switch_mlp: SwitchGlu,
    router: Router,
    top_k: i32,
}
impl_module!(GraniteMoeMoe { switch_mlp, router });

impl FeedForward for GraniteMoeMoe {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let logits = self.router.layer.forward(x)?;
        let idx = top_k_indices(&logits, self.top_k)?;
        let gates = logits
            .take_along_axis(&idx, -1)?
            .astype(Dtype::Float32)?
            .softmax(Some(&[-1]), false)?;
        let y = self.switch_mlp.forward(x, &idx)?;
        let dtype = y.dtype();
        let r = y
            .multiply(&gates.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?
            .astype(dtype)?;
        add_residual(r, residual)
    }
}

/// GraniteMoE with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Decoder<GraniteMoeMoe>,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, experts) = (args.hidden_size, args.num_local_experts);
        let moe = || {
            Ok(GraniteMoeMoe {
                switch_mlp: SwitchGlu::new(dim, args.intermediate_size, experts, false)?,
                router: Router {
                    layer: LinearLayer::new(dim, experts, false)?,
                },
                top_k: args.num_experts_per_tok,
            })
        };
        let model = granite::decoder(&args.as_granite(), moe, "block_sparse_moe")?;
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
    Ok(Box::new(Model::new(parse_args(config, "granitemoe")?)?))
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

fn take(weights: &mut Weights, key: &str) -> crate::Result<Array> {
    weights.remove(key).ok_or_else(|| crate::Error::Weights {
        path: "model weights".into(),
        message: format!("missing tensor `{key}`"),
    })
}

impl Architecture for Model {
    /// HF's `input_linear` (gate and up, concatenated on axis 1) and `output_linear`
    /// become `switch_mlp`'s projections; a tied head's `lm_head.weight` is dropped.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if !weights.contains_key("model.layers.0.block_sparse_moe.input_linear.weight") {
            return Ok(weights);
        }
        for l in 0..self.args.num_hidden_layers {
            let prefix = format!("model.layers.{l}.block_sparse_moe");
            let input = take(&mut weights, &format!("{prefix}.input_linear.weight"))?;
            let mut parts = input.split_sections(2, 1)?.into_iter();
            let (Some(gate), Some(up)) = (parts.next(), parts.next()) else {
                return Err(crate::Error::Weights {
                    path: "model weights".into(),
                    message: format!("`{prefix}.input_linear.weight` does not split in two"),
                });
            };
            weights.insert(format!("{prefix}.switch_mlp.gate_proj.weight"), gate);
            weights.insert(format!("{prefix}.switch_mlp.up_proj.weight"), up);
            let down = take(&mut weights, &format!("{prefix}.output_linear.weight"))?;
            weights.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
        }
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
