//! GLM-4.5 MoE (`glm4_moe`), following `mlx_lm/models/glm4_moe.py`: pre-norm layers with
//! partial-rotary attention (optional per-head q/k norms), dense SwiGLU MLPs in the first
//! `first_k_dense_replace` layers and sigmoid-scored, group-limited top-k experts plus
//! shared experts in the rest; an untied head; the checkpoint's multi-token-prediction
//! layer is dropped.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::decoder::{stack_experts, Decoder, DecoderLayer, DenseOrMoe, FeedForward, fuse_shared, routed_output};
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{
    router_outputs, top_k_indices_of_negated, zero_weak_groups, Architecture,
    Weights,
};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::activations::{call_compiled_keyed, KeyedBody};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{impl_module, KvCache, LinearLayer, Module, Param, RmsNorm, Rope, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GLM-4.5 MoE.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub max_position_embeddings: i32,
    pub moe_intermediate_size: i32,
    pub norm_topk_prob: bool,
    pub num_attention_heads: i32,
    pub n_group: i32,
    pub head_dim: i32,
    pub topk_group: i32,
    pub n_shared_experts: Option<i32>,
    pub n_routed_experts: i32,
    pub routed_scaling_factor: f64,
    pub num_experts_per_tok: i32,
    pub first_k_dense_replace: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Value>,
    pub use_qk_norm: bool,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub partial_rotary_factor: f64,
    #[serde(default = "default_topk_method")]
    pub topk_method: String,
}

fn default_topk_method() -> String {
    "noaux_tc".into()
}

/// Self-attention: q/k/v biased where `attention_bias`, a plain RoPE over
/// `partial_rotary_factor` of each head, per-head q/k norms where `use_qk_norm`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let head_dim = args.head_dim;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: false,
    };
    let rotary = (head_dim as f64 * args.partial_rotary_factor) as i32;
    let rope = Rope::new(rotary, false, args.rope_theta, 1.0);
    let attn = Attention::new(d, rope, (head_dim as f64).powf(-0.5))?;
    if !args.use_qk_norm {
        return Ok(attn);
    }
    let eps = args.rms_norm_eps;
    attn.with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))
}

/// mlx-lm's compiled `group_expert_select`: sigmoid scores, corrected by the bias for
/// the choice only, the weakest `n_group - topk_group` groups (by their two best scores)
/// zeroed, then the top `k`; returns the expert ids and their (normalized, scaled)
/// uncorrected scores.
#[allow(clippy::too_many_arguments)]
fn group_expert_select(
    gates: &Array,
    bias: &Array,
    top_k: i32,
    n_group: i32,
    topk_group: i32,
    routed_scaling_factor: f64,
    norm_topk_prob: bool,
    limit_groups: bool,
) -> Result<Vec<Array>> {
    let orig_scores = gates.astype(Dtype::Float32)?.sigmoid()?;
    let mut scores = orig_scores.add(bias)?;
    if limit_groups {
        scores = zero_weak_groups(&scores, n_group, topk_group)?;
    }
    let inds = top_k_indices_of_negated(&scores, top_k)?;
    let mut scores = orig_scores.take_along_axis(&inds, -1)?;
    if top_k > 1 && norm_topk_prob {
        scores = scores.divide(&scores.sum(Some(&[-1]), true)?)?;
    }
    Ok(vec![inds, scores.multiply(routed_scaling_factor)?])
}

/// The router: `x @ weight.T`, then `group_expert_select`.
#[derive(Debug)]
pub struct MoeGate {
    weight: Param,
    e_score_correction_bias: Param,
    top_k: i32,
    n_group: i32,
    topk_group: i32,
    routed_scaling_factor: f64,
    norm_topk_prob: bool,
    /// Whether the group step runs: glm4_moe's `n_group > 1`, dots1's
    /// `n_group - topk_group != 0`.
    limit_groups: bool,
}
impl_module!(MoeGate {
    weight,
    e_score_correction_bias
});

