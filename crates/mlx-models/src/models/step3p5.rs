//! Step 3.5 (`step3p5`), following `mlx_lm/models/step3p5.py`: pre-norm layers (plain
//! weighted RMS norms); sliding (`layer_types`, else every even layer) or full
//! attention, the sliding layers with `attention_other_setting`'s heads where it is
//! set, per-head RMS `q_norm` / `k_norm`, RoPE from `initialize_rope` over
//! `head_dim * partial_rotary_factors[i]` dimensions at `rope_theta` (or its entry `i`),
//! `rope_scaling` only on the `yarn_only_types` (all layers without that list), each
//! head of the output times `sigmoid(g_proj(x))` by `use_head_wise_attn_gate`; a
//! `RotatingKVCache(sliding_window)` with the windowed mask or a `KVCache`; the layers of
//! `moe_layers_enum` (default all but the first) routed experts (sigmoid scores of
//! float32 logits chosen with `router_bias`, normalized with 1e-20 by
//! `norm_expert_weight`, times `moe_router_scaling_factor`) plus a shared expert, the
//! others a SwiGLU MLP, each SwiGLU clamped where `swiglu_limits` /
//! `swiglu_limits_shared` give the layer a positive limit; an untied head. `sanitize`
//! renames the original layout (`moe.*`, `share_expert.*`, norms stored minus one) and
//! drops MTP layers.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt, OutGate};
use super::config_error;
use super::deepseek_v3::cast_all_except;
use super::{
    layer_caches, router_outputs, swiglu_mlp, top_k_indices_of_negated, weigh_experts,
    Architecture, LayerMasks, Weights,
};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result, Scalar};
use mlx_nn::activations::{call_compiled_keyed, clamped_swiglu, KeyedBody};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, GluActivation, KvCache, LinearLayer,
    Param, RmsNorm, SwitchGlu,
};
use serde::Deserialize;
use serde_json::{Map, Value};

const SLIDING: &str = "sliding_attention";

/// config.json keys read by Step 3.5 (mlx-lm's defaults for the optional ones).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub vocab_size: i32,
    pub num_attention_heads: i32,
    pub num_attention_groups: i32,
    pub head_dim: i32,
    pub intermediate_size: i32,
    #[serde(default = "d::rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// A number, or one per layer.
    #[serde(default = "d::rope_theta")]
    pub rope_theta: Value,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "d::max_position_embeddings")]
    pub max_position_embeddings: i32,
    #[serde(default = "d::sliding_window")]
    pub sliding_window: i32,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub yarn_only_types: Option<Vec<String>>,
    #[serde(default)]
    pub partial_rotary_factors: Option<Vec<f64>>,
    #[serde(default)]
    pub attention_other_setting: Option<Map<String, Value>>,
    #[serde(default = "d::yes")]
    pub use_head_wise_attn_gate: bool,
    #[serde(default = "d::moe_num_experts")]
    pub moe_num_experts: i32,
    #[serde(default = "d::moe_top_k")]
    pub moe_top_k: i32,
    #[serde(default = "d::dim_1280")]
    pub moe_intermediate_size: i32,
    #[serde(default = "d::dim_1280")]
    pub share_expert_dim: i32,
    #[serde(default)]
    pub moe_layers_enum: Option<String>,
    #[serde(default = "d::scaling")]
    pub moe_router_scaling_factor: f64,
    #[serde(default = "d::yes")]
    pub norm_expert_weight: bool,
    #[serde(default)]
    pub swiglu_limits: Option<Vec<Option<f64>>>,
    #[serde(default)]
    pub swiglu_limits_shared: Option<Vec<Option<f64>>>,
}

/// mlx-lm's dataclass defaults.
mod d {
    use serde_json::Value;
    pub fn rms_norm_eps() -> f64 {
        1e-5
    }
    pub fn rope_theta() -> Value {
        Value::from(10000.0)
    }
    pub fn max_position_embeddings() -> i32 {
        262144
    }
    pub fn sliding_window() -> i32 {
        512
    }
    pub fn yes() -> bool {
        true
    }
    pub fn moe_num_experts() -> i32 {
        288
    }
    pub fn moe_top_k() -> i32 {
        8
    }
    pub fn dim_1280() -> i32 {
        1280
    }
    pub fn scaling() -> f64 {
        3.0
    }
}

