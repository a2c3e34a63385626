//! Gemma 4 text model, following `mlx_lm/models/gemma4_text.py`: sliding and full
//! attention layers (full ones with their own head size and proportional RoPE), q/k/v
//! norms, later layers reading an earlier layer's keys and values (the model has fewer
//! caches than layers), per-layer input embeddings, an optional expert block beside the
//! MLP, a scalar per layer and soft-capped logits.
use super::config_error;
use super::head;
use super::{batch_len, top_k_indices, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::activations::{call_compiled_keyed, geglu, gelu_approx};
use mlx_nn::cache::{create_attention_mask, RopePosition};
use mlx_nn::switch::GluActivation;
use mlx_nn::module::join;
use mlx_nn::{
    impl_module, initialize_rope, scaled_dot_product_attention, AttnMask, EmbeddingLayer,
    KvCache, KvFetch, LinearLayer, Param, RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

/// config.json keys read by Gemma 4 (text), with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
#[serde(default)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub global_head_dim: Option<i32>,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub vocab_size_per_layer_input: i32,
    pub num_key_value_heads: i32,
    pub num_global_key_value_heads: Option<i32>,
    pub num_kv_shared_layers: i32,
    pub hidden_size_per_layer_input: Option<i32>,
    pub rope_traditional: bool,
    pub rope_parameters: Option<Value>,
    pub sliding_window: i32,
    pub sliding_window_pattern: i32,
    pub max_position_embeddings: i32,
    pub attention_k_eq_v: bool,
    pub final_logit_softcapping: Option<f64>,
    pub use_double_wide_mlp: bool,
    pub enable_moe_block: bool,
    pub num_experts: Option<i32>,
    pub top_k_experts: Option<i32>,
    pub moe_intermediate_size: Option<i32>,
    pub layer_types: Option<Vec<String>>,
    pub tie_word_embeddings: bool,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "gemma4_text".into(),
            hidden_size: 1536,
            num_hidden_layers: 35,
            intermediate_size: 6144,
            num_attention_heads: 8,
            head_dim: 256,
            global_head_dim: Some(512),
            rms_norm_eps: 1e-6,
            vocab_size: 262144,
            vocab_size_per_layer_input: 262144,
            num_key_value_heads: 1,
            num_global_key_value_heads: None,
            num_kv_shared_layers: 20,
            hidden_size_per_layer_input: Some(256),
            rope_traditional: false,
            rope_parameters: None,
            sliding_window: 512,
            sliding_window_pattern: 5,
            max_position_embeddings: 131072,
            attention_k_eq_v: false,
            final_logit_softcapping: Some(30.0),
            use_double_wide_mlp: true,
            enable_moe_block: false,
            num_experts: None,
            top_k_experts: None,
            moe_intermediate_size: None,
            layer_types: None,
            tie_word_embeddings: true,
        }
    }
}

impl ModelArgs {
    /// `__post_init__`: the default RoPE parameters and layer pattern.
    fn post_init(&mut self) -> crate::Result<()> {
        if self.rope_parameters.is_none() {
            self.rope_parameters = Some(serde_json::json!({
                FULL: {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                       "rope_type": "proportional"},
                SLIDING: {"partial_rotary_factor": 1.0, "rope_theta": 10000.0,
                          "rope_type": "default"},
            }));
        }
        let n = self.num_hidden_layers.max(0) as usize;
        if self.layer_types.is_none() {
            if self.sliding_window_pattern <= 0 {
                return Err(config_error("gemma4_text", 
                    "key `sliding_window_pattern` must be positive".into(),
                ));
            }
            let p = self.sliding_window_pattern as usize;
            let types = (0..n)
                .map(|i| if i % p == p - 1 { FULL } else { SLIDING }.to_string())
                .collect();
            self.layer_types = Some(types);
        }
        let types = self.types();
        if types.len() < n {
            return Err(config_error("gemma4_text", format!(
                "key `layer_types` has {} entries for {n} layers",
                types.len()
            )));
        }
        if let Some(bad) = types[..n].iter().find(|t| *t != FULL && *t != SLIDING) {
            return Err(config_error("gemma4_text", format!(
                "key `layer_types`: unknown layer type \"{bad}\""
            )));
        }
        if self.num_kv_shared_layers < 0 || self.num_kv_shared_layers > self.num_hidden_layers {
            return Err(config_error("gemma4_text", format!(
                "key `num_kv_shared_layers` ({}) must be between 0 and num_hidden_layers ({n})",
                self.num_kv_shared_layers
            )));
        }
        Ok(())
    }

