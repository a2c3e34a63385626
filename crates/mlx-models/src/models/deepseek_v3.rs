//! DeepSeek-V3 (`deepseek_v3`, also Kimi K2's text model), following
//! `mlx_lm/models/deepseek_v3.py`: multi-head latent attention (queries through a
//! low-rank `q_a` / `q_b` pair, keys and values kept compressed as one latent vector
//! per position plus a shared rotary part, both in a plain `KVCache`; [`MultiLinear`]
//! maps queries into the latent space for decoding steps and expands the latent for
//! prompts), dense SwiGLU MLPs in the first `first_k_dense_replace` layers and
//! sigmoid-scored, group-limited top-k experts plus shared experts in the rest.
//! `sanitize` dequantizes FP8 block-scaled checkpoints, reads compressed-tensors int4
//! ones, stacks experts and splits `kv_b_proj` into `embed_q` / `unembed_out`.
use super::decoder::{stack_mlp_experts, DenseOrMoe, FeedForward, fuse_shared, routed_output};
use super::deepseek_v32::{apply_topk, Indexer, IndexerArgs};
use super::mla::MultiLinear;
use super::mlp::Mlp;
use super::{batch_len, cache_at, layer_caches, merge_heads, split_heads, top_k_indices_of_negated};
use super::{router_outputs, zero_weak_groups};
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::quant::{dequantize, quantize, QuantMode};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::activations::{call_compiled_keyed, KeyedBody};
use mlx_nn::attention::finfo_min;
use mlx_nn::cache::create_attention_mask;
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, KvFetch, LinearLayer, Module,
    Param, RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by DeepSeek-V3, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub n_shared_experts: Option<i32>,
    pub n_routed_experts: Option<i32>,
    pub routed_scaling_factor: f64,
    pub kv_lora_rank: i32,
    pub q_lora_rank: Option<i32>,
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
    pub qk_nope_head_dim: i32,
    pub topk_method: String,
    pub norm_topk_prob: bool,
    pub n_group: i32,
    pub topk_group: i32,
    pub num_experts_per_tok: i32,
    pub moe_layer_freq: i32,
    pub first_k_dense_replace: i32,
    pub max_position_embeddings: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Value>,
    pub attention_bias: bool,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "deepseek_v3".into(),
            vocab_size: 102400,
            hidden_size: 4096,
            intermediate_size: 11008,
            moe_intermediate_size: 1407,
            num_hidden_layers: 30,
            num_attention_heads: 32,
            n_shared_experts: None,
            n_routed_experts: None,
            routed_scaling_factor: 1.0,
            kv_lora_rank: 512,
            q_lora_rank: Some(1536),
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            qk_nope_head_dim: 128,
            topk_method: "noaux_tc".into(),
            norm_topk_prob: true,
            n_group: 1,
            topk_group: 1,
            num_experts_per_tok: 1,
            moe_layer_freq: 1,
            first_k_dense_replace: 0,
            max_position_embeddings: 2048,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: None,
            attention_bias: false,
        }
    }
}

/// Where the files built on this one differ from DeepSeek-V3 (GLM-4.7-Flash's
/// `glm4_moe_lite` is the same model with other norms, a guarded router division and
/// its own `sanitize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `deepseek_v3.py`.
    DeepseekV3,
    /// `glm4_moe_lite.py`.
    Glm4MoeLite,
    /// `deepseek_v32.py` (an indexer picks the positions attention reads).
    DeepseekV32,
}

