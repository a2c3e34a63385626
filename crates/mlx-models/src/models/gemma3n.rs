//! Gemma 3n, text model only, following `mlx_lm/models/gemma3n.py`: AltUp (several
//! predicted copies of the hidden state, one of them run through each layer and the
//! others corrected), the LAuReL low-rank residual, per-layer input embeddings, MLPs
//! with Gaussian top-k activation sparsity, and KV-shared layers that read the last
//! earlier cache of their type (the model has fewer caches than layers).
use super::config_error;
use super::{batch_len, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result, Scalar};
use mlx_nn::activations::{call_compiled, call_compiled_keyed, gelu_approx};
use mlx_nn::attention::finfo_min;
use mlx_nn::cache::{create_attention_mask, RopePosition};
use mlx_nn::{
    impl_module, scaled_dot_product_attention, AttnMask, EmbeddingLayer, KvCache, KvFetch,
    LinearLayer, Module, Param, RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

/// `intermediate_size`: one for all layers or one per layer.
pub use crate::config::PerLayer;

/// The `text_config` keys Gemma 3n reads (mlx-lm's `TextConfig`: all required).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct TextConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: PerLayer,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub num_kv_shared_layers: i32,
    pub vocab_size_per_layer_input: i32,
    pub sliding_window: i32,
    pub rope_local_base_freq: f64,
    pub rope_theta: f64,
    pub final_logit_softcapping: Option<f64>,
    pub layer_types: Vec<String>,
    pub activation_sparsity_pattern: Option<Vec<f64>>,
    pub hidden_size_per_layer_input: i32,
    pub altup_num_inputs: i32,
    pub altup_coef_clip: Option<f64>,
    pub altup_correct_scale: bool,
    pub altup_active_idx: i32,
    pub laurel_rank: i32,
}

/// config.json keys read by Gemma 3n.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub text_config: Value,
}

fn bad(message: &str) -> mlx_array::Error {
    mlx_array::Error::InvalidArgument(format!("gemma3n: {message}"))
}

/// `x[i]` over the first axis.
fn at(x: &Array, i: i32) -> Result<Array> {
    x.slice_axis(0, i, i + 1)?.squeeze(Some(&[0]))
}

/// `mean(x ** 2, axis=-1, keepdims=True) ** 0.5`.
fn magnitude(x: &Array) -> Result<Array> {
    x.power(2)?.mean(Some(&[-1]), true)?.power(0.5)
}

/// Self-attention with q/k/v norms (every layer has k/v projections; the KV-shared ones
/// read their owner's cache instead when there is one).
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
    head_dim: i32,
    eps: f32,
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
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        shared: Option<KvFetch>,
        offset: &RopePosition,
    ) -> Result<(Array, Option<KvFetch>)> {
        let (b, l) = batch_len(x)?;
        let heads = |a: Array, n: i32| a.reshape(&[b, l, n, self.head_dim]);
        let queries = self.q_norm.forward(&heads(self.q_proj.forward(x)?, self.n_heads)?)?;
        let (fetch, own) = match shared {
            Some(f) => (f, None),
            None => {
                let keys = self.k_norm.forward(&heads(self.k_proj.forward(x)?, self.n_kv_heads)?)?;
                let keys = keys.transpose(Some(&[0, 2, 1, 3]))?;
                let keys = self.rope.forward_at(&keys, offset.as_rope_offset())?;
                let values = heads(self.v_proj.forward(x)?, self.n_kv_heads)?;
                let values =
                    fast::rms_norm(&values, None, self.eps)?.transpose(Some(&[0, 2, 1, 3]))?;
                match cache {
                    Some(c) => {
                        let f = mlx_nn::pipeline::update_and_fetch(c, &keys, &values)?;
                        (f.clone(), Some(f))
                    }
                    None => (KvFetch::Plain { keys, values }, None),
                }
            }
        };
        let queries = queries.transpose(Some(&[0, 2, 1, 3]))?;
        let queries = self.rope.forward_at(&queries, offset.as_rope_offset())?;
        let out = scaled_dot_product_attention(&queries, &fetch, 1.0, mask, None)?;
        let out = out.transpose(Some(&[0, 2, 1, 3]))?.reshape(&[b, l, -1])?;
        Ok((self.o_proj.forward(&out)?, own))
    }
}