    fn types(&self) -> &[String] {
        self.layer_types.as_deref().unwrap_or(&[])
    }

    /// The first layer that reads another layer's keys and values.
    fn first_kv_shared(&self) -> usize {
        (self.num_hidden_layers - self.num_kv_shared_layers).max(0) as usize
    }

    fn per_layer_dim(&self) -> Option<i32> {
        self.hidden_size_per_layer_input.filter(|&d| d != 0)
    }

    fn rope(&self, is_sliding: bool, head_dim: i32) -> crate::Result<Rope> {
        let key = if is_sliding { SLIDING } else { FULL };
        let empty = Value::Object(Default::default());
        let params = self
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get(key))
            .unwrap_or(&empty);
        let base = params
            .get("rope_theta")
            .and_then(Value::as_f64)
            .unwrap_or(10000.0);
        Ok(initialize_rope(
            head_dim,
            base,
            self.rope_traditional,
            rope_scaling(Some(params))?.as_ref(),
            Some(self.max_position_embeddings),
        )?)
    }
}

/// What a layer hands to the layers that share its cache: the keys and values attention
/// read, and the RoPE offset of its queries.
#[derive(Debug, Clone)]
pub struct SharedKv {
    fetch: KvFetch,
    offset: RopePosition,
}

/// Self-attention; layers past the shared point have no k/v projections of their own.
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: Option<LinearLayer>,
    v_proj: Option<LinearLayer>,
    o_proj: LinearLayer,
    q_norm: RmsNorm,
    k_norm: Option<RmsNorm>,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    eps: f32,
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
    fn new(args: &ModelArgs, i: usize) -> crate::Result<Attention> {
        let is_sliding = args.types()[i] == SLIDING;
        let head_dim = match args.global_head_dim {
            Some(g) if !is_sliding && g != 0 => g,
            _ => args.head_dim,
        };
        let has_kv = i < args.first_kv_shared();
        let k_eq_v = args.attention_k_eq_v && !is_sliding;
        let n_kv_heads = match args.num_global_key_value_heads {
            Some(n) if k_eq_v => n,
            _ => args.num_key_value_heads,
        };
        let (dim, n_heads, eps) = (args.hidden_size, args.num_attention_heads, args.rms_norm_eps);
        let kv = |on: bool| -> crate::Result<Option<LinearLayer>> {
            Ok(if on {
                Some(LinearLayer::new(dim, n_kv_heads * head_dim, false)?)
            } else {
                None
            })
        };
        Ok(Attention {
            q_proj: LinearLayer::new(dim, n_heads * head_dim, false)?,
            k_proj: kv(has_kv)?,
            v_proj: kv(has_kv && !k_eq_v)?,
            o_proj: LinearLayer::new(n_heads * head_dim, dim, false)?,
            q_norm: RmsNorm::new(head_dim, eps)?,
            k_norm: if has_kv {
                Some(RmsNorm::new(head_dim, eps)?)
            } else {
                None
            },
            rope: args.rope(is_sliding, head_dim)?,
            n_heads,
            n_kv_heads,
            head_dim,
            eps: eps as f32,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        shared: Option<SharedKv>,
    ) -> Result<(Array, SharedKv)> {
        let (b, l) = batch_len(x)?;
        let heads = |a: Array, n: i32| a.reshape(&[b, l, n, self.head_dim]);
        let queries = self.q_norm.forward(&heads(self.q_proj.forward(x)?, self.n_heads)?)?;
        let shared = match (shared, &self.k_proj, &self.k_norm) {
            (Some(s), _, _) => s,
            (None, Some(k_proj), Some(k_norm)) => {
                let keys = heads(k_proj.forward(x)?, self.n_kv_heads)?;
                let values = match &self.v_proj {
                    Some(v) => heads(v.forward(x)?, self.n_kv_heads)?,
                    None => keys.clone(),
                };
                let offset = match cache.as_ref() {
                    Some(c) => c.rope_offset()?,
                    None => RopePosition::Scalar(0),
                };
                let keys = k_norm.forward(&keys)?.transpose(Some(&[0, 2, 1, 3]))?;
                let keys = self.rope.forward_at(&keys, offset.as_rope_offset())?;
                let values = fast::rms_norm(&values, None, self.eps)?
                    .transpose(Some(&[0, 2, 1, 3]))?;
                let fetch = match cache {
                    Some(c) => mlx_nn::pipeline::update_and_fetch(c, &keys, &values)?,
                    None => KvFetch::Plain { keys, values },
                };
                SharedKv { fetch, offset }
            }
            _ => {
                return Err(mlx_array::Error::InvalidArgument(
                    "a KV-shared gemma4 layer received no shared keys and values".into(),
                ))
            }
        };
        let queries = queries.transpose(Some(&[0, 2, 1, 3]))?;
        let queries = self
            .rope
            .forward_at(&queries, shared.offset.as_rope_offset())?;
        let out = scaled_dot_product_attention(&queries, &shared.fetch, 1.0, mask, None)?;
        let out = out.transpose(Some(&[0, 2, 1, 3]))?.reshape(&[b, l, -1])?;
        Ok((self.o_proj.forward(&out)?, shared))
    }
}

/// The GELU-gated MLP (twice as wide on KV-shared layers with `use_double_wide_mlp`).
#[derive(Debug)]
pub struct Mlp {
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
    fn forward(&self, x: &Array) -> Result<Array> {
        let h = geglu(&self.gate_proj.forward(x)?, &self.up_proj.forward(x)?)?;
        self.down_proj.forward(&h)
    }
}

/// Expert router: norm, scale, project, top-k, softmax, per-expert scale.
#[derive(Debug)]
pub struct Router {
    proj: LinearLayer,
    scale: Param,
    per_expert_scale: Param,
    eps: f32,
    root_size: f64,
    top_k: i32,
}
impl_module!(Router {
    proj,
    scale,
    per_expert_scale
});

impl Router {
    fn forward(&self, x: &Array) -> Result<(Array, Array)> {
        let w = self.scale.multiply(self.root_size)?;
        let scores = self.proj.forward(&fast::rms_norm(x, Some(&w), self.eps)?)?;
        let inds = top_k_indices(&scores, self.top_k)?;
        let weights = scores
            .take_along_axis(&inds, -1)?
            .softmax(Some(&[-1]), false)?;
        let weights = weights.multiply(&self.per_expert_scale.take(&inds, Some(0))?)?;
        Ok((inds, weights))
    }
}

/// The experts (`SwitchGLU` with GeGLU).
#[derive(Debug)]
pub struct Experts {
    switch_glu: SwitchGlu,
}
impl_module!(Experts { switch_glu });

/// One decoder layer. The expert block (router, experts and their norms) and the
/// per-layer input gate sit directly on the layer, as in mlx-lm.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    router: Option<Router>,
    experts: Option<Experts>,
    post_feedforward_layernorm_1: Option<RmsNorm>,
    post_feedforward_layernorm_2: Option<RmsNorm>,
    pre_feedforward_layernorm_2: Option<RmsNorm>,
    per_layer_input_gate: Option<LinearLayer>,
    per_layer_projection: Option<LinearLayer>,
    post_per_layer_input_norm: Option<RmsNorm>,
    layer_scalar: Param,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm,
    pre_feedforward_layernorm,
    post_feedforward_layernorm,
    router,
    experts,
    post_feedforward_layernorm_1,
    post_feedforward_layernorm_2,
    pre_feedforward_layernorm_2,
    per_layer_input_gate,
    per_layer_projection,
    post_per_layer_input_norm,
    layer_scalar,
});

