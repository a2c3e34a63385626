//! DBRX (`dbrx`), following `mlx_lm/models/dbrx.py`: `transformer.wte`, `blocks` of a
//! `norm_attn_norm` (bias-free layer norms around attention through a fused `Wqkv`
//! clipped to `clip_qkv`, queries the first `d_model` columns) and an `ffn` of softmax
//! top-k experts (their scores renormalized by their L1 norm) that are separate gated
//! MLPs (`w2(swiglu(w1(x), v1(x)))`), run as mlx-lm runs them outside training: token
//! by token, each chosen expert on that token's vector, the outputs stacked on a last
//! axis and weighted; then `norm_f` and an untied `lm_head`. `sanitize` splits HF's
//! fused `experts.mlp.{w1, v1, w2}` into the experts (`w2`'s parts transposed).
use super::lm::even_head_dim;
use super::{batch_len, cache_at, layer_caches, merge_heads, rope_attend, split_heads};
use super::{Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    activations, impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, LinearLayer, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// `attn_config`'s keys mlx-lm reads (all required).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct AttnConfig {
    pub kv_n_heads: i32,
    pub clip_qkv: f64,
    pub rope_theta: f64,
}

/// `ffn_config`'s keys mlx-lm reads (all required).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct FfnConfig {
    pub ffn_hidden_size: i32,
    pub moe_num_experts: i32,
    pub moe_top_k: i32,
}

/// config.json keys read by DBRX (all required, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub d_model: i32,
    pub ffn_config: FfnConfig,
    pub attn_config: AttnConfig,
    pub n_layers: i32,
    pub n_heads: i32,
}

fn config_err(message: String) -> crate::Error {
    crate::Error::Config {
        path: "config.json (dbrx)".into(),
        message,
    }
}

/// Attention through the fused, clipped `Wqkv`.
#[derive(Debug)]
pub struct DbrxAttention {
    wqkv: LinearLayer,
    out_proj: LinearLayer,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    d_model: i32,
    clip_qkv: f64,
    scale: f64,
}
impl_module!(DbrxAttention { wqkv as "Wqkv", out_proj });

impl DbrxAttention {
    fn new(args: &ModelArgs) -> crate::Result<DbrxAttention> {
        let (dim, heads) = (args.d_model, args.n_heads);
        let head_dim = even_head_dim(dim, heads, "dbrx")?;
        let kv = args.attn_config.kv_n_heads;
        Ok(DbrxAttention {
            wqkv: LinearLayer::new(dim, (kv * 2 + heads) * head_dim, false)?,
            out_proj: LinearLayer::new(dim, dim, false)?,
            rope: Rope::new(head_dim, false, args.attn_config.rope_theta, 1.0),
            n_heads: heads,
            n_kv_heads: kv,
            head_dim,
            d_model: dim,
            clip_qkv: args.attn_config.clip_qkv,
            scale: (head_dim as f64).powf(-0.5),
        })
    }

    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let qkv = self.wqkv.forward(x)?;
        let dtype = qkv.dtype();
        let lo = Array::scalar_f64(-self.clip_qkv, dtype)?;
        let hi = Array::scalar_f64(self.clip_qkv, dtype)?;
        let qkv = qkv.clip(Some(&lo), Some(&hi))?;
        let splits = [self.d_model, self.d_model + self.head_dim * self.n_kv_heads];
        let parts = qkv.split_at(&splits, -1)?;
        let [q, k, v] = <[Array; 3]>::try_from(parts).map_err(|_| {
            mlx_array::Error::InvalidArgument("dbrx Wqkv: expected three parts".into())
        })?;
        let (b, l) = batch_len(x)?;
        let out = rope_attend(
            &split_heads(&q, b, l, self.n_heads)?,
            &split_heads(&k, b, l, self.n_kv_heads)?,
            split_heads(&v, b, l, self.n_kv_heads)?,
            &self.rope,
            cache,
            self.scale,
            mask,
        )?;
        self.out_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// `norm_1`, attention, the residual, `norm_2`.
#[derive(Debug)]
pub struct NormAttnNorm {
    norm_1: LayerNorm,
    norm_2: LayerNorm,
    attn: DbrxAttention,
}
impl_module!(NormAttnNorm {
    norm_1,
    norm_2,
    attn
});

/// One expert: `w2(swiglu(w1(x), v1(x)))`.
#[derive(Debug)]
pub struct Expert {
    v1: LinearLayer,
    w1: LinearLayer,
    w2: LinearLayer,
}
impl_module!(Expert { v1, w1, w2 });

impl Expert {
    fn forward(&self, x: &Array) -> Result<Array> {
        let h = activations::swiglu(&self.w1.forward(x)?, &self.v1.forward(x)?)?;
        self.w2.forward(&h)
    }
}

/// The router (`router.layer`).
#[derive(Debug)]
pub struct Router {
    layer: LinearLayer,
}
impl_module!(Router { layer });

/// Softmax top-k over separate experts, evaluated token by token.
#[derive(Debug)]
pub struct SparseMoeBlock {
    router: Router,
    experts: Vec<Expert>,
    top_k: i32,
}
impl_module!(SparseMoeBlock { router, experts });

impl SparseMoeBlock {
    fn forward(&self, x: &Array) -> Result<Array> {
        let ne = self.top_k;
        let shape = x.shape();
        let x = x.reshape(&[-1, x.dim(-1)?])?;
        let gates = self
            .router
            .layer
            .forward(&x)?
            .astype(Dtype::Float32)?
            .softmax(Some(&[-1]), false)?;
        let inds = gates
            .negative()?
            .argpartition(ne - 1, Some(-1))?
            .slice_axis(-1, 0, ne)?
            .stop_gradient()?;
        let scores = gates.take_along_axis(&inds, -1)?;
        // `mx.linalg.norm(scores, ord=1, axis=-1, keepdims=True)`: the sum of absolute
        // values.
        let l1 = scores.abs()?.sum(Some(&[-1]), true)?;
        let scores = scores.divide(&l1)?.astype(x.dtype())?;
        // mlx-lm's `inds.tolist()`: the choices read back to pick each token's experts.
        let chosen = inds.astype(Dtype::Int32)?.to_vec::<i32>()?;
        let n = x.dim(0)?;
        let mut rows = Vec::with_capacity(n as usize);
        for t in 0..n {
            let xt = x.slice_axis(0, t, t + 1)?.squeeze(Some(&[0]))?;
            let st = scores.slice_axis(0, t, t + 1)?.squeeze(Some(&[0]))?;
            let mut outs = Vec::with_capacity(ne as usize);
            for j in 0..ne {
                let e = chosen[(t * ne + j) as usize];
                let expert = usize::try_from(e)
                    .ok()
                    .and_then(|e| self.experts.get(e))
                    .ok_or_else(|| {
                        mlx_array::Error::InvalidArgument(format!("dbrx router chose expert {e}"))
                    })?;
                outs.push(expert.forward(&xt)?);
            }
            let refs: Vec<&Array> = outs.iter().collect();
            let yt = ops::stack(&refs, -1)?;
            rows.push(yt.multiply(&st)?.sum(Some(&[-1]), false)?);
        }
        let refs: Vec<&Array> = rows.iter().collect();
        ops::stack(&refs, 0)?.reshape(&shape)
    }
}

/// One block: `ffn(h) + r` where `(r, h)` are attention's residual stream and its norm.
#[derive(Debug)]
pub struct DecoderLayer {
    ffn: SparseMoeBlock,
    norm_attn_norm: NormAttnNorm,
}
impl_module!(DecoderLayer {
    ffn,
    norm_attn_norm
});

impl DecoderLayer {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let na = &self.norm_attn_norm;
        let h = na.attn.forward(&na.norm_1.forward(x)?, mask, cache)?;
        let r = h.add(x)?;
        let h = na.norm_2.forward(&r)?;
        self.ffn.forward(&h)?.add(&r)
    }
}

