//! LFM2-MoE (`lfm2_moe`), following `mlx_lm/models/lfm2_moe.py`: the LFM2 stack of
//! [`super::lfm2`] (gated short convolutions and attention layers) whose first
//! `num_dense_layers` feed-forward blocks are SwiGLU MLPs and the rest sigmoid-routed
//! top-k experts ([`SparseMoe`]: an optional `expert_bias` only for choosing them, the
//! weights from the unbiased scores, normalized and scaled). `sanitize` renames
//! `w1` / `w2` / `w3` and stacks the experts.
use super::decoder::{stack_experts, GLU_EXPERT_PROJS};
use super::lfm2::{FeedForward, Model, ModelArgs as Lfm2Args};
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::parse_args;
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::{impl_module, LinearLayer, Param, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

fn one() -> f64 {
    1.0
}

/// The MoE keys of config.json (mlx-lm requires all but `routed_scaling_factor`).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct MoeArgs {
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub norm_topk_prob: bool,
    pub use_expert_bias: bool,
    pub num_dense_layers: i32,
    #[serde(default = "one")]
    pub routed_scaling_factor: f64,
}

/// mlx-lm's `Lfm2MoeSparseMoeBlock`.
#[derive(Debug)]
pub struct SparseMoe {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    expert_bias: Option<Param>,
    top_k: i32,
    norm_topk_prob: bool,
    routed_scaling_factor: f64,
}
impl_module!(SparseMoe {
    gate,
    switch_mlp,
    expert_bias
});

impl SparseMoe {
    fn new(a: &MoeArgs) -> crate::Result<SparseMoe> {
        if a.num_experts_per_tok <= 0 || a.num_experts_per_tok > a.num_experts {
            return Err(crate::Error::Config {
                path: "config.json (lfm2_moe)".into(),
                message: format!(
                    "num_experts_per_tok must be in 1..={}, got {}",
                    a.num_experts, a.num_experts_per_tok
                ),
            });
        }
        let bias = a
            .use_expert_bias
            .then(|| ops::zeros(&[a.num_experts], Dtype::Float32).map(Param::new))
            .transpose()?;
        Ok(SparseMoe {
            gate: LinearLayer::new(a.hidden_size, a.num_experts, false)?,
            switch_mlp: SwitchGlu::new(
                a.hidden_size,
                a.moe_intermediate_size,
                a.num_experts,
                false,
            )?,
            expert_bias: bias,
            top_k: a.num_experts_per_tok,
            norm_topk_prob: a.norm_topk_prob,
            routed_scaling_factor: a.routed_scaling_factor,
        })
    }

    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        let routing = self.gate.forward(x)?.sigmoid()?;
        let k = self.top_k;
        let n = routing.dim(-1)?;
        let inds = match &self.expert_bias {
            Some(bias) => routing.astype(Dtype::Float32)?.add(bias)?,
            None => routing.clone(),
        }
        .argpartition(-k, Some(-1))?
        .slice_axis(-1, n - k, n)?
        .stop_gradient()?;
        let mut scores = routing.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(&scores.sum(Some(&[-1]), true)?.add(1e-6)?)?;
        }
        let scores = scores
            .multiply(self.routed_scaling_factor)?
            .astype(x.dtype())?;
        let y = self.switch_mlp.forward(x, &inds)?;
        y.multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)
    }
}

/// The LFM2 keys LFM2-MoE does not have: its dense blocks are plain `intermediate_size`
/// SwiGLU MLPs.
fn lfm2_args(config: &Value) -> crate::Result<Lfm2Args> {
    let mut c = config.clone();
    if let Some(m) = c.as_object_mut() {
        let hidden = m.get("hidden_size").cloned().unwrap_or(Value::Null);
        m.insert("block_dim".into(), hidden);
        m.insert("block_multiple_of".into(), 1.into());
        m.insert("block_auto_adjust_ff_dim".into(), false.into());
        m.insert("block_ffn_dim_multiplier".into(), Value::Null);
    }
    parse_args(&c, "lfm2_moe")
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let moe: MoeArgs = parse_args(config, "lfm2_moe")?;
    let args = lfm2_args(config)?;
    let ffn = |a: &Lfm2Args, i: i32| -> crate::Result<FeedForward> {
        Ok(if i < moe.num_dense_layers {
            FeedForward::Glu(Box::new(Mlp::new(a.hidden_size, moe.intermediate_size, false)?))
        } else {
            FeedForward::Moe(Box::new(SparseMoe::new(&moe)?))
        })
    };
    Ok(Box::new(
        Model::with_feed_forward(args, &ffn)?.with_experts(moe.num_experts),
    ))
}

/// mlx-lm's `sanitize` beyond LFM2's: `w1` / `w2` / `w3` become `gate_proj` /
/// `down_proj` / `up_proj` and the experts are stacked.
pub(crate) fn sanitize(weights: Weights, n_experts: i32, n_layers: i32) -> crate::Result<Weights> {
    let mut out: Weights = weights
        .into_iter()
        .map(|(k, v)| {
            let mut k = k;
            for (old, new) in [
                ("w1.weight", "gate_proj.weight"),
                ("w2.weight", "down_proj.weight"),
                ("w3.weight", "up_proj.weight"),
            ] {
                if k.contains(old) {
                    k = k.replace(old, new);
                }
            }
            (k, v)
        })
        .collect();
    stack_experts(
        &mut out,
        n_layers,
        |l| format!("model.layers.{l}.feed_forward"),
        GLU_EXPERT_PROJS,
        &["weight"],
        n_experts,
    )?;
    Ok(out)
}
