//! OLMo 3, following `mlx_lm/models/olmo3.py`: OLMo 2's layers, three sliding-window
//! layers to one full one by default; only the full layers take `rope_scaling`.
use super::olmo2::{self, head_dim, TransformerBlock};
use super::LayerMasks;
use super::{layer_caches, Architecture};
use super::{layer_type_index, window_cache_specs};
use crate::config::{parse_args, rope_scaling};
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, initialize_rope, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by OLMo 3.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub max_position_embeddings: i32,
    pub sliding_window: i32,
    pub rope_theta: f64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

impl ModelArgs {
    /// OLMo 2's arguments for the same layers (no feed-forward bias).
    fn as_olmo2(&self) -> olmo2::ModelArgs {
        olmo2::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            head_dim: self.head_dim,
            max_position_embeddings: Some(self.max_position_embeddings),
            num_key_value_heads: self.num_key_value_heads,
            attention_bias: self.attention_bias,
            mlp_bias: false,
            rope_theta: self.rope_theta,
            rope_traditional: false,
            rope_scaling: self.rope_scaling.clone(),
            tie_word_embeddings: self.tie_word_embeddings,
        }
    }

    /// `__post_init__`: every fourth layer full, the others sliding.
    fn layer_types(&self) -> Vec<String> {
        self.layer_types.clone().unwrap_or_else(|| {
            (0..self.num_hidden_layers)
                .map(|i| {
                    if (i + 1) % 4 == 0 {
                        "full_attention".to_string()
                    } else {
                        "sliding_attention".to_string()
                    }
                })
                .collect()
        })
    }
}

/// OLMo 3 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Olmo3Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

/// The decoder stack.
#[derive(Debug)]
pub struct Olmo3Model {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    /// Per layer: attends within the sliding window.
    sliding: Vec<bool>,
    swa_idx: usize,
    ga_idx: usize,
    sliding_window: i32,
}
impl_module!(Olmo3Model {
    embed_tokens,
    layers,
    norm
});

impl Olmo3Model {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let n = h.dim(1)?;
        let masks = LayerMasks::new(
            n,
            caches,
            self.ga_idx,
            Some(self.swa_idx),
            Some(self.sliding_window),
        )?;
        for ((layer, cache), &sliding) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
            .zip(&self.sliding)
        {
            let mask = masks.get(sliding);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.norm.forward(&h)
    }
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let config_err = |message: String| crate::Error::Config {
            path: "config.json (olmo3)".into(),
            message,
        };
        let types = args.layer_types();
        if types.len() != args.num_hidden_layers.max(0) as usize {
            return Err(config_err(format!(
                "key `layer_types` has {} entries for {} layers",
                types.len(),
                args.num_hidden_layers
            )));
        }
        let swa_idx = layer_type_index(&types, "sliding_attention", "olmo3")?;
        let ga_idx = layer_type_index(&types, "full_attention", "olmo3")?;
        let base = args.as_olmo2();
        let d = head_dim(&base);
        let sliding: Vec<bool> = types.iter().map(|t| t != "full_attention").collect();
        let layers = sliding
            .iter()
            .map(|&s| {
                let rope = if s {
                    Rope::new(d, false, args.rope_theta, 1.0)
                } else {
                    initialize_rope(
                        d,
                        args.rope_theta,
                        false,
                        rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
                        Some(args.max_position_embeddings),
                    )?
                };
                TransformerBlock::new(&base, rope)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Olmo3Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, args.hidden_size)?,
            layers,
            norm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
            sliding,
            swa_idx,
            ga_idx,
            sliding_window: args.sliding_window,
        };
        let lm_head = head::untied(args.tie_word_embeddings, args.hidden_size, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "olmo3")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        window_cache_specs(self.model.sliding.iter().copied(), self.args.sliding_window)
    }
    decoder_accessors!();
    fn defines_make_cache(&self) -> bool {
        true
    }
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model
            .layers
            .iter_mut()
            .try_for_each(TransformerBlock::fuse)
    }
}