/// Multi-head latent attention.
#[derive(Debug)]
pub struct MlaAttention {
    q_proj: Option<LinearLayer>,
    q_a_proj: Option<LinearLayer>,
    q_a_layernorm: Option<RmsNorm>,
    q_b_proj: Option<LinearLayer>,
    kv_a_proj_with_mqa: LinearLayer,
    kv_a_layernorm: RmsNorm,
    embed_q: MultiLinear,
    unembed_out: MultiLinear,
    o_proj: LinearLayer,
    indexer: Option<Indexer>,
    rope: Rope,
    num_heads: i32,
    q_head_dim: i32,
    qk_nope_head_dim: i32,
    kv_lora_rank: i32,
    scale: f64,
    /// Prompts (`L > 1`) attend to the expanded keys and values with the rope half
    /// concatenated and the ordinary mask (mistral4), not through the latent scores.
    concat_prefill: bool,
    /// LongCat-Flash's `mla_scale_q_lora` (times the split-off queries) and
    /// `mla_scale_kv_lora` (times the normed latent).
    lora_scales: (Option<f64>, Option<f64>),
}
impl_module!(MlaAttention {
    q_proj,
    q_a_proj,
    q_a_layernorm,
    q_b_proj,
    kv_a_proj_with_mqa,
    kv_a_layernorm,
    embed_q,
    unembed_out,
    o_proj,
    indexer
});

impl MlaAttention {
    pub(crate) fn new(
        args: &ModelArgs,
        flavor: Flavor,
        indexer: Option<&IndexerArgs>,
    ) -> crate::Result<MlaAttention> {
        let (dim, heads) = (args.hidden_size, args.num_attention_heads);
        let q_head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim;
        let norm_eps = match flavor {
            Flavor::DeepseekV3 | Flavor::DeepseekV32 => 1e-6,
            Flavor::Glm4MoeLite => args.rms_norm_eps,
        };
        let bias = args.attention_bias;
        let (q_proj, q_a_proj, q_a_layernorm, q_b_proj) = match args.q_lora_rank {
            None => (
                Some(LinearLayer::new(dim, heads * q_head_dim, false)?),
                None,
                None,
                None,
            ),
            Some(r) => (
                None,
                Some(LinearLayer::new(dim, r, bias)?),
                Some(RmsNorm::new(r, norm_eps)?),
                Some(LinearLayer::new(r, heads * q_head_dim, false)?),
            ),
        };
        let mut scale = (q_head_dim as f64).powf(-0.5);
        let scaling = rope_scaling(args.rope_scaling.as_ref())?;
        if let Some(cfg) = &scaling {
            let mscale_all_dim = cfg.mscale_all_dim.unwrap_or(0.0);
            if mscale_all_dim != 0.0 {
                let factor = cfg.factor.ok_or_else(|| crate::Error::Config {
                    path: "config.json (deepseek_v3)".into(),
                    message: "key `rope_scaling.factor` is required with `mscale_all_dim`".into(),
                })?;
                if factor > 1.0 {
                    let s = 0.1 * mscale_all_dim * factor.ln() + 1.0;
                    scale = scale * s * s;
                }
            }
        }
        let rope = initialize_rope(
            args.qk_rope_head_dim,
            args.rope_theta,
            true,
            scaling.as_ref(),
            Some(args.max_position_embeddings),
        )?;
        Ok(MlaAttention {
            q_proj,
            q_a_proj,
            q_a_layernorm,
            q_b_proj,
            kv_a_proj_with_mqa: LinearLayer::new(
                dim,
                args.kv_lora_rank + args.qk_rope_head_dim,
                bias,
            )?,
            kv_a_layernorm: RmsNorm::new(args.kv_lora_rank, norm_eps)?,
            embed_q: MultiLinear::new(args.qk_nope_head_dim, args.kv_lora_rank, heads)?,
            unembed_out: MultiLinear::new(args.kv_lora_rank, args.v_head_dim, heads)?,
            o_proj: LinearLayer::new(heads * args.v_head_dim, dim, bias)?,
            indexer: indexer.map(|ix| Indexer::new(args, ix)).transpose()?,
            rope,
            num_heads: heads,
            q_head_dim,
            qk_nope_head_dim: args.qk_nope_head_dim,
            kv_lora_rank: args.kv_lora_rank,
            scale,
            concat_prefill: false,
            lora_scales: (None, None),
        })
    }

