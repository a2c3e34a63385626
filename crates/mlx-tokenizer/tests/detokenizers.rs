//! Streaming detokenizers on the real tokenizers: exact mlx-lm segments and
//! the "segments add up to the decode, never split a character" property.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

mod common;

use common::{cached, golden, ids, TOKENIZERS};
use mlx_tokenizer::{DetokenizerKind, StreamingDetokenizer};

/// Streams `ids` and returns every `last_segment` (one per token, then the
/// one after `finalize`).
fn stream(detok: &mut impl StreamingDetokenizer, ids: &[u32]) -> Vec<String> {
    detok.reset();
    let mut segments: Vec<String> = ids
        .iter()
        .map(|&id| {
            detok.add_token(id);
            detok.last_segment()
        })
        .collect();
    detok.finalize();
    segments.push(detok.last_segment());
    segments
}

#[test]
fn streamed_segments_match_mlx_lm_exactly() {
    for name in TOKENIZERS {
        let tok = cached(name);
        let g = golden(name);
        let ids = ids(&g["stream"]["ids"]);
        let want: Vec<String> =
            serde_json::from_value(g["stream"]["segments"].clone()).expect("segments in golden");
        let mut detok = tok.detokenizer();
        assert_eq!(stream(&mut detok, &ids), want, "{name}");
        assert_eq!(detok.tokens(), &ids[..]);
    }
}

#[test]
fn segments_concatenate_to_full_decode_without_split_characters() {
    for name in TOKENIZERS {
        let tok = cached(name);
        let g = golden(name);
        let ids = ids(&g["stream"]["ids"]);
        let decoded = tok.decode(&ids, false).unwrap();
        assert_eq!(
            decoded,
            g["stream"]["decoded"].as_str().unwrap(),
            "{name} decode"
        );
        assert!(!decoded.contains('\u{FFFD}'));
        let kinds = [tok.detokenizer_kind(), DetokenizerKind::Naive];
        for kind in kinds {
            let mut detok = tok.detokenizer_of_kind(kind);
            let segments = stream(&mut detok, &ids);
            for s in &segments {
                assert!(
                    !s.contains('\u{FFFD}'),
                    "{name} {kind:?}: segment {s:?} has a replacement char"
                );
            }
            assert_eq!(segments.concat(), decoded, "{name} {kind:?}");
            assert_eq!(detok.text(), decoded, "{name} {kind:?} text()");
        }
    }
}

#[test]
fn emoji_split_over_byte_tokens_is_held_back_until_complete() {
    for name in TOKENIZERS {
        let tok = cached(name);
        // A rare emoji is spread over several byte-level tokens in these vocabularies.
        let text = "a🦩b";
        let ids = tok.encode(text, false).unwrap();
        let mut detok = tok.detokenizer();
        let segments = stream(&mut detok, &ids);
        assert_eq!(segments.concat(), text, "{name}");
        assert!(
            segments.iter().any(|s| s.contains('🦩')),
            "{name}: {segments:?}"
        );
        assert!(
            segments.iter().all(|s| !s.contains('\u{FFFD}')),
            "{name}: {segments:?}"
        );
    }
}

#[test]
fn special_tokens_stream_as_their_text() {
    let tok = cached("qwen2_5");
    let mut ids = tok.encode("Hi there", false).unwrap();
    ids.push(tok.token_to_id("<|im_end|>").unwrap());
    let mut detok = tok.detokenizer();
    assert_eq!(stream(&mut detok, &ids).concat(), "Hi there<|im_end|>");
}

#[test]
fn leading_space_of_first_word_is_dropped_like_mlx_lm() {
    // BPE: mlx-lm trims the first segment's leading space.
    let llama = cached("llama3_2");
    let ids = llama.encode(" hello world", false).unwrap();
    assert_eq!(
        stream(&mut llama.detokenizer(), &ids).concat(),
        "hello world"
    );
    // Gemma's SPM decoder has no Strip step, so mlx-lm keeps the space.
    let gemma = cached("gemma3");
    let ids = gemma.encode(" hello world", false).unwrap();
    assert_eq!(
        stream(&mut gemma.detokenizer(), &ids).concat(),
        " hello world"
    );
}

#[test]
fn reset_and_clone_give_independent_streams() {
    let tok = cached("mistral_nemo");
    let ids = tok.encode("Bonjour le monde — ça va?", false).unwrap();
    let mut a = tok.detokenizer();
    let first = stream(&mut a, &ids);
    let second = stream(&mut a, &ids);
    assert_eq!(first, second);

    let mut b = a.clone();
    b.reset();
    b.add_token(ids[0]);
    assert_eq!(b.tokens(), &ids[..1]);
    assert_eq!(a.tokens(), &ids[..]);
}

#[test]
fn naive_detokenizer_flushes_completed_lines() {
    let tok = cached("qwen3");
    let ids = tok.encode("line one\nline two", false).unwrap();
    let mut detok = tok.detokenizer_of_kind(DetokenizerKind::Naive);
    let mut seen = String::new();
    for id in &ids {
        detok.add_token(*id);
        seen.push_str(&detok.last_segment());
        assert!("line one\nline two".starts_with(&seen), "{seen:?}");
    }
    detok.finalize();
    seen.push_str(&detok.last_segment());
    assert_eq!(seen, "line one\nline two");
}
