//! Laguna (`laguna`), following `mlx_lm/models/laguna.py`: pre-norm layers whose
//! attention has its own head count per layer (`num_attention_heads_per_layer`), Qwen3's
//! per-head `q_norm` / `k_norm`, RoPE from `initialize_rope` over
//! `head_dim * partial_rotary_factor` dimensions with the layer type's entry of
//! `rope_parameters` (its `rope_theta` the base, the rest the scaling), and, by
//! `gating`, each head of the output times `softplus(g_proj(x))` (in float32) before
//! `o_proj`; `layer_types` (default all `full_attention`) choosing a
//! `RotatingKVCache(sliding_window)` and the windowed mask or a `KVCache`; by
//! `mlp_layer_types` (default one `dense`, then `sparse`) a SwiGLU MLP or experts routed
//! by `sigmoid` (or `sqrtsoftplus`) scores of optionally soft-capped float32 logits,
//! chosen with `e_score_correction_bias` and normalized, their output times
//! `moe_routed_scaling_factor` plus a shared expert; the head tied by
//! `tie_word_embeddings`. `sanitize` drops a `language_model.` prefix and a tied head,
//! moves the bare router and its bias under `gate`, and stacks the experts.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt, OutGate};
use super::config_error;
use super::decoder::stack_mlp_experts;
use super::deepseek_v3::cast_all_but_bias;
use super::head::{self, LogitScale};
use super::lm::drop_tied_head;
use super::mlp::Mlp;
use super::{
    layer_caches, top_k_indices_of_negated, weigh_experts, Architecture, LayerMasks, Weights,
};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Param,
    RmsNorm, SwitchGlu,
};
use serde::Deserialize;
use serde_json::{Map, Value};

const SLIDING: &str = "sliding_attention";
const FULL: &str = "full_attention";

/// config.json keys read by Laguna (mlx-lm's defaults for the others).
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
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub max_position_embeddings: i32,
    pub rms_norm_eps: f64,
    pub attention_bias: bool,
    pub qkv_bias: bool,
    pub gating: bool,
    pub tie_word_embeddings: bool,
    pub sliding_window: Option<i32>,
    pub partial_rotary_factor: Option<f64>,
    pub rope_parameters: Option<Map<String, Value>>,
    pub layer_types: Option<Vec<String>>,
    pub num_attention_heads_per_layer: Option<Vec<i32>>,
    pub mlp_layer_types: Option<Vec<String>>,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub moe_intermediate_size: i32,
    pub shared_expert_intermediate_size: i32,
    pub moe_routed_scaling_factor: f64,
    pub moe_router_logit_softcapping: f64,
    pub moe_router_score_func: String,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "laguna".into(),
            vocab_size: 100352,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 40,
            num_attention_heads: 48,
            num_key_value_heads: 8,
            head_dim: 128,
            max_position_embeddings: 262144,
            rms_norm_eps: 1e-6,
            attention_bias: false,
            qkv_bias: false,
            gating: true,
            tie_word_embeddings: false,
            sliding_window: Some(512),
            partial_rotary_factor: None,
            rope_parameters: None,
            layer_types: None,
            num_attention_heads_per_layer: None,
            mlp_layer_types: None,
            num_experts: 256,
            num_experts_per_tok: 8,
            moe_intermediate_size: 512,
            shared_expert_intermediate_size: 512,
            moe_routed_scaling_factor: 1.0,
            moe_router_logit_softcapping: 0.0,
            moe_router_score_func: "sigmoid".into(),
        }
    }
}

/// One layer's plan: sliding or not, its query heads, sparse or not.
struct LayerPlan {
    sliding: bool,
    heads: i32,
    sparse: bool,
    layer_type: String,
}