    /// LongCat-Flash's attention: the queries (after the head split) times `q`, the
    /// normed latent times `kv`.
    pub(crate) fn with_lora_scales(mut self, q: Option<f64>, kv: Option<f64>) -> MlaAttention {
        self.lora_scales = (q, kv);
        self
    }

    /// mistral4's attention: its own rotation and softmax scale (from its
    /// `rope_parameters`), and prompts attending to the expanded keys and values with the
    /// rope half concatenated under the ordinary mask.
    pub(crate) fn mistral4(mut self, rope: Rope, scale: f64) -> MlaAttention {
        self.rope = rope;
        self.scale = scale;
        self.concat_prefill = true;
        self
    }

    /// `x + o_proj(attention(x))`; both query halves multiplied by `q_scale` after the
    /// rotation where given (mistral4's Llama 4 scale).
    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        residual: &Array,
        q_scale: Option<&Array>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let (q, qr) = match (&self.q_proj, &self.q_a_proj, &self.q_a_layernorm, &self.q_b_proj) {
            (Some(p), ..) => (p.forward(x)?, None),
            (None, Some(a), Some(n), Some(bp)) => {
                let qr = n.forward(&a.forward(x)?)?;
                (bp.forward(&qr)?, Some(qr))
            }
            _ => {
                return Err(mlx_array::Error::InvalidArgument(
                    "deepseek_v3 attention: no query projection".into(),
                ))
            }
        };
        // With an indexer the layer's cache is a CacheList: cache[0] for the latent
        // keys and values, cache[1] for the indexer's keys.
        type Slot<'c> = Option<&'c mut dyn KvCache>;
        let (cache, index_cache): (Slot<'_>, Slot<'_>) = match (cache, &self.indexer) {
            (Some(c), Some(_)) => match c.sub_caches_mut() {
                Some([main, index]) => (Some(&mut **main), Some(&mut **index)),
                _ => {
                    return Err(mlx_array::Error::InvalidArgument(
                        "deepseek_v32 attention needs a CacheList of two caches".into(),
                    ))
                }
            },
            (c, _) => (c, None),
        };
        let q = q
            .reshape(&[b, l, self.num_heads, self.q_head_dim])?
            .transpose(Some(&[0, 2, 1, 3]))?;
        let q = match self.lora_scales.0 {
            Some(s) => q.multiply(s)?,
            None => q,
        };
        let [q_nope, q_pe] = two(q.split_at(&[self.qk_nope_head_dim], -1)?)?;
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let [compressed, k_pe] = two(compressed.split_at(&[self.kv_lora_rank], -1)?)?;
        let k_pe = split_heads(&k_pe, b, l, 1)?;
        let kv_latent = self.kv_a_layernorm.forward(&compressed)?;
        let kv_latent = match self.lora_scales.1 {
            Some(s) => kv_latent.multiply(s)?,
            None => kv_latent,
        };

        let (q_pe, kv_latent, k_pe) = match cache {
            Some(c) => {
                let offset = c.rope_offset()?;
                let q_pe = self.rope.forward_at(&q_pe, offset.as_rope_offset())?;
                let k_pe = self.rope.forward_at(&k_pe, offset.as_rope_offset())?;
                let kv_latent = kv_latent.expand_dims(&[1])?;
                match mlx_nn::pipeline::update_and_fetch(c, &kv_latent, &k_pe)? {
                    KvFetch::Plain { keys, values } => (q_pe, keys, values),
                    KvFetch::Quantized { .. } => {
                        return Err(mlx_array::Error::InvalidArgument(
                            "multi-head latent attention cannot read a quantized KV cache \
                             (mlx-lm fails there too): run without --kv-bits"
                                .into(),
                        ))
                    }
                }
            }
            None => (
                self.rope.forward(&q_pe, 0)?,
                kv_latent.expand_dims(&[1])?,
                self.rope.forward(&k_pe, 0)?,
            ),
        };
        let (q_nope, q_pe) = match q_scale {
            Some(s) => (q_nope.multiply(s)?, q_pe.multiply(s)?),
            None => (q_nope, q_pe),
        };
        if self.concat_prefill && l > 1 {
            let heads = self.num_heads;
            let k_nope = self.embed_q.forward(&kv_latent, false)?;
            let v = self.unembed_out.forward(&kv_latent, true)?;
            let k_pe = k_pe.broadcast_to(&[b, heads, k_pe.dim(2)?, k_pe.dim(-1)?])?;
            let fetch = KvFetch::Plain {
                keys: ops::concatenate(&[&k_nope, &k_pe], -1)?,
                values: v,
            };
            let q = ops::concatenate(&[&q_nope, &q_pe], -1)?;
            let out = mlx_nn::scaled_dot_product_attention(&q, &fetch, self.scale, mask, None)?;
            return residual.add(&self.o_proj.forward(&merge_heads(&out, b, l)?)?);
        }

