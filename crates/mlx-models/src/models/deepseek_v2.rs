//! DeepSeek-V2 (`deepseek_v2`), following `mlx_lm/models/deepseek_v2.py`: low-rank
//! queries and a compressed key/value projection expanded by `kv_b_proj` into full
//! per-head keys (no-position part plus a shared rotary part repeated over the heads)
//! and values, kept in a plain `KVCache`; DeepSeek's own YaRN rotary embedding (always,
//! from the required `rope_scaling`); softmax-scored top-k experts (optionally
//! group-limited) plus shared experts after the first `first_k_dense_replace` layers.
use super::config_error;
use super::decoder::{add_residual, stack_mlp_experts, DenseOrMoe, FeedForward};
use super::mlp::Mlp;
use super::{batch_len, cache_at, layer_caches, merge_heads, split_heads, top_k_indices_of_negated};
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, scaled_dot_product_attention, AttnMask, EmbeddingLayer, KvCache, KvFetch,
    LinearLayer, Param, RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by DeepSeek-V2, with mlx-lm's defaults.
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
    pub n_group: Option<i32>,
    pub topk_group: Option<i32>,
    pub num_experts_per_tok: Option<i32>,
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
            model_type: "deepseek_v2".into(),
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
            topk_method: "gready".into(),
            n_group: None,
            topk_group: None,
            num_experts_per_tok: None,
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

/// Attention over keys expanded from the compressed projection.
#[derive(Debug)]
pub struct Attention {
    q_proj: Option<LinearLayer>,
    q_a_proj: Option<LinearLayer>,
    q_a_layernorm: Option<RmsNorm>,
    q_b_proj: Option<LinearLayer>,
    kv_a_proj_with_mqa: LinearLayer,
    kv_a_layernorm: RmsNorm,
    kv_b_proj: LinearLayer,
    o_proj: LinearLayer,
    rope: Rope,
    num_heads: i32,
    q_head_dim: i32,
    qk_nope_head_dim: i32,
    kv_lora_rank: i32,
    scale: f64,
}
impl_module!(Attention {
    q_proj,
    q_a_proj,
    q_a_layernorm,
    q_b_proj,
    kv_a_proj_with_mqa,
    kv_a_layernorm,
    kv_b_proj,
    o_proj
});

/// The sizes of an [`Attention`] and what its file chooses.
pub(crate) struct AttentionParts {
    pub dim: i32,
    pub num_heads: i32,
    /// `None`: one `q_proj`.
    pub q_lora_rank: Option<i32>,
    pub kv_lora_rank: i32,
    pub qk_nope_head_dim: i32,
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
    /// Biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`.
    pub bias: bool,
    /// Epsilon of `q_a_layernorm` and `kv_a_layernorm`.
    pub norm_eps: f64,
    pub rope: Rope,
    pub scale: f64,
}

impl Attention {
    /// Zero placeholders of the given sizes.
    pub(crate) fn from_parts(p: AttentionParts) -> crate::Result<Attention> {
        let (dim, heads) = (p.dim, p.num_heads);
        let q_head_dim = p.qk_nope_head_dim + p.qk_rope_head_dim;
        let (q_proj, q_a_proj, q_a_layernorm, q_b_proj) = match p.q_lora_rank {
            None => (
                Some(LinearLayer::new(dim, heads * q_head_dim, false)?),
                None,
                None,
                None,
            ),
            Some(r) => (
                None,
                Some(LinearLayer::new(dim, r, p.bias)?),
                Some(RmsNorm::new(r, p.norm_eps)?),
                Some(LinearLayer::new(r, heads * q_head_dim, false)?),
            ),
        };
        Ok(Attention {
            q_proj,
            q_a_proj,
            q_a_layernorm,
            q_b_proj,
            kv_a_proj_with_mqa: LinearLayer::new(
                dim,
                p.kv_lora_rank + p.qk_rope_head_dim,
                p.bias,
            )?,
            kv_a_layernorm: RmsNorm::new(p.kv_lora_rank, p.norm_eps)?,
            kv_b_proj: LinearLayer::new(
                p.kv_lora_rank,
                heads * (p.qk_nope_head_dim + p.v_head_dim),
                false,
            )?,
            o_proj: LinearLayer::new(heads * p.v_head_dim, dim, p.bias)?,
            rope: p.rope,
            num_heads: heads,
            q_head_dim,
            qk_nope_head_dim: p.qk_nope_head_dim,
            kv_lora_rank: p.kv_lora_rank,
            scale: p.scale,
        })
    }

