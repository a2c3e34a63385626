//! Bit-exact parity with mlx-lm on the committed tiny checkpoints in `goldens/models/`
//! (written by `cargo xtask parity --goldens`): full forward, batch of two, and cached
//! decode with mlx-cache's caches.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{Array, Dtype};
use mlx_models::parity::{check_model_dir, compare, summarize, Decoding, Outcome};
use mlx_models::LanguageModel;
use mlx_nn::KvCache;
use std::path::PathBuf;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/models")
        .join(name)
}

fn caches(model: &dyn LanguageModel) -> Result<Vec<Box<dyn KvCache>>, String> {
    mlx_cache::make_prompt_cache(&model.cache_specs(), None).map_err(|e| e.to_string())
}

fn quantize(caches: &mut [Box<dyn KvCache>]) -> Result<(), String> {
    mlx_cache::maybe_quantize_kv_cache(caches, 0, 32, Some(8)).map_err(|e| e.to_string())
}

const DECODING: Decoding<'static> = Decoding {
    make_caches: &caches,
    quantize_caches: Some(&quantize),
};

fn assert_identical(name: &str) {
    let cases = check_model_dir(&golden(name), Some(DECODING)).expect("golden model runs");
    assert!(
        cases.len() >= 9,
        "{name}: expected 4 full, 1 batch and 4 decode cases at least"
    );
    let (ok, line) = summarize(&cases);
    assert!(ok, "{name}: {line}");
}

macro_rules! golden_tests {
    ($($test:ident => $dir:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            assert_identical($dir);
        }
    )*};
}