impl MoeGate {
    /// Zero placeholders for `n_experts` experts of `dim` inputs; the routing
    /// parameters as the config gives them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        n_experts: i32,
        dim: i32,
        top_k: i32,
        n_group: i32,
        topk_group: i32,
        routed_scaling_factor: f64,
        norm_topk_prob: bool,
        limit_groups: bool,
    ) -> crate::Result<MoeGate> {
        Ok(MoeGate {
            weight: Param::new(mlx_array::ops::zeros(&[n_experts, dim], Dtype::Float32)?),
            e_score_correction_bias: Param::new(mlx_array::ops::zeros(
                &[n_experts],
                Dtype::Float32,
            )?),
            top_k,
            n_group,
            topk_group,
            routed_scaling_factor,
            norm_topk_prob,
            limit_groups,
        })
    }

    pub(crate) fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = x.matmul(&self.weight.transposed()?)?;
        let (k, g, tg) = (self.top_k, self.n_group, self.topk_group);
        let (s, norm, lg) = (
            self.routed_scaling_factor,
            self.norm_topk_prob,
            self.limit_groups,
        );
        let key = format!("glm4_moe.group_expert_select:{k}:{g}:{tg}:{s:e}:{norm}:{lg}");
        let make = move || -> KeyedBody {
            Box::new(move |a| group_expert_select(&a[0], &a[1], k, g, tg, s, norm, lg))
        };
        router_outputs(call_compiled_keyed(&key, make, &[&gates, &self.e_score_correction_bias])?, "glm4_moe")
    }
}

/// Routed experts plus the shared ones.
#[derive(Debug)]
pub struct Moe {
    switch_mlp: SwitchGlu,
    gate: MoeGate,
    shared_experts: Option<Mlp>,
}
impl_module!(Moe {
    switch_mlp,
    gate,
    shared_experts
});

impl FeedForward for Moe {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let routed = self.gate.route(x)?;
        routed_output(x, residual, routed, &self.switch_mlp, self.shared_experts.as_ref())
    }
    fn fuse(&mut self) -> crate::Result<()> {
        fuse_shared(&mut self.shared_experts)
    }
}

/// A layer's feed-forward block.
pub type Ffn = DenseOrMoe<Moe>;

/// GLM-4.5 MoE with its (always untied) head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Decoder<Ffn>,
    lm_head: LinearLayer,
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        if args.topk_method != "noaux_tc" {
            return Err(crate::Error::Config {
                path: "config.json (glm4_moe)".into(),
                message: format!(
                    "key `topk_method`: only \"noaux_tc\" is supported, got {:?}",
                    args.topk_method
                ),
            });
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let n_experts = args.n_routed_experts;
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let ffn = if i >= args.first_k_dense_replace {
                    let shared = args
                        .n_shared_experts
                        .map(|n| Mlp::new(dim, args.moe_intermediate_size * n, false).map(Mlp::up_before_down))
                        .transpose()?;
                    DenseOrMoe::Moe(Box::new(Moe {
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.moe_intermediate_size,
                            n_experts,
                            false,
                        )?,
                        gate: MoeGate::new(
                            n_experts,
                            dim,
                            args.num_experts_per_tok,
                            args.n_group,
                            args.topk_group,
                            args.routed_scaling_factor,
                            args.norm_topk_prob,
                            args.n_group > 1,
                        )?,
                        shared_experts: shared,
                    }))
                } else {
                    DenseOrMoe::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?.up_before_down()))
                };
                DecoderLayer::new(attention(&args)?, ffn, "mlp", dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Decoder::new(args.vocab_size, dim, eps, layers)?;
        let lm_head = LinearLayer::new(dim, args.vocab_size, false)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

impl Module for Model {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.model.visit_params(&join(prefix, "model"), f);
        self.lm_head.visit_params(&join(prefix, "lm_head"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.model.visit_params_mut(&join(prefix, "model"), f);
        self.lm_head.visit_params_mut(&join(prefix, "lm_head"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.model
            .visit_quantizable_mut(&join(prefix, "model"), f)?;
        self.lm_head
            .visit_quantizable_mut(&join(prefix, "lm_head"), f)
    }
    /// mlx-lm's `cast_predicate`: the routers' `e_score_correction_bias` keeps its dtype.
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        super::deepseek_v3::cast_all_but_bias(self, dtype)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "glm4_moe")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let embed = &self.model.embed_tokens;
        head::logits(embed, Some(&self.lm_head), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Stacks per-expert weights into `switch_mlp` and drops the multi-token-prediction
    /// layer (`model.layers.{num_hidden_layers}.*`).
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        let names = [
            ("gate_proj", "gate_proj"),
            ("down_proj", "down_proj"),
            ("up_proj", "up_proj"),
        ];
        stack_experts(
            &mut weights,
            self.args.num_hidden_layers,
            |l| format!("model.layers.{l}.mlp"),
            &names,
            &["weight", "scales", "biases"],
            self.args.n_routed_experts,
        )?;
        let mtp = format!("model.layers.{}", self.args.num_hidden_layers);
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.starts_with(&mtp))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
