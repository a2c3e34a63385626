//! Chat template rendering compared exactly with mlx-lm/transformers goldens,
//! plus the engine's safety behaviour (errors, fuel).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

mod common;

use common::{cached, golden, repo_root, TOKENIZERS};
use mlx_tokenizer::{ChatOptions, ChatTemplate, TemplateError, TokenizerError};
use serde_json::{json, Map, Value};

/// SmolLM2's ChatML template.
const SMOLLM_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

fn options(value: &Value) -> ChatOptions {
    let list = |key: &str| value.get(key).and_then(Value::as_array).cloned();
    ChatOptions {
        add_generation_prompt: value["add_generation_prompt"].as_bool().unwrap_or(false),
        continue_final_message: value["continue_final_message"].as_bool().unwrap_or(false),
        tools: list("tools"),
        documents: list("documents"),
        kwargs: value
            .get("kwargs")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        template_name: None,
    }
}

fn messages(case: &Value) -> Vec<Value> {
    case["messages"].as_array().expect("messages").clone()
}

/// Checks a render result against a golden case (`rendered` or `error`).
fn check(label: &str, case: &Value, result: Result<String, TemplateError>) {
    match (case.get("rendered").and_then(Value::as_str), result) {
        (Some(want), Ok(got)) => assert_eq!(got, want, "{label}"),
        (Some(_), Err(e)) => panic!("{label}: expected a render, got error {e}"),
        (None, Ok(got)) => panic!("{label}: expected error {}, got {got:?}", case["error"]),
        (None, Err(e)) => {
            let want = case["error"].as_str().unwrap_or_default();
            if let Some(msg) = want.strip_prefix("TemplateError: ") {
                assert_eq!(e, TemplateError::Raised(msg.to_string()), "{label}");
            }
        }
    }
}

fn unwrap_template_err(r: Result<String, TokenizerError>) -> Result<String, TemplateError> {
    r.map_err(|e| match e {
        TokenizerError::Template(t) => t,
        other => panic!("unexpected error {other}"),
    })
}

#[test]
fn real_chat_templates_render_like_transformers() {
    let mut checked = 0;
    for name in TOKENIZERS {
        let tok = cached(name);
        assert!(tok.has_chat_template(), "{name}");
        for case in golden(name)["chats"].as_array().expect("chats") {
            if case.get("template").is_some() {
                continue;
            }
            let label = format!("{name}/{}", case["name"].as_str().unwrap_or("?"));
            let result = tok.apply_chat_template(&messages(case), &options(&case["options"]));
            check(&label, case, unwrap_template_err(result));
            checked += 1;
        }
    }
    assert!(checked >= 35, "only {checked} cases");
}

#[test]
fn smollm_chatml_template_renders_like_transformers() {
    let stored =
        std::fs::read_to_string(repo_root().join("goldens/tokenizer/smollm_template.jinja"))
            .unwrap();
    assert_eq!(
        stored, SMOLLM_TEMPLATE,
        "goldens were made from a different template"
    );
    let tok = cached("qwen2_5");
    let template = ChatTemplate::new(SMOLLM_TEMPLATE).unwrap();
    let mut count = 0;
    for case in golden("qwen2_5")["chats"].as_array().unwrap() {
        if case.get("template").and_then(Value::as_str) != Some("smollm") {
            continue;
        }
        let result = template.render(
            &messages(case),
            &options(&case["options"]),
            &tok.special_tokens_map(),
        );
        check(case["name"].as_str().unwrap(), case, result);
        count += 1;
    }
    assert_eq!(count, 4);

    // Through the tokenizer after replacing its template.
    let mut custom = (*tok).clone();
    custom.set_chat_template(SMOLLM_TEMPLATE);
    let out = custom
        .apply_chat_template(
            &[json!({"role": "user", "content": "Hi"})],
            &ChatOptions::default(),
        )
        .unwrap();
    assert!(
        out.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"),
        "{out}"
    );
}

#[test]
fn template_snippets_print_like_python_jinja() {
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("goldens/tokenizer/template_snippets.json"))
            .unwrap(),
    )
    .unwrap();
    let msgs = g["snippet_messages"].as_array().unwrap().clone();
    for case in g["snippets"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let template = ChatTemplate::new(case["template"].as_str().unwrap()).unwrap();
        let opts = ChatOptions {
            kwargs: case["context"].as_object().unwrap().clone(),
            ..Default::default()
        };
        check(name, case, template.render(&msgs, &opts, &Map::new()));
    }
    for case in g["chat_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let template = ChatTemplate::new(case["template"].as_str().unwrap()).unwrap();
        let result = template.render(&messages(case), &options(&case["options"]), &Map::new());
        if case.get("error").is_some() {
            assert!(
                matches!(result, Err(TemplateError::InvalidChat(_))),
                "{name}: {result:?}"
            );
        }
        check(name, case, result);
    }
}

