//! The decoder stack most mlx-lm files write out again: `model.embed_tokens`, then
//! `model.layers` of `h = x + self_attn(input_layernorm(x))`,
//! `out = h + mlp(post_attention_layernorm(h))`, then `model.norm`, with one causal mask
//! made from the first layer's cache. What differs between those files (the attention's
//! options, the feed-forward block, its name) is a parameter; the head and `sanitize`
//! stay in each model's file.
use super::attention::{Attention, Extras};
use super::mlp::Mlp;
use super::{layer_caches, LayerMasks};
use mlx_array::{Array, Result};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{EmbeddingLayer, KvCache, LinearLayer, Module, Param, RmsNorm, SwitchGlu};

/// A layer's feed-forward block.
pub trait FeedForward: Module + std::fmt::Debug + Send {
    /// `residual + block(x)` (`block(x)` without a residual).
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array>;

    /// Fuses dense projections that read the same input (see the `fuse` module).
    fn fuse(&mut self) -> crate::Result<()> {
        Ok(())
    }

    /// The block as a Llama MLP's gate/up/down, where it is one (AWQ).
    fn mlp_projections_mut(&mut self) -> Option<[&mut LinearLayer; 3]> {
        None
    }
}

impl FeedForward for Mlp {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        Mlp::forward(self, x, residual)
    }
    fn mlp_projections_mut(&mut self) -> Option<[&mut LinearLayer; 3]> {
        self.projections_mut()
    }
    fn fuse(&mut self) -> crate::Result<()> {
        Mlp::fuse(self)
    }
}

/// A layer's feed-forward block in the MoE models whose first (or every n-th) layers
/// stay dense: the SwiGLU [`Mlp`] or the model's expert block `M`.
#[derive(Debug)]
pub enum DenseOrMoe<M> {
    /// Dense SwiGLU.
    Dense(Box<Mlp>),
    /// Experts.
    Moe(Box<M>),
}

impl<M: FeedForward> Module for DenseOrMoe<M> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        match self {
            DenseOrMoe::Dense(m) => m.visit_params(prefix, f),
            DenseOrMoe::Moe(m) => m.visit_params(prefix, f),
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        match self {
            DenseOrMoe::Dense(m) => m.visit_params_mut(prefix, f),
            DenseOrMoe::Moe(m) => m.visit_params_mut(prefix, f),
        }
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        match self {
            DenseOrMoe::Dense(m) => m.visit_quantizable_mut(prefix, f),
            DenseOrMoe::Moe(m) => m.visit_quantizable_mut(prefix, f),
        }
    }
}

impl<M: FeedForward> FeedForward for DenseOrMoe<M> {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        match self {
            DenseOrMoe::Dense(m) => m.forward(x, residual),
            DenseOrMoe::Moe(m) => m.forward(x, residual),
        }
    }
    fn fuse(&mut self) -> crate::Result<()> {
        match self {
            DenseOrMoe::Dense(m) => m.fuse(),
            DenseOrMoe::Moe(m) => m.fuse(),
        }
    }
}

/// `residual + r` (`r` alone without a residual), as mlx-lm's `h + r`.
pub(crate) fn add_residual(r: Array, residual: Option<&Array>) -> Result<Array> {
    match residual {
        Some(h) => h.add(&r),
        None => Ok(r),
    }
}

/// A routed MoE block's output, as mlx-lm's `MoE.__call__` of deepseek_v3, mistral4,
/// glm4_moe and bailing_moe: the experts `routed` chose (indices, scores) weighted by
/// their scores, plus the shared MLP's output where there is one, then the residual.
pub(crate) fn routed_output<F: FeedForward>(
    x: &Array,
    residual: Option<&Array>,
    routed: (Array, Array),
    switch_mlp: &SwitchGlu,
    shared: Option<&F>,
) -> Result<Array> {
    let (inds, scores) = routed;
    let mut y = super::weigh_experts(&switch_mlp.forward(x, &inds)?, &scores)?;
    if let Some(shared) = shared {
        y = y.add(&shared.forward(x, None)?)?;
    }
    add_residual(y, residual)
}

