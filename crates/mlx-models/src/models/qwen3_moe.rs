//! Qwen3-MoE, following `mlx_lm/models/qwen3_moe.py` (Qwen3 attention, softmax-routed
//! SwitchGLU experts on sparse layers, dense MLPs on `mlp_only_layers`).
use super::attention::{Attention, Extras};
use super::mlp::Mlp;
use super::qwen3::attention;
use super::top_k_indices;
use super::{cache_at, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, RmsNorm, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Qwen3-MoE.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    pub mlp_only_layers: Vec<i32>,
    pub moe_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: i32,
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
}

impl ModelArgs {
    /// The attention arguments (Qwen3's, with plain RoPE as qwen3_moe.py builds it).
    fn attention_args(&self) -> super::qwen3::ModelArgs {
        super::qwen3::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            num_key_value_heads: self.num_key_value_heads,
            max_position_embeddings: self.max_position_embeddings,
            head_dim: self.head_dim,
            tie_word_embeddings: self.tie_word_embeddings,
            rope_theta: Some(self.rope_theta),
            rope_scaling: None,
            rope_parameters: None,
        }
    }
}

/// Softmax router over experts, top-k, optionally renormalized.
#[derive(Debug)]
pub struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    top_k: i32,
    norm_topk_prob: bool,
}
impl_module!(SparseMoeBlock { gate, switch_mlp });

impl SparseMoeBlock {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gates = self.gate.forward(x)?.softmax(Some(&[-1]), true)?;
        let k = self.top_k;
        let inds = top_k_indices(&gates, k)?;
        let mut scores = gates.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(&scores.sum(Some(&[-1]), true)?)?;
        }
        let y = self.switch_mlp.forward(x, &inds)?;
        let dtype = y.dtype();
        y.multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?
            .astype(dtype)
    }
}

/// A layer's feed-forward part: sparse experts or a dense MLP.
#[derive(Debug)]
pub enum FeedForward {
    /// Experts.
    Sparse(Box<SparseMoeBlock>),
    /// Dense.
    Dense(Box<Mlp>),
}

impl FeedForward {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Sparse(m) => m.forward(x),
            FeedForward::Dense(m) => m.forward(x, None),
        }
    }
}

impl Module for FeedForward {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a mlx_nn::Param)) {
        match self {
            FeedForward::Sparse(m) => m.visit_params(prefix, f),
            FeedForward::Dense(m) => m.visit_params(prefix, f),
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut mlx_nn::Param)) {
        match self {
            FeedForward::Sparse(m) => m.visit_params_mut(prefix, f),
            FeedForward::Dense(m) => m.visit_params_mut(prefix, f),
        }
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut mlx_nn::module::QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        match self {
            FeedForward::Sparse(m) => m.visit_quantizable_mut(prefix, f),
            FeedForward::Dense(m) => m.visit_quantizable_mut(prefix, f),
        }
    }
}

/// One decoder layer.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
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
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        h.add(&r)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct Qwen3MoeModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(Qwen3MoeModel {
    embed_tokens,
    layers,
    norm
});

/// Qwen3-MoE with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Qwen3MoeModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let attn_args = args.attention_args();
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let sparse = !args.mlp_only_layers.contains(&i)
                    && args.num_experts > 0
                    && args.decoder_sparse_step > 0
                    && (i + 1) % args.decoder_sparse_step == 0;
                let mlp = if sparse {
                    FeedForward::Sparse(Box::new(SparseMoeBlock {
                        gate: LinearLayer::new(dim, args.num_experts, false)?,
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.moe_intermediate_size,
                            args.num_experts,
                            false,
                        )?,
                        top_k: args.num_experts_per_tok,
                        norm_topk_prob: args.norm_topk_prob,
                    }))
                } else {
                    FeedForward::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?))
                };
                Ok(DecoderLayer {
                    self_attn: attention(&attn_args)?,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Qwen3MoeModel {
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
    Ok(Box::new(Model::new(parse_args(config, "qwen3_moe")?)?))
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
    /// Drops a tied head and stacks per-expert weights into `switch_mlp`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        let mut moe_layers: Vec<String> = weights
            .keys()
            .filter(|k| {
                k.starts_with("model.layers.") && k.ends_with(".mlp.experts.0.up_proj.weight")
            })
            .filter_map(|k| k.split('.').nth(2).map(str::to_string))
            .collect();
        moe_layers.sort_by_key(|l| l.parse::<i64>().unwrap_or(i64::MAX));
        for l in moe_layers {
            let prefix = format!("model.layers.{l}");
            for n in ["up_proj", "down_proj", "gate_proj"] {
                let mut parts = Vec::new();
                for e in 0..self.args.num_experts {
                    let key = format!("{prefix}.mlp.experts.{e}.{n}.weight");
                    parts.push(weights.remove(&key).ok_or_else(|| crate::Error::Weights {
                        path: "model weights".into(),
                        message: format!("missing expert tensor `{key}`"),
                    })?);
                }
                let refs: Vec<&Array> = parts.iter().collect();
                weights.insert(
                    format!("{prefix}.mlp.switch_mlp.{n}.weight"),
                    ops::stack(&refs, 0)?,
                );
            }
        }
        Ok(weights)
    }    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            if let FeedForward::Dense(mlp) = &mut layer.mlp {
                mlp.fuse()?;
            }
        }
        Ok(())
    }
}
