//! Qwen3, following `mlx_lm/models/qwen3.py`.
use super::{batch_len, cache_at, layer_caches, merge_heads, rope_attend, split_heads};
use super::{fuse, project, project_out, swiglu_mlp, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, FusedLinears, KvCache, LinearLayer,
    RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Qwen3.
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
    pub num_key_value_heads: i32,
    pub max_position_embeddings: i32,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    /// transformers >= 5 nests `rope_theta` and the scaling here.
    #[serde(default)]
    pub rope_parameters: Option<Value>,
}

impl ModelArgs {
    /// `__post_init__`: fills `rope_theta` / `rope_scaling` from `rope_parameters`.
    fn resolve(mut self) -> crate::Result<ModelArgs> {
        if let Some(p) = self
            .rope_parameters
            .clone()
            .filter(|p| p.as_object().is_some_and(|o| !o.is_empty()))
        {
            if self.rope_theta.is_none() {
                self.rope_theta = p.get("rope_theta").and_then(Value::as_f64);
            }
            if self.rope_scaling.is_none() {
                self.rope_scaling = Some(p);
            }
        }
        if self.rope_theta.is_none() {
            return Err(crate::Error::Config {
                path: "config.json (qwen3)".into(),
                message: "key `rope_theta` is missing from the model config".into(),
            });
        }
        Ok(self)
    }
}

/// Self-attention with per-head q/k RMS norms.
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
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
    o_proj,
    q_norm,
    k_norm
});

impl Attention {
    pub(crate) fn new(args: &ModelArgs) -> crate::Result<Attention> {
        let dim = args.hidden_size;
        let (n_heads, n_kv_heads) = (args.num_attention_heads, args.num_key_value_heads);
        let head_dim = args.head_dim;
        Ok(Attention {
            q_proj: LinearLayer::new(dim, n_heads * head_dim, false)?,
            k_proj: LinearLayer::new(dim, n_kv_heads * head_dim, false)?,
            v_proj: LinearLayer::new(dim, n_kv_heads * head_dim, false)?,
            o_proj: LinearLayer::new(n_heads * head_dim, dim, false)?,
            q_norm: RmsNorm::new(head_dim, args.rms_norm_eps)?,
            k_norm: RmsNorm::new(head_dim, args.rms_norm_eps)?,
            rope: initialize_rope(
                head_dim,
                args.rope_theta.unwrap_or_default(),
                false,
                rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
                Some(args.max_position_embeddings),
            )?,
            n_heads,
            n_kv_heads,
            scale: (head_dim as f64).powf(-0.5),
            qkv: None,
        })
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        residual: Option<&Array>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let [q, k, v] = project(
            self.qkv.as_deref(),
            [&self.q_proj, &self.k_proj, &self.v_proj],
            x,
        )?;
        let queries = q.reshape(&[b, l, self.n_heads, -1])?;
        let queries = self
            .q_norm
            .forward(&queries)?
            .transpose(Some(&[0, 2, 1, 3]))?;
        let keys = k.reshape(&[b, l, self.n_kv_heads, -1])?;
        let keys = self.k_norm.forward(&keys)?.transpose(Some(&[0, 2, 1, 3]))?;
        let values = split_heads(&v, b, l, self.n_kv_heads)?;
        let out = rope_attend(&queries, &keys, values, &self.rope, cache, self.scale, mask)?;
        project_out(&self.o_proj, &merge_heads(&out, b, l)?, residual)
    }

    fn fuse(&mut self) -> crate::Result<()> {
        self.qkv = fuse([&mut self.q_proj, &mut self.k_proj, &mut self.v_proj])?;
        Ok(())
    }
}

/// The SwiGLU feed-forward block.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: LinearLayer,
    down_proj: LinearLayer,
    up_proj: LinearLayer,
    /// gate/up as one matmul for decoding steps (set by the loader).
    gate_up: Option<Box<FusedLinears>>,
}
impl_module!(Mlp {
    gate_proj,
    down_proj,
    up_proj
});

impl Mlp {
    fn new(dim: i32, hidden: i32) -> crate::Result<Mlp> {
        Ok(Mlp {
            gate_proj: LinearLayer::new(dim, hidden, false)?,
            down_proj: LinearLayer::new(hidden, dim, false)?,
            up_proj: LinearLayer::new(dim, hidden, false)?,
            gate_up: None,
        })
    }

    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let h = swiglu_mlp(self.gate_up.as_deref(), &self.gate_proj, &self.up_proj, x)?;
        project_out(&self.down_proj, &h, residual)
    }

    fn fuse(&mut self) -> crate::Result<()> {
        self.gate_up = fuse([&mut self.gate_proj, &mut self.up_proj])?;
        Ok(())
    }
}

/// One decoder layer.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
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
            .forward(&self.input_layernorm.forward(x)?, mask, cache, Some(x))?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct Qwen3Model {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
}
impl_module!(Qwen3Model {
    embed_tokens,
    layers,
    norm
});

impl Qwen3Model {
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

/// Qwen3 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Qwen3Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: Attention::new(&args)?,
                    mlp: Mlp::new(args.hidden_size, args.intermediate_size)?,
                    input_layernorm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
                    post_attention_layernorm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Qwen3Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, args.hidden_size)?,
            layers,
            norm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
        };
        let lm_head = if args.tie_word_embeddings {
            None
        } else {
            Some(LinearLayer::new(args.hidden_size, args.vocab_size, false)?)
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
    let args: ModelArgs = parse_args(config, "qwen3")?;
    Ok(Box::new(Model::new(args.resolve()?)?))
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
    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
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
