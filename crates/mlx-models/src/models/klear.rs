//! Klear (`Klear`), following `mlx_lm/models/Klear.py`: Qwen3-shaped attention (per-head
//! q/k RMS norms before a plain RoPE, every projection biased by `attention_bias`, heads
//! of `hidden_size / num_attention_heads`) on the shared decoder, and in the layers that
//! `decoder_sparse_step` picks (outside `mlp_only_layers`) experts chosen by sigmoid
//! scores plus `expert_bias`, mixed with the shared experts by a softmax over a biased
//! `coefficient` projection; the other layers a SwiGLU MLP. The head is always untied;
//! `expert_bias` keeps its dtype (`cast_predicate`) and the router its 8 bits
//! (`quant_predicate`, in mlx-quant).
use super::config_error;
use super::attention::{Attention, AttentionDims};
use super::decoder::{stack_experts_into, DecoderLayer, DenseOrMoe, FeedForward, LINEAR_KINDS};
use super::lm::{DecoderLm, LmDims};
use super::mlp::Mlp;
use super::{top_k_indices_of_negated, weigh_experts, Architecture, Weights};
use crate::config::parse_args;
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::{impl_module, initialize_rope, LinearLayer, Param, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Klear (all required, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub attention_bias: bool,
    pub mlp_only_layers: Vec<i32>,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    pub n_shared_experts: i32,
    pub moe_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub rope_theta: f64,
    pub max_position_embeddings: i32,
    pub norm_topk_prob: bool,
}

/// `KlearSparseMoeBlock`.
#[derive(Debug)]
pub struct Moe {
    gate: LinearLayer,
    experts: SwitchGlu,
    shared_experts: Mlp,
    coefficient: LinearLayer,
    expert_bias: Param,
    top_k: i32,
    norm_topk_prob: bool,
}
impl_module!(Moe {
    gate,
    experts,
    shared_experts,
    coefficient,
    expert_bias
});

impl Moe {
    fn new(args: &ModelArgs) -> crate::Result<Moe> {
        let (dim, n) = (args.hidden_size, args.num_experts);
        let k = args.num_experts_per_tok;
        if k < 1 || k > n {
            return Err(config_error("Klear", format!(
                "key `num_experts_per_tok` must be between 1 and `num_experts` ({n}), got {k}"
            )));
        }
        let shared = args.moe_intermediate_size * args.n_shared_experts;
        Ok(Moe {
            gate: LinearLayer::new(dim, n, false)?,
            experts: SwitchGlu::new(dim, args.moe_intermediate_size, n, false)?,
            shared_experts: Mlp::new(dim, shared, false)?,
            coefficient: LinearLayer::new(dim, 2, true)?,
            expert_bias: Param::new(ops::zeros(&[n], Dtype::Float32)?),
            top_k: k,
            norm_topk_prob: args.norm_topk_prob,
        })
    }
}

impl FeedForward for Moe {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let routing = self.gate.forward(x)?.astype(Dtype::Float32)?.sigmoid()?;
        let biased = routing.add(&self.expert_bias.reshape(&[1, 1, -1])?)?;
        let inds = top_k_indices_of_negated(&biased, self.top_k)?;
        let mut scores = routing.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(&scores.sum(Some(&[-1]), true)?)?;
        }
        let scores = scores.astype(x.dtype())?;
        let y_experts = weigh_experts(&self.experts.forward(x, &inds)?, &scores)?;
        let coef = self
            .coefficient
            .forward(x)?
            .softmax(Some(&[-1]), true)?;
        let shared = self.shared_experts.forward(x, None)?;
        let y = y_experts
            .multiply(&coef.slice_axis(-1, 0, 1)?)?
            .add(&shared.multiply(&coef.slice_axis(-1, 1, 2)?)?)?;
        super::decoder::add_residual(y, residual)
    }
    fn fuse(&mut self) -> crate::Result<()> {
        self.shared_experts.fuse()
    }
}

/// Klear: the shared decoder with dense or expert layers and an untied head.
pub type Model = DecoderLm<ModelArgs, DenseOrMoe<Moe>>;

/// The attention: per-head q/k norms before `nn.RoPE(head_dim, base=rope_theta)`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    if n_heads <= 0 {
        return Err(config_error("Klear", 
            "key `num_attention_heads` must be positive".into(),
        ));
    }
    let head_dim = args.hidden_size / n_heads;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: args.attention_bias,
    };
    let rope = initialize_rope(head_dim, args.rope_theta, false, None, None)?;
    Attention::with_rms_head_norms(d, rope, args.rms_norm_eps)
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "Klear")?;
    if args.num_experts > 0 && args.decoder_sparse_step <= 0 {
        return Err(config_error("Klear", 
            "key `decoder_sparse_step` must be positive with experts".into(),
        ));
    }
    let d = LmDims {
        model_type: args.model_type.clone(),
        vocab: args.vocab_size,
        dim: args.hidden_size,
        eps: args.rms_norm_eps,
        layers: args.num_hidden_layers,
        tied: false,
    };
    let model = DecoderLm::new(d, args, |args, i| {
        let sparse = !args.mlp_only_layers.contains(&i)
            && args.num_experts > 0
            && (i + 1) % args.decoder_sparse_step == 0;
        let mlp = match sparse {
            true => DenseOrMoe::Moe(Box::new(Moe::new(args)?)),
            false => DenseOrMoe::Dense(Box::new(Mlp::new(
                args.hidden_size,
                args.intermediate_size,
                false,
            )?)),
        };
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model.keeping_dtype("expert_bias")))
}

impl Architecture for Model {
    /// Stacks each expert layer's `experts.{e}.{gate,up,down}_proj.weight` into
    /// `experts.{proj}.weight`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        let names = [
            ("gate_proj", "gate_proj"),
            ("up_proj", "up_proj"),
            ("down_proj", "down_proj"),
        ];
        stack_experts_into(
            &mut weights,
            self.args.num_hidden_layers,
            |l| format!("model.layers.{l}.mlp"),
            ("experts", "experts"),
            &names,
            &LINEAR_KINDS[..1],
            self.args.num_experts,
        )?;
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
