//! Qwen3-Next, following `mlx_lm/models/qwen3_next.py`: gated delta-net linear
//! attention (an [`ArraysState`] of convolution window and recurrent state) on three of
//! every `full_attention_interval` layers, gated full attention on the others, and
//! softmax-routed experts with a gated shared expert.
use super::config_error;
use super::recurrent::{conv_window_or_zeros, keep_conv_window, mask_positions, recurrent_state};
use super::{batch_len, layer_caches, top_k_indices, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Error, Result};
use mlx_nn::activations::{silu, swiglu};
use mlx_nn::cache::{create_attention_mask, ArraysState};
use mlx_nn::gated_delta::{gated_delta_update, normalize_qk, precise_swiglu};
use mlx_nn::{
    impl_module, initialize_rope, scaled_dot_product_attention, AttnMask, EmbeddingLayer, KvCache,
    LinearLayer, Param, RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

fn default_interval() -> i32 {
    4
}

/// config.json keys read by Qwen3-Next.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub linear_num_value_heads: i32,
    pub linear_num_key_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    pub linear_conv_kernel_dim: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    pub shared_expert_intermediate_size: i32,
    pub mlp_only_layers: Vec<i32>,
    pub moe_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
    pub max_position_embeddings: i32,
    pub head_dim: i32,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_interval")]
    pub full_attention_interval: i32,
}

/// `Qwen3NextRMSNormGated`: RMS norm, then `silu(gate) * x` in float32.
#[derive(Debug)]
struct GatedRmsNorm {
    weight: Param,
    eps: f32,
}
impl_module!(GatedRmsNorm { weight });

impl GatedRmsNorm {
    fn forward(&self, h: &Array, gate: &Array) -> Result<Array> {
        let x = mlx_array::fast::rms_norm(h, Some(&self.weight), self.eps)?;
        precise_swiglu(h, gate, &x)
    }
}

/// Full attention with a sigmoid output gate and per-head q/k norms.
#[derive(Debug)]
struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f64,
}
impl_module!(Attention {
    q_proj,
    k_proj,
    v_proj,
    o_proj,
    q_norm,
    k_norm
});