fn some<T>(on: bool, make: impl FnOnce() -> crate::Result<T>) -> crate::Result<Option<T>> {
    Ok(if on { Some(make()?) } else { None })
}

impl DecoderLayer {
    fn new(args: &ModelArgs, i: usize) -> crate::Result<DecoderLayer> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let first_shared = args.num_hidden_layers - args.num_kv_shared_layers;
        let is_kv_shared = i as i32 >= first_shared && first_shared > 0;
        let wide = args.use_double_wide_mlp && is_kv_shared;
        let hidden = args.intermediate_size * if wide { 2 } else { 1 };
        let norm = || Ok(RmsNorm::new(dim, eps)?);
        let moe = args.enable_moe_block;
        let need = |v: Option<i32>, key: &str| {
            v.ok_or_else(|| config_error("gemma4_text", format!("key `{key}` is required with enable_moe_block")))
        };
        let router = some(moe, || {
            let n = need(args.num_experts, "num_experts")?;
            Ok(Router {
                proj: LinearLayer::new(dim, n, false)?,
                scale: Param::new(ops::ones(&[dim], Dtype::Float32)?),
                per_expert_scale: Param::new(ops::ones(&[n], Dtype::Float32)?),
                eps: eps as f32,
                root_size: (dim as f64).powf(-0.5),
                top_k: need(args.top_k_experts, "top_k_experts")?,
            })
        })?;
        let experts = some(moe, || {
            let glu = SwitchGlu::new(
                dim,
                need(args.moe_intermediate_size, "moe_intermediate_size")?,
                need(args.num_experts, "num_experts")?,
                false,
            )?;
            Ok(Experts {
                switch_glu: glu.with_activation(GluActivation::Geglu),
            })
        })?;
        let per_layer = args.per_layer_dim();
        let p = per_layer.unwrap_or(0);
        Ok(DecoderLayer {
            self_attn: Attention::new(args, i)?,
            mlp: Mlp {
                gate_proj: LinearLayer::new(dim, hidden, false)?,
                down_proj: LinearLayer::new(hidden, dim, false)?,
                up_proj: LinearLayer::new(dim, hidden, false)?,
            },
            input_layernorm: norm()?,
            post_attention_layernorm: norm()?,
            pre_feedforward_layernorm: norm()?,
            post_feedforward_layernorm: norm()?,
            router,
            experts,
            post_feedforward_layernorm_1: some(moe, norm)?,
            post_feedforward_layernorm_2: some(moe, norm)?,
            pre_feedforward_layernorm_2: some(moe, norm)?,
            per_layer_input_gate: some(per_layer.is_some(), || {
                Ok(LinearLayer::new(dim, p, false)?)
            })?,
            per_layer_projection: some(per_layer.is_some(), || {
                Ok(LinearLayer::new(p, dim, false)?)
            })?,
            post_per_layer_input_norm: some(per_layer.is_some(), norm)?,
            layer_scalar: Param::new(ops::ones(&[1], Dtype::Float32)?),
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
        per_layer_input: Option<&Array>,
        shared: Option<SharedKv>,
    ) -> Result<(Array, SharedKv)> {
        let (h, shared) =
            self.self_attn
                .forward(&self.input_layernorm.forward(x)?, mask, cache, shared)?;
        let h = x.add(&self.post_attention_layernorm.forward(&h)?)?;
        let ff = match (
            &self.router,
            &self.experts,
            &self.post_feedforward_layernorm_1,
            &self.post_feedforward_layernorm_2,
            &self.pre_feedforward_layernorm_2,
        ) {
            (Some(router), Some(experts), Some(post1), Some(post2), Some(pre2)) => {
                let h1 = post1.forward(&self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?)?;
                let (inds, weights) = router.forward(&h)?;
                let y = experts
                    .switch_glu
                    .forward(&pre2.forward(&h)?, &inds)?;
                let h2 = weights.expand_dims(&[-1])?.multiply(&y)?.sum(Some(&[-2]), false)?;
                h1.add(&post2.forward(&h2)?)?
            }
            _ => self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?,
        };
        let mut h = h.add(&self.post_feedforward_layernorm.forward(&ff)?)?;
        if let (Some(gate), Some(proj), Some(norm), Some(pli)) = (
            &self.per_layer_input_gate,
            &self.per_layer_projection,
            &self.post_per_layer_input_norm,
            per_layer_input,
        ) {
            let g = gelu_approx(&gate.forward(&h)?)?.multiply(pli)?;
            h = h.add(&norm.forward(&proj.forward(&g)?)?)?;
        }
        Ok((h.multiply(&*self.layer_scalar)?, shared))
    }
}

impl DecoderLayer {
    /// [`DecoderLayer::forward`] without a cache, checkpointed (mlx-lm's
    /// `grad_checkpoint`): its array arguments (`x`, the per-layer input, the shared
    /// keys and values) are the inputs of the checkpointed call, and the hidden state
    /// and the keys and values it hands on are its outputs, so the gradient of a later
    /// layer reading them reaches the layer that made them.
    fn checkpointed(
        &self,
        x: &Array,
        mask: &AttnMask,
        per_layer_input: Option<Array>,
        shared: Option<SharedKv>,
    ) -> Result<(Array, SharedKv)> {
        let mut inputs = vec![x];
        if let Some(p) = &per_layer_input {
            inputs.push(p);
        }
        // Without a cache the keys and values are plain and the RoPE offset is 0, or
        // the one handed on with them.
        let offset = match &shared {
            Some(s) => s.offset.clone(),
            None => RopePosition::Scalar(0),
        };
        if let Some(SharedKv {
            fetch: KvFetch::Plain { keys, values },
            ..
        }) = &shared
        {
            inputs.extend([keys, values]);
        }
        let (has_pli, has_shared) = (per_layer_input.is_some(), shared.is_some());
        let (mask, at) = (mask.clone(), offset.clone());
        let out = mlx_nn::checkpoint::call(self, &inputs, None, move |l, a, cache| {
            let pli = if has_pli { a.get(1) } else { None };
            let kv = usize::from(has_pli) + 1;
            let shared = match (has_shared, a.get(kv), a.get(kv + 1)) {
                (true, Some(keys), Some(values)) => Some(SharedKv {
                    fetch: KvFetch::Plain {
                        keys: keys.clone(),
                        values: values.clone(),
                    },
                    offset: at.clone(),
                }),
                _ => None,
            };
            let (h, shared) = l.forward(&a[0], &mask, cache, pli, shared)?;
            match shared.fetch {
                KvFetch::Plain { keys, values } => Ok(vec![h, keys, values]),
                KvFetch::Quantized { .. } => Err(mlx_array::Error::InvalidArgument(
                    "a checkpointed gemma4 layer made quantized keys and values".into(),
                )),
            }
        })?;
        match <[Array; 3]>::try_from(out) {
            Ok([h, keys, values]) => Ok((
                h,
                SharedKv {
                    fetch: KvFetch::Plain { keys, values },
                    offset,
                },
            )),
            Err(_) => Err(mlx_array::Error::InvalidArgument(
                "a checkpointed gemma4 layer gave other than 3 outputs".into(),
            )),
        }
    }
}

/// The per-layer input embeddings and their projection from the hidden state.
#[derive(Debug)]
pub struct PerLayerInputs {
    embed_tokens_per_layer: EmbeddingLayer,
    per_layer_model_projection: LinearLayer,
    per_layer_projection_norm: RmsNorm,
}
impl_module!(PerLayerInputs {
    embed_tokens_per_layer,
    per_layer_model_projection,
    per_layer_projection_norm
});

/// The decoder stack.
#[derive(Debug)]
pub struct Gemma4TextModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    per_layer: Option<PerLayerInputs>,
    /// For each layer, the layer whose keys and values it reads (itself if it has its own).
    previous_kvs: Vec<usize>,
    sliding: Vec<bool>,
    n_caches: usize,
    hidden_size: i32,
    per_layer_dim: i32,
    window: i32,
}