/// `__post_init__`'s defaults for the per-layer lists (mlx-lm indexes their first
/// `num_hidden_layers` entries; fewer are a config error).
fn plan(args: &ModelArgs) -> crate::Result<Vec<LayerPlan>> {
    let err = |m: String| config_error("laguna", m);
    let n = usize::try_from(args.num_hidden_layers)
        .map_err(|_| err("key `num_hidden_layers` must not be negative".into()))?;
    let types = args
        .layer_types
        .clone()
        .unwrap_or_else(|| vec![FULL.to_string(); n]);
    let mlp_types = args.mlp_layer_types.clone().unwrap_or_else(|| {
        (0..n)
            .map(|i| if i == 0 { "dense" } else { "sparse" }.to_string())
            .collect()
    });
    let heads = args
        .num_attention_heads_per_layer
        .clone()
        .unwrap_or_else(|| vec![args.num_attention_heads; n]);
    for (key, len) in [
        ("layer_types", types.len()),
        ("mlp_layer_types", mlp_types.len()),
        ("num_attention_heads_per_layer", heads.len()),
    ] {
        if len < n {
            return Err(err(format!("key `{key}` has {len} entries for {n} layers")));
        }
    }
    // `layer_types.index("full_attention")`: the full mask's cache.
    if !types[..n].iter().any(|t| t == FULL) && n > 0 {
        return Err(err("key `layer_types`: no \"full_attention\" layer".into()));
    }
    let kv = args.num_key_value_heads;
    let plan = (0..n)
        .map(|i| LayerPlan {
            sliding: types[i] == SLIDING,
            heads: heads[i],
            sparse: mlp_types[i] == "sparse",
            layer_type: types[i].clone(),
        })
        .collect::<Vec<_>>();
    if let Some(p) = plan
        .iter()
        .find(|p| p.heads <= 0 || kv <= 0 || p.heads % kv != 0)
    {
        return Err(err(format!(
            "a layer's query heads ({}) must be a positive multiple of `num_key_value_heads` \
             ({kv})",
            p.heads
        )));
    }
    if plan.iter().any(|p| p.sliding) && args.sliding_window.is_none_or(|w| w <= 0) {
        return Err(err(format!(
            "key `sliding_window` ({:?}) must be positive with sliding layers",
            args.sliding_window
        )));
    }
    if plan.iter().any(|p| p.sparse) {
        let (e, k) = (args.num_experts, args.num_experts_per_tok);
        if k <= 0 || e < k {
            return Err(err(format!(
                "`num_experts_per_tok` ({k}) must be positive and at most `num_experts` ({e})"
            )));
        }
        let f = args.moe_router_score_func.as_str();
        if f != "sigmoid" && f != "sqrtsoftplus" {
            return Err(err(format!("unknown `moe_router_score_func`: {f:?}")));
        }
    }
    Ok(plan)
}

/// `_layer_rope`: the layer type's `rope_parameters` entry (its `rope_theta` the base,
/// the rest the scaling, `rope_type` "default" where it names none) over
/// `head_dim * partial_rotary_factor` dimensions.
fn layer_rope(args: &ModelArgs, layer_type: &str) -> crate::Result<mlx_nn::Rope> {
    let err = |m: String| config_error("laguna", m);
    let params = match args.rope_parameters.as_ref().and_then(|p| p.get(layer_type)) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(err(format!(
                "key `rope_parameters.{layer_type}` must be an object, got {other}"
            )))
        }
    };
    let number = |key: &str, default: f64| match params.get(key) {
        None => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| {
            err(format!(
                "key `rope_parameters.{layer_type}.{key}` must be a number, got {v}"
            ))
        }),
    };
    let base = number("rope_theta", 10000.0)?;
    let partial = number("partial_rotary_factor", args.partial_rotary_factor.unwrap_or(1.0))?;
    let dims = (f64::from(args.head_dim) * partial) as i32;
    if dims <= 0 || dims > args.head_dim || dims % 2 != 0 {
        return Err(err(format!(
            "invalid rotary dimension {dims} for {layer_type} with head_dim={}",
            args.head_dim
        )));
    }
    let mut scaling: Map<String, Value> = params
        .into_iter()
        .filter(|(k, _)| k != "rope_theta")
        .collect();
    if !scaling.contains_key("rope_type") && !scaling.contains_key("type") {
        scaling.insert("rope_type".into(), "default".into());
    }
    let scaling = crate::config::rope_scaling(Some(&Value::Object(scaling)))?;
    Ok(initialize_rope(
        dims,
        base,
        false,
        scaling.as_ref(),
        Some(args.max_position_embeddings),
    )?)
}

/// `MoEGate`: the router (`proj`) and its selection bias.
#[derive(Debug)]
pub struct MoeGate {
    proj: LinearLayer,
    e_score_correction_bias: Param,
}
impl_module!(MoeGate {
    proj,
    e_score_correction_bias
});

/// `MoE`: routed experts times `moe_routed_scaling_factor` plus the shared expert.
#[derive(Debug)]
pub struct Moe {
    gate: MoeGate,
    switch_mlp: SwitchGlu,
    shared_expert: Mlp,
    top_k: i32,
    softcap: f64,
    sqrt_softplus: bool,
    scaling: f64,
}
impl_module!(Moe {
    gate,
    switch_mlp,
    shared_expert
});

impl Moe {
    /// `MoEGate.__call__`: the chosen experts and their normalized scores (float32).
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let mut logits = self.gate.proj.forward(x)?.astype(Dtype::Float32)?;
        if self.softcap > 0.0 {
            logits = logits.divide(self.softcap)?.tanh()?.multiply(self.softcap)?;
        }
        let scores = if self.sqrt_softplus {
            mlx_nn::activations::softplus(&logits)?.sqrt()?
        } else {
            logits.sigmoid()?
        };
        let biased = scores.add(&*self.gate.e_score_correction_bias)?;
        let inds = top_k_indices_of_negated(&biased, self.top_k)?;
        let weights = scores.take_along_axis(&inds, -1)?;
        let weights = weights.divide(&weights.sum(Some(&[-1]), true)?)?;
        Ok((inds, weights))
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let shared = self.shared_expert.forward(x, None)?;
        let (inds, weights) = self.route(x)?;
        let y = weigh_experts(&self.switch_mlp.forward(x, &inds)?, &weights)?;
        y.multiply(self.scaling)?.add(&shared)
    }
}

