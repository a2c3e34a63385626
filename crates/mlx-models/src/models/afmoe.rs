//! AFMoE (`afmoe`), following `mlx_lm/models/afmoe.py`: embeddings times
//! `sqrt(hidden_size)` (`mup_enabled`); sandwich layers (input, post-attention, pre-MLP
//! and post-MLP RMS norms); attention with per-head RMS `q_norm` / `k_norm`, RoPE
//! (`initialize_rope`) on the sliding layers only (the full ones take no positions), the
//! merged heads times `sigmoid(gate_proj(x))` before `o_proj`; `layer_types` choosing a
//! `RotatingKVCache(sliding_window)` with the windowed mask or a `KVCache`; the first
//! `num_dense_layers` layers a SwiGLU MLP, the others experts routed by sigmoid (or
//! softmax) scores of float32 logits, chosen with `expert_bias` (and, with `n_group > 1`,
//! only in the best groups), normalized by `route_norm`, times `route_scale`, plus
//! `num_shared_experts` experts' worth of shared MLP; the head tied by
//! `tie_word_embeddings`. `sanitize` drops rotary buffers and a tied head and stacks the
//! experts.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt, OutGate};
use super::config_error;
use super::decoder::{stack_experts_into, GLU_EXPERT_PROJS, LINEAR_KINDS};
use super::deepseek_v3::cast_all_except;
use super::head::{self, LogitScale};
use super::lm::drop_tied_head;
use super::mlp::Mlp;
use super::{
    drop_rotary_inv_freq, layer_caches, layer_type_index, top_k_indices_of_negated,
    weigh_experts, zero_weak_groups, Architecture, LayerMasks, Weights,
};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Param,
    RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

const SLIDING: &str = "sliding_attention";
const FULL: &str = "full_attention";

/// config.json keys read by AFMoE (mlx-lm's defaults for all but `model_type` and
/// `layer_types`).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub layer_types: Vec<String>,
    #[serde(default = "d::vocab_size")]
    pub vocab_size: i32,
    #[serde(default = "d::hidden_size")]
    pub hidden_size: i32,
    #[serde(default = "d::intermediate_size")]
    pub intermediate_size: i32,
    #[serde(default = "d::moe_intermediate_size")]
    pub moe_intermediate_size: i32,
    #[serde(default = "d::num_hidden_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d::num_attention_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d::num_key_value_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "d::head_dim")]
    pub head_dim: i32,
    #[serde(default = "d::max_position_embeddings")]
    pub max_position_embeddings: i32,
    #[serde(default = "d::rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d::rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "d::num_experts")]
    pub num_experts: i32,
    #[serde(default = "d::num_experts_per_tok")]
    pub num_experts_per_tok: i32,
    #[serde(default = "d::one")]
    pub num_shared_experts: i32,
    #[serde(default = "d::num_dense_layers")]
    pub num_dense_layers: i32,
    #[serde(default = "d::yes")]
    pub route_norm: bool,
    #[serde(default = "d::route_scale")]
    pub route_scale: f64,
    #[serde(default = "d::score_func")]
    pub score_func: String,
    #[serde(default = "d::one")]
    pub n_group: i32,
    #[serde(default = "d::one")]
    pub topk_group: i32,
    #[serde(default = "d::sliding_window")]
    pub sliding_window: i32,
    #[serde(default = "d::yes")]
    pub mup_enabled: bool,
}

/// mlx-lm's dataclass defaults.
mod d {
    pub fn vocab_size() -> i32 {
        200192
    }
    pub fn hidden_size() -> i32 {
        2048
    }
    pub fn intermediate_size() -> i32 {
        6144
    }
    pub fn moe_intermediate_size() -> i32 {
        1024
    }
    pub fn num_hidden_layers() -> i32 {
        32
    }
    pub fn num_attention_heads() -> i32 {
        32
    }
    pub fn num_key_value_heads() -> i32 {
        4
    }
    pub fn head_dim() -> i32 {
        64
    }
    pub fn max_position_embeddings() -> i32 {
        131072
    }
    pub fn rms_norm_eps() -> f64 {
        1e-5
    }
    pub fn rope_theta() -> f64 {
        10000.0
    }
    pub fn num_experts() -> i32 {
        128
    }
    pub fn num_experts_per_tok() -> i32 {
        8
    }
    pub fn one() -> i32 {
        1
    }
    pub fn num_dense_layers() -> i32 {
        2
    }
    pub fn yes() -> bool {
        true
    }
    pub fn route_scale() -> f64 {
        2.826
    }
    pub fn score_func() -> String {
        "sigmoid".into()
    }
    pub fn sliding_window() -> i32 {
        2048
    }
}

