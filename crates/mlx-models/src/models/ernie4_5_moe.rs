//! ERNIE 4.5 MoE, following `mlx_lm/models/ernie4_5_moe.py`: ERNIE 4.5's layers, the
//! feed-forward of every `moe_layer_interval`-th layer between the start and end indices
//! being softmax- (or sigmoid-) gated top-k SwitchGLU experts plus optional shared
//! experts.
use super::decoder::{add_residual, stack_experts, Decoder, DecoderLayer, DenseOrMoe, FeedForward};
use super::ernie4_5::{self, attention};
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{top_k_indices_of_negated, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::{impl_module, KvCache, LinearLayer, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// An index that configs give as one number or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One index.
    One(i32),
    /// Several (mlx-lm takes the min of a start list, the max of an end list).
    Many(Vec<i32>),
}

/// config.json keys ERNIE 4.5 MoE adds to ERNIE 4.5's.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct MoeArgs {
    pub moe_num_experts: i32,
    #[serde(default = "default_start")]
    pub moe_layer_start_index: OneOrMany,
    #[serde(default)]
    pub moe_intermediate_size: i32,
    #[serde(default = "default_one")]
    pub moe_k: i32,
    #[serde(default = "default_one")]
    pub moe_layer_interval: i32,
    #[serde(default)]
    pub moe_num_shared_experts: i32,
    #[serde(default)]
    pub moe_layer_end_index: Option<OneOrMany>,
    #[serde(default = "default_gate_act")]
    pub moe_gate_act: String,
}

fn default_start() -> OneOrMany {
    OneOrMany::One(0)
}
fn default_one() -> i32 {
    1
}
fn default_gate_act() -> String {
    "softmax".into()
}

/// Top-k experts over softmax or sigmoid gates, plus the shared experts.
#[derive(Debug)]
pub struct MoeMlp {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    shared_experts: Option<Mlp>,
    k: i32,
    sigmoid: bool,
}
impl_module!(MoeMlp {
    gate,
    switch_mlp,
    shared_experts
});

impl FeedForward for MoeMlp {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let gates = self.gate.forward(x)?.astype(Dtype::Float32)?;
        let gates = if self.sigmoid {
            mlx_nn::activations::sigmoid(&gates)?
        } else {
            mlx_nn::activations::softmax(&gates)?
        };
        let inds = top_k_indices_of_negated(&gates, self.k)?;
        let scores = gates.take_along_axis(&inds, -1)?;
        let scores = scores.divide(&scores.sum(Some(&[-1]), true)?.maximum(1e-12)?)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        let dtype = y.dtype();
        let mut y = y
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?
            .astype(dtype)?;
        if let Some(shared) = &self.shared_experts {
            y = y.add(&shared.forward(x, None)?)?;
        }
        add_residual(y, residual)
    }
    fn fuse(&mut self) -> crate::Result<()> {
        match &mut self.shared_experts {
            Some(m) => m.fuse(),
            None => Ok(()),
        }
    }
}

/// A layer's feed-forward block.
pub type Ffn = DenseOrMoe<MoeMlp>;

/// ERNIE 4.5 MoE with its output head.
#[derive(Debug)]
pub struct Model {
    args: ernie4_5::ModelArgs,
    moe: MoeArgs,
    model: Decoder<Ffn>,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ernie4_5::ModelArgs, moe: MoeArgs) -> crate::Result<Model> {
        let sigmoid = match moe.moe_gate_act.as_str() {
            "softmax" => false,
            "sigmoid" => true,
            other => {
                return Err(crate::Error::Config {
                    path: "config.json (ernie4_5_moe)".into(),
                    message: format!("key `moe_gate_act`: {other:?} is not supported"),
                })
            }
        };
        let start = match &moe.moe_layer_start_index {
            OneOrMany::One(i) => *i,
            OneOrMany::Many(v) => v.iter().copied().min().unwrap_or(0),
        };
        let end = match &moe.moe_layer_end_index {
            None => args.num_hidden_layers - 1,
            Some(OneOrMany::One(i)) => *i,
            Some(OneOrMany::Many(v)) => v.iter().copied().max().unwrap_or(-1),
        };
        if moe.moe_layer_interval <= 0 {
            return Err(crate::Error::Config {
                path: "config.json (ernie4_5_moe)".into(),
                message: "key `moe_layer_interval` must be positive".into(),
            });
        }
        let (dim, eps, bias) = (args.hidden_size, args.rms_norm_eps, args.use_bias);
        let moe_hidden = if moe.moe_intermediate_size != 0 {
            moe.moe_intermediate_size
        } else {
            args.intermediate_size
        };
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let sparse = (i + 1) % moe.moe_layer_interval == 0 && i >= start && i <= end;
                let ffn = if sparse {
                    let shared = (moe.moe_num_shared_experts > 0)
                        .then(|| Mlp::new(dim, moe_hidden * moe.moe_num_shared_experts, bias))
                        .transpose()?;
                    DenseOrMoe::Moe(Box::new(MoeMlp {
                        gate: LinearLayer::new(dim, moe.moe_num_experts, false)?,
                        switch_mlp: SwitchGlu::new(dim, moe_hidden, moe.moe_num_experts, bias)?,
                        shared_experts: shared,
                        k: moe.moe_k,
                        sigmoid,
                    }))
                } else {
                    DenseOrMoe::Dense(Box::new(Mlp::new(dim, args.intermediate_size, bias)?))
                };
                DecoderLayer::new(attention(&args)?, ffn, "mlp", dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Decoder::new(args.vocab_size, dim, eps, layers)?;
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            moe,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args = parse_args(config, "ernie4_5_moe")?;
    let moe = parse_args(config, "ernie4_5_moe")?;
    Ok(Box::new(Model::new(args, moe)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let embed = &self.model.embed_tokens;
        head::logits(embed, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Drops the multi-token-prediction tensors and `e_score_correction_bias`, then
    /// stacks per-expert weights into `switch_mlp`.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        const DROP: [&str; 5] = [
            "mtp_block.",
            "mtp_linear_proj.",
            "mtp_hidden_norm.",
            "mtp_emb_norm.",
            "e_score_correction_bias",
        ];
        let mut weights: Weights = weights
            .into_iter()
            .filter(|(k, _)| !DROP.iter().any(|p| k.contains(p)))
            .collect();
        let names = [
            ("gate_proj", "gate_proj"),
            ("down_proj", "down_proj"),
            ("up_proj", "up_proj"),
        ];
        stack_experts(
            &mut weights,
            self.args.num_hidden_layers,
            |l| format!("model.layers.{l}.mlp"),
            &names,
            &["weight"],
            self.moe.moe_num_experts,
        )?;
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}
