//! RWKV-7 (`rwkv7`), following `mlx_lm/models/rwkv7.py` on its operations path (the one
//! mlx-lm takes off Metal): embeddings, a layer norm before the first layer, then per
//! layer `h = x + time_mix(attn_norm(x))`, `h + channel_mix(ffn_norm(h))`, and a final
//! layer norm. Time mixing: token shift (the previous position, the cached last one
//! first), six compiled `addcmul` interpolations, r / k / v projections per head, the
//! in-context learning rate `sigmoid(a_lora)`, the gate `g_lora` (sigmoid inside), the
//! first layer's values mixed into the later ones by `sigmoid(v_lora)`, the decay
//! `exp(-0.606531 * sigmoid(w_lora))` (in float32), `kk = l2_norm(k * k_k)`, keys times
//! `1 + (iclr - 1) * k_a`, and the WKV-7 recurrence per position (mlx-lm's compiled
//! `_wkv7_step_ops`: `state * w + v k^T + (state a) b^T`, read out by r); a per-head layer
//! norm, the bonus `sum(r * k * r_k) * v`, `o_proj(out * gate)`. Channel mixing: token
//! shift, `addcmul` by `x_k`, `value(relu2(key(x)))`. An `ArraysCache(3)` per layer (the
//! time mixer's last input and state, the channel mixer's last input). The blocks take
//! no padding mask (as mlx-lm's): the engine prefills one prompt at a time.
//! `sanitize` reshapes `k_k`, `k_a` and `g_norm` to `[heads, head_dim]`;
//! `quant_predicate` keeps `lora.2` layers and the embeddings at 8 bits.
use super::config_error;
use super::head::{self, LogitScale};
use super::recurrent::recurrent_state;
use super::{batch_len, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, linalg, ops, Array, Dtype, Result};
use mlx_nn::activations::{call_compiled, call_compiled_keyed, relu2};
use mlx_nn::cache::ArraysState;
use mlx_nn::{impl_module, EmbeddingLayer, KvCache, LayerNorm, LinearLayer, Param};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by RWKV-7 (all required but `tie_word_embeddings`).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub norm_eps: f64,
    pub head_dim: i32,
    pub num_hidden_layers: i32,
    pub a_low_rank_dim: i32,
    pub v_low_rank_dim: i32,
    pub gate_low_rank_dim: i32,
    pub decay_low_rank_dim: i32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

/// mlx-lm's compiled `addcmul(x, y, z) = x + y * z`.
fn addcmul(x: &Array, y: &Array, z: &Array) -> Result<Array> {
    call_compiled(
        "rwkv7_addcmul",
        |a| Ok(vec![a[0].add(&a[1].multiply(&a[2])?)?]),
        &[x, y, z],
    )
}

/// mlx-lm's compiled `l2_norm(x) = x / maximum(norm(x, axis=-1, keepdims=True), 1e-7)`.
fn l2_norm(x: &Array) -> Result<Array> {
    call_compiled(
        "rwkv7_l2_norm",
        |a| {
            let n = linalg::norm(&a[0], linalg::NormOrd::Default, Some(&[-1]), true)?;
            Ok(vec![a[0].divide(&n.maximum(1e-7)?)?])
        },
        &[x],
    )
}

/// mlx-lm's compiled `_wkv7_step_ops(r, w, k, v, a, b, state)`: `(y, state)`.
fn wkv7_step(inputs: &[&Array]) -> Result<(Array, Array)> {
    let mut out = call_compiled_keyed(
        "rwkv7_wkv7_step",
        || {
            Box::new(|a: &[Array]| {
                let (r, w, k, v, aa, b, state) = (&a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6]);
                let sab = state
                    .matmul(&aa.expand_dims(&[-1])?)?
                    .matmul(&b.expand_dims(&[-2])?)?;
                let state = state
                    .multiply(&w.expand_dims(&[2])?)?
                    .add(&v.expand_dims(&[-1])?.matmul(&k.expand_dims(&[-2])?)?)?
                    .add(&sab)?;
                let y = state.matmul(&r.expand_dims(&[-1])?)?;
                Ok(vec![y, state])
            })
        },
        inputs,
    )?;
    let state = out.pop();
    let y = out.pop();
    match (y, state) {
        (Some(y), Some(state)) => Ok((y, state)),
        _ => Err(mlx_array::Error::InvalidArgument("wkv7 step: missing outputs".into())),
    }
}