    fn new(args: &ModelArgs) -> crate::Result<Attention> {
        let q_head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim;
        // mlx-lm reads `rope_scaling["factor"]` unconditionally and always builds its
        // YaRN embedding from the section's keys.
        let mut cfg = rope_scaling(args.rope_scaling.as_ref())?.ok_or_else(|| {
            config_error("deepseek_v2", "key `rope_scaling`: required (with `factor`) by DeepSeek-V2".into())
        })?;
        let factor = cfg
            .factor
            .ok_or_else(|| config_error("deepseek_v2", "key `rope_scaling.factor` is missing".into()))?;
        let mut scale = (q_head_dim as f64).powf(-0.5);
        let mscale_all_dim = cfg.mscale_all_dim.unwrap_or(0.0);
        if mscale_all_dim != 0.0 {
            let m = if factor <= 1.0 {
                1.0
            } else {
                0.1 * mscale_all_dim * factor.ln() + 1.0
            };
            scale = scale * m * m;
        }
        cfg.rope_type = "yarn".into();
        let rope = Rope::yarn(args.qk_rope_head_dim, true, args.rope_theta, &cfg)?;
        Attention::from_parts(AttentionParts {
            dim: args.hidden_size,
            num_heads: args.num_attention_heads,
            q_lora_rank: args.q_lora_rank,
            kv_lora_rank: args.kv_lora_rank,
            qk_nope_head_dim: args.qk_nope_head_dim,
            qk_rope_head_dim: args.qk_rope_head_dim,
            v_head_dim: args.v_head_dim,
            bias: args.attention_bias,
            norm_eps: 1e-6,
            rope,
            scale,
        })
    }

