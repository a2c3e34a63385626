//! Mistral 4 (`mistral4`, also the text model of a `mistral3` checkpoint), following
//! `mlx_lm/models/mistral4.py`: DeepSeek-V3's multi-head latent attention
//! ([`MlaAttention`], its latent `KVCache` and the decoding path through it) with the
//! rotation, its interleaving (`rope_interleave`, default true) and YaRN's attention
//! mscale all from `rope_parameters`, Llama 4's position-dependent query scale
//! (ministral3's) on both query halves after the rotation, and prompts attending to the
//! expanded keys and values (nope and rope halves concatenated) under the ordinary mask.
//! The experts are routed by a plain `gate` linear layer (quantized with the rest):
//! softmax scores, optionally group-limited, the top k renormalized with `1e-20` added
//! to the sum when `norm_topk_prob`, then scaled; shared experts beside them and dense
//! SwiGLU MLPs in the first `first_k_dense_replace` layers. `sanitize` reads
//! compressed-tensors int4, dequantizes FP8 (per-tensor, per-expert and 128x128 block
//! `*_scale_inv`, `activation_scale` dropped), splits fused `experts.gate_up_proj`,
//! stacks per-expert weights and splits `kv_b_proj` into `embed_q` / `unembed_out`.
use super::decoder::{stack_mlp_experts, DenseOrMoe, FeedForward, fuse_shared, routed_output};
use super::deepseek_v3::{self, MlaAttention};
use super::head::{self, LogitScale};
use super::lm::Stack;
use super::ministral3::llama4_attn_scale;
use super::mlp::Mlp;
use super::{cache_at, layer_caches, router_outputs, top_k_indices_of_negated};
use super::{zero_weak_groups, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::activations::{call_compiled_keyed, KeyedBody};
use mlx_nn::cache::{create_attention_mask, RopePosition};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm,
    RopeScaling, SwitchGlu,
};
use serde::Deserialize;
use serde_json::{Map, Value};

/// config.json keys read by Mistral 4 (those without a default are required, as in
/// mlx-lm; `q_lora_rank`, `n_shared_experts` and `n_routed_experts` may be null).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs, dead_code)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    num_key_value_heads: i32,
    #[serde(deserialize_with = "Option::deserialize")]
    pub n_shared_experts: Option<i32>,
    #[serde(deserialize_with = "Option::deserialize")]
    pub n_routed_experts: Option<i32>,
    pub routed_scaling_factor: f64,
    pub kv_lora_rank: i32,
    #[serde(deserialize_with = "Option::deserialize")]
    pub q_lora_rank: Option<i32>,
    pub norm_topk_prob: bool,
    pub max_position_embeddings: i32,
    pub rms_norm_eps: f64,
    pub topk_group: i32,
    pub num_experts_per_tok: i32,
    pub first_k_dense_replace: i32,
    pub n_group: i32,
    pub qk_rope_head_dim: i32,
    pub qk_nope_head_dim: i32,
    pub v_head_dim: i32,
    #[serde(default)]
    head_dim: Option<i32>,
    #[serde(default)]
    qk_head_dim: Option<i32>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub rope_interleave: Option<bool>,
    #[serde(default)]
    pub attention_bias: bool,
    /// The rotation (`rope_theta`, default 100000, and the scaling), YaRN's mscale,
    /// `llama_4_scaling_beta` and `original_max_position_embeddings`; mlx-lm's forward
    /// reads the last two, so it is required here.
    #[serde(default)]
    pub rope_parameters: Option<Map<String, Value>>,
}

fn config_err(message: String) -> crate::Error {
    crate::Error::Config {
        path: "config.json (mistral4)".into(),
        message,
    }
}

impl ModelArgs {
    fn rope_parameters(&self) -> crate::Result<&Map<String, Value>> {
        self.rope_parameters.as_ref().ok_or_else(|| {
            config_err(
                "key `rope_parameters` is required (its `llama_4_scaling_beta` and \
                 `original_max_position_embeddings` scale the queries)"
                    .into(),
            )
        })
    }

