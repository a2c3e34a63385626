//! EXAONE 4, following `mlx_lm/models/exaone4.py`: per-head q/k RMS norms, norms after
//! attention and feed-forward, and with a `sliding_window_pattern` ("LLLG"...) local
//! layers in a sliding window with RoPE and global layers without it.
use super::llama::Mlp;
use super::window_cache_specs;
use super::LayerMasks;
use super::{batch_len, layer_caches, merge_heads, rope_attend, split_heads};
use super::{fuse, project, Architecture};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, FusedLinears, KvCache, LinearLayer,
    RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by EXAONE 4.
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
    pub rope_theta: f64,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    pub rope_scaling: Option<Value>,
    pub sliding_window: Option<i32>,
    pub sliding_window_pattern: Option<String>,
}

/// Self-attention with per-head q/k norms; RoPE unless the layer is global in a
/// patterned model.
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
    is_local: bool,
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
    /// `is_local`: `None` without a pattern (RoPE, full attention).
    fn new(args: &ModelArgs, is_local: Option<bool>) -> crate::Result<Attention> {
        let dim = args.hidden_size;
        let (n_heads, n_kv_heads, d) = (
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
        );
        let rope = if is_local.unwrap_or(true) {
            initialize_rope(
                d,
                args.rope_theta,
                false,
                rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
                Some(args.max_position_embeddings),
            )?
        } else {
            Rope::Identity
        };
        Ok(Attention {
            q_proj: LinearLayer::new(dim, n_heads * d, false)?,
            k_proj: LinearLayer::new(dim, n_kv_heads * d, false)?,
            v_proj: LinearLayer::new(dim, n_kv_heads * d, false)?,
            o_proj: LinearLayer::new(n_heads * d, dim, false)?,
            q_norm: RmsNorm::new(d, args.rms_norm_eps)?,
            k_norm: RmsNorm::new(d, args.rms_norm_eps)?,
            rope,
            n_heads,
            n_kv_heads,
            scale: (d as f64).powf(-0.5),
            is_local: is_local.unwrap_or(false),
            qkv: None,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let [q, k, v] = project(
            self.qkv.as_deref(),
            [&self.q_proj, &self.k_proj, &self.v_proj],
            x,
        )?;
        let heads = |a: &Array, n: i32, norm: &RmsNorm| -> Result<Array> {
            norm.forward(&a.reshape(&[b, l, n, -1])?)?
                .transpose(Some(&[0, 2, 1, 3]))
        };
        let queries = heads(&q, self.n_heads, &self.q_norm)?;
        let keys = heads(&k, self.n_kv_heads, &self.k_norm)?;
        let values = split_heads(&v, b, l, self.n_kv_heads)?;
        let out = rope_attend(&queries, &keys, values, &self.rope, cache, self.scale, mask)?;
        self.o_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// One decoder layer: `h = x + norm(attn(x))`, `out = h + norm(mlp(h))`.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    post_attention_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    post_attention_layernorm,
    post_feedforward_layernorm
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let r = self.self_attn.forward(x, mask, cache)?;
        let h = x.add(&self.post_attention_layernorm.forward(&r)?)?;
        let r = self.mlp.forward(&h, None)?;
        h.add(&self.post_feedforward_layernorm.forward(&r)?)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct ExaoneModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    swa_idx: Option<usize>,
    full_idx: usize,
    window_size: Option<i32>,
}
impl_module!(ExaoneModel {
    embed_tokens,
    layers,
    norm
});

impl ExaoneModel {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let n = h.dim(1)?;
        let masks = LayerMasks::new(n, caches, self.full_idx, self.swa_idx, self.window_size)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            let mask = masks.get(layer.self_attn.is_local);
            h = layer.forward(&h, mask, cache)?;
        }
        self.norm.forward(&h)
    }
}

/// EXAONE 4 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: ExaoneModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |message: &str| crate::Error::Config {
            path: "config.json (exaone4)".into(),
            message: message.into(),
        };
        let pattern: Option<Vec<char>> = args
            .sliding_window_pattern
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(|p| p.chars().collect());
        let (swa_idx, full_idx) =
            match &pattern {
                Some(p) => (
                    Some(p.iter().position(|&c| c == 'L').ok_or_else(|| {
                        err("key `sliding_window_pattern` has no local (`L`) layer")
                    })?),
                    p.iter().position(|&c| c == 'G').ok_or_else(|| {
                        err("key `sliding_window_pattern` has no global (`G`) layer")
                    })?,
                ),
                None => (None, 0),
            };
        if swa_idx.is_some() && args.sliding_window.is_none() {
            return Err(err("a `sliding_window_pattern` needs `sliding_window`"));
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers as usize)
            .map(|i| {
                let is_local = pattern.as_ref().map(|p| p[i % p.len()] == 'L');
                Ok(TransformerBlock {
                    self_attn: Attention::new(&args, is_local)?,
                    mlp: Mlp::new(dim, args.intermediate_size, false)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    post_feedforward_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = ExaoneModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
            swa_idx,
            full_idx,
            window_size: args.sliding_window,
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
    Ok(Box::new(Model::new(parse_args(config, "exaone4")?)?))
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
        let sliding = self.model.layers.iter().map(|l| l.self_attn.is_local);
        window_cache_specs(sliding, self.args.sliding_window.unwrap_or(0))
    }
    fn defines_make_cache(&self) -> bool {
        true
    }
    decoder_accessors!();
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            let a = &mut layer.self_attn;
            a.qkv = fuse([&mut a.q_proj, &mut a.k_proj, &mut a.v_proj])?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}
