//! Baichuan-M1 (`baichuan_m1`), following `mlx_lm/models/baichuan_m1.py`: a fused
//! `W_pack` q/k/v projection whose keys and values first pass a two-tap causal
//! convolution over positions (per kv head, `conv_k` / `conv_v`), then RoPE and
//! attention; the layers of `sliding_window_layers` attend through a window (with their
//! own head counts where `num_swa_*_heads` are set). Each layer's cache is mlx-lm's
//! `CacheList(ArraysCache(2), KVCache or RotatingKVCache(sliding_window))`: the arrays
//! keep the last raw key and value (the convolution's state), the second cache the
//! rotated keys and values. `sanitize` scales each row of a dense `lm_head` to unit
//! norm (its "NormHead").
use super::config_error;
use super::lm::{even_head_dim, Stack};
use super::mlp::Mlp;
use super::{batch_len, layer_caches, merge_heads, rope_cache, split_heads};
use super::{Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::linalg::{norm, NormOrd};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, scaled_dot_product_attention, ArraysState, AttnMask, EmbeddingLayer, KvCache,
    LinearLayer, Param, RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// config.json keys read by Baichuan-M1 (those without a default are required, as in
/// mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub rope_theta: f64,
    pub sliding_window: i32,
    pub sliding_window_layers: Vec<i32>,
    pub conv_window: i32,
    pub rms_norm_eps: f64,
    #[serde(default = "default_model_type")]
    pub model_type: String,
    #[serde(default)]
    pub num_swa_attention_heads: Option<i32>,
    #[serde(default)]
    pub num_swa_key_value_heads: Option<i32>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_model_type() -> String {
    "baichuan_m1".into()
}

impl ModelArgs {
    fn is_swa(&self, i: usize) -> bool {
        self.sliding_window_layers.iter().any(|&l| l as usize == i && l >= 0)
    }

    /// mlx-lm's `first_swa_idx` (the list's first entry) and `first_global_idx` (the
    /// first layer not in it), the layers whose caches the two masks are made from.
    fn mask_layers(&self) -> (Option<usize>, Option<usize>) {
        let swa = self.sliding_window_layers.first().map(|&l| l as usize);
        let global = (0..self.num_hidden_layers.max(0) as usize).find(|&i| !self.is_swa(i));
        (swa, global)
    }
}

/// The convolution state slots of a layer's `ArraysCache`: the last raw key and value.
const STATE_K: usize = 0;
const STATE_V: usize = 1;

/// Attention over `W_pack`, keys and values convolved over positions before RoPE.
#[derive(Debug)]
pub struct Attention {
    w_pack: LinearLayer,
    o_proj: LinearLayer,
    conv_k: Param,
    conv_v: Param,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f64,
}
impl_module!(Attention {
    w_pack as "W_pack",
    o_proj,
    conv_k,
    conv_v
});

impl Attention {
    fn new(args: &ModelArgs, i: usize) -> crate::Result<Attention> {
        let swa = args.is_swa(i);
        let pick = |own: Option<i32>, base: i32| match own {
            Some(n) if swa && n != 0 => n,
            _ => base,
        };
        let n_heads = pick(args.num_swa_attention_heads, args.num_attention_heads);
        let n_kv_heads = pick(args.num_swa_key_value_heads, args.num_key_value_heads);
        let dim = args.hidden_size;
        let head_dim = even_head_dim(dim, n_heads, "baichuan_m1")?;
        if args.conv_window != 2 {
            return Err(config_error("baichuan_m1", format!(
                "key `conv_window` must be 2 (mlx-lm's assertion), got {}",
                args.conv_window
            )));
        }
        let conv = || -> crate::Result<Param> {
            Ok(Param::new(ops::zeros(
                &[1, 1, n_kv_heads, 1, args.conv_window],
                Dtype::Float32,
            )?))
        };
        Ok(Attention {
            w_pack: LinearLayer::new(dim, dim + 2 * n_kv_heads * head_dim, false)?,
            o_proj: LinearLayer::new(n_heads * head_dim, dim, false)?,
            conv_k: conv()?,
            conv_v: conv()?,
            rope: Rope::new(head_dim, false, args.rope_theta, 1.0),
            n_heads,
            n_kv_heads,
            head_dim,
            scale: (head_dim as f64).powf(-0.5),
        })
    }

    /// mlx-lm's `_custom_convolution`: `u_prev * w0 + u * w1`, `u_prev` the positions
    /// shifted by one with `state` (zeros without one) in front.
    fn convolve(&self, u: &Array, weights: &Param, state: Option<&Array>) -> Result<Array> {
        let s = u.shape();
        let (b, h, l, d) = (s[0], s[1], s[2], s[3]);
        let w = weights.value().reshape(&[1, h, 2, 1, 1])?;
        let w0 = w.slice_axis(2, 0, 1)?.squeeze(Some(&[2]))?;
        let w1 = w.slice_axis(2, 1, 2)?.squeeze(Some(&[2]))?;
        let state = match state {
            Some(s) => s.clone(),
            None => ops::zeros(&[b, h, 1, d], u.dtype())?,
        };
        let prev = if l > 1 {
            ops::concatenate(&[&state, &u.slice_axis(2, 0, l - 1)?], 2)?
        } else {
            state
        };
        prev.multiply(&w0)?.add(&u.multiply(&w1)?)
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<(&mut ArraysState, &mut dyn KvCache)>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let d = x.dim(-1)?;
        let kv = self.n_kv_heads * self.head_dim;
        let parts = self.w_pack.forward(x)?.split_at(&[d, d + kv], -1)?;
        let [q, k, v] = <[Array; 3]>::try_from(parts).map_err(|_| {
            mlx_array::Error::InvalidArgument("W_pack does not split in three".into())
        })?;
        let q = split_heads(&q, b, l, self.n_heads)?;
        let k_init = split_heads(&k, b, l, self.n_kv_heads)?;
        let v_init = split_heads(&v, b, l, self.n_kv_heads)?;
        let (state, kv_cache) = match cache {
            Some((s, c)) => (Some(s), Some(c)),
            None => (None, None),
        };
        let last = |i: usize| state.as_ref().and_then(|s| s.get(i).cloned());
        let k = self.convolve(&k_init, &self.conv_k, last(STATE_K).as_ref())?;
        let v = self.convolve(&v_init, &self.conv_v, last(STATE_V).as_ref())?;
        let (queries, fetch) = rope_cache(&q, &k, v, &self.rope, kv_cache)?;
        if let Some(s) = state {
            s.set(STATE_K, k_init.slice_axis(2, l - 1, l)?)?;
            s.set(STATE_V, v_init.slice_axis(2, l - 1, l)?)?;
        }
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        self.o_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// One layer: attention then the SwiGLU MLP, each after an RMS norm.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl DecoderLayer {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let cache = match cache {
            None => None,
            Some(c) => match c.sub_caches_mut() {
                Some([state, kv]) => {
                    let state = state.arrays_mut().ok_or_else(|| {
                        mlx_array::Error::InvalidArgument(
                            "baichuan_m1 needs an ArraysCache first in each layer's CacheList"
                                .into(),
                        )
                    })?;
                    let kv: &mut dyn KvCache = &mut **kv;
                    Some((state, kv))
                }
                _ => {
                    return Err(mlx_array::Error::InvalidArgument(
                        "baichuan_m1 layers need a CacheList(ArraysCache, KV cache)".into(),
                    ))
                }
            },
        };
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        let h = x.add(&r)?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// Baichuan-M1: `model` (`embed_tokens`, `layers`, `norm`) and the untied `lm_head`.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Stack<DecoderLayer, RmsNorm>,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        if args.tie_word_embeddings {
            // mlx-lm builds no `lm_head` then, and its forward calls it.
            return Err(config_error("baichuan_m1", 
                "`tie_word_embeddings` is not supported: mlx-lm's model has no tied head \
                 (its forward always calls `lm_head`)"
                    .into(),
            ));
        }
        if args.sliding_window < 1 && !args.sliding_window_layers.is_empty() {
            return Err(config_error("baichuan_m1", format!(
                "key `sliding_window` must be positive with sliding layers, got {}",
                args.sliding_window
            )));
        }
        let n = args.num_hidden_layers.max(0) as usize;
        if let Some(&l) = args
            .sliding_window_layers
            .iter()
            .find(|&&l| l < 0 || l as usize >= n)
        {
            return Err(config_error("baichuan_m1", format!(
                "key `sliding_window_layers`: {l} is not a layer of {n}"
            )));
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..n)
            .map(|i| {
                Ok(DecoderLayer {
                    self_attn: Attention::new(&args, i)?,
                    mlp: Mlp::new(dim, args.intermediate_size, false)?.up_before_down(),
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Stack {
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
    Ok(Box::new(Model::new(parse_args(config, "baichuan_m1")?)?))
}

/// The key/value cache inside layer `i`'s `CacheList` (for masks).
fn kv_cache_at(caches: &[Box<dyn KvCache>], i: Option<usize>) -> Option<&dyn KvCache> {
    let subs = caches.get(i?)?.sub_caches()?;
    subs.get(1).map(|c| c.as_ref())
}

/// `[ArraysCache(2), RotatingKVCache(window)]`, made once per window size: a cache list's
/// spec is a static slice, and the window is the config's.
fn sliding_list(window: i32) -> &'static [CacheSpec] {
    static LISTS: OnceLock<Mutex<BTreeMap<i32, &'static [CacheSpec]>>> = OnceLock::new();
    let mut lists = LISTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    lists.entry(window).or_insert_with(|| {
        Box::leak(Box::new([
            CacheSpec::Arrays { size: 2 },
            CacheSpec::Rotating {
                max_size: window,
                keep: 0,
            },
        ]))
    })
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let (swa_idx, global_idx) = self.args.mask_layers();
        let global = create_attention_mask(n, kv_cache_at(caches, global_idx), None, false)?;
        let window = Some(self.args.sliding_window);
        let swa = create_attention_mask(n, kv_cache_at(caches, swa_idx), window, false)?;
        let mut h = h;
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let mask = if self.args.is_swa(i) { &swa } else { &global };
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.lm_head.forward(&m.norm.forward(&h)?)
    }
    /// mlx-lm's `make_cache`: `CacheList(ArraysCache(2), KVCache())`, with a
    /// `RotatingKVCache(sliding_window)` on the sliding layers.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        const GLOBAL: &[CacheSpec] = &[CacheSpec::Arrays { size: 2 }, CacheSpec::Standard];
        (0..self.model.layers.len())
            .map(|i| match self.args.is_swa(i) {
                true => CacheSpec::List(sliding_list(self.args.sliding_window)),
                false => CacheSpec::List(GLOBAL),
            })
            .collect()
    }
    fn defines_make_cache(&self) -> bool {
        true
    }
    /// The convolution reads the position before each token: in a right-padded batch
    /// the state a short row keeps is a padding position's (mlx-lm's file keeps no
    /// lengths), so prompts are prefilled one at a time.
    fn padded_prefill_is_exact(&self) -> bool {
        false
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// mlx-lm's `sanitize`: a dense `lm_head` (no `lm_head.scales`) has each row divided
    /// by its norm (`w / (|w| + 1e-7)` in float32, cast back), at every load.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if weights.contains_key("lm_head.scales") {
            return Ok(weights);
        }
        if let Some(w) = weights.remove("lm_head.weight") {
            let dtype = w.dtype();
            let w = w.astype(Dtype::Float32)?;
            let n = norm(&w, NormOrd::Default, Some(&[-1]), true)?;
            let w = w.divide(&n.add(1e-7)?)?.astype(dtype)?;
            weights.insert("lm_head.weight".into(), w);
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}