/// What mlx-lm would reject (or index out of range) while building or running the
/// model, as config errors naming the key.
fn check(args: &ModelArgs) -> crate::Result<()> {
    let err = |m: String| config_error("afmoe", m);
    layer_type_index(&args.layer_types, FULL, "afmoe")?;
    let (h, kv) = (args.num_attention_heads, args.num_key_value_heads);
    if h <= 0 || kv <= 0 || h % kv != 0 {
        return Err(err(format!(
            "`num_attention_heads` ({h}) must be a positive multiple of \
             `num_key_value_heads` ({kv})"
        )));
    }
    if args.head_dim <= 0 || args.head_dim % 2 != 0 {
        return Err(err(format!(
            "key `head_dim` ({}) must be positive and even",
            args.head_dim
        )));
    }
    if args.layer_types.iter().any(|t| t == SLIDING) && args.sliding_window <= 0 {
        return Err(err(format!(
            "key `sliding_window` ({}) must be positive with sliding layers",
            args.sliding_window
        )));
    }
    let n = args.layer_types.len() as i64;
    if i64::from(args.num_dense_layers) < n {
        let (e, k) = (args.num_experts, args.num_experts_per_tok);
        if k <= 0 || e < k {
            return Err(err(format!(
                "`num_experts_per_tok` ({k}) must be positive and at most `num_experts` ({e})"
            )));
        }
        let f = args.score_func.as_str();
        if f != "sigmoid" && f != "softmax" {
            return Err(err(format!("unknown `score_func`: {f:?}")));
        }
        if args.n_group > 1 {
            let (g, tg) = (args.n_group, args.topk_group);
            if e % g != 0 || e / g < 2 || tg < 1 || tg > g {
                return Err(err(format!(
                    "`n_group` ({g}) must divide `num_experts` ({e}) into groups of at least \
                     two, and `topk_group` ({tg}) be between 1 and `n_group`"
                )));
            }
        }
    }
    Ok(())
}

/// `AfmoeMoE`: routed experts times `route_scale`, plus the shared experts.
#[derive(Debug)]
pub struct Moe {
    router: RouterGate,
    expert_bias: Param,
    experts: SwitchGlu,
    shared_experts: Option<Mlp>,
    top_k: i32,
    softmax: bool,
    n_group: i32,
    topk_group: i32,
    route_norm: bool,
    route_scale: f64,
}
impl_module!(Moe {
    router,
    expert_bias,
    experts,
    shared_experts
});

/// `MoERouter`: the bare `gate` projection.
#[derive(Debug)]
pub struct RouterGate {
    gate: LinearLayer,
}
impl_module!(RouterGate { gate });

impl Moe {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gates = self.router.gate.forward(x)?.astype(Dtype::Float32)?;
        let scores = if self.softmax {
            gates.softmax(Some(&[-1]), false)?
        } else {
            gates.sigmoid()?
        };
        let mut selection = scores.add(&*self.expert_bias)?;
        if self.n_group > 1 {
            selection = zero_weak_groups(&selection, self.n_group, self.topk_group)?;
        }
        let inds = top_k_indices_of_negated(&selection, self.top_k)?;
        let mut chosen = scores.take_along_axis(&inds, -1)?;
        if self.route_norm && self.top_k > 1 {
            chosen = chosen.divide(&chosen.sum(Some(&[-1]), true)?)?;
        }
        let chosen = chosen.multiply(self.route_scale)?;
        let y = weigh_experts(&self.experts.forward(x, &inds)?, &chosen)?;
        match &self.shared_experts {
            Some(s) => y.add(&s.forward(x, None)?),
            None => Ok(y),
        }
    }
}

/// A layer's feed-forward block: dense or routed.
#[derive(Debug)]
pub enum FeedForward {
    /// `MLP`.
    Dense(Box<Mlp>),
    /// `AfmoeMoE`.
    Sparse(Box<Moe>),
}

enum_module!(FeedForward {
    Dense => "",
    Sparse => "",
});

/// `DecoderLayer`.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_mlp_layernorm: RmsNorm,
    post_mlp_layernorm: RmsNorm,
    sliding: bool,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm,
    pre_mlp_layernorm,
    post_mlp_layernorm
});