impl mlx_nn::Module for Gemma4TextModel {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        // mlx-lm keeps the per-layer input modules directly on the text model.
        self.embed_tokens.visit_params(&join(prefix, "embed_tokens"), f);
        self.layers.visit_params(&join(prefix, "layers"), f);
        self.norm.visit_params(&join(prefix, "norm"), f);
        self.per_layer.visit_params(prefix, f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.embed_tokens.visit_params_mut(&join(prefix, "embed_tokens"), f);
        self.layers.visit_params_mut(&join(prefix, "layers"), f);
        self.norm.visit_params_mut(&join(prefix, "norm"), f);
        self.per_layer.visit_params_mut(prefix, f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut mlx_nn::module::QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.embed_tokens.visit_quantizable_mut(&join(prefix, "embed_tokens"), f)?;
        self.layers.visit_quantizable_mut(&join(prefix, "layers"), f)?;
        self.norm.visit_quantizable_mut(&join(prefix, "norm"), f)?;
        self.per_layer.visit_quantizable_mut(prefix, f)
    }
}

impl Gemma4TextModel {
    fn new(args: &ModelArgs) -> crate::Result<Gemma4TextModel> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let n = args.num_hidden_layers.max(0) as usize;
        let layers = (0..n)
            .map(|i| DecoderLayer::new(args, i))
            .collect::<crate::Result<Vec<_>>>()?;
        let types = &args.types()[..n];
        let m = args.first_kv_shared();
        let mut previous_kvs: Vec<usize> = (0..n).collect();
        if args.num_kv_shared_layers > 0 {
            for j in m..n {
                previous_kvs[j] = (0..m).rev().find(|&i| types[i] == types[j]).ok_or_else(|| {
                    config_error("gemma4_text", format!(
                        "layer {j} shares the keys and values of an earlier \"{}\" layer, \
                         but none of the first {m} layers is one",
                        types[j]
                    ))
                })?;
            }
        }
        let per_layer_dim = args.per_layer_dim().unwrap_or(0);
        let per_layer = some(args.per_layer_dim().is_some(), || {
            Ok(PerLayerInputs {
                embed_tokens_per_layer: EmbeddingLayer::new(
                    args.vocab_size_per_layer_input,
                    args.num_hidden_layers * per_layer_dim,
                )?,
                per_layer_model_projection: LinearLayer::new(
                    dim,
                    args.num_hidden_layers * per_layer_dim,
                    false,
                )?,
                per_layer_projection_norm: RmsNorm::new(per_layer_dim, eps)?,
            })
        })?;
        Ok(Gemma4TextModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
            per_layer,
            previous_kvs,
            sliding: types.iter().map(|t| t == SLIDING).collect(),
            n_caches: if args.num_kv_shared_layers > 0 { m } else { n },
            hidden_size: dim,
            per_layer_dim,
            window: args.sliding_window,
        })
    }

    /// `_get_per_layer_inputs` then `_project_per_layer_inputs`: `[B, L, layers, P]`.
    fn per_layer_inputs(&self, p: &PerLayerInputs, inputs: &Array, h: &Array) -> Result<Array> {
        let (b, l) = batch_len(h)?;
        let shape = [b, l, self.layers.len() as i32, self.per_layer_dim];
        let scale = (self.per_layer_dim as f64).powf(0.5);
        let embedded = p
            .embed_tokens_per_layer
            .forward(inputs)?
            .multiply(scale)?
            .reshape(&shape)?;
        let projected = p
            .per_layer_model_projection
            .forward(h)?
            .multiply((self.hidden_size as f64).powf(-0.5))?
            .reshape(&shape)?;
        let projected = p.per_layer_projection_norm.forward(&projected)?;
        projected.add(&embedded)?.multiply(2f64.powf(-0.5))
    }

    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        if !caches.is_empty() && caches.len() != self.n_caches {
            return Err(mlx_array::Error::InvalidArgument(format!(
                "gemma4 wants {} caches (one per layer with its own keys and values), got {}",
                self.n_caches,
                caches.len()
            )));
        }
        let h = self.embed_tokens.forward(inputs)?;
        let mut h = h.multiply((self.hidden_size as f64).powf(0.5))?;
        let per_layer = match &self.per_layer {
            Some(p) => Some(self.per_layer_inputs(p, inputs, &h)?),
            None => None,
        };
        // One mask per layer type, from the cache of the first layer of that type.
        let n = h.dim(1)?;
        let mut masks: [Option<AttnMask>; 2] = [None, None];
        for (i, &s) in self.sliding.iter().enumerate() {
            let slot = &mut masks[usize::from(s)];
            if slot.is_none() {
                let cache = caches.get(i).map(|c| c.as_ref());
                *slot = Some(create_attention_mask(n, cache, s.then_some(self.window), false)?);
            }
        }
        let mut shared: Vec<Option<SharedKv>> = vec![None; self.layers.len()];
        let mut caches = caches.iter_mut();
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = caches.next().map(|c| c.as_mut() as &mut dyn KvCache);
            let mask = masks[usize::from(self.sliding[i])]
                .as_ref()
                .unwrap_or(&AttnMask::None);
            let pli = match &per_layer {
                Some(p) => Some(p.slice_axis(2, i as i32, i as i32 + 1)?.squeeze(Some(&[2]))?),
                None => None,
            };
            let prev = self.previous_kvs[i];
            let from = if prev == i { None } else { shared[prev].clone() };
            let (out, kv) = if cache.is_some() || !mlx_nn::checkpoint::enabled() {
                layer.forward(&h, mask, cache, pli.as_ref(), from)?
            } else {
                layer.checkpointed(&h, mask, pli, from)?
            };
            h = out;
            shared[i] = Some(kv);
        }
        self.norm.forward(&h)
    }
}

