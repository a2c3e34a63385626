//! The multi-head latent attention families: mlx-lm's defaults and aliases, and configs
//! mlx-lm cannot run refused at build time with an error naming the key.
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

fn deepseek(model_type: &str) -> Value {
    json!({
        "model_type": model_type, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
        "v_head_dim": 8, "first_k_dense_replace": 1,
        "rope_scaling": {"type": "yarn", "factor": 4.0},
    })
}

#[test]
fn kimi_k2_and_joyai_load_as_deepseek_v3_with_plain_caches() {
    for t in [
        "deepseek_v3",
        "kimi_k2",
        "joyai_llm_flash",
        "glm4_moe_lite",
        "deepseek_v2",
    ] {
        let m = build_model(&deepseek(t)).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(m.model_type(), t);
        assert_eq!(m.cache_specs(), vec![CacheSpec::Standard; 2], "{t}");
    }
    let k = json!({"model_type": "kimi_k25", "text_config": deepseek("deepseek_v3")});
    let m = build_model(&k).expect("kimi_k25 builds from its text_config");
    assert_eq!((m.model_type(), m.num_layers()), ("kimi_k25", 2));
    let e = err(&json!({"model_type": "kimi_k25"}));
    assert!(e.contains("text_config"), "{e}");
}

#[test]
fn deepseek_v3_takes_mlx_lm_s_defaults_for_missing_keys() {
    // Everything but the type: mlx-lm's dataclass defaults (30 layers, q-LoRA 1536, ...).
    let m = build_model(&json!({"model_type": "deepseek_v3"})).expect("builds");
    assert_eq!(m.num_layers(), 30);
    assert_eq!(m.vocab_size(), 102400);
    // A null q_lora_rank gives the single `q_proj`.
    let m =
        build_model(&with(deepseek("deepseek_v3"), json!({"q_lora_rank": null}))).expect("builds");
    let names: Vec<String> = m
        .as_module()
        .expect("module")
        .parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names
        .iter()
        .any(|n| n == "model.layers.0.self_attn.q_proj.weight"));
    assert!(!names.iter().any(|n| n.contains("q_a_proj")));
    assert!(names
        .iter()
        .any(|n| n == "model.layers.1.self_attn.embed_q.weight"));
}

#[test]
fn configs_mlx_lm_cannot_run_are_refused_naming_the_key() {
    let e = err(&with(
        deepseek("deepseek_v3"),
        json!({"topk_method": "greedy"}),
    ));
    assert!(e.contains("topk_method"), "{e}");
    let e = err(&with(
        deepseek("deepseek_v2"),
        json!({"rope_scaling": null}),
    ));
    assert!(e.contains("rope_scaling"), "{e}");
    let e = err(&with(
        deepseek("deepseek_v2"),
        json!({"topk_method": "group_limited_greedy"}),
    ));
    assert!(e.contains("n_group"), "{e}");
    let minicpm3 = json!({
        "model_type": "minicpm3", "hidden_size": 32, "dim_model_base": 16,
        "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 4,
        "rms_norm_eps": 1e-5, "vocab_size": 64, "num_key_value_heads": 4, "q_lora_rank": 16,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "kv_lora_rank": 16, "scale_depth": 1.4,
        "scale_emb": 12.0, "max_position_embeddings": 128,
    });
    let e = err(&minicpm3);
    assert!(e.contains("rope_scaling"), "{e}");
    let ok = with(minicpm3, json!({"rope_scaling": {"type": "longrope"}}));
    build_model(&ok).expect("minicpm3 with rope_scaling builds");
}

#[test]
fn an_unknown_model_type_lists_the_mla_ones() {
    let e = err(&json!({"model_type": "not_a_model"}));
    for t in [
        "deepseek_v2",
        "deepseek_v3",
        "glm4_moe_lite",
        "joyai_llm_flash",
        "kimi_k2",
        "kimi_k25",
        "minicpm3",
    ] {
        let listed = e
            .split_once("supported: ")
            .map(|(_, l)| l.split(", ").any(|x| x == t));
        assert_eq!(listed, Some(true), "{t} not in: {e}");
    }
}

#[test]
fn deepseek_v32_keeps_a_cache_list_per_layer_and_needs_its_indexer_inputs() {
    let c = with(
        deepseek("deepseek_v32"),
        json!({"index_topk": 4, "index_n_heads": 2, "index_head_dim": 16}),
    );
    let m = build_model(&c).expect("builds");
    let list = CacheSpec::List(&[CacheSpec::Standard, CacheSpec::Standard]);
    assert_eq!(m.cache_specs(), vec![list; 2]);
    assert!(m.defines_make_cache());
    let e = err(&with(c.clone(), json!({"q_lora_rank": null})));
    assert!(e.contains("q_lora_rank"), "{e}");
    let e = err(&with(c, json!({"index_topk": 0})));
    assert!(e.contains("index_topk"), "{e}");
}