impl Attention {
    fn new(a: &ModelArgs) -> crate::Result<Attention> {
        let (dim, hd, bias) = (a.hidden_size, a.head_dim, a.attention_bias);
        let (nh, nkv) = (a.num_attention_heads, a.num_key_value_heads);
        Ok(Attention {
            q_proj: LinearLayer::new(dim, nh * hd * 2, bias)?,
            k_proj: LinearLayer::new(dim, nkv * hd, bias)?,
            v_proj: LinearLayer::new(dim, nkv * hd, bias)?,
            o_proj: LinearLayer::new(nh * hd, dim, bias)?,
            q_norm: RmsNorm::new(hd, a.rms_norm_eps)?,
            k_norm: RmsNorm::new(hd, a.rms_norm_eps)?,
            rope: initialize_rope(
                (hd as f64 * a.partial_rotary_factor) as i32,
                a.rope_theta,
                false,
                rope_scaling(a.rope_scaling.as_ref())?.as_ref(),
                Some(a.max_position_embeddings),
            )?,
            n_heads: nh,
            n_kv_heads: nkv,
            scale: (hd as f64).powf(-0.5),
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let qg = self.q_proj.forward(x)?.reshape(&[b, l, self.n_heads, -1])?;
        let [queries, gate]: [Array; 2] = qg
            .split_sections(2, -1)?
            .try_into()
            .map_err(|_| Error::InvalidArgument("q_proj split".into()))?;
        let gate = gate.reshape(&[b, l, -1])?;
        let (keys, values) = (self.k_proj.forward(x)?, self.v_proj.forward(x)?);
        let queries = self
            .q_norm
            .forward(&queries)?
            .transpose(Some(&[0, 2, 1, 3]))?;
        let keys = self
            .k_norm
            .forward(&keys.reshape(&[b, l, self.n_kv_heads, -1])?)?
            .transpose(Some(&[0, 2, 1, 3]))?;
        let values = values
            .reshape(&[b, l, self.n_kv_heads, -1])?
            .transpose(Some(&[0, 2, 1, 3]))?;
        let (queries, fetch) = super::rope_cache(&queries, &keys, values, &self.rope, cache)?;
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        let out = out.transpose(Some(&[0, 2, 1, 3]))?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&out.multiply(&gate.sigmoid()?)?)
    }
}

/// Qwen3-Next's two fused input projections (q, k, v, z interleaved per key head; b, a
/// likewise).
#[derive(Debug)]
struct FusedProj {
    in_proj_qkvz: LinearLayer,
    in_proj_ba: LinearLayer,
}
impl_module!(FusedProj {
    in_proj_qkvz,
    in_proj_ba
});

/// Qwen3.5's four input projections.
#[derive(Debug)]
struct SplitProj {
    in_proj_qkv: LinearLayer,
    in_proj_z: LinearLayer,
    in_proj_b: LinearLayer,
    in_proj_a: LinearLayer,
}
impl_module!(SplitProj {
    in_proj_qkv,
    in_proj_z,
    in_proj_b,
    in_proj_a
});

/// The input projections of a gated delta-net.
#[derive(Debug)]
enum InProj {
    Fused(Box<FusedProj>),
    Split(Box<SplitProj>),
}
enum_module!(InProj { Fused => "", Split => "" });

/// The gated delta-net (linear attention) block.
#[derive(Debug)]
struct GatedDeltaNet {
    proj: InProj,
    conv1d: Conv1dWeight,
    dt_bias: Param,
    a_log: Param,
    norm: GatedRmsNorm,
    out_proj: LinearLayer,
    nk: i32,
    nv: i32,
    dk: i32,
    dv: i32,
    kernel: i32,
}
impl_module!(GatedDeltaNet {
    conv1d,
    proj as "",
    dt_bias,
    a_log as "A_log",
    norm,
    out_proj
});

/// A depthwise `nn.Conv1d` without bias: weight `[channels, kernel, 1]`.
#[derive(Debug)]
struct Conv1dWeight {
    weight: Param,
}
impl_module!(Conv1dWeight { weight });

impl GatedDeltaNet {
    fn new(a: &ModelArgs, split: bool) -> crate::Result<GatedDeltaNet> {
        let (nk, nv, dk, dv) = (
            a.linear_num_key_heads,
            a.linear_num_value_heads,
            a.linear_key_head_dim,
            a.linear_value_head_dim,
        );
        if nk <= 0 || nv % nk != 0 {
            return Err(config_error("qwen3_next", format!(
                "linear_num_value_heads ({nv}) must be a multiple of linear_num_key_heads ({nk})"
            )));
        }
        let (key_dim, value_dim) = (nk * dk, nv * dv);
        let conv_dim = key_dim * 2 + value_dim;
        let zeros = |s: &[i32]| ops::zeros(s, Dtype::Float32);
        let d = a.hidden_size;
        let proj = if split {
            InProj::Split(Box::new(SplitProj {
                in_proj_qkv: LinearLayer::new(d, key_dim * 2 + value_dim, false)?,
                in_proj_z: LinearLayer::new(d, value_dim, false)?,
                in_proj_b: LinearLayer::new(d, nv, false)?,
                in_proj_a: LinearLayer::new(d, nv, false)?,
            }))
        } else {
            InProj::Fused(Box::new(FusedProj {
                in_proj_qkvz: LinearLayer::new(d, key_dim * 2 + value_dim * 2, false)?,
                in_proj_ba: LinearLayer::new(d, nv * 2, false)?,
            }))
        };
        Ok(GatedDeltaNet {
            proj,
            conv1d: Conv1dWeight {
                weight: Param::new(zeros(&[conv_dim, a.linear_conv_kernel_dim, 1])?),
            },
            dt_bias: Param::new(ops::ones(&[nv], Dtype::Float32)?),
            a_log: Param::new(zeros(&[nv])?),
            norm: GatedRmsNorm {
                weight: Param::new(ops::ones(&[dv], Dtype::Float32)?),
                eps: a.rms_norm_eps as f32,
            },
            out_proj: LinearLayer::new(value_dim, a.hidden_size, false)?,
            nk,
            nv,
            dk,
            dv,
            kernel: a.linear_conv_kernel_dim,
        })
    }