golden_tests! {
    llama_f32_tied_logits_match_mlx_lm => "llama-small-f32-tied",
    llama_bf16_untied_bias_logits_match_mlx_lm => "llama-small-bf16-untied-bias",
    llama_sliding_llama3_rope_logits_match_mlx_lm => "llama-small-f32-sliding-llama3",
    llama_affine_q4_logits_match_mlx_lm => "llama-small-q4-g32",
    llama_head_dim_32_with_quantized_kv_cache_matches_mlx_lm => "llama-small-f32-hd32",
    llama_mxfp4_logits_match_mlx_lm => "llama-small-mxfp4",
    qwen2_logits_match_mlx_lm => "qwen2-small-f32",
    qwen3_bf16_logits_match_mlx_lm => "qwen3-small-bf16",
    qwen3_affine_q8_logits_match_mlx_lm => "qwen3-small-q8-g32",
    phi3_longrope_logits_match_mlx_lm => "phi3-small-f32-longrope",
    gemma2_logits_match_mlx_lm => "gemma2-small-f32",
    gemma3_text_bf16_logits_match_mlx_lm => "gemma3_text-small-bf16",
    qwen3_moe_logits_match_mlx_lm => "qwen3_moe-small-f32",
    qwen2_moe_shared_expert_logits_match_mlx_lm => "qwen2_moe-small-f32",
    qwen3_next_gated_delta_hybrid_logits_match_mlx_lm => "qwen3_next-small-f32",
    qwen3_5_gated_delta_hybrid_logits_match_mlx_lm => "qwen3_5-small-f32",
    qwen3_5_moe_text_config_logits_match_mlx_lm => "qwen3_5_moe-small-f32",
    lfm2_short_conv_hybrid_logits_match_mlx_lm => "lfm2-small-f32",
    lfm2_moe_sigmoid_experts_logits_match_mlx_lm => "lfm2_moe-small-f32",
    falcon_h1_parallel_mamba_attention_logits_match_mlx_lm => "falcon_h1-small-f32",
    mamba2_ssd_scan_logits_match_mlx_lm => "mamba2-small-f32",
    mamba_selective_scan_logits_match_mlx_lm => "mamba-small-f32",
    granitemoehybrid_mamba_experts_logits_match_mlx_lm => "granitemoehybrid-small-f32",
    nemotron_h_mamba_attention_mlp_logits_match_mlx_lm => "nemotron_h-small-f32",
    mixtral_logits_match_mlx_lm => "mixtral-small-f32",
    gemma_logits_match_mlx_lm => "gemma-small-f32",
    cohere2_parallel_sliding_logits_match_mlx_lm => "cohere2-small-f32",
    exaone4_hybrid_logits_match_mlx_lm => "exaone4-small-f32-hybrid",
    glm4_logits_match_mlx_lm => "glm4-small-f32",
    ministral3_sliding_llama4_scale_logits_match_mlx_lm => "ministral3-small-f32-sliding",
    gpt_oss_sinks_sliding_experts_logits_match_mlx_lm => "gpt_oss-small-f32",
    granite_logits_match_mlx_lm => "granite-small-f32",
    olmo2_logits_match_mlx_lm => "olmo2-small-f32",
    olmo3_sliding_logits_match_mlx_lm => "olmo3-small-f32",
    smollm3_nope_logits_match_mlx_lm => "smollm3-small-f32",
    seed_oss_logits_match_mlx_lm => "seed_oss-small-f32",
    starcoder2_logits_match_mlx_lm => "starcoder2-small-f32",
    // Issue 26, dense and MoE families.
    olmoe_logits_match_mlx_lm => "olmoe-small-f32",
    mimo_drops_mtp_layers_logits_match_mlx_lm => "mimo-small-f32",
    helium_logits_match_mlx_lm => "helium-small-f32",
    ernie4_5_bias_logits_match_mlx_lm => "ernie4_5-small-f32",
    internlm3_bias_logits_match_mlx_lm => "internlm3-small-f32",
    glm4_moe_group_routing_shared_experts_logits_match_mlx_lm => "glm4_moe-small-f32",
    ernie4_5_moe_logits_match_mlx_lm => "ernie4_5_moe-small-f32",
    qwen2_vl_text_logits_match_mlx_lm => "qwen2_vl-small-f32",
    qwen3_vl_nested_text_logits_match_mlx_lm => "qwen3_vl-small-f32",
    hunyuan_v1_dense_norms_after_rope_logits_match_mlx_lm => "hunyuan_v1_dense-small-f32",
    // Issue 26, multi-head latent attention families.
    deepseek_v3_latent_attention_group_routing_logits_match_mlx_lm => "deepseek_v3-small-f32",
    deepseek_v32_indexer_sparse_attention_logits_match_mlx_lm => "deepseek_v32-small-f32",
    kimi_k25_text_model_logits_match_mlx_lm => "kimi_k25-small-f32",
    glm4_moe_lite_drops_mtp_layers_logits_match_mlx_lm => "glm4_moe_lite-small-f32",
    deepseek_v2_expanded_kv_yarn_logits_match_mlx_lm => "deepseek_v2-small-f32",
    // Issue 26, Gemma 4: KV caches shared between layers.
    gemma4_text_shared_kv_per_layer_inputs_logits_match_mlx_lm => "gemma4_text-small-f32",
    gemma4_text_experts_k_eq_v_logits_match_mlx_lm => "gemma4_text-small-f32-moe",
    gemma3n_altup_laurel_shared_kv_logits_match_mlx_lm => "gemma3n-small-f32",
    minicpm3_scaled_residuals_su_rope_logits_match_mlx_lm => "minicpm3-small-f32",
    // Issue 26, wave 2 part B.
    phi_parallel_partial_rotary_logits_match_mlx_lm => "phi-small-f32",
    phimoe_sparsemixer_longrope_logits_match_mlx_lm => "phimoe-small-f32-longrope",
    granitemoe_logits_match_mlx_lm => "granitemoe-small-f32",
    internlm2_grouped_wqkv_logits_match_mlx_lm => "internlm2-small-f32-bias",
    exaone_logits_match_mlx_lm => "exaone-small-f32",
    cohere_per_head_qk_norm_logits_match_mlx_lm => "cohere-small-f32-qknorm",
    minicpm_scaled_residuals_logits_match_mlx_lm => "minicpm-small-f32",
    nemotron_layernorm1p_relu2_logits_match_mlx_lm => "nemotron-small-f32",
    gpt_neox_parallel_residual_logits_match_mlx_lm => "gpt_neox-small-f32",
    gpt2_learned_positions_logits_match_mlx_lm => "gpt2-small-f32",
    gpt_bigcode_multi_query_logits_match_mlx_lm => "gpt_bigcode-small-f32",
    stablelm_per_head_layernorm_logits_match_mlx_lm => "stablelm-small-f32-qknorm",
    qwen3_vl_moe_fused_experts_text_logits_match_mlx_lm => "qwen3_vl_moe-small-f32",
    dots1_group_routing_shared_experts_logits_match_mlx_lm => "dots1-small-f32",
    // Issue 26, chunked attention (prompts and decode prefills longer than the chunk).
    llama4_chunked_attention_nope_moe_logits_match_mlx_lm => "llama4-small-f32",
    llama4_text_no_rope_layers_qk_norm_logits_match_mlx_lm => "llama4_text-small-f32",
    minimax_partial_rope_biased_sigmoid_routing_logits_match_mlx_lm => "minimax-small-f32",
    exaone_moe_sliding_group_routing_shared_experts_logits_match_mlx_lm => "exaone_moe-small-f32",
    olmo_fused_projections_padded_embedding_logits_match_mlx_lm => "olmo-small-f32",
    hunyuan_cross_layer_attention_experts_logits_match_mlx_lm => "hunyuan-small-f32",
    baichuan_m1_convolved_kv_sliding_layers_logits_match_mlx_lm => "baichuan_m1-small-f32",
    bailing_moe_fused_qkv_routed_experts_logits_match_mlx_lm => "bailing_moe-small-f32",
    glm_moe_dsa_rope_parameters_indexer_logits_match_mlx_lm => "glm_moe_dsa-small-f32",
    solar_open_glm4_moe_defaults_logits_match_mlx_lm => "solar_open-small-f32",
    apertus_xielu_qk_norm_logits_match_mlx_lm => "apertus-small-f32",
    qwen_c_attn_biased_head_logits_match_mlx_lm => "qwen-small-f32",
    gptj_parallel_partial_traditional_rope_logits_match_mlx_lm => "gptj-small-f32",
    glm_traditional_rope_gate_up_logits_match_mlx_lm => "glm-small-f32",
    openelm_per_layer_heads_and_widths_logits_match_mlx_lm => "openelm-small-f32",
    nanochat_weightless_norms_negated_rope_softcap_logits_match_mlx_lm => "nanochat-small-f32",
    mistral4_latent_attention_llama4_scale_logits_match_mlx_lm => "mistral4-small-f32",
    deepseek_moe_v1_logits_match_mlx_lm => "deepseek-small-f32",
    dbrx_clipped_qkv_token_by_token_experts_logits_match_mlx_lm => "dbrx-small-f32",
    phixtral_parallel_switch_mlp_experts_logits_match_mlx_lm => "phixtral-small-f32",
    telechat3_llama_shaped_logits_match_mlx_lm => "telechat3-small-f32",
    nanbeige_looped_layers_logits_match_mlx_lm => "nanbeige-small-f32",
    lille_130m_fused_qkv_inner_norms_logits_match_mlx_lm => "lille-130m-small-f32",
    pixtral_llama_text_logits_match_mlx_lm => "pixtral-small-f32",
    lfm2_vl_lfm2_text_logits_match_mlx_lm => "lfm2-vl-small-f32",
    kimi_vl_deepseek_v3_text_logits_match_mlx_lm => "kimi_vl-small-f32",
    nemotron_nas_per_layer_blocks_logits_match_mlx_lm => "nemotron-nas-small-f32",
    youtu_llm_expanded_low_rank_attention_logits_match_mlx_lm => "youtu_llm-small-f32",
    klear_coefficient_mixed_experts_logits_match_mlx_lm => "Klear-small-f32",
    mellum_sliding_experts_logits_match_mlx_lm => "mellum-small-f32",
    talkie_gains_embedding_skip_logits_match_mlx_lm => "talkie-small-f32",
    plamo_tiled_heads_parallel_layers_logits_match_mlx_lm => "plamo-small-f32",
    iquestloopcoder_gated_loops_logits_match_mlx_lm => "iquestloopcoder-small-f32",
    plamo3_offset_norms_sliding_logits_match_mlx_lm => "plamo3-small-f32",
    muse_glimmer_gated_nope_softcapped_logits_match_mlx_lm => "muse_glimmer-small-f32",
    spark2_5_head_gates_partial_rope_logits_match_mlx_lm => "spark2_5-small-f32",
    laguna_per_layer_heads_routed_experts_logits_match_mlx_lm => "laguna-small-f32",
    mimo_v2_flash_hybrid_sinks_grouped_experts_logits_match_mlx_lm => "mimo_v2_flash-small-f32",
    afmoe_sandwich_gated_grouped_experts_logits_match_mlx_lm => "afmoe-small-f32",
    jamba_mamba_attention_experts_logits_match_mlx_lm => "jamba-small-f32",
    olmo_hybrid_gated_delta_attention_logits_match_mlx_lm => "olmo_hybrid-small-f32",
    recurrent_gemma_rg_lru_local_attention_logits_match_mlx_lm => "recurrent_gemma-small-f32",
    step3p5_head_gates_clamped_experts_logits_match_mlx_lm => "step3p5-small-f32",
    plamo2_mamba2_offset_norms_logits_match_mlx_lm => "plamo2-small-f32",
    gear_conv_mixer_softcapped_attention_logits_match_mlx_lm => "gear-small-f32",
    rwkv7_wkv7_recurrence_token_shift_logits_match_mlx_lm => "rwkv7-small-f32",
    longcat_flash_two_mla_blocks_identity_experts_logits_match_mlx_lm => "longcat_flash-small-f32",
}

