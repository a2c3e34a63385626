//! Llama (and Mistral), following `mlx_lm/models/llama.py`.
use super::attention::{Attention, AttentionDims, Extras};
use super::head::{self, LogitScale};
use super::lm::LmDims;
use super::mlp::Mlp;
use super::LayerMasks;
use super::{cache_at, drop_rotary_inv_freq, layer_caches};
use super::{layer_type_index, window_cache_specs};
use super::{Architecture, Weights};
use crate::config::{default_true, parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Llama.
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
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub sliding_window: Option<i32>,
}

fn default_rope_theta() -> f64 {
    10000.0
}

/// Self-attention; `scale` (default `head_dim ** -0.5`) multiplies the logits, `o_bias`
/// (default `attention_bias`) puts a bias on `o_proj`.
pub(crate) fn attention(
    args: &ModelArgs,
    scale: Option<f64>,
    o_bias: Option<bool>,
) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = args
        .head_dim
        .filter(|&d| d > 0)
        .unwrap_or(args.hidden_size / n_heads);
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: o_bias.unwrap_or(args.attention_bias),
    };
    let rope = initialize_rope(
        head_dim,
        args.rope_theta,
        args.rope_traditional,
        rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
        args.max_position_embeddings,
    )?;
    Attention::new(d, rope, scale.unwrap_or((head_dim as f64).powf(-0.5)))
}

/// One decoder layer (attending through a sliding window where `use_sliding`).
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    use_sliding: bool,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    /// A layer of `layer_type` (`"sliding_attention"` or another, global, one).
    pub(crate) fn new(
        self_attn: Attention,
        mlp: Mlp,
        dim: i32,
        eps: f64,
        layer_type: &str,
    ) -> crate::Result<TransformerBlock> {
        Ok(TransformerBlock {
            self_attn,
            mlp,
            input_layernorm: RmsNorm::new(dim, eps)?,
            post_attention_layernorm: RmsNorm::new(dim, eps)?,
            use_sliding: layer_type == "sliding_attention",
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        extras: Extras<'_>,
    ) -> Result<Array> {
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            Some(x),
            extras,
        )?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

impl crate::awq::AwqBlock for TransformerBlock {
    fn forward_block(&self, x: &Array, mask: &AttnMask) -> Result<Array> {
        self.forward(x, mask, None, Extras::default())
    }
    fn attention(&self, x: &Array, mask: &AttnMask) -> Result<Array> {
        self.self_attn
            .forward(x, mask, None, None, Extras::default())
    }
    fn feed_forward(&self, x: &Array) -> Result<Array> {
        self.mlp.forward(x, None)
    }
    fn parts(&mut self) -> Option<crate::awq::AwqParts<'_>> {
        let [q, k, v, o] = self.self_attn.projections_mut()?;
        let [gate, up, down] = self.mlp.projections_mut()?;
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

impl LlamaModel {
    /// The blocks as AWQ runs them.
    pub(crate) fn awq_blocks(&mut self) -> Vec<&mut dyn crate::awq::AwqBlock> {
        self.layers
            .iter_mut()
            .map(|l| l as &mut dyn crate::awq::AwqBlock)
            .collect()
    }
}

/// What a model multiplies the queries by (ministral3's position-dependent scale), made
/// from the embedded inputs and the first layer's cache.
pub(crate) type QueryScale<'a> = &'a dyn Fn(&Array, Option<&dyn KvCache>) -> Result<Array>;

/// The decoder stack: global layers, and sliding-window ones with their own mask.
#[derive(Debug)]
pub struct LlamaModel {
    pub(crate) embed_tokens: EmbeddingLayer,
    pub(crate) layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    fa_idx: usize,
    swa_idx: Option<usize>,
    sliding_window: Option<i32>,
}
impl_module!(LlamaModel {
    embed_tokens,
    layers,
    norm
});

impl LlamaModel {
    /// The stack over `layers`, one per entry of `layer_types` (each built by
    /// `layer(type)`; all global when `None`); `model` names the config in errors.
    pub(crate) fn new(
        d: &LmDims,
        layer_types: Option<&[String]>,
        sliding_window: Option<i32>,
        model: &str,
        layer: impl Fn(&str) -> crate::Result<TransformerBlock>,
    ) -> crate::Result<LlamaModel> {
        let types = layer_types
            .map(<[String]>::to_vec)
            .unwrap_or_else(|| vec!["full_attention".into(); d.layers as usize]);
        let layers = types
            .iter()
            .map(|t| layer(t))
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(LlamaModel {
            embed_tokens: EmbeddingLayer::new(d.vocab, d.dim)?,
            fa_idx: layer_type_index(&types, "full_attention", model)?,
            swa_idx: layers.iter().position(|l| l.use_sliding),
            layers,
            norm: RmsNorm::new(d.dim, d.eps)?,
            sliding_window,
        })
    }

    /// Whether any layer slides.
    pub(crate) fn has_sliding(&self) -> bool {
        self.swa_idx.is_some()
    }

    /// mlx-lm's `make_cache`: a rotating cache of the window for each sliding layer.
    pub(crate) fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.layers.iter().map(|l| l.use_sliding);
        window_cache_specs(sliding, self.sliding_window.unwrap_or(0))
    }

    /// The normed hidden states of `inputs` (with the queries scaled by
    /// `query_scale`, when given, in every layer).
    pub(crate) fn forward(
        &self,
        inputs: &Array,
        caches: &mut [Box<dyn KvCache>],
        query_scale: Option<QueryScale<'_>>,
    ) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let n = h.dim(1)?;
        let masks = LayerMasks::new(n, caches, self.fa_idx, self.swa_idx, self.sliding_window)?;
        let scale = match query_scale {
            Some(f) => Some(f(&h, cache_at(caches, 0))?),
            None => None,
        };
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            let mask = masks.get(layer.use_sliding);
            h = match &scale {
                // mlx-lm's `layer(h, attn_scale, mask, cache)`: the scale is an input of
                // the checkpointed call too.
                Some(s) => {
                    let mask = mask.clone();
                    let out = mlx_nn::checkpoint::call(layer, &[&h, s], cache, move |l, a, c| {
                        let extras = Extras {
                            query_scale: Some(&a[1]),
                            ..Default::default()
                        };
                        Ok(vec![l.forward(&a[0], &mask, c, extras)?])
                    })?;
                    mlx_nn::checkpoint::first(out)?
                }
                None => mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| {
                    l.forward(x, m, c, Extras::default())
                })?,
            };
        }
        self.norm.forward(&h)
    }

    /// Fuses every layer's q/k/v and gate/up projections.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        for layer in &mut self.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

