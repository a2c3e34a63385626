//! Phixtral (`phixtral`), following `mlx_lm/models/phixtral.py`: Phi-2 layers whose
//! feed-forward is a mixture of experts. One layer norm per layer read by attention and
//! the experts in parallel (`attn(ln(x)) + moe(ln(x)) + x`); attention through one
//! biased `Wqkv` split in three, the first `rotary_dim` dimensions of each head rotated
//! (base 10000, not traditional), SDPA on float32 queries; experts chosen by softmax
//! over the top-k router logits, each a biased `fc2(gelu_approx(fc1(x)))` four times the
//! width (`SwitchMLP`); a head of a layer norm and a biased linear. `sanitize` stacks
//! the per-expert `moe.mlp.{e}` tensors.
use super::config_error;
use super::attention::{Attention, AttentionDims, Extras};
use super::decoder::stack_experts_in;
use super::lm::{causal_layers, even_head_dim};
use super::{top_k_indices_of_negated, weigh_experts, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{
    activations, impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, LinearLayer, Rope,
    SwitchMlp,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Phixtral (all defaulted, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    #[serde(default = "default_num_vocab")]
    pub num_vocab: i32,
    #[serde(default = "default_model_dim")]
    pub model_dim: i32,
    #[serde(default = "default_num_heads")]
    pub num_heads: i32,
    #[serde(default = "default_num_layers")]
    pub num_layers: i32,
    #[serde(default = "default_rotary_dim")]
    pub rotary_dim: i32,
    #[serde(default = "default_num_experts_per_tok")]
    pub num_experts_per_tok: i32,
    #[serde(default = "default_num_local_experts")]
    pub num_local_experts: i32,
}

fn default_model_type() -> String {
    "phixtral".into()
}
fn default_num_vocab() -> i32 {
    51200
}
fn default_model_dim() -> i32 {
    2560
}
fn default_num_heads() -> i32 {
    32
}
fn default_num_layers() -> i32 {
    32
}
fn default_rotary_dim() -> i32 {
    32
}
fn default_num_experts_per_tok() -> i32 {
    2
}
fn default_num_local_experts() -> i32 {
    4
}

/// The router and its experts.
#[derive(Debug)]
pub struct Moe {
    gate: LinearLayer,
    switch_mlp: SwitchMlp,
    top_k: i32,
}
impl_module!(Moe { gate, switch_mlp });

impl Moe {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gates = self.gate.forward(x)?;
        let inds = top_k_indices_of_negated(&gates, self.top_k)?;
        let scores = gates
            .take_along_axis(&inds, -1)?
            .softmax(Some(&[-1]), true)?;
        weigh_experts(&self.switch_mlp.forward(x, &inds)?, &scores)
    }
}

/// One layer: attention and experts in parallel over one norm.
#[derive(Debug)]
pub struct ParallelBlock {
    mixer: Attention,
    ln: LayerNorm,
    moe: Moe,
}
impl_module!(ParallelBlock { mixer, ln, moe });

impl ParallelBlock {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let h = self.ln.forward(x)?;
        let extras = Extras {
            queries_in_f32: true,
            ..Default::default()
        };
        let attn = self.mixer.forward(&h, mask, cache, None, extras)?;
        attn.add(&self.moe.forward(&h)?)?.add(x)
    }
}

/// `transformer.embd.wte`.
#[derive(Debug)]
pub struct Embd {
    wte: EmbeddingLayer,
}
impl_module!(Embd { wte });

/// The embedding and the layers (no final norm: it is the head's).
#[derive(Debug)]
pub struct TransformerDecoder {
    embd: Embd,
    h: Vec<ParallelBlock>,
}
impl_module!(TransformerDecoder { embd, h });

/// `linear(ln(x))`.
#[derive(Debug)]
pub struct OutputHead {
    ln: LayerNorm,
    linear: LinearLayer,
}
impl_module!(OutputHead { ln, linear });

/// Phixtral with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    transformer: TransformerDecoder,
    lm_head: OutputHead,
}
impl_module!(Model {
    transformer,
    lm_head
});

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, n_heads) = (args.model_dim, args.num_heads);
        let head_dim = even_head_dim(dim, n_heads, "phixtral")?;
        let (k, n_experts) = (args.num_experts_per_tok, args.num_local_experts);
        if k < 1 || k > n_experts {
            return Err(config_error("phixtral", format!(
                "num_experts_per_tok ({k}) must be between 1 and num_local_experts ({n_experts})"
            )));
        }
        if args.rotary_dim < 1 || args.rotary_dim > head_dim || args.rotary_dim % 2 != 0 {
            return Err(config_error("phixtral", format!(
                "rotary_dim ({}) must be even and at most the head size ({head_dim})",
                args.rotary_dim
            )));
        }
        if args.num_vocab < 1 {
            return Err(config_error("phixtral", format!(
                "num_vocab must be positive (got {})",
                args.num_vocab
            )));
        }
        let h = (0..args.num_layers)
            .map(|_| {
                let d = AttentionDims {
                    dim,
                    n_heads,
                    n_kv_heads: n_heads,
                    head_dim,
                    qkv_bias: true,
                    o_bias: true,
                };
                let rope = Rope::new(args.rotary_dim, false, 10000.0, 1.0);
                let mixer =
                    Attention::new_joint_qkv(d, "Wqkv", rope, (head_dim as f64).recip().sqrt())?
                        .with_out_name("out_proj");
                Ok(ParallelBlock {
                    mixer,
                    ln: LayerNorm::new(dim, 1e-5, true, true)?,
                    moe: Moe {
                        gate: LinearLayer::new(dim, n_experts, false)?,
                        switch_mlp: SwitchMlp::new(
                            dim,
                            4 * dim,
                            n_experts,
                            true,
                            activations::gelu_approx,
                        )?,
                        top_k: k,
                    },
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let transformer = TransformerDecoder {
            embd: Embd {
                wte: EmbeddingLayer::new(args.num_vocab, dim)?,
            },
            h,
        };
        let lm_head = OutputHead {
            ln: LayerNorm::new(dim, 1e-5, true, true)?,
            linear: LinearLayer::new(dim, args.num_vocab, true)?,
        };
        Ok(Model {
            args,
            transformer,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "phixtral")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let t = &self.transformer;
        let h = t.embd.wte.forward(tokens)?;
        let h = causal_layers(&t.h, h, caches, ParallelBlock::forward)?;
        let head = &self.lm_head;
        head.linear.forward(&head.ln.forward(&h)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.transformer.h.len()]
    }
    fn model_type(&self) -> &str {
        &self.args.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.args.num_vocab
    }
    fn num_layers(&self) -> usize {
        self.transformer.h.len()
    }
    fn as_module(&self) -> Option<&dyn mlx_nn::Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn mlx_nn::Module> {
        Some(self)
    }
}

impl Architecture for Model {
    /// Stacks the per-expert `transformer.h.{l}.moe.mlp.{e}.{fc1, fc2}` tensors (weights,
    /// quantization scales and biases, and the linear biases) into `moe.switch_mlp`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if !weights.contains_key("transformer.h.0.moe.mlp.0.fc1.weight") {
            return Ok(weights);
        }
        stack_experts_in(
            &mut weights,
            self.args.num_layers,
            |l| format!("transformer.h.{l}.moe"),
            "mlp",
            &[("fc1", "fc1"), ("fc2", "fc2")],
            &["weight", "scales", "biases", "bias"],
            self.args.num_local_experts,
        )?;
        Ok(weights)
    }
}