/// A layer's limit from `swiglu_limits` / `swiglu_limits_shared` (`or 0`; only a
/// positive one clamps).
fn limit(list: &Option<Vec<Option<f64>>>, i: usize) -> Option<f64> {
    list.as_ref()
        .and_then(|l| l.get(i).copied().flatten())
        .filter(|&v| v > 0.0)
}

/// `Step3p5MLP`: SwiGLU, clamped where the layer has a limit.
#[derive(Debug)]
struct StepMlp {
    gate_proj: LinearLayer,
    up_proj: LinearLayer,
    down_proj: LinearLayer,
    limit: Option<f64>,
}
impl_module!(StepMlp {
    gate_proj,
    up_proj,
    down_proj
});

impl StepMlp {
    fn new(dim: i32, hidden: i32, limit: Option<f64>) -> crate::Result<StepMlp> {
        Ok(StepMlp {
            gate_proj: LinearLayer::new(dim, hidden, false)?,
            up_proj: LinearLayer::new(dim, hidden, false)?,
            down_proj: LinearLayer::new(hidden, dim, false)?,
            limit,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        match self.limit {
            Some(l) => {
                let h = clamped_swiglu(&self.up_proj.forward(x)?, &self.gate_proj.forward(x)?, l)?;
                self.down_proj.forward(&h)
            }
            None => self
                .down_proj
                .forward(&swiglu_mlp(None, &self.gate_proj, &self.up_proj, x)?),
        }
    }
}

/// `Step3p5MoEGate`: the router and its selection bias.
#[derive(Debug)]
struct MoeGate {
    gate: LinearLayer,
    router_bias: Param,
    top_k: i32,
    scaling: f64,
    norm: bool,
}
impl_module!(MoeGate { gate, router_bias });

/// mlx-lm's compiled `moe_gate_select`.
fn moe_gate_select(
    gates: &Array,
    bias: &Array,
    top_k: i32,
    scaling: f64,
    norm: bool,
) -> Result<Vec<Array>> {
    let scores = gates.astype(Dtype::Float32)?.sigmoid()?;
    let corrected = scores.add(bias)?;
    let inds = top_k_indices_of_negated(&corrected, top_k)?;
    let mut w = scores.take_along_axis(&inds, -1)?;
    if norm {
        let tiny = Array::weak_scalar(Scalar::Float(1e-20), w.dtype())?;
        w = w.divide(&w.sum(Some(&[-1]), true)?.add(&tiny)?)?;
    }
    Ok(vec![inds, w.multiply(scaling)?])
}

impl MoeGate {
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = self.gate.forward(x)?;
        let (k, s, norm) = (self.top_k, self.scaling, self.norm);
        let key = format!("step3p5.moe_gate_select:{k}:{s:e}:{norm}");
        let make = move || -> KeyedBody { Box::new(move |a| moe_gate_select(&a[0], &a[1], k, s, norm)) };
        router_outputs(
            call_compiled_keyed(&key, make, &[&gates, &self.router_bias])?,
            "step3p5",
        )
    }
}

/// `Step3p5MoE`: routed experts plus the shared expert.
#[derive(Debug)]
struct Moe {
    gate: MoeGate,
    switch_mlp: SwitchGlu,
    share_expert: StepMlp,
}
impl_module!(Moe {
    gate,
    switch_mlp,
    share_expert
});

impl Moe {
    fn forward(&self, x: &Array) -> Result<Array> {
        let (inds, weights) = self.gate.route(x)?;
        let routed = weigh_experts(&self.switch_mlp.forward(x, &inds)?, &weights)?;
        routed.add(&self.share_expert.forward(x)?)
    }
}

/// A layer's feed-forward block.
#[derive(Debug)]
enum FeedForward {
    Dense(Box<StepMlp>),
    Sparse(Box<Moe>),
}
enum_module!(FeedForward {
    Dense => "",
    Sparse => "",
});

/// `Step3p5DecoderLayer`.
#[derive(Debug)]
struct DecoderLayer {
    self_attn: Attention,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    sliding: bool,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
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
        let h = x.add(&r)?;
        let n = self.post_attention_layernorm.forward(&h)?;
        let r = match &self.mlp {
            FeedForward::Dense(m) => m.forward(&n)?,
            FeedForward::Sparse(m) => m.forward(&n)?,
        };
        h.add(&r)
    }
}