        let mut index_state = Vec::new();
        let (kv_latent, k_pe, mask) = match (&self.indexer, &qr) {
            (Some(ix), Some(qr)) => {
                let (topk, state) = ix.forward(x, qr, mask, index_cache)?;
                index_state = state;
                match topk {
                    // mlx-lm's `mx.stop_gradient(topk_indices)`: training differentiates
                    // through the gathers, never the positions.
                    Some(topk) => {
                        apply_topk(&topk.stop_gradient()?, kv_latent, k_pe, mask.clone(), l)?
                    }
                    None => (kv_latent, k_pe, mask.clone()),
                }
            }
            _ => (kv_latent, k_pe, mask.clone()),
        };
        let mut pe_scores = q_pe.multiply(self.scale)?.matmul(&k_pe.swapaxes(-1, -2)?)?;
        match &mask {
            AttnMask::None => {}
            AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } => {
                let dtype = pe_scores.dtype();
                let min = Array::scalar_f64(finfo_min(dtype)?, dtype)?;
                pe_scores = ops::where_(m, &pe_scores, &min)?;
            }
            AttnMask::Causal => {
                return Err(mlx_array::Error::InvalidArgument(
                    "multi-head latent attention needs an array mask".into(),
                ))
            }
        }
        let (q_nope, k, v) = if l == 1 {
            (
                self.embed_q.forward(&q_nope, true)?,
                kv_latent.clone(),
                kv_latent,
            )
        } else {
            (
                q_nope,
                self.embed_q.forward(&kv_latent, false)?,
                self.unembed_out.forward(&kv_latent, true)?,
            )
        };
        let mut out = mlx_array::fast::scaled_dot_product_attention(
            &q_nope,
            &k,
            &v,
            self.scale as f32,
            mlx_array::fast::SdpaMask::Array(&pe_scores),
            None,
        )?;
        if l == 1 {
            out = self.unembed_out.forward(&out, true)?;
        }
        let out = residual.add(&self.o_proj.forward(&merge_heads(&out, b, l)?)?)?;
        if index_state.is_empty() {
            return Ok(out);
        }
        // mlx-lm makes the latent cache depend on the indexer's so that each step
        // evaluates it even when its top-k is unused; the layer's output depending on it
        // does the same (identity on the values) without reaching into the cache.
        let deps: Vec<&Array> = index_state.iter().collect();
        let mut out = ops::depends(&[&out], &deps)?;
        out.pop().ok_or_else(|| {
            mlx_array::Error::InvalidArgument("depends returned no array".into())
        })
    }
}

/// The two parts of a split.
pub(crate) fn two(parts: Vec<Array>) -> Result<[Array; 2]> {
    <[Array; 2]>::try_from(parts)
        .map_err(|_| mlx_array::Error::InvalidArgument("expected a split in two".into()))
}