/// `TokenShift`: each position's predecessor (the cached last position first, zeros
/// without one); at one position the cached one alone.
fn token_shift(x: &Array, state: Option<&Array>) -> Result<Array> {
    let (b, l) = batch_len(x)?;
    let d = x.dim(2)?;
    let state = match state {
        Some(s) => s.clone(),
        None => ops::zeros(&[b, 1, d], x.dtype())?,
    };
    if l == 1 {
        return Ok(state);
    }
    ops::concatenate(&[&state, &x.slice_axis(1, 0, l - 1)?], 1)
}

/// The last position `[B, 1, D]`.
fn last(x: &Array) -> Result<Array> {
    let l = x.dim(1)?;
    x.slice_axis(1, l - 1, l)
}

/// `LayerNormPerHead`: `weight * layer_norm(x, eps) + bias`, per head.
#[derive(Debug)]
struct HeadNorm {
    weight: Param,
    bias: Param,
    eps: f32,
}
impl_module!(HeadNorm { weight, bias });

impl HeadNorm {
    fn forward(&self, x: &Array) -> Result<Array> {
        self.weight
            .multiply(&fast::layer_norm(x, None, None, self.eps)?)?
            .add(&self.bias)
    }
}

/// A LoRA's activation.
#[derive(Debug, Clone, Copy)]
enum LoraAct {
    Identity,
    Sigmoid,
    Tanh,
}

/// `LoRA`: `lora.2(act(lora.0(x)))`.
#[derive(Debug)]
struct Lora {
    down: LinearLayer,
    up: LinearLayer,
    act: LoraAct,
}
impl_module!(Lora {
    down as "lora.0",
    up as "lora.2"
});