impl DecoderLayer {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let r = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            None,
            Default::default(),
        )?;
        let h = x.add(&self.post_attention_layernorm.forward(&r)?)?;
        let n = self.pre_mlp_layernorm.forward(&h)?;
        let r = match &self.mlp {
            FeedForward::Dense(m) => m.forward(&n, None)?,
            FeedForward::Sparse(m) => m.forward(&n)?,
        };
        h.add(&self.post_mlp_layernorm.forward(&r)?)
    }
}

/// `AfmoeModel`.
#[derive(Debug)]
pub struct AfmoeModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(AfmoeModel {
    embed_tokens,
    layers,
    norm
});

/// AFMoE with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: AfmoeModel,
    lm_head: Option<LinearLayer>,
}

impl_module!(Model { model, lm_head }
    /// mlx-lm's `cast_predicate`: the routers' `expert_bias` keeps its dtype.
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        cast_all_except(self, dtype, "expert_bias")
    }
);

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        check(&args)?;
        let (dim, eps, head_dim) = (args.hidden_size, args.rms_norm_eps, args.head_dim);
        let scaling = crate::config::rope_scaling(args.rope_scaling.as_ref())?;
        let layers = args
            .layer_types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let sliding = t == SLIDING;
                let d = AttentionDims {
                    dim,
                    n_heads: args.num_attention_heads,
                    n_kv_heads: args.num_key_value_heads,
                    head_dim,
                    qkv_bias: false,
                    o_bias: false,
                };
                let rope = if sliding {
                    initialize_rope(
                        head_dim,
                        args.rope_theta,
                        false,
                        scaling.as_ref(),
                        Some(args.max_position_embeddings),
                    )?
                } else {
                    Rope::Identity
                };
                let self_attn = Attention::new(d, rope, f64::from(head_dim).powf(-0.5))?
                    .with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))?
                    .with_output_gate("gate_proj", dim, false, OutGate::PerFeature)?;
                let mlp = if (i as i64) < i64::from(args.num_dense_layers) {
                    FeedForward::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?))
                } else {
                    let shared = if args.num_shared_experts > 0 {
                        Some(Mlp::new(
                            dim,
                            args.moe_intermediate_size * args.num_shared_experts,
                            false,
                        )?)
                    } else {
                        None
                    };
                    FeedForward::Sparse(Box::new(Moe {
                        router: RouterGate {
                            gate: LinearLayer::new(dim, args.num_experts, false)?,
                        },
                        expert_bias: Param::new(ops::zeros(&[args.num_experts], Dtype::Float32)?),
                        experts: SwitchGlu::new(
                            dim,
                            args.moe_intermediate_size,
                            args.num_experts,
                            false,
                        )?,
                        shared_experts: shared,
                        top_k: args.num_experts_per_tok,
                        softmax: args.score_func != "sigmoid",
                        n_group: args.n_group,
                        topk_group: args.topk_group,
                        route_norm: args.route_norm,
                        route_scale: args.route_scale,
                    }))
                };
                Ok(DecoderLayer {
                    self_attn,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    pre_mlp_layernorm: RmsNorm::new(dim, eps)?,
                    post_mlp_layernorm: RmsNorm::new(dim, eps)?,
                    sliding,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = AfmoeModel {
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
    Ok(Box::new(Model::new(parse_args(config, "afmoe")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        if self.args.mup_enabled {
            h = h.multiply(f64::from(self.args.hidden_size).sqrt())?;
        }
        let n = h.dim(1)?;
        let fa_idx = m.layers.iter().position(|l| !l.sliding).unwrap_or(0);
        let swa_idx = m.layers.iter().position(|l| l.sliding);
        let masks = LayerMasks::new(n, caches, fa_idx, swa_idx, Some(self.args.sliding_window))?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            let mask = masks.get(layer.sliding);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        let out = m.norm.forward(&h)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: a `RotatingKVCache(sliding_window)` for each sliding layer, a
    /// `KVCache` for the others.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| l.sliding);
        super::window_cache_specs(sliding, self.args.sliding_window)
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = drop_rotary_inv_freq(weights);
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        // The dense layers have no experts: stack_experts_into skips them.
        stack_experts_into(
            &mut weights,
            self.args.num_hidden_layers,
            |l| format!("model.layers.{l}.mlp"),
            ("experts", "experts"),
            GLU_EXPERT_PROJS,
            LINEAR_KINDS,
            self.args.num_experts,
        )?;
        Ok(weights)
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            match &mut layer.mlp {
                FeedForward::Dense(m) => m.fuse()?,
                FeedForward::Sparse(m) => {
                    if let Some(s) = &mut m.shared_experts {
                        s.fuse()?;
                    }
                }
            }
        }
        Ok(())
    }
}
