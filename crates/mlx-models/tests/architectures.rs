//! Every architecture on a tiny config with random weights: logits shape and dtype,
//! batches, and cached decoding against the full forward.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;
use common::{caches, max_diff, random_model, tiny, tokens};
use mlx_array::Dtype;

fn logits_are_batch_by_length_by_vocab(model_type: &str) {
    let m = random_model(&tiny(model_type), 1);
    let t = tokens(&[&[1, 2, 3, 4, 5], &[9, 8, 7, 6, 5]]);
    let y = m.forward(&t, &mut []).unwrap();
    assert_eq!(y.shape(), [2, 5, 64]);
    assert_eq!(y.dtype(), Dtype::Float32);
    assert_eq!(m.vocab_size(), 64);
    assert_eq!(m.num_layers(), 2);
    assert_eq!(m.cache_specs().len(), 2);
    // Each row of a batch is the same computation as the row alone.
    let row = m.forward(&tokens(&[&[9, 8, 7, 6, 5]]), &mut []).unwrap();
    let second = y.slice_axis(0, 1, 2).unwrap();
    assert!(
        max_diff(&second, &row) < 1e-4,
        "{}",
        max_diff(&second, &row)
    );
}

fn decode_step_matches_full_forward(model_type: &str) {
    let m = random_model(&tiny(model_type), 2);
    let prompt: &[i32] = &[3, 1, 4, 1, 5, 9, 2];
    let full = m.forward(&tokens(&[prompt]), &mut []).unwrap();
    let mut c = caches(m.as_ref());
    let n = prompt.len() as i32;
    // Prefill all but two tokens, then decode the last two one at a time.
    let pre = m.forward(&tokens(&[&prompt[..5]]), &mut c).unwrap();
    assert_eq!(c[0].offset(), 5);
    let s1 = m.forward(&tokens(&[&prompt[5..6]]), &mut c).unwrap();
    let s2 = m.forward(&tokens(&[&prompt[6..7]]), &mut c).unwrap();
    assert_eq!(c[1].offset(), n);
    let cached = mlx_array::concatenate(&[&pre, &s1, &s2], 1).unwrap();
    let d = max_diff(&cached, &full);
    assert!(
        d < 1e-4,
        "{model_type}: cached decode differs from the full forward by {d}"
    );
}

fn bfloat16_weights_give_bfloat16_logits(model_type: &str) {
    let mut m = random_model(&tiny(model_type), 3);
    m.cast_floating(Dtype::Bfloat16).unwrap();
    let y = m.forward(&tokens(&[&[1, 2, 3]]), &mut []).unwrap();
    assert_eq!(y.dtype(), Dtype::Bfloat16);
    assert_eq!(y.shape(), [1, 3, 64]);
}

macro_rules! arch_tests {
    ($($m:ident => $t:literal),* $(,)?) => {$(
        mod $m {
            #[test]
            fn logits_are_batch_by_length_by_vocab() {
                super::logits_are_batch_by_length_by_vocab($t)
            }
            #[test]
            fn decode_step_matches_full_forward() {
                super::decode_step_matches_full_forward($t)
            }
        }
    )*};
}

// MLX's CPU gather_mm runs float32 only, so the MoE models are left out here.
macro_rules! bf16_tests {
    ($($m:ident => $t:literal),* $(,)?) => {$(
        #[test]
        fn $m() {
            bfloat16_weights_give_bfloat16_logits($t)
        }
    )*};
}

bf16_tests! {
    llama_bfloat16_weights_give_bfloat16_logits => "llama",
    qwen2_bfloat16_weights_give_bfloat16_logits => "qwen2",
    qwen3_bfloat16_weights_give_bfloat16_logits => "qwen3",
    phi3_bfloat16_weights_give_bfloat16_logits => "phi3",
    gemma2_bfloat16_weights_give_bfloat16_logits => "gemma2",
    gemma3_text_bfloat16_weights_give_bfloat16_logits => "gemma3_text",
    gemma3_bfloat16_weights_give_bfloat16_logits => "gemma3",
}

arch_tests! {
    llama => "llama",
    mistral => "mistral",
    qwen2 => "qwen2",
    qwen3 => "qwen3",
    phi3 => "phi3",
    gemma2 => "gemma2",
    gemma3_text => "gemma3_text",
    gemma3 => "gemma3",
    qwen3_moe => "qwen3_moe",
    mixtral => "mixtral",
}

#[test]
fn sliding_layers_ask_for_rotating_caches() {
    use mlx_models::CacheSpec;
    let m = random_model(&tiny("gemma3_text"), 4);
    assert_eq!(
        m.cache_specs(),
        [
            CacheSpec::Rotating {
                max_size: 3,
                keep: 0
            },
            CacheSpec::Standard
        ]
    );
    let m = random_model(&tiny("llama"), 4);
    assert_eq!(
        m.cache_specs(),
        [
            CacheSpec::Rotating {
                max_size: 3,
                keep: 0
            },
            CacheSpec::Standard
        ]
    );
}

#[test]
fn parameter_names_follow_checkpoint_names() {
    let m = random_model(&tiny("qwen3_moe"), 5);
    let names = m.parameter_shapes();
    assert_eq!(
        names["model.layers.1.mlp.switch_mlp.gate_proj.weight"],
        [4, 16, 32]
    );
    assert_eq!(names["model.layers.0.mlp.gate_proj.weight"], [64, 32]);
    assert_eq!(names["model.layers.1.self_attn.q_norm.weight"], [8]);
    assert_eq!(names["lm_head.weight"], [64, 32]);
    let m = random_model(&tiny("phi3"), 5);
    assert_eq!(
        m.parameter_shapes()["model.layers.0.self_attn.qkv_proj.weight"],
        [64, 32]
    );
}