/// `Step3p5Model`.
#[derive(Debug)]
struct StepModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(StepModel {
    embed_tokens,
    layers,
    norm
});

/// Step 3.5 with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: StepModel,
    lm_head: LinearLayer,
}

impl_module!(Model { model, lm_head }
    /// mlx-lm's `cast_predicate`: the routers' `router_bias` keeps its dtype.
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        cast_all_except(self, dtype, "router_bias")
    }
);

/// Layer `i`'s attention (`Step3p5Attention`).
fn attention(a: &ModelArgs, i: usize, sliding: bool) -> crate::Result<Attention> {
    let err = |m: String| config_error("step3p5", m);
    let (mut heads, mut kv) = (a.num_attention_heads, a.num_attention_groups);
    if sliding {
        if let Some(other) = &a.attention_other_setting {
            let get = |key: &str| {
                other
                    .get(key)
                    .and_then(Value::as_i64)
                    .and_then(|v| i32::try_from(v).ok())
                    .ok_or_else(|| {
                        err(format!(
                            "key `attention_other_setting.{key}` must be an integer"
                        ))
                    })
            };
            heads = get("num_attention_heads")?;
            kv = get("num_attention_groups")?;
        }
    }
    if heads <= 0 || kv <= 0 || heads % kv != 0 {
        return Err(err(format!(
            "layer {i}: query heads ({heads}) must be a positive multiple of the key-value \
             groups ({kv})"
        )));
    }
    let theta = match &a.rope_theta {
        Value::Array(list) => list.get(i).and_then(Value::as_f64).ok_or_else(|| {
            err(format!("key `rope_theta`: no number for layer {i}"))
        })?,
        v => v
            .as_f64()
            .ok_or_else(|| err(format!("key `rope_theta` must be a number or a list, got {v}")))?,
    };
    let factor = a
        .partial_rotary_factors
        .as_ref()
        .and_then(|f| f.get(i).copied())
        .unwrap_or(1.0);
    let dims = (f64::from(a.head_dim) * factor) as i32;
    if dims <= 0 || dims > a.head_dim || dims % 2 != 0 {
        return Err(err(format!(
            "layer {i}: invalid rotary dimension {dims} for head_dim={}",
            a.head_dim
        )));
    }
    let layer_type = a
        .layer_types
        .as_ref()
        .filter(|t| !t.is_empty())
        .map_or("full_attention", |t| t[i].as_str());
    let yarn_only = a.yarn_only_types.as_ref().filter(|t| !t.is_empty());
    let scaling = match yarn_only {
        Some(types) if !types.iter().any(|t| t == layer_type) => None,
        _ => crate::config::rope_scaling(a.rope_scaling.as_ref())?,
    };
    let rope = initialize_rope(
        dims,
        theta,
        false,
        scaling.as_ref(),
        Some(a.max_position_embeddings),
    )?;
    let d = AttentionDims {
        dim: a.hidden_size,
        n_heads: heads,
        n_kv_heads: kv,
        head_dim: a.head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let eps = a.rms_norm_eps;
    let mut attn = Attention::new(d, rope, f64::from(a.head_dim).powf(-0.5))?
        .with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))?;
    if a.use_head_wise_attn_gate {
        attn = attn.with_output_gate("g_proj", a.hidden_size, false, OutGate::PerHead)?;
    }
    Ok(attn)
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |m: String| config_error("step3p5", m);
        let n = usize::try_from(args.num_hidden_layers)
            .map_err(|_| err("key `num_hidden_layers` must not be negative".into()))?;
        let types = args.layer_types.clone().filter(|t| !t.is_empty());
        if let Some(t) = &types {
            if t.len() < n {
                return Err(err(format!(
                    "key `layer_types` has {} entries for {n} layers",
                    t.len()
                )));
            }
        }
        let moe_layers: Vec<usize> = match &args.moe_layers_enum {
            Some(list) => list
                .trim()
                .split(',')
                .map(|p| {
                    p.trim().parse::<usize>().map_err(|_| {
                        err(format!("key `moe_layers_enum`: {p:?} is not a layer index"))
                    })
                })
                .collect::<crate::Result<_>>()?,
            None => (1..n).collect(),
        };
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..n)
            .map(|i| {
                let sliding = match &types {
                    Some(t) => t[i] == SLIDING,
                    None => i % 2 == 0,
                };
                let self_attn = attention(&args, i, sliding)?;
                let mlp = if moe_layers.contains(&i) {
                    let (e, k) = (args.moe_num_experts, args.moe_top_k);
                    if k <= 0 || e < k {
                        return Err(err(format!(
                            "`moe_top_k` ({k}) must be positive and at most `moe_num_experts` ({e})"
                        )));
                    }
                    let mut switch_mlp = SwitchGlu::new(dim, args.moe_intermediate_size, e, false)?;
                    if let Some(l) = limit(&args.swiglu_limits, i) {
                        switch_mlp = switch_mlp.with_activation(GluActivation::ClampedSwiglu(l));
                    }
                    FeedForward::Sparse(Box::new(Moe {
                        gate: MoeGate {
                            gate: LinearLayer::new(dim, e, false)?,
                            router_bias: Param::new(ops::zeros(&[e], Dtype::Float32)?),
                            top_k: k,
                            scaling: args.moe_router_scaling_factor,
                            norm: args.norm_expert_weight,
                        },
                        switch_mlp,
                        share_expert: StepMlp::new(
                            dim,
                            args.share_expert_dim,
                            limit(&args.swiglu_limits_shared, i),
                        )?,
                    }))
                } else {
                    FeedForward::Dense(Box::new(StepMlp::new(
                        dim,
                        args.intermediate_size,
                        limit(&args.swiglu_limits_shared, i),
                    )?))
                };
                Ok(DecoderLayer {
                    self_attn,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    sliding,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        if layers.iter().any(|l| l.sliding) && args.sliding_window <= 0 {
            return Err(err(format!(
                "key `sliding_window` ({}) must be positive with sliding layers",
                args.sliding_window
            )));
        }
        let model = StepModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, false)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "step3p5")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let full_idx = m.layers.iter().position(|l| !l.sliding).unwrap_or(0);
        let swa_idx = m.layers.iter().position(|l| l.sliding);
        let masks = LayerMasks::new(n, caches, full_idx, swa_idx, Some(self.args.sliding_window))?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            let mask = masks.get(layer.sliding);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.lm_head.forward(&m.norm.forward(&h)?)
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

/// `sanitize`'s renames of the original layout (the first that applies to a key).
const REMAPPINGS: [(&str, &str); 6] = [
    (".moe.gate_proj.", ".mlp.switch_mlp.gate_proj."),
    (".moe.up_proj.", ".mlp.switch_mlp.up_proj."),
    (".moe.down_proj.", ".mlp.switch_mlp.down_proj."),
    (".moe.gate.", ".mlp.gate.gate."),
    (".moe.router_bias", ".mlp.gate.router_bias"),
    (".share_expert.", ".mlp.share_expert."),
];

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let is_vanilla = weights.keys().any(|k| {
            REMAPPINGS
                .iter()
                .any(|(src, dst)| k.contains(src) && !k.contains(dst))
        });
        let n = i64::from(self.args.num_hidden_layers);
        let mut out = Weights::new();
        for (k, v) in weights {
            if k.contains(".mtp") {
                continue;
            }
            if k.contains("model.layers.") {
                let parts: Vec<&str> = k.split('.').collect();
                if parts.len() > 2 {
                    if let Ok(i) = parts[2].parse::<i64>() {
                        if parts[2].chars().all(|c| c.is_ascii_digit()) && i >= n {
                            continue;
                        }
                    }
                }
            }
            let mut k = k;
            for (src, dst) in REMAPPINGS {
                if k.contains(src) && !k.contains(dst) {
                    k = k.replace(src, dst);
                    break;
                }
            }
            let v = if is_vanilla && k.ends_with(".weight") && k.contains("norm") {
                v.add(&Array::weak_scalar(Scalar::Int(1), v.dtype())?)?
            } else {
                v
            };
            out.insert(k, v);
        }
        Ok(out)
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
        }
        Ok(())
    }
}
