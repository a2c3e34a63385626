//! Mixtral, following `mlx_lm/models/mixtral.py` (Llama attention, top-k routed
//! SwitchGLU experts with softmax over the chosen logits).
use super::attention::{Attention, Extras};
use super::llama;
use super::top_k_indices_of_negated;
use super::{cache_at, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Mixtral (every key has mlx-lm's default).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
#[serde(default)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_key_value_heads: Option<i32>,
    pub num_local_experts: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_traditional: bool,
    pub tie_word_embeddings: bool,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: String::new(),
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_experts_per_tok: 2,
            num_key_value_heads: Some(8),
            num_local_experts: 8,
            rms_norm_eps: 1e-5,
            rope_theta: 1e6,
            rope_traditional: false,
            tie_word_embeddings: false,
        }
    }
}

impl ModelArgs {
    /// Llama attention arguments with a plain RoPE, as `MixtralAttention` builds it.
    fn attention_args(&self) -> super::llama::ModelArgs {
        super::llama::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            head_dim: None,
            max_position_embeddings: None,
            num_key_value_heads: Some(self.num_key_value_heads.unwrap_or(self.num_attention_heads)),
            attention_bias: false,
            mlp_bias: false,
            rope_theta: self.rope_theta,
            rope_traditional: self.rope_traditional,
            rope_scaling: None,
            tie_word_embeddings: self.tie_word_embeddings,
            layer_types: None,
            sliding_window: None,
        }
    }
}

/// Top-k router and experts.
#[derive(Debug)]
pub struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    top_k: i32,
}
impl_module!(SparseMoeBlock { gate, switch_mlp });

impl SparseMoeBlock {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gates = self.gate.forward(x)?;
        let k = self.top_k;
        let inds = top_k_indices_of_negated(&gates, k)?;
        let scores = gates
            .take_along_axis(&inds, -1)?
            .softmax(Some(&[-1]), true)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        y.multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)
    }
}

/// One decoder layer.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    block_sparse_moe: SparseMoeBlock,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(DecoderLayer {
    self_attn,
    block_sparse_moe,
    input_layernorm,
    post_attention_layernorm
});

impl DecoderLayer {
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
        let r = self
            .block_sparse_moe
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        h.add(&r)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct MixtralModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(MixtralModel {
    embed_tokens,
    layers,
    norm
});

/// Mixtral with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: MixtralModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let attn_args = args.attention_args();
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(DecoderLayer {
                    self_attn: llama::attention(&attn_args, None, None)?,
                    block_sparse_moe: SparseMoeBlock {
                        gate: LinearLayer::new(dim, args.num_local_experts, false)?,
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.intermediate_size,
                            args.num_local_experts,
                            false,
                        )?,
                        top_k: args.num_experts_per_tok,
                    },
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = MixtralModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
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
    Ok(Box::new(Model::new(parse_args(config, "mixtral")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        let out = m.norm.forward(&h)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Drops a tied head and stacks `experts.{e}.w1/w2/w3` into `switch_mlp`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        if !weights.contains_key("model.layers.0.block_sparse_moe.experts.0.w1.weight") {
            return Ok(weights);
        }
        for l in 0..self.args.num_hidden_layers {
            let prefix = format!("model.layers.{l}.block_sparse_moe");
            for (n, m) in [("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")] {
                for k in ["weight", "scales", "biases"] {
                    if !weights.contains_key(&format!("{prefix}.experts.0.{n}.{k}")) {
                        continue;
                    }
                    let mut parts = Vec::new();
                    for e in 0..self.args.num_local_experts {
                        let key = format!("{prefix}.experts.{e}.{n}.{k}");
                        parts.push(weights.remove(&key).ok_or_else(|| crate::Error::Weights {
                            path: "model weights".into(),
                            message: format!("missing expert tensor `{key}`"),
                        })?);
                    }
                    let refs: Vec<&Array> = parts.iter().collect();
                    weights.insert(
                        format!("{prefix}.switch_mlp.{m}.{k}"),
                        ops::stack(&refs, 0)?,
                    );
                }
            }
        }
        Ok(weights)
    }    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
        }
        Ok(())
    }
}