/// Gemma 4 text with its head (tied unless `tie_word_embeddings` is false).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Gemma4TextModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Reads the arguments (all keys have mlx-lm's defaults) and builds the model with
    /// zero placeholders.
    pub fn from_config(config: &Value) -> crate::Result<Model> {
        let mut args: ModelArgs = parse_args(config, "gemma4_text")?;
        args.post_init()?;
        let model = Gemma4TextModel::new(&args)?;
        let lm_head = head::untied(args.tie_word_embeddings, args.hidden_size, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }

}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::from_config(config)?))
}

/// mlx-lm's `logit_softcap(softcap, x)`: `tanh(x / softcap) * softcap`, compiled with
/// `softcap` a constant.
fn logit_softcap(cap: f64, x: &Array) -> Result<Array> {
    let make = move || -> mlx_nn::activations::KeyedBody {
        Box::new(move |a: &[Array]| Ok(vec![a[0].divide(cap)?.tanh()?.multiply(cap)?]))
    };
    let mut out = call_compiled_keyed(&format!("gemma4_logit_softcap_{cap:e}"), make, &[x])?;
    out.pop()
        .ok_or_else(|| mlx_array::Error::InvalidArgument("logit_softcap: no output".into()))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let out = head::logits(
            &self.model.embed_tokens,
            self.lm_head.as_ref(),
            &out,
            head::LogitScale::None,
        )?;
        match self.args.final_logit_softcapping {
            Some(cap) => logit_softcap(cap, &out),
            None => Ok(out),
        }
    }
    /// `make_cache`: one cache per layer with its own keys and values (the KV-shared
    /// layers read theirs from an earlier layer).
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model.sliding[..self.args.first_kv_shared()]
            .iter()
            .map(|&s| {
                if s {
                    CacheSpec::Rotating {
                        max_size: self.args.sliding_window,
                        keep: 0,
                    }
                } else {
                    CacheSpec::Standard
                }
            })
            .collect()
    }
    decoder_accessors!();
    fn defines_make_cache(&self) -> bool {
        true
    }
}

