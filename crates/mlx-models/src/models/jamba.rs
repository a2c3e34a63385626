//! Jamba (`jamba`), following `mlx_lm/models/jamba.py`: pre-norm layers, each either
//! attention without positions (no RoPE; a `KVCache`) or a Mamba mixer (an
//! `ArraysCache` of its convolution window and state), by `layers_block_type` (default:
//! attention where `i % attn_layer_period == attn_layer_offset`); the mixer's delta, B
//! and C through weighted RMS norms, its scan's state for the whole chunk built at once
//! and carried across positions with the compiled `fma`; by `expert_layer_period` /
//! `expert_layer_offset` (with `num_experts > 1`) a SwiGLU MLP or experts picked from
//! the raw router logits, their scores a precise softmax over the chosen ones; the head
//! tied by `tie_word_embeddings`. Like mlx-lm's, the mixer takes no padding mask, so
//! prompts of a batch must not be padded. `sanitize` moves HF's convolution weights to
//! MLX's layout, drops a tied head and stacks the experts.
use super::attention::{Attention, AttentionDims};
use super::config_error;
use super::head::{self, LogitScale};
use super::lm::drop_tied_head;
use super::mlp::Mlp;
use super::recurrent::{recurrent_state, DepthwiseConv};
use super::{layer_caches, top_k_indices_of_negated, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::activations::{call_compiled, silu, softplus, swiglu};
use mlx_nn::cache::ArraysState;
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{
    impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, Param, RmsNorm, Rope,
    SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

fn default_true() -> bool {
    true
}

/// config.json keys read by Jamba.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub attn_layer_offset: i32,
    pub attn_layer_period: i32,
    pub expert_layer_offset: i32,
    pub expert_layer_period: i32,
    pub mamba_d_conv: i32,
    pub mamba_d_state: i32,
    pub mamba_expand: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: i32,
    pub vocab_size: i32,
    #[serde(default)]
    pub mamba_dt_rank: Option<Value>,
    #[serde(default)]
    pub mamba_proj_bias: bool,
    #[serde(default = "default_true")]
    pub mamba_conv_bias: bool,
    #[serde(default)]
    pub layers_block_type: Option<Vec<String>>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

/// The resolved per-layer plan and the mixer's rank (`__post_init__`).
struct Plan {
    attention: Vec<bool>,
    experts: Vec<bool>,
    rank: i32,
}

fn plan(a: &ModelArgs) -> crate::Result<Plan> {
    let err = |m: String| config_error("jamba", m);
    let rank = match &a.mamba_dt_rank {
        None => (f64::from(a.hidden_size) / 16.0).ceil() as i32,
        Some(Value::String(s)) if s == "auto" => (f64::from(a.hidden_size) / 16.0).ceil() as i32,
        Some(Value::Number(n)) if n.as_i64().is_some_and(|r| r > 0 && r <= i32::MAX as i64) => {
            n.as_i64().unwrap_or_default() as i32
        }
        Some(other) => {
            return Err(err(format!(
                "key `mamba_dt_rank`: expected a positive integer or \"auto\", got {other}"
            )))
        }
    };
    if a.num_hidden_layers < 0 {
        return Err(err("key `num_hidden_layers` must not be negative".into()));
    }
    let types = match &a.layers_block_type {
        Some(t) => t.clone(),
        None => {
            if a.attn_layer_period <= 0 {
                return Err(err(format!(
                    "key `attn_layer_period` ({}) must be positive",
                    a.attn_layer_period
                )));
            }
            (0..a.num_hidden_layers)
                .map(|i| {
                    if i % a.attn_layer_period == a.attn_layer_offset {
                        "attention"
                    } else {
                        "mamba"
                    }
                    .to_string()
                })
                .collect()
        }
    };
    // `layers_block_type.index("attention")` / `.index("mamba")`: both kinds must exist.
    for kind in ["attention", "mamba"] {
        if !types.iter().any(|t| t == kind) {
            return Err(err(format!("key `layers_block_type`: no \"{kind}\" layer")));
        }
    }
    let moe = a.num_experts > 1;
    if moe && a.expert_layer_period <= 0 {
        return Err(err(format!(
            "key `expert_layer_period` ({}) must be positive",
            a.expert_layer_period
        )));
    }
    let experts: Vec<bool> = (0..types.len() as i64)
        .map(|i| {
            moe && (i + i64::from(a.expert_layer_offset)).rem_euclid(i64::from(a.expert_layer_period))
                == 0
        })
        .collect();
    if experts.iter().any(|&e| e) {
        let (e, k) = (a.num_experts, a.num_experts_per_tok);
        if k <= 0 || e < k {
            return Err(err(format!(
                "`num_experts_per_tok` ({k}) must be positive and at most `num_experts` ({e})"
            )));
        }
    }
    let (h, kv) = (a.num_attention_heads, a.num_key_value_heads);
    if h <= 0 || kv <= 0 || h % kv != 0 || a.hidden_size % h != 0 {
        return Err(err(format!(
            "`num_attention_heads` ({h}) must divide `hidden_size` ({}) and be a positive \
             multiple of `num_key_value_heads` ({kv})",
            a.hidden_size
        )));
    }
    if a.mamba_d_conv < 2 || a.mamba_d_state <= 0 || a.mamba_expand <= 0 {
        return Err(err(format!(
            "`mamba_d_conv` ({}) must be at least 2, `mamba_d_state` ({}) and `mamba_expand` \
             ({}) positive",
            a.mamba_d_conv, a.mamba_d_state, a.mamba_expand
        )));
    }
    Ok(Plan {
        attention: types.iter().map(|t| t == "attention").collect(),
        experts,
        rank,
    })
}

/// `JambaMambaMixer`.
#[derive(Debug)]
struct MambaMixer {
    in_proj: LinearLayer,
    conv1d: DepthwiseConv,
    x_proj: LinearLayer,
    dt_proj: LinearLayer,
    a_log: Param,
    d: Param,
    out_proj: LinearLayer,
    dt_layernorm: RmsNorm,
    b_layernorm: RmsNorm,
    c_layernorm: RmsNorm,
    rank: i32,
    state_size: i32,
}
impl_module!(MambaMixer {
    in_proj,
    conv1d,
    x_proj,
    dt_proj,
    a_log as "A_log",
    d as "D",
    out_proj,
    dt_layernorm,
    b_layernorm,
    c_layernorm
});

/// mlx-lm's compiled `fma`: `a * b + c`.
fn fma(a: &Array, b: &Array, c: &Array) -> Result<Array> {
    call_compiled(
        "jamba_fma",
        |x| Ok(vec![x[0].multiply(&x[1])?.add(&x[2])?]),
        &[a, b, c],
    )
}

impl MambaMixer {
    fn new(a: &ModelArgs, rank: i32) -> crate::Result<MambaMixer> {
        let (h, st, eps) = (a.hidden_size, a.mamba_d_state, a.rms_norm_eps);
        let inner = a.mamba_expand * h;
        let f32z = |s: &[i32]| ops::zeros(s, Dtype::Float32);
        Ok(MambaMixer {
            in_proj: LinearLayer::new(h, inner * 2, a.mamba_proj_bias)?,
            conv1d: DepthwiseConv::zeros(inner, a.mamba_d_conv, a.mamba_conv_bias)?,
            x_proj: LinearLayer::new(inner, rank + 2 * st, false)?,
            dt_proj: LinearLayer::new(rank, inner, true)?,
            a_log: Param::new(f32z(&[inner, st])?),
            d: Param::new(ops::ones(&[inner], Dtype::Float32)?),
            out_proj: LinearLayer::new(inner, h, a.mamba_proj_bias)?,
            dt_layernorm: RmsNorm::new(rank, eps)?,
            b_layernorm: RmsNorm::new(st, eps)?,
            c_layernorm: RmsNorm::new(st, eps)?,
            rank,
            state_size: st,
        })
    }

    /// `ssm_step`: the scan over the chunk `x` (`[B, T, inner]`), from `state`.
    fn ssm_step(&self, x: &Array, a: &Array, state: Option<&Array>) -> Result<(Array, Array)> {
        let t = x.dim(1)?;
        let parts = self
            .x_proj
            .forward(x)?
            .split_at(&[self.rank, self.rank + self.state_size], -1)?;
        let delta = self.dt_layernorm.forward(&parts[0])?;
        let b = self.b_layernorm.forward(&parts[1])?;
        let c = self.c_layernorm.forward(&parts[2])?;
        let delta = softplus(&self.dt_proj.forward(&delta)?)?;
        let new_state = delta
            .multiply(x)?
            .expand_dims(&[-1])?
            .multiply(&b.expand_dims(&[-2])?)?;
        let dta = delta.expand_dims(&[-1])?.multiply(a)?.exp()?;
        let mut state = state.cloned();
        let mut steps = Vec::with_capacity(t.max(0) as usize);
        for i in 0..t {
            let mut s = new_state.slice_axis(1, i, i + 1)?.squeeze(Some(&[1]))?;
            if let Some(prev) = &state {
                let decay = dta.slice_axis(1, i, i + 1)?.squeeze(Some(&[1]))?;
                s = fma(prev, &decay, &s)?;
            }
            state = Some(s.clone());
            steps.push(s);
        }
        let states = ops::stack(&steps.iter().collect::<Vec<_>>(), 1)?;
        let y = states
            .matmul(&c.expand_dims(&[-1])?)?
            .squeeze(Some(&[-1]))?;
        let y = y.add(&self.d.multiply(x)?)?;
        let last = states.slice_axis(1, t - 1, t)?.squeeze(Some(&[1]))?;
        Ok((y, last))
    }

    fn forward(&self, x: &Array, cache: Option<&mut ArraysState>) -> Result<Array> {
        let xz = self.in_proj.forward(x)?.split_sections(2, -1)?;
        let (x, z) = (&xz[0], &xz[1]);
        let conv_state = cache.as_deref().and_then(|c| c.get(0)).cloned();
        let (conv_out, new_conv_state) = self.conv1d.causal(x, conv_state.as_ref())?;
        let xs = silu(&conv_out)?;
        let a = self.a_log.exp()?.negative()?;
        let ssm_state = cache.as_deref().and_then(|c| c.get(1)).cloned();
        let (y, ssm_state) = self.ssm_step(&xs, &a, ssm_state.as_ref())?;
        let out = self.out_proj.forward(&swiglu(z, &y)?)?;
        if let Some(c) = cache {
            c.set(0, new_conv_state)?;
            c.set(1, ssm_state)?;
        }
        Ok(out)
    }
}

/// `JambaSparseMoeBlock`: the top experts of the raw router logits, their scores a
/// precise softmax over the chosen ones.
#[derive(Debug)]
struct SparseMoe {
    router: LinearLayer,
    switch_mlp: SwitchGlu,
    top_k: i32,
}
impl_module!(SparseMoe { router, switch_mlp });

impl SparseMoe {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gates = self.router.forward(x)?;
        let inds = top_k_indices_of_negated(&gates, self.top_k)?;
        let scores = gates
            .take_along_axis(&inds, -1)?
            .softmax(Some(&[-1]), true)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        y.multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)
    }
}

