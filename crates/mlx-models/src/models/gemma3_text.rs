//! Gemma 3 text model, following `mlx_lm/models/gemma3_text.py` (interleaved sliding
//! and global attention, q/k norms, bf16-rounded embedding scale, clipped residuals).
use super::gemma2::{Mlp, RmsNorm};
use super::window_cache_specs;
use super::attention::{Attention, AttentionDims, Extras, HeadNorm, NormAt};
use super::{cache_at, layer_caches, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::activations::call_compiled;
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Gemma 3 (text).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
#[serde(default)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub rope_theta: f64,
    pub rope_local_base_freq: f64,
    pub query_pre_attn_scalar: f64,
    pub sliding_window: i32,
    pub sliding_window_pattern: i32,
    pub max_position_embeddings: i32,
    pub rope_scaling: Option<Value>,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: String::new(),
            hidden_size: 1152,
            num_hidden_layers: 26,
            intermediate_size: 6912,
            num_attention_heads: 4,
            head_dim: 256,
            rms_norm_eps: 1.0e-6,
            vocab_size: 262144,
            num_key_value_heads: 1,
            rope_theta: 1_000_000.0,
            rope_local_base_freq: 10_000.0,
            query_pre_attn_scalar: 256.0,
            sliding_window: 512,
            sliding_window_pattern: 6,
            max_position_embeddings: 32768,
            rope_scaling: None,
        }
    }
}

/// Self-attention with q/k norms; sliding layers use the local RoPE base.
fn attention(args: &ModelArgs, is_sliding: bool) -> crate::Result<Attention> {
    let head_dim = args.head_dim;
    let rope = if is_sliding {
        initialize_rope(head_dim, args.rope_local_base_freq, false, None, None)?
    } else {
        initialize_rope(
            head_dim,
            args.rope_theta,
            false,
            rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
            Some(args.max_position_embeddings),
        )?
    };
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let eps = args.rms_norm_eps;
    Attention::new(d, rope, args.query_pre_attn_scalar.powf(-0.5))?
        .with_qk_norms(NormAt::SplitHeads, |n| Ok(HeadNorm::Gemma(RmsNorm::new(n, eps)?)))
}

/// mlx-lm's compiled `clip_residual`: `x + y`, computed in float32 and clipped to the
/// float16 range when the activations are float16.
fn clip_residual(x: &Array, y: &Array) -> Result<Array> {
    call_compiled(
        "gemma3_clip_residual",
        |a| {
            if a[0].dtype() != Dtype::Float16 {
                return Ok(vec![a[0].add(&a[1])?]);
            }
            let bound = 65504.0; // mx.finfo(mx.float16).max
            let s = a[0]
                .astype(Dtype::Float32)?
                .add(&a[1].astype(Dtype::Float32)?)?;
            let lo = Array::scalar_f64(-bound, Dtype::Float32)?;
            let hi = Array::scalar_f64(bound, Dtype::Float32)?;
            Ok(vec![s
                .clip(Some(&lo), Some(&hi))?
                .astype(Dtype::Float16)?])
        },
        &[x, y],
    )
}

/// One decoder layer.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm,
    pre_feedforward_layernorm,
    post_feedforward_layernorm,
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache, None, Extras::default())?;
        let h = clip_residual(x, &self.post_attention_layernorm.forward(&r)?)?;
        let r = self
            .mlp
            .forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        clip_residual(&h, &self.post_feedforward_layernorm.forward(&r)?)
    }
}