    fn rope_number(&self, key: &str) -> crate::Result<f64> {
        self.rope_parameters()?
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| config_err(format!("key `rope_parameters.{key}` is missing")))
    }

    /// The DeepSeek-V3 arguments the shared attention and `kv_b_proj` split read (the
    /// rotation and scale are set from `rope_parameters` afterwards).
    fn deepseek_args(&self) -> deepseek_v3::ModelArgs {
        deepseek_v3::ModelArgs {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            moe_intermediate_size: self.moe_intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            n_shared_experts: self.n_shared_experts,
            n_routed_experts: self.n_routed_experts,
            routed_scaling_factor: self.routed_scaling_factor,
            kv_lora_rank: self.kv_lora_rank,
            q_lora_rank: self.q_lora_rank,
            qk_rope_head_dim: self.qk_rope_head_dim,
            v_head_dim: self.v_head_dim,
            qk_nope_head_dim: self.qk_nope_head_dim,
            norm_topk_prob: self.norm_topk_prob,
            n_group: self.n_group,
            topk_group: self.topk_group,
            num_experts_per_tok: self.num_experts_per_tok,
            first_k_dense_replace: self.first_k_dense_replace,
            max_position_embeddings: self.max_position_embeddings,
            rms_norm_eps: self.rms_norm_eps,
            rope_scaling: None,
            attention_bias: self.attention_bias,
            ..deepseek_v3::ModelArgs::default()
        }
    }
}

/// mlx-lm's `apply_yarn_mscale`: `scale * s^2` with `s = 0.1 * mscale_all_dim *
/// ln(factor) + 1`, unless the rotation is the default one, `mscale_all_dim` is zero or
/// missing, or `factor` (default 1) is at most 1.
fn apply_yarn_mscale(scale: f64, cfg: Option<&RopeScaling>) -> f64 {
    let Some(cfg) = cfg else {
        return scale;
    };
    let mscale_all_dim = cfg.mscale_all_dim.unwrap_or(0.0);
    let factor = cfg.factor.unwrap_or(1.0);
    if cfg.rope_type == "default" || mscale_all_dim == 0.0 || factor <= 1.0 {
        return scale;
    }
    let s = 0.1 * mscale_all_dim * factor.ln() + 1.0;
    scale * s * s
}

/// The attention: DeepSeek-V3's, rotated and scaled from `rope_parameters`.
fn attention(args: &ModelArgs, ds: &deepseek_v3::ModelArgs) -> crate::Result<MlaAttention> {
    let params = Value::Object(args.rope_parameters()?.clone());
    let scaling = rope_scaling(Some(&params))?;
    let theta = args
        .rope_parameters()?
        .get("rope_theta")
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| config_err("key `rope_parameters.rope_theta` must be a number".into()))
        })
        .transpose()?
        .unwrap_or(100000.0);
    let q_head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim;
    let scale = apply_yarn_mscale((q_head_dim as f64).powf(-0.5), scaling.as_ref());
    let rope = initialize_rope(
        args.qk_rope_head_dim,
        theta,
        args.rope_interleave.unwrap_or(true),
        scaling.as_ref(),
        Some(args.max_position_embeddings),
    )?;
    Ok(MlaAttention::new(ds, deepseek_v3::Flavor::DeepseekV3, None)?.mistral4(rope, scale))
}

/// mlx-lm's compiled `mistral4_expert_select`: softmax scores (float32), the weakest
/// `n_group - topk_group` groups zeroed for the choice when `n_group > 1`, the top `k`;
/// their scores renormalized (`1e-20` added to the sum) when `norm_topk_prob`, scaled.
fn expert_select(
    gates: &Array,
    top_k: i32,
    (n_group, topk_group): (i32, i32),
    routed_scaling_factor: f64,
    norm_topk_prob: bool,
) -> Result<Vec<Array>> {
    let scores = gates.astype(Dtype::Float32)?.softmax(Some(&[-1]), false)?;
    let inds = if n_group > 1 {
        top_k_indices_of_negated(&zero_weak_groups(&scores, n_group, topk_group)?, top_k)?
    } else {
        top_k_indices_of_negated(&scores, top_k)?
    };
    let mut selected = scores.take_along_axis(&inds, -1)?;
    if norm_topk_prob {
        let denominator = selected.sum(Some(&[-1]), true)?.add(1e-20)?;
        selected = selected.divide(&denominator)?;
    }
    Ok(vec![inds, selected.multiply(routed_scaling_factor)?])
}