/// mlx-lm's compiled `group_expert_select`: sigmoid scores, corrected by the bias for
/// the choice only, the weakest `n_group - topk_group` groups (by their two best
/// scores) zeroed, then the top `k`; the chosen uncorrected scores, normalized (with
/// `denom_eps` added to the sum where the file adds one) and scaled.
#[allow(clippy::too_many_arguments)]
fn group_expert_select(
    gates: &Array,
    bias: &Array,
    top_k: i32,
    n_group: i32,
    topk_group: i32,
    routed_scaling_factor: f64,
    norm_topk_prob: bool,
    denom_eps: Option<f64>,
) -> Result<Vec<Array>> {
    let orig_scores = gates.astype(Dtype::Float32)?.sigmoid()?;
    let mut scores = orig_scores.add(bias)?;
    if n_group > 1 {
        scores = zero_weak_groups(&scores, n_group, topk_group)?;
    }
    let inds = top_k_indices_of_negated(&scores, top_k)?;
    let mut scores = orig_scores.take_along_axis(&inds, -1)?;
    if top_k > 1 && norm_topk_prob {
        let mut denominator = scores.sum(Some(&[-1]), true)?;
        if let Some(eps) = denom_eps {
            denominator = denominator.add(eps)?;
        }
        scores = scores.divide(&denominator)?;
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
    denom_eps: Option<f64>,
}
impl_module!(MoeGate {
    weight,
    e_score_correction_bias
});

impl MoeGate {
    /// Zero placeholders for `n_experts` experts of `dim` inputs; `groups` is
    /// `(n_group, topk_group)`; `denom_eps` is added to the normalizing sum where the
    /// mlx-lm file adds one.
    pub(crate) fn new(
        n_experts: i32,
        dim: i32,
        top_k: i32,
        groups: (i32, i32),
        routed_scaling_factor: f64,
        norm_topk_prob: bool,
        denom_eps: Option<f64>,
    ) -> Result<MoeGate> {
        Ok(MoeGate {
            weight: Param::new(ops::zeros(&[n_experts, dim], Dtype::Float32)?),
            e_score_correction_bias: Param::new(ops::zeros(&[n_experts], Dtype::Float32)?),
            top_k,
            n_group: groups.0,
            topk_group: groups.1,
            routed_scaling_factor,
            norm_topk_prob,
            denom_eps,
        })
    }

    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = x.matmul(&self.weight.transposed()?)?;
        let (k, g, tg) = (self.top_k, self.n_group, self.topk_group);
        let (s, norm, eps) = (
            self.routed_scaling_factor,
            self.norm_topk_prob,
            self.denom_eps,
        );
        let key = format!("deepseek_v3.group_expert_select:{k}:{g}:{tg}:{s:e}:{norm}:{eps:?}");
        let make = move || -> KeyedBody {
            Box::new(move |a| group_expert_select(&a[0], &a[1], k, g, tg, s, norm, eps))
        };
        router_outputs(call_compiled_keyed(&key, make, &[&gates, &self.e_score_correction_bias])?, "deepseek_v3")
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

impl Moe {
    /// SwitchGLU experts of `moe_dim` hidden units routed by `gate`, plus shared experts
    /// of `moe_dim * n_shared` (gate, up, down) where `n_shared` is given.
    pub(crate) fn new(
        dim: i32,
        moe_dim: i32,
        n_experts: i32,
        n_shared: Option<i32>,
        gate: MoeGate,
    ) -> crate::Result<Moe> {
        let shared_experts = n_shared
            .map(|n| Mlp::new(dim, moe_dim * n, false).map(Mlp::up_before_down))
            .transpose()?;
        Ok(Moe {
            switch_mlp: SwitchGlu::new(dim, moe_dim, n_experts, false)?,
            gate,
            shared_experts,
        })
    }
}

impl FeedForward for Moe {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let routed = self.gate.route(x)?;
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

/// `embed_tokens`, the layers and the final `norm`.
#[derive(Debug)]
pub struct Stack {
    embed_tokens: EmbeddingLayer,
    pub(crate) layers: Vec<Layer>,
    norm: RmsNorm,
}
impl_module!(Stack {
    embed_tokens,
    layers,
    norm
});

impl Stack {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, true)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |layer, h, mask, cache| {
                let x = layer.input_layernorm.forward(h)?;
                let h2 = layer.self_attn.forward(&x, mask, cache, h, None)?;
                layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&h2)?, Some(&h2))
            })?;
        }
        self.norm.forward(&h)
    }
}

