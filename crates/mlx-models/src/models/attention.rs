//! The self-attention most mlx-lm files write out again: q/k/v projections split into
//! heads, RoPE at the cache offset, the cache update, SDPA and `o_proj`. The parts
//! that differ between architectures (biases, head size, rotation, scale, sinks, a
//! query scale) are parameters.
use super::{batch_len, fuse, merge_heads, project, project_out, rope_cache, split_heads};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::{
    impl_module, scaled_dot_product_attention, AttnMask, FusedLinears, KvCache, LinearLayer, Rope,
};

/// Sizes and biases of an [`Attention`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttentionDims {
    /// Model width (input of q/k/v, output of o).
    pub dim: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    /// Biases on q, k and v.
    pub qkv_bias: bool,
    /// Bias on o.
    pub o_bias: bool,
}

/// What some architectures add to the plain attention.
#[derive(Default)]
pub(crate) struct Extras<'a> {
    /// One sink logit per head (GPT-OSS).
    pub sinks: Option<&'a Array>,
    /// Multiplies the rotated queries (Ministral 3's position scale).
    pub query_scale: Option<&'a Array>,
    /// Runs SDPA on float32 queries when they are float16 (Cohere 2), the output cast
    /// back.
    pub f16_queries_in_f32: bool,
}

/// `o_proj(sdpa(rope(q), rope(k), v))` with the cache in between.
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
    /// Zero placeholders; `scale` multiplies the attention logits.
    pub(crate) fn new(d: AttentionDims, rope: Rope, scale: f64) -> crate::Result<Attention> {
        Ok(Attention {
            q_proj: LinearLayer::new(d.dim, d.n_heads * d.head_dim, d.qkv_bias)?,
            k_proj: LinearLayer::new(d.dim, d.n_kv_heads * d.head_dim, d.qkv_bias)?,
            v_proj: LinearLayer::new(d.dim, d.n_kv_heads * d.head_dim, d.qkv_bias)?,
            o_proj: LinearLayer::new(d.n_heads * d.head_dim, d.dim, d.o_bias)?,
            rope,
            n_heads: d.n_heads,
            n_kv_heads: d.n_kv_heads,
            scale,
            qkv: None,
        })
    }

    /// The attention output (plus `residual`, added as `residual + o_proj(..)` would).
    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        residual: Option<&Array>,
        extras: Extras<'_>,
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
        let (mut queries, fetch) = rope_cache(&queries, &keys, values, &self.rope, cache)?;
        if let Some(s) = extras.query_scale {
            queries = queries.multiply(s)?;
        }
        let dtype = queries.dtype();
        let out = if extras.f16_queries_in_f32 && dtype == Dtype::Float16 {
            let q = queries.astype(Dtype::Float32)?;
            scaled_dot_product_attention(&q, &fetch, self.scale, mask, extras.sinks)?
                .astype(dtype)?
        } else {
            scaled_dot_product_attention(&queries, &fetch, self.scale, mask, extras.sinks)?
        };
        project_out(&self.o_proj, &merge_heads(&out, b, l)?, residual)
    }

    /// Replaces the rotary embedding (SmolLM3's NoPE layers).
    pub(crate) fn set_rope(&mut self, rope: Rope) {
        self.rope = rope;
    }

    /// Fuses dense q/k/v into one matmul for decoding steps.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        self.qkv = fuse([&mut self.q_proj, &mut self.k_proj, &mut self.v_proj])?;
        Ok(())
    }
}
