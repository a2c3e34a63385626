//! Falcon-H1 (`falcon_h1`), following `mlx_lm/models/falcon_h1.py`: every layer runs a
//! Mamba-2 mixer (`Mamba2Block`) and attention side by side on the same normalized
//! input and adds both to the residual, then a SwiGLU MLP. Each layer's cache is a
//! `CacheList(ArraysCache(2), KVCache())`. `sanitize` folds the checkpoint's µP
//! multipliers into the weights (HF checkpoints only, told apart by their convolution
//! layout); tied heads scale the logits by `lm_head_multiplier / embedding_multiplier`.
use super::config_error;
use super::attention::{Attention, AttentionDims, Extras};
use super::mamba2::{GateNorm, Mamba2Block, MixerDims};
use super::mlp::Mlp;
use super::recurrent::recurrent_state;
use super::{layer_caches, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Falcon-H1, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub attention_bias: bool,
    pub attention_in_multiplier: f64,
    pub attention_out_multiplier: f64,
    pub embedding_multiplier: f64,
    pub head_dim: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub key_multiplier: f64,
    pub lm_head_multiplier: f64,
    pub mamba_conv_bias: bool,
    pub mamba_d_conv: i32,
    pub mamba_d_head: i32,
    pub mamba_d_ssm: i32,
    pub mamba_d_state: i32,
    pub mamba_n_groups: i32,
    pub mamba_n_heads: i32,
    pub mamba_norm_before_gate: bool,
    pub mamba_proj_bias: bool,
    pub mamba_rms_norm: bool,
    pub max_position_embeddings: i32,
    pub mlp_bias: bool,
    pub mlp_multipliers: Vec<f64>,
    pub num_attention_heads: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub projectors_bias: bool,
    pub rms_norm_eps: f64,
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    pub rope_theta: f64,
    pub ssm_in_multiplier: f64,
    pub ssm_multipliers: Vec<f64>,
    pub ssm_out_multiplier: f64,
    pub vocab_size: i32,
    pub tie_word_embeddings: bool,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "falcon_h1".into(),
            attention_bias: false,
            attention_in_multiplier: 1.0,
            attention_out_multiplier: 0.9375,
            embedding_multiplier: 5.656854249492381,
            head_dim: 64,
            hidden_size: 1024,
            intermediate_size: 2048,
            key_multiplier: 0.390625,
            lm_head_multiplier: 0.0390625,
            mamba_conv_bias: true,
            mamba_d_conv: 4,
            mamba_d_head: 64,
            mamba_d_ssm: 1536,
            mamba_d_state: 128,
            mamba_n_groups: 1,
            mamba_n_heads: 24,
            mamba_norm_before_gate: false,
            mamba_proj_bias: false,
            mamba_rms_norm: false,
            max_position_embeddings: 131072,
            mlp_bias: false,
            mlp_multipliers: vec![0.8838834764831844, 0.5859375],
            num_attention_heads: 8,
            num_hidden_layers: 36,
            num_key_value_heads: 2,
            projectors_bias: false,
            rms_norm_eps: 1e-5,
            rope_traditional: false,
            rope_scaling: None,
            rope_theta: 100000000000.0,
            ssm_in_multiplier: 1.25,
            ssm_multipliers: vec![
                0.3535533905932738,
                0.25,
                0.3535533905932738,
                0.5,
                0.3535533905932738,
            ],
            ssm_out_multiplier: 0.23570226039551587,
            vocab_size: 32784,
            tie_word_embeddings: true,
        }
    }
}

/// One layer: mixer and attention in parallel, then the MLP.
#[derive(Debug)]
struct Layer {
    feed_forward: Mlp,
    mamba: Mamba2Block,
    self_attn: Attention,
    input_layernorm: RmsNorm,
    pre_ff_layernorm: RmsNorm,
}
impl_module!(Layer {
    feed_forward,
    mamba,
    self_attn,
    input_layernorm,
    pre_ff_layernorm
});

/// The decoder stack.
#[derive(Debug)]
struct Stack {
    embed_tokens: EmbeddingLayer,
    layers: Vec<Layer>,
    final_layernorm: RmsNorm,
}
impl_module!(Stack {
    embed_tokens,
    layers,
    final_layernorm
});

