//! DeepSeek-V3.2 (`deepseek_v32`), following `mlx_lm/models/deepseek_v32.py`: the
//! DeepSeek-V3 model of [`super::deepseek_v3`] (multi-head latent attention, grouped
//! sigmoid routing) whose attention reads only the `index_topk` positions an
//! [`Indexer`] scores highest once more positions than that are cached. Each layer's
//! cache is a `CacheList` of two `KVCache`s: `cache[0]` the latent keys and values,
//! `cache[1]` the indexer's keys (its values zeros, as mlx-lm stores them). `sanitize`
//! drops the multi-token-prediction layers, dequantizes FP8 block-scaled weights,
//! stacks experts and splits `kv_b_proj`.
use super::deepseek_v3::{Flavor, Model, ModelArgs};
use super::Architecture;
use crate::config::{parse_args, rope_scaling};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::{impl_module, initialize_rope, AttnMask, KvCache, KvFetch, LayerNorm, LinearLayer, Rope};
use serde::Deserialize;
use serde_json::Value;

/// The indexer's config.json keys, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct IndexerArgs {
    pub index_head_dim: i32,
    pub index_n_heads: i32,
    pub index_topk: i32,
    pub indexer_rope_interleave: bool,
}

impl Default for IndexerArgs {
    fn default() -> IndexerArgs {
        IndexerArgs {
            index_head_dim: 128,
            index_n_heads: 64,
            index_topk: 2048,
            indexer_rope_interleave: false,
        }
    }
}

/// mlx-lm's `Indexer`: scores every cached position for each query from the low-rank
/// query (`qr`) and a single normalized key per position, and returns the indices of
/// the `index_topk` best (`None` while no more than that many are cached).
#[derive(Debug)]
pub struct Indexer {
    wq_b: LinearLayer,
    wk: LinearLayer,
    k_norm: LayerNorm,
    weights_proj: LinearLayer,
    rope: Rope,
    n_heads: i32,
    head_dim: i32,
    index_topk: i32,
    softmax_scale: f64,
}
impl_module!(Indexer {
    wq_b,
    wk,
    k_norm,
    weights_proj
});

impl Indexer {
    pub(crate) fn new(args: &ModelArgs, ix: &IndexerArgs) -> crate::Result<Indexer> {
        let q_lora_rank = args.q_lora_rank.ok_or_else(|| crate::Error::Config {
            path: "config.json (deepseek_v32)".into(),
            message: "key `q_lora_rank` must be a number (the indexer reads the low-rank query)"
                .into(),
        })?;
        if ix.index_topk <= 0 || ix.index_n_heads <= 0 || ix.index_head_dim <= 0 {
            return Err(crate::Error::Config {
                path: "config.json (deepseek_v32)".into(),
                message: "keys `index_topk`, `index_n_heads` and `index_head_dim` must be positive"
                    .into(),
            });
        }
        let (dim, heads, head_dim) = (args.hidden_size, ix.index_n_heads, ix.index_head_dim);
        let scaling = rope_scaling(args.rope_scaling.as_ref())?;
        Ok(Indexer {
            wq_b: LinearLayer::new(q_lora_rank, heads * head_dim, false)?,
            wk: LinearLayer::new(dim, head_dim, false)?,
            k_norm: LayerNorm::new(head_dim, 1e-5, true, true)?,
            weights_proj: LinearLayer::new(dim, heads, false)?,
            rope: initialize_rope(
                args.qk_rope_head_dim,
                args.rope_theta,
                ix.indexer_rope_interleave,
                scaling.as_ref(),
                Some(args.max_position_embeddings),
            )?,
            n_heads: heads,
            head_dim,
            index_topk: ix.index_topk,
            softmax_scale: (head_dim as f64).powf(-0.5),
        })
    }