/// A layer's feed-forward block: dense or routed.
#[derive(Debug)]
pub enum FeedForward {
    /// `MLP`.
    Dense(Box<Mlp>),
    /// `MoE`.
    Sparse(Box<Moe>),
}

enum_module!(FeedForward {
    Dense => "",
    Sparse => "",
});

/// `TransformerBlock`.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    sliding: bool,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let r = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            None,
            Default::default(),
        )?;
        let h = x.add(&r)?;
        let n = self.post_attention_layernorm.forward(&h)?;
        let r = match &self.mlp {
            FeedForward::Dense(m) => m.forward(&n, None)?,
            FeedForward::Sparse(m) => m.forward(&n)?,
        };
        h.add(&r)
    }
}

/// `LagunaModel`.
#[derive(Debug)]
pub struct LagunaModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
}
impl_module!(LagunaModel {
    embed_tokens,
    layers,
    norm
});

/// Laguna with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: LagunaModel,
    lm_head: Option<LinearLayer>,
}

impl_module!(Model { model, lm_head }
    /// mlx-lm's `cast_predicate`: the routers' `e_score_correction_bias` keeps its dtype.
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        cast_all_but_bias(self, dtype)
    }
);

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let plan = plan(&args)?;
        let (dim, eps, head_dim) = (args.hidden_size, args.rms_norm_eps, args.head_dim);
        let layers = plan
            .iter()
            .map(|p| {
                let d = AttentionDims {
                    dim,
                    n_heads: p.heads,
                    n_kv_heads: args.num_key_value_heads,
                    head_dim,
                    qkv_bias: args.qkv_bias,
                    o_bias: args.attention_bias,
                };
                let rope = layer_rope(&args, &p.layer_type)?;
                let mut self_attn = Attention::new(d, rope, f64::from(head_dim).powf(-0.5))?
                    .with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))?;
                if args.gating {
                    self_attn =
                        self_attn.with_output_gate("g_proj", dim, false, OutGate::PerHeadSoftplusF32)?;
                }
                let mlp = if p.sparse {
                    FeedForward::Sparse(Box::new(Moe {
                        gate: MoeGate {
                            proj: LinearLayer::new(dim, args.num_experts, false)?,
                            e_score_correction_bias: Param::new(ops::zeros(
                                &[args.num_experts],
                                Dtype::Float32,
                            )?),
                        },
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.moe_intermediate_size,
                            args.num_experts,
                            false,
                        )?,
                        shared_expert: Mlp::new(dim, args.shared_expert_intermediate_size, false)?,
                        top_k: args.num_experts_per_tok,
                        softcap: args.moe_router_logit_softcapping,
                        sqrt_softplus: args.moe_router_score_func == "sqrtsoftplus",
                        scaling: args.moe_routed_scaling_factor,
                    }))
                } else {
                    FeedForward::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?))
                };
                Ok(TransformerBlock {
                    self_attn,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    sliding: p.sliding,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = LagunaModel {
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

    fn window(&self) -> i32 {
        self.args.sliding_window.unwrap_or(0)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "laguna")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let fa_idx = m.layers.iter().position(|l| !l.sliding).unwrap_or(0);
        let swa_idx = m.layers.iter().position(|l| l.sliding);
        let masks = LayerMasks::new(n, caches, fa_idx, swa_idx, Some(self.window()))?;
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
        super::window_cache_specs(sliding, self.window())
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let prefix = "language_model.";
        let mut weights: Weights = if weights.keys().any(|k| k.starts_with(prefix)) {
            weights
                .into_iter()
                .map(|(k, v)| match k.strip_prefix(prefix) {
                    Some(rest) => (rest.to_string(), v),
                    None => (k, v),
                })
                .collect()
        } else {
            weights
        };
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        for l in 0..self.args.num_hidden_layers {
            let prefix = format!("model.layers.{l}.mlp");
            if let Some(w) = weights.remove(&format!("{prefix}.gate.weight")) {
                weights.insert(format!("{prefix}.gate.proj.weight"), w);
            }
            let bias = format!("{prefix}.experts.e_score_correction_bias");
            if let Some(b) = weights.remove(&bias) {
                weights.insert(format!("{prefix}.gate.e_score_correction_bias"), b);
            }
        }
        stack_mlp_experts(&mut weights, self.args.num_hidden_layers, self.args.num_experts)?;
        Ok(weights)
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            match &mut layer.mlp {
                FeedForward::Dense(m) => m.fuse()?,
                FeedForward::Sparse(m) => m.shared_expert.fuse()?,
            }
        }
        Ok(())
    }
}