impl crate::awq::AwqBlock for TransformerBlock {
    fn forward_block(&self, x: &Array, mask: &AttnMask) -> Result<Array> {
        self.forward(x, mask, None)
    }
    fn attention(&self, x: &Array, mask: &AttnMask) -> Result<Array> {
        self.self_attn
            .forward(x, mask, None, None, Extras::default())
    }
    fn feed_forward(&self, x: &Array) -> Result<Array> {
        self.mlp.forward(x)
    }
    /// mlx-lm's Gemma 3 configuration scales gate/up through `pre_feedforward_layernorm`.
    fn parts(&mut self) -> Option<crate::awq::AwqParts<'_>> {
        let [q, k, v, o] = self.self_attn.projections_mut()?;
        let [gate, up, down] = self.mlp.projections_mut();
        Some(crate::awq::AwqParts {
            input_norm: self.input_layernorm.weight_mut(),
            ff_norm: self.pre_feedforward_layernorm.weight_mut(),
            norm_offset: true,
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

/// The decoder stack.
#[derive(Debug)]
pub struct Gemma3Model {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    hidden_size: i32,
    window_size: i32,
    sliding_window_pattern: i32,
}
impl_module!(Gemma3Model {
    embed_tokens,
    layers,
    norm
});

impl Gemma3Model {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let h = self.embed_tokens.forward(inputs)?;
        let scale = Array::scalar_f64((self.hidden_size as f64).powf(0.5), Dtype::Bfloat16)?
            .astype(h.dtype())?;
        let mut h = h.multiply(&scale)?;
        let n = h.dim(1)?;
        let pattern = self.sliding_window_pattern;
        let global_mask = create_attention_mask(
            n,
            cache_at(caches, (pattern - 1).max(0) as usize),
            None,
            false,
        )?;
        let sliding_mask = if pattern > 1 {
            create_attention_mask(n, cache_at(caches, 0), Some(self.window_size), false)?
        } else {
            AttnMask::None
        };
        for (i, (layer, cache)) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
            .enumerate()
        {
            let is_global = i as i32 % pattern == pattern - 1;
            let mask = if is_global {
                &global_mask
            } else {
                &sliding_mask
            };
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.norm.forward(&h)
    }
}

/// Gemma 3 text with its head (tied when the checkpoint has no `lm_head`).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Gemma3Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let is_sliding = (i + 1) % args.sliding_window_pattern != 0;
                Ok(TransformerBlock {
                    self_attn: attention(&args, is_sliding)?,
                    mlp: Mlp::new(dim, args.intermediate_size)?,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    pre_feedforward_layernorm: RmsNorm::new(dim, eps)?,
                    post_feedforward_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Gemma3Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
            hidden_size: dim,
            window_size: args.sliding_window,
            sliding_window_pattern: args.sliding_window_pattern,
        };
        let lm_head = Some(LinearLayer::new(dim, args.vocab_size, false)?);
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }

    /// Reads the arguments (all keys have mlx-lm's defaults).
    pub fn from_config(config: &Value) -> crate::Result<Model> {
        let args: ModelArgs = parse_args(config, "gemma3_text")?;
        if args.sliding_window_pattern <= 0 {
            return Err(crate::Error::Config {
                path: "config.json (gemma3_text)".into(),
                message: "key `sliding_window_pattern` must be positive".into(),
            });
        }
        Model::new(args)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::from_config(config)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let p = self.args.sliding_window_pattern;
        let sliding = (0..self.args.num_hidden_layers).map(|i| i % p != p - 1);
        window_cache_specs(sliding, self.args.sliding_window)
    }
    decoder_accessors!();
    fn defines_make_cache(&self) -> bool {
        true
    }
    fn as_awq_mut(&mut self) -> Option<&mut dyn crate::awq::AwqModel> {
        Some(self)
    }
}

/// mlx-lm's AWQ embeds the calibration rows with `embed_tokens` alone (no scaling by
/// `sqrt(hidden_size)`) and runs each block under one causal mask.
impl crate::awq::AwqModel for Model {
    fn embed_tokens_mut(&mut self) -> &mut EmbeddingLayer {
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

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        if !weights.contains_key("lm_head.weight") {
            self.lm_head = None;
        }
        Ok(weights)
    }    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
        }
        Ok(())
    }
}
