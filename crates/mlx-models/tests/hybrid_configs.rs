//! The hybrid and state-space architectures: configs mlx-lm cannot run (or that we do not
//! port yet) are refused at build time with an error naming the key; the layouts their
//! caches follow are mlx-lm's `make_cache`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_models::{build_model, CacheSpec};
use serde_json::{json, Value};

fn with(mut c: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    c
}

fn err(c: &Value) -> String {
    match build_model(c) {
        Ok(_) => panic!("{c} should be refused"),
        Err(e) => e.to_string(),
    }
}

fn qwen3_next() -> Value {
    json!({
        "model_type": "qwen3_next", "hidden_size": 32, "num_hidden_layers": 4,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
        "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "num_experts": 0,
        "num_experts_per_tok": 0, "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 0, "mlp_only_layers": [],
        "moe_intermediate_size": 0, "rms_norm_eps": 1e-6, "vocab_size": 64,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        "max_position_embeddings": 128, "head_dim": 8,
    })
}

fn nemotron_h(pattern: &str) -> Value {
    json!({
        "model_type": "nemotron_h", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "max_position_embeddings": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "attention_bias": false, "mamba_num_heads": 4,
        "mamba_head_dim": 8, "mamba_proj_bias": false, "ssm_state_size": 8,
        "conv_kernel": 4, "n_groups": 2, "mlp_bias": false, "layer_norm_epsilon": 1e-5,
        "use_bias": false, "use_conv_bias": true, "hybrid_override_pattern": pattern,
    })
}

#[test]
fn qwen3_next_caches_follow_the_attention_interval() {
    let m = build_model(&qwen3_next()).expect("builds");
    let a = CacheSpec::Arrays { size: 2 };
    // full_attention_interval defaults to 4: every fourth layer attends.
    assert_eq!(m.cache_specs(), vec![a, a, a, CacheSpec::Standard]);
    assert!(m.defines_make_cache());
}

#[test]
fn qwen3_next_needs_an_attention_layer_within_the_stack() {
    let e = err(&with(qwen3_next(), json!({"full_attention_interval": 8})));
    assert!(e.contains("full_attention_interval"), "{e}");
    let e = err(&with(qwen3_next(), json!({"linear_num_key_heads": 3})));
    assert!(e.contains("linear_num_key_heads"), "{e}");
}

#[test]
fn qwen3_5_takes_mlx_lm_s_defaults_and_text_config() {
    let text = json!({"model_type": "qwen3_5_text", "hidden_size": 32, "num_hidden_layers": 2,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "linear_num_value_heads": 2, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
        "linear_value_head_dim": 8, "vocab_size": 64, "full_attention_interval": 2});
    let m = build_model(&json!({"model_type": "qwen3_5", "text_config": text})).expect("builds");
    assert_eq!(m.model_type(), "qwen3_5");
    assert_eq!(m.vocab_size(), 64);
    assert_eq!(
        m.cache_specs(),
        vec![CacheSpec::Arrays { size: 2 }, CacheSpec::Standard]
    );
}

#[test]
fn lfm2_needs_attention_and_convolution_layers() {
    let c = json!({"model_type": "lfm2", "vocab_size": 64, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "norm_eps": 1e-5, "conv_bias": false,
        "conv_L_cache": 3, "block_dim": 32, "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": true,
        "block_ff_dim": 64, "full_attn_idxs": [1]});
    let m = build_model(&c).expect("builds");
    assert_eq!(
        m.cache_specs(),
        vec![CacheSpec::Arrays { size: 1 }, CacheSpec::Standard]
    );
    let e = err(&with(c.clone(), json!({"full_attn_idxs": []})));
    assert!(e.contains("no attention layer"), "{e}");
    let e = err(&with(c.clone(), json!({"full_attn_idxs": [0, 1]})));
    assert!(e.contains("every layer is an attention layer"), "{e}");
    let e = err(&with(c, json!({"block_ff_dim": null})));
    assert!(e.contains("intermediate_size"), "{e}");
}