/// Fuses a routed block's shared MLP, where it has one.
pub(crate) fn fuse_shared<F: FeedForward>(shared: &mut Option<F>) -> crate::Result<()> {
    shared.as_mut().map_or(Ok(()), |m| m.fuse())
}

/// One pre-norm decoder layer; its feed-forward block is named `ff_name`.
#[derive(Debug)]
pub struct DecoderLayer<F> {
    pub(crate) self_attn: Attention,
    pub(crate) mlp: F,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    ff_name: &'static str,
    /// The checkpoint name of the attention block (default `self_attn`).
    attn_name: &'static str,
    /// The checkpoint names of the two norms (default `input_layernorm`,
    /// `post_attention_layernorm`).
    norm_names: [&'static str; 2],
    /// Multiplies both residual branches (Granite's `residual_multiplier`).
    residual_scale: Option<f64>,
    /// The parameters in the order self_attn, norms, mlp (the files declaring the norms
    /// before the feed-forward) instead of llama.py's self_attn, mlp, norms: mlx.nn's
    /// `parameters()` keeps declaration order, which lays out a saved full fine-tune.
    norms_before_mlp: bool,
}

impl<F: FeedForward> DecoderLayer<F> {
    /// A layer of `self_attn` and `mlp` (named `ff_name`) with RMS norms of `dim`.
    pub(crate) fn new(
        self_attn: Attention,
        mlp: F,
        ff_name: &'static str,
        dim: i32,
        eps: f64,
    ) -> crate::Result<DecoderLayer<F>> {
        Ok(DecoderLayer {
            self_attn,
            mlp,
            input_layernorm: RmsNorm::new(dim, eps)?,
            post_attention_layernorm: RmsNorm::new(dim, eps)?,
            ff_name,
            attn_name: "self_attn",
            norm_names: ["input_layernorm", "post_attention_layernorm"],
            residual_scale: None,
            norms_before_mlp: false,
        })
    }

    /// The layer with both residual branches multiplied by `m`:
    /// `h = x + attn(norm(x)) * m`, `out = h + ff(norm(h)) * m`.
    pub(crate) fn with_residual_scale(mut self, m: f64) -> DecoderLayer<F> {
        self.residual_scale = Some(m);
        self
    }

    /// Names the norms before attention and before the feed-forward as the checkpoint
    /// does (Apertus's `attention_layernorm`, `feedforward_layernorm`).
    pub(crate) fn with_norm_names(
        mut self,
        attn: &'static str,
        ff: &'static str,
    ) -> DecoderLayer<F> {
        self.norm_names = [attn, ff];
        self
    }

    /// Names the attention block as the checkpoint does (Qwen's and OpenELM's `attn`).
    pub(crate) fn with_attn_name(mut self, name: &'static str) -> DecoderLayer<F> {
        self.attn_name = name;
        self
    }