/// Llama with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: LlamaModel,
    lm_head: Option<LinearLayer>,
    makes_cache: bool,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        Model::with_out_bias(args, None)
    }

    /// [`Model::new`] with `o_proj`'s bias set apart from `attention_bias` (Seed-OSS).
    fn with_out_bias(args: ModelArgs, o_bias: Option<bool>) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let types = args.layer_types.as_deref();
        let model = LlamaModel::new(&lm_dims!(args), types, args.sliding_window, "llama", |t| {
            let mlp = Mlp::new(dim, args.intermediate_size, args.mlp_bias)?;
            TransformerBlock::new(attention(&args, None, o_bias)?, mlp, dim, eps, t)
        })?;
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
            makes_cache: true,
        })
    }
}

impl Model {
    /// SmolLM3: no rotary embedding in the layers whose flag is `false`, and no
    /// `make_cache` of its own (mlx-lm's smollm3 class does not define one).
    pub(crate) fn into_smollm3(mut self, uses_rope: &[bool]) -> Model {
        for (layer, &uses) in self.model.layers.iter_mut().zip(uses_rope) {
            if !uses {
                layer.self_attn.set_rope(Rope::Identity);
            }
        }
        self.makes_cache = false;
        self
    }

    /// Seed-OSS: `o_proj` biased by `attention_out_bias`, no `make_cache` of its own.
    pub(crate) fn seed_oss(args: ModelArgs, out_bias: bool) -> crate::Result<Model> {
        let mut model = Model::with_out_bias(args, Some(out_bias))?;
        model.makes_cache = false;
        Ok(model)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "llama")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches, None)?;
        head::logits(
            &self.model.embed_tokens,
            self.lm_head.as_ref(),
            &out,
            LogitScale::None,
        )
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model.cache_specs()
    }
    decoder_accessors!();
    fn defines_make_cache(&self) -> bool {
        self.makes_cache
    }
    fn as_awq_mut(&mut self) -> Option<&mut dyn crate::awq::AwqModel> {
        Some(self)
    }
}

impl crate::awq::AwqModel for Model {
    fn embed_tokens_mut(&mut self) -> &mut mlx_nn::EmbeddingLayer {
        &mut self.model.embed_tokens
    }
    fn awq_blocks(&mut self) -> Vec<&mut dyn crate::awq::AwqBlock> {
        self.model.awq_blocks()
    }
    fn lm_head_mut(&mut self) -> Option<&mut LinearLayer> {
        self.lm_head.as_mut()
    }
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = drop_rotary_inv_freq(weights);
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