#[test]
fn nemotron_h_caches_only_mixers_and_attention_and_refuses_experts() {
    let m = build_model(&nemotron_h("M-*M-")).expect("builds");
    assert_eq!(m.num_layers(), 3);
    assert_eq!(
        m.cache_specs(),
        vec![
            CacheSpec::Arrays { size: 2 },
            CacheSpec::Standard,
            CacheSpec::Arrays { size: 2 }
        ]
    );
    let e = err(&nemotron_h("M*E"));
    assert!(e.contains("routed-expert layers"), "{e}");
    let mut c = nemotron_h("");
    c["hybrid_override_pattern"] = Value::Null;
    c["layers_block_type"] = json!(["mamba", "sparse"]);
    let e = err(&c);
    assert!(e.contains("unsupported layers_block_type `sparse`"), "{e}");
}

#[test]
fn granitemoehybrid_refuses_unknown_layer_types_and_missing_mamba_keys() {
    let c = json!({"model_type": "granitemoehybrid", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "attention_bias": false,
        "embedding_multiplier": 1.0, "attention_multiplier": 0.1, "logits_scaling": 1.0,
        "residual_multiplier": 1.0, "layer_types": ["attention", "attention"],
        "rms_norm_eps": 1e-5});
    assert!(build_model(&c).is_ok());
    let e = err(&with(
        c.clone(),
        json!({"layer_types": ["attention", "mamba"]}),
    ));
    assert!(e.contains("mamba_n_heads"), "{e}");
    let e = err(&with(c, json!({"layer_types": ["attention", "ssm"]})));
    assert!(e.contains("unknown layer type `ssm`"), "{e}");
}

#[test]
fn mamba2_refuses_groups_that_do_not_divide_the_heads() {
    let c = json!({"model_type": "mamba2", "num_heads": 6, "head_dim": 8, "vocab_size": 64,
        "hidden_size": 24, "intermediate_size": 48, "state_size": 8, "num_hidden_layers": 1,
        "layer_norm_epsilon": 1e-5, "conv_kernel": 4, "n_groups": 4, "use_bias": false,
        "use_conv_bias": true, "tie_word_embeddings": true,
        "time_step_limit": [0.0, 100.0], "time_step_rank": "auto"});
    let e = err(&c);
    assert!(e.contains("must divide the mamba heads"), "{e}");
    let m = build_model(&with(c, json!({"n_groups": 2}))).expect("builds");
    assert_eq!(m.cache_specs(), vec![CacheSpec::Arrays { size: 2 }]);
}

#[test]
fn an_unknown_model_type_lists_the_hybrid_ones() {
    let e = err(&json!({"model_type": "not_a_model"}));
    for t in [
        "falcon_h1",
        "falcon_mamba",
        "granitemoehybrid",
        "lfm2",
        "lfm2_moe",
        "mamba",
        "mamba2",
        "nemotron_h",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
    ] {
        let listed = e
            .split_once("supported: ")
            .map(|(_, l)| l.split(", ").any(|x| x == t));
        assert_eq!(listed, Some(true), "{t} not in: {e}");
    }
}

#[test]
fn lfm2_moe_needs_its_expert_keys_and_a_valid_top_k() {
    let c = json!({"model_type": "lfm2_moe", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2,
        "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "use_expert_bias": true, "num_dense_layers": 1, "norm_eps": 1e-5,
        "conv_bias": false, "conv_L_cache": 3, "full_attn_idxs": [1]});
    let m = build_model(&c).expect("builds");
    assert_eq!(
        m.cache_specs(),
        vec![CacheSpec::Arrays { size: 1 }, CacheSpec::Standard]
    );
    let e = err(&with(c.clone(), json!({"num_experts_per_tok": 5})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let mut missing = c;
    missing.as_object_mut().unwrap().remove("num_experts");
    let e = err(&missing);
    assert!(e.contains("num_experts"), "{e}");
}

#[test]
fn falcon_h1_keeps_a_cache_list_per_layer_and_checks_its_mamba_sizes() {
    let c = json!({"model_type": "falcon_h1", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "mamba_d_ssm": 32, "mamba_n_heads": 4,
        "mamba_d_head": 8, "mamba_d_state": 8, "mamba_n_groups": 1});
    let m = build_model(&c).expect("builds");
    let list = CacheSpec::List(&[CacheSpec::Arrays { size: 2 }, CacheSpec::Standard]);
    assert_eq!(m.cache_specs(), vec![list; 2]);
    let e = err(&with(c.clone(), json!({"mamba_d_ssm": 48})));
    assert!(e.contains("mamba_d_ssm"), "{e}");
    let e = err(&with(c, json!({"mamba_n_groups": 3})));
    assert!(e.contains("must divide the mamba heads"), "{e}");
}