/// A layer's feed-forward block.
#[derive(Debug)]
enum FeedForward {
    Dense(Box<Mlp>),
    Sparse(Box<SparseMoe>),
}
enum_module!(FeedForward {
    Dense => "",
    Sparse => "",
});

/// A layer's mixer: attention or Mamba.
#[derive(Debug)]
enum Mixer {
    Attention(Box<Attention>),
    Mamba(Box<MambaMixer>),
}
enum_module!(Mixer {
    Attention => "self_attn",
    Mamba => "mamba",
});

/// `JambaDecoderLayer`.
#[derive(Debug)]
struct DecoderLayer {
    mixer: Mixer,
    feed_forward: FeedForward,
    input_layernorm: RmsNorm,
    pre_ff_layernorm: RmsNorm,
}

impl Module for DecoderLayer {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.mixer.visit_params(prefix, f);
        self.feed_forward
            .visit_params(&join(prefix, "feed_forward"), f);
        self.input_layernorm
            .visit_params(&join(prefix, "input_layernorm"), f);
        self.pre_ff_layernorm
            .visit_params(&join(prefix, "pre_ff_layernorm"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.mixer.visit_params_mut(prefix, f);
        self.feed_forward
            .visit_params_mut(&join(prefix, "feed_forward"), f);
        self.input_layernorm
            .visit_params_mut(&join(prefix, "input_layernorm"), f);
        self.pre_ff_layernorm
            .visit_params_mut(&join(prefix, "pre_ff_layernorm"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.mixer.visit_quantizable_mut(prefix, f)?;
        self.feed_forward
            .visit_quantizable_mut(&join(prefix, "feed_forward"), f)
    }
}

impl DecoderLayer {
    fn is_attn(&self) -> bool {
        matches!(self.mixer, Mixer::Attention(_))
    }
}

/// `JambaModel`.
#[derive(Debug)]
struct JambaModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    final_layernorm: RmsNorm,
}
impl_module!(JambaModel {
    embed_tokens,
    layers,
    final_layernorm
});

/// Jamba with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: JambaModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let plan = plan(&args)?;
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let head_dim = dim / args.num_attention_heads;
        let layers = plan
            .attention
            .iter()
            .zip(&plan.experts)
            .map(|(&attn, &experts)| {
                let mixer = if attn {
                    let d = AttentionDims {
                        dim,
                        n_heads: args.num_attention_heads,
                        n_kv_heads: args.num_key_value_heads,
                        head_dim,
                        qkv_bias: false,
                        o_bias: false,
                    };
                    Mixer::Attention(Box::new(Attention::new(
                        d,
                        Rope::Identity,
                        f64::from(head_dim).powf(-0.5),
                    )?))
                } else {
                    Mixer::Mamba(Box::new(MambaMixer::new(&args, plan.rank)?))
                };
                let feed_forward = if experts {
                    FeedForward::Sparse(Box::new(SparseMoe {
                        router: LinearLayer::new(dim, args.num_experts, false)?,
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.intermediate_size,
                            args.num_experts,
                            false,
                        )?,
                        top_k: args.num_experts_per_tok,
                    }))
                } else {
                    FeedForward::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?))
                };
                Ok(DecoderLayer {
                    mixer,
                    feed_forward,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    pre_ff_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = JambaModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            final_layernorm: RmsNorm::new(dim, eps)?,
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
    Ok(Box::new(Model::new(parse_args(config, "jamba")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let attn_idx = m.layers.iter().position(|l| l.is_attn()).unwrap_or(0);
        let mask = mlx_nn::cache::create_attention_mask(
            n,
            super::cache_at(caches, attn_idx),
            None,
            false,
        )?;
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let forward = move |layer: &DecoderLayer,
                                x: &Array,
                                mask: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                let normed = layer.input_layernorm.forward(x)?;
                let h = match &layer.mixer {
                    Mixer::Attention(at) => {
                        at.forward(&normed, mask, cache, None, Default::default())?
                    }
                    Mixer::Mamba(mx) => {
                        let state = recurrent_state(cache, i, "mamba")?;
                        mx.forward(&normed, state)?
                    }
                };
                let r = x.add(&h)?;
                let n = layer.pre_ff_layernorm.forward(&r)?;
                let f = match &layer.feed_forward {
                    FeedForward::Dense(mlp) => mlp.forward(&n, None)?,
                    FeedForward::Sparse(moe) => moe.forward(&n)?,
                };
                r.add(&f)
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, forward)?;
        }
        let out = m.final_layernorm.forward(&h)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: a `KVCache` per attention layer, an `ArraysCache(2)` per mixer.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model
            .layers
            .iter()
            .map(|l| {
                if l.is_attn() {
                    CacheSpec::Standard
                } else {
                    CacheSpec::Arrays { size: 2 }
                }
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The mixer takes no padding mask (as mlx-lm's): padded rows would scan it.
    fn padded_prefill_is_exact(&self) -> bool {
        false
    }

    decoder_accessors!();
}

impl Architecture for Model {
    /// Each mixer's `nn.Conv1d` draws one key for its weight.
    fn extra_init_key_draws(&self) -> usize {
        self.model.layers.iter().filter(|l| !l.is_attn()).count()
    }

    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = weights
            .into_iter()
            .map(|(k, v)| {
                let v = if k.contains("conv1d.weight") && v.dim(-1)? != 1 {
                    v.moveaxis(2, 1)?
                } else {
                    v
                };
                Ok((k, v))
            })
            .collect::<crate::Result<Weights>>()?;
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        for l in 0..self.args.num_hidden_layers {
            let base = format!("model.layers.{l}.feed_forward");
            let experts = format!("{base}.experts.");
            if !weights.keys().any(|k| k.starts_with(&experts)) {
                continue;
            }
            let count = weights.len();
            for proj in ["gate_proj", "down_proj", "up_proj"] {
                for name in ["weight", "bias", "scales", "biases"] {
                    let parts: Vec<Array> = (0..count)
                        .filter_map(|e| weights.remove(&format!("{experts}{e}.{proj}.{name}")))
                        .collect();
                    if !parts.is_empty() {
                        let refs: Vec<&Array> = parts.iter().collect();
                        weights.insert(
                            format!("{base}.switch_mlp.{proj}.{name}"),
                            ops::stack(&refs, 0)?,
                        );
                    }
                }
            }
        }
        Ok(weights)
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            if let Mixer::Attention(at) = &mut layer.mixer {
                at.fuse()?;
            }
            if let FeedForward::Dense(m) = &mut layer.feed_forward {
                m.fuse()?;
            }
        }
        Ok(())
    }
}
