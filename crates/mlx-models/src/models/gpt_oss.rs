//! GPT-OSS, following `mlx_lm/models/gpt_oss.py`: attention with per-head sinks and
//! biased projections, sliding-window layers alternating with full ones, and top-k
//! routed SwitchGLU experts with the `SwigluOAI` activation. `sanitize` reads the
//! original checkpoints (interleaved `gate_up_proj`, MXFP4 `_blocks` / `_scales`).
use super::attention::{Attention, AttentionDims, Extras};
use super::top_k_indices;
use super::LayerMasks;
use super::{layer_caches, Architecture, Weights};
use super::{layer_type_index, window_cache_specs};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, GluActivation, KvCache, LinearLayer,
    Param, RmsNorm, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GPT-OSS (mlx-lm's defaults are those of gpt-oss-20b).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    #[serde(default = "default_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "default_experts")]
    pub num_local_experts: i32,
    #[serde(default = "default_experts_per_tok")]
    pub num_experts_per_tok: i32,
    #[serde(default = "default_vocab")]
    pub vocab_size: i32,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_hidden")]
    pub hidden_size: i32,
    #[serde(default = "default_hidden")]
    pub intermediate_size: i32,
    #[serde(default = "default_head_dim")]
    pub head_dim: i32,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "default_window")]
    pub sliding_window: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

fn default_model_type() -> String {
    "gpt_oss".into()
}
fn default_layers() -> i32 {
    36
}
fn default_experts() -> i32 {
    128
}
fn default_experts_per_tok() -> i32 {
    4
}
fn default_vocab() -> i32 {
    201088
}
fn default_eps() -> f64 {
    1e-5
}
fn default_hidden() -> i32 {
    2880
}
fn default_head_dim() -> i32 {
    64
}
fn default_heads() -> i32 {
    64
}
fn default_kv_heads() -> i32 {
    8
}
fn default_window() -> i32 {
    128
}
fn default_rope_theta() -> f64 {
    150000.0
}

/// Self-attention (biased projections) with one learned sink logit per head.
#[derive(Debug)]
pub struct AttentionBlock {
    attn: Attention,
    sinks: Param,
}

impl_module!(AttentionBlock {
    sinks,
    attn as ""
});

impl AttentionBlock {
    fn new(args: &ModelArgs) -> crate::Result<AttentionBlock> {
        let d = args.head_dim;
        let dims = AttentionDims {
            dim: args.hidden_size,
            n_heads: args.num_attention_heads,
            n_kv_heads: args.num_key_value_heads,
            head_dim: d,
            qkv_bias: true,
            o_bias: true,
        };
        let rope = initialize_rope(
            d,
            args.rope_theta,
            false,
            rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
            None,
        )?;
        Ok(AttentionBlock {
            attn: Attention::new(dims, rope, 1.0 / (d as f64).sqrt())?,
            sinks: Param::new(ops::zeros(&[args.num_attention_heads], Dtype::Float32)?),
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        residual: &Array,
    ) -> Result<Array> {
        let extras = Extras {
            sinks: Some(self.sinks.value()),
            ..Default::default()
        };
        self.attn.forward(x, mask, cache, Some(residual), extras)
    }
}

/// The routed experts: top-k of the router's logits, softmax over the k.
#[derive(Debug)]
pub struct MlpBlock {
    experts: SwitchGlu,
    router: LinearLayer,
    top_k: i32,
}
impl_module!(MlpBlock { experts, router });

impl MlpBlock {
    fn forward(&self, x: &Array) -> Result<Array> {
        let g = self.router.forward(x)?;
        let k = self.top_k;
        // mlx-lm's `mlx_topk`: the last k of an argpartition, then their values.
        let indices = top_k_indices(&g, k)?;
        let weights = g
            .take_along_axis(&indices, -1)?
            .softmax(Some(&[-1]), true)?;
        let y = self.experts.forward(x, &indices)?;
        y.multiply(&weights.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)
    }
}

/// One decoder layer (pre-norm).
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: AttentionBlock,
    mlp: MlpBlock,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    sliding: bool,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache, x)?;
        h.add(
            &self
                .mlp
                .forward(&self.post_attention_layernorm.forward(&h)?)?,
        )
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct GptOssMoeModel {
    embed_tokens: EmbeddingLayer,
    norm: RmsNorm,
    layers: Vec<TransformerBlock>,
    window_size: i32,
    swa_idx: usize,
    ga_idx: usize,
}
impl_module!(GptOssMoeModel {
    embed_tokens,
    norm,
    layers
});

impl GptOssMoeModel {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut x = self.embed_tokens.forward(inputs)?;
        let n = x.dim(1)?;
        let masks = LayerMasks::new(
            n,
            caches,
            self.ga_idx,
            Some(self.swa_idx),
            Some(self.window_size),
        )?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            let mask = masks.get(layer.sliding);
            x = mlx_nn::checkpoint::layer(layer, &x, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.norm.forward(&x)
    }
}

/// GPT-OSS with its (untied) output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: GptOssMoeModel,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let config_err = |message: String| crate::Error::Config {
            path: "config.json (gpt_oss)".into(),
            message,
        };
        let layer_types = match &args.layer_types {
            Some(t) => t.clone(),
            None => ["sliding_attention", "full_attention"]
                .repeat((args.num_hidden_layers / 2).max(0) as usize)
                .into_iter()
                .map(String::from)
                .collect(),
        };
        if layer_types.len() != args.num_hidden_layers.max(0) as usize {
            return Err(config_err(format!(
                "key `layer_types` has {} entries for {} layers",
                layer_types.len(),
                args.num_hidden_layers
            )));
        }
        let swa_idx = layer_type_index(&layer_types, "sliding_attention", "gpt_oss")?;
        let ga_idx = layer_type_index(&layer_types, "full_attention", "gpt_oss")?;
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = layer_types
            .iter()
            .map(|t| {
                Ok(TransformerBlock {
                    self_attn: AttentionBlock::new(&args)?,
                    mlp: MlpBlock {
                        experts: SwitchGlu::new(
                            dim,
                            args.intermediate_size,
                            args.num_local_experts,
                            true,
                        )?
                        .with_activation(GluActivation::SwigluOai),
                        router: LinearLayer::new(dim, args.num_local_experts, true)?,
                        top_k: args.num_experts_per_tok,
                    },
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    sliding: t != "full_attention",
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = GptOssMoeModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            norm: RmsNorm::new(dim, eps)?,
            layers,
            window_size: args.sliding_window,
            swa_idx,
            ga_idx,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, false)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "gpt_oss")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.lm_head.forward(&self.model.forward(tokens, caches)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| l.sliding);
        window_cache_specs(sliding, self.args.sliding_window)
    }
    decoder_accessors!();
    fn defines_make_cache(&self) -> bool {
        true
    }
}