    fn forward(
        &self,
        inputs: &Array,
        mask: Option<&Array>,
        mut cache: Option<&mut ArraysState>,
    ) -> Result<Array> {
        let (b, s) = batch_len(inputs)?;
        let (nk, nv, dk, dv) = (self.nk, self.nv, self.dk, self.dv);
        let (mixed, z, bb, a) = match &self.proj {
            InProj::Fused(f) => {
                // fix_query_key_value_ordering
                let qkvz = f.in_proj_qkvz.forward(inputs)?.reshape(&[b, s, nk, -1])?;
                let ba = f.in_proj_ba.forward(inputs)?.reshape(&[b, s, nk, -1])?;
                let r = nv / nk;
                let p = qkvz.split_at(&[dk, 2 * dk, 2 * dk + r * dv], -1)?;
                let pb = ba.split_at(&[r], -1)?;
                let v = p[2].reshape(&[b, s, -1, dv])?;
                let mixed = ops::concatenate(
                    &[
                        &p[0].reshape(&[b, s, -1])?,
                        &p[1].reshape(&[b, s, -1])?,
                        &v.reshape(&[b, s, -1])?,
                    ],
                    -1,
                )?;
                let z = p[3].reshape(&[b, s, -1, dv])?;
                (
                    mixed,
                    z,
                    pb[0].reshape(&[b, s, nv])?,
                    pb[1].reshape(&[b, s, nv])?,
                )
            }
            InProj::Split(p) => (
                p.in_proj_qkv.forward(inputs)?,
                p.in_proj_z.forward(inputs)?.reshape(&[b, s, nv, dv])?,
                p.in_proj_b.forward(inputs)?,
                p.in_proj_a.forward(inputs)?,
            ),
        };

        let conv_dim = self.conv1d.weight.dim(0)?;
        let n_keep = self.kernel - 1;
        let conv_state =
            conv_window_or_zeros(cache.as_deref(), b, n_keep, conv_dim, inputs.dtype())?;
        let mixed = mask_positions(mixed, mask)?;
        let conv_input = ops::concatenate(&[&conv_state, &mixed], 1)?;
        if let Some(c) = cache.as_deref_mut() {
            keep_conv_window(c, &conv_input, n_keep, s, true)?;
        }
        let conv_out = silu(&ops::conv1d(
            &conv_input,
            &self.conv1d.weight,
            1,
            0,
            1,
            conv_dim,
        )?)?;
        let key_dim = nk * dk;
        let parts = conv_out.split_at(&[key_dim, 2 * key_dim], -1)?;
        let q = parts[0].reshape(&[b, s, nk, dk])?;
        let k = parts[1].reshape(&[b, s, nk, dk])?;
        let v = parts[2].reshape(&[b, s, nv, dv])?;

        let state = cache.as_deref().and_then(|c| c.get(1)).cloned();
        let (q, k) = normalize_qk(&q, &k, (dk as f64).powf(-0.5), 1e-6)?;
        let (out, state) = gated_delta_update(
            &q,
            &k,
            &v,
            &a,
            &bb,
            &self.a_log,
            &self.dt_bias,
            state.as_ref(),
            mask,
        )?;
        if let Some(c) = cache {
            c.set(1, state)?;
            c.advance(s)?;
        }
        let out = self.norm.forward(&out, &z)?;
        self.out_proj.forward(&out.reshape(&[b, s, -1])?)
    }
}

/// `Qwen3NextMLP`.
#[derive(Debug)]
struct Mlp {
    gate_proj: LinearLayer,
    down_proj: LinearLayer,
    up_proj: LinearLayer,
}
impl_module!(Mlp {
    gate_proj,
    down_proj,
    up_proj
});

impl Mlp {
    fn new(dim: i32, hidden: i32) -> crate::Result<Mlp> {
        Ok(Mlp {
            gate_proj: LinearLayer::new(dim, hidden, false)?,
            down_proj: LinearLayer::new(hidden, dim, false)?,
            up_proj: LinearLayer::new(dim, hidden, false)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&swiglu(
            &self.gate_proj.forward(x)?,
            &self.up_proj.forward(x)?,
        )?)
    }
}

/// Routed experts plus a sigmoid-gated shared expert.
#[derive(Debug)]
struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    shared_expert: Mlp,
    shared_expert_gate: LinearLayer,
    top_k: i32,
    norm_topk_prob: bool,
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
        let inds = top_k_indices(&gates, self.top_k)?;
        let mut scores = gates.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(&scores.sum(Some(&[-1]), true)?)?;
        }
        let y = self.switch_mlp.forward(x, &inds)?;
        let y = y
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?;
        let shared = self.shared_expert.forward(x)?;
        let shared = self
            .shared_expert_gate
            .forward(x)?
            .sigmoid()?
            .multiply(&shared)?;
        y.add(&shared)
    }
}

