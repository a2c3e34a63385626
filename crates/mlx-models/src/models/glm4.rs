//! GLM-4, following `mlx_lm/models/glm4.py`: partial (traditional by default) rotary
//! embeddings, one `gate_up_proj` matmul split in two, and norms after both sub-blocks.
use super::lm::Stack;
use super::attention::{Attention, AttentionDims, Extras};
use super::{project_out, Architecture};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::activations::swiglu;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GLM-4.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub attention_bias: bool,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub partial_rotary_factor: f64,
    pub rope_theta: f64,
    #[serde(default = "crate::config::default_true")]
    pub rope_traditional: bool,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: i32,
}

fn default_max_position_embeddings() -> i32 {
    32768
}

/// q/k/v biased where `attention_bias`, o never; `partial_rotary_factor` of each head
/// rotated.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let head_dim = args.head_dim;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: false,
    };
    let rotary = (head_dim as f64 * args.partial_rotary_factor) as i32;
    let rope = Rope::new(rotary, args.rope_traditional, args.rope_theta, 1.0);
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// `down(swiglu(*split(gate_up(x), 2)))`.
#[derive(Debug)]
pub struct Mlp {
    gate_up_proj: LinearLayer,
    down_proj: LinearLayer,
}
impl_module!(Mlp {
    gate_up_proj,
    down_proj
});

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let parts = self.gate_up_proj.forward(x)?.split_sections(2, -1)?;
        let [gate, up] = <[Array; 2]>::try_from(parts).map_err(|_| {
            mlx_array::Error::InvalidArgument("gate_up_proj: expected two halves".into())
        })?;
        project_out(&self.down_proj, &swiglu(&gate, &up)?, None)
    }
}

/// One decoder layer: norms before and after attention and feed-forward.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    post_self_attn_layernorm: RmsNorm,
    post_mlp_layernorm: RmsNorm,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm,
    post_self_attn_layernorm,
    post_mlp_layernorm
});

impl DecoderLayer {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let a = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            None,
            Extras::default(),
        )?;
        let x = x.add(&self.post_self_attn_layernorm.forward(&a)?)?;
        let m = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?)?;
        self.post_mlp_layernorm.forward(&m)?.add(&x)
    }
}

/// The decoder stack.
pub type Glm4Model = Stack<DecoderLayer, RmsNorm>;

/// GLM-4 with its (untied) output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Glm4Model,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(DecoderLayer {
                    self_attn: attention(&args)?,
                    mlp: Mlp {
                        gate_up_proj: LinearLayer::new(dim, 2 * args.intermediate_size, false)?,
                        down_proj: LinearLayer::new(args.intermediate_size, dim, false)?,
                    },
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    post_self_attn_layernorm: RmsNorm::new(dim, eps)?,
                    post_mlp_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Glm4Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
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
    Ok(Box::new(Model::new(parse_args(config, "glm4")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.lm_head.forward(&self.model.forward(tokens, caches, DecoderLayer::forward, RmsNorm::forward)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
        }
        Ok(())
    }
}
