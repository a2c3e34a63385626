//! EXAONE MoE (`exaone_moe`), following `mlx_lm/models/exaone_moe.py`: pre-norm layers
//! whose attention is EXAONE 4's (per-head q/k RMS norms; where `layer_types` has
//! sliding layers, those use a window and RoPE and the full ones no rotation), and whose
//! feed-forward block is, per `is_moe_layer`, a dense SwiGLU MLP or DeepSeek-V3's
//! sigmoid-scored group-limited router (with the correction bias and routed scaling)
//! over SwitchGLU experts plus shared experts. Sanitize drops the multi-token-prediction
//! weights (`mtp.*`), moves the correction bias under the gate and stacks the experts.
use super::attention::Attention;
use super::decoder::{stack_experts, DecoderLayer, DenseOrMoe, FeedForward};
use super::deepseek_v3::{cast_all_but_bias, Moe, MoeGate};
use super::exaone4::exaone_attention;
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{layer_caches, window_cache_specs, Architecture, LayerMasks, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{impl_module, EmbeddingLayer, KvCache, LinearLayer, Module, Param, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by EXAONE MoE (those without a default are required, as in
/// mlx-lm's `ModelArgs`).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub num_shared_experts: Option<i32>,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: i32,
    pub sliding_window: i32,
    pub layer_types: Vec<String>,
    pub is_moe_layer: Vec<bool>,
    #[serde(default = "one")]
    pub n_group: i32,
    #[serde(default = "one")]
    pub topk_group: i32,
    #[serde(default = "default_routed_scaling_factor")]
    pub routed_scaling_factor: f64,
    #[serde(default = "default_true")]
    pub norm_topk_prob: bool,
    #[serde(default = "default_topk_method")]
    pub topk_method: String,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn one() -> i32 {
    1
}
fn default_routed_scaling_factor() -> f64 {
    2.5
}
fn default_true() -> bool {
    true
}
fn default_topk_method() -> String {
    "noaux_tc".into()
}
fn default_rope_theta() -> f64 {
    1_000_000.0
}

/// EXAONE 4's attention, rotated when `use_rope`.
fn attention(args: &ModelArgs, use_rope: bool) -> crate::Result<Attention> {
    exaone_attention(
        args.hidden_size,
        args.num_attention_heads,
        args.num_key_value_heads,
        args.head_dim,
        args.rope_theta,
        args.rope_scaling.as_ref(),
        args.max_position_embeddings,
        args.rms_norm_eps,
        use_rope,
    )
}

/// A layer's feed-forward block.
pub type Ffn = DenseOrMoe<Moe>;

/// The decoder stack, each layer sliding or full.
#[derive(Debug)]
pub struct ExaoneMoeModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer<Ffn>>,
    norm: RmsNorm,
    sliding: Vec<bool>,
    swa_idx: Option<usize>,
    ga_idx: Option<usize>,
    window_size: i32,
}
impl_module!(ExaoneMoeModel {
    embed_tokens,
    layers,
    norm
});

impl ExaoneMoeModel {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let n = h.dim(1)?;
        // Without a layer of a kind, mlx-lm builds that kind's mask from the first
        // cache; no layer reads it then.
        let masks = LayerMasks::new(
            n,
            caches,
            self.ga_idx.unwrap_or(0),
            self.swa_idx,
            Some(self.window_size),
        )?;
        for ((layer, &sliding), cache) in self
            .layers
            .iter()
            .zip(&self.sliding)
            .zip(layer_caches(caches, self.layers.len())?)
        {
            let mask = masks.get(sliding);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.norm.forward(&h)
    }
}

/// EXAONE MoE with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: ExaoneMoeModel,
    lm_head: Option<LinearLayer>,
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(mut args: ModelArgs) -> crate::Result<Model> {
        let err = |message: String| crate::Error::Config {
            path: "config.json (exaone_moe)".into(),
            message,
        };
        if let Some(theta) = args
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
        {
            args.rope_theta = theta
                .as_f64()
                .ok_or_else(|| err("key `rope_parameters.rope_theta` must be a number".into()))?;
        }
        if args.topk_method != "noaux_tc" {
            return Err(err(format!(
                "key `topk_method`: only \"noaux_tc\" is supported, got {:?}",
                args.topk_method
            )));
        }
        let n_layers = args.num_hidden_layers as usize;
        if args.layer_types.len() < n_layers || args.is_moe_layer.len() < n_layers {
            return Err(err(format!(
                "keys `layer_types` and `is_moe_layer` need an entry for each of the {n_layers} layers"
            )));
        }
        let sliding: Vec<bool> = args.layer_types[..n_layers]
            .iter()
            .map(|t| t == "sliding_attention")
            .collect();
        let rope_all_layers = !args.layer_types.iter().any(|t| t == "sliding_attention");
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let n_shared = args.num_shared_experts.filter(|&n| n > 0);
        let layers = (0..n_layers)
            .map(|i| {
                let ffn = if args.is_moe_layer[i] {
                    let gate = MoeGate::new(
                        args.num_experts,
                        dim,
                        args.num_experts_per_tok,
                        (args.n_group, args.topk_group),
                        args.routed_scaling_factor,
                        args.norm_topk_prob,
                        Some(1e-20),
                    )?;
                    let moe_dim = args.moe_intermediate_size;
                    DenseOrMoe::Moe(Box::new(Moe::new(dim, moe_dim, args.num_experts, n_shared, gate)?))
                } else {
                    let mlp = Mlp::new(dim, args.intermediate_size, false)?.up_before_down();
                    DenseOrMoe::Dense(Box::new(mlp))
                };
                let attn = attention(&args, sliding[i] || rope_all_layers)?;
                DecoderLayer::new(attn, ffn, "mlp", dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = ExaoneMoeModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
            swa_idx: sliding.iter().position(|&s| s),
            ga_idx: sliding.iter().position(|&s| !s),
            sliding,
            window_size: args.sliding_window,
        };
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

impl Module for Model {
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
    /// mlx-lm's `cast_predicate`: the routers' `e_score_correction_bias` keeps its dtype.
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        cast_all_but_bias(self, dtype)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "exaone_moe")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        window_cache_specs(self.model.sliding.iter().copied(), self.args.sliding_window)
    }
    fn defines_make_cache(&self) -> bool {
        true
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Drops `mtp.*`; in each MoE layer moves `mlp.e_score_correction_bias` to
    /// `mlp.gate.e_score_correction_bias` and stacks the per-expert projections into
    /// `switch_mlp`; drops `lm_head.weight` when the head is tied.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights: Weights = weights
            .into_iter()
            .filter(|(k, _)| !k.starts_with("mtp."))
            .collect();
        let n_experts = self.args.num_experts;
        for (l, &moe) in self.args.is_moe_layer.iter().enumerate() {
            if !moe || l >= self.args.num_hidden_layers as usize {
                continue;
            }
            let prefix = format!("model.layers.{l}.mlp");
            if let Some(b) = weights.remove(&format!("{prefix}.e_score_correction_bias")) {
                weights.insert(format!("{prefix}.gate.e_score_correction_bias"), b);
            }
            let names = [
                ("gate_proj", "gate_proj"),
                ("down_proj", "down_proj"),
                ("up_proj", "up_proj"),
            ];
            stack_experts(
                &mut weights,
                1,
                |_| prefix.clone(),
                &names,
                &["weight", "scales", "biases"],
                n_experts,
            )?;
        }
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}