/// mlx-lm's `sanitize`: drops rotary buffers and calibration ranges, the k/v
/// projections of KV-shared layers, and splits the fused expert projections.
pub(crate) fn sanitize(weights: Weights, first_kv_shared: usize) -> crate::Result<Weights> {
    const DROPPED: [&str; 5] = [
        "self_attn.rotary_emb",
        "input_max",
        "input_min",
        "output_max",
        "output_min",
    ];
    const KV: [&str; 3] = [".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"];
    let mut out = Weights::new();
    for (k, v) in weights {
        if DROPPED.iter().any(|s| k.contains(s)) {
            continue;
        }
        if KV.iter().any(|s| k.contains(s)) {
            let idx = k
                .split_once("layers.")
                .and_then(|(_, rest)| rest.split('.').next())
                .and_then(|i| i.parse::<usize>().ok());
            if idx.is_some_and(|i| i >= first_kv_shared) {
                continue;
            }
        }
        if let Some(base) = k.strip_suffix(".experts.gate_up_proj") {
            let parts = v.split_sections(2, -2)?;
            let [gate, up] = <[Array; 2]>::try_from(parts).map_err(|_| {
                crate::Error::Config {
                    path: k.clone(),
                    message: "could not split gate_up_proj in two".into(),
                }
            })?;
            out.insert(format!("{base}.experts.switch_glu.gate_proj.weight"), gate.contiguous()?);
            out.insert(format!("{base}.experts.switch_glu.up_proj.weight"), up.contiguous()?);
            continue;
        }
        if let Some(base) = k.strip_suffix(".experts.down_proj") {
            out.insert(format!("{base}.experts.switch_glu.down_proj.weight"), v);
            continue;
        }
        out.insert(k, v);
    }
    Ok(out)
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        sanitize(weights, self.args.first_kv_shared())
    }
}

impl Model {
    /// The first KV-shared layer (for the multimodal wrapper's sanitize).
    pub(crate) fn first_kv_shared(&self) -> usize {
        self.args.first_kv_shared()
    }
}
