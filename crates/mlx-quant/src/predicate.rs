//! Quantization predicates: what mlx-lm's `quant_predicate` callables return for a layer,
//! the mixed-bit recipes of `mlx_lm.convert --quant-predicate`, and the per-model
//! predicates some architectures define.
use crate::error::{QuantError, Result};
use mlx_array::quant::QuantMode;
use mlx_nn::QuantSpec;
use serde_json::{json, Map, Value};

/// What a predicate says about one quantizable layer (mlx-lm's `bool | dict`).
#[derive(Debug, Clone, PartialEq)]
pub enum LayerChoice {
    /// `False`: keep the layer dense.
    Skip,
    /// `True`: quantize with the call's group size, bits and mode.
    Default,
    /// A dict of `to_quantized` arguments (`group_size`, `bits`, `mode`; absent or null
    /// values take the defaults of the mode, which is `affine` when absent). Recorded
    /// verbatim as the layer's entry in the config's `quantization` section.
    Params(Map<String, Value>),
}

impl LayerChoice {
    /// The spec mlx.nn's `to_quantized(**params)` would use (`default` for [`LayerChoice::Default`]).
    pub fn spec(&self, default: QuantSpec) -> Result<Option<QuantSpec>> {
        match self {
            LayerChoice::Skip => Ok(None),
            LayerChoice::Default => Ok(Some(default)),
            LayerChoice::Params(m) => {
                let int = |k: &str| m.get(k).and_then(Value::as_i64).map(|v| v as i32);
                let mode = match m.get("mode").and_then(Value::as_str) {
                    Some(s) => QuantMode::parse(s)?,
                    None => QuantMode::Affine,
                };
                Ok(Some(QuantSpec::new(int("group_size"), int("bits"), mode)))
            }
        }
    }
}

/// A mixed-bit recipe of `mlx_lm.convert --quant-predicate` (after llama.cpp's Q4_K_M
/// choices: more bits for `v_proj` and `down_proj` of the first and last eighth of the
/// layers and every third layer between, and for `lm_head`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// 2 bits, 6 for the sensitive layers.
    Mixed2_6,
    /// 3 bits, 4 for the sensitive layers.
    Mixed3_4,
    /// 3 bits, 6 for the sensitive layers.
    Mixed3_6,
    /// 4 bits, 6 for the sensitive layers.
    Mixed4_6,
}

impl Recipe {
    /// Every recipe, in mlx-lm's `QUANT_RECIPES` order.
    pub const ALL: [Recipe; 4] = [
        Recipe::Mixed2_6,
        Recipe::Mixed3_4,
        Recipe::Mixed3_6,
        Recipe::Mixed4_6,
    ];

    /// The recipe's name (`mixed_3_6`).
    pub fn name(self) -> &'static str {
        match self {
            Recipe::Mixed2_6 => "mixed_2_6",
            Recipe::Mixed3_4 => "mixed_3_4",
            Recipe::Mixed3_6 => "mixed_3_6",
            Recipe::Mixed4_6 => "mixed_4_6",
        }
    }

    /// Parses a recipe name.
    pub fn parse(name: &str) -> Result<Recipe> {
        Recipe::ALL
            .into_iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| {
                QuantError::Options(format!(
                    "invalid quant recipe `{name}` (expected one of mixed_2_6, mixed_3_4, \
                     mixed_3_6, mixed_4_6)"
                ))
            })
    }

    /// `(low_bits, high_bits)`.
    pub fn bits(self) -> (i32, i32) {
        match self {
            Recipe::Mixed2_6 => (2, 6),
            Recipe::Mixed3_4 => (3, 4),
            Recipe::Mixed3_6 => (3, 6),
            Recipe::Mixed4_6 => (4, 6),
        }
    }
}

/// mlx-lm's `mixed_quant_predicate_builder(recipe, model, group_size)`, built from the
/// model's quantizable layer paths and its number of layers.
#[derive(Debug, Clone)]
pub struct MixedPredicate {
    recipe: Recipe,
    group_size: Option<i32>,
    layer_location: usize,
    num_layers: i64,
}