#[test]
fn llama_template_dates_today_via_strftime_now() {
    let tok = cached("llama3_2");
    let out = tok
        .apply_chat_template(
            &[json!({"role": "user", "content": "Hi"})],
            &ChatOptions::default(),
        )
        .unwrap();
    let today = chrono::Local::now().format("%d %b %Y").to_string();
    assert!(out.contains(&format!("Today Date: {today}")), "{out}");
}

#[test]
fn qwen3_thinking_defaults_on_and_kwarg_turns_it_off() {
    let tok = cached("qwen3");
    let msgs = [json!({"role": "user", "content": "Hi"})];
    let mut opts = ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let default = tok.apply_chat_template(&msgs, &opts).unwrap();
    assert!(default.ends_with("<|im_start|>assistant\n"), "{default}");
    opts.kwargs.insert("enable_thinking".into(), json!(false));
    let off = tok.apply_chat_template(&msgs, &opts).unwrap();
    assert!(
        off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{off}"
    );
}

#[test]
fn rendered_chat_encodes_without_adding_bos_twice() {
    let tok = cached("llama3_2");
    let msgs = [json!({"role": "user", "content": "Hi"})];
    let opts = ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let ids = tok.apply_chat_template_ids(&msgs, &opts).unwrap();
    let bos = tok.bos_token_id().unwrap();
    assert_eq!(ids[0], bos);
    assert_eq!(ids.iter().filter(|&&i| i == bos).count(), 1);
    let text = tok.apply_chat_template(&msgs, &opts).unwrap();
    assert_eq!(tok.encode_prompt(&text).unwrap(), ids);
}

#[test]
fn mistral_raise_exception_surfaces_template_message() {
    let tok = cached("mistral_nemo");
    let msgs = [json!({"role": "assistant", "content": "first"})];
    match tok.apply_chat_template(&msgs, &ChatOptions::default()) {
        Err(TokenizerError::Template(TemplateError::Raised(msg))) => {
            assert!(msg.contains("must alternate"), "{msg}")
        }
        other => panic!("expected raised exception, got {other:?}"),
    }
}

#[test]
fn endless_template_runs_out_of_fuel_instead_of_hanging() {
    let src =
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
    let template = ChatTemplate::with_fuel(src, Some(200_000)).unwrap();
    let msgs = [json!({"role": "user", "content": "x"})];
    assert_eq!(
        template.render(&msgs, &ChatOptions::default(), &Map::new()),
        Err(TemplateError::OutOfFuel)
    );
}

#[test]
fn default_fuel_is_enough_for_long_conversations() {
    let tok = cached("qwen3");
    let msgs: Vec<Value> = (0..400)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("turn {i}")}))
        .collect();
    let opts = ChatOptions {
        add_generation_prompt: true,
        tools: Some(vec![json!({"name": "t"})]),
        ..Default::default()
    };
    let out = tok.apply_chat_template(&msgs, &opts).unwrap();
    assert!(out.contains("turn 399"));
}

#[test]
fn runaway_recursion_is_an_error_not_a_crash() {
    let template = ChatTemplate::new("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").unwrap();
    let msgs = [json!({"role": "user", "content": "x"})];
    assert!(template
        .render(&msgs, &ChatOptions::default(), &Map::new())
        .is_err());
}

#[test]
fn bad_templates_and_inputs_are_reported() {
    assert!(matches!(
        ChatTemplate::new("{% for %}"),
        Err(TemplateError::Syntax(_))
    ));
    let t = ChatTemplate::new("{{ messages[0].content }}").unwrap();
    let none = Map::new();
    assert!(matches!(
        t.render(&[], &ChatOptions::default(), &none),
        Err(TemplateError::InvalidChat(_))
    ));
    assert!(matches!(
        t.render(&[json!("hi")], &ChatOptions::default(), &none),
        Err(TemplateError::InvalidChat(_))
    ));
    let bad_doc = ChatOptions {
        documents: Some(vec![json!(1)]),
        ..Default::default()
    };
    assert!(matches!(
        t.render(&[json!({"role": "user", "content": "x"})], &bad_doc, &none),
        Err(TemplateError::InvalidChat(_))
    ));
    let t = ChatTemplate::new("{{ 'x' | tojson(bogus=1) }}{{ strftime_now('%Q') }}").unwrap();
    assert!(matches!(
        t.render(
            &[json!({"role": "user", "content": "x"})],
            &ChatOptions::default(),
            &none
        ),
        Err(TemplateError::Render(_))
    ));
}

#[test]
fn special_tokens_are_template_variables_and_kwargs_override_them() {
    let t = ChatTemplate::new("{{ bos_token }}|{{ eos_token }}|{{ custom }}").unwrap();
    let mut special = Map::new();
    special.insert("bos_token".into(), json!("<s>"));
    special.insert("eos_token".into(), json!("</s>"));
    let mut opts = ChatOptions::default();
    opts.kwargs.insert("custom".into(), json!(3));
    opts.kwargs.insert("eos_token".into(), json!("<eot>"));
    let out = t
        .render(&[json!({"role": "user", "content": "x"})], &opts, &special)
        .unwrap();
    assert_eq!(out, "<s>|<eot>|3");
}
