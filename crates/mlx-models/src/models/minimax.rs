//! MiniMax (`minimax`), following `mlx_lm/models/minimax.py`: attention with rms norms
//! over the whole q/k projections and a partial rotary embedding (`rotary_dim`), and
//! sigmoid-scored experts chosen with a correction bias, their weights renormalized.
//! Sanitize dequantizes FP8 block-scaled weights and stacks per-expert `w1/w2/w3`.
use super::attention::{Attention, AttentionDims, Extras, HeadNorm, NormAt};
use super::deepseek_v3::{cast_all_but_bias, dequantize_fp8};
use super::head::{self, LogitScale};
use super::{cache_at, layer_caches, top_k_indices_of_negated, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, Param, RmsNorm, Rope,
    SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by MiniMax (those without a default are required, as in
/// mlx-lm's `ModelArgs`).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub max_position_embeddings: i32,
    pub num_experts_per_tok: i32,
    pub num_local_experts: i32,
    pub shared_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rotary_dim: i32,
    pub vocab_size: i32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default = "default_true")]
    pub use_qk_norm: bool,
}

fn default_true() -> bool {
    true
}

/// Sigmoid-scored top-k experts with a correction bias.
#[derive(Debug)]
pub struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    e_score_correction_bias: Param,
    top_k: i32,
}
impl_module!(SparseMoeBlock {
    gate,
    switch_mlp,
    e_score_correction_bias
});

impl SparseMoeBlock {
    fn forward(&self, x: &Array) -> Result<Array> {
        let scores = self.gate.forward(&x.astype(Dtype::Float32)?)?.sigmoid()?;
        let biased = scores.add(&*self.e_score_correction_bias)?;
        let inds = top_k_indices_of_negated(&biased, self.top_k)?;
        let scores = scores.take_along_axis(&inds, -1)?;
        let scores = scores
            .divide(&scores.sum(Some(&[-1]), true)?.add(1e-20)?)?
            .astype(x.dtype())?;
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
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let n = self.input_layernorm.forward(x)?;
        let r = x.add(&self.self_attn.forward(&n, mask, cache, None, Extras::default())?)?;
        let m = self
            .block_sparse_moe
            .forward(&self.post_attention_layernorm.forward(&r)?)?;
        r.add(&m)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct MiniMaxModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(MiniMaxModel {
    embed_tokens,
    layers,
    norm
});

/// MiniMax with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: MiniMaxModel,
    lm_head: Option<LinearLayer>,
}

impl Module for Model {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.model
            .visit_params(&mlx_nn::module::join(prefix, "model"), f);
        self.lm_head
            .visit_params(&mlx_nn::module::join(prefix, "lm_head"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.model
            .visit_params_mut(&mlx_nn::module::join(prefix, "model"), f);
        self.lm_head
            .visit_params_mut(&mlx_nn::module::join(prefix, "lm_head"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut mlx_nn::module::QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.model
            .visit_quantizable_mut(&mlx_nn::module::join(prefix, "model"), f)?;
        self.lm_head
            .visit_quantizable_mut(&mlx_nn::module::join(prefix, "lm_head"), f)
    }
    /// mlx-lm's `cast_predicate`: the routers' `e_score_correction_bias` keeps its dtype.
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        cast_all_but_bias(self, dtype)
    }
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let n = args.num_attention_heads;
        let head_dim = args.head_dim.filter(|&d| d > 0).unwrap_or(dim / n);
        let d = AttentionDims {
            dim,
            n_heads: n,
            n_kv_heads: args.num_key_value_heads,
            head_dim,
            qkv_bias: false,
            o_bias: false,
        };
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = Rope::new(args.rotary_dim, false, args.rope_theta, 1.0);
                let mut self_attn = Attention::new(d, rope, (head_dim as f64).powf(-0.5))?;
                if args.use_qk_norm {
                    self_attn = self_attn.with_qk_norms(NormAt::Projection, |f| {
                        Ok(HeadNorm::Rms(RmsNorm::new(f, eps)?))
                    })?;
                }
                Ok(DecoderLayer {
                    self_attn,
                    block_sparse_moe: SparseMoeBlock {
                        gate: LinearLayer::new(dim, args.num_local_experts, false)?,
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.intermediate_size,
                            args.num_local_experts,
                            false,
                        )?,
                        e_score_correction_bias: Param::new(ops::zeros(
                            &[args.num_local_experts],
                            Dtype::Float32,
                        )?),
                        top_k: args.num_experts_per_tok,
                    },
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = MiniMaxModel {
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
    Ok(Box::new(Model::new(parse_args(config, "minimax")?)?))
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
    /// FP8 block-scaled weights dequantized to bfloat16, then `experts.{e}.w1/w2/w3`
    /// stacked into `switch_mlp`.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = dequantize_fp8(weights)?;
        if !weights.contains_key("model.layers.0.block_sparse_moe.experts.0.w1.weight") {
            return Ok(weights);
        }
        for l in 0..self.args.num_hidden_layers {
            let prefix = format!("model.layers.{l}.block_sparse_moe");
            for (n, m) in [("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")] {
                if !weights.contains_key(&format!("{prefix}.experts.0.{n}.weight")) {
                    continue;
                }
                let mut parts = Vec::new();
                for e in 0..self.args.num_local_experts {
                    let key = format!("{prefix}.experts.{e}.{n}.weight");
                    parts.push(weights.remove(&key).ok_or_else(|| crate::Error::Weights {
                        path: "model weights".into(),
                        message: format!("missing expert tensor `{key}`"),
                    })?);
                }
                let refs: Vec<&Array> = parts.iter().collect();
                weights.insert(
                    format!("{prefix}.switch_mlp.{m}.weight"),
                    ops::stack(&refs, 0)?,
                );
            }
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
        }
        Ok(())
    }
}
