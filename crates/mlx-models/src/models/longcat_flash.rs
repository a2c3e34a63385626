//! LongCat-Flash (`longcat_flash`), following `mlx_lm/models/longcat_flash.py`: each
//! layer runs two sub-blocks, each `h + mla_i(input_layernorm_i(h))` then `h +
//! mlps_i(post_attention_layernorm_i(h))`, the first sub-block's post-attention
//! activations also feeding a mixture of experts whose output joins after the second
//! (the shortcut). The attention is DeepSeek-V3's multi-head latent attention
//! (`deepseek_v3::MlaAttention`: latent scores masked by the rope half, `embed_q` /
//! `unembed_out`, traditional RoPE, the mscale from `rope_scaling`), its queries times
//! `sqrt(hidden_size / q_lora_rank)` and its normed latent times `sqrt(hidden_size /
//! kv_lora_rank)`, norms of mlx.nn's default 1e-5, over one `KVCache` each of a layer's
//! `CacheList(KVCache(), KVCache())`; one array mask from the first layer's first cache.
//! The experts: a `classifier` (biased by `router_bias`) over the routed experts plus
//! `zero_expert_num` identity experts, softmax scores, the top `moe_topk` of the scores
//! plus `e_score_correction_bias`, their scores (normalized with `norm_topk_prob`) times
//! `routed_scaling_factor`; SwitchGLU for the routed ones, the input times the identity
//! experts' weights added. `sanitize` stacks HF's experts, splits `kv_b_proj` and drops
//! MTP tensors.
use super::config_error;
use super::decoder::stack_mlp_experts;
use super::deepseek_v3::{self, split_kv_b_proj, Flavor, MlaAttention};
use super::{batch_len, cache_at, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result, Scalar};
use mlx_nn::activations::swiglu;
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Param, RmsNorm, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by LongCat-Flash.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub attention_method: String,
    pub zero_expert_type: String,
    pub hidden_size: i32,
    pub ffn_hidden_size: i32,
    pub moe_topk: i32,
    pub expert_ffn_hidden_size: i32,
    pub n_routed_experts: i32,
    pub zero_expert_num: i32,
    pub num_layers: i32,
    pub vocab_size: i32,
    pub max_position_embeddings: i32,
    pub num_attention_heads: i32,
    pub kv_lora_rank: i32,
    /// Required, but may be null (a plain `q_proj`).
    #[serde(deserialize_with = "Option::deserialize")]
    pub q_lora_rank: Option<i32>,
    pub qk_rope_head_dim: i32,
    pub qk_nope_head_dim: i32,
    pub v_head_dim: i32,
    pub routed_scaling_factor: f64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub mla_scale_q_lora: bool,
    pub mla_scale_kv_lora: bool,
    pub attention_bias: bool,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub router_bias: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
}

/// `LongcatFlashMLP`: `down(swiglu(gate(x), up(x)))`.
#[derive(Debug)]
struct Mlp {
    gate_proj: LinearLayer,
    up_proj: LinearLayer,
    down_proj: LinearLayer,
}
impl_module!(Mlp {
    gate_proj,
    up_proj,
    down_proj
});

