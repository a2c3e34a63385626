//! The self-attention most mlx-lm files write out again: q/k/v projections split into
//! heads, RoPE at the cache offset, the cache update, SDPA and `o_proj`. The parts
//! that differ between architectures (biases, head size, rotation, scale, sinks, a
//! query scale, q/k norms and where they apply) are parameters.
use super::{batch_len, fuse, merge_heads, project, project_out, split_heads};
use super::{rope_cache_with, AfterRope};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{
    scaled_dot_product_attention, AttnMask, FusedLinears, KvCache, KvFetch, LinearLayer, Module,
    Param, RmsNorm, Rope,
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
    /// Runs SDPA on float32 queries whatever their dtype (Phi), the output cast back.
    pub queries_in_f32: bool,
}

/// Where an attention block's `q_norm` / `k_norm` apply, as each mlx-lm file writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormAt {
    /// Over the whole projection, before the head split (`q_norm(q_proj(x))`).
    Projection,
    /// Over each head: `norm(q.reshape(B, L, n, -1)).transpose(0, 2, 1, 3)`.
    Heads,
    /// Over each head after the split: `norm(q.reshape(B, L, n, -1).transpose(0, 2, 1, 3))`.
    SplitHeads,
    /// Over each head after the split and the rotation, before the cache update.
    AfterRope,
}

/// A q or k norm: mlx.nn's `RMSNorm`, Gemma's (`1 + weight`), or Cohere's layer norm
/// with one weight per head.
#[derive(Debug)]
pub(crate) enum HeadNorm {
    Rms(RmsNorm),
    Gemma(super::gemma2::RmsNorm),
    PerHead(super::cohere::LayerNorm2d),
    /// `mx.fast.rms_norm(x, None, eps)`: no weight (nanochat's).
    Weightless(f32),
    /// [`HeadNorm::Weightless`], then each head times its gain `head_g` (cast to the
    /// input's dtype; Talkie's queries).
    WeightlessGain(f32, Param),
    /// [`HeadNorm::Weightless`] times a constant (Muse Glimmer's queries, scaled by
    /// `qk_scale_factor` before the rotation).
    WeightlessTimes(f32, f64),
}

impl HeadNorm {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            HeadNorm::Rms(n) => n.forward(x),
            HeadNorm::Gemma(n) => n.forward(x),
            HeadNorm::PerHead(n) => n.forward(x),
            HeadNorm::Weightless(eps) => mlx_array::fast::rms_norm(x, None, *eps),
            HeadNorm::WeightlessGain(eps, g) => {
                let gain = g.astype(x.dtype())?.reshape(&[1, -1, 1, 1])?;
                mlx_array::fast::rms_norm(x, None, *eps)?.multiply(&gain)
            }
            HeadNorm::WeightlessTimes(eps, s) => {
                mlx_array::fast::rms_norm(x, None, *eps)?.multiply(*s)
            }
        }
    }
}

impl Module for HeadNorm {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        match self {
            HeadNorm::Rms(n) => n.visit_params(prefix, f),
            HeadNorm::Gemma(n) => n.visit_params(prefix, f),
            HeadNorm::PerHead(n) => n.visit_params(prefix, f),
            HeadNorm::Weightless(_) | HeadNorm::WeightlessTimes(..) => {}
            HeadNorm::WeightlessGain(_, g) => f(&join(prefix, "head_g"), g),
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        match self {
            HeadNorm::Rms(n) => n.visit_params_mut(prefix, f),
            HeadNorm::Gemma(n) => n.visit_params_mut(prefix, f),
            HeadNorm::PerHead(n) => n.visit_params_mut(prefix, f),
            HeadNorm::Weightless(_) | HeadNorm::WeightlessTimes(..) => {}
            HeadNorm::WeightlessGain(_, g) => f(&join(prefix, "head_g"), g),
        }
    }
}

