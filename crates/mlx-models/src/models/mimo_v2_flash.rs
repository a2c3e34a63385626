//! MiMo-V2-Flash (`mimo_v2_flash`), following `mlx_lm/models/mimo_v2_flash.py`: pre-norm
//! layers, sliding (`hybrid_layer_pattern` 1) or full (0), each kind with its own heads,
//! key heads, query/key and value head sizes (`v_head_dim` may differ), RoPE base and
//! optional per-head attention sinks (`attention_sink_bias`); `nn.RoPE` over
//! `int(partial_rotary_factor * head_dim)` dimensions, values times
//! `attention_value_scale` where set; a `RotatingKVCache(sliding_window_size)` and the
//! windowed mask on the sliding layers, a `KVCache` on the full ones; by
//! `moe_layer_freq` a SwiGLU MLP or DeepSeek-V3's experts (the compiled
//! `group_expert_select`, `1e-20` added to the normalizing sum) plus shared experts;
//! an untied `lm_head`. `sanitize` dequantizes FP8 block-scaled weights, stacks the
//! experts and drops the multi-token-prediction layers (`model.mtp`).
use super::attention::{Attention, AttentionDims, Extras};
use super::config_error;
use super::decoder::{stack_mlp_experts, DenseOrMoe, FeedForward};
use super::deepseek_v3::{cast_all_but_bias, Moe, MoeGate};
use super::mlp::Mlp;
use super::{layer_caches, Architecture, LayerMasks, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::{
    impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Param, RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by MiMo-V2-Flash (all required, as mlx-lm's dataclass has
/// them, but `attention_value_scale`).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub num_experts_per_tok: i32,
    pub hybrid_layer_pattern: Vec<i32>,
    pub moe_layer_freq: Vec<i32>,
    pub add_swa_attention_sink_bias: bool,
    pub add_full_attention_sink_bias: bool,
    pub sliding_window_size: i32,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub n_shared_experts: Option<i32>,
    pub n_routed_experts: Option<i32>,
    pub routed_scaling_factor: Option<f64>,
    pub topk_method: String,
    pub scoring_func: String,
    pub norm_topk_prob: bool,
    pub n_group: i32,
    pub topk_group: i32,
    pub max_position_embeddings: i32,
    pub layernorm_epsilon: f64,
    pub rope_theta: f64,
    pub swa_rope_theta: f64,
    pub swa_num_attention_heads: i32,
    pub swa_num_key_value_heads: i32,
    pub head_dim: i32,
    pub v_head_dim: i32,
    pub swa_head_dim: i32,
    pub swa_v_head_dim: i32,
    pub partial_rotary_factor: f64,
    #[serde(default)]
    pub attention_value_scale: Option<f64>,
}

/// `Attention`: the shared attention with the layer kind's sinks.
#[derive(Debug)]
pub struct AttentionBlock {
    attn: Attention,
    attention_sink_bias: Option<Param>,
}
impl_module!(AttentionBlock {
    attn as "",
    attention_sink_bias
});

impl AttentionBlock {
    fn new(args: &ModelArgs, sliding: bool) -> crate::Result<AttentionBlock> {
        let (n_heads, n_kv_heads, sinks, head_dim, v_head_dim, theta) = if sliding {
            (
                args.swa_num_attention_heads,
                args.swa_num_key_value_heads,
                args.add_swa_attention_sink_bias,
                args.swa_head_dim,
                args.swa_v_head_dim,
                args.swa_rope_theta,
            )
        } else {
            (
                args.num_attention_heads,
                args.num_key_value_heads,
                args.add_full_attention_sink_bias,
                args.head_dim,
                args.v_head_dim,
                args.rope_theta,
            )
        };
        let err = |m: String| config_error("mimo_v2_flash", m);
        let kind = if sliding { "sliding" } else { "full" };
        if n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads != 0 {
            return Err(err(format!(
                "the {kind} layers' heads ({n_heads}) must be a positive multiple of their \
                 key-value heads ({n_kv_heads})"
            )));
        }
        let dims = (args.partial_rotary_factor * f64::from(head_dim)) as i32;
        if head_dim <= 0 || v_head_dim <= 0 || dims <= 0 || dims > head_dim || dims % 2 != 0 {
            return Err(err(format!(
                "the {kind} layers' head sizes ({head_dim}, values {v_head_dim}) and rotary \
                 dimension {dims} (`partial_rotary_factor`) must be positive, the rotary one \
                 even and at most the head size"
            )));
        }
        let d = AttentionDims {
            dim: args.hidden_size,
            n_heads,
            n_kv_heads,
            head_dim,
            qkv_bias: false,
            o_bias: false,
        };
        let rope = Rope::new(dims, false, theta, 1.0);
        let attn = Attention::new(d, rope, f64::from(head_dim).powf(-0.5))?
            .with_v_head_dim(args.hidden_size, v_head_dim, false)?
            .with_value_scale(args.attention_value_scale);
        let attention_sink_bias = if sinks {
            Some(Param::new(ops::ones(&[n_heads], Dtype::Float32)?))
        } else {
            None
        };
        Ok(AttentionBlock {
            attn,
            attention_sink_bias,
        })
    }

    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let extras = Extras {
            sinks: self.attention_sink_bias.as_ref().map(|s| s.value()),
            ..Default::default()
        };
        self.attn.forward(x, mask, cache, None, extras)
    }
}

/// `DecoderLayer`.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: AttentionBlock,
    mlp: DenseOrMoe<Moe>,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    sliding: bool,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl DecoderLayer {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        let h = x.add(&r)?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// `LanguageModel`.
#[derive(Debug)]
pub struct MimoModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(MimoModel {
    embed_tokens,
    layers,
    norm
});

/// MiMo-V2-Flash with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: MimoModel,
    lm_head: LinearLayer,
    swa_idx: usize,
    ga_idx: usize,
}

impl_module!(Model { model, lm_head }
    /// mlx-lm's `cast_predicate`: the routers' `e_score_correction_bias` keeps its dtype.
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        cast_all_but_bias(self, dtype)
    }
);

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn from_config(config: &Value) -> crate::Result<Model> {
        let err = |m: String| config_error("mimo_v2_flash", m);
        // Required by mlx-lm's dataclass even where null.
        for key in ["n_shared_experts", "n_routed_experts", "routed_scaling_factor"] {
            if config.get(key).is_none() {
                return Err(err(format!("missing key `{key}`")));
            }
        }
        let args: ModelArgs = parse_args(config, "mimo_v2_flash")?;
        let n = usize::try_from(args.num_hidden_layers)
            .map_err(|_| err("key `num_hidden_layers` must not be negative".into()))?;
        for (key, len) in [
            ("hybrid_layer_pattern", args.hybrid_layer_pattern.len()),
            ("moe_layer_freq", args.moe_layer_freq.len()),
        ] {
            if len < n {
                return Err(err(format!("key `{key}` has {len} entries for {n} layers")));
            }
        }
        // `hybrid_layer_pattern.index(1)` and `.index(0)`: both kinds must be there.
        let position = |v: i32| {
            args.hybrid_layer_pattern
                .iter()
                .position(|&p| p == v)
                .filter(|&i| i < n)
                .ok_or_else(|| {
                    err(format!(
                        "key `hybrid_layer_pattern` needs a {} layer ({v})",
                        if v == 1 { "sliding" } else { "full" }
                    ))
                })
        };
        let (swa_idx, ga_idx) = (position(1)?, position(0)?);
        let dim = args.hidden_size;
        let eps = args.layernorm_epsilon;
        let layers = (0..n)
            .map(|i| {
                let sliding = args.hybrid_layer_pattern[i] == 1;
                let mlp = if args.moe_layer_freq[i] == 1 {
                    DenseOrMoe::Moe(Box::new(moe(&args)?))
                } else {
                    DenseOrMoe::Dense(Box::new(
                        Mlp::new(dim, args.intermediate_size, false)?.up_before_down(),
                    ))
                };
                Ok(DecoderLayer {
                    self_attn: AttentionBlock::new(&args, sliding)?,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    sliding,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        if args.sliding_window_size <= 0 {
            return Err(err(format!(
                "key `sliding_window_size` ({}) must be positive",
                args.sliding_window_size
            )));
        }
        let model = MimoModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, false)?;
        Ok(Model {
            args,
            model,
            lm_head,
            swa_idx,
            ga_idx,
        })
    }
}

/// `MoE`: DeepSeek-V3's router and experts with `1e-20` in the normalizing sum.
fn moe(args: &ModelArgs) -> crate::Result<Moe> {
    let err = |m: String| config_error("mimo_v2_flash", m);
    let Some(n_experts) = args.n_routed_experts else {
        return Err(err("MoE layers need `n_routed_experts`".into()));
    };
    if args.topk_method != "noaux_tc" {
        return Err(err(format!(
            "unsupported `topk_method` {:?} (mlx-lm supports \"noaux_tc\")",
            args.topk_method
        )));
    }
    let (k, g, tg) = (args.num_experts_per_tok, args.n_group, args.topk_group);
    let groups_bad = g > 1 && (n_experts % g != 0 || n_experts / g < 2 || tg < 0 || tg > g);
    if k <= 0 || k > n_experts || groups_bad {
        return Err(err(format!(
            "`num_experts_per_tok` ({k}), `n_group` ({g}) and `topk_group` ({tg}) do not fit \
             {n_experts} experts"
        )));
    }
    let gate = MoeGate::new(
        n_experts,
        args.hidden_size,
        k,
        (g, tg),
        args.routed_scaling_factor.unwrap_or(1.0),
        args.norm_topk_prob,
        Some(1e-20),
    )?;
    Moe::new(
        args.hidden_size,
        args.moe_intermediate_size,
        n_experts,
        args.n_shared_experts,
        gate,
    )
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::from_config(config)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let window = Some(self.args.sliding_window_size);
        let masks = LayerMasks::new(n, caches, self.ga_idx, Some(self.swa_idx), window)?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            let mask = masks.get(layer.sliding);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.lm_head.forward(&m.norm.forward(&h)?)
    }

    /// `make_cache`: a `RotatingKVCache(sliding_window_size)` for each sliding layer, a
    /// `KVCache` for each full one.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| l.sliding);
        super::window_cache_specs(sliding, self.args.sliding_window_size)
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

/// mlx-lm's `dequant(weight, scale_inv)` of this file: FP8 in 128x128 blocks, padded to
/// the scales' blocks, to bfloat16.
fn fp8_dequant(weight: &Array, scale_inv: &Array) -> Result<Array> {
    const BS: i32 = 128;
    let w = mlx_array::quant::from_fp8(weight, Dtype::Bfloat16)?;
    let (m, n) = (w.dim(0)?, w.dim(1)?);
    let (pad_bottom, pad_side) = (BS * scale_inv.dim(0)? - m, BS * scale_inv.dim(1)? - n);
    let w = w.pad(&[0, 1], &[0, 0], &[pad_bottom, pad_side], None, "constant")?;
    let w = w.reshape(&[(m + pad_bottom) / BS, BS, (n + pad_side) / BS, BS])?;
    let w = w
        .multiply(&scale_inv.expand_dims(&[1, 3])?)?
        .reshape(&[m + pad_bottom, n + pad_side])?;
    w.slice(&[0, 0], &[m, n], None)?.astype(Dtype::Bfloat16)
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let weight_error = |message: String| crate::Error::Weights {
            path: "model weights".into(),
            message,
        };
        let mut out = Weights::new();
        for (k, v) in &weights {
            if k.contains("weight_scale_inv") {
                let wk = k.replacen("_scale_inv", "", 1);
                let w = weights
                    .get(&wk)
                    .ok_or_else(|| weight_error(format!("`{wk}` is missing for `{k}`")))?;
                out.insert(wk, fp8_dequant(w, v)?);
            } else if !out.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
        let mut weights = out;
        stack_mlp_experts(&mut weights, self.args.num_hidden_layers, self.args.n_routed_experts.unwrap_or(0))?;
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.starts_with("model.mtp"))
            .collect())
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}