/// `x[..., start::2, :]` (`axis` -2) or `x[..., start::2]` (`axis` -1), contiguous.
fn every_other(x: &Array, axis: i32, start: i32) -> Result<Array> {
    let shape = x.shape();
    let nd = shape.len();
    let ax = (nd as i32 + axis) as usize;
    let mut begin = vec![0; nd];
    let mut strides = vec![1; nd];
    begin[ax] = start;
    strides[ax] = 2;
    x.slice(&begin, &shape, Some(&strides))?.contiguous()
}

/// MXFP4 `_blocks` (`uint8 [..., groups, 16]`) as MLX's packed `uint32 [..., groups * 4]`.
fn unpack_blocks(key: &str, v: Array) -> Result<(String, Array)> {
    if key.contains("_blocks") {
        let v = v.view(Dtype::Uint32)?.flatten(-2, -1)?;
        return Ok((key.replace("_blocks", ".weight"), v));
    }
    if key.contains("_scales") {
        return Ok((key.replace("_scales", ".scales"), v));
    }
    Ok((key.to_string(), v))
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        if weights.keys().any(|k| k.contains("gate_proj.weight")) {
            return Ok(weights);
        }
        let mut out = Weights::new();
        for (k, v) in weights {
            if k.contains("gate_up_proj") && !k.contains("bias") {
                let (k, v) = unpack_blocks(&k, v)?;
                out.insert(
                    k.replace("gate_up_proj", "gate_proj"),
                    every_other(&v, -2, 0)?,
                );
                out.insert(
                    k.replace("gate_up_proj", "up_proj"),
                    every_other(&v, -2, 1)?,
                );
            } else if k.contains("down_proj") && !k.contains("bias") {
                let (k, v) = unpack_blocks(&k, v)?;
                out.insert(k, v);
            } else if k.contains("gate_up_proj_bias") {
                out.insert(
                    k.replace("gate_up_proj_bias", "gate_proj.bias"),
                    every_other(&v, -1, 0)?,
                );
                out.insert(
                    k.replace("gate_up_proj_bias", "up_proj.bias"),
                    every_other(&v, -1, 1)?,
                );
            } else if k.contains("down_proj_bias") {
                out.insert(k.replace("down_proj_bias", "down_proj.bias"), v);
            } else {
                out.insert(k, v);
            }
        }
        Ok(out)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.attn.fuse()?;
        }
        Ok(())
    }
}