    /// The layer of a file that declares the norms before the feed-forward (see
    /// `norms_before_mlp`).
    pub(crate) fn norms_before_mlp(mut self) -> DecoderLayer<F> {
        self.norms_before_mlp = true;
        self
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &mlx_nn::AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        if let Some(m) = self.residual_scale {
            let r = self.self_attn.forward(
                &self.input_layernorm.forward(x)?,
                mask,
                cache,
                None,
                Extras::default(),
            )?;
            let h = x.add(&r.multiply(m)?)?;
            let r = self
                .mlp
                .forward(&self.post_attention_layernorm.forward(&h)?, None)?;
            return h.add(&r.multiply(m)?);
        }
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            Some(x),
            Extras::default(),
        )?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

impl<F: FeedForward> Module for DecoderLayer<F> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.self_attn
            .visit_params(&join(prefix, self.attn_name), f);
        if !self.norms_before_mlp {
            self.mlp.visit_params(&join(prefix, self.ff_name), f);
        }
        let [attn_norm, ff_norm] = self.norm_names;
        self.input_layernorm
            .visit_params(&join(prefix, attn_norm), f);
        self.post_attention_layernorm
            .visit_params(&join(prefix, ff_norm), f);
        if self.norms_before_mlp {
            self.mlp.visit_params(&join(prefix, self.ff_name), f);
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.self_attn
            .visit_params_mut(&join(prefix, self.attn_name), f);
        if !self.norms_before_mlp {
            self.mlp.visit_params_mut(&join(prefix, self.ff_name), f);
        }
        let [attn_norm, ff_norm] = self.norm_names;
        self.input_layernorm
            .visit_params_mut(&join(prefix, attn_norm), f);
        self.post_attention_layernorm
            .visit_params_mut(&join(prefix, ff_norm), f);
        if self.norms_before_mlp {
            self.mlp.visit_params_mut(&join(prefix, self.ff_name), f);
        }
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.self_attn
            .visit_quantizable_mut(&join(prefix, self.attn_name), f)?;
        self.mlp
            .visit_quantizable_mut(&join(prefix, self.ff_name), f)
    }
}

impl<F: FeedForward> crate::awq::AwqBlock for DecoderLayer<F> {
    fn forward_block(&self, x: &Array, mask: &mlx_nn::AttnMask) -> Result<Array> {
        self.forward(x, mask, None)
    }
    fn attention(&self, x: &Array, mask: &mlx_nn::AttnMask) -> Result<Array> {
        self.self_attn
            .forward(x, mask, None, None, Extras::default())
    }
    fn feed_forward(&self, x: &Array) -> Result<Array> {
        self.mlp.forward(x, None)
    }
    fn parts(&mut self) -> Option<crate::awq::AwqParts<'_>> {
        if self.residual_scale.is_some() {
            return None;
        }
        let [q, k, v, o] = self.self_attn.projections_mut()?;
        let [gate, up, down] = self.mlp.mlp_projections_mut()?;
        Some(crate::awq::AwqParts {
            input_norm: &mut self.input_layernorm.weight,
            ff_norm: &mut self.post_attention_layernorm.weight,
            norm_offset: false,
            q,
            k,
            v,
            o,
            gate,
            up,
            down,
        })
    }
}