impl MixedPredicate {
    /// Builds the predicate. `layer_paths` are the model's module paths (only the first
    /// one containing `down_proj` is used, to find which path component is the layer
    /// index); `group_size` is `--q-group-size` as given (`None` is written as `null`
    /// into the config, as mlx-lm does).
    pub fn new(
        recipe: Recipe,
        layer_paths: &[String],
        num_layers: usize,
        group_size: Option<i32>,
    ) -> Result<MixedPredicate> {
        let first = layer_paths
            .iter()
            .find(|p| p.contains("down_proj"))
            .ok_or_else(|| {
                QuantError::Unsupported(
                    "model does not have expected keys for mixed quant (no `down_proj` layer)"
                        .into(),
                )
            })?;
        let parts: Vec<&str> = first.split('.').collect();
        // Python's `for i, k in enumerate(parts): if k.isdigit(): break` leaves the last
        // index when no component is a number.
        let layer_location = parts
            .iter()
            .position(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()))
            .unwrap_or(parts.len().saturating_sub(1));
        Ok(MixedPredicate {
            recipe,
            group_size,
            layer_location,
            num_layers: num_layers as i64,
        })
    }

    /// The choice for the layer at `path`.
    pub fn choose(&self, path: &str) -> Result<LayerChoice> {
        let parts: Vec<&str> = path.split('.').collect();
        let index: i64 = if parts.len() > self.layer_location {
            let p = parts[self.layer_location];
            p.parse().map_err(|_| {
                QuantError::Unsupported(format!(
                    "mixed quant: component {} of `{path}` (`{p}`) is not a layer index",
                    self.layer_location
                ))
            })?
        } else {
            0
        };
        let n = self.num_layers;
        let use_more_bits =
            index < n / 8 || index >= 7 * n / 8 || (index - n / 8).rem_euclid(3) == 2;
        let (low, high) = self.recipe.bits();
        // The v projections and down_proj of the chosen layers, and lm_head.
        let v_proj = ["v_proj", "v_a_proj", "v_b_proj"]
            .iter()
            .any(|k| path.contains(k));
        let high_layer =
            (use_more_bits && (v_proj || path.contains("down_proj"))) || path.contains("lm_head");
        let bits = if high_layer { high } else { low };
        let Value::Object(m) = json!({
            "group_size": self.group_size,
            "bits": bits,
            "mode": "affine",
        }) else {
            return Err(QuantError::Unsupported("internal: not an object".into()));
        };
        Ok(LayerChoice::Params(m))
    }
}

/// The `quant_predicate` property some mlx-lm models define (used when no recipe is
/// given): qwen3_moe (and Klear, mellum) keeps its router (`mlp.gate`) at 8 bits, group size 64, gpt_oss
/// its `router`, minimax its `block_sparse_moe.gate`, granite its `o_proj`, `down_proj`
/// and `lm_head` (granitemoe those and
/// its `router.layer`), the qwen3_next family
/// its router and shared-expert gate, granitemoehybrid its `router.layer`, lfm2_moe
/// its `feed_forward.gate`, bailing_moe its `mlp.gate.gate_proj`, Gemma 4 its
/// `router.proj` (affine, whatever the mode asked for), laguna its `mlp.gate.proj`, afmoe
/// any layer whose path contains `router.gate`, jamba its `feed_forward.router`, step3p5
/// any layer whose path contains `mlp.gate.gate`, rwkv7 its LoRAs' `lora.2` and its
/// `embeddings` (`{"bits": 8}`, no group size), longcat_flash its `classifier`;
/// spark2_5 leaves its
/// `self_attn.g_proj` dense.
pub fn model_predicate(model_type: &str, path: &str) -> Option<LayerChoice> {
    let eight_bits = || {
        let mut m = Map::new();
        m.insert("group_size".into(), 64.into());
        m.insert("bits".into(), 8.into());
        LayerChoice::Params(m)
    };
    let choose = |high: bool| {
        if high {
            eight_bits()
        } else {
            LayerChoice::Default
        }
    };
    match model_type {
        "qwen3_moe" | "qwen3_vl_moe" | "Klear" | "mellum" => {
            Some(choose(path.ends_with("mlp.gate")))
        }
        "gpt_oss" => Some(choose(path.ends_with("router"))),
        "granite" => Some(choose(
            path.ends_with("self_attn.o_proj")
                || path.ends_with("mlp.down_proj")
                || path == "lm_head",
        )),
        // Without experts (dense qwen3_5) neither layer exists, as mlx-lm's `None`.
        "qwen3_next" | "qwen3_5" | "qwen3_5_moe" => Some(choose(
            path.ends_with("mlp.gate") || path.ends_with("shared_expert_gate"),
        )),
        "granitemoehybrid" => Some(choose(path.ends_with("router.layer"))),
        "minimax" => Some(choose(path.ends_with("block_sparse_moe.gate"))),
        "lfm2_moe" => Some(choose(path.ends_with("feed_forward.gate"))),
        "bailing_moe" => Some(choose(path.ends_with("mlp.gate.gate_proj"))),
        "gemma4_text" | "gemma4" => Some(choose(path.ends_with("router.proj"))),
        "laguna" => Some(choose(path.ends_with("mlp.gate.proj"))),
        "afmoe" => Some(choose(path.contains("router.gate"))),
        "jamba" => Some(choose(path.ends_with("router"))),
        "step3p5" => Some(choose(path.contains("mlp.gate.gate"))),
        "longcat_flash" => Some(choose(path.ends_with("classifier"))),
        // `{"bits": 8}` alone: the group size and mode are `to_quantized`'s defaults.
        "rwkv7" => Some(if path.contains("lora.2") || path.contains("embeddings") {
            let mut m = Map::new();
            m.insert("bits".into(), 8.into());
            LayerChoice::Params(m)
        } else {
            LayerChoice::Default
        }),
        // The per-head attention gate stays in the source precision.
        "spark2_5" => Some(if path.ends_with("self_attn.g_proj") {
            LayerChoice::Skip
        } else {
            LayerChoice::Default
        }),
        "granitemoe" => Some(choose(
            path.ends_with("block_sparse_moe.router.layer")
                || path.ends_with("self_attn.o_proj")
                || path.ends_with("mlp.down_proj")
                || path == "lm_head",
        )),
        _ => None,
    }
}

