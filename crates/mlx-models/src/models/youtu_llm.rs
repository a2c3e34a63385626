//! Youtu-LLM (`youtu_llm`), following `mlx_lm/models/youtu_llm.py`: DeepSeek-V2's
//! low-rank query / compressed key-value attention ([`super::deepseek_v2::Attention`]:
//! keys expanded by `kv_b_proj`, the rotary part repeated over the heads, a plain
//! `KVCache`) with its norms at `rms_norm_eps`, RoPE from `initialize_rope` over
//! `qk_rope_head_dim` (traditional by default, `rope_scaling`), dense SwiGLU MLPs
//! biased by `mlp_bias`, on DeepSeek-V2's layer stack; tied by default.
use super::deepseek_v2::{Attention, AttentionParts, Layer, Stack};
use super::head::{self, LogitScale};
use super::lm::drop_tied_head;
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, initialize_rope, KvCache, LinearLayer};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Youtu-LLM, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub kv_lora_rank: i32,
    pub q_lora_rank: Option<i32>,
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
    pub qk_nope_head_dim: i32,
    pub max_position_embeddings: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "youtu_llm".into(),
            vocab_size: 128256,
            hidden_size: 2048,
            intermediate_size: 6144,
            num_hidden_layers: 32,
            num_attention_heads: 16,
            num_key_value_heads: 16,
            kv_lora_rank: 512,
            q_lora_rank: Some(1536),
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            qk_nope_head_dim: 128,
            max_position_embeddings: 131072,
            rms_norm_eps: 1e-6,
            rope_theta: 1_600_000.0,
            rope_traditional: true,
            rope_scaling: None,
            attention_bias: false,
            mlp_bias: false,
            tie_word_embeddings: true,
        }
    }
}

/// Youtu-LLM with its head (the embedding when tied).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Stack,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let q_head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim;
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = initialize_rope(
                    args.qk_rope_head_dim,
                    args.rope_theta,
                    args.rope_traditional,
                    rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
                    Some(args.max_position_embeddings),
                )?;
                let attn = Attention::from_parts(AttentionParts {
                    dim,
                    num_heads: args.num_attention_heads,
                    q_lora_rank: args.q_lora_rank,
                    kv_lora_rank: args.kv_lora_rank,
                    qk_nope_head_dim: args.qk_nope_head_dim,
                    qk_rope_head_dim: args.qk_rope_head_dim,
                    v_head_dim: args.v_head_dim,
                    bias: args.attention_bias,
                    norm_eps: eps,
                    rope,
                    scale: (q_head_dim as f64).powf(-0.5),
                })?;
                let mlp = Mlp::new(dim, args.intermediate_size, args.mlp_bias)?.up_before_down();
                Layer::new(attn, Box::new(mlp), dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Stack::new(args.vocab_size, dim, eps, layers)?;
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "youtu_llm")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let embed = self.model.embed_tokens();
        head::logits(embed, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Drops `lm_head.weight` when the head is tied.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