/// `embed_tokens`, the layers and the final `norm`.
#[derive(Debug)]
pub struct Decoder<F> {
    pub(crate) embed_tokens: EmbeddingLayer,
    pub(crate) layers: Vec<DecoderLayer<F>>,
    norm: RmsNorm,
    /// Multiplies the token embeddings (Granite's `embedding_multiplier`).
    embedding_scale: Option<f64>,
    /// The checkpoint names of the embedding, the layer list and the final norm
    /// (default `embed_tokens`, `layers`, `norm`).
    names: [&'static str; 3],
    /// How many times the layers run, with shared weights and a cache per layer and
    /// run (Nanbeige's `num_loops`; default 1).
    loops: usize,
    /// With `loops`: the final norm once at the end instead of after every run.
    skip_loop_final_norm: bool,
    /// Set by [`Decoder::with_loops`] and [`Decoder::with_sliding`]: mlx-lm's class
    /// defines `make_cache` (so `make_prompt_cache` ignores `max_kv_size`).
    pub(crate) defines_make_cache: bool,
    /// Set by [`Decoder::with_sliding`]: which layers attend through a window.
    sliding: Option<Sliding>,
}

/// The layers of a [`Decoder`] that attend through a window of `window` positions.
#[derive(Debug, Clone)]
struct Sliding {
    /// Per layer: whether it slides.
    layers: Vec<bool>,
    window: i32,
    /// The first global layer (its cache makes the global mask) and the first sliding
    /// one (its cache makes the windowed mask).
    full_idx: usize,
    swa_idx: Option<usize>,
}

impl<F: FeedForward + 'static> Decoder<F> {
    /// The stack over `layers`, with a `vocab x dim` embedding.
    pub(crate) fn new(
        vocab: i32,
        dim: i32,
        eps: f64,
        layers: Vec<DecoderLayer<F>>,
    ) -> crate::Result<Decoder<F>> {
        Ok(Decoder {
            embed_tokens: EmbeddingLayer::new(vocab, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
            embedding_scale: None,
            names: ["embed_tokens", "layers", "norm"],
            loops: 1,
            skip_loop_final_norm: false,
            defines_make_cache: false,
            sliding: None,
        })
    }

    /// The layers whose flag in `sliding` is set attend through a window of `window`
    /// positions, with a rotating cache of that size (mlx-lm's `make_cache`), the others
    /// globally; each kind's mask comes from the cache of its first layer (`full_idx`:
    /// the first global one).
    pub(crate) fn with_sliding(
        mut self,
        sliding: Vec<bool>,
        window: i32,
        full_idx: usize,
    ) -> Decoder<F> {
        let swa_idx = sliding.iter().position(|&s| s);
        self.sliding = Some(Sliding {
            layers: sliding,
            window,
            full_idx,
            swa_idx,
        });
        self.defines_make_cache = true;
        self
    }

    /// The caches mlx-lm's `make_cache` gives: a rotating one of the window for each
    /// sliding layer (see [`Decoder::with_sliding`]), else a plain one per layer and run.
    pub(crate) fn cache_specs(&self) -> Vec<crate::model::CacheSpec> {
        match &self.sliding {
            Some(s) => super::window_cache_specs(s.layers.iter().copied(), s.window),
            None => vec![crate::model::CacheSpec::Standard; self.num_caches()],
        }
    }

    /// The stack with the token embeddings multiplied by `m`.
    pub(crate) fn with_embedding_scale(mut self, m: f64) -> Decoder<F> {
        self.embedding_scale = Some(m);
        self
    }

    /// Names the embedding, the layer list and the final norm as the checkpoint does
    /// (Qwen's `wte`, `h`, `ln_f`).
    pub(crate) fn with_names(
        mut self,
        embed: &'static str,
        layers: &'static str,
        norm: &'static str,
    ) -> Decoder<F> {
        self.names = [embed, layers, norm];
        self
    }

    /// The stack run `loops` times over its layers (Nanbeige's `num_loops`), each run
    /// with its own caches and followed by the final norm unless `skip_final_norm`
    /// (then normed once at the end). Such a file defines `make_cache` (a cache per layer
    /// and run), so mlx-lm's `make_prompt_cache` ignores `max_kv_size` for it.
    pub(crate) fn with_loops(mut self, loops: usize, skip_final_norm: bool) -> Decoder<F> {
        self.loops = loops;
        self.defines_make_cache = true;
        self.skip_loop_final_norm = skip_final_norm;
        self
    }

    /// The number of caches the stack reads: one per layer and run.
    pub(crate) fn num_caches(&self) -> usize {
        self.layers.len() * self.loops
    }

    /// The normed hidden states of `inputs`.
    pub(crate) fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        if let Some(m) = self.embedding_scale {
            h = h.multiply(m)?;
        }
        let n = h.dim(1)?;
        let masks = match &self.sliding {
            Some(s) => LayerMasks::new(n, caches, s.full_idx, s.swa_idx, Some(s.window))?,
            None => LayerMasks::new(n, caches, 0, None, None)?,
        };
        let sliding = |i: usize| self.sliding.as_ref().is_some_and(|s| s.layers[i]);
        let mut caches = layer_caches(caches, self.num_caches())?.into_iter();
        for _ in 0..self.loops {
            for (i, (layer, cache)) in self.layers.iter().zip(caches.by_ref()).enumerate() {
                let mask = masks.get(sliding(i));
                h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| {
                    l.forward(x, m, c)
                })?;
            }
            if !self.skip_loop_final_norm {
                h = self.norm.forward(&h)?;
            }
        }
        if self.skip_loop_final_norm {
            h = self.norm.forward(&h)?;
        }
        Ok(h)
    }

    /// Fuses every layer's q/k/v and its feed-forward block's projections.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        for layer in &mut self.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

impl<F: FeedForward> Module for Decoder<F> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        let [embed, layers, norm] = self.names;
        self.embed_tokens.visit_params(&join(prefix, embed), f);
        self.layers.visit_params(&join(prefix, layers), f);
        self.norm.visit_params(&join(prefix, norm), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        let [embed, layers, norm] = self.names;
        self.embed_tokens.visit_params_mut(&join(prefix, embed), f);
        self.layers.visit_params_mut(&join(prefix, layers), f);
        self.norm.visit_params_mut(&join(prefix, norm), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        let [embed, layers, _] = self.names;
        self.embed_tokens
            .visit_quantizable_mut(&join(prefix, embed), f)?;
        self.layers.visit_quantizable_mut(&join(prefix, layers), f)
    }
}