impl Lora {
    fn new(dim: i32, rank: i32, bias: bool, act: LoraAct) -> crate::Result<Lora> {
        Ok(Lora {
            down: LinearLayer::new(dim, rank, false)?,
            up: LinearLayer::new(rank, dim, bias)?,
            act,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let h = self.down.forward(x)?;
        let h = match self.act {
            LoraAct::Identity => h,
            LoraAct::Sigmoid => h.sigmoid()?,
            LoraAct::Tanh => h.tanh()?,
        };
        self.up.forward(&h)
    }
}

/// `Rwkv7TimeMixing`.
#[derive(Debug)]
struct TimeMixing {
    x_r: Param,
    x_w: Param,
    x_k: Param,
    x_v: Param,
    x_a: Param,
    x_g: Param,
    k_k: Param,
    k_a: Param,
    r_k: Param,
    r_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    g_norm: HeadNorm,
    w_lora: Lora,
    v_lora: Option<Lora>,
    a_lora: Lora,
    g_lora: Lora,
    heads: i32,
    head_dim: i32,
}
impl_module!(TimeMixing {
    x_r,
    x_w,
    x_k,
    x_v,
    x_a,
    x_g,
    k_k,
    k_a,
    r_k,
    r_proj,
    k_proj,
    v_proj,
    o_proj,
    g_norm,
    w_lora,
    v_lora,
    a_lora,
    g_lora
});

impl TimeMixing {
    fn new(a: &ModelArgs, layer: i32) -> crate::Result<TimeMixing> {
        let (d, hd) = (a.hidden_size, a.head_dim);
        let h = d / hd;
        let vec3 = || -> crate::Result<Param> { Ok(Param::new(ops::zeros(&[1, 1, d], Dtype::Float32)?)) };
        let per_head = || -> crate::Result<Param> { Ok(Param::new(ops::zeros(&[h, hd], Dtype::Float32)?)) };
        Ok(TimeMixing {
            x_r: vec3()?,
            x_w: vec3()?,
            x_k: vec3()?,
            x_v: vec3()?,
            x_a: vec3()?,
            x_g: vec3()?,
            k_k: per_head()?,
            k_a: per_head()?,
            r_k: per_head()?,
            r_proj: LinearLayer::new(d, d, false)?,
            k_proj: LinearLayer::new(d, d, false)?,
            v_proj: LinearLayer::new(d, d, false)?,
            o_proj: LinearLayer::new(d, d, false)?,
            g_norm: HeadNorm {
                weight: per_head()?,
                bias: per_head()?,
                eps: 64e-5,
            },
            w_lora: Lora::new(d, a.decay_low_rank_dim, true, LoraAct::Tanh)?,
            v_lora: if layer > 0 {
                Some(Lora::new(d, a.v_low_rank_dim, true, LoraAct::Identity)?)
            } else {
                None
            },
            a_lora: Lora::new(d, a.a_low_rank_dim, true, LoraAct::Identity)?,
            g_lora: Lora::new(d, a.gate_low_rank_dim, false, LoraAct::Sigmoid)?,
            heads: h,
            head_dim: hd,
        })
    }

    /// `_wkv7` on the operations path: the recurrence position by position.
    fn wkv7(&self, t: [&Array; 6], state: Option<Array>) -> Result<(Array, Array)> {
        let [r, w, k, v, a, b] = t;
        let (bsz, l) = (r.dim(0)?, r.dim(1)?);
        let mut state = match state {
            Some(s) => s,
            None => ops::zeros(&[bsz, self.heads, self.head_dim, self.head_dim], r.dtype())?,
        };
        let mut ys = Vec::with_capacity(l as usize);
        for i in 0..l {
            let at = |x: &Array| x.slice_axis(1, i, i + 1)?.squeeze(Some(&[1]));
            let (rt, wt, kt, vt, att, bt) = (at(r)?, at(w)?, at(k)?, at(v)?, at(a)?, at(b)?);
            let (y, s) = wkv7_step(&[&rt, &wt, &kt, &vt, &att, &bt, &state])?;
            ys.push(y);
            state = s;
        }
        let refs: Vec<&Array> = ys.iter().collect();
        let y = ops::stack(&refs, 1)?.astype(r.dtype())?;
        Ok((y, state))
    }

    fn forward(
        &self,
        x: &Array,
        v_first: Option<Array>,
        cache: Option<&mut ArraysState>,
    ) -> Result<(Array, Array)> {
        let (b, l) = batch_len(x)?;
        let d = x.dim(2)?;
        let (h, hd) = (self.heads, self.head_dim);
        let shift = cache.as_deref().and_then(|c| c.get(0).cloned());
        let state = cache.as_deref().and_then(|c| c.get(1).cloned());
        let x_prev = token_shift(x, shift.as_ref())?;
        let xx = x_prev.subtract(x)?;
        let xr = addcmul(x, &xx, &self.x_r)?;
        let xw = addcmul(x, &xx, &self.x_w)?;
        let xk = addcmul(x, &xx, &self.x_k)?;
        let xv = addcmul(x, &xx, &self.x_v)?;
        let xa = addcmul(x, &xx, &self.x_a)?;
        let xg = addcmul(x, &xx, &self.x_g)?;
        let heads = |t: Array| t.reshape(&[b, l, h, hd]);
        let key = heads(self.k_proj.forward(&xk)?)?;
        let mut value = heads(self.v_proj.forward(&xv)?)?;
        let receptance = heads(self.r_proj.forward(&xr)?)?;
        let iclr = heads(self.a_lora.forward(&xa)?.sigmoid()?)?;
        let gate = self.g_lora.forward(&xg)?;
        let v_first = match (&self.v_lora, v_first) {
            (Some(v_lora), Some(first)) => {
                let vv = heads(v_lora.forward(&xv)?.sigmoid()?)?;
                value = addcmul(&value, &first.subtract(&value)?, &vv)?;
                first
            }
            (None, _) => value.clone(),
            (Some(_), None) => {
                return Err(mlx_array::Error::InvalidArgument(
                    "rwkv7: a later layer needs the first layer's values".into(),
                ))
            }
        };
        let decay = heads(self.w_lora.forward(&xw)?)?.sigmoid()?.astype(Dtype::Float32)?;
        let decay = decay.multiply(-0.606531)?.exp()?.astype(receptance.dtype())?;
        let kk = l2_norm(&key.multiply(&self.k_k)?)?;
        let one = Array::weak_scalar(mlx_array::Scalar::Float(1.0), iclr.dtype())?;
        let key = key.multiply(&one.add(&iclr.subtract(&one)?.multiply(&self.k_a)?)?)?;
        let a = kk.negative()?;
        let bb = kk.multiply(&iclr)?;
        let (out, new_state) = self.wkv7([&receptance, &decay, &key, &value, &a, &bb], state)?;
        let out = self.g_norm.forward(&out.reshape(&[b, l, h, hd])?)?;
        let bonus = receptance
            .multiply(&key)?
            .multiply(&self.r_k)?
            .sum(Some(&[-1]), true)?
            .multiply(&value)?;
        let out = out.add(&bonus)?.reshape(&[b, l, d])?;
        if let Some(c) = cache {
            c.set(0, last(x)?)?;
            c.set(1, new_state)?;
        }
        Ok((self.o_proj.forward(&out.multiply(&gate)?)?, v_first))
    }
}

/// `Rwkv7ChannelMixing`.
#[derive(Debug)]
struct ChannelMixing {
    key: LinearLayer,
    value: LinearLayer,
    x_k: Param,
}
impl_module!(ChannelMixing { key, value, x_k });

impl ChannelMixing {
    fn forward(&self, x: &Array, cache: Option<&mut ArraysState>) -> Result<Array> {
        let state = cache.as_deref().and_then(|c| c.get(2).cloned());
        let x_prev = token_shift(x, state.as_ref())?;
        let xx = addcmul(x, &x_prev.subtract(x)?, &self.x_k)?;
        if let Some(c) = cache {
            c.set(2, last(x)?)?;
        }
        self.value.forward(&relu2(&self.key.forward(&xx)?)?)
    }
}

/// `Rwkv7Layer`.
#[derive(Debug)]
struct Layer {
    pre_norm: Option<LayerNorm>,
    attn: TimeMixing,
    ffn: ChannelMixing,
    attn_norm: LayerNorm,
    ffn_norm: LayerNorm,
}
impl_module!(Layer {
    pre_norm,
    attn,
    ffn,
    attn_norm,
    ffn_norm
});

/// `Rwkv7Model`.
#[derive(Debug)]
struct Rwkv7Model {
    embeddings: EmbeddingLayer,
    layers: Vec<Layer>,
    norm: LayerNorm,
}
impl_module!(Rwkv7Model {
    embeddings,
    layers,
    norm
});

/// RWKV-7 with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Rwkv7Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |m: String| config_error("rwkv7", m);
        let (d, hd) = (args.hidden_size, args.head_dim);
        if args.num_hidden_layers < 0 {
            return Err(err("key `num_hidden_layers` must not be negative".into()));
        }
        if hd <= 0 || d <= 0 || d % hd != 0 {
            return Err(err(format!(
                "key `head_dim` ({hd}) must be positive and divide `hidden_size` ({d})"
            )));
        }
        let eps = args.norm_eps;
        let ln = || -> crate::Result<LayerNorm> { Ok(LayerNorm::new(d, eps, true, true)?) };
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                Ok(Layer {
                    pre_norm: if i == 0 { Some(ln()?) } else { None },
                    attn: TimeMixing::new(&args, i)?,
                    ffn: ChannelMixing {
                        key: LinearLayer::new(d, args.intermediate_size, false)?,
                        value: LinearLayer::new(args.intermediate_size, d, false)?,
                        x_k: Param::new(ops::zeros(&[d], Dtype::Float32)?),
                    },
                    attn_norm: ln()?,
                    ffn_norm: ln()?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Rwkv7Model {
            embeddings: EmbeddingLayer::new(args.vocab_size, d)?,
            layers,
            norm: ln()?,
        };
        let lm_head = head::untied(args.tie_word_embeddings, d, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "rwkv7")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut x = m.embeddings.forward(tokens)?;
        let mut v_first: Option<Array> = None;
        for (i, (layer, cache)) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?).enumerate() {
            let mut state = recurrent_state(cache, i, "rwkv7")?;
            if let Some(pre) = &layer.pre_norm {
                x = pre.forward(&x)?;
            }
            let (h, vf) = layer.attn.forward(&layer.attn_norm.forward(&x)?, v_first.take(), state.as_deref_mut())?;
            v_first = Some(vf);
            let h = x.add(&h)?;
            x = h.add(&layer.ffn.forward(&layer.ffn_norm.forward(&h)?, state)?)?;
        }
        let out = m.norm.forward(&x)?;
        head::logits(&m.embeddings, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: an `ArraysCache(3)` per layer.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Arrays { size: 3 }; self.model.layers.len()]
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The blocks ignore a batch's right padding, as mlx-lm's.
    fn padded_prefill_is_exact(&self) -> bool {
        false
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
    fn as_module(&self) -> Option<&dyn mlx_nn::Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn mlx_nn::Module> {
        Some(self)
    }
}

impl Architecture for Model {
    /// `k_k`, `k_a` and `g_norm` reshaped to `[heads, head_dim]`.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let (h, hd) = (self.args.hidden_size / self.args.head_dim, self.args.head_dim);
        weights
            .into_iter()
            .map(|(k, v)| {
                let v = if k.contains("k_k") || k.contains("k_a") || k.contains("g_norm") {
                    v.reshape(&[h, hd])?
                } else {
                    v
                };
                Ok((k, v))
            })
            .collect()
    }
}