/// mlx-lm's compiled `gelu_topk(inputs, std_multiplier)`.
fn gelu_topk(x: &Array, std_multiplier: &Array) -> Result<Array> {
    call_compiled(
        "gemma3n_gelu_topk",
        |a| {
            let mean = a[0].mean(Some(&[-1]), true)?;
            let std = a[0].std(Some(&[-1]), true, 0)?;
            let cutoff = mean.add(&std.multiply(&a[1].astype(std.dtype())?)?)?;
            let zero = Array::weak_scalar(Scalar::Int(0), a[0].dtype())?;
            Ok(vec![gelu_approx(&zero.maximum(&a[0].subtract(&cutoff)?)?)?])
        },
        &[x, std_multiplier],
    )
}

/// The GELU-gated MLP, sparse where the layer's `activation_sparsity` is positive.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: LinearLayer,
    up_proj: LinearLayer,
    down_proj: LinearLayer,
    std_multiplier: Option<Array>,
}
impl_module!(Mlp {
    gate_proj,
    up_proj,
    down_proj
});

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gate = self.gate_proj.forward(x)?;
        let act = match &self.std_multiplier {
            Some(m) => gelu_topk(&gate, m)?,
            None => gelu_approx(&gate)?,
        };
        self.down_proj.forward(&act.multiply(&self.up_proj.forward(x)?)?)
    }
}

/// A bias-free linear layer AltUp reads as float32 and clips (never quantized: its
/// input width is the number of AltUp inputs).
#[derive(Debug)]
pub struct Coefs {
    weight: Param,
}
impl_module!(Coefs { weight });

impl Coefs {
    /// `x @ clip(weight.astype(float32)).T`.
    fn forward(&self, x: &Array, clip: Option<f64>) -> Result<Array> {
        let mut w = self.weight.astype(Dtype::Float32)?;
        if let Some(c) = clip {
            let lo = Array::weak_scalar(Scalar::Float(-c), Dtype::Float32)?;
            let hi = Array::weak_scalar(Scalar::Float(c), Dtype::Float32)?;
            w = w.clip(Some(&lo), Some(&hi))?;
        }
        x.matmul(&w.transpose(None)?)
    }
}

/// Alternating updates: predicts every copy from the active one, corrects them from the
/// layer's output.
#[derive(Debug)]
pub struct AltUp {
    correct_output_scale: Param,
    correction_coefs: Coefs,
    prediction_coefs: Coefs,
    modality_router: LinearLayer,
    router_norm: RmsNorm,
    n: i32,
    active: i32,
    clip: Option<f64>,
    hidden_size: i32,
}
impl_module!(AltUp {
    correct_output_scale,
    correction_coefs,
    prediction_coefs,
    modality_router,
    router_norm
});

impl AltUp {
    fn modalities(&self, x: &Array) -> Result<Array> {
        let r = self
            .router_norm
            .forward(x)?
            .multiply((self.hidden_size as f64).powf(-1.0))?;
        self.modality_router.forward(&r)?.astype(Dtype::Float32)?.tanh()
    }

    fn predict(&self, x: &Array) -> Result<Array> {
        let m = self.modalities(&at(x, self.active)?)?;
        let mut shape = m.shape();
        shape.pop();
        shape.extend([self.n, self.n]);
        let coefs = self
            .prediction_coefs
            .forward(&m, self.clip)?
            .reshape(&shape)?
            .transpose(Some(&[0, 1, 3, 2]))?;
        let x_up = x.astype(Dtype::Float32)?;
        let p = x_up
            .transpose(Some(&[1, 2, 3, 0]))?
            .matmul(&coefs)?
            .transpose(Some(&[3, 0, 1, 2]))?;
        p.add(&x_up)?.astype(x.dtype())
    }

    fn correct(&self, predictions: &Array, activated: &Array) -> Result<Array> {
        let m = self.modalities(activated)?;
        let coefs = self.correction_coefs.forward(&m, self.clip)?.add(1.0)?;
        let innovation = activated.subtract(&at(predictions, self.active)?)?;
        let coefs = coefs.moveaxis(2, 0)?;
        let corrected = innovation
            .expand_dims(&[0])?
            .multiply(&coefs.expand_dims(&[-1])?)?;
        corrected.add(predictions)?.astype(activated.dtype())
    }
}

/// The learned augmented residual layer.
#[derive(Debug)]
pub struct Laurel {
    linear_left: LinearLayer,
    linear_right: LinearLayer,
    post_laurel_norm: RmsNorm,
}
impl_module!(Laurel {
    linear_left,
    linear_right,
    post_laurel_norm
});

