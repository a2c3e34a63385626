//! StarCoder2, following `mlx_lm/models/starcoder2.py`: biased projections, layer
//! norms and a GELU feed-forward (`c_fc`, `c_proj`).
use super::{batch_len, cache_at, layer_caches, merge_heads, rope_attend, split_heads};
use super::{fuse, project, project_out, Architecture};
use crate::config::{default_true, parse_args};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    activations, impl_module, AttnMask, EmbeddingLayer, FusedLinears, KvCache, LayerNorm,
    LinearLayer, Module, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by StarCoder2.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "default_norm_epsilon")]
    pub norm_epsilon: f64,
    #[serde(default = "default_vocab_size")]
    pub vocab_size: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_norm_epsilon() -> f64 {
    1e-5
}

fn default_vocab_size() -> i32 {
    49152
}

fn default_rope_theta() -> f64 {
    100000.0
}

/// Self-attention (every projection biased).
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f64,
    /// q/k/v as one matmul for decoding steps (set by the loader).
    qkv: Option<Box<FusedLinears>>,
}
impl_module!(Attention {
    q_proj,
    k_proj,
    v_proj,
    o_proj
});

impl Attention {
    fn new(args: &ModelArgs) -> crate::Result<Attention> {
        let dim = args.hidden_size;
        let (n_heads, n_kv_heads) = (args.num_attention_heads, args.num_key_value_heads);
        let head_dim = dim / n_heads;
        Ok(Attention {
            q_proj: LinearLayer::new(dim, n_heads * head_dim, true)?,
            k_proj: LinearLayer::new(dim, n_kv_heads * head_dim, true)?,
            v_proj: LinearLayer::new(dim, n_kv_heads * head_dim, true)?,
            o_proj: LinearLayer::new(n_heads * head_dim, dim, true)?,
            rope: Rope::new(head_dim, false, args.rope_theta, 1.0),
            n_heads,
            n_kv_heads,
            scale: (head_dim as f64).powf(-0.5),
            qkv: None,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        residual: &Array,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let [q, k, v] = project(
            self.qkv.as_deref(),
            [&self.q_proj, &self.k_proj, &self.v_proj],
            x,
        )?;
        let queries = split_heads(&q, b, l, self.n_heads)?;
        let keys = split_heads(&k, b, l, self.n_kv_heads)?;
        let values = split_heads(&v, b, l, self.n_kv_heads)?;
        let out = rope_attend(&queries, &keys, values, &self.rope, cache, self.scale, mask)?;
        project_out(&self.o_proj, &merge_heads(&out, b, l)?, Some(residual))
    }

    fn fuse(&mut self) -> crate::Result<()> {
        self.qkv = fuse([&mut self.q_proj, &mut self.k_proj, &mut self.v_proj])?;
        Ok(())
    }
}

/// `c_proj(gelu(c_fc(x)))`.
#[derive(Debug)]
pub struct Mlp {
    c_fc: LinearLayer,
    c_proj: LinearLayer,
}
impl_module!(Mlp { c_fc, c_proj });

/// One decoder layer (pre-norm, layer norms).
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: LayerNorm,
    post_attention_layernorm: LayerNorm,
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
        let up = self
            .mlp
            .c_fc
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        project_out(&self.mlp.c_proj, &activations::gelu(&up)?, Some(&h))
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct Starcoder2Model {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: LayerNorm,
}
impl_module!(Starcoder2Model {
    embed_tokens,
    layers,
    norm
});

impl Starcoder2Model {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            h = layer.forward(&h, &mask, cache)?;
        }
        self.norm.forward(&h)
    }
}

/// StarCoder2 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Starcoder2Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.norm_epsilon);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: Attention::new(&args)?,
                    mlp: Mlp {
                        c_fc: LinearLayer::new(dim, args.intermediate_size, true)?,
                        c_proj: LinearLayer::new(args.intermediate_size, dim, true)?,
                    },
                    input_layernorm: LayerNorm::new(dim, eps, true, true)?,
                    post_attention_layernorm: LayerNorm::new(dim, eps, true, true)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Starcoder2Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: LayerNorm::new(dim, eps, true, true)?,
        };
        let lm_head = if args.tie_word_embeddings {
            None
        } else {
            Some(LinearLayer::new(dim, args.vocab_size, false)?)
        };
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "starcoder2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        match &self.lm_head {
            Some(head) => head.forward(&out),
            None => self.model.embed_tokens.as_linear(&out),
        }
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    fn model_type(&self) -> &str {
        &self.args.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.args.vocab_size
    }
    fn num_layers(&self) -> usize {
        self.model.layers.len()
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
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