    /// `o_proj(attention(x))`; the key's rotary part is shared by the heads (mlx-lm's
    /// `repeat` here, `broadcast_to` in MiniCPM3: the same keys).
    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let q = match (&self.q_proj, &self.q_a_proj, &self.q_a_layernorm, &self.q_b_proj) {
            (Some(p), ..) => p.forward(x)?,
            (None, Some(a), Some(n), Some(bp)) => bp.forward(&n.forward(&a.forward(x)?)?)?,
            _ => {
                return Err(mlx_array::Error::InvalidArgument(
                    "deepseek_v2 attention: no query projection".into(),
                ))
            }
        };
        let q = q
            .reshape(&[b, l, self.num_heads, self.q_head_dim])?
            .transpose(Some(&[0, 2, 1, 3]))?;
        let [q_nope, q_pe] = two(q.split_at(&[self.qk_nope_head_dim], -1)?)?;
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let [compressed, k_pe] = two(compressed.split_at(&[self.kv_lora_rank], -1)?)?;
        let k_pe = split_heads(&k_pe, b, l, 1)?;
        let kv = self
            .kv_b_proj
            .forward(&self.kv_a_layernorm.forward(&compressed)?)?
            .reshape(&[b, l, self.num_heads, -1])?
            .transpose(Some(&[0, 2, 1, 3]))?;
        let [k_nope, values] = two(kv.split_at(&[self.qk_nope_head_dim], -1)?)?;
        let (q_pe, fetch) = match cache {
            Some(c) => {
                let offset = c.rope_offset()?;
                let q_pe = self.rope.forward_at(&q_pe, offset.as_rope_offset())?;
                let k_pe = self.rope.forward_at(&k_pe, offset.as_rope_offset())?;
                let k_pe = k_pe.repeat(self.num_heads, Some(1))?;
                let keys = ops::concatenate(&[&k_nope, &k_pe], -1)?;
                (q_pe, mlx_nn::pipeline::update_and_fetch(c, &keys, &values)?)
            }
            None => {
                let q_pe = self.rope.forward(&q_pe, 0)?;
                let k_pe = self.rope.forward(&k_pe, 0)?.repeat(self.num_heads, Some(1))?;
                let keys = ops::concatenate(&[&k_nope, &k_pe], -1)?;
                (q_pe, KvFetch::Plain { keys, values })
            }
        };
        let queries = ops::concatenate(&[&q_nope, &q_pe], -1)?;
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        self.o_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// The two parts of a split.
fn two(parts: Vec<Array>) -> Result<[Array; 2]> {
    <[Array; 2]>::try_from(parts)
        .map_err(|_| mlx_array::Error::InvalidArgument("expected a split in two".into()))
}

/// The router: softmax scores, the weakest groups zeroed for `group_limited_greedy`,
/// then the top `k`, scaled.
#[derive(Debug)]
pub struct MoeGate {
    weight: Param,
    top_k: i32,
    group_limited: Option<(i32, i32)>,
    /// `None` where the file does not scale the scores (deepseek.py).
    routed_scaling_factor: Option<f64>,
}
impl_module!(MoeGate { weight });

impl MoeGate {
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = x.matmul(&self.weight.transposed()?)?;
        let mut scores = gates.softmax(Some(&[-1]), true)?;
        if let Some((n_group, topk_group)) = self.group_limited {
            let (b, l) = batch_len(x)?;
            scores = scores.reshape(&[b, l, n_group, -1])?;
            let group_scores = scores.max(Some(&[-1]), true)?;
            let k = n_group - topk_group;
            let group_idx = group_scores
                .argpartition(k - 1, Some(-2))?
                .slice_axis(-2, 0, k)?
                .stop_gradient()?;
            let zero = Array::scalar_f64(0.0, scores.dtype())?;
            scores = scores
                .put_along_axis(&group_idx, &zero, -2)?
                .reshape(&[b, l, -1])?;
        }
        let inds = top_k_indices_of_negated(&scores, self.top_k)?;
        let mut scores = scores.take_along_axis(&inds, -1)?;
        if let Some(s) = self.routed_scaling_factor {
            scores = scores.multiply(s)?;
        }
        Ok((inds, scores))
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
        let (inds, scores) = self.gate.route(x)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        let mut y = y
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?;
        if let Some(shared) = &self.shared_experts {
            y = y.add(&shared.forward(x, None)?)?;
        }
        add_residual(y, residual)
    }
    fn fuse(&mut self) -> crate::Result<()> {
        match &mut self.shared_experts {
            Some(m) => m.fuse(),
            None => Ok(()),
        }
    }
}

/// One decoder layer (its feed-forward DeepSeek-V2's dense-or-experts block, Youtu-LLM's
/// SwiGLU MLP).
#[derive(Debug)]
pub struct Layer {
    self_attn: Attention,
    mlp: Box<dyn FeedForward>,
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

impl Layer {
    /// A pre-norm layer of `dim` features whose norms have epsilon `eps`.
    pub(crate) fn new(
        self_attn: Attention,
        mlp: Box<dyn FeedForward>,
        dim: i32,
        eps: f64,
    ) -> crate::Result<Layer> {
        Ok(Layer {
            self_attn,
            mlp,
            input_layernorm: RmsNorm::new(dim, eps)?,
            post_attention_layernorm: RmsNorm::new(dim, eps)?,
        })
    }
}

impl Stack {
    /// `vocab x dim` embeddings, `layers`, and the final norm of epsilon `eps`.
    pub(crate) fn new(vocab: i32, dim: i32, eps: f64, layers: Vec<Layer>) -> crate::Result<Stack> {
        Ok(Stack {
            embed_tokens: EmbeddingLayer::new(vocab, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        })
    }

    /// The embedding, to read tied logits from.
    pub(crate) fn embed_tokens(&self) -> &EmbeddingLayer {
        &self.embed_tokens
    }

    /// Fuses every layer's feed-forward projections.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        for layer in &mut self.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }

    pub(crate) fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |layer, h, mask, cache| {
                let x = layer.input_layernorm.forward(h)?;
                let h2 = h.add(&layer.self_attn.forward(&x, mask, cache)?)?;
                layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&h2)?, Some(&h2))
            })?;
        }
        self.norm.forward(&h)
    }
}

