//! Hunyuan MoE (`hunyuan`, Hunyuan-Large), following `mlx_lm/models/hunyuan.py`: the
//! dense sibling's attention (RoPE with `rope_scaling.alpha`'s base, q/k norms after the
//! rotation) with cross-layer attention, softmax top-k experts with an optional shared
//! MLP (or a dense MLP when `num_experts` is 1), and the head always tied to the
//! embedding.
//!
//! Cross-layer attention (`use_cla`): only every `cla_share_factor`-th layer (0, f, 2f,
//! ...) has k/v projections; each layer after it reads those layers' raw k/v projections
//! (before the head split, the rotation and the key norm), rotates and normalizes them
//! itself and stores them in its own cache, as mlx-lm's `kv_states` does. Every layer
//! keeps its own `KVCache` (mlx-lm's default `make_cache`), so the cache count is the
//! layer count.
use super::config_error;
use super::decoder::{add_residual, stack_mlp_experts, DenseOrMoe, FeedForward};
use super::hunyuan_v1_dense::alpha_rope;
use super::lm::{even_head_dim, Stack};
use super::mlp::Mlp;
use super::{batch_len, cache_at, layer_caches, merge_heads, project, project_out, split_heads};
use super::{rope_cache_with, top_k_indices_of_negated, AfterRope, Architecture, Weights};
use crate::config::{parse_args, PerLayer};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, scaled_dot_product_attention, AttnMask, KvCache, LinearLayer, RmsNorm, Rope,
    SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Hunyuan (those without a default are required, as in
/// mlx-lm; `tie_word_embeddings` is read and ignored: the head is always the embedding).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub attention_bias: bool,
    pub moe_topk: PerLayer,
    pub num_experts: i32,
    pub num_shared_expert: PerLayer,
    pub use_mixed_mlp_moe: bool,
    pub use_qk_norm: bool,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub use_cla: bool,
    pub cla_share_factor: i32,
    #[serde(default)]
    pub moe_intermediate_size: Option<PerLayer>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

impl ModelArgs {
    /// `rope_scaling.alpha`. mlx-lm's `__post_init__` wants `factor` and `type` in a
    /// non-empty `rope_scaling`, and its attention reads `rope_scaling["alpha"]`, so the
    /// section and its `alpha` are required.
    fn rope_alpha(&self) -> crate::Result<f64> {
        let s = self.rope_scaling.as_ref().ok_or_else(|| {
            config_error("hunyuan", "key `rope_scaling` is required (its `alpha` scales the RoPE base)".into())
        })?;
        if !s.is_empty() && !["factor", "type"].iter().all(|k| s.contains_key(*k)) {
            return Err(config_error("hunyuan", 
                "key `rope_scaling` must contain keys `factor` and `type`".into(),
            ));
        }
        s.get("alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| config_error("hunyuan", "key `rope_scaling.alpha`: a number is required".into()))
    }

    /// Whether layer `i` has its own k/v projections (`not use_cla or i % f == 0`).
    fn kv_proj(&self, i: usize) -> bool {
        !self.use_cla || i.is_multiple_of(self.cla_share_factor.max(1) as usize)
    }
}

/// A layer's raw k and v projections, handed to the layers that share them.
type KvStates = [Array; 2];

/// Self-attention; the k/v projections only on layers that make their own.
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: Option<LinearLayer>,
    v_proj: Option<LinearLayer>,
    o_proj: LinearLayer,
    query_layernorm: Option<RmsNorm>,
    key_layernorm: Option<RmsNorm>,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f64,
}
impl_module!(Attention {
    q_proj,
    k_proj,
    v_proj,
    o_proj,
    query_layernorm,
    key_layernorm
});

impl Attention {
    fn new(args: &ModelArgs, kv_proj: bool, head_dim: i32, rope: Rope) -> crate::Result<Attention> {
        let (dim, bias) = (args.hidden_size, args.attention_bias);
        let (n_heads, n_kv_heads) = (args.num_attention_heads, args.num_key_value_heads);
        let kv = || -> crate::Result<Option<LinearLayer>> {
            Ok(match kv_proj {
                true => Some(LinearLayer::new(dim, n_kv_heads * head_dim, bias)?),
                false => None,
            })
        };
        let norm = || -> crate::Result<Option<RmsNorm>> {
            Ok(match args.use_qk_norm {
                true => Some(RmsNorm::new(head_dim, args.rms_norm_eps)?),
                false => None,
            })
        };
        Ok(Attention {
            q_proj: LinearLayer::new(dim, n_heads * head_dim, bias)?,
            k_proj: kv()?,
            v_proj: kv()?,
            o_proj: LinearLayer::new(n_heads * head_dim, dim, bias)?,
            query_layernorm: norm()?,
            key_layernorm: norm()?,
            rope,
            n_heads,
            n_kv_heads,
            scale: (head_dim as f64).powf(-0.5),
        })
    }

    /// `residual + o_proj(attention)` and the raw k/v projections this layer used: its
    /// own, or `shared` from the layer it reads them from.
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        shared: Option<KvStates>,
        residual: &Array,
    ) -> Result<(Array, KvStates)> {
        let (b, l) = batch_len(x)?;
        let (q, kv) = match (shared, &self.k_proj, &self.v_proj) {
            (Some(kv), _, _) => (self.q_proj.forward(x)?, kv),
            (None, Some(k_proj), Some(v_proj)) => {
                let [q, k, v] = project(None, [&self.q_proj, k_proj, v_proj], x)?;
                (q, [k, v])
            }
            _ => {
                return Err(mlx_array::Error::InvalidArgument(
                    "a hunyuan layer without k/v projections got no shared keys and values"
                        .into(),
                ))
            }
        };
        let queries = split_heads(&q, b, l, self.n_heads)?;
        let keys = split_heads(&kv[0], b, l, self.n_kv_heads)?;
        let values = split_heads(&kv[1], b, l, self.n_kv_heads)?;
        let norms = |q: Array, k: Array| -> Result<(Array, Array)> {
            match (&self.query_layernorm, &self.key_layernorm) {
                (Some(qn), Some(kn)) => Ok((qn.forward(&q)?, kn.forward(&k)?)),
                _ => Ok((q, k)),
            }
        };
        let post: AfterRope<'_> = &norms;
        let (queries, fetch) =
            rope_cache_with(&queries, &keys, values, &self.rope, cache, Some(post))?;
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        let out = project_out(&self.o_proj, &merge_heads(&out, b, l)?, Some(residual))?;
        Ok((out, kv))
    }
}