/// `o_proj(sdpa(rope(q), rope(k), v))` with the cache in between.
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    /// One projection (named as the checkpoint names it) whose output holds q, k and v
    /// one after the other, instead of the three above (Qwen's `c_attn`, OpenELM's
    /// `qkv_proj`).
    joint_qkv: Option<(&'static str, LinearLayer)>,
    o_proj: LinearLayer,
    q_norm: Option<HeadNorm>,
    k_norm: Option<HeadNorm>,
    /// The checkpoint names of `q_proj`, `k_proj` and `v_proj`.
    qkv_names: [&'static str; 3],
    /// The checkpoint names of `q_norm` and `k_norm`.
    norm_names: [&'static str; 2],
    /// The checkpoint name of the output projection (default `o_proj`).
    o_name: &'static str,
    norm_at: NormAt,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f64,
    /// q/k/v as one matmul for decoding steps (set by the loader).
    qkv: Option<Box<FusedLinears>>,
    /// The fetched keys and values tiled this many times over the heads (`mx.tile(k,
    /// [1, n, 1, 1])`, PLaMo's shared heads), so query head `i` reads key head
    /// `i % n_kv_heads`.
    kv_tile: Option<i32>,
    /// The merged heads times `sigmoid(gate(x))` before `o_proj` (Muse Glimmer's gated
    /// output; Spark 2.5's one gate per head), the gate named as the checkpoint names it.
    out_gate: Option<(&'static str, LinearLayer, OutGate)>,
    /// The value heads times this before the cache (MiMo-V2-Flash's
    /// `attention_value_scale`).
    value_scale: Option<f64>,
}

/// How [`Attention::with_output_gate`]'s gate multiplies the attention output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutGate {
    /// One gate per output feature: `out * sigmoid(gate(x))` (Muse Glimmer).
    PerFeature,
    /// One gate per head, its sigmoid taken in float32 and cast to the output's dtype:
    /// `out * sigmoid(gate(x).astype(float32)).astype(out.dtype)[..., None]` (Spark 2.5).
    PerHeadF32,
    /// One gate per head through the compiled `nn.softplus` in float32, cast to the
    /// output's dtype (Laguna).
    PerHeadSoftplusF32,
    /// One gate per head in the gate's own dtype: `out * sigmoid(gate(x))[..., None]`
    /// (Step 3.5).
    PerHead,
}

impl Module for Attention {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        match &self.joint_qkv {
            Some((name, proj)) => proj.visit_params(&join(prefix, name), f),
            None => {
                let [qn, kn, vn] = self.qkv_names;
                self.q_proj.visit_params(&join(prefix, qn), f);
                self.k_proj.visit_params(&join(prefix, kn), f);
                self.v_proj.visit_params(&join(prefix, vn), f);
            }
        }
        self.o_proj.visit_params(&join(prefix, self.o_name), f);
        if let Some((name, gate, _)) = &self.out_gate {
            gate.visit_params(&join(prefix, name), f);
        }
        let [q, k] = self.norm_names;
        self.q_norm.visit_params(&join(prefix, q), f);
        self.k_norm.visit_params(&join(prefix, k), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        match &mut self.joint_qkv {
            Some((name, proj)) => proj.visit_params_mut(&join(prefix, name), f),
            None => {
                let [qn, kn, vn] = self.qkv_names;
                self.q_proj.visit_params_mut(&join(prefix, qn), f);
                self.k_proj.visit_params_mut(&join(prefix, kn), f);
                self.v_proj.visit_params_mut(&join(prefix, vn), f);
            }
        }
        self.o_proj.visit_params_mut(&join(prefix, self.o_name), f);
        if let Some((name, gate, _)) = &mut self.out_gate {
            gate.visit_params_mut(&join(prefix, name), f);
        }
        let [q, k] = self.norm_names;
        self.q_norm.visit_params_mut(&join(prefix, q), f);
        self.k_norm.visit_params_mut(&join(prefix, k), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        match &mut self.joint_qkv {
            Some((name, proj)) => proj.visit_quantizable_mut(&join(prefix, name), f)?,
            None => {
                let [qn, kn, vn] = self.qkv_names;
                self.q_proj.visit_quantizable_mut(&join(prefix, qn), f)?;
                self.k_proj.visit_quantizable_mut(&join(prefix, kn), f)?;
                self.v_proj.visit_quantizable_mut(&join(prefix, vn), f)?;
            }
        }
        self.o_proj
            .visit_quantizable_mut(&join(prefix, self.o_name), f)?;
        match &mut self.out_gate {
            Some((name, gate, _)) => gate.visit_quantizable_mut(&join(prefix, name), f),
            None => Ok(()),
        }
    }
}

impl Attention {
    /// Zero placeholders; `scale` multiplies the attention logits.
    pub(crate) fn new(d: AttentionDims, rope: Rope, scale: f64) -> crate::Result<Attention> {
        Ok(Attention {
            q_proj: LinearLayer::new(d.dim, d.n_heads * d.head_dim, d.qkv_bias)?,
            k_proj: LinearLayer::new(d.dim, d.n_kv_heads * d.head_dim, d.qkv_bias)?,
            v_proj: LinearLayer::new(d.dim, d.n_kv_heads * d.head_dim, d.qkv_bias)?,
            joint_qkv: None,
            o_proj: LinearLayer::new(d.n_heads * d.head_dim, d.dim, d.o_bias)?,
            q_norm: None,
            k_norm: None,
            qkv_names: ["q_proj", "k_proj", "v_proj"],
            norm_names: ["q_norm", "k_norm"],
            o_name: "o_proj",
            norm_at: NormAt::Heads,
            rope,
            n_heads: d.n_heads,
            n_kv_heads: d.n_kv_heads,
            head_dim: d.head_dim,
            scale,
            qkv: None,
            kv_tile: None,
            out_gate: None,
            value_scale: None,
        })
    }

    /// [`Attention::new`] with the default scale `head_dim ** -0.5` and RoPE from
    /// `initialize_rope(head_dim, rope_theta, False, rope_scaling, max_position_embeddings)`.
    pub(crate) fn with_scaled_rope(
        d: AttentionDims,
        rope_theta: f64,
        rope_scaling: Option<&serde_json::Value>,
        max_position_embeddings: Option<i32>,
    ) -> crate::Result<Attention> {
        let rope = mlx_nn::initialize_rope(
            d.head_dim,
            rope_theta,
            false,
            crate::config::rope_scaling(rope_scaling)?.as_ref(),
            max_position_embeddings,
        )?;
        Attention::new(d, rope, (d.head_dim as f64).powf(-0.5))
    }

    /// Qwen3's attention: per-head `q_norm` / `k_norm` RMS norms of epsilon `eps` before
    /// `rope`, the default scale `head_dim ** -0.5` (Klear's, Mellum's).
    pub(crate) fn with_rms_head_norms(
        d: AttentionDims,
        rope: Rope,
        eps: f64,
    ) -> crate::Result<Attention> {
        Attention::new(d, rope, (d.head_dim as f64).powf(-0.5))?
            .with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))
    }

    /// The fetched keys and values tiled `n` times over the heads (see `kv_tile`).
    pub(crate) fn with_tiled_kv(mut self, n: i32) -> Attention {
        self.kv_tile = Some(n);
        self
    }

    /// Value heads of `v_head_dim` features instead of `head_dim` (`v_proj` and `o_proj`
    /// rebuilt for them; MiMo-V2-Flash), over a model of `dim` features.
    pub(crate) fn with_v_head_dim(
        mut self,
        dim: i32,
        v_head_dim: i32,
        bias: bool,
    ) -> crate::Result<Attention> {
        self.v_proj = LinearLayer::new(dim, self.n_kv_heads * v_head_dim, bias)?;
        self.o_proj = LinearLayer::new(self.n_heads * v_head_dim, dim, bias)?;
        Ok(self)
    }

    /// Multiplies the value heads by `s` before the cache (see `value_scale`).
    pub(crate) fn with_value_scale(mut self, s: Option<f64>) -> Attention {
        self.value_scale = s;
        self
    }

    /// Gates the merged heads by `sigmoid(gate(x))` before `o_proj` (see `out_gate`), the
    /// gate a `Linear(dim, n)` named `name`, biased by `bias`, of `n` the output features
    /// ([`OutGate::PerFeature`]) or the heads ([`OutGate::PerHeadF32`]).
    pub(crate) fn with_output_gate(
        mut self,
        name: &'static str,
        dim: i32,
        bias: bool,
        kind: OutGate,
    ) -> crate::Result<Attention> {
        let n = match kind {
            OutGate::PerFeature => self.n_heads * self.head_dim,
            OutGate::PerHeadF32 | OutGate::PerHeadSoftplusF32 | OutGate::PerHead => self.n_heads,
        };
        self.out_gate = Some((name, LinearLayer::new(dim, n, bias)?, kind));
        Ok(self)
    }

    /// Adds `q_norm` and `k_norm` applied `at`; `norm(dims)` builds one of `dims` features.
    pub(crate) fn with_qk_norms(
        mut self,
        at: NormAt,
        norm: impl Fn(i32) -> crate::Result<HeadNorm>,
    ) -> crate::Result<Attention> {
        let (q, k) = match at {
            NormAt::Projection => (
                self.n_heads * self.head_dim,
                self.n_kv_heads * self.head_dim,
            ),
            NormAt::Heads | NormAt::SplitHeads | NormAt::AfterRope => {
                (self.head_dim, self.head_dim)
            }
        };
        self.q_norm = Some(norm(q)?);
        self.k_norm = Some(norm(k)?);
        self.norm_at = at;
        Ok(self)
    }

    /// Adds the given `q_norm` and `k_norm`, applied `at` (norms whose shape is more than
    /// a feature count).
    pub(crate) fn with_qk_norm_pair(mut self, at: NormAt, q: HeadNorm, k: HeadNorm) -> Attention {
        self.q_norm = Some(q);
        self.k_norm = Some(k);
        self.norm_at = at;
        self
    }

    /// Names the q/k norms as the checkpoint does (default `q_norm`, `k_norm`).
    pub(crate) fn with_norm_names(mut self, q: &'static str, k: &'static str) -> Attention {
        self.norm_names = [q, k];
        self
    }

    /// [`Attention::new`] with q, k and v from one projection named `name` (biased by
    /// `d.qkv_bias`) in place of `q_proj` / `k_proj` / `v_proj`: its output holds the
    /// query heads, then the key heads, then the value heads.
    pub(crate) fn new_joint_qkv(
        d: AttentionDims,
        name: &'static str,
        rope: Rope,
        scale: f64,
    ) -> crate::Result<Attention> {
        let out = (d.n_heads + 2 * d.n_kv_heads) * d.head_dim;
        let joint = LinearLayer::new(d.dim, out, d.qkv_bias)?;
        let empty = AttentionDims {
            dim: 0,
            n_heads: d.n_heads,
            n_kv_heads: d.n_kv_heads,
            head_dim: 0,
            qkv_bias: false,
            o_bias: false,
        };
        let mut attn = Attention::new(empty, rope, scale)?;
        attn.joint_qkv = Some((name, joint));
        attn.o_proj = LinearLayer::new(d.n_heads * d.head_dim, d.dim, d.o_bias)?;
        attn.head_dim = d.head_dim;
        Ok(attn)
    }

    /// Names the q, k and v projections as the checkpoint does (nanochat's `c_q`, `c_k`,
    /// `c_v`).
    pub(crate) fn with_qkv_names(
        mut self,
        q: &'static str,
        k: &'static str,
        v: &'static str,
    ) -> Attention {
        self.qkv_names = [q, k, v];
        self
    }

    /// Names the output projection as the checkpoint does (default `o_proj`).
    pub(crate) fn with_out_name(mut self, name: &'static str) -> Attention {
        self.o_name = name;
        self
    }

    /// `[B, n, L, head_dim]` heads of a projection, through `norm` where there is one.
    fn heads(&self, a: &Array, b: i32, l: i32, n: i32, norm: Option<&HeadNorm>) -> Result<Array> {
        match (norm, self.norm_at) {
            (None, _) => split_heads(a, b, l, n),
            (Some(norm), NormAt::Projection) => split_heads(&norm.forward(a)?, b, l, n),
            (Some(norm), NormAt::Heads) => norm
                .forward(&a.reshape(&[b, l, n, -1])?)?
                .transpose(Some(&[0, 2, 1, 3])),
            (Some(norm), NormAt::SplitHeads) => norm.forward(&split_heads(a, b, l, n)?),
            (Some(_), NormAt::AfterRope) => split_heads(a, b, l, n),
        }
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
        let [q, k, v] = match &self.joint_qkv {
            Some((_, proj)) => {
                let q_size = self.n_heads * self.head_dim;
                let kv_size = self.n_kv_heads * self.head_dim;
                let parts = proj.forward(x)?.split_at(&[q_size, q_size + kv_size], -1)?;
                <[Array; 3]>::try_from(parts).map_err(|_| {
                    mlx_array::Error::InvalidArgument("qkv projection: expected three parts".into())
                })?
            }
            None => project(
                self.qkv.as_deref(),
                [&self.q_proj, &self.k_proj, &self.v_proj],
                x,
            )?,
        };
        let queries = self.heads(&q, b, l, self.n_heads, self.q_norm.as_ref())?;
        let keys = self.heads(&k, b, l, self.n_kv_heads, self.k_norm.as_ref())?;
        let mut values = split_heads(&v, b, l, self.n_kv_heads)?;
        if let Some(s) = self.value_scale {
            values = values.multiply(s)?;
        }
        let after_rope = |q: Array, k: Array| -> Result<(Array, Array)> {
            match (&self.q_norm, &self.k_norm) {
                (Some(qn), Some(kn)) => Ok((qn.forward(&q)?, kn.forward(&k)?)),
                _ => Ok((q, k)),
            }
        };
        let post: Option<AfterRope<'_>> =
            (self.norm_at == NormAt::AfterRope).then_some(&after_rope);
        let (mut queries, fetch) =
            rope_cache_with(&queries, &keys, values, &self.rope, cache, post)?;
        if let Some(s) = extras.query_scale {
            queries = queries.multiply(s)?;
        }
        let fetch = match (self.kv_tile, fetch) {
            (None, fetch) => fetch,
            (Some(n), KvFetch::Plain { keys, values }) => KvFetch::Plain {
                keys: keys.tile(&[1, n, 1, 1])?,
                values: values.tile(&[1, n, 1, 1])?,
            },
            // mlx-lm's `mx.tile` of the quantized (packed, scales, biases) tuple raises.
            (Some(_), _) => {
                return Err(mlx_array::Error::InvalidArgument(
                    "tiling the heads of a quantized KV cache is not supported (mlx-lm's \
                     PLaMo cannot either)"
                        .into(),
                ))
            }
        };
        let dtype = queries.dtype();
        let in_f32 =
            extras.queries_in_f32 || (extras.f16_queries_in_f32 && dtype == Dtype::Float16);
        let out = if in_f32 {
            let q = queries.astype(Dtype::Float32)?;
            scaled_dot_product_attention(&q, &fetch, self.scale, mask, extras.sinks)?
                .astype(dtype)?
        } else {
            scaled_dot_product_attention(&queries, &fetch, self.scale, mask, extras.sinks)?
        };
        let out = merge_heads(&out, b, l)?;
        let out = match &self.out_gate {
            Some((_, gate, OutGate::PerFeature)) => out.multiply(&gate.forward(x)?.sigmoid()?)?,
            Some((_, gate, OutGate::PerHead)) => {
                let g = gate.forward(x)?.sigmoid()?.expand_dims(&[-1])?;
                out.reshape(&[b, l, self.n_heads, -1])?
                    .multiply(&g)?
                    .reshape(&[b, l, -1])?
            }
            Some((_, gate, kind)) => {
                let g = gate.forward(x)?.astype(Dtype::Float32)?;
                let g = if *kind == OutGate::PerHeadSoftplusF32 {
                    mlx_nn::activations::softplus(&g)?
                } else {
                    g.sigmoid()?
                };
                let g = g.astype(out.dtype())?.expand_dims(&[-1])?;
                out.reshape(&[b, l, self.n_heads, -1])?
                    .multiply(&g)?
                    .reshape(&[b, l, -1])?
            }
            None => out,
        };
        project_out(&self.o_proj, &out, residual)
    }

    /// mlx-lm's `get_qkv` (IQuest-Loop-Coder): the heads of q, k and v of `x` (no q/k
    /// norms), q and k rotated at `cache`'s position (0 without one), before any cache
    /// update.
    pub(crate) fn rotated_qkv(&self, x: &Array, cache: Option<&dyn KvCache>) -> Result<[Array; 3]> {
        let (b, l) = batch_len(x)?;
        let projs = [&self.q_proj, &self.k_proj, &self.v_proj];
        let [q, k, v] = project(self.qkv.as_deref(), projs, x)?;
        let q = split_heads(&q, b, l, self.n_heads)?;
        let k = split_heads(&k, b, l, self.n_kv_heads)?;
        let (q, k) = match cache {
            Some(c) => {
                let offset = c.rope_offset()?;
                let q = self.rope.forward_at(&q, offset.as_rope_offset())?;
                (q, self.rope.forward_at(&k, offset.as_rope_offset())?)
            }
            None => (self.rope.forward(&q, 0)?, self.rope.forward(&k, 0)?),
        };
        Ok([q, k, split_heads(&v, b, l, self.n_kv_heads)?])
    }

    /// SDPA of rotated `queries` over `fetch` at this attention's scale.
    pub(crate) fn attend(
        &self,
        queries: &Array,
        fetch: &KvFetch,
        mask: &AttnMask,
    ) -> Result<Array> {
        scaled_dot_product_attention(queries, fetch, self.scale, mask, None)
    }

    /// `o_proj` of the attention output's heads (plus `residual`).
    pub(crate) fn output(&self, out: &Array, residual: Option<&Array>) -> Result<Array> {
        let (b, l) = (out.dim(0)?, out.dim(2)?);
        project_out(&self.o_proj, &merge_heads(out, b, l)?, residual)
    }

    /// Replaces the rotary embedding (SmolLM3's NoPE layers).
    /// q/k/v/o, where q, k and v are separate projections and none is fused (AWQ).
    pub(crate) fn projections_mut(&mut self) -> Option<[&mut LinearLayer; 4]> {
        if self.joint_qkv.is_some() || self.qkv.is_some() {
            return None;
        }
        Some([
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.o_proj,
        ])
    }

    pub(crate) fn set_rope(&mut self, rope: Rope) {
        self.rope = rope;
    }

    /// Fuses dense q/k/v into one matmul for decoding steps.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        if self.joint_qkv.is_some() {
            return Ok(());
        }
        self.qkv = fuse([&mut self.q_proj, &mut self.k_proj, &mut self.v_proj])?;
        Ok(())
    }
}