/// One decoder layer (its input and output are the AltUp copies, `[n, B, L, D]`).
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    altup: AltUp,
    laurel: Laurel,
    per_layer_input_gate: LinearLayer,
    per_layer_projection: LinearLayer,
    post_per_layer_input_norm: RmsNorm,
    correct_scale: bool,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm,
    pre_feedforward_layernorm,
    post_feedforward_layernorm,
    altup,
    laurel,
    per_layer_input_gate,
    per_layer_projection,
    post_per_layer_input_norm
});

impl DecoderLayer {
    fn new(c: &TextConfig, i: usize) -> crate::Result<DecoderLayer> {
        let (dim, eps) = (c.hidden_size, c.rms_norm_eps);
        let norm = |d: i32| -> crate::Result<RmsNorm> { Ok(RmsNorm::new(d, eps)?) };
        let lin = |i: i32, o: i32| -> crate::Result<LinearLayer> {
            Ok(LinearLayer::new(i, o, false)?)
        };
        let hidden = c.intermediate_size.at(i, "intermediate_size", "gemma3n")?;
        let sparsity = match &c.activation_sparsity_pattern {
            Some(v) => *v.get(i).ok_or_else(|| {
                config_error("gemma3n", format!(
                    "key `activation_sparsity_pattern` has no entry for layer {i}"
                ))
            })?,
            None => 0.0,
        };
        let std_multiplier = if sparsity > 0.0 {
            let e = Array::scalar_f64(2.0 * sparsity - 1.0, Dtype::Float32)?.erfinv()?;
            let m = e.multiply(2f64.sqrt())?;
            // Evaluated now: a lazy graph would belong to this thread's stream, and the
            // model may run on another (the engine's).
            mlx_array::transforms::eval(&[&m])?;
            Some(m)
        } else {
            None
        };
        let (h, n) = (c.head_dim, c.num_attention_heads);
        let kv = c.num_key_value_heads;
        let sliding = c.layer_types[i] == SLIDING;
        let base = if sliding {
            c.rope_local_base_freq
        } else {
            c.rope_theta
        };
        let an = c.altup_num_inputs;
        let zeros = |shape: &[i32]| -> crate::Result<Param> {
            Ok(Param::new(ops::zeros(shape, Dtype::Float32)?))
        };
        Ok(DecoderLayer {
            self_attn: Attention {
                q_proj: lin(dim, n * h)?,
                k_proj: lin(dim, kv * h)?,
                v_proj: lin(dim, kv * h)?,
                o_proj: lin(n * h, dim)?,
                q_norm: norm(h)?,
                k_norm: norm(h)?,
                rope: Rope::new(h, false, base, 1.0),
                n_heads: n,
                n_kv_heads: kv,
                head_dim: h,
                eps: eps as f32,
            },
            mlp: Mlp {
                gate_proj: lin(dim, hidden)?,
                up_proj: lin(dim, hidden)?,
                down_proj: lin(hidden, dim)?,
                std_multiplier,
            },
            input_layernorm: norm(dim)?,
            post_attention_layernorm: norm(dim)?,
            pre_feedforward_layernorm: norm(dim)?,
            post_feedforward_layernorm: norm(dim)?,
            altup: AltUp {
                correct_output_scale: zeros(&[dim])?,
                correction_coefs: Coefs {
                    weight: zeros(&[an, an])?,
                },
                prediction_coefs: Coefs {
                    weight: zeros(&[an * an, an])?,
                },
                modality_router: lin(dim, an)?,
                router_norm: norm(dim)?,
                n: an,
                active: c.altup_active_idx,
                clip: c.altup_coef_clip,
                hidden_size: dim,
            },
            laurel: Laurel {
                linear_left: lin(dim, c.laurel_rank)?,
                linear_right: lin(c.laurel_rank, dim)?,
                post_laurel_norm: norm(dim)?,
            },
            per_layer_input_gate: lin(dim, c.hidden_size_per_layer_input)?,
            per_layer_projection: lin(c.hidden_size_per_layer_input, dim)?,
            post_per_layer_input_norm: norm(dim)?,
            correct_scale: c.altup_correct_scale,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        shared: Option<KvFetch>,
        per_layer_input: &Array,
        offset: &RopePosition,
    ) -> Result<(Array, Option<KvFetch>)> {
        let active = self.altup.active;
        let predictions = self.altup.predict(x)?;
        let active_prediction = at(&predictions, active)?;
        let normed = self.input_layernorm.forward(&active_prediction)?;
        let l = &self.laurel;
        let laurel = l.linear_right.forward(&l.linear_left.forward(&normed)?)?;
        let laurel = normed.add(&l.post_laurel_norm.forward(&laurel)?)?;
        let (attn, own) = self
            .self_attn
            .forward(&normed, mask, cache, shared, offset)?;
        let attn = self.post_attention_layernorm.forward(&attn)?;
        let gated = active_prediction.add(&attn)?;
        let attn_laurel = gated.add(&laurel)?.multiply(2f64.powf(-0.5))?;
        let ffw = self
            .mlp
            .forward(&self.pre_feedforward_layernorm.forward(&attn_laurel)?)?;
        let out = attn_laurel.add(&self.post_feedforward_layernorm.forward(&ffw)?)?;
        let corrected = self.altup.correct(&predictions, &out)?;
        let mut first = at(&corrected, active)?;
        if self.correct_scale {
            first = first.multiply(&*self.altup.correct_output_scale)?;
        }
        let first = gelu_approx(&self.per_layer_input_gate.forward(&first)?)?;
        let first = first.multiply(per_layer_input)?;
        let first = self
            .post_per_layer_input_norm
            .forward(&self.per_layer_projection.forward(&first)?)?;
        let n = corrected.dim(0)?;
        let head = corrected.slice_axis(0, 0, 1)?;
        let rest = corrected.slice_axis(0, 1, n)?.add(&first)?;
        Ok((ops::concatenate(&[&head, &rest], 0)?, own))
    }
}

/// The text model (`model.language_model` in the checkpoint).
#[derive(Debug)]
pub struct TextModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    embed_tokens_per_layer: EmbeddingLayer,
    per_layer_model_projection: LinearLayer,
    per_layer_projection_norm: RmsNorm,
    altup_projections: Vec<LinearLayer>,
    altup_unembed_projections: Vec<LinearLayer>,
    norm: RmsNorm,
    config: TextConfig,
    /// For each layer, the cache it uses (its own, or its owner's for KV-shared ones).
    cache_of: Vec<usize>,
    first_shared: usize,
    first_full: usize,
    first_sliding: usize,
}
impl_module!(TextModel {
    embed_tokens,
    layers,
    embed_tokens_per_layer,
    per_layer_model_projection,
    per_layer_projection_norm,
    altup_projections,
    altup_unembed_projections,
    norm
});

impl TextModel {
    fn new(c: TextConfig) -> crate::Result<TextModel> {
        let n = c.num_hidden_layers.max(0) as usize;
        if c.layer_types.len() < n {
            return Err(config_error("gemma3n", format!(
                "key `layer_types` has {} entries for {n} layers",
                c.layer_types.len()
            )));
        }
        let types = &c.layer_types[..n];
        if let Some(bad) = types.iter().find(|t| *t != FULL && *t != SLIDING) {
            return Err(config_error("gemma3n", format!("unknown layer type \"{bad}\"")));
        }
        let first_shared = (c.num_hidden_layers - c.num_kv_shared_layers).clamp(0, n as i32) as usize;
        let first = |t: &str| {
            types
                .iter()
                .position(|x| x == t)
                .ok_or_else(|| config_error("gemma3n", format!("key `layer_types`: no \"{t}\" layer")))
        };
        let (first_full, first_sliding) = (first(FULL)?, first(SLIDING)?);
        let last = |t: &str| {
            types[..first_shared]
                .iter()
                .rposition(|x| x == t)
                .ok_or_else(|| {
                    config_error("gemma3n", format!(
                        "no \"{t}\" layer before the KV-shared layers (layer {first_shared} on)"
                    ))
                })
        };
        let (shared_full, shared_sliding) = (last(FULL)?, last(SLIDING)?);
        let cache_of = (0..n)
            .map(|i| match (i < first_shared, types[i] == FULL) {
                (true, _) => i,
                (false, true) => shared_full,
                (false, false) => shared_sliding,
            })
            .collect();
        let (dim, eps) = (c.hidden_size, c.rms_norm_eps);
        let lin = |i: i32, o: i32| -> crate::Result<LinearLayer> {
            Ok(LinearLayer::new(i, o, false)?)
        };
        let per_layer = c.num_hidden_layers * c.hidden_size_per_layer_input;
        Ok(TextModel {
            embed_tokens: EmbeddingLayer::new(c.vocab_size, dim)?,
            layers: (0..n)
                .map(|i| DecoderLayer::new(&c, i))
                .collect::<crate::Result<_>>()?,
            embed_tokens_per_layer: EmbeddingLayer::new(c.vocab_size_per_layer_input, per_layer)?,
            per_layer_model_projection: lin(dim, per_layer)?,
            per_layer_projection_norm: RmsNorm::new(c.hidden_size_per_layer_input, eps)?,
            altup_projections: (1..c.altup_num_inputs)
                .map(|_| lin(dim, dim))
                .collect::<crate::Result<_>>()?,
            altup_unembed_projections: (1..c.altup_num_inputs)
                .map(|_| lin(dim, dim))
                .collect::<crate::Result<_>>()?,
            norm: RmsNorm::new(dim, eps)?,
            config: c,
            cache_of,
            first_shared,
            first_full,
            first_sliding,
        })
    }

