//! Helium, following `mlx_lm/models/helium.py`: Llama-shaped layers with a traditional
//! RoPE and `o_proj` never biased; `lm_head` is a parameter even when tied (then unused).
use super::attention::{Attention, AttentionDims};
use super::decoder::{Decoder, DecoderLayer};
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::Architecture;
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, LinearLayer, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Helium (all required, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub attention_bias: bool,
    pub head_dim: i32,
    pub max_position_embeddings: i32,
    pub mlp_bias: bool,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
}

/// Self-attention: q/k/v biased where `attention_bias`, a traditional RoPE; the head
/// size is `hidden_size / num_attention_heads` (mlx-lm ignores `head_dim`).
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let head_dim = args.hidden_size / args.num_attention_heads;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: false,
    };
    let rope = Rope::new(head_dim, true, args.rope_theta, 1.0);
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// The model with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Decoder<Mlp>,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let mlp = Mlp::new(dim, args.intermediate_size, args.mlp_bias)?.up_before_down();
                DecoderLayer::new(attention(&args)?, mlp, "mlp", dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Decoder::new(args.vocab_size, dim, eps, layers)?;
        let lm_head = Some(LinearLayer::new(dim, args.vocab_size, false)?);
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "helium")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let embed = &self.model.embed_tokens;
        head::logits(embed, self.lm_head.as_ref().filter(|_| !self.args.tie_word_embeddings), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
    ///
    /// Untied, mlx-lm builds `lm_head` twice (the first one is replaced): one more key.
    fn extra_init_key_draws(&self) -> usize {
        usize::from(!self.args.tie_word_embeddings)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
