//! Ling / Bailing MoE (`bailing_moe`), following `mlx_lm/models/bailing_moe.py`:
//! `model.word_embeddings`, pre-norm layers whose `attention` reads one fused
//! `query_key_value` projection (optional per-head `query_layernorm` / `key_layernorm`,
//! RoPE over `rotary_dim` or `partial_rotary_factor` of each head) and writes through
//! `dense`; dense SwiGLU MLPs in the first `first_k_dense_replace` layers, routed
//! experts in the rest (softmax or sigmoid scores, an optional `expert_bias` for the
//! choice only, optional group limiting, top-k normalized and scaled) beside optional
//! shared experts. `sanitize` drops a tied `lm_head`, divides each column of the head
//! by its norm where `norm_head` (at every load, as mlx-lm), stacks per-expert tensors
//! and moves the router's `mlp.gate.*` to `mlp.gate.gate_proj.*`.
use super::config_error;
use super::decoder::{stack_mlp_experts, DenseOrMoe, FeedForward, fuse_shared, routed_output};
use super::deepseek_v3::cast_all_except;
use super::head::{self, LogitScale};
use super::lm::causal_layers;
use super::mlp::Mlp;
use super::{batch_len, merge_heads, project_out, rope_attend, split_heads};
use super::{router_outputs, top_k_indices, zero_weak_groups, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::linalg::{norm, NormOrd};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::activations::{call_compiled_keyed, KeyedBody};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Param,
    RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Bailing MoE (those without a default are required, as in
/// mlx-lm; `num_experts` may be null: every layer dense).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub max_position_embeddings: i32,
    pub moe_intermediate_size: i32,
    #[serde(deserialize_with = "Option::deserialize")]
    pub num_experts: Option<i32>,
    pub num_shared_experts: i32,
    pub norm_topk_prob: bool,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub vocab_size: i32,
    pub first_k_dense_replace: i32,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub use_bias: bool,
    #[serde(default)]
    pub use_qkv_bias: bool,
    #[serde(default)]
    pub norm_head: bool,
    #[serde(default)]
    pub use_qk_norm: bool,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "one")]
    pub partial_rotary_factor: f64,
    #[serde(default)]
    pub rotary_dim: Option<i32>,
    #[serde(default)]
    pub moe_router_enable_expert_bias: bool,
    #[serde(default = "one")]
    pub routed_scaling_factor: f64,
    #[serde(default = "default_score_function")]
    pub score_function: String,
    #[serde(default = "default_n_group")]
    pub n_group: i32,
    #[serde(default = "default_topk_group")]
    pub topk_group: i32,
    #[serde(default)]
    pub moe_shared_expert_intermediate_size: Option<i32>,
    #[serde(default = "yes")]
    pub moe_router_enable_shared_expert: bool,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_score_function() -> String {
    "softmax".into()
}
fn default_n_group() -> i32 {
    1
}
fn default_topk_group() -> i32 {
    4
}

/// Self-attention through the fused `query_key_value` projection.
#[derive(Debug)]
pub struct Attention {
    query_key_value: LinearLayer,
    dense: LinearLayer,
    key_layernorm: Option<RmsNorm>,
    query_layernorm: Option<RmsNorm>,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f64,
}
impl_module!(Attention {
    query_key_value,
    dense,
    key_layernorm,
    query_layernorm
});

impl Attention {
    fn new(args: &ModelArgs) -> crate::Result<Attention> {
        let (dim, n_heads, n_kv_heads) = (
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
        );
        if n_heads < 1 || n_kv_heads < 1 {
            return Err(config_error("bailing_moe", 
                "keys `num_attention_heads` and `num_key_value_heads` must be positive".into(),
            ));
        }
        let head_dim = dim / n_heads;
        let rope_dim = args
            .rotary_dim
            .unwrap_or((head_dim as f64 * args.partial_rotary_factor) as i32);
        let scaling = rope_scaling(args.rope_scaling.as_ref())?;
        let rope = initialize_rope(
            rope_dim,
            args.rope_theta,
            false,
            scaling.as_ref(),
            Some(args.max_position_embeddings),
        )?;
        let qk_norm = || -> crate::Result<Option<RmsNorm>> {
            Ok(match args.use_qk_norm {
                true => Some(RmsNorm::new(head_dim, args.rms_norm_eps)?),
                false => None,
            })
        };
        Ok(Attention {
            query_key_value: LinearLayer::new(
                dim,
                (n_heads + 2 * n_kv_heads) * head_dim,
                args.use_qkv_bias,
            )?,
            dense: LinearLayer::new(n_heads * head_dim, dim, args.use_bias)?,
            key_layernorm: qk_norm()?,
            query_layernorm: qk_norm()?,
            rope,
            n_heads,
            n_kv_heads,
            head_dim,
            scale: (head_dim as f64).powf(-0.5),
        })
    }