    /// `get_per_layer_inputs` then `project_per_layer_inputs`: `[B, L, layers, P]`.
    fn per_layer_inputs(&self, ids: &Array, h: &Array) -> Result<Array> {
        let c = &self.config;
        let (b, l) = batch_len(h)?;
        let shape = [b, l, c.num_hidden_layers, c.hidden_size_per_layer_input];
        let keep = ids.less(&Array::weak_scalar(
            Scalar::Int(c.vocab_size_per_layer_input as i64),
            ids.dtype(),
        )?)?;
        let tokens = ops::where_(&keep, ids, &ops::zeros_like(ids)?)?;
        let embedded = self
            .embed_tokens_per_layer
            .forward(&tokens)?
            .multiply((c.hidden_size_per_layer_input as f64).powf(0.5))?
            .reshape(&shape)?;
        let projected = self
            .per_layer_model_projection
            .forward(h)?
            .multiply((c.hidden_size as f64).powf(-0.5))?
            .reshape(&shape)?;
        let projected = self.per_layer_projection_norm.forward(&projected)?;
        projected.add(&embedded)?.multiply(2f64.powf(-0.5))
    }

    /// `h[1:] * (target / maximum(magnitude(h[1:]), finfo.min))`, `h[0]` kept.
    fn rescale(h: &Array, target: &Array, dtype: Dtype) -> Result<Array> {
        let n = h.dim(0)?;
        let rest = h.slice_axis(0, 1, n)?;
        let floor = Array::weak_scalar(Scalar::Float(finfo_min(dtype)?), rest.dtype())?;
        let mags = magnitude(&rest)?.maximum(&floor)?;
        let rest = rest.multiply(&target.divide(&mags)?)?;
        ops::concatenate(&[&h.slice_axis(0, 0, 1)?, &rest], 0)
    }

    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let c = &self.config;
        if !caches.is_empty() && caches.len() != self.first_shared {
            return Err(bad(&format!(
                "wants {} caches (one per layer before the KV-shared ones), got {}",
                self.first_shared,
                caches.len()
            )));
        }
        let h = self
            .embed_tokens
            .forward(inputs)?
            .multiply((c.hidden_size as f64).powf(0.5))?;
        let per_layer = self.per_layer_inputs(inputs, &h)?;
        let n = h.dim(1)?;
        let cache_ref = |i: usize| caches.get(i).map(|c| c.as_ref());
        let global = create_attention_mask(n, cache_ref(self.first_full), None, false)?;
        let sliding = create_attention_mask(
            n,
            cache_ref(self.first_sliding),
            Some(c.sliding_window),
            false,
        )?;
        let target = magnitude(&h)?;
        let mut copies = vec![h.clone()];
        for p in &self.altup_projections {
            copies.push(p.forward(&h)?);
        }
        let stacked = ops::stack(&copies.iter().collect::<Vec<_>>(), 0)?;
        let mut x = Self::rescale(&stacked, &target, h.dtype())?;
        // One offset for the whole forward, read before any cache moves.
        let offset = match caches.first() {
            Some(c0) => c0.rope_offset()?,
            None => RopePosition::Scalar(0),
        };
        let mut fetches: Vec<Option<KvFetch>> = vec![None; self.layers.len()];
        let no_caches = caches.is_empty();
        for (i, layer) in self.layers.iter().enumerate() {
            let pli = per_layer.slice_axis(2, i as i32, i as i32 + 1)?.squeeze(Some(&[2]))?;
            let mask = if c.layer_types[i] == FULL {
                &global
            } else {
                &sliding
            };
            let owner = self.cache_of[i];
            let (cache, shared) = if caches.is_empty() {
                (None, None)
            } else if owner == i {
                (Some(caches[i].as_mut() as &mut dyn KvCache), None)
            } else {
                let f = fetches[owner]
                    .clone()
                    .ok_or_else(|| bad("a KV-shared layer's owner has no keys"))?;
                (None, Some(f))
            };
            let (out, own) = if no_caches && mlx_nn::checkpoint::enabled() {
                // mlx-lm's `grad_checkpoint`: without caches there is nothing shared and
                // the layer gives only its hidden states; its array arguments, the
                // hidden states and the per-layer input, are the checkpointed inputs.
                let (mask, at) = (mask.clone(), offset.clone());
                let out = mlx_nn::checkpoint::call(layer, &[&x, &pli], None, move |l, a, c| {
                    Ok(vec![l.forward(&a[0], &mask, c, None, &a[1], &at)?.0])
                })?;
                (mlx_nn::checkpoint::first(out)?, None)
            } else {
                layer.forward(&x, mask, cache, shared, &pli, &offset)?
            };
            x = out;
            fetches[i] = own;
        }
        let target = magnitude(&at(&x, 0)?)?;
        let mut copies = vec![x.slice_axis(0, 0, 1)?];
        for (i, p) in self.altup_unembed_projections.iter().enumerate() {
            copies.push(p.forward(&at(&x, i as i32 + 1)?)?.expand_dims(&[0])?);
        }
        let x = ops::concatenate(&copies.iter().collect::<Vec<_>>(), 0)?;
        let x = Self::rescale(&x, &target, h.dtype())?.mean(Some(&[0]), false)?;
        let out = self.embed_tokens.as_linear(&self.norm.forward(&x)?)?;
        match c.final_logit_softcapping {
            Some(cap) => logit_softcap(cap, &out),
            None => Ok(out),
        }
    }
}