/// DeepSeek-V3 with its (always untied) head.
#[derive(Debug)]
pub struct Model {
    pub(crate) args: ModelArgs,
    flavor: Flavor,
    model: Stack,
    lm_head: LinearLayer,
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
        cast_all_but_bias(self, dtype)
    }
}

impl Model {
    /// Builds the model (zero placeholders) from parsed arguments.
    pub(crate) fn new(args: ModelArgs, flavor: Flavor) -> crate::Result<Model> {
        Model::with_indexer(args, flavor, None)
    }

    /// Builds the model, each attention layer with an indexer when `indexer` is given.
    pub(crate) fn with_indexer(
        args: ModelArgs,
        flavor: Flavor,
        indexer: Option<&IndexerArgs>,
    ) -> crate::Result<Model> {
        let what = match flavor {
            Flavor::DeepseekV3 => "deepseek_v3",
            Flavor::Glm4MoeLite => "glm4_moe_lite",
            Flavor::DeepseekV32 => "deepseek_v32",
        };
        if args.topk_method != "noaux_tc" {
            return Err(crate::Error::Config {
                path: format!("config.json ({what})"),
                message: format!(
                    "key `topk_method`: only \"noaux_tc\" is supported, got {:?}",
                    args.topk_method
                ),
            });
        }
        if args.moe_layer_freq <= 0 {
            return Err(crate::Error::Config {
                path: format!("config.json ({what})"),
                message: "key `moe_layer_freq` must be positive".into(),
            });
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let denom_eps = (flavor == Flavor::Glm4MoeLite).then_some(1e-20);
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let mlp = match args.n_routed_experts {
                    Some(n_experts)
                        if i >= args.first_k_dense_replace && i % args.moe_layer_freq == 0 =>
                    {
                        DenseOrMoe::Moe(Box::new(Moe::new(
                            dim,
                            args.moe_intermediate_size,
                            n_experts,
                            args.n_shared_experts,
                            MoeGate::new(
                                n_experts,
                                dim,
                                args.num_experts_per_tok,
                                (args.n_group, args.topk_group),
                                args.routed_scaling_factor,
                                args.norm_topk_prob,
                                denom_eps,
                            )?,
                        )?))
                    }
                    _ => DenseOrMoe::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?.up_before_down())),
                };
                Ok(Layer {
                    self_attn: MlaAttention::new(&args, flavor, indexer)?,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Stack {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, false)?;
        Ok(Model {
            args,
            flavor,
            model,
            lm_head,
        })
    }

    /// Builds the model from a (text) config.
    pub(crate) fn from_config(config: &Value) -> crate::Result<Model> {
        Model::new(parse_args(config, "deepseek_v3")?, Flavor::DeepseekV3)
    }

    /// mlx-lm's `sanitize` of this file (see the module docs).
    pub(crate) fn sanitize_weights(&self, weights: Weights) -> crate::Result<Weights> {
        let n = self.args.num_hidden_layers;
        let mut weights = match self.flavor {
            Flavor::DeepseekV3 => dequantize_fp8(remap_int4(weights)?)?,
            Flavor::Glm4MoeLite => weights
                .into_iter()
                .filter(|(k, _)| !is_mtp_layer(k, n))
                .collect(),
            Flavor::DeepseekV32 => dequantize_fp8(
                weights
                    .into_iter()
                    .filter(|(k, _)| !is_mtp_layer(k, n))
                    .collect(),
            )?,
        };
        let a = &self.args;
        if let Some(n_experts) = a.n_routed_experts {
            stack_mlp_experts(&mut weights, a.num_hidden_layers, n_experts)?;
        }
        for l in 0..a.num_hidden_layers {
            split_kv_b_proj(&mut weights, &format!("model.layers.{l}.self_attn"), a)?;
        }
        Ok(match self.flavor {
            Flavor::DeepseekV3 => weights
                .into_iter()
                .filter(|(k, _)| {
                    !k.starts_with("model.layers.61") && !k.contains("rotary_emb.inv_freq")
                })
                .collect(),
            Flavor::Glm4MoeLite | Flavor::DeepseekV32 => weights,
        })
    }
}

/// mlx-lm's `cast_predicate`: the routers' `e_score_correction_bias` keeps its dtype.
pub(crate) fn cast_all_but_bias(module: &mut dyn Module, dtype: Dtype) -> mlx_nn::Result<()> {
    cast_all_except(module, dtype, "e_score_correction_bias")
}

/// `--dtype` under a `cast_predicate` of `keep not in k`: every floating parameter
/// whose name does not contain `keep` cast to `dtype`.
pub(crate) fn cast_all_except(
    module: &mut dyn Module,
    dtype: Dtype,
    keep: &str,
) -> mlx_nn::Result<()> {
    cast_all_but(module, dtype, |name| name.contains(keep))
}

/// Casts every floating parameter to `dtype` but those whose name `keep` accepts.
pub(crate) fn cast_all_but(
    module: &mut dyn Module,
    dtype: Dtype,
    keep: impl Fn(&str) -> bool,
) -> mlx_nn::Result<()> {
    let mut err = None;
    module.visit_params_mut("", &mut |name, p| {
        let kept = keep(name);
        if err.is_none() && !kept && p.dtype().is_floating() && p.dtype() != dtype {
            match p.astype(dtype) {
                Ok(a) => p.set(a),
                Err(e) => err = Some(e),
            }
        }
    });
    err.map_or(Ok(()), |e| Err(e.into()))
}

/// glm4_moe_lite's `is_mpt_layer`: `*.layers.{i}.*` with `i >= num_hidden_layers`.
fn is_mtp_layer(key: &str, n_layers: i32) -> bool {
    let parts: Vec<&str> = key.split('.').collect();
    parts.len() >= 3
        && parts[1] == "layers"
        && parts[2].parse::<i64>().is_ok_and(|i| i >= n_layers as i64)
}

pub(crate) fn weight_error(message: String) -> crate::Error {
    crate::Error::Weights {
        path: "model weights".into(),
        message,
    }
}

/// Compressed-tensors int4 (`weight_packed`, `weight_scale`, `weight_shape`) to MLX's
/// affine layout: the packed words as uint32, `biases = -8 * scales`.
pub(crate) fn remap_int4(weights: Weights) -> crate::Result<Weights> {
    let mut out = Weights::new();
    for (k, v) in &weights {
        if let Some(base) = k.strip_suffix("weight_shape") {
            let packed = weights
                .get(&format!("{base}weight_packed"))
                .ok_or_else(|| weight_error(format!("`{base}weight_packed` is missing")))?;
            let s = weights
                .get(&format!("{base}weight_scale"))
                .ok_or_else(|| weight_error(format!("`{base}weight_scale` is missing")))?;
            out.insert(format!("{base}weight"), packed.view(Dtype::Uint32)?);
            out.insert(format!("{base}scales"), s.clone());
            out.insert(format!("{base}biases"), s.multiply(-8.0)?);
        } else if !(k.ends_with("weight_scale") || k.ends_with("weight_packed")) {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

/// FP8 weights with 128x128 block scales (`*.weight_scale_inv`) to bfloat16.
pub(crate) fn dequantize_fp8(weights: Weights) -> crate::Result<Weights> {
    let mut out = Weights::new();
    for (k, v) in &weights {
        if k.contains("weight_scale_inv") {
            let wk = k.replacen("_scale_inv", "", 1);
            let w = weights
                .get(&wk)
                .ok_or_else(|| weight_error(format!("`{wk}` is missing for `{k}`")))?;
            out.insert(wk, fp8_block_dequant(w, v)?);
        } else if !out.contains_key(k) {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

/// mlx-lm's `dequant(weight, scale_inv)` with block size 128.
pub(crate) fn fp8_block_dequant(weight: &Array, scale_inv: &Array) -> Result<Array> {
    const BS: i32 = 128;
    let w = mlx_array::quant::from_fp8(weight, Dtype::Bfloat16)?;
    let (m, n) = (w.dim(0)?, w.dim(1)?);
    let (pad_bottom, pad_side) = ((-m).rem_euclid(BS), (-n).rem_euclid(BS));
    let w = w.pad(&[0, 1], &[0, 0], &[pad_bottom, pad_side], None, "constant")?;
    let w = w.reshape(&[(m + pad_bottom) / BS, BS, (n + pad_side) / BS, BS])?;
    let s = scale_inv.expand_dims(&[1, 3])?;
    let w = w.multiply(&s)?.reshape(&[m + pad_bottom, n + pad_side])?;
    w.slice(&[0, 0], &[m, n], None)?.astype(Dtype::Bfloat16)
}

/// `{prefix}.kv_b_proj` (dense or affine-quantized) split per head into
/// `embed_q` (the key half, transposed) and `unembed_out` (the value half), each
/// quantized again with the inferred bits and group size when it was.
pub(crate) fn split_kv_b_proj(
    weights: &mut Weights,
    prefix: &str,
    a: &ModelArgs,
) -> crate::Result<()> {
    let Some(mut v) = weights.remove(&format!("{prefix}.kv_b_proj.weight")) else {
        return Ok(());
    };
    let quant = match weights.remove(&format!("{prefix}.kv_b_proj.scales")) {
        Some(scales) => {
            let biases = weights.remove(&format!("{prefix}.kv_b_proj.biases"));
            let dims = a.kv_lora_rank;
            let bits = v.dim(-1)? * 32 / dims;
            let group_size = dims / scales.dim(-1)?;
            v = dequantize(
                &v,
                &scales,
                biases.as_ref(),
                Some(group_size),
                Some(bits),
                QuantMode::Affine,
                None,
            )?;
            Some((bits, group_size))
        }
        None => None,
    };
    let head_dim = a.qk_nope_head_dim + a.v_head_dim;
    let v = v.reshape(&[a.num_attention_heads, head_dim, -1])?;
    let rows = v.dim(-1)?;
    let heads = a.num_attention_heads;
    let wk = v
        .slice(&[0, 0, 0], &[heads, a.qk_nope_head_dim, rows], None)?
        .swapaxes(-1, -2)?
        .contiguous()?;
    let wv = v
        .slice(&[0, a.qk_nope_head_dim, 0], &[heads, head_dim, rows], None)?
        .contiguous()?;
    for (name, w) in [("embed_q", wk), ("unembed_out", wv)] {
        match quant {
            Some((bits, group_size)) => {
                let q = quantize(&w, Some(group_size), Some(bits), QuantMode::Affine)?;
                weights.insert(format!("{prefix}.{name}.weight"), q.weight);
                weights.insert(format!("{prefix}.{name}.scales"), q.scales);
                if let Some(b) = q.biases {
                    weights.insert(format!("{prefix}.{name}.biases"), b);
                }
            }
            None => {
                weights.insert(format!("{prefix}.{name}.weight"), w);
            }
        }
    }
    Ok(())
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::from_config(config)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        self.lm_head.forward(&out)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let spec = match self.flavor {
            // mlx-lm: `CacheList(KVCache(), KVCache())` per layer.
            Flavor::DeepseekV32 => CacheSpec::List(&[CacheSpec::Standard, CacheSpec::Standard]),
            Flavor::DeepseekV3 | Flavor::Glm4MoeLite => CacheSpec::Standard,
        };
        vec![spec; self.model.layers.len()]
    }
    fn defines_make_cache(&self) -> bool {
        self.flavor == Flavor::DeepseekV32
    }
    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        self.sanitize_weights(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}
