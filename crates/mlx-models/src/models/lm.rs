//! mlx-lm's `Model` class of the files built on the shared [`Decoder`]: `model` (the
//! stack), then `lm_head`, or `model.embed_tokens.as_linear` when the two are tied, and a
//! plain `KVCache` for every layer. Each model file keeps its config, its layers'
//! attention and feed-forward, and its `sanitize` (`impl Architecture`); this is the
//! wrapper they would all write the same way. For the files with layers or norms of
//! their own there is [`Stack`] (`embed_tokens`, `layers`, `norm`), the loop over the
//! layers (`causal_layers`, `masked_layers`) and the head-size check.
use super::decoder::{Decoder, DecoderLayer, FeedForward};
use super::deepseek_v3::cast_all_but;
use super::head::{self, LogitScale};
use super::{cache_at, layer_caches, Weights};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::checkpoint::LayerFn;
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{AttnMask, EmbeddingLayer, KvCache, LinearLayer, Module, Param};

/// [`LmDims`] from the config.json keys most files name alike: `vocab_size`,
/// `hidden_size`, `rms_norm_eps`, `num_hidden_layers`, `tie_word_embeddings`.
macro_rules! lm_dims {
    ($args:expr) => {
        $crate::models::lm::LmDims {
            model_type: $args.model_type.clone(),
            vocab: $args.vocab_size,
            dim: $args.hidden_size,
            eps: $args.rms_norm_eps,
            layers: $args.num_hidden_layers,
            tied: $args.tie_word_embeddings,
        }
    };
}

/// The sizes the stack and the head are built from.
#[derive(Debug, Clone)]
pub(crate) struct LmDims {
    pub(crate) model_type: String,
    pub(crate) vocab: i32,
    pub(crate) dim: i32,
    pub(crate) eps: f64,
    pub(crate) layers: i32,
    pub(crate) tied: bool,
}

/// A model of config `A` (its file's `ModelArgs`): the decoder stack and its head.
#[derive(Debug)]
pub struct DecoderLm<A, F> {
    pub(crate) args: A,
    model_type: String,
    vocab_size: i32,
    pub(crate) model: Decoder<F>,
    lm_head: Option<LinearLayer>,
    /// The checkpoint name of the stack (default `model`).
    model_name: &'static str,
    /// Parameters whose name contains this keep their dtype when the model is cast
    /// (mlx-lm's `cast_predicate`).
    keep_dtype: Option<&'static str>,
}

impl<A, F: FeedForward + 'static> DecoderLm<A, F> {
    /// `d.layers` layers, layer `i` from `layer(&args, i)`, over a `vocab x dim`
    /// embedding; no `lm_head` when `d.tied`.
    pub(crate) fn new(
        d: LmDims,
        args: A,
        mut layer: impl FnMut(&A, i32) -> crate::Result<DecoderLayer<F>>,
    ) -> crate::Result<DecoderLm<A, F>> {
        let layers = (0..d.layers)
            .map(|i| layer(&args, i))
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(DecoderLm {
            args,
            model_type: d.model_type,
            vocab_size: d.vocab,
            model: Decoder::new(d.vocab, d.dim, d.eps, layers)?,
            lm_head: head::untied(d.tied, d.dim, d.vocab)?,
            model_name: "model",
            keep_dtype: None,
        })
    }

    /// The stack named as the checkpoint names it (Qwen's and OpenELM's `transformer`).
    pub(crate) fn with_model_name(mut self, name: &'static str) -> DecoderLm<A, F> {
        self.model_name = name;
        self
    }

    /// The stack with sliding-window layers (see [`Decoder::with_sliding`]).
    pub(crate) fn with_sliding(
        mut self,
        sliding: Vec<bool>,
        window: i32,
        full_idx: usize,
    ) -> DecoderLm<A, F> {
        self.model = self.model.with_sliding(sliding, window, full_idx);
        self
    }

    /// Casting the model leaves the parameters whose name contains `name` as they are
    /// (mlx-lm's `cast_predicate`, Klear's `expert_bias`).
    pub(crate) fn keeping_dtype(mut self, name: &'static str) -> DecoderLm<A, F> {
        self.keep_dtype = Some(name);
        self
    }

    /// The stack with its embedding, layer list and final norm named as the checkpoint
    /// names them (see [`Decoder::with_names`]).
    pub(crate) fn with_stack_names(
        mut self,
        embed: &'static str,
        layers: &'static str,
        norm: &'static str,
    ) -> DecoderLm<A, F> {
        self.model = self.model.with_names(embed, layers, norm);
        self
    }

    /// A biased `lm_head` of `dim -> vocab` in place of the default head (Qwen's
    /// `bias=not no_bias`).
    pub(crate) fn with_head_bias(mut self, dim: i32, bias: bool) -> crate::Result<DecoderLm<A, F>> {
        self.lm_head = Some(LinearLayer::new(dim, self.vocab_size, bias)?);
        Ok(self)
    }
}