/// `gate.wg`: the router's projection.
#[derive(Debug)]
pub struct Gate {
    wg: LinearLayer,
}
impl_module!(Gate { wg });

/// Softmax top-k experts (not renormalized), plus the shared MLP where
/// `use_mixed_mlp_moe`.
#[derive(Debug)]
pub struct MoeBlock {
    shared_mlp: Option<Mlp>,
    gate: Gate,
    switch_mlp: SwitchGlu,
    top_k: i32,
}
impl_module!(MoeBlock {
    shared_mlp,
    gate,
    switch_mlp
});

impl MoeBlock {
    fn new(args: &ModelArgs, i: usize) -> crate::Result<MoeBlock> {
        let (dim, hidden) = (args.hidden_size, args.intermediate_size);
        let shared_mlp = match args.use_mixed_mlp_moe {
            true => {
                let n = args.num_shared_expert.at(i, "num_shared_expert", "hunyuan")?;
                Some(Mlp::new(dim, hidden * n, false)?)
            }
            false => None,
        };
        let top_k = args.moe_topk.at(i, "moe_topk", "hunyuan")?;
        if top_k < 1 || top_k > args.num_experts {
            return Err(config_error("hunyuan", format!(
                "key `moe_topk`: layer {i} picks {top_k} of {} experts",
                args.num_experts
            )));
        }
        let expert_hidden = match &args.moe_intermediate_size {
            Some(m) => m.at(i, "moe_intermediate_size", "hunyuan")?,
            None => hidden,
        };
        Ok(MoeBlock {
            shared_mlp,
            gate: Gate {
                wg: LinearLayer::new(dim, args.num_experts, false)?,
            },
            switch_mlp: SwitchGlu::new(dim, expert_hidden, args.num_experts, false)?,
            top_k,
        })
    }
}

impl FeedForward for MoeBlock {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let gates = self.gate.wg.forward(x)?.softmax(Some(&[-1]), true)?;
        let inds = top_k_indices_of_negated(&gates, self.top_k)?;
        let scores = gates.take_along_axis(&inds, -1)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        let dtype = y.dtype();
        let weights = scores.expand_dims(&[-1])?.astype(Dtype::Float32)?;
        let mut y = y
            .multiply(&weights)?
            .sum(Some(&[-2]), false)?
            .astype(dtype)?;
        if let Some(shared) = &self.shared_mlp {
            y = y.add(&shared.forward(x, None)?)?;
        }
        add_residual(y, residual)
    }
    fn fuse(&mut self) -> crate::Result<()> {
        match &mut self.shared_mlp {
            Some(m) => m.fuse(),
            None => Ok(()),
        }
    }
}