    /// The top-k positions `[B, 1, L, index_topk]` for the queries of `x` (`qr` their
    /// low-rank query), or `None` while the cache holds at most `index_topk` positions;
    /// with a cache, also its updated keys and values (for the caller to depend on).
    pub(crate) fn forward(
        &self,
        x: &Array,
        qr: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<(Option<Array>, Vec<Array>)> {
        let (b, s) = (x.dim(0)?, x.dim(1)?);
        let q = self
            .wq_b
            .forward(qr)?
            .reshape(&[b, s, self.n_heads, self.head_dim])?
            .swapaxes(1, 2)?;
        let k = self.k_norm.forward(&self.wk.forward(x)?)?;
        let k = k.reshape(&[b, 1, s, self.head_dim])?;
        let mut state = Vec::new();
        let k = match cache {
            Some(c) => {
                let offset = c.rope_offset()?;
                let q = self.rope.forward_at(&q, offset.as_rope_offset())?;
                let k = self.rope.forward_at(&k, offset.as_rope_offset())?;
                // mlx-lm stores the keys as values too, then zeros the values.
                let zeros = ops::zeros_like(&k)?;
                match mlx_nn::pipeline::update_and_fetch(c, &k, &zeros)? {
                    KvFetch::Plain { keys, values } => {
                        state = vec![keys.clone(), values];
                        (q, keys)
                    }
                    KvFetch::Quantized { .. } => {
                        return Err(mlx_array::Error::InvalidArgument(
                            "the deepseek_v32 indexer cannot read a quantized cache".into(),
                        ))
                    }
                }
            }
            None => (self.rope.forward(&q, 0)?, self.rope.forward(&k, 0)?),
        };
        let (q, k) = k;
        let t = k.dim(2)?;
        if t <= self.index_topk {
            return Ok((None, state));
        }
        let scores = q.matmul(&k.swapaxes(-1, -2)?)?.maximum(0.0)?;
        let scale = (self.n_heads as f64).powf(-0.5) * self.softmax_scale;
        let weights = self.weights_proj.forward(x)?.multiply(scale)?;
        let weights = weights.swapaxes(-1, -2)?.expand_dims(&[-1])?;
        let scores = scores.multiply(&weights)?;
        let mut scores = if s > 1 {
            // mlx-lm sums the heads one by one (Python's `sum`, from 0).
            let mut acc = scores.slice_axis(1, 0, 1)?.add(0.0)?;
            for h in 1..self.n_heads {
                acc = acc.add(&scores.slice_axis(1, h, h + 1)?)?;
            }
            acc
        } else {
            scores.sum(Some(&[1]), true)?
        };
        if let AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } = mask {
            let neg_inf = Array::scalar_f64(f64::NEG_INFINITY, scores.dtype())?;
            scores = ops::where_(m, &scores, &neg_inf)?;
        }
        let kth = -self.index_topk;
        let inds = scores.argpartition(kth, Some(-1))?;
        Ok((
            Some(inds.slice_axis(-1, t - self.index_topk, t)?),
            state,
        ))
    }
}

/// Restricts attention to the indexer's `topk` positions: for one query, the latent
/// keys, rotary keys and mask gathered at them; for several, a mask of them.
pub(crate) fn apply_topk(
    topk: &Array,
    kv_latent: Array,
    k_pe: Array,
    mask: AttnMask,
    l: i32,
) -> Result<(Array, Array, AttnMask)> {
    if l == 1 {
        let idx = topk.slice_axis(2, 0, 1)?.squeeze(Some(&[2]))?.expand_dims(&[-1])?;
        let gather = |a: &Array| -> Result<Array> {
            let mut shape = idx.shape();
            if let Some(last) = shape.last_mut() {
                *last = a.dim(-1)?;
            }
            a.take_along_axis(&idx.broadcast_to(&shape)?, 2)
        };
        let mask = match mask {
            AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } => {
                AttnMask::Array(m.take_along_axis(topk, -1)?)
            }
            other => other,
        };
        Ok((gather(&kv_latent)?, gather(&k_pe)?, mask))
    } else {
        let mut shape = topk.shape();
        if let Some(last) = shape.last_mut() {
            *last = kv_latent.dim(2)?;
        }
        let sparse = ops::zeros(&shape, Dtype::Bool)?;
        let sparse = sparse.put_along_axis(topk, &Array::scalar(true)?, -1)?;
        let sparse = match mask {
            AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } => sparse.logical_and(&m)?,
            _ => sparse,
        };
        Ok((kv_latent, k_pe, AttnMask::Array(sparse)))
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "deepseek_v32")?;
    let ix: IndexerArgs = parse_args(config, "deepseek_v32")?;
    Ok(Box::new(Model::with_indexer(
        args,
        Flavor::DeepseekV32,
        Some(&ix),
    )?))
}
