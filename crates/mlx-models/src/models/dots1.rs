//! dots.llm1, following `mlx_lm/models/dots1.py`: pre-norm layers with per-head q/k RMS
//! norms and no attention biases, dense SwiGLU MLPs in the first `first_k_dense_replace`
//! layers and, in the rest, GLM-4.5's sigmoid-scored group-limited router (glm4_moe.rs,
//! with dots1's group condition) over SwitchGLU `experts` plus always-present shared
//! experts.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::decoder::{add_residual, stack_experts, Decoder, DecoderLayer, DenseOrMoe, FeedForward};
use super::glm4_moe::MoeGate;
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, initialize_rope, KvCache, LinearLayer, RmsNorm, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by dots1.
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
    pub max_position_embeddings: Option<i32>,
    pub num_key_value_heads: i32,
    pub first_k_dense_replace: i32,
    pub moe_intermediate_size: i32,
    pub n_routed_experts: i32,
    pub n_shared_experts: i32,
    pub norm_topk_prob: bool,
    pub num_experts_per_tok: i32,
    pub rope_theta: f64,
    pub routed_scaling_factor: f64,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default = "one")]
    pub n_group: i32,
    #[serde(default = "one")]
    pub topk_group: i32,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn one() -> i32 {
    1
}

/// Self-attention: no biases, per-head q/k RMS norms before the rotation.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = args
        .head_dim
        .filter(|&d| d != 0)
        .unwrap_or(args.hidden_size / n_heads.max(1));
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let rope = initialize_rope(
        head_dim,
        args.rope_theta,
        false,
        rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
        args.max_position_embeddings,
    )?;
    let eps = args.rms_norm_eps;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))?
        .with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))
}

/// Routed experts plus the shared ones.
#[derive(Debug)]
pub struct Moe {
    experts: SwitchGlu,
    gate: MoeGate,
    shared_experts: Mlp,
}
impl_module!(Moe {
    experts,
    gate,
    shared_experts
});

impl FeedForward for Moe {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let (inds, scores) = self.gate.route(x)?;
        let y = self.experts.forward(x, &inds)?;
        let dtype = y.dtype();
        let y = y
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?
            .astype(dtype)?
            .add(&self.shared_experts.forward(x, None)?)?;
        add_residual(y, residual)
    }
    fn fuse(&mut self) -> crate::Result<()> {
        self.shared_experts.fuse()
    }
}

/// dots1 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Decoder<DenseOrMoe<Moe>>,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let moe_dim = args.moe_intermediate_size;
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let ffn = if i >= args.first_k_dense_replace {
                    DenseOrMoe::Moe(Box::new(Moe {
                        experts: SwitchGlu::new(dim, moe_dim, args.n_routed_experts, false)?,
                        gate: MoeGate::new(
                            args.n_routed_experts,
                            dim,
                            args.num_experts_per_tok,
                            args.n_group,
                            args.topk_group,
                            args.routed_scaling_factor,
                            args.norm_topk_prob,
                            args.n_group - args.topk_group != 0,
                        )?,
                        shared_experts: Mlp::new(
                            dim,
                            moe_dim * args.n_shared_experts,
                            args.mlp_bias,
                        )?
                        .up_before_down(),
                    }))
                } else {
                    let mlp = Mlp::new(dim, args.intermediate_size, args.mlp_bias)?.up_before_down();
                    DenseOrMoe::Dense(Box::new(mlp))
                };
                DecoderLayer::new(attention(&args)?, ffn, "mlp", dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Decoder::new(args.vocab_size, dim, eps, layers)?;
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
    Ok(Box::new(Model::new(parse_args(config, "dots1")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let embed = &self.model.embed_tokens;
        head::logits(embed, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// A tied head's `lm_head.weight` dropped; per-expert tensors of the expert layers
    /// stacked into `mlp.experts.*`; rotary `inv_freq` buffers dropped.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        let names = [
            ("gate_proj", "gate_proj"),
            ("down_proj", "down_proj"),
            ("up_proj", "up_proj"),
        ];
        let first_moe = self.args.first_k_dense_replace.max(0);
        for l in first_moe..self.args.num_hidden_layers {
            let prefix = format!("model.layers.{l}.mlp");
            stack_experts(
                &mut weights,
                1,
                |_| prefix.clone(),
                &names,
                &["weight", "scales", "biases"],
                self.args.n_routed_experts,
            )?;
            // `stack_experts` names the stack `switch_mlp`; dots1 keeps `experts`.
            let stacked: Vec<String> = weights
                .keys()
                .filter(|k| k.starts_with(&format!("{prefix}.switch_mlp.")))
                .cloned()
                .collect();
            for k in stacked {
                if let Some(v) = weights.remove(&k) {
                    let to = k.replacen(".switch_mlp.", ".experts.", 1);
                    weights.insert(to, v);
                }
            }
        }
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.contains("rotary_emb.inv_freq"))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
