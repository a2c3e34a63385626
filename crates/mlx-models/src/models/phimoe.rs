//! Phi-3.5-MoE, following `mlx_lm/models/phimoe.py`: biased attention with the
//! `SuScaledRoPE` of Phi-3 (plain RoPE when `rope_scaling` is null), layer norms, and
//! SwitchGLU experts routed by HF's `sparsemixer`; the head is biased.
use super::config_error;
use super::attention::{Attention, AttentionDims, Extras};
use super::decoder::stack_experts;
use super::lm::causal_layers;
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::ops::{concatenate, where_};
use mlx_array::{Array, Result};
use mlx_nn::{
    impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, LinearLayer, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by PhiMoE (mlx-lm's defaults are Phi-3.5-MoE's).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    #[serde(default = "default_vocab")]
    pub vocab_size: i32,
    #[serde(default = "default_hidden")]
    pub hidden_size: i32,
    #[serde(default = "default_intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "default_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: i32,
    #[serde(default = "default_orig_max_pos")]
    pub original_max_position_embeddings: i32,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_experts")]
    pub num_local_experts: i32,
    #[serde(default = "default_top_k")]
    pub num_experts_per_tok: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_jitter")]
    pub router_jitter_noise: f64,
}

fn default_model_type() -> String {
    "phimoe".into()
}
fn default_vocab() -> i32 {
    32064
}
fn default_hidden() -> i32 {
    4096
}
fn default_intermediate() -> i32 {
    6400
}
fn default_layers() -> i32 {
    32
}
fn default_heads() -> i32 {
    32
}
fn default_kv_heads() -> i32 {
    8
}
fn default_max_pos() -> i32 {
    131072
}
fn default_orig_max_pos() -> i32 {
    4096
}
fn default_eps() -> f64 {
    1e-6
}
fn default_experts() -> i32 {
    16
}
fn default_top_k() -> i32 {
    2
}
fn default_rope_theta() -> f64 {
    10000.0
}
fn default_jitter() -> f64 {
    0.01
}

/// Plain RoPE, or `SuScaledRoPE` from `rope_scaling` (whose four keys mlx-lm reads
/// unconditionally); a non-zero `long_mscale` replaces the default input scale.
fn rope(args: &ModelArgs, head_dim: i32) -> crate::Result<Rope> {
    let Some(section) = args.rope_scaling.as_ref().filter(|v| !v.is_null()) else {
        return Ok(Rope::new(head_dim, false, args.rope_theta, 1.0));
    };
    for key in ["short_factor", "long_factor", "short_mscale", "long_mscale"] {
        if section.get(key).is_none() {
            return Err(config_error("phimoe", format!("key `rope_scaling.{key}` is missing")));
        }
    }
    let scaling =
        rope_scaling(Some(section))?.ok_or_else(|| config_error("phimoe", "rope_scaling".into()))?;
    let long = scaling.long_factor.unwrap_or_else(|| vec![1.0]);
    let mut rope = Rope::su_scaled(
        head_dim,
        args.rope_theta,
        args.max_position_embeddings as f64,
        args.original_max_position_embeddings as f64,
        &long,
    )?;
    let long_mscale = section["long_mscale"].as_f64().filter(|&m| m != 0.0);
    if let (Some(m), Rope::Freqs { input_scale, .. }) = (long_mscale, &mut rope) {
        *input_scale = Some(m);
    }
    Ok(rope)
}