/// Falcon-H1 with its (tied or own) head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Stack,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from parsed arguments.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let a = &args;
        if a.mamba_n_heads * a.mamba_d_head != a.mamba_d_ssm {
            return Err(config_error("falcon_h1", format!(
                "mamba_n_heads * mamba_d_head ({} * {}) must equal mamba_d_ssm ({})",
                a.mamba_n_heads, a.mamba_d_head, a.mamba_d_ssm
            )));
        }
        if a.ssm_multipliers.len() != 5 || a.mlp_multipliers.len() != 2 {
            return Err(config_error("falcon_h1", 
                "ssm_multipliers needs 5 values and mlp_multipliers 2".into(),
            ));
        }
        let dims = MixerDims {
            hidden_size: a.hidden_size,
            num_heads: a.mamba_n_heads,
            head_dim: a.mamba_d_head,
            n_groups: a.mamba_n_groups,
            state_size: a.mamba_d_state,
            conv_kernel: a.mamba_d_conv,
            conv_bias: a.mamba_conv_bias,
            proj_bias: a.mamba_proj_bias,
            norm_eps: a.rms_norm_eps,
            time_step_limit: (0.0, f64::INFINITY),
            cast_d: false,
            norm_group_size: None,
            scan_lengths: true,
            out_bias: a.projectors_bias,
            gate_norm: match (a.mamba_rms_norm, a.mamba_norm_before_gate) {
                (false, _) => GateNorm::GateOnly,
                (true, false) => GateNorm::GateThenNorm,
                (true, true) => GateNorm::NormThenGate,
            },
        };
        let attn = AttentionDims {
            dim: a.hidden_size,
            n_heads: a.num_attention_heads,
            n_kv_heads: a.num_key_value_heads,
            head_dim: a.head_dim,
            qkv_bias: a.attention_bias,
            o_bias: a.attention_bias,
        };
        let scaling = rope_scaling(a.rope_scaling.as_ref())?;
        let layers = (0..a.num_hidden_layers)
            .map(|_| {
                let rope = initialize_rope(
                    a.head_dim,
                    a.rope_theta,
                    a.rope_traditional,
                    scaling.as_ref(),
                    Some(a.max_position_embeddings),
                )?;
                let scale = (a.head_dim as f64).powf(-0.5);
                Ok(Layer {
                    feed_forward: Mlp::new(a.hidden_size, a.intermediate_size, a.mlp_bias)?
                        .up_before_down(),
                    mamba: Mamba2Block::new(&dims, "falcon_h1")?,
                    self_attn: Attention::new(attn, rope, scale)?,
                    input_layernorm: RmsNorm::new(a.hidden_size, a.rms_norm_eps)?,
                    pre_ff_layernorm: RmsNorm::new(a.hidden_size, a.rms_norm_eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Stack {
            embed_tokens: EmbeddingLayer::new(a.vocab_size, a.hidden_size)?,
            layers,
            final_layernorm: RmsNorm::new(a.hidden_size, a.rms_norm_eps)?,
        };
        let lm_head = (!a.tie_word_embeddings)
            .then(|| LinearLayer::new(a.hidden_size, a.vocab_size, false))
            .transpose()?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }

    /// mlx-lm's `compute_mup_vector`: each `in_proj` output row's `ssm_multipliers`
    /// entry (gate, x, B, C, dt), float32.
    fn mup_vector(&self) -> Result<Array> {
        let a = &self.args;
        let gs = a.mamba_n_groups * a.mamba_d_state;
        let sizes = [a.mamba_d_ssm, a.mamba_d_ssm, gs, gs, a.mamba_n_heads];
        let parts = sizes
            .iter()
            .zip(&a.ssm_multipliers)
            .map(|(&s, &m)| Array::scalar(m as f32)?.broadcast_to(&[s]))
            .collect::<Result<Vec<_>>>()?;
        ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "falcon_h1")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let first = caches.first().and_then(|c| c.sub_caches());
        let ssm_mask = match first.and_then(|s| s.first()).and_then(|c| c.arrays()) {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        let kv = first.and_then(|s| s.get(1)).map(|c| c.as_ref());
        let attn_mask = create_attention_mask(n, kv, None, false)?;
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let ssm_mask = ssm_mask.clone();
            let forward = move |layer: &Layer,
                                h: &Array,
                                attn_mask: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                type Slot<'c> = Option<&'c mut dyn KvCache>;
                let (state, kv): (Slot<'_>, Slot<'_>) = match cache {
                    None => (None, None),
                    Some(c) => match c.sub_caches_mut() {
                        Some([state, kv]) => (Some(&mut **state), Some(&mut **kv)),
                        _ => {
                            return Err(mlx_array::Error::InvalidArgument(format!(
                                "falcon_h1 layer {i} needs a CacheList(ArraysCache, KVCache)"
                            )))
                        }
                    },
                };
                let x = layer.input_layernorm.forward(h)?;
                let state = recurrent_state(state, i, "mamba")?;
                let mamba_h = layer.mamba.forward(&x, ssm_mask.as_ref(), state)?;
                let attn_h = layer
                    .self_attn
                    .forward(&x, attn_mask, kv, None, Extras::default())?;
                let h = h.add(&mamba_h)?.add(&attn_h)?;
                layer
                    .feed_forward
                    .forward(&layer.pre_ff_layernorm.forward(&h)?, Some(&h))
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &attn_mask, cache, forward)?;
        }
        let out = m.final_layernorm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&out),
            None => {
                let a = &self.args;
                m.embed_tokens
                    .as_linear(&out)?
                    .multiply(a.lm_head_multiplier / a.embedding_multiplier)
            }
        }
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        // mlx-lm: `CacheList(ArraysCache(size=2), KVCache())` per layer.
        let spec = CacheSpec::List(&[CacheSpec::Arrays { size: 2 }, CacheSpec::Standard]);
        vec![spec; self.model.layers.len()]
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    /// Each mixer's `nn.Conv1d` draws one key for its weight.
    fn extra_init_key_draws(&self) -> usize {
        self.model.layers.len()
    }

    /// mlx-lm's `sanitize`: a checkpoint whose convolution weights are already
    /// `[channels, kernel, 1]` is used as is; otherwise each weight takes its µP
    /// multiplier and the convolutions move to MLX's layout.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let key = "model.layers.0.mamba.conv1d.weight";
        let c1d = weights.get(key).ok_or_else(|| crate::Error::Weights {
            path: "model weights".into(),
            message: format!("`{key}` is missing"),
        })?;
        if c1d.dim(-1)? <= c1d.dim(1)? {
            return Ok(weights);
        }
        let a = self.args.clone();
        let mup = self.mup_vector()?;
        weights
            .into_iter()
            .map(|(name, p)| {
                let p = if name.ends_with("embed_tokens.weight") {
                    p.multiply(a.embedding_multiplier)?
                } else if name.ends_with("lm_head.weight") {
                    p.multiply(a.lm_head_multiplier)?
                } else if name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight") {
                    p.multiply(a.attention_in_multiplier)?
                } else if name.ends_with("key_proj.weight") {
                    p.multiply(a.attention_in_multiplier * a.key_multiplier)?
                } else if name.ends_with("o_proj.weight") {
                    p.multiply(a.attention_out_multiplier)?
                } else if name.ends_with("out_proj.weight") {
                    p.multiply(a.ssm_out_multiplier)?
                } else if name.ends_with("gate_proj.weight") {
                    p.multiply(a.mlp_multipliers[0])?
                } else if name.ends_with("down_proj.weight") {
                    p.multiply(a.mlp_multipliers[1])?
                } else if name.ends_with("in_proj.weight") {
                    let m = mup
                        .astype(p.dtype())?
                        .expand_dims(&[1])?
                        .multiply(a.ssm_in_multiplier)?;
                    p.multiply(&m)?
                } else if name.contains("conv1d.weight") {
                    p.transpose(Some(&[0, 2, 1]))?
                } else {
                    p
                };
                Ok((name, p))
            })
            .collect()
    }
}