    /// `residual + dense(attention(x))`.
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        residual: &Array,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let q_size = self.n_heads * self.head_dim;
        let kv_size = self.n_kv_heads * self.head_dim;
        let qkv = self.query_key_value.forward(x)?;
        let parts = qkv.split_at(&[q_size, q_size + kv_size], -1)?;
        let [q, k, v] = <[Array; 3]>::try_from(parts).map_err(|_| {
            mlx_array::Error::InvalidArgument("bailing_moe: expected a split in three".into())
        })?;
        let mut queries = split_heads(&q, b, l, self.n_heads)?;
        let mut keys = split_heads(&k, b, l, self.n_kv_heads)?;
        let values = split_heads(&v, b, l, self.n_kv_heads)?;
        if let (Some(qn), Some(kn)) = (&self.query_layernorm, &self.key_layernorm) {
            queries = qn.forward(&queries)?;
            keys = kn.forward(&keys)?;
        }
        let out = rope_attend(&queries, &keys, values, &self.rope, cache, self.scale, mask)?;
        project_out(&self.dense, &merge_heads(&out, b, l)?, Some(residual))
    }
}

/// The routing constants of [`group_expert_select`].
#[derive(Debug, Clone, Copy)]
struct Routing {
    top_k: i32,
    n_group: i32,
    topk_group: i32,
    routed_scaling_factor: f64,
    norm_topk_prob: bool,
    sigmoid: bool,
}

/// mlx-lm's compiled `group_expert_select` of this file: softmax (or sigmoid) scores in
/// float32, the expert bias added for the choice only, the weak groups zeroed where
/// `n_group > 1`, the top `k` by `argpartition(kth=-k)`; their uncorrected scores,
/// normalized (`+ 1e-20`) where `k > 1` and `norm_topk_prob`, scaled, and cast back to
/// the gates' dtype.
fn group_expert_select(gates: &Array, bias: Option<&Array>, r: Routing) -> Result<Vec<Array>> {
    let g = gates.astype(Dtype::Float32)?;
    let orig_scores = match r.sigmoid {
        true => g.sigmoid()?,
        false => g.softmax(Some(&[-1]), false)?,
    };
    let mut scores = match bias {
        Some(b) => orig_scores.add(b)?,
        None => orig_scores.clone(),
    };
    if r.n_group > 1 {
        scores = zero_weak_groups(&scores, r.n_group, r.topk_group)?;
    }
    let inds = top_k_indices(&scores, r.top_k)?;
    let mut chosen = orig_scores.take_along_axis(&inds, -1)?;
    if r.top_k > 1 && r.norm_topk_prob {
        chosen = chosen.divide(&chosen.sum(Some(&[-1]), true)?.add(1e-20)?)?;
    }
    let chosen = chosen.multiply(r.routed_scaling_factor)?.astype(gates.dtype())?;
    Ok(vec![inds, chosen])
}

/// The router: `gate_proj` (quantized at 8 bits by mlx-lm's predicate), then
/// `group_expert_select`.
#[derive(Debug)]
pub struct Gate {
    gate_proj: LinearLayer,
    expert_bias: Option<Param>,
    routing: Routing,
}
impl_module!(Gate {
    gate_proj,
    expert_bias
});

impl Gate {
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = self.gate_proj.forward(x)?;
        let r = self.routing;
        let with_bias = self.expert_bias.is_some();
        let key = format!(
            "bailing_moe.group_expert_select:{}:{}:{}:{:e}:{}:{}:{with_bias}",
            r.top_k, r.n_group, r.topk_group, r.routed_scaling_factor, r.norm_topk_prob, r.sigmoid
        );
        let make = move || -> KeyedBody {
            Box::new(move |a| group_expert_select(&a[0], a.get(1), r))
        };
        let mut inputs = vec![&gates];
        if let Some(b) = &self.expert_bias {
            inputs.push(&**b);
        }
        router_outputs(call_compiled_keyed(&key, make, &inputs)?, "bailing_moe")
    }
}

