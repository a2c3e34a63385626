//! mlx-lm's `Model` class of the files built on the shared [`Decoder`]: `model` (the
//! stack), then `lm_head`, or `model.embed_tokens.as_linear` when the two are tied, and a
//! plain `KVCache` for every layer. Each model file keeps its config, its attention and
//! its `sanitize`; this is the wrapper they would all write the same way.
use super::decoder::{Decoder, DecoderLayer, FeedForward};
use super::head::{self, LogitScale};
use super::Weights;
use crate::model::CacheSpec;
use mlx_array::{Array, Result};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{KvCache, LinearLayer, Module, Param};

/// [`LmDims`] from the config.json keys most files name alike: `vocab_size`,
/// `hidden_size`, `rms_norm_eps`, `num_hidden_layers`, `tie_word_embeddings`.
macro_rules! lm_dims {
    ($args:expr) => {
        $crate::models::lm::LmDims {
            vocab: $args.vocab_size,
            dim: $args.hidden_size,
            eps: $args.rms_norm_eps,
            layers: $args.num_hidden_layers,
            tied: $args.tie_word_embeddings,
        }
    };
}

/// The sizes the stack and the head are built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LmDims {
    pub(crate) vocab: i32,
    pub(crate) dim: i32,
    pub(crate) eps: f64,
    pub(crate) layers: i32,
    pub(crate) tied: bool,
}

/// The decoder stack and its head.
#[derive(Debug)]
pub struct DecoderLm<F> {
    pub(crate) model: Decoder<F>,
    lm_head: Option<LinearLayer>,
}

impl<F: FeedForward + 'static> DecoderLm<F> {
    /// `d.layers` layers, layer `i` from `layer(i)`, over a `vocab x dim` embedding; no
    /// `lm_head` when `d.tied`.
    pub(crate) fn new(
        d: LmDims,
        layer: impl FnMut(i32) -> crate::Result<DecoderLayer<F>>,
    ) -> crate::Result<DecoderLm<F>> {
        let layers = (0..d.layers)
            .map(layer)
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(DecoderLm {
            model: Decoder::new(d.vocab, d.dim, d.eps, layers)?,
            lm_head: head::untied(d.tied, d.dim, d.vocab)?,
        })
    }

    /// The logits of `tokens`.
    pub(crate) fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let embed = &self.model.embed_tokens;
        head::logits(embed, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// A standard cache per layer.
    pub(crate) fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
}

/// mlx-lm's `if tie_word_embeddings: weights.pop("lm_head.weight", None)`.
pub(crate) fn drop_tied_head(tied: bool, weights: &mut Weights) {
    if tied {
        weights.remove("lm_head.weight");
    }
}

impl<F: FeedForward> Module for DecoderLm<F> {
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
}