/// One layer: attention (own or shared k/v), then the MLP or the experts.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: DenseOrMoe<MoeBlock>,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl DecoderLayer {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        shared: Option<KvStates>,
    ) -> Result<(Array, KvStates)> {
        let normed = self.input_layernorm.forward(x)?;
        let (h, kv) = self.self_attn.forward(&normed, mask, cache, shared, x)?;
        let out = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))?;
        Ok((out, kv))
    }

    /// [`DecoderLayer::forward`] through [`mlx_nn::checkpoint::call`] (checkpointed when
    /// training asks for it): `x` and the shared k/v are its inputs, the hidden state
    /// and the k/v handed on its outputs.
    fn call(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        shared: Option<KvStates>,
    ) -> Result<(Array, KvStates)> {
        let mut inputs = vec![x];
        if let Some([k, v]) = &shared {
            inputs.extend([k, v]);
        }
        let mask = mask.clone();
        let out = mlx_nn::checkpoint::call(self, &inputs, cache, move |l, a, c| {
            let shared = match a {
                [_, k, v] => Some([k.clone(), v.clone()]),
                _ => None,
            };
            let (h, [k, v]) = l.forward(&a[0], &mask, c, shared)?;
            Ok(vec![h, k, v])
        })?;
        match <[Array; 3]>::try_from(out) {
            Ok([h, k, v]) => Ok((h, [k, v])),
            Err(_) => Err(mlx_array::Error::InvalidArgument(
                "a hunyuan layer gave other than 3 outputs".into(),
            )),
        }
    }
}

/// Hunyuan: `model` (`embed_tokens`, `layers`, `norm`), the head the embedding.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Stack<DecoderLayer, RmsNorm>,
}
impl_module!(Model { model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let dim = args.hidden_size;
        let head_dim = even_head_dim(dim, args.num_attention_heads, "hunyuan")?;
        if args.vocab_size <= 0 {
            return Err(config_error("hunyuan", "`vocab_size` must be positive".into()));
        }
        if args.use_cla && args.cla_share_factor < 1 {
            return Err(config_error("hunyuan", format!(
                "key `cla_share_factor` must be at least 1 with `use_cla` (got {})",
                args.cla_share_factor
            )));
        }
        let alpha = args.rope_alpha()?;
        let layers = (0..args.num_hidden_layers.max(0) as usize)
            .map(|i| {
                let rope = alpha_rope(head_dim, args.rope_theta, alpha)?;
                let mlp = match args.num_experts {
                    1 => DenseOrMoe::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?)),
                    _ => DenseOrMoe::Moe(Box::new(MoeBlock::new(&args, i)?)),
                };
                Ok(DecoderLayer {
                    self_attn: Attention::new(&args, args.kv_proj(i), head_dim, rope)?,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, args.rms_norm_eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, args.rms_norm_eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Stack {
            embed_tokens: mlx_nn::EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, args.rms_norm_eps)?,
        };
        Ok(Model { args, model })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "hunyuan")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        let mut shared: Option<KvStates> = None;
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            if self.args.kv_proj(i) {
                shared = None;
            }
            let (out, kv) = layer.call(&h, &mask, cache, shared.take())?;
            h = out;
            shared = Some(kv);
        }
        m.embed_tokens.as_linear(&m.norm.forward(&h)?)
    }
    /// A standard cache per layer, the layers without k/v projections included.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// mlx-lm's `sanitize`: when layer 0 has a fused dense `mlp.gate_and_up_proj`, every
    /// `qkv_proj` is split per kv head into q, k and v (`[n_kv, groups + 2, head_dim,
    /// -1]`) and every `gate_and_up_proj` into `up_proj` then `gate_proj`; per-expert
    /// tensors are stacked into `mlp.switch_mlp`.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = if weights.contains_key("model.layers.0.mlp.gate_and_up_proj.weight") {
            self.split_fused(weights)?
        } else {
            weights
        };
        if !weights.contains_key("model.layers.0.mlp.experts.0.up_proj.weight") {
            return Ok(weights);
        }
        stack_mlp_experts(&mut weights, self.args.num_hidden_layers, self.args.num_experts)?;
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

impl Model {
    /// The fused checkpoint's `qkv_proj` and `gate_and_up_proj` tensors split as
    /// mlx-lm's `sanitize` splits them (any kind: weights, biases, scales).
    fn split_fused(&self, weights: Weights) -> crate::Result<Weights> {
        let a = &self.args;
        let n_kv = a.num_key_value_heads;
        let groups = a.num_attention_heads / n_kv.max(1);
        let head_dim = a.hidden_size / a.num_attention_heads.max(1);
        let mut out = Weights::new();
        for (k, v) in weights {
            if k.contains("qkv_proj") {
                let parts = v
                    .reshape(&[n_kv, groups + 2, head_dim, -1])?
                    .split_at(&[groups, groups + 1], 1)?;
                for (name, part) in ["q_proj", "k_proj", "v_proj"].iter().zip(parts) {
                    out.insert(k.replace("qkv_proj", name), part.flatten(0, 2)?);
                }
            } else if k.contains("gate_and_up_proj") {
                let parts = v.split_sections(2, 0)?;
                for (name, part) in ["up_proj", "gate_proj"].iter().zip(parts) {
                    out.insert(k.replace("gate_and_up_proj", name), part);
                }
            } else {
                out.insert(k, v);
            }
        }
        Ok(out)
    }
}
