//! Lille 130M (`lille-130m`), following `mlx_lm/models/lille-130m.py`: the shared
//! decoder under Lille's names (`transformer.tok_embeddings`,
//! `transformer.layers.{i}.attention` / `feed_forward`, `transformer.norm`), each
//! block's pre-norm held inside it (`attention.norm`, `feed_forward.norm`). Attention
//! reads q, k and v from one bias-free `qkv_proj` (`n_head` query and `n_kv_heads`
//! key-value heads of `n_embd / n_head`), rotates them with traditional RoPE at
//! `rope_theta` and projects back through `out_proj`; the SwiGLU MLP is
//! `256 * round(int(8 * n_embd / 3) / 256)` wide. The head is always the embedding
//! (mlx-lm reads `tie_word_embeddings` but never an `lm_head`). `sanitize` drops the
//! `rotary_emb` buffers.
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::{DecoderLm, LmDims};
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::{default_true, parse_args};
use mlx_nn::Rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Lille (those without a default are required, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs, dead_code)]
pub struct ModelArgs {
    pub model_type: String,
    pub block_size: i32,
    pub layer_norm_eps: f64,
    pub n_embd: i32,
    pub n_head: i32,
    pub n_kv_heads: i32,
    pub n_layer: i32,
    pub rope_theta: f64,
    pub vocab_size: i32,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn config_err(message: &str) -> crate::Error {
    crate::Error::Config {
        path: "config.json (lille-130m)".into(),
        message: message.into(),
    }
}

/// The MLP width, mlx-lm's `256 * round(int(8 * n_embd / 3) / 256)`: a truncated
/// true division, then Python's `round` (half to even).
fn mlp_width(n_embd: i32) -> i32 {
    let third = (8.0 * n_embd as f64 / 3.0).trunc();
    256 * (third / 256.0).round_ties_even() as i32
}

/// The attention block: the fused `qkv_proj`, traditional RoPE, `out_proj`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    if args.n_head <= 0 {
        return Err(config_err("key `n_head` must be positive"));
    }
    let head_dim = args.n_embd / args.n_head;
    let d = AttentionDims {
        dim: args.n_embd,
        n_heads: args.n_head,
        n_kv_heads: args.n_kv_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let rope = Rope::new(head_dim, true, args.rope_theta, 1.0);
    Ok(
        Attention::new_joint_qkv(d, "qkv_proj", rope, (head_dim as f64).powf(-0.5))?
            .with_out_name("out_proj"),
    )
}

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "lille-130m")?;
    let (dim, eps) = (args.n_embd, args.layer_norm_eps);
    let d = LmDims {
        model_type: args.model_type.clone(),
        vocab: args.vocab_size,
        dim,
        eps,
        layers: args.n_layer,
        tied: true,
    };
    let hidden = mlp_width(dim);
    let model = Model::new(d, args, |args, _| {
        let mlp = Mlp::new(dim, hidden, false)?;
        Ok(DecoderLayer::new(attention(args)?, mlp, "feed_forward", dim, eps)?
            .with_attn_name("attention")
            .with_norm_names("attention.norm", "feed_forward.norm")
            .norms_before_mlp())
    })?
    .with_model_name("transformer")
    .with_stack_names("tok_embeddings", "layers", "norm");
    Ok(Box::new(model))
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.contains("rotary_emb"))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

#[cfg(test)]
mod tests {
    use super::mlp_width;

    #[test]
    fn mlp_width_rounds_as_mlx_lm() {
        // Python: 256 * round(int(8 * n / 3) / 256) for n = 768, 64, 48 (0.5 rounds to
        // even: 0), 32, 96, 144 (1.5 rounds to 2).
        assert_eq!(mlp_width(768), 2048);
        assert_eq!(mlp_width(64), 256);
        assert_eq!(mlp_width(48), 0);
        assert_eq!(mlp_width(32), 0);
        assert_eq!(mlp_width(96), 256);
        assert_eq!(mlp_width(144), 512);
    }
}