/// A layer's token mixer.
#[derive(Debug)]
enum Mixer {
    Linear(Box<GatedDeltaNet>),
    Full(Box<Attention>),
}

/// A layer's feed-forward part.
#[derive(Debug)]
enum FeedForward {
    Sparse(Box<SparseMoeBlock>),
    Dense(Box<Mlp>),
}

enum_module!(Mixer { Linear => "linear_attn", Full => "self_attn" });
enum_module!(FeedForward { Sparse => "", Dense => "" });

/// One decoder layer.
#[derive(Debug)]
struct DecoderLayer {
    mixer: Mixer,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(DecoderLayer {
    mixer as "",
    input_layernorm,
    post_attention_layernorm,
    mlp
});

/// The decoder stack.
#[derive(Debug)]
pub struct Qwen3NextModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(Qwen3NextModel {
    embed_tokens,
    layers,
    norm
});

/// Qwen3-Next with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Qwen3NextModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

/// How a checkpoint of the family lays its layers out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Four linear-attention input projections (Qwen3.5) instead of two fused ones.
    pub split_projections: bool,
    /// Experts on every layer when `num_experts > 0` (Qwen3.5), instead of
    /// `decoder_sparse_step` and `mlp_only_layers` choosing.
    pub experts_everywhere: bool,
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let layout = Layout {
            split_projections: false,
            experts_everywhere: false,
        };
        Model::with_layout(args, layout)
    }

    /// The model with the layer layout of another file of the family.
    pub(crate) fn with_layout(args: ModelArgs, layout: Layout) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let interval = args.full_attention_interval;
        if interval <= 0 || interval > args.num_hidden_layers {
            return Err(config_error("qwen3_next", format!(
                "full_attention_interval {interval} must be in 1..={} (num_hidden_layers): \
                 mlx-lm masks full attention with layer {}'s cache",
                args.num_hidden_layers,
                interval - 1
            )));
        }
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let mixer = if (i + 1) % interval != 0 {
                    Mixer::Linear(Box::new(GatedDeltaNet::new(
                        &args,
                        layout.split_projections,
                    )?))
                } else {
                    Mixer::Full(Box::new(Attention::new(&args)?))
                };
                let sparse = if layout.experts_everywhere {
                    args.num_experts > 0
                } else {
                    !args.mlp_only_layers.contains(&i)
                        && args.num_experts > 0
                        && args.decoder_sparse_step > 0
                        && (i + 1) % args.decoder_sparse_step == 0
                };
                let mlp = if sparse {
                    FeedForward::Sparse(Box::new(SparseMoeBlock {
                        gate: LinearLayer::new(dim, args.num_experts, false)?,
                        switch_mlp: SwitchGlu::new(
                            dim,
                            args.moe_intermediate_size,
                            args.num_experts,
                            false,
                        )?,
                        shared_expert: Mlp::new(dim, args.shared_expert_intermediate_size)?,
                        shared_expert_gate: LinearLayer::new(dim, 1, false)?,
                        top_k: args.num_experts_per_tok,
                        norm_topk_prob: args.norm_topk_prob,
                    }))
                } else {
                    FeedForward::Dense(Box::new(Mlp::new(dim, args.intermediate_size)?))
                };
                Ok(DecoderLayer {
                    mixer,
                    mlp,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Qwen3NextModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        let lm_head = if args.tie_word_embeddings {
            None
        } else {
            Some(LinearLayer::new(dim, args.vocab_size, false)?)
        };
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "qwen3_next")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let fa_idx = (self.args.full_attention_interval - 1) as usize;
        let fa_mask =
            create_attention_mask(n, caches.get(fa_idx).map(|c| c.as_ref()), None, false)?;
        let ssm_mask = match caches.first().and_then(|c| c.arrays()) {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let ssm_mask = ssm_mask.clone();
            let forward = move |layer: &DecoderLayer,
                                h: &Array,
                                fa_mask: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                let x = layer.input_layernorm.forward(h)?;
                let r = match &layer.mixer {
                    Mixer::Linear(l) => {
                        let state = recurrent_state(cache, i, "linear-attention")?;
                        l.forward(&x, ssm_mask.as_ref(), state)?
                    }
                    Mixer::Full(a) => a.forward(&x, fa_mask, cache)?,
                };
                let hh = h.add(&r)?;
                let ff = match &layer.mlp {
                    FeedForward::Sparse(s) => {
                        s.forward(&layer.post_attention_layernorm.forward(&hh)?)?
                    }
                    FeedForward::Dense(d) => {
                        d.forward(&layer.post_attention_layernorm.forward(&hh)?)?
                    }
                };
                hh.add(&ff)
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &fa_mask, cache, forward)?;
        }
        let out = m.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&out),
            None => m.embed_tokens.as_linear(&out),
        }
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Linear(_) => CacheSpec::Arrays { size: 2 },
                Mixer::Full(_) => CacheSpec::Standard,
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Model {
    /// Each gated delta-net draws two keys besides its linears: its `nn.Conv1d` weight
    /// and the uniform `A` behind `A_log`.
    pub(crate) fn tied(&self) -> bool {
        self.args.tie_word_embeddings
    }

    pub(crate) fn delta_net_key_draws(&self) -> usize {
        let linear = self.model.layers.iter();
        2 * linear
            .filter(|l| matches!(l.mixer, Mixer::Linear(_)))
            .count()
    }
}