/// Routed experts plus the shared ones.
#[derive(Debug)]
pub struct Moe {
    switch_mlp: SwitchGlu,
    gate: Gate,
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

impl Moe {
    fn new(args: &ModelArgs, n_experts: i32) -> crate::Result<Moe> {
        let (dim, k) = (args.hidden_size, args.num_experts_per_tok);
        if k < 1 || k > n_experts {
            return Err(config_error("bailing_moe", format!(
                "key `num_experts_per_tok` must be between 1 and `num_experts` ({n_experts}), \
                 got {k}"
            )));
        }
        let (g, tg) = (args.n_group, args.topk_group);
        if g > 1 && (n_experts % g != 0 || n_experts / g < 2 || tg < 0 || tg > g) {
            return Err(config_error("bailing_moe", format!(
                "with `n_group` {g}, `num_experts` ({n_experts}) must split into groups of at \
                 least two and `topk_group` ({tg}) must be between 0 and `n_group`"
            )));
        }
        let sigmoid = match args.score_function.as_str() {
            "sigmoid" => true,
            // mlx-lm's `else`: any other name scores with softmax.
            _ => false,
        };
        let expert_bias = match args.moe_router_enable_expert_bias {
            true => Some(Param::new(mlx_array::ops::zeros(&[n_experts], Dtype::Float32)?)),
            false => None,
        };
        let shared_dim = args
            .moe_shared_expert_intermediate_size
            .filter(|&n| n != 0)
            .unwrap_or(args.moe_intermediate_size);
        let shared_experts = (args.num_shared_experts > 0 && args.moe_router_enable_shared_expert)
            .then(|| Mlp::new(dim, shared_dim * args.num_shared_experts, args.use_bias))
            .transpose()?;
        Ok(Moe {
            switch_mlp: SwitchGlu::new(dim, args.moe_intermediate_size, n_experts, args.use_bias)?,
            gate: Gate {
                gate_proj: LinearLayer::new(dim, n_experts, false)?,
                expert_bias,
                routing: Routing {
                    top_k: k,
                    n_group: g,
                    topk_group: tg,
                    routed_scaling_factor: args.routed_scaling_factor,
                    norm_topk_prob: args.norm_topk_prob,
                    sigmoid,
                },
            },
            shared_experts,
        })
    }
}

/// One decoder layer.
#[derive(Debug)]
pub struct Layer {
    attention: Attention,
    mlp: DenseOrMoe<Moe>,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(Layer {
    attention,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl Layer {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self
            .attention
            .forward(&self.input_layernorm.forward(x)?, mask, cache, x)?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// `word_embeddings`, the layers and the final `norm`.
#[derive(Debug)]
pub struct Stack {
    word_embeddings: EmbeddingLayer,
    layers: Vec<Layer>,
    norm: RmsNorm,
}
impl_module!(Stack {
    word_embeddings,
    layers,
    norm
});

/// Bailing MoE with its head (`lm_head`, or the word embeddings where tied).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Stack,
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
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        if args.norm_head && args.tie_word_embeddings {
            return Err(config_error("bailing_moe", 
                "`norm_head` with `tie_word_embeddings`: mlx-lm's sanitize normalizes \
                 `lm_head.weight` after dropping it (a KeyError)"
                    .into(),
            ));
        }
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let mlp = match args.num_experts {
                    Some(n) if i >= args.first_k_dense_replace => {
                        DenseOrMoe::Moe(Box::new(Moe::new(&args, n)?))
                    }
                    _ => DenseOrMoe::Dense(Box::new(Mlp::new(
                        dim,
                        args.intermediate_size,
                        args.use_bias,
                    )?)),
                };
                Ok(Layer {
                    attention: Attention::new(&args)?,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Stack {
            word_embeddings: EmbeddingLayer::new(args.vocab_size, dim)?,
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
    Ok(Box::new(Model::new(parse_args(config, "bailing_moe")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let h = self.model.word_embeddings.forward(tokens)?;
        let h = causal_layers(&self.model.layers, h, caches, |l, x, m, c| l.forward(x, m, c))?;
        let out = self.model.norm.forward(&h)?;
        let embed = &self.model.word_embeddings;
        head::logits(embed, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        let a = &self.args;
        if a.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        if a.norm_head {
            let w = weights.remove("lm_head.weight").ok_or_else(|| crate::Error::Weights {
                path: "model weights".into(),
                message: "`norm_head` needs `lm_head.weight`".into(),
            })?;
            let dtype = w.dtype();
            if !dtype.is_floating() {
                return Err(crate::Error::Weights {
                    path: "model weights".into(),
                    message: "`norm_head` with a quantized `lm_head`: mlx-lm's sanitize \
                              would divide the packed integers by their norms (a broken \
                              head); load the unquantized checkpoint"
                        .into(),
                });
            }
            let w32 = w.astype(Dtype::Float32)?;
            let n = norm(&w32, NormOrd::Default, Some(&[0]), true)?.add(1e-7)?;
            weights.insert("lm_head.weight".into(), w.divide(&n)?.astype(dtype)?);
        }
        if let Some(n_experts) = a.num_experts {
            stack_mlp_experts(&mut weights, a.num_hidden_layers, n_experts)?;
        }
        for l in a.first_k_dense_replace.max(0)..a.num_hidden_layers {
            let gate = format!("model.layers.{l}.mlp.gate");
            for kind in ["weight", "bias"] {
                if let Some(v) = weights.remove(&format!("{gate}.{kind}")) {
                    weights.insert(format!("{gate}.gate_proj.{kind}"), v);
                }
            }
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}