/// `transformer`: the embedding, the blocks and the final norm.
#[derive(Debug)]
pub struct Dbrx {
    wte: EmbeddingLayer,
    blocks: Vec<DecoderLayer>,
    norm_f: LayerNorm,
}
impl_module!(Dbrx {
    wte,
    blocks,
    norm_f
});

/// DBRX with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    transformer: Dbrx,
    lm_head: LinearLayer,
}
impl_module!(Model {
    transformer,
    lm_head
});

impl Model {
    /// Builds the model (zero placeholders) from parsed arguments.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let dim = args.d_model;
        let f = &args.ffn_config;
        if f.moe_top_k < 1 || f.moe_top_k > f.moe_num_experts {
            return Err(config_err(format!(
                "key `ffn_config.moe_top_k` must be between 1 and `moe_num_experts` ({}), got {}",
                f.moe_num_experts, f.moe_top_k
            )));
        }
        let blocks = (0..args.n_layers)
            .map(|_| {
                let experts = (0..f.moe_num_experts)
                    .map(|_| {
                        Ok(Expert {
                            v1: LinearLayer::new(dim, f.ffn_hidden_size, false)?,
                            w1: LinearLayer::new(dim, f.ffn_hidden_size, false)?,
                            w2: LinearLayer::new(f.ffn_hidden_size, dim, false)?,
                        })
                    })
                    .collect::<crate::Result<Vec<_>>>()?;
                Ok(DecoderLayer {
                    ffn: SparseMoeBlock {
                        router: Router {
                            layer: LinearLayer::new(dim, f.moe_num_experts, false)?,
                        },
                        experts,
                        top_k: f.moe_top_k,
                    },
                    norm_attn_norm: NormAttnNorm {
                        norm_1: LayerNorm::new(dim, 1e-5, true, false)?,
                        norm_2: LayerNorm::new(dim, 1e-5, true, false)?,
                        attn: DbrxAttention::new(&args)?,
                    },
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(Model {
            transformer: Dbrx {
                wte: EmbeddingLayer::new(args.vocab_size, dim)?,
                blocks,
                norm_f: LayerNorm::new(dim, 1e-5, true, false)?,
            },
            lm_head: LinearLayer::new(dim, args.vocab_size, false)?,
            args,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "dbrx")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let t = &self.transformer;
        let mut h = t.wte.forward(tokens)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (block, cache) in t.blocks.iter().zip(layer_caches(caches, t.blocks.len())?) {
            h = mlx_nn::checkpoint::layer(block, &h, &mask, cache, |b, x, m, c| {
                b.forward(x, m, c)
            })?;
        }
        let h = t.norm_f.forward(&h)?;
        self.lm_head.forward(&h)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.transformer.blocks.len()]
    }
    decoder_accessors!(transformer.blocks);
}

impl Architecture for Model {
    /// HF's fused `*.experts.mlp.{w1, v1, w2}` (`[experts * ffn, d_model]`) split into
    /// `*.experts.{e}.{w1, v1, w2}.weight`, `w2`'s parts transposed.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let n = self.args.ffn_config.moe_num_experts;
        let mut out = Weights::new();
        for (k, v) in weights {
            if !k.contains("experts.mlp") {
                out.insert(k, v);
                continue;
            }
            for (e, part) in v.split_sections(n, 0)?.into_iter().enumerate() {
                let part = if k.ends_with("w2") {
                    part.transpose(None)?
                } else {
                    part
                };
                out.insert(k.replace(".mlp", &format!(".{e}")) + ".weight", part);
            }
        }
        Ok(out)
    }
}
