//! Malformed configs of the architectures with layer patterns or nested settings are
//! refused at build time with an error naming the key, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_models::build_model;
use serde_json::{json, Value};

fn base(model_type: &str) -> Value {
    json!({
        "model_type": model_type, "hidden_size": 32, "num_hidden_layers": 2,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "vocab_size": 64, "max_position_embeddings": 128,
        "rope_theta": 10000.0, "head_dim": 8, "tie_word_embeddings": false,
    })
}

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

#[test]
fn gpt_oss_layer_types_need_both_kinds_and_one_per_layer() {
    let c = with(
        base("gpt_oss"),
        json!({"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4}),
    );
    assert!(build_model(&c).is_ok());
    let e = err(&with(
        c.clone(),
        json!({"layer_types": ["full_attention", "full_attention"]}),
    ));
    assert!(
        e.contains("layer_types") && e.contains("sliding_attention"),
        "{e}"
    );
    let e = err(&with(c, json!({"layer_types": ["full_attention"]})));
    assert!(
        e.contains("layer_types") && e.contains("1 entries for 2 layers"),
        "{e}"
    );
}

#[test]
fn smollm3_no_rope_layers_must_match_the_layers() {
    let c = base("smollm3");
    assert!(build_model(&c).is_ok());
    let e = err(&with(c.clone(), json!({"no_rope_layers": [1, 0, 1]})));
    assert!(
        e.contains("no_rope_layers") && e.contains("3 entries for 2 layers"),
        "{e}"
    );
    let e = err(&with(c, json!({"no_rope_layer_interval": 0})));
    assert!(e.contains("no_rope_layer_interval"), "{e}");
}

#[test]
fn ministral3_needs_its_rope_parameters() {
    let rope = json!({"rope_type": "default", "rope_theta": 10000.0,
                      "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 64});
    let c = with(base("ministral3"), json!({"rope_parameters": rope}));
    assert!(build_model(&c).is_ok());
    let mut missing = rope.clone();
    missing
        .as_object_mut()
        .map(|m| m.remove("llama_4_scaling_beta"));
    let e = err(&with(c.clone(), json!({"rope_parameters": missing})));
    assert!(e.contains("rope_parameters.llama_4_scaling_beta"), "{e}");
    let e = err(&with(
        c,
        json!({"layer_types": ["sliding_attention", "full_attention"]}),
    ));
    assert!(e.contains("sliding_window"), "{e}");
}

#[test]
fn mistral3_reads_its_text_config() {
    let text = with(base("mistral"), json!({}));
    let c = json!({"model_type": "mistral3", "text_config": text});
    let m = build_model(&c).expect("a mistral text model");
    assert_eq!(m.model_type(), "mistral3");
    // A Mistral 4 text model needs Mistral 4's keys.
    let e = err(
        &json!({"model_type": "mistral3", "text_config": with(text, json!({"model_type": "mistral4"}))}),
    );
    assert!(
        e.contains("mistral4") && e.contains("moe_intermediate_size"),
        "{e}"
    );
    let m = build_model(&json!({"model_type": "mistral3", "text_config": mistral4()}))
        .expect("a mistral4 text model");
    assert_eq!(m.model_type(), "mistral3");
}

#[test]
fn deepseek_checks_rope_scaling_and_its_routed_layers() {
    let c = with(
        base("deepseek"),
        json!({"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}),
    );
    assert!(build_model(&c).is_ok());
    let linear = json!({"rope_scaling": {"type": "linear", "factor": 2.0}});
    assert!(build_model(&with(c.clone(), linear)).is_ok());
    // mlx-lm reads `rope_scaling["type"]` and asserts a float factor.
    let e = err(&with(
        c.clone(),
        json!({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ));
    assert!(e.contains("rope_scaling.type"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"rope_scaling": {"type": "linear", "factor": 2}}),
    ));
    assert!(e.contains("rope_scaling.factor"), "{e}");
    let mut no_top_k = c.clone();
    no_top_k
        .as_object_mut()
        .unwrap()
        .remove("num_experts_per_tok");
    assert!(err(&no_top_k).contains("num_experts_per_tok"));
    let e = err(&with(c.clone(), json!({"moe_layer_freq": 0})));
    assert!(e.contains("moe_layer_freq"), "{e}");
    let e = err(&with(c, json!({"num_attention_heads": 5})));
    assert!(e.contains("divisible"), "{e}");
}

#[test]
fn dbrx_requires_its_nested_configs() {
    let c = json!({
        "model_type": "dbrx", "vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4,
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
        "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
    });
    assert!(build_model(&c).is_ok());
    // Read by mlx-lm without a default (`clip_qkv: null` fails in its forward).
    for (section, key) in [
        ("attn_config", "kv_n_heads"),
        ("attn_config", "clip_qkv"),
        ("attn_config", "rope_theta"),
        ("ffn_config", "moe_top_k"),
    ] {
        let mut missing = c.clone();
        missing[section].as_object_mut().unwrap().remove(key);
        let e = err(&missing);
        assert!(e.contains(key), "{e}");
    }
    let mut null_clip = c.clone();
    null_clip["attn_config"]["clip_qkv"] = Value::Null;
    assert!(err(&null_clip).contains("clip_qkv"));
    let mut top_k = c.clone();
    top_k["ffn_config"]["moe_top_k"] = json!(5);
    assert!(err(&top_k).contains("moe_top_k"));
    let e = err(&with(c, json!({"n_heads": 5})));
    assert!(e.contains("divisible"), "{e}");
}

#[test]
fn phixtral_refuses_bad_sizes() {
    let c = json!({
        "model_type": "phixtral", "num_vocab": 64, "model_dim": 32, "num_heads": 4,
        "num_layers": 2, "rotary_dim": 4, "num_experts_per_tok": 2, "num_local_experts": 4,
    });
    assert!(build_model(&c).is_ok());
    let e = err(&with(c.clone(), json!({"num_heads": 5})));
    assert!(e.contains("divisible"), "{e}");
    let e = err(&with(c.clone(), json!({"num_experts_per_tok": 5})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = err(&with(c.clone(), json!({"rotary_dim": 16})));
    assert!(e.contains("rotary_dim"), "{e}");
    let e = err(&with(c, json!({"num_vocab": 0})));
    assert!(e.contains("num_vocab"), "{e}");
}

fn mistral4() -> Value {
    let rope = json!({"rope_type": "default", "llama_4_scaling_beta": 0.1,
                      "original_max_position_embeddings": 64});
    with(
        base("mistral4"),
        json!({"moe_intermediate_size": 16, "n_shared_experts": 1, "n_routed_experts": 4,
               "routed_scaling_factor": 1.0, "kv_lora_rank": 16, "q_lora_rank": null,
               "norm_topk_prob": true, "topk_group": 1, "num_experts_per_tok": 2,
               "first_k_dense_replace": 1, "n_group": 1, "qk_rope_head_dim": 8,
               "qk_nope_head_dim": 8, "v_head_dim": 8, "rope_parameters": rope}),
    )
}

#[test]
fn mistral4_requires_its_keys_and_rope_parameters() {
    let c = mistral4();
    assert!(build_model(&c).is_ok());
    // Required by mlx-lm's dataclass (the nullable ones too).
    for key in [
        "n_group",
        "q_lora_rank",
        "n_routed_experts",
        "norm_topk_prob",
        "num_key_value_heads",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert!(err(&missing).contains(key), "{key}");
    }
    // mlx-lm's forward reads the Llama 4 scale from rope_parameters.
    let mut missing = c.clone();
    missing.as_object_mut().unwrap().remove("rope_parameters");
    assert!(err(&missing).contains("rope_parameters"));
    let mut rope = c["rope_parameters"].clone();
    rope.as_object_mut()
        .map(|m| m.remove("llama_4_scaling_beta"));
    let e = err(&with(c, json!({"rope_parameters": rope})));
    assert!(e.contains("rope_parameters.llama_4_scaling_beta"), "{e}");
}

#[test]
fn olmo3_and_exaone4_patterns_need_both_kinds_of_layer() {
    // Two layers by the default pattern (every fourth full) have no full layer, which
    // mlx-lm cannot build either; four have one.
    let olmo3 = with(base("olmo3"), json!({"sliding_window": 4}));
    let e = err(&olmo3);
    assert!(e.contains("full_attention"), "{e}");
    assert!(build_model(&with(olmo3.clone(), json!({"num_hidden_layers": 4}))).is_ok());
    let e = err(&with(
        olmo3,
        json!({"layer_types": ["sliding_attention", "sliding_attention"]}),
    ));
    assert!(e.contains("full_attention"), "{e}");
    let exaone = with(
        base("exaone4"),
        json!({"rope_scaling": null, "sliding_window": 4, "sliding_window_pattern": "LG"}),
    );
    assert!(build_model(&exaone).is_ok());
    let e = err(&with(
        exaone.clone(),
        json!({"sliding_window_pattern": "LL"}),
    ));
    assert!(e.contains("sliding_window_pattern"), "{e}");
    let e = err(&with(exaone, json!({"sliding_window": null})));
    assert!(e.contains("sliding_window"), "{e}");
}

#[test]
fn granite_and_qwen2_moe_refuse_what_mlx_lm_refuses() {
    // Granite's multipliers are required keys.
    let e = err(&base("granite"));
    assert!(e.contains("logits_scaling"), "{e}");
    let moe = with(
        base("qwen2_moe"),
        json!({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
               "shared_expert_intermediate_size": 32}),
    );
    assert!(build_model(&moe).is_ok());
    let e = err(&with(
        moe,
        json!({"rope_scaling": {"type": "yarn", "factor": 2.0}}),
    ));
    assert!(e.contains("rope_scaling") && e.contains("linear"), "{e}");
}

#[test]
fn olmo_needs_its_mlp_width_key_and_an_even_width() {
    let c = json!({
        "model_type": "olmo", "d_model": 32, "n_layers": 2, "n_heads": 4,
        "mlp_hidden_size": null, "vocab_size": 60, "embedding_size": 64,
    });
    let m = build_model(&c).unwrap();
    assert_eq!(m.vocab_size(), 64, "the logits are embedding_size wide");
    // Required (as in mlx-lm's dataclass) though it may be null.
    let mut missing = c.clone();
    missing.as_object_mut().unwrap().remove("mlp_hidden_size");
    assert!(err(&missing).contains("mlp_hidden_size"));
    let e = err(&with(c.clone(), json!({"mlp_hidden_size": 63})));
    assert!(e.contains("even"), "{e}");
    let e = err(&with(c, json!({"n_heads": 5})));
    assert!(e.contains("divisible"), "{e}");
}

#[test]
fn hunyuan_needs_rope_alpha_a_share_factor_and_a_layer_entry_per_list() {
    let c = with(
        base("hunyuan"),
        json!({"attention_bias": false, "moe_topk": 2, "num_experts": 4, "num_shared_expert": 1,
               "use_mixed_mlp_moe": true, "use_qk_norm": true, "use_cla": true,
               "cla_share_factor": 2,
               "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}}),
    );
    let m = build_model(&c).unwrap();
    assert_eq!(m.cache_specs().len(), 2, "every layer keeps its own cache");
    let e = err(&with(c.clone(), json!({"rope_scaling": null})));
    assert!(e.contains("rope_scaling"), "{e}");
    let e = err(&with(c.clone(), json!({"rope_scaling": {"alpha": 2.0}})));
    assert!(e.contains("factor"), "{e}");
    let e = err(&with(c.clone(), json!({"cla_share_factor": 0})));
    assert!(e.contains("cla_share_factor"), "{e}");
    let e = err(&with(c.clone(), json!({"moe_topk": [2]})));
    assert!(e.contains("moe_topk") && e.contains("layer 1"), "{e}");
    let e = err(&with(c, json!({"moe_topk": 5})));
    assert!(e.contains("moe_topk"), "{e}");
}

#[test]
fn baichuan_m1_refuses_what_mlx_lm_cannot_run() {
    let c = with(
        base("baichuan_m1"),
        json!({"sliding_window": 4, "sliding_window_layers": [1], "conv_window": 2}),
    );
    let m = build_model(&c).unwrap();
    assert_eq!(m.cache_specs().len(), 2);
    let e = err(&with(c.clone(), json!({"conv_window": 3})));
    assert!(e.contains("conv_window"), "{e}");
    // mlx-lm builds no head for a tied config, and its forward calls lm_head.
    let e = err(&with(c.clone(), json!({"tie_word_embeddings": true})));
    assert!(e.contains("tie_word_embeddings"), "{e}");
    let e = err(&with(c, json!({"sliding_window_layers": [2]})));
    assert!(e.contains("sliding_window_layers"), "{e}");
}

#[test]
fn bailing_moe_refuses_a_tied_norm_head_and_impossible_routing() {
    let c = with(
        base("bailing_moe"),
        json!({"moe_intermediate_size": 16, "num_experts": 8, "num_shared_experts": 1,
               "norm_topk_prob": true, "num_experts_per_tok": 2, "first_k_dense_replace": 1}),
    );
    assert!(build_model(&c).is_ok());
    // `num_experts` is required but may be null (every layer dense).
    assert!(build_model(&with(c.clone(), json!({"num_experts": null}))).is_ok());
    let mut missing = c.clone();
    missing.as_object_mut().unwrap().remove("num_experts");
    assert!(err(&missing).contains("num_experts"));
    // mlx-lm's sanitize pops the tied head, then normalizes it (a KeyError).
    let e = err(&with(
        c.clone(),
        json!({"norm_head": true, "tie_word_embeddings": true}),
    ));
    assert!(e.contains("norm_head"), "{e}");
    let e = err(&with(c.clone(), json!({"num_experts_per_tok": 9})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = err(&with(c.clone(), json!({"n_group": 3, "topk_group": 1})));
    assert!(e.contains("n_group"), "{e}");
    let e = err(&with(c, json!({"n_group": 2, "topk_group": 4})));
    assert!(e.contains("topk_group"), "{e}");
}

#[test]
fn glm_moe_dsa_needs_its_keys_and_rope_parameters_with_a_theta() {
    let c = json!({
        "model_type": "glm_moe_dsa", "vocab_size": 64, "hidden_size": 32, "index_head_dim": 16,
        "index_n_heads": 2, "index_topk": 4, "intermediate_size": 64, "moe_intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "n_shared_experts": 1, "n_routed_experts": 8, "routed_scaling_factor": 2.5,
        "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "v_head_dim": 8,
        "qk_nope_head_dim": 8, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": true, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
        "moe_layer_freq": 1, "first_k_dense_replace": 1, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5, "attention_bias": false,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    });
    let m = build_model(&c).unwrap();
    assert_eq!(m.cache_specs().len(), 2);
    // No defaults, unlike deepseek_v32's ModelArgs.
    for key in [
        "index_topk",
        "q_lora_rank",
        "moe_layer_freq",
        "rope_parameters",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert!(err(&missing).contains(key), "{key}");
    }
    // __post_init__ reads rope_parameters["rope_theta"] (a KeyError in mlx-lm).
    let e = err(&with(
        c,
        json!({"rope_parameters": {"rope_type": "default"}}),
    ));
    assert!(e.contains("rope_theta"), "{e}");
}

#[test]
fn solar_open_defaults_what_glm4_moe_requires() {
    let c = with(
        base("solar_open"),
        json!({"moe_intermediate_size": 16, "n_shared_experts": 1, "n_routed_experts": 4,
               "routed_scaling_factor": 1.0, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
               "norm_topk_prob": true, "partial_rotary_factor": 0.5}),
    );
    // attention_bias, use_qk_norm, n_group and topk_group left out.
    assert!(build_model(&c).is_ok());
    let mut missing = c.clone();
    missing
        .as_object_mut()
        .unwrap()
        .remove("tie_word_embeddings");
    assert!(err(&missing).contains("tie_word_embeddings"));
    let e = err(&with(c, json!({"topk_method": "greedy"})));
    assert!(e.contains("topk_method"), "{e}");
}

#[test]
fn apertus_requires_the_keys_it_does_not_read() {
    let c = with(
        base("apertus"),
        json!({"mlp_bias": false, "attention_bias": false, "post_norm": false, "qk_norm": true}),
    );
    assert!(build_model(&c).is_ok());
    // Required by mlx-lm's dataclass though never read.
    for key in ["attention_bias", "post_norm", "qk_norm", "mlp_bias"] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert!(err(&missing).contains(key), "{key}");
    }
    let e = err(&with(c, json!({"num_attention_heads": 0})));
    assert!(e.contains("num_attention_heads"), "{e}");
}

#[test]
fn qwen_c_proj_needs_kv_channels_times_heads_to_be_the_width() {
    let c = with(
        base("qwen"),
        json!({"kv_channels": 8, "layer_norm_epsilon": 1e-6}),
    );
    assert!(build_model(&c).is_ok());
    // mlx-lm builds it, then its c_proj cannot read the attention's output.
    let e = err(&with(c.clone(), json!({"kv_channels": 16})));
    assert!(e.contains("kv_channels"), "{e}");
    let e = err(&with(c, json!({"num_attention_heads": 0})));
    assert!(e.contains("num_attention_heads"), "{e}");
}

#[test]
fn gptj_heads_must_divide_the_width() {
    let c = json!({"model_type": "gptj", "n_embd": 32, "n_head": 4, "n_layer": 2,
                   "vocab_size": 64, "rotary_dim": 4});
    assert!(build_model(&c).is_ok());
    assert!(build_model(&with(c.clone(), json!({"rotary_dim": null}))).is_ok());
    for heads in [3, 0] {
        let e = err(&with(c.clone(), json!({"n_head": heads})));
        assert!(e.contains("divisible"), "{e}");
    }
}

#[test]
fn glm_requires_head_dim_though_it_may_be_null() {
    let c = base("glm");
    assert!(build_model(&c).is_ok());
    assert!(build_model(&with(c.clone(), json!({"head_dim": null}))).is_ok());
    for key in ["head_dim", "num_key_value_heads"] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert!(err(&missing).contains(key), "{key}");
    }
}

#[test]
fn openelm_per_layer_lists_cover_every_layer() {
    let c = json!({"model_type": "openelm", "head_dim": 8, "num_transformer_layers": 2,
                   "model_dim": 32, "vocab_size": 64, "ffn_dim_divisor": 8,
                   "num_query_heads": [2, 4], "num_kv_heads": [1, 2],
                   "ffn_multipliers": [0.5, 1.3]});
    assert!(build_model(&c).is_ok());
    for key in ["num_query_heads", "num_kv_heads", "ffn_multipliers"] {
        let e = err(&with(c.clone(), json!({key: [1]})));
        assert!(e.contains(key), "{e}");
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert!(err(&missing).contains(key), "{key}");
    }
    let e = err(&with(c.clone(), json!({"ffn_dim_divisor": 0})));
    assert!(e.contains("ffn_dim_divisor"), "{e}");
    let e = err(&with(c, json!({"vocab_size": 0})));
    assert!(e.contains("vocab_size"), "{e}");
}

#[test]
fn nanochat_heads_must_divide_the_width() {
    let c = json!({"model_type": "nanochat", "hidden_size": 32, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64,
                   "intermediate_size": 64});
    assert!(build_model(&c).is_ok());
    for heads in [3, 0] {
        let e = err(&with(c.clone(), json!({"num_attention_heads": heads})));
        assert!(e.contains("divisible"), "{e}");
    }
    // A head size of 5: RoPE's frequencies need an even one.
    let e = err(&with(c, json!({"hidden_size": 20})));
    assert!(e.contains("even"), "{e}");
}

#[test]
fn telechat3_requires_its_keys_and_a_known_rope_type() {
    let c = base("telechat3");
    assert!(build_model(&c).is_ok());
    assert!(build_model(&with(c.clone(), json!({"head_dim": null}))).is_ok());
    for key in [
        "max_position_embeddings",
        "rope_theta",
        "num_key_value_heads",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert!(err(&missing).contains(key), "{key}");
    }
    let e = err(&with(
        c,
        json!({"rope_scaling": {"rope_type": "bogus", "factor": 2.0}}),
    ));
    assert!(e.contains("bogus"), "{e}");
}

#[test]
fn nanbeige_refuses_unported_loop_features_and_no_loops() {
    let c = base("nanbeige");
    assert!(build_model(&c).is_ok());
    for key in [
        "enable_double_loop_split",
        "loop_share_kv",
        "enable_depth_attention",
    ] {
        let e = err(&with(c.clone(), json!({ key: true })));
        assert!(e.contains("not yet supported"), "{key}: {e}");
    }
    assert!(err(&with(c.clone(), json!({"num_loops": 0}))).contains("num_loops"));
    // Loss weights decide the number of runs, whatever num_loops says.
    assert!(build_model(&with(
        c.clone(),
        json!({"num_loops": 0, "loop_loss_weights": [1.0]})
    ))
    .is_ok());
    assert!(err(&with(c.clone(), json!({"head_dim": 0}))).contains("head_dim"));
    let mut missing = c;
    missing
        .as_object_mut()
        .unwrap()
        .remove("num_key_value_heads");
    assert!(err(&missing).contains("num_key_value_heads"));
}

#[test]
fn lille_130m_requires_its_keys_and_positive_heads() {
    let c = json!({"model_type": "lille-130m", "block_size": 128, "layer_norm_eps": 1e-5,
                   "n_embd": 64, "n_head": 4, "n_kv_heads": 2, "n_layer": 2,
                   "rope_theta": 10000.0, "vocab_size": 64});
    assert!(build_model(&c).is_ok());
    // The module's name is no model_type of mlx-lm's.
    assert!(build_model(&with(c.clone(), json!({"model_type": "lille_130m"}))).is_err());
    for key in ["block_size", "layer_norm_eps", "n_kv_heads", "rope_theta"] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert!(err(&missing).contains(key), "{key}");
    }
    let e = err(&with(c, json!({"n_head": 0})));
    assert!(e.contains("n_head"), "{e}");
}

#[test]
fn pixtral_and_lfm2_vl_require_a_text_config() {
    let llama = json!({"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
                       "intermediate_size": 128, "num_key_value_heads": 8,
                       "rms_norm_eps": 1e-5, "vocab_size": 64});
    // Without num_attention_heads: 32, as pixtral's __post_init__ sets.
    let c = json!({"model_type": "pixtral", "text_config": llama});
    assert!(build_model(&c).is_ok());
    assert!(err(&json!({"model_type": "pixtral"})).contains("text_config"));
    let e = err(&json!({"model_type": "pixtral", "text_config": [1]}));
    assert!(e.contains("text_config"), "{e}");
    // The text model's own required keys.
    let mut no_width = c.clone();
    no_width["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("hidden_size");
    assert!(err(&no_width).contains("hidden_size"));

    let lfm2 = json!({"model_type": "lfm2", "vocab_size": 64, "hidden_size": 64,
                      "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "max_position_embeddings": 128,
                      "norm_eps": 1e-5, "conv_bias": false, "conv_L_cache": 3,
                      "block_dim": 64, "block_ff_dim": 128, "block_multiple_of": 64,
                      "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": true,
                      "full_attn_idxs": [1]});
    let c = json!({"model_type": "lfm2-vl", "text_config": lfm2});
    assert!(build_model(&c).is_ok());
    // The module's name is no model_type of mlx-lm's.
    assert!(build_model(&with(c.clone(), json!({"model_type": "lfm2_vl"}))).is_err());
    assert!(err(&json!({"model_type": "lfm2-vl"})).contains("text_config"));
    let mut no_conv = c;
    no_conv["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("conv_L_cache");
    assert!(err(&no_conv).contains("conv_L_cache"));
}

#[test]
fn kimi_vl_requires_a_text_config_and_checks_deepseek_v3s_keys() {
    // kimi_vl's TextArgs: DeepSeek-V3's keys, every one defaulted.
    let c = json!({"model_type": "kimi_vl",
                   "text_config": {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
                                   "num_attention_heads": 2, "kv_lora_rank": 16,
                                   "q_lora_rank": 16, "qk_rope_head_dim": 8,
                                   "qk_nope_head_dim": 8, "v_head_dim": 8,
                                   "intermediate_size": 64}});
    assert!(build_model(&c).is_ok());
    assert!(err(&json!({"model_type": "kimi_vl"})).contains("text_config"));
    let e = err(&json!({"text_config": c["text_config"].clone()}));
    assert!(e.contains("model_type"), "{e}");
    let mut bad = c;
    bad["text_config"]["topk_method"] = json!("greedy");
    assert!(err(&bad).contains("topk_method"));
}

#[test]
fn nemotron_nas_checks_its_block_configs() {
    let full = json!({"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}});
    let c = json!({"model_type": "nemotron-nas", "hidden_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "vocab_size": 64,
                   "block_configs": [full.clone(),
                                     {"attention": {"replace_with_linear": true},
                                      "ffn": {"no_op": true}}]});
    assert!(build_model(&c).is_ok());
    // The module's name is no model_type of mlx-lm's.
    assert!(build_model(&with(c.clone(), json!({"model_type": "nemotron_nas"}))).is_err());
    let e = err(&with(c.clone(), json!({"num_hidden_layers": 3})));
    assert!(e.contains("block_configs"), "{e}");
    let blocks = |b: Value| with(c.clone(), json!({"block_configs": [full.clone(), b]}));
    let e = err(&blocks(json!({"attention": {}, "ffn": {"ffn_mult": 1.0}})));
    assert!(e.contains("n_heads_in_group"), "{e}");
    let e = err(&blocks(
        json!({"attention": {"n_heads_in_group": 0}, "ffn": {"no_op": true}}),
    ));
    assert!(e.contains("n_heads_in_group"), "{e}");
    let e = err(&blocks(
        json!({"attention": {"n_heads_in_group": 3}, "ffn": {"no_op": true}}),
    ));
    assert!(e.contains("divisible"), "{e}");
    let e = err(&blocks(json!({"attention": {"no_op": true}, "ffn": {}})));
    assert!(e.contains("ffn_mult"), "{e}");
    // AttentionConfig(**data): an unknown key is refused.
    let e = err(&blocks(
        json!({"attention": {"no_op": true, "heads": 2}, "ffn": {"no_op": true}}),
    ));
    assert!(e.contains("heads"), "{e}");
    let e = err(&with(c.clone(), json!({"hidden_act": "swish"})));
    assert!(e.contains("swish"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"rope_scaling": {"factor": 8.0, "type": "llama3"}}),
    ));
    assert!(e.contains("rope_type"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"rope_scaling": {"rope_type": "linear"}}),
    ));
    assert!(e.contains("factor"), "{e}");
    let e = err(&with(c.clone(), json!({"hidden_size": 66})));
    assert!(e.contains("divisible"), "{e}");
    // No attention layer at all: mlx-lm's forward reads cache[0].
    let none = json!({"attention": {"no_op": true}, "ffn": {"ffn_mult": 1.0}});
    let e = err(&with(c, json!({"block_configs": [none.clone(), none]})));
    assert!(e.contains("no_op"), "{e}");
}

#[test]
fn youtu_llm_defaults_every_key_and_refuses_a_bad_rope_scaling() {
    let c = json!({"model_type": "youtu_llm", "vocab_size": 64, "hidden_size": 32,
                   "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "kv_lora_rank": 16, "q_lora_rank": null, "qk_rope_head_dim": 8,
                   "qk_nope_head_dim": 8, "v_head_dim": 8});
    let m = build_model(&c).expect("youtu_llm builds");
    assert_eq!((m.model_type(), m.num_layers()), ("youtu_llm", 1));
    let e = err(&with(
        c.clone(),
        json!({"rope_scaling": {"rope_type": "llama3"}}),
    ));
    assert!(e.contains("factor"), "{e}");
    let e = err(&with(
        c,
        json!({"rope_scaling": {"type": "unknown_kind", "factor": 2.0}}),
    ));
    assert!(e.contains("unknown_kind"), "{e}");
}

#[test]
fn klear_requires_its_keys_and_a_sparse_step_with_experts() {
    let c = json!({"model_type": "Klear", "hidden_size": 64, "num_hidden_layers": 2,
                   "intermediate_size": 128, "num_attention_heads": 4, "attention_bias": false,
                   "mlp_only_layers": [0], "num_experts": 4, "num_experts_per_tok": 2,
                   "decoder_sparse_step": 1, "n_shared_experts": 1, "moe_intermediate_size": 32,
                   "rms_norm_eps": 1e-6, "vocab_size": 64, "num_key_value_heads": 2,
                   "rope_theta": 10000.0, "max_position_embeddings": 128,
                   "norm_topk_prob": true});
    assert!(build_model(&c).is_ok());
    // The model_type is capitalised, as mlx-lm's file.
    assert!(build_model(&with(c.clone(), json!({"model_type": "klear"}))).is_err());
    for key in [
        "mlp_only_layers",
        "decoder_sparse_step",
        "n_shared_experts",
        "norm_topk_prob",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert!(err(&missing).contains(key), "{key}");
    }
    let e = err(&with(c.clone(), json!({"decoder_sparse_step": 0})));
    assert!(e.contains("decoder_sparse_step"), "{e}");
    // Without experts the step is never read.
    assert!(build_model(&with(
        c.clone(),
        json!({"num_experts": 0, "decoder_sparse_step": 0})
    ))
    .is_ok());
    let e = err(&with(c, json!({"num_experts_per_tok": 5})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
}

#[test]
fn klear_keeps_expert_bias_in_its_dtype_when_cast() {
    let c = json!({"model_type": "Klear", "hidden_size": 64, "num_hidden_layers": 2,
                   "intermediate_size": 128, "num_attention_heads": 4, "attention_bias": false,
                   "mlp_only_layers": [], "num_experts": 4, "num_experts_per_tok": 2,
                   "decoder_sparse_step": 1, "n_shared_experts": 1, "moe_intermediate_size": 32,
                   "rms_norm_eps": 1e-6, "vocab_size": 64, "num_key_value_heads": 2,
                   "rope_theta": 10000.0, "max_position_embeddings": 128,
                   "norm_topk_prob": true});
    let mut m = build_model(&c).unwrap();
    let module = m.as_module_mut().unwrap();
    module.cast_floating(mlx_array::Dtype::Bfloat16).unwrap();
    let mut seen = 0;
    module.visit_params("", &mut |name, p| {
        let want = match name.contains("expert_bias") {
            true => mlx_array::Dtype::Float32,
            false => mlx_array::Dtype::Bfloat16,
        };
        seen += usize::from(name.contains("expert_bias"));
        assert_eq!(p.dtype(), want, "{name}");
    });
    assert_eq!(seen, 2);
}

#[test]
fn mellum_checks_its_layer_types_and_rope_parameters() {
    let c = json!({"model_type": "mellum", "hidden_size": 32, "num_hidden_layers": 2,
                   "intermediate_size": 64, "num_attention_heads": 4, "num_experts": 4,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 16, "rms_norm_eps": 1e-6,
                   "vocab_size": 64, "num_key_value_heads": 2, "head_dim": 8,
                   "tie_word_embeddings": false, "max_position_embeddings": 128,
                   "norm_topk_prob": true, "sliding_window": 4,
                   "layer_types": ["sliding_attention", "full_attention"],
                   "rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                       "sliding_attention": {"rope_theta": 1e4}}});
    let m = build_model(&c).unwrap();
    // make_cache: a rotating cache of the window for the sliding layer.
    assert!(m.defines_make_cache());
    let e = err(&with(
        c.clone(),
        json!({"rope_parameters": {"full_attention": {"rope_theta": 1e6}}}),
    ));
    assert!(e.contains("rope_parameters.sliding_attention"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"rope_parameters": {"full_attention": {},
                                                             "sliding_attention": {"rope_theta": 1e4}}}),
    ));
    assert!(e.contains("rope_theta"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"layer_types": ["sliding_attention", "sliding_attention"]}),
    ));
    assert!(e.contains("full_attention"), "{e}");
    let e = err(&with(c.clone(), json!({"layer_types": ["full_attention"]})));
    assert!(e.contains("layer_types"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"layer_types": ["full_attention", "chunked"]}),
    ));
    assert!(e.contains("chunked"), "{e}");
    let e = err(&with(c.clone(), json!({"num_experts_per_tok": 0})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let mut missing = c;
    missing.as_object_mut().unwrap().remove("sliding_window");
    assert!(err(&missing).contains("sliding_window"));
}

#[test]
fn talkie_defaults_its_keys_and_needs_even_heads() {
    let c = json!({"model_type": "talkie", "hidden_size": 32, "num_hidden_layers": 1,
                   "num_attention_heads": 2, "head_dim": 8, "intermediate_size": 64,
                   "vocab_size": 64});
    let m = build_model(&c).unwrap();
    assert_eq!((m.model_type(), m.num_layers()), ("talkie", 1));
    let e = err(&with(c.clone(), json!({"head_dim": 7})));
    assert!(e.contains("head_dim"), "{e}");
    let e = err(&with(c, json!({"num_attention_heads": 0})));
    assert!(e.contains("num_attention_heads"), "{e}");
}

#[test]
fn plamo_needs_heads_that_the_shared_heads_divide() {
    let c = json!({"model_type": "plamo", "hidden_size": 64, "num_hidden_layers": 1,
                   "intermediate_size": 128, "num_attention_heads": 8, "rms_norm_eps": 1e-6,
                   "vocab_size": 64});
    // n_shared_head defaults to 8: one key head for eight.
    assert!(build_model(&c).is_ok());
    let e = err(&with(c.clone(), json!({"num_attention_heads": 4})));
    assert!(e.contains("n_shared_head"), "{e}");
    let e = err(&with(c.clone(), json!({"n_shared_head": 0})));
    assert!(e.contains("n_shared_head"), "{e}");
    let mut missing = c;
    missing.as_object_mut().unwrap().remove("rms_norm_eps");
    assert!(err(&missing).contains("rms_norm_eps"));
}

#[test]
fn iquestloopcoder_runs_two_loops_only() {
    let c = json!({"model_type": "iquestloopcoder", "hidden_size": 32, "num_hidden_layers": 2,
                   "intermediate_size": 64, "num_attention_heads": 4, "rms_norm_eps": 1e-6,
                   "vocab_size": 64, "head_dim": 8, "num_key_value_heads": 2});
    let m = build_model(&c).unwrap();
    // make_cache: a KVCache per layer, then a rotating one per layer for the second run.
    assert!(m.defines_make_cache());
    let e = err(&with(c.clone(), json!({"loop_num": 3})));
    assert!(e.contains("loop_num"), "{e}");
    let e = err(&with(c.clone(), json!({"loop_window_size": 0})));
    assert!(e.contains("loop_window_size"), "{e}");
    let mut missing = c;
    missing.as_object_mut().unwrap().remove("head_dim");
    assert!(err(&missing).contains("head_dim"));
}

#[test]
fn plamo3_defaults_its_keys_and_checks_heads_and_windows() {
    // Every key has mlx-lm's default: 32 layers, a full layer every 8th.
    let m = build_model(
        &json!({"model_type": "plamo3", "hidden_size": 64, "head_dim": 16,
                                "num_attention_heads": 4, "num_key_value_heads": 2,
                                "intermediate_size": 64, "vocab_size": 64}),
    )
    .unwrap();
    assert_eq!((m.model_type(), m.num_layers()), ("plamo3", 32));
    assert!(m.defines_make_cache());
    let c = with(
        base("plamo3"),
        json!({"window_size": 4, "sliding_window_pattern": 2}),
    );
    assert!(build_model(&c).is_ok());
    let e = err(&with(c.clone(), json!({"num_key_value_heads": 3})));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&with(c.clone(), json!({"sliding_window_pattern": 0})));
    assert!(e.contains("sliding_window_pattern"), "{e}");
    let e = err(&with(c.clone(), json!({"sliding_window": 0})));
    assert!(e.contains("sliding_window"), "{e}");
    let e = err(&with(c, json!({"hidden_size": "wide"})));
    assert!(e.contains("hidden_size"), "{e}");
}

#[test]
fn muse_glimmer_reads_text_config_and_checks_its_layer_lists() {
    let c = with(
        base("muse_glimmer"),
        json!({"num_hidden_layers": 4, "sliding_window": 4}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    // Meta's layout: the text keys under text_config override the top-level ones.
    let nested = json!({"model_type": "muse_glimmer", "hidden_size": 8,
                        "text_config": with(c.clone(), json!({"num_hidden_layers": 3}))});
    let m = build_model(&nested).unwrap();
    assert_eq!((m.model_type(), m.num_layers()), ("muse_glimmer", 3));
    let e = err(&with(c.clone(), json!({"layer_types": ["full_attention"]})));
    assert!(e.contains("layer_types"), "{e}");
    let e = err(&with(c.clone(), json!({"layer_rope_theta": [1.0, 0.0]})));
    assert!(e.contains("layer_rope_theta"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"rope_parameters": {"rope_theta": "big"}}),
    ));
    assert!(e.contains("rope_theta"), "{e}");
    let e = err(&with(c.clone(), json!({"sliding_window": 0})));
    assert!(e.contains("sliding_window"), "{e}");
    let e = err(&with(c.clone(), json!({"num_key_value_heads": 3})));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&json!({"model_type": "muse_glimmer", "text_config": [1]}));
    assert!(e.contains("text_config"), "{e}");
}

#[test]
fn spark2_5_checks_its_layer_types_rope_parameters_and_gates() {
    let rope = json!({"sliding_attention": {"rope_theta": 10000.0},
                      "full_attention": {"rope_theta": 1e6, "partial_rotary_factor": 0.5}});
    let c = with(
        base("spark2_5"),
        json!({"num_hidden_layers": 4, "sliding_window": 4, "rope_parameters": rope}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    let e = err(&with(c.clone(), json!({"layer_types": ["full_attention"]})));
    assert!(e.contains("layer_types"), "{e}");
    let types = json!([
        "full_attention",
        "chunked",
        "full_attention",
        "full_attention"
    ]);
    let e = err(&with(c.clone(), json!({"layer_types": types})));
    assert!(e.contains("chunked"), "{e}");
    let only_full = json!({"full_attention": {"rope_theta": 1e6}});
    let e = err(&with(c.clone(), json!({"rope_parameters": only_full})));
    assert!(e.contains("sliding_attention"), "{e}");
    let odd = json!({"sliding_attention": {"partial_rotary_factor": 0.125},
                     "full_attention": {}});
    let e = err(&with(c.clone(), json!({"rope_parameters": odd})));
    assert!(e.contains("rotary"), "{e}");
    let e = err(&with(c.clone(), json!({"num_key_value_heads": 3})));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&with(c.clone(), json!({"hidden_act": "silu"})));
    assert!(e.contains("hidden_act"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"headwise_attn_output_gate": false}),
    ));
    assert!(e.contains("headwise_attn_output_gate"), "{e}");
    let e = err(&with(c.clone(), json!({"gate_attn_act_mode": "softmax"})));
    assert!(e.contains("gate_attn_act_mode"), "{e}");
    let mut missing = c;
    missing.as_object_mut().unwrap().remove("sliding_window");
    assert!(err(&missing).contains("sliding_window"));
}

#[test]
fn laguna_checks_its_layer_lists_rope_and_router() {
    let c = with(
        base("laguna"),
        json!({"num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2,
               "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
               "sliding_window": 4,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    let e = err(&with(c.clone(), json!({"layer_types": ["full_attention"]})));
    assert!(e.contains("layer_types"), "{e}");
    let only_sliding = json!([
        "sliding_attention",
        "sliding_attention",
        "sliding_attention"
    ]);
    let e = err(&with(c.clone(), json!({"layer_types": only_sliding})));
    assert!(e.contains("full_attention"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"num_attention_heads_per_layer": [4, 3, 4]}),
    ));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&with(c.clone(), json!({"mlp_layer_types": ["dense"]})));
    assert!(e.contains("mlp_layer_types"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"moe_router_score_func": "softmax"}),
    ));
    assert!(e.contains("moe_router_score_func"), "{e}");
    let e = err(&with(c.clone(), json!({"num_experts_per_tok": 8})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = err(&with(c.clone(), json!({"partial_rotary_factor": 0.1})));
    assert!(e.contains("rotary"), "{e}");
    let e = err(&with(c.clone(), json!({"sliding_window": null})));
    assert!(e.contains("sliding_window"), "{e}");
    let rope = json!({"full_attention": {"rope_theta": "big"}});
    let e = err(&with(c, json!({"rope_parameters": rope})));
    assert!(e.contains("rope_theta"), "{e}");
}

#[test]
fn mimo_v2_flash_needs_both_layer_kinds_and_a_known_router() {
    let c = json!({"model_type": "mimo_v2_flash", "num_experts_per_tok": 2,
        "hybrid_layer_pattern": [0, 1], "moe_layer_freq": [0, 1],
        "add_swa_attention_sink_bias": true, "add_full_attention_sink_bias": false,
        "sliding_window_size": 4, "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "n_shared_experts": 1,
        "n_routed_experts": 4, "routed_scaling_factor": null, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": true, "n_group": 1, "topk_group": 1,
        "max_position_embeddings": 128, "layernorm_epsilon": 1e-5, "rope_theta": 1e6,
        "swa_rope_theta": 1e4, "swa_num_attention_heads": 8, "swa_num_key_value_heads": 4,
        "head_dim": 8, "v_head_dim": 4, "swa_head_dim": 8, "swa_v_head_dim": 8,
        "partial_rotary_factor": 0.5});
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    let e = err(&with(c.clone(), json!({"hybrid_layer_pattern": [0, 0]})));
    assert!(e.contains("hybrid_layer_pattern"), "{e}");
    let e = err(&with(c.clone(), json!({"moe_layer_freq": [1]})));
    assert!(e.contains("moe_layer_freq"), "{e}");
    let e = err(&with(c.clone(), json!({"topk_method": "greedy"})));
    assert!(e.contains("topk_method"), "{e}");
    let e = err(&with(c.clone(), json!({"swa_num_key_value_heads": 3})));
    assert!(e.contains("sliding"), "{e}");
    let e = err(&with(c.clone(), json!({"partial_rotary_factor": 0.1})));
    assert!(e.contains("partial_rotary_factor"), "{e}");
    let e = err(&with(c.clone(), json!({"num_experts_per_tok": 5})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let mut missing = c;
    missing
        .as_object_mut()
        .unwrap()
        .remove("routed_scaling_factor");
    assert!(err(&missing).contains("routed_scaling_factor"));
}

#[test]
fn afmoe_checks_its_layer_types_heads_and_router() {
    let c = with(
        base("afmoe"),
        json!({"num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2,
               "moe_intermediate_size": 16, "num_dense_layers": 1, "sliding_window": 4,
               "n_group": 2, "topk_group": 1,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    // `layer_types` is the dataclass's one required key.
    let mut missing = c.clone();
    missing.as_object_mut().unwrap().remove("layer_types");
    let e = err(&missing);
    assert!(e.contains("layer_types"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"layer_types": ["sliding_attention", "sliding_attention"]}),
    ));
    assert!(e.contains("full_attention"), "{e}");
    let e = err(&with(c.clone(), json!({"num_key_value_heads": 3})));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&with(c.clone(), json!({"num_experts_per_tok": 8})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = err(&with(c.clone(), json!({"score_func": "sqrtsoftplus"})));
    assert!(e.contains("score_func"), "{e}");
    let e = err(&with(c.clone(), json!({"n_group": 3})));
    assert!(e.contains("n_group"), "{e}");
    let e = err(&with(c.clone(), json!({"sliding_window": 0})));
    assert!(e.contains("sliding_window"), "{e}");
    let e = err(&with(c, json!({"head_dim": 7})));
    assert!(e.contains("head_dim"), "{e}");
}

#[test]
fn jamba_checks_its_layer_kinds_experts_and_mixer() {
    let c = with(
        base("jamba"),
        json!({"num_hidden_layers": 4, "attn_layer_offset": 1, "attn_layer_period": 2,
               "expert_layer_offset": 1, "expert_layer_period": 2, "mamba_d_conv": 4,
               "mamba_d_state": 8, "mamba_expand": 2, "num_experts": 4,
               "num_experts_per_tok": 2}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    // The dataclass's required keys.
    for key in [
        "attn_layer_period",
        "expert_layer_offset",
        "mamba_d_state",
        "num_experts",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        let e = err(&missing);
        assert!(e.contains(key), "{key}: {e}");
    }
    let e = err(&with(c.clone(), json!({"attn_layer_period": 0})));
    assert!(e.contains("attn_layer_period"), "{e}");
    let e = err(&with(c.clone(), json!({"expert_layer_period": 0})));
    assert!(e.contains("expert_layer_period"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"layers_block_type": ["mamba", "mamba", "mamba", "mamba"]}),
    ));
    assert!(e.contains("attention"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"layers_block_type": ["attention", "attention"]}),
    ));
    assert!(e.contains("mamba"), "{e}");
    let e = err(&with(c.clone(), json!({"mamba_dt_rank": "big"})));
    assert!(e.contains("mamba_dt_rank"), "{e}");
    let e = err(&with(c.clone(), json!({"num_experts_per_tok": 8})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = err(&with(c.clone(), json!({"num_key_value_heads": 3})));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&with(c, json!({"mamba_d_conv": 1})));
    assert!(e.contains("mamba_d_conv"), "{e}");
}

#[test]
fn olmo_hybrid_checks_its_heads_and_linear_attention() {
    let c = with(
        base("olmo_hybrid"),
        json!({"num_hidden_layers": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
               "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
               "linear_allow_neg_eigval": true, "attention_bias": false}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    // `num_key_value_heads` is required but may be null (as many as the heads).
    build_model(&with(c.clone(), json!({"num_key_value_heads": null}))).unwrap();
    for key in [
        "num_key_value_heads",
        "linear_num_key_heads",
        "linear_conv_kernel_dim",
        "linear_allow_neg_eigval",
        "attention_bias",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        let e = err(&missing);
        assert!(e.contains(key), "{key}: {e}");
    }
    let e = err(&with(c.clone(), json!({"num_key_value_heads": 3})));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&with(c.clone(), json!({"linear_num_value_heads": 3})));
    assert!(e.contains("linear_num_value_heads"), "{e}");
    let e = err(&with(c.clone(), json!({"linear_conv_kernel_dim": 1})));
    assert!(e.contains("linear_conv_kernel_dim"), "{e}");
    let e = err(&with(c.clone(), json!({"head_dim": 7})));
    assert!(e.contains("head_dim"), "{e}");
    let e = err(&with(c, json!({"rope_parameters": {"rope_theta": "big"}})));
    assert!(e.contains("rope_theta"), "{e}");
}

#[test]
fn recurrent_gemma_checks_its_block_types_and_heads() {
    let c = with(
        base("recurrent_gemma"),
        json!({"num_hidden_layers": 3, "attention_bias": false, "conv1d_width": 4,
               "logits_soft_cap": 30.0, "attention_window_size": 4, "num_key_value_heads": 1,
               "block_types": ["recurrent", "recurrent", "attention"]}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    // The 9B's `_block_types` serves too; `logits_soft_cap` is required but may be null.
    let mut alt = with(
        c.clone(),
        json!({"_block_types": ["attention", "recurrent"], "logits_soft_cap": null}),
    );
    alt.as_object_mut().unwrap().remove("block_types");
    build_model(&alt).unwrap();
    for key in ["logits_soft_cap", "attention_window_size", "conv1d_width"] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        let e = err(&missing);
        assert!(e.contains(key), "{key}: {e}");
    }
    let mut none = c.clone();
    none.as_object_mut().unwrap().remove("block_types");
    let e = err(&none);
    assert!(e.contains("block_types"), "{e}");
    let e = err(&with(c.clone(), json!({"block_types": ["recurrent"]})));
    assert!(e.contains("attention"), "{e}");
    let e = err(&with(c.clone(), json!({"num_attention_heads": 3})));
    assert!(e.contains("num_attention_heads"), "{e}");
    let e = err(&with(c, json!({"attention_window_size": 0})));
    assert!(e.contains("attention_window_size"), "{e}");
}

#[test]
fn step3p5_checks_its_heads_rope_lists_and_experts() {
    let c = with(
        base("step3p5"),
        json!({"num_hidden_layers": 3, "num_attention_groups": 2, "sliding_window": 4,
               "moe_num_experts": 4, "moe_top_k": 2, "moe_intermediate_size": 16,
               "share_expert_dim": 16, "rope_theta": [10000.0, 1000000.0, 10000.0],
               "partial_rotary_factors": [0.5, 1.0, 0.5],
               "attention_other_setting": {"num_attention_heads": 2, "num_attention_groups": 1},
               "swiglu_limits": [null, 7.0, null]}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    for key in ["num_attention_groups", "head_dim", "intermediate_size"] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        let e = err(&missing);
        assert!(e.contains(key), "{key}: {e}");
    }
    let e = err(&with(c.clone(), json!({"num_attention_groups": 3})));
    assert!(e.contains("key-value groups"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"attention_other_setting": {"num_attention_heads": 2}}),
    ));
    assert!(
        e.contains("attention_other_setting.num_attention_groups"),
        "{e}"
    );
    let e = err(&with(c.clone(), json!({"rope_theta": [10000.0]})));
    assert!(e.contains("rope_theta"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"partial_rotary_factors": [0.1, 1.0, 1.0]}),
    ));
    assert!(e.contains("rotary"), "{e}");
    let e = err(&with(c.clone(), json!({"layer_types": ["full_attention"]})));
    assert!(e.contains("layer_types"), "{e}");
    let e = err(&with(c.clone(), json!({"moe_layers_enum": "1,x"})));
    assert!(e.contains("moe_layers_enum"), "{e}");
    let e = err(&with(c.clone(), json!({"moe_top_k": 8})));
    assert!(e.contains("moe_top_k"), "{e}");
    let e = err(&with(c, json!({"sliding_window": 0})));
    assert!(e.contains("sliding_window"), "{e}");
}

#[test]
fn plamo2_checks_its_mamba_step_and_heads() {
    let c = with(
        base("plamo2"),
        json!({"num_hidden_layers": 4, "hidden_size_per_head": 8, "mamba_d_state": 8,
               "mamba_d_conv": 4, "mamba_num_heads": 4, "mamba_step": 2}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    let e = err(&with(c.clone(), json!({"mamba_step": 1})));
    assert!(e.contains("mamba_step"), "{e}");
    let e = err(&with(c.clone(), json!({"mamba_step": 10})));
    assert!(e.contains("mamba_step"), "{e}");
    let e = err(&with(c.clone(), json!({"num_key_value_heads": 3})));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&with(c.clone(), json!({"hidden_size_per_head": 7})));
    assert!(e.contains("hidden_size_per_head"), "{e}");
    let e = err(&with(c, json!({"mamba_d_conv": 1})));
    assert!(e.contains("mamba_d_conv"), "{e}");
}

#[test]
fn gear_checks_its_required_keys_layer_types_and_heads() {
    let c = with(
        base("gear"),
        json!({"num_hidden_layers": 3, "head_dim": 8, "sliding_window": 4,
               "layer_types": ["conv_mixer", "sliding_attention", "full_attention"]}),
    );
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    // Required by the dataclass (layer_types and num_key_value_heads may be null).
    for key in [
        "layer_types",
        "head_dim",
        "num_key_value_heads",
        "rms_norm_eps",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        let e = err(&missing);
        assert!(e.contains(key), "{key}: {e}");
    }
    build_model(&with(
        c.clone(),
        json!({"layer_types": null, "num_key_value_heads": null}),
    ))
    .unwrap();
    let e = err(&with(c.clone(), json!({"layer_types": ["full_attention"]})));
    assert!(e.contains("layer_types"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"layer_types": ["conv_mixer", "conv", "full_attention"]}),
    ));
    assert!(e.contains("layer_types"), "{e}");
    let e = err(&with(
        c.clone(),
        json!({"use_bidirectional_attention": true}),
    ));
    assert!(e.contains("use_bidirectional_attention"), "{e}");
    let e = err(&with(c.clone(), json!({"hidden_activation": "relu"})));
    assert!(e.contains("hidden_activation"), "{e}");
    let e = err(&with(c.clone(), json!({"num_key_value_heads": 3})));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = err(&with(c.clone(), json!({"conv_L_cache": 0})));
    assert!(e.contains("conv_L_cache"), "{e}");
    let e = err(&with(c, json!({"sliding_window": 0})));
    assert!(e.contains("sliding_window"), "{e}");
}

#[test]
fn rwkv7_requires_its_ranks_and_a_head_dim_dividing_the_width() {
    let c = json!({
        "model_type": "rwkv7", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "norm_eps": 1e-5, "head_dim": 8, "num_hidden_layers": 2, "a_low_rank_dim": 8,
        "v_low_rank_dim": 8, "gate_low_rank_dim": 8, "decay_low_rank_dim": 8,
    });
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    assert!(!m.padded_prefill_is_exact());
    for key in [
        "norm_eps",
        "head_dim",
        "a_low_rank_dim",
        "v_low_rank_dim",
        "gate_low_rank_dim",
        "decay_low_rank_dim",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        let e = err(&missing);
        assert!(e.contains(key), "{key}: {e}");
    }
    let e = err(&with(c.clone(), json!({"head_dim": 12})));
    assert!(e.contains("head_dim"), "{e}");
    let e = err(&with(c, json!({"head_dim": 0})));
    assert!(e.contains("head_dim"), "{e}");
}

#[test]
fn longcat_flash_checks_its_scales_experts_and_required_keys() {
    let c = json!({
        "model_type": "longcat_flash", "attention_method": "MLA", "zero_expert_type": "identity",
        "hidden_size": 32, "ffn_hidden_size": 64, "moe_topk": 2, "expert_ffn_hidden_size": 16,
        "n_routed_experts": 4, "zero_expert_num": 2, "num_layers": 2, "vocab_size": 64,
        "max_position_embeddings": 128, "num_attention_heads": 4, "kv_lora_rank": 16,
        "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
        "routed_scaling_factor": 2.0, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "mla_scale_q_lora": true, "mla_scale_kv_lora": true, "attention_bias": false,
    });
    let m = build_model(&c).unwrap();
    assert!(m.defines_make_cache());
    for key in [
        "zero_expert_type",
        "q_lora_rank",
        "kv_lora_rank",
        "mla_scale_kv_lora",
        "num_layers",
    ] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(key);
        let e = err(&missing);
        assert!(e.contains(key), "{key}: {e}");
    }
    let e = err(&with(c.clone(), json!({"zero_expert_type": "zero"})));
    assert!(e.contains("zero_expert_type"), "{e}");
    let e = err(&with(c.clone(), json!({"mla_scale_q_lora": false})));
    assert!(e.contains("mla_scale_q_lora"), "{e}");
    let e = err(&with(c.clone(), json!({"q_lora_rank": null})));
    assert!(e.contains("q_lora_rank"), "{e}");
    let e = err(&with(c.clone(), json!({"moe_topk": 7})));
    assert!(e.contains("moe_topk"), "{e}");
    let e = err(&with(c, json!({"qk_rope_head_dim": 7})));
    assert!(e.contains("qk_rope_head_dim"), "{e}");
}