impl<A: std::fmt::Debug + Send + 'static, F: FeedForward + 'static> LanguageModel
    for DecoderLm<A, F>
{
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let embed = &self.model.embed_tokens;
        head::logits(embed, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    /// A standard cache per layer (and per run of the layers, see `Decoder::with_loops`),
    /// rotating ones for sliding layers (`Decoder::with_sliding`).
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model.cache_specs()
    }
    fn defines_make_cache(&self) -> bool {
        self.model.defines_make_cache
    }
    fn model_type(&self) -> &str {
        &self.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }
    fn num_layers(&self) -> usize {
        self.model.layers.len()
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
    fn as_awq_mut(&mut self) -> Option<&mut dyn crate::awq::AwqModel> {
        Some(self)
    }
}

impl<A, F: FeedForward + 'static> crate::awq::AwqModel for DecoderLm<A, F> {
    fn embed_tokens_mut(&mut self) -> &mut mlx_nn::EmbeddingLayer {
        &mut self.model.embed_tokens
    }
    fn awq_blocks(&mut self) -> Vec<&mut dyn crate::awq::AwqBlock> {
        self.model
            .layers
            .iter_mut()
            .map(|l| l as &mut dyn crate::awq::AwqBlock)
            .collect()
    }
    fn lm_head_mut(&mut self) -> Option<&mut LinearLayer> {
        self.lm_head.as_mut()
    }
}

/// mlx-lm's `for layer, c in zip(self.layers, cache): h = layer(h, mask, c)` over the
/// embedded inputs `h`, with one causal mask made from the first layer's cache; each call
/// goes through [`mlx_nn::checkpoint::layer`] (checkpointed when training asks for it).
pub(crate) fn causal_layers<L: Module + 'static>(
    layers: &[L],
    h: Array,
    caches: &mut [Box<dyn KvCache>],
    forward: LayerFn<L>,
) -> Result<Array> {
    let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
    masked_layers(layers, h, &mask, caches, forward)
}

/// The loop of [`causal_layers`] under a `mask` the caller made.
pub(crate) fn masked_layers<L: Module + 'static>(
    layers: &[L],
    mut h: Array,
    mask: &AttnMask,
    caches: &mut [Box<dyn KvCache>],
    forward: LayerFn<L>,
) -> Result<Array> {
    for (layer, cache) in layers.iter().zip(layer_caches(caches, layers.len())?) {
        h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, forward)?;
    }
    Ok(h)
}

/// mlx-lm's inner model class of the files whose layers (or final norm) are their own:
/// `embed_tokens`, `layers` of `L`, and `norm` of `N`.
#[derive(Debug)]
pub struct Stack<L, N> {
    pub(crate) embed_tokens: EmbeddingLayer,
    pub(crate) layers: Vec<L>,
    pub(crate) norm: N,
}

impl<L: Module + 'static, N> Stack<L, N> {
    /// `norm(layers(embed_tokens(inputs)))`, each layer run by `layer` (see
    /// [`causal_layers`]) and the final norm by `norm`.
    pub(crate) fn forward(
        &self,
        inputs: &Array,
        caches: &mut [Box<dyn KvCache>],
        layer: LayerFn<L>,
        norm: fn(&N, &Array) -> Result<Array>,
    ) -> Result<Array> {
        self.run(self.embed_tokens.forward(inputs)?, caches, layer, norm)
    }

    /// `norm(layers(h))` of embedded inputs `h`, as [`Stack::forward`].
    pub(crate) fn run(
        &self,
        h: Array,
        caches: &mut [Box<dyn KvCache>],
        layer: LayerFn<L>,
        norm: fn(&N, &Array) -> Result<Array>,
    ) -> Result<Array> {
        let h = causal_layers(&self.layers, h, caches, layer)?;
        norm(&self.norm, &h)
    }
}

impl<L: Module, N: Module> Module for Stack<L, N> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.embed_tokens
            .visit_params(&join(prefix, "embed_tokens"), f);
        self.layers.visit_params(&join(prefix, "layers"), f);
        self.norm.visit_params(&join(prefix, "norm"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.embed_tokens
            .visit_params_mut(&join(prefix, "embed_tokens"), f);
        self.layers.visit_params_mut(&join(prefix, "layers"), f);
        self.norm.visit_params_mut(&join(prefix, "norm"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.embed_tokens
            .visit_quantizable_mut(&join(prefix, "embed_tokens"), f)?;
        self.layers
            .visit_quantizable_mut(&join(prefix, "layers"), f)?;
        self.norm.visit_quantizable_mut(&join(prefix, "norm"), f)
    }
}

/// `hidden_size / num_heads`, where `num_heads` divides `hidden_size` (mlx-lm's assert,
/// as a config error of `model`).
pub(crate) fn even_head_dim(dim: i32, n_heads: i32, model: &str) -> crate::Result<i32> {
    let head_dim = dim / n_heads.max(1);
    if n_heads < 1 || head_dim * n_heads != dim {
        return Err(crate::Error::Config {
            path: format!("config.json ({model})"),
            message: format!(
                "hidden_size must be divisible by num_heads (got `hidden_size`: {dim} and \
                 `num_heads`: {n_heads})"
            ),
        });
    }
    Ok(head_dim)
}

/// mlx-lm's `if tie_word_embeddings: weights.pop("lm_head.weight", None)`.
pub(crate) fn drop_tied_head(tied: bool, weights: &mut Weights) {
    if tied {
        weights.remove("lm_head.weight");
    }
}

impl<A, F: FeedForward> Module for DecoderLm<A, F> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.model.visit_params(&join(prefix, self.model_name), f);
        self.lm_head.visit_params(&join(prefix, "lm_head"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.model
            .visit_params_mut(&join(prefix, self.model_name), f);
        self.lm_head.visit_params_mut(&join(prefix, "lm_head"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.model
            .visit_quantizable_mut(&join(prefix, self.model_name), f)?;
        self.lm_head
            .visit_quantizable_mut(&join(prefix, "lm_head"), f)
    }
    fn cast_floating(&mut self, dtype: mlx_array::Dtype) -> mlx_nn::Result<()> {
        let keep = self.keep_dtype;
        cast_all_but(self, dtype, |name| keep.is_some_and(|k| name.contains(k)))
    }
}