/// The gated MLP's three projections as most MoE checkpoints name them, each stacked
/// under the same name (for [`stack_experts`]).
pub(crate) const GLU_EXPERT_PROJS: &[(&str, &str)] = &[
    ("gate_proj", "gate_proj"),
    ("down_proj", "down_proj"),
    ("up_proj", "up_proj"),
];

/// The tensor kinds of a possibly quantized linear layer (for [`stack_experts`]).
pub(crate) const LINEAR_KINDS: &[&str] = &["weight", "scales", "biases"];

/// [`stack_experts`] of the gated projections of `model.layers.{l}.mlp.experts.{e}`, the
/// most common layout (weights, scales and biases).
pub(crate) fn stack_mlp_experts(
    weights: &mut super::Weights,
    layers: i32,
    n_experts: i32,
) -> crate::Result<()> {
    stack_experts(
        weights,
        layers,
        |l| format!("model.layers.{l}.mlp"),
        GLU_EXPERT_PROJS,
        LINEAR_KINDS,
        n_experts,
    )
}

/// mlx-lm's expert stacking in `sanitize`: for each of `layers` layers, the
/// `{prefix}.experts.{e}.{name}.{kind}` tensors of `n_experts` experts become one
/// `{prefix}.switch_mlp.{proj}.{kind}` (`prefix` formats the layer index; `names` pairs
/// each checkpoint name with its `switch_mlp` projection; `kinds` are the tensor kinds
/// the mlx-lm file stacks). Kinds a checkpoint lacks (`scales`, `biases` of unquantized
/// ones) are skipped; a missing expert is an error.
pub(crate) fn stack_experts(
    weights: &mut super::Weights,
    layers: i32,
    prefix: impl Fn(i32) -> String,
    names: &[(&str, &str)],
    kinds: &[&str],
    n_experts: i32,
) -> crate::Result<()> {
    stack_experts_in(weights, layers, prefix, "experts", names, kinds, n_experts)
}

/// [`stack_experts`] for checkpoints whose experts sit under another list than
/// `experts` (phixtral's `moe.mlp.{e}`): `{prefix}.{list}.{e}.{name}.{kind}`.
pub(crate) fn stack_experts_in(
    weights: &mut super::Weights,
    layers: i32,
    prefix: impl Fn(i32) -> String,
    list: &str,
    names: &[(&str, &str)],
    kinds: &[&str],
    n_experts: i32,
) -> crate::Result<()> {
    let lists = (list, "switch_mlp");
    stack_experts_into(weights, layers, prefix, lists, names, kinds, n_experts)
}

/// [`stack_experts_in`] into `{prefix}.{stacked}.{proj}.{kind}` (`lists` is `(list,
/// stacked)`; Klear stacks `experts.{e}` into `experts` itself).
pub(crate) fn stack_experts_into(
    weights: &mut super::Weights,
    layers: i32,
    prefix: impl Fn(i32) -> String,
    (list, stacked): (&str, &str),
    names: &[(&str, &str)],
    kinds: &[&str],
    n_experts: i32,
) -> crate::Result<()> {
    for l in 0..layers {
        let prefix = prefix(l);
        for (name, proj) in names {
            for kind in kinds {
                if !weights.contains_key(&format!("{prefix}.{list}.0.{name}.{kind}")) {
                    continue;
                }
                let mut parts = Vec::new();
                for e in 0..n_experts {
                    let key = format!("{prefix}.{list}.{e}.{name}.{kind}");
                    parts.push(weights.remove(&key).ok_or_else(|| crate::Error::Weights {
                        path: "model weights".into(),
                        message: format!("missing expert tensor `{key}`"),
                    })?);
                }
                let refs: Vec<&Array> = parts.iter().collect();
                weights.insert(
                    format!("{prefix}.{stacked}.{proj}.{kind}"),
                    mlx_array::ops::stack(&refs, 0)?,
                );
            }
        }
    }
    Ok(())
}