impl Mlp {
    fn new(dim: i32, hidden: i32) -> crate::Result<Mlp> {
        Ok(Mlp {
            gate_proj: LinearLayer::new(dim, hidden, false)?,
            up_proj: LinearLayer::new(dim, hidden, false)?,
            down_proj: LinearLayer::new(hidden, dim, false)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let g = swiglu(&self.gate_proj.forward(x)?, &self.up_proj.forward(x)?)?;
        self.down_proj.forward(&g)
    }
}

/// `LongcatFlashTopkRouter`.
#[derive(Debug)]
struct Router {
    classifier: LinearLayer,
    e_score_correction_bias: Param,
    top_k: i32,
    norm_topk_prob: bool,
    routed_scaling_factor: f64,
}
impl_module!(Router {
    classifier,
    e_score_correction_bias
});

impl Router {
    /// `(indices, weights)`: the top-k of the corrected softmax scores, weighted by the
    /// plain scores (normalized by `norm_topk_prob`) times the scaling, in `x`'s dtype.
    fn forward(&self, x: &Array) -> Result<(Array, Array)> {
        let dtype = x.dtype();
        let scores = self.classifier.forward(x)?.softmax(Some(&[-1]), false)?;
        let corrected = scores.add(&self.e_score_correction_bias)?;
        let k = self.top_k;
        let n = corrected.dim(-1)?;
        let idx = corrected
            .argpartition(-k, Some(-1))?
            .slice_axis(-1, n - k, n)?
            .stop_gradient()?;
        let mut w = scores.take_along_axis(&idx, -1)?;
        if self.norm_topk_prob {
            let denom = w.sum(Some(&[-1]), true)?.add(1e-20)?;
            w = w.divide(&denom)?;
        }
        let w = w.multiply(self.routed_scaling_factor)?.astype(dtype)?;
        Ok((idx, w))
    }
}

/// `LongcatFlashMoE`: routed SwitchGLU experts plus identity (zero-compute) experts.
#[derive(Debug)]
struct Moe {
    switch_mlp: SwitchGlu,
    router: Router,
    n_routed: i32,
}
impl_module!(Moe { switch_mlp, router });

impl Moe {
    fn forward(&self, x: &Array) -> Result<Array> {
        let (idx, w) = self.router.forward(x)?;
        let n = Array::weak_scalar(Scalar::Int(self.n_routed.into()), idx.dtype())?;
        let mask = idx.greater_equal(&n)?;
        let zero_idx = Array::weak_scalar(Scalar::Int(0), idx.dtype())?;
        let idx = ops::where_(&mask, &zero_idx, &idx)?;
        let zero_w = Array::weak_scalar(Scalar::Float(0.0), w.dtype())?;
        let regular = ops::where_(&mask, &zero_w, &w)?;
        let y = self.switch_mlp.forward(x, &idx)?;
        let out = y.multiply(&regular.expand_dims(&[-1])?)?.sum(Some(&[-2]), false)?;
        let identity = ops::where_(&mask, &w, &zero_w)?.sum(Some(&[-1]), true)?;
        out.add(&x.multiply(&identity)?)
    }
}

/// `LongcatFlashDecoderLayer`.
#[derive(Debug)]
struct Layer {
    mlp: Moe,
    self_attn: Vec<MlaAttention>,
    mlps: Vec<Mlp>,
    input_layernorm: Vec<RmsNorm>,
    post_attention_layernorm: Vec<RmsNorm>,
}
impl_module!(Layer {
    mlp,
    self_attn,
    mlps,
    input_layernorm,
    post_attention_layernorm
});

impl Layer {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let mut subs: [Option<&mut dyn KvCache>; 2] = match cache {
            None => [None, None],
            Some(c) => match c.sub_caches_mut() {
                Some([a, b]) => [Some(&mut **a), Some(&mut **b)],
                _ => {
                    return Err(mlx_array::Error::InvalidArgument(
                        "longcat_flash layers need a CacheList of two caches".into(),
                    ))
                }
            },
        };
        let mut h = x.clone();
        let mut shortcut = None;
        for (i, sub) in subs.iter_mut().enumerate() {
            let normed = self.input_layernorm[i].forward(&h)?;
            h = self.self_attn[i].forward(&normed, mask, sub.take(), &h, None)?;
            let residual = h.clone();
            let normed = self.post_attention_layernorm[i].forward(&h)?;
            if i == 0 {
                shortcut = Some(self.mlp.forward(&normed)?);
            }
            h = residual.add(&self.mlps[i].forward(&normed)?)?;
            if i == 1 {
                if let Some(s) = &shortcut {
                    h = h.add(s)?;
                }
            }
        }
        Ok(h)
    }
}

/// `LongcatFlashModel`.
#[derive(Debug)]
struct LongcatModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<Layer>,
    norm: RmsNorm,
}
impl_module!(LongcatModel {
    embed_tokens,
    layers,
    norm
});