/// HF's `sparsemixer` at inference: `top_k` rounds, each taking the largest remaining
/// logit and its softmax weight over the logits within `2 * jitter_eps` of it.
fn sparsemixer(gates: &Array, top_k: i32, jitter_eps: f64) -> Result<(Array, Array)> {
    let neg_inf = Array::scalar_f64(f64::NEG_INFINITY, gates.dtype())?;
    let mut masked = gates.clone();
    let (mut inds, mut scores) = (Vec::new(), Vec::new());
    for _ in 0..top_k {
        let top = masked.max(Some(&[-1]), true)?;
        let ind = masked.argmax(Some(-1), true)?.stop_gradient()?;
        let factor = gates.abs()?.maximum(&top)?;
        let far = top
            .subtract(gates)?
            .divide(&factor)?
            .greater(2.0 * jitter_eps)?;
        let band = where_(&far, &neg_inf, &masked)?.softmax(Some(&[-1]), true)?;
        scores.push(band.take_along_axis(&ind, -1)?);
        masked = masked.put_along_axis(&ind, &neg_inf, -1)?;
        inds.push(ind);
    }
    let inds: Vec<&Array> = inds.iter().collect();
    let scores: Vec<&Array> = scores.iter().collect();
    Ok((concatenate(&inds, -1)?, concatenate(&scores, -1)?))
}

/// The experts and their router.
#[derive(Debug)]
pub struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    top_k: i32,
    jitter_eps: f64,
}
impl_module!(SparseMoeBlock { gate, switch_mlp });

impl SparseMoeBlock {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gates = self.gate.forward(x)?;
        let (inds, scores) = sparsemixer(&gates, self.top_k, self.jitter_eps)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        y.multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)
    }
}

/// One pre-norm layer with layer norms.
#[derive(Debug)]
pub struct PhiMoeDecoderLayer {
    self_attn: Attention,
    block_sparse_moe: SparseMoeBlock,
    input_layernorm: LayerNorm,
    post_attention_layernorm: LayerNorm,
}
impl_module!(PhiMoeDecoderLayer {
    self_attn,
    block_sparse_moe,
    input_layernorm,
    post_attention_layernorm
});

impl PhiMoeDecoderLayer {
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
pub struct PhiMoeModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<PhiMoeDecoderLayer>,
    norm: LayerNorm,
}
impl_module!(PhiMoeModel {
    embed_tokens,
    layers,
    norm
});

/// PhiMoE with its biased head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: PhiMoeModel,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        if args.num_experts_per_tok > args.num_local_experts {
            return Err(config_error("phimoe", format!(
                "num_experts_per_tok ({}) is larger than num_local_experts ({})",
                args.num_experts_per_tok, args.num_local_experts
            )));
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let head_dim = dim / args.num_attention_heads.max(1);
        let d = AttentionDims {
            dim,
            n_heads: args.num_attention_heads,
            n_kv_heads: args.num_key_value_heads,
            head_dim,
            qkv_bias: true,
            o_bias: true,
        };
        let norm = || LayerNorm::new(dim, eps, true, true);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(PhiMoeDecoderLayer {
                    self_attn: Attention::new(
                        d,
                        rope(&args, head_dim)?,
                        (head_dim as f64).powf(-0.5),
                    )?,
                    block_sparse_moe: SparseMoeBlock {
                        gate: LinearLayer::new(dim, args.num_local_experts, false)?,
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.intermediate_size,
                            args.num_local_experts,
                            false,
                        )?,
                        top_k: args.num_experts_per_tok,
                        jitter_eps: args.router_jitter_noise,
                    },
                    input_layernorm: norm()?,
                    post_attention_layernorm: norm()?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = PhiMoeModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: norm()?,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, true)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "phimoe")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let h = causal_layers(&m.layers, h, caches, PhiMoeDecoderLayer::forward)?;
        self.lm_head.forward(&m.norm.forward(&h)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Stacks HF's per-expert `w1` / `w2` / `w3` into `switch_mlp`'s gate, down and up.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if !weights.contains_key("model.layers.0.block_sparse_moe.experts.0.w1.weight") {
            return Ok(weights);
        }
        stack_experts(
            &mut weights,
            self.args.num_hidden_layers,
            |l| format!("model.layers.{l}.block_sparse_moe"),
            &[("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")],
            &["weight", "scales", "biases"],
            self.args.num_local_experts,
        )?;
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
        }
        Ok(())
    }
}