/// DeepSeek-V2 with its (always untied) head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Stack,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        if args.moe_layer_freq <= 0 {
            return Err(config_error("deepseek_v2", "key `moe_layer_freq` must be positive".into()));
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let mlp = match args.n_routed_experts {
                    Some(n_experts)
                        if i >= args.first_k_dense_replace && i % args.moe_layer_freq == 0 =>
                    {
                        DenseOrMoe::Moe(Box::new(moe(&args, n_experts)?))
                    }
                    _ => DenseOrMoe::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?.up_before_down())),
                };
                Layer::new(Attention::new(&args)?, Box::new(mlp), dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Stack::new(args.vocab_size, dim, eps, layers)?;
        let lm_head = LinearLayer::new(dim, args.vocab_size, false)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// A layer's expert block (the config keys mlx-lm reads there must be set).
fn moe(args: &ModelArgs, n_experts: i32) -> crate::Result<Moe> {
    let dim = args.hidden_size;
    let top_k = args.num_experts_per_tok.ok_or_else(|| {
        config_error("deepseek_v2", "key `num_experts_per_tok`: required with `n_routed_experts`".into())
    })?;
    let group_limited = if args.topk_method == "group_limited_greedy" {
        match (args.n_group, args.topk_group) {
            (Some(g), Some(t)) => Some((g, t)),
            _ => {
                return Err(config_error("deepseek_v2", 
                    "keys `n_group` and `topk_group`: required by `group_limited_greedy`".into(),
                ))
            }
        }
    } else {
        None
    };
    Moe::new(
        (dim, args.moe_intermediate_size),
        n_experts,
        args.n_shared_experts,
        top_k,
        group_limited,
        Some(args.routed_scaling_factor),
    )
}

impl Moe {
    /// `n_experts` SwitchGLU experts of `moe_dim` hidden units (`dims` is `(dim,
    /// moe_dim)`) routed by softmax top-`top_k` scores (group-limited when
    /// `group_limited` is `(n_group, topk_group)`, scaled by `routed_scaling_factor` where
    /// given), plus shared experts of `moe_dim * n_shared` (gate, up, down) where given.
    pub(crate) fn new(
        (dim, moe_dim): (i32, i32),
        n_experts: i32,
        n_shared: Option<i32>,
        top_k: i32,
        group_limited: Option<(i32, i32)>,
        routed_scaling_factor: Option<f64>,
    ) -> crate::Result<Moe> {
        let shared = n_shared
            .map(|n| Mlp::new(dim, moe_dim * n, false).map(Mlp::up_before_down))
            .transpose()?;
        Ok(Moe {
            switch_mlp: SwitchGlu::new(dim, moe_dim, n_experts, false)?,
            gate: MoeGate {
                weight: Param::new(ops::zeros(&[n_experts, dim], Dtype::Float32)?),
                top_k,
                group_limited,
                routed_scaling_factor,
            },
            shared_experts: shared,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "deepseek_v2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        self.lm_head.forward(&out)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Stacks per-expert weights into `switch_mlp`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if let Some(n_experts) = self.args.n_routed_experts {
            stack_mlp_experts(&mut weights, self.args.num_hidden_layers, n_experts)?;
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
