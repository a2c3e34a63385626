//! OpenELM (`openelm`), following `mlx_lm/models/openelm.py`: the shared decoder under
//! OpenELM's names (`transformer.token_embeddings`, `transformer.layers.{i}.attn_norm` /
//! `attn` / `ffn_norm` / `ffn`, `transformer.norm`) with per-layer sizes: layer `i` has
//! `num_query_heads[i]` query and `num_kv_heads[i]` key-value heads of `head_dim`, from
//! one bias-free `qkv_proj` split by heads, per-head `q_norm` / `k_norm` where
//! `normalize_qk_projections`, non-traditional RoPE at `rope_freq_constant`, and a SwiGLU
//! MLP (fused `proj_1`, then `proj_2`) `make_divisible(ffn_multipliers[i] * model_dim,
//! ffn_dim_divisor)` wide. The head is the embedding where `share_input_output_layers`.
use super::config_error;
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::decoder::DecoderLayer;
use super::lm::{DecoderLm, LmDims};
use super::mlp::GateUpMlp;
use super::Architecture;
use crate::config::{default_true, parse_args};
use mlx_nn::{RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by OpenELM (those without a default are required, as in
/// mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs, dead_code)]
pub struct ModelArgs {
    pub model_type: String,
    pub head_dim: i32,
    pub num_transformer_layers: i32,
    pub model_dim: i32,
    pub vocab_size: i32,
    pub ffn_dim_divisor: i32,
    pub num_query_heads: Vec<i32>,
    pub num_kv_heads: Vec<i32>,
    pub ffn_multipliers: Vec<f64>,
    #[serde(default = "default_true")]
    ffn_with_glu: bool,
    #[serde(default = "default_true")]
    pub normalize_qk_projections: bool,
    #[serde(default = "default_true")]
    pub share_input_output_layers: bool,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_freq_constant")]
    pub rope_freq_constant: f64,
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}
fn default_rope_freq_constant() -> f64 {
    10000.0
}

/// mlx-lm's `make_divisible(v, divisor)` (from the TF MobileNet code): `v` rounded to
/// the nearest multiple of `divisor`, at least `divisor`, and at most 10% below `v`.
fn make_divisible(v: f64, divisor: i32) -> crate::Result<i32> {
    if divisor == 0 {
        return Err(config_error("openelm", "key `ffn_dim_divisor` must not be 0".into()));
    }
    let d = divisor as i64;
    // `int(v + divisor / 2) // divisor * divisor`: truncation, then floor division.
    let rounded = ((v + divisor as f64 / 2.0).trunc() as i64).div_euclid(d) * d;
    let mut new_v = rounded.max(d);
    if (new_v as f64) < 0.9 * v {
        new_v += d;
    }
    i32::try_from(new_v).map_err(|_| config_error("openelm", format!("FFN width {new_v} is out of range")))
}

/// Entry `i` of the per-layer list `key` (mlx-lm's `IndexError` as a config error).
fn per_layer<T: Copy>(list: &[T], i: i32, key: &str) -> crate::Result<T> {
    usize::try_from(i)
        .ok()
        .and_then(|i| list.get(i).copied())
        .ok_or_else(|| {
            config_error("openelm", format!(
                "key `{key}` has {} entries, fewer than `num_transformer_layers`",
                list.len()
            ))
        })
}

/// Layer `i`'s attention: the bias-free fused `qkv_proj`, the per-head norms, `out_proj`.
fn attention(args: &ModelArgs, i: i32) -> crate::Result<Attention> {
    let head_dim = args.head_dim;
    let d = AttentionDims {
        dim: args.model_dim,
        n_heads: per_layer(&args.num_query_heads, i, "num_query_heads")?,
        n_kv_heads: per_layer(&args.num_kv_heads, i, "num_kv_heads")?,
        head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let rope = Rope::new(head_dim, false, args.rope_freq_constant, 1.0);
    let attn = Attention::new_joint_qkv(d, "qkv_proj", rope, (head_dim as f64).powf(-0.5))?
        .with_out_name("out_proj");
    if !args.normalize_qk_projections {
        return Ok(attn);
    }
    let eps = args.rms_norm_eps;
    attn.with_qk_norms(NormAt::SplitHeads, |n| {
        Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?))
    })
}

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, GateUpMlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "openelm")?;
    if args.vocab_size <= 0 {
        return Err(config_error("openelm", "key `vocab_size` must be positive".into()));
    }
    let (dim, eps) = (args.model_dim, args.rms_norm_eps);
    let d = LmDims {
        model_type: args.model_type.clone(),
        vocab: args.vocab_size,
        dim,
        eps,
        layers: args.num_transformer_layers,
        tied: args.share_input_output_layers,
    };
    let model = Model::new(d, args, |args, i| {
        let multiplier = per_layer(&args.ffn_multipliers, i, "ffn_multipliers")?;
        let hidden = make_divisible(multiplier * dim as f64, args.ffn_dim_divisor)?;
        let mlp = GateUpMlp::new(dim, hidden, ["proj_1", "proj_2"])?;
        Ok(DecoderLayer::new(attention(args, i)?, mlp, "ffn", dim, eps)?
            .with_attn_name("attn")
            .with_norm_names("attn_norm", "ffn_norm"))
    })?
    .with_model_name("transformer")
    .with_stack_names("token_embeddings", "layers", "norm");
    Ok(Box::new(model))
}

impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

#[cfg(test)]
mod tests {
    use super::make_divisible;

    #[test]
    fn make_divisible_rounds_as_mlx_lm() {
        // Python: make_divisible(0.5 * 1280, 256) == 768, (4.0 * 1280, 256) == 5120,
        // (0.5 * 64, 8) == 32, (1.3 * 64, 16) == 80, (0.1 * 10, 8) == 8.
        assert_eq!(make_divisible(640.0, 256).unwrap(), 768);
        assert_eq!(make_divisible(5120.0, 256).unwrap(), 5120);
        assert_eq!(make_divisible(32.0, 8).unwrap(), 32);
        assert_eq!(make_divisible(1.3 * 64.0, 16).unwrap(), 80);
        assert_eq!(make_divisible(1.0, 8).unwrap(), 8);
    }
}
