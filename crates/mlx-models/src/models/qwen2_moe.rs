//! Qwen2-MoE, following `mlx_lm/models/qwen2_moe.py`: Qwen2 attention (plain RoPE),
//! softmax-routed SwitchGLU experts plus a sigmoid-gated shared expert in every layer.
use super::attention::{Attention, AttentionDims, Extras};
use super::mlp::Mlp;
use super::top_k_indices_of_negated;
use super::{cache_at, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Qwen2-MoE.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_experts: i32,
    pub moe_intermediate_size: i32,
    pub shared_expert_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    1_000_000.0
}

impl ModelArgs {
    /// `__post_init__`'s checks: a `rope_scaling` must be `linear` with a `factor`
    /// (mlx-lm then does not apply it).
    fn validate(self) -> crate::Result<ModelArgs> {
        if let Some(s) = self.rope_scaling.as_ref().filter(|s| !s.is_empty()) {
            let err = |message: &str| crate::Error::Config {
                path: "config.json (qwen2_moe)".into(),
                message: message.into(),
            };
            if !s.contains_key("factor") || !s.contains_key("type") {
                return Err(err("key `rope_scaling` must contain `factor` and `type`"));
            }
            if s.get("type").and_then(Value::as_str) != Some("linear") {
                return Err(err("key `rope_scaling.type`: only `linear` is supported"));
            }
        }
        Ok(self)
    }
}

/// The experts (top-k of the softmax, unnormalized) and the gated shared expert.
#[derive(Debug)]
pub struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    shared_expert: Mlp,
    shared_expert_gate: LinearLayer,
    top_k: i32,
}
impl_module!(SparseMoeBlock {
    gate,
    switch_mlp,
    shared_expert,
    shared_expert_gate
});

impl SparseMoeBlock {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gates = self.gate.forward(x)?.softmax(Some(&[-1]), true)?;
        let k = self.top_k;
        let inds = top_k_indices_of_negated(&gates, k)?;
        let scores = gates.take_along_axis(&inds, -1)?;
        let y = self
            .switch_mlp
            .forward(x, &inds)?
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?;
        let shared = self.shared_expert.forward(x, None)?;
        let gated = self
            .shared_expert_gate
            .forward(x)?
            .sigmoid()?
            .multiply(&shared)?;
        y.add(&gated)
    }
}

/// One decoder layer.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: SparseMoeBlock,
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
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            Some(x),
            Extras::default(),
        )?;
        h.add(
            &self
                .mlp
                .forward(&self.post_attention_layernorm.forward(&h)?)?,
        )
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct Qwen2MoeModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(Qwen2MoeModel {
    embed_tokens,
    layers,
    norm
});

impl Qwen2MoeModel {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.norm.forward(&h)
    }
}

/// Qwen2-MoE with its output head (always its own, as in mlx-lm).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Qwen2MoeModel,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let n_heads = args.num_attention_heads;
        let head_dim = dim / n_heads;
        let dims = AttentionDims {
            dim,
            n_heads,
            n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            qkv_bias: true,
            o_bias: false,
        };
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = Rope::new(head_dim, args.rope_traditional, args.rope_theta, 1.0);
                Ok(DecoderLayer {
                    self_attn: Attention::new(dims, rope, (head_dim as f64).powf(-0.5))?,
                    mlp: SparseMoeBlock {
                        gate: LinearLayer::new(dim, args.num_experts, false)?,
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.moe_intermediate_size,
                            args.num_experts,
                            false,
                        )?,
                        shared_expert: Mlp::new(dim, args.shared_expert_intermediate_size, false)?,
                        shared_expert_gate: LinearLayer::new(dim, 1, false)?,
                        top_k: args.num_experts_per_tok,
                    },
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Qwen2MoeModel {
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
    let args: ModelArgs = parse_args(config, "qwen2_moe")?;
    Ok(Box::new(Model::new(args.validate()?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.lm_head.forward(&self.model.forward(tokens, caches)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// Per-expert tensors (`mlp.experts.{e}.{proj}.{weight,scales,biases}`) stacked into
    /// `mlp.switch_mlp`, when the checkpoint has them.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if !weights.contains_key("model.layers.0.mlp.experts.0.up_proj.weight") {
            return Ok(weights);
        }
        for l in 0..self.args.num_hidden_layers {
            let prefix = format!("model.layers.{l}.mlp");
            for n in ["up_proj", "down_proj", "gate_proj"] {
                for k in ["weight", "scales", "biases"] {
                    if !weights.contains_key(&format!("{prefix}.experts.0.{n}.{k}")) {
                        continue;
                    }
                    let mut parts = Vec::new();
                    for e in 0..self.args.num_experts {
                        let key = format!("{prefix}.experts.{e}.{n}.{k}");
                        parts.push(weights.remove(&key).ok_or_else(|| crate::Error::Weights {
                            path: "model weights".into(),
                            message: format!("missing expert tensor `{key}`"),
                        })?);
                    }
                    let refs: Vec<&Array> = parts.iter().collect();
                    weights.insert(
                        format!("{prefix}.switch_mlp.{n}.{k}"),
                        ops::stack(&refs, 0)?,
                    );
                }
            }
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.shared_expert.fuse()?;
        }
        Ok(())
    }
}
