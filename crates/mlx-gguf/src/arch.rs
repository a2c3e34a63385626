//! Architectures: llama.cpp tensor names to Hugging Face names, and per-architecture facts.
use crate::error::{GgufError, Result};

/// What differs between the supported architectures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arch {
    /// `general.architecture` in the GGUF.
    pub gguf_name: &'static str,
    /// `model_type` in config.json (the mlx-lm module name).
    pub model_type: &'static str,
    /// `architectures[0]` in config.json.
    pub hf_class: &'static str,
    /// Whether llama.cpp's converter permuted the Q/K rows (interleaved RoPE): undone on import.
    pub permuted_qk: bool,
    /// config.json needs `head_dim` even when it is `hidden_size / num_attention_heads`.
    pub needs_head_dim: bool,
    /// Default `rope_theta` when the file has no `rope.freq_base`.
    pub default_rope_theta: f64,
}

/// The architectures this importer maps.
pub const ARCHES: &[Arch] = &[
    Arch {
        gguf_name: "llama",
        model_type: "llama",
        hf_class: "LlamaForCausalLM",
        permuted_qk: true,
        needs_head_dim: false,
        default_rope_theta: 10000.0,
    },
    Arch {
        gguf_name: "qwen2",
        model_type: "qwen2",
        hf_class: "Qwen2ForCausalLM",
        permuted_qk: false,
        needs_head_dim: false,
        default_rope_theta: 1_000_000.0,
    },
    Arch {
        gguf_name: "qwen3",
        model_type: "qwen3",
        hf_class: "Qwen3ForCausalLM",
        permuted_qk: false,
        needs_head_dim: true,
        default_rope_theta: 1_000_000.0,
    },
];

impl Arch {
    /// Looks up `general.architecture`.
    pub fn from_gguf(name: &str) -> Result<Arch> {
        ARCHES
            .iter()
            .copied()
            .find(|a| a.gguf_name == name)
            .ok_or_else(|| GgufError::UnsupportedArchitecture {
                arch: name.to_string(),
                supported: ARCHES
                    .iter()
                    .map(|a| a.gguf_name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

/// The role a tensor plays, where the importer must treat it specially.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Query projection (rows permuted for llama).
    Query,
    /// Key projection (rows permuted for llama).
    Key,
    /// Anything else.
    Other,
}

/// Maps a GGUF module path (a tensor name without its last component) to its Hugging Face
/// module path and role. `None` for tensors that have no Hugging Face counterpart and are
/// dropped (`rope_freqs`).
pub fn map_module(module: &str, arch: &Arch) -> Result<Option<(String, Role)>> {
    let unknown = || GgufError::UnknownTensor {
        tensor: module.to_string(),
        arch: arch.gguf_name.to_string(),
    };
    match module {
        "token_embd" => return Ok(Some(("model.embed_tokens".into(), Role::Other))),
        "output_norm" => return Ok(Some(("model.norm".into(), Role::Other))),
        "output" => return Ok(Some(("lm_head".into(), Role::Other))),
        "rope_freqs" => return Ok(None),
        _ => {}
    }
    let rest = module.strip_prefix("blk.").ok_or_else(unknown)?;
    let (layer, part) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: u32 = layer.parse().map_err(|_| unknown())?;
    let (hf, role) = match part {
        "attn_norm" => ("input_layernorm", Role::Other),
        "ffn_norm" => ("post_attention_layernorm", Role::Other),
        "attn_q" => ("self_attn.q_proj", Role::Query),
        "attn_k" => ("self_attn.k_proj", Role::Key),
        "attn_v" => ("self_attn.v_proj", Role::Other),
        "attn_output" => ("self_attn.o_proj", Role::Other),
        "attn_q_norm" if arch.gguf_name == "qwen3" => ("self_attn.q_norm", Role::Other),
        "attn_k_norm" if arch.gguf_name == "qwen3" => ("self_attn.k_norm", Role::Other),
        "ffn_gate" => ("mlp.gate_proj", Role::Other),
        "ffn_up" => ("mlp.up_proj", Role::Other),
        "ffn_down" => ("mlp.down_proj", Role::Other),
        _ => return Err(unknown()),
    };
    Ok(Some((format!("model.layers.{layer}.{hf}"), role)))
}

/// Splits a GGUF tensor name into module path and leaf (`weight` or `bias`).
pub fn split_leaf(name: &str) -> Option<(&str, &str)> {
    let (module, leaf) = name.rsplit_once('.')?;
    matches!(leaf, "weight" | "bias").then_some((module, leaf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_names_map_to_hugging_face_names() {
        let llama = Arch::from_gguf("llama").unwrap();
        let cases = [
            ("token_embd", "model.embed_tokens"),
            ("output_norm", "model.norm"),
            ("output", "lm_head"),
            ("blk.0.attn_norm", "model.layers.0.input_layernorm"),
            (
                "blk.12.ffn_norm",
                "model.layers.12.post_attention_layernorm",
            ),
            ("blk.3.attn_q", "model.layers.3.self_attn.q_proj"),
            ("blk.3.attn_k", "model.layers.3.self_attn.k_proj"),
            ("blk.3.attn_v", "model.layers.3.self_attn.v_proj"),
            ("blk.3.attn_output", "model.layers.3.self_attn.o_proj"),
            ("blk.29.ffn_gate", "model.layers.29.mlp.gate_proj"),
            ("blk.29.ffn_up", "model.layers.29.mlp.up_proj"),
            ("blk.29.ffn_down", "model.layers.29.mlp.down_proj"),
        ];
        for (g, hf) in cases {
            assert_eq!(map_module(g, &llama).unwrap().unwrap().0, hf, "{g}");
        }
        assert_eq!(
            map_module("blk.1.attn_q", &llama).unwrap().unwrap().1,
            Role::Query
        );
        assert_eq!(map_module("rope_freqs", &llama).unwrap(), None);
        assert!(matches!(
            map_module("blk.1.attn_q_norm", &llama),
            Err(GgufError::UnknownTensor { .. })
        ));
        assert!(matches!(
            map_module("blk.x.attn_q", &llama),
            Err(GgufError::UnknownTensor { .. })
        ));
    }

    #[test]
    fn unsupported_architecture_error_lists_the_supported_ones() {
        let e = Arch::from_gguf("gemma2").unwrap_err().to_string();
        assert!(
            e.contains("gemma2") && e.contains("llama, qwen2, qwen3"),
            "{e}"
        );
    }

    #[test]
    fn split_leaf_accepts_weight_and_bias_only() {
        assert_eq!(
            split_leaf("blk.0.attn_q.bias"),
            Some(("blk.0.attn_q", "bias"))
        );
        assert_eq!(
            split_leaf("token_embd.weight"),
            Some(("token_embd", "weight"))
        );
        assert_eq!(split_leaf("token_embd.scales"), None);
    }
}