/// The `cast_predicate` some mlx-lm models define: parameters `--dtype` leaves in their
/// own dtype (the SSM decay `A_log` of qwen3_5 and nemotron_h, the router correction
/// bias of glm4_moe (and solar_open), minimax, exaone_moe, laguna, mimo_v2_flash, the
/// DeepSeek-V3 family (V3.2,
/// glm_moe_dsa, kimi_k25 and kimi_vl included),
/// nemotron_h, the `expert_bias` of lfm2_moe, bailing_moe, Klear and afmoe, and the
/// `router_bias` of step3p5; longcat_flash's correction bias too).
pub fn model_keeps_dtype(model_type: &str, path: &str) -> bool {
    match model_type {
        "glm4_moe" | "glm4_moe_lite" | "deepseek_v3" | "kimi_k2" | "joyai_llm_flash"
        | "kimi_k25" | "kimi_vl" | "deepseek_v32" | "glm_moe_dsa" | "solar_open" | "minimax"
        | "exaone_moe" | "laguna" | "mimo_v2_flash" | "longcat_flash" => {
            path.contains("e_score_correction_bias")
        }
        "lfm2_moe" | "bailing_moe" | "Klear" | "afmoe" => path.contains("expert_bias"),
        "step3p5" => path.contains("router_bias"),
        "qwen3_5" | "qwen3_5_moe" => path.ends_with("A_log"),
        "nemotron_h" => path.contains("e_score_correction_bias") || path.contains("A_log"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(n: usize) -> Vec<String> {
        (0..n)
            .flat_map(|i| {
                ["self_attn.v_proj", "self_attn.q_proj", "mlp.down_proj"]
                    .map(|s| format!("model.layers.{i}.{s}"))
            })
            .collect()
    }

    fn bits(c: LayerChoice) -> i64 {
        match c {
            LayerChoice::Params(m) => m["bits"].as_i64().unwrap_or(-1),
            _ => -1,
        }
    }

    #[test]
    fn mixed_3_6_gives_six_bits_to_first_last_and_every_third_layer() {
        // 16 layers: n/8 = 2, 7n/8 = 14; more bits for 0, 1, 4, 7, 10, 13, 14, 15.
        let p = MixedPredicate::new(Recipe::Mixed3_6, &paths(16), 16, Some(64)).unwrap();
        let high: Vec<i64> = (0..16)
            .filter(|i| {
                bits(
                    p.choose(&format!("model.layers.{i}.mlp.down_proj"))
                        .unwrap(),
                ) == 6
            })
            .collect();
        assert_eq!(high, [0, 1, 4, 7, 10, 13, 14, 15]);
        assert_eq!(
            bits(p.choose("model.layers.4.self_attn.q_proj").unwrap()),
            3
        );
        assert_eq!(
            bits(p.choose("model.layers.4.self_attn.v_proj").unwrap()),
            6
        );
        assert_eq!(bits(p.choose("lm_head").unwrap()), 6);
        assert_eq!(bits(p.choose("model.embed_tokens").unwrap()), 3);
    }

    #[test]
    fn mixed_predicate_records_a_null_group_size_when_none_was_given() {
        let p = MixedPredicate::new(Recipe::Mixed3_4, &paths(2), 2, None).unwrap();
        let LayerChoice::Params(m) = p.choose("model.layers.0.mlp.up_proj").unwrap() else {
            panic!("expected params")
        };
        assert_eq!(
            Value::Object(m),
            json!({"group_size": null, "bits": 3, "mode": "affine"})
        );
    }

    #[test]
    fn mixed_predicate_needs_a_down_proj() {
        let err = MixedPredicate::new(Recipe::Mixed2_6, &["model.x.0.up".into()], 1, None);
        assert!(err.unwrap_err().to_string().contains("down_proj"));
    }

    #[test]
    fn recipe_names_round_trip_and_unknown_names_fail() {
        for r in Recipe::ALL {
            assert_eq!(Recipe::parse(r.name()).unwrap(), r);
        }
        assert!(Recipe::parse("mixed_5_8").is_err());
    }
}