/// Routed experts (a linear router) plus the shared ones.
#[derive(Debug)]
pub struct Moe {
    switch_mlp: SwitchGlu,
    gate: LinearLayer,
    shared_experts: Option<Mlp>,
    top_k: i32,
    groups: (i32, i32),
    routed_scaling_factor: f64,
    norm_topk_prob: bool,
}
impl_module!(Moe {
    switch_mlp,
    gate,
    shared_experts
});

impl Moe {
    fn new(args: &ModelArgs, n_experts: i32) -> crate::Result<Moe> {
        let (dim, moe_dim) = (args.hidden_size, args.moe_intermediate_size);
        let shared_experts = args
            .n_shared_experts
            .map(|n| Mlp::new(dim, moe_dim * n, false).map(Mlp::up_before_down))
            .transpose()?;
        Ok(Moe {
            switch_mlp: SwitchGlu::new(dim, moe_dim, n_experts, false)?,
            gate: LinearLayer::new(dim, n_experts, false)?,
            shared_experts,
            top_k: args.num_experts_per_tok,
            groups: (args.n_group, args.topk_group),
            routed_scaling_factor: args.routed_scaling_factor,
            norm_topk_prob: args.norm_topk_prob,
        })
    }

    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = self.gate.forward(x)?;
        let (k, groups, s, norm) = (
            self.top_k,
            self.groups,
            self.routed_scaling_factor,
            self.norm_topk_prob,
        );
        let key = format!(
            "mistral4.expert_select:{k}:{}:{}:{s:e}:{norm}",
            groups.0, groups.1
        );
        let make = move || -> KeyedBody {
            Box::new(move |a| expert_select(&a[0], k, groups, s, norm))
        };
        router_outputs(call_compiled_keyed(&key, make, &[&gates])?, "mistral4")
    }
}

impl FeedForward for Moe {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let routed = self.route(x)?;
        routed_output(x, residual, routed, &self.switch_mlp, self.shared_experts.as_ref())
    }
    fn fuse(&mut self) -> crate::Result<()> {
        fuse_shared(&mut self.shared_experts)
    }
}