/// LongCat-Flash with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    ds: deepseek_v3::ModelArgs,
    model: LongcatModel,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |m: String| config_error("longcat_flash", m);
        if args.num_layers < 0 {
            return Err(err("key `num_layers` must not be negative".into()));
        }
        if args.zero_expert_type != "identity" {
            return Err(err(format!(
                "key `zero_expert_type`: only \"identity\" is supported (mlx-lm asserts it), got {:?}",
                args.zero_expert_type
            )));
        }
        // mlx-lm reads both scales unconditionally (a false flag leaves the attribute
        // unset and its forward fails).
        if !args.mla_scale_q_lora || !args.mla_scale_kv_lora {
            return Err(err(
                "keys `mla_scale_q_lora` and `mla_scale_kv_lora` must be true (mlx-lm's attention reads both scales)"
                    .into(),
            ));
        }
        let Some(q_rank) = args.q_lora_rank.filter(|r| *r > 0) else {
            return Err(err(
                "key `q_lora_rank` must be positive (`mla_scale_q_lora` divides by it)".into(),
            ));
        };
        let total = args.n_routed_experts + args.zero_expert_num;
        if args.n_routed_experts <= 0 || args.zero_expert_num < 0 || args.moe_topk <= 0 || args.moe_topk > total {
            return Err(err(format!(
                "`moe_topk` ({}) must be positive and at most `n_routed_experts` ({}) plus `zero_expert_num` ({})",
                args.moe_topk, args.n_routed_experts, args.zero_expert_num
            )));
        }
        if args.num_attention_heads <= 0 || args.kv_lora_rank <= 0 || args.qk_rope_head_dim % 2 != 0 {
            return Err(err(format!(
                "`num_attention_heads` ({}) and `kv_lora_rank` ({}) must be positive, `qk_rope_head_dim` ({}) even",
                args.num_attention_heads, args.kv_lora_rank, args.qk_rope_head_dim
            )));
        }
        let dim = args.hidden_size;
        let ds = deepseek_v3::ModelArgs {
            model_type: args.model_type.clone(),
            vocab_size: args.vocab_size,
            hidden_size: dim,
            num_hidden_layers: args.num_layers,
            num_attention_heads: args.num_attention_heads,
            kv_lora_rank: args.kv_lora_rank,
            q_lora_rank: args.q_lora_rank,
            qk_rope_head_dim: args.qk_rope_head_dim,
            v_head_dim: args.v_head_dim,
            qk_nope_head_dim: args.qk_nope_head_dim,
            max_position_embeddings: args.max_position_embeddings,
            // mlx.nn.RMSNorm's default, the q_a / kv_a norms' eps here.
            rms_norm_eps: 1e-5,
            rope_theta: args.rope_theta,
            rope_scaling: args.rope_scaling.clone(),
            attention_bias: args.attention_bias,
            ..deepseek_v3::ModelArgs::default()
        };
        let q_scale = (f64::from(dim) / f64::from(q_rank)).powf(0.5);
        let kv_scale = (f64::from(dim) / f64::from(args.kv_lora_rank)).powf(0.5);
        let eps = args.rms_norm_eps;
        let layers = (0..args.num_layers)
            .map(|_| {
                let attn = || -> crate::Result<MlaAttention> {
                    Ok(MlaAttention::new(&ds, Flavor::Glm4MoeLite, None)?
                        .with_lora_scales(Some(q_scale), Some(kv_scale)))
                };
                Ok(Layer {
                    mlp: Moe {
                        switch_mlp: SwitchGlu::new(dim, args.expert_ffn_hidden_size, args.n_routed_experts, false)?,
                        router: Router {
                            classifier: LinearLayer::new(dim, total, args.router_bias)?,
                            e_score_correction_bias: Param::new(ops::zeros(&[total], Dtype::Float32)?),
                            top_k: args.moe_topk,
                            norm_topk_prob: args.norm_topk_prob,
                            routed_scaling_factor: args.routed_scaling_factor,
                        },
                        n_routed: args.n_routed_experts,
                    },
                    self_attn: vec![attn()?, attn()?],
                    mlps: vec![Mlp::new(dim, args.ffn_hidden_size)?, Mlp::new(dim, args.ffn_hidden_size)?],
                    input_layernorm: vec![RmsNorm::new(dim, eps)?, RmsNorm::new(dim, eps)?],
                    post_attention_layernorm: vec![RmsNorm::new(dim, eps)?, RmsNorm::new(dim, eps)?],
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = LongcatModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        Ok(Model {
            lm_head: LinearLayer::new(dim, args.vocab_size, false)?,
            args,
            ds,
            model,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "longcat_flash")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let (_, n) = batch_len(&h)?;
        // `cache[0][0]`: the first layer's first cache.
        let first = match cache_at(caches, 0) {
            Some(c) => c.sub_caches().and_then(|s| s.first()).map(|c| c.as_ref()),
            None => None,
        };
        let mask = create_attention_mask(n, first, None, true)?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |l, x, mk, c| l.forward(x, mk, c))?;
        }
        self.lm_head.forward(&m.norm.forward(&h)?)
    }

    /// `make_cache`: a `CacheList(KVCache(), KVCache())` per layer.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::List(&[CacheSpec::Standard, CacheSpec::Standard]); self.model.layers.len()]
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    fn model_type(&self) -> &str {
        &self.args.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.args.vocab_size
    }
    fn num_layers(&self) -> usize {
        self.model.layers.len()
    }
    fn as_module(&self) -> Option<&dyn mlx_nn::Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn mlx_nn::Module> {
        Some(self)
    }
}

impl Architecture for Model {
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        stack_mlp_experts(&mut weights, self.args.num_layers, self.args.n_routed_experts)?;
        for l in 0..self.args.num_layers {
            let prefix = format!("model.layers.{l}");
            for i in 0..2 {
                split_kv_b_proj(&mut weights, &format!("{prefix}.self_attn.{i}"), &self.ds)?;
            }
        }
        Ok(weights.into_iter().filter(|(k, _)| !k.starts_with("model.mtp")).collect())
    }
}