#[test]
fn every_golden_directory_has_a_test() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/models");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let src = include_str!("parity_goldens.rs");
    for n in names {
        assert!(src.contains(&format!("\"{n}\"")), "golden {n} has no test");
    }
}

#[test]
fn a_one_ulp_difference_is_reported_with_its_size() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let b = Array::from_slice(&[1.0f32, 2.0, 3.0 + f32::EPSILON * 2.0], &[3]).unwrap();
    assert_eq!(compare(&a, &a.copy().unwrap()), Outcome::Identical);
    match compare(&a, &b) {
        Outcome::Differs(d) => assert!(d > 0.0 && d < 1e-5, "{d}"),
        other => panic!("expected a difference, got {other:?}"),
    }
    let c = a.astype(Dtype::Bfloat16).unwrap();
    assert!(matches!(compare(&a, &c), Outcome::Failed(_)));
}

#[test]
fn logits_of_another_model_are_not_identical() {
    // The oracle of one golden against the weights of another must be caught.
    let tmp = std::env::temp_dir().join(format!("mlx-models-swap-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(golden("qwen2-small-f32").join(f), tmp.join(f)).unwrap();
    }
    std::fs::copy(
        golden("llama-small-f32-tied").join("oracle.safetensors"),
        tmp.join("oracle.safetensors"),
    )
    .unwrap();
    let cases = check_model_dir(&tmp, None).unwrap();
    let (ok, line) = summarize(&cases);
    std::fs::remove_dir_all(&tmp).ok();
    assert!(!ok, "{line}");
    assert!(line.contains("max abs diff"), "{line}");
}

#[test]
fn the_head_dim_32_golden_covers_the_quantized_kv_cache() {
    let cases = check_model_dir(&golden("llama-small-f32-hd32"), Some(DECODING)).unwrap();
    assert!(cases
        .iter()
        .any(|c| c.name == "qdecode.0" && c.outcome == Outcome::Identical));
}