/// One decoder layer.
#[derive(Debug)]
pub struct Layer {
    self_attn: MlaAttention,
    mlp: DenseOrMoe<Moe>,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(Layer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl Layer {
    fn forward(
        &self,
        x: &Array,
        attn_scale: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let n = self.input_layernorm.forward(x)?;
        let h = self
            .self_attn
            .forward(&n, mask, cache, x, Some(attn_scale))?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// Mistral 4 with its head (`lm_head`, or the embedding when tied).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    ds_args: deepseek_v3::ModelArgs,
    model: Stack<Layer, RmsNorm>,
    lm_head: Option<LinearLayer>,
    scaling_beta: f64,
    original_max_position_embeddings: f64,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from parsed arguments.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let ds = args.deepseek_args();
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let mlp = match args.n_routed_experts {
                    Some(n) if i >= args.first_k_dense_replace => {
                        DenseOrMoe::Moe(Box::new(Moe::new(&args, n)?))
                    }
                    _ => DenseOrMoe::Dense(Box::new(
                        Mlp::new(dim, args.intermediate_size, false)?.up_before_down(),
                    )),
                };
                Ok(Layer {
                    self_attn: attention(&args, &ds)?,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(Model {
            scaling_beta: args.rope_number("llama_4_scaling_beta")?,
            original_max_position_embeddings: args
                .rope_number("original_max_position_embeddings")?,
            model: Stack {
                embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
                layers,
                norm: RmsNorm::new(dim, eps)?,
            },
            lm_head: head::untied(args.tie_word_embeddings, dim, args.vocab_size)?,
            ds_args: ds,
            args,
        })
    }

    /// From a config object (mistral3's `text_config` too).
    pub fn from_config(config: &Value) -> crate::Result<Model> {
        Model::new(parse_args(config, "mistral4")?)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::from_config(config)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        // "causal" for a prompt, none for one position (the latent path's case).
        let mask = create_attention_mask(n, cache_at(caches, 0), None, false)?;
        let offset = match cache_at(caches, 0) {
            Some(c) => c.rope_offset()?,
            None => RopePosition::Scalar(0),
        };
        let (beta, max_pos) = (self.scaling_beta, self.original_max_position_embeddings);
        let attn_scale = llama4_attn_scale(n, &offset, beta, max_pos)?.astype(h.dtype())?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            // mlx-lm's `layer(h, attn_scale, mask, cache)`: the scale is an input of the
            // checkpointed call too.
            let mask = mask.clone();
            let out = mlx_nn::checkpoint::call(layer, &[&h, &attn_scale], cache, move |l, a, c| {
                Ok(vec![l.forward(&a[0], &a[1], &mask, c)?])
            })?;
            h = mlx_nn::checkpoint::first(out)?;
        }
        let out = m.norm.forward(&h)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

/// Whether a scale of `scale` broadcasts against a weight of `weight` (mlx-lm's
/// `broadcasts`: per-tensor and per-expert scales).
fn broadcasts(scale: &[i32], weight: &[i32]) -> bool {
    scale.len() <= weight.len()
        && scale
            .iter()
            .zip(&weight[weight.len() - scale.len()..])
            .all(|(&s, &w)| s == 1 || s == w)
}

/// mlx-lm's FP8 step of this file: each `*_scale_inv` (matched by suffix, so the
/// experts' `experts.down_proj_scale_inv` too) multiplies its FP8 weight, broadcast
/// when it is per-tensor or per-expert, else as 128x128 blocks; bfloat16 out.
/// `activation_scale`s are dropped.
fn dequantize_fp8(weights: Weights) -> crate::Result<Weights> {
    let mut out = Weights::new();
    for (k, v) in &weights {
        if k.ends_with("activation_scale") {
            continue;
        }
        if k.ends_with("_scale_inv") {
            let wk = k.replace("_scale_inv", "");
            let w = weights.get(&wk).ok_or_else(|| {
                deepseek_v3::weight_error(format!("`{wk}` is missing for `{k}`"))
            })?;
            let d = if broadcasts(&v.shape(), &w.shape()) {
                let w = mlx_array::quant::from_fp8(w, Dtype::Bfloat16)?;
                w.multiply(v)?.astype(Dtype::Bfloat16)?
            } else {
                deepseek_v3::fp8_block_dequant(w, v)?
            };
            out.insert(wk, d);
        } else if !out.contains_key(k) {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

impl Architecture for Model {
    /// See the module docs.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = dequantize_fp8(deepseek_v3::remap_int4(weights)?)?;
        let n_layers = self.args.num_hidden_layers;
        for l in 0..n_layers {
            let p = format!("model.layers.{l}.mlp");
            if let Some(gate_up) = weights.remove(&format!("{p}.experts.gate_up_proj")) {
                let [gate, up] = deepseek_v3::two(gate_up.split_sections(2, 1)?)?;
                weights.insert(format!("{p}.switch_mlp.gate_proj.weight"), gate);
                weights.insert(format!("{p}.switch_mlp.up_proj.weight"), up);
            }
            if let Some(down) = weights.remove(&format!("{p}.experts.down_proj")) {
                weights.insert(format!("{p}.switch_mlp.down_proj.weight"), down);
            }
        }
        if let Some(n_experts) = self.args.n_routed_experts {
            stack_mlp_experts(&mut weights, n_layers, n_experts)?;
        }
        for l in 0..n_layers {
            let prefix = format!("model.layers.{l}.self_attn");
            deepseek_v3::split_kv_b_proj(&mut weights, &prefix, &self.ds_args)?;
        }
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.contains("rotary_emb.inv_freq"))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}