/// mlx-lm's compiled `logit_softcap(softcap, x)` with `softcap` a constant.
fn logit_softcap(cap: f64, x: &Array) -> Result<Array> {
    let make = move || -> mlx_nn::activations::KeyedBody {
        Box::new(move |a: &[Array]| Ok(vec![a[0].divide(cap)?.tanh()?.multiply(cap)?]))
    };
    let mut out = call_compiled_keyed(&format!("gemma3n_logit_softcap_{cap:e}"), make, &[x])?;
    out.pop().ok_or_else(|| bad("logit_softcap: no output"))
}

/// `Gemma3n`: the text model under `language_model`.
#[derive(Debug)]
pub struct Gemma3n {
    language_model: TextModel,
}
impl_module!(Gemma3n { language_model });

/// Gemma 3n (text).
#[derive(Debug)]
pub struct Model {
    model_type: String,
    model: Gemma3n,
}
impl_module!(Model { model });

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "gemma3n")?;
    let text: TextConfig = parse_args(&args.text_config, "gemma3n text_config")?;
    Ok(Box::new(Model {
        model_type: args.model_type,
        model: Gemma3n {
            language_model: TextModel::new(text)?,
        },
    }))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.model.language_model.forward(tokens, caches)
    }
    /// `make_cache`: one cache per layer before the KV-shared ones.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let lm = &self.model.language_model;
        let sliding = lm.config.layer_types[..lm.first_shared]
            .iter()
            .map(|t| t == SLIDING);
        super::window_cache_specs(sliding, lm.config.sliding_window)
    }
    fn model_type(&self) -> &str {
        &self.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.model.language_model.config.vocab_size
    }
    fn num_layers(&self) -> usize {
        self.model.language_model.layers.len()
    }
    fn defines_make_cache(&self) -> bool {
        true
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
}

impl Architecture for Model {
    /// mlx-lm's `sanitize`: the vision and audio towers and their embedders dropped.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        const DROPPED: [&str; 4] = ["vision_tower", "audio_tower", "embed_audio", "embed_vision"];
        Ok(weights
            .into_iter()
            .filter(|(k, _)| {
                let top = k
                    .strip_prefix("model.")
                    .and_then(|r| r.split('.').next());
                !top.is_some_and(|t| DROPPED.contains(&t))
            })
            .collect())
    }

    /// AltUp's two coefficient layers per layer are `nn.Linear`s in mlx-lm (one key
    /// each), held here as plain weights.
    fn extra_init_key_draws(&self) -> usize {
        2 * self.model.language_model.layers.len()
    }
}