impl Architecture for Model {
    /// Each gated delta-net draws two keys besides its linears: its `nn.Conv1d` weight
    /// and the uniform `A` behind `A_log`.
    fn extra_init_key_draws(&self) -> usize {
        self.delta_net_key_draws()
    }

    /// mlx-lm's sanitize: only for checkpoints with per-expert weights (HF layout):
    /// drops `mtp.*` and a tied head, stacks the experts, moves conv1d's kernel axis to
    /// MLX's layout, and adds 1 to the (zero-centred) RMS norm weights.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        let mut moe_layers: Vec<i64> = weights
            .keys()
            .filter(|k| {
                k.starts_with("model.layers.") && k.ends_with(".mlp.experts.0.up_proj.weight")
            })
            .filter_map(|k| k.split('.').nth(2).and_then(|l| l.parse().ok()))
            .collect();
        if moe_layers.is_empty() {
            return Ok(weights);
        }
        moe_layers.sort();
        weights.retain(|k, _| !k.contains("mtp."));
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        for l in moe_layers {
            let prefix = format!("model.layers.{l}.mlp");
            for n in ["up_proj", "down_proj", "gate_proj"] {
                let mut parts = Vec::new();
                for e in 0..self.args.num_experts {
                    let key = format!("{prefix}.experts.{e}.{n}.weight");
                    parts.push(weights.remove(&key).ok_or_else(|| crate::Error::Weights {
                        path: "model weights".into(),
                        message: format!("missing expert tensor `{key}`"),
                    })?);
                }
                let refs: Vec<&Array> = parts.iter().collect();
                weights.insert(
                    format!("{prefix}.switch_mlp.{n}.weight"),
                    ops::stack(&refs, 0)?,
                );
            }
        }
        const NORMS: [&str; 5] = [
            ".input_layernorm.weight",
            ".post_attention_layernorm.weight",
            "model.norm.weight",
            ".q_norm.weight",
            ".k_norm.weight",
        ];
        for (k, v) in weights.iter_mut() {
            if k.contains("conv1d.weight") && v.dim(-1)? != 1 {
                *v = v.moveaxis(2, 1)?;
            }
            if NORMS.iter().any(|s| k.ends_with(s)) && v.ndim() == 1 {
                *v = v.add(1.0)?;
            }
        }
        Ok(weights)
    }
}
