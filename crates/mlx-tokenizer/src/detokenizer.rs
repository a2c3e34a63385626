//! Streaming detokenizers with mlx-lm's semantics.
//!
//! Feed generated ids one at a time with [`StreamingDetokenizer::add_token`]
//! and read the newly printable text with
//! [`StreamingDetokenizer::last_segment`]. Text is held back while it ends in
//! an incomplete UTF-8 sequence, so a multi-byte character is never split.
//! After [`StreamingDetokenizer::finalize`], the concatenated segments equal the
//! tokenizer's full decode (minus one leading space for the SPM/BPE kinds,
//! which drop it like mlx-lm does).

use std::sync::{Arc, OnceLock};

use serde_json::{json, Value as Json};

/// Which streaming detokenizer a tokenizer uses (mlx-lm's choice from the
/// `decoder` section of tokenizer.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetokenizerKind {
    /// Re-decodes the pending tokens with the tokenizer; works for any tokenizer.
    Naive,
    /// SentencePiece (`▁` word marker, `<0xXX>` byte tokens).
    Spm {
        /// Drop the leading space of the first word.
        trim_space: bool,
    },
    /// Byte-level BPE (GPT-2 byte-to-unicode mapping).
    Bpe,
}

impl DetokenizerKind {
    /// mlx-lm's rule: exact SPM decoder sequences select SPM (with or without the
    /// final `Strip`), a `ByteLevel` decoder selects BPE, anything else Naive.
    pub fn from_decoder(decoder: Option<&Json>) -> Self {
        let Some(decoder) = decoder else {
            return Self::Naive;
        };
        let replace = json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "});
        let spm = json!({"type": "Sequence", "decoders": [
            replace, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        let spm_no_space = json!({"type": "Sequence", "decoders": [
            replace, {"type": "ByteFallback"}, {"type": "Fuse"}]});
        if *decoder == spm {
            Self::Spm { trim_space: true }
        } else if *decoder == spm_no_space {
            Self::Spm { trim_space: false }
        } else if decoder.get("type").and_then(Json::as_str) == Some("ByteLevel") {
            Self::Bpe
        } else {
            Self::Naive
        }
    }
}

/// One-token-at-a-time detokenization (mlx-lm's `StreamingDetokenizer`).
pub trait StreamingDetokenizer {
    /// Drops all streaming state.
    fn reset(&mut self);
    /// Consumes one token id.
    fn add_token(&mut self, id: u32);
    /// Flushes text held back waiting for more tokens.
    fn finalize(&mut self);
    /// All readable text so far.
    fn text(&mut self) -> &str;
    /// The ids added since the last reset.
    fn tokens(&self) -> &[u32];
    /// Text that became readable since the previous call.
    fn last_segment(&mut self) -> String;
}

/// Returns `text[*offset..]` and moves `offset` to the end.
fn take_segment(text: &str, offset: &mut usize) -> String {
    let mut from = (*offset).min(text.len());
    while !text.is_char_boundary(from) {
        from += 1;
    }
    *offset = text.len();
    text[from..].to_string()
}

/// Decodes ids with the tokenizer (used by [`NaiveDetokenizer`]).
pub(crate) type DecodeFn = dyn Fn(&[u32]) -> String + Send + Sync;

/// The bytes each token id stands for, built once per tokenizer.
#[derive(Debug, Default)]
pub(crate) struct TokenBytes {
    data: Vec<u8>,
    offsets: Vec<usize>,
    /// Byte-level BPE: ids whose token is the single-space marker `Ġ`.
    space_ids: Vec<u32>,
    /// Byte-level BPE: ids whose token holds `Ā` (byte 0), with the bytes mlx-lm's
    /// `finalize` gives them (`Ā` as a NUL byte; `data` has it as the UTF-8 of `Ā`).
    finalize_bytes: Vec<(u32, Vec<u8>)>,
}

impl TokenBytes {
    /// Builds the table from `(id -> token string)` for ids `0..n`.
    pub(crate) fn build(
        n: usize,
        kind: DetokenizerKind,
        token: impl Fn(u32) -> Option<String>,
    ) -> Self {
        let mut out = TokenBytes {
            offsets: Vec::with_capacity(n + 1),
            ..Default::default()
        };
        out.offsets.push(0);
        for id in 0..n {
            let id = u32::try_from(id).unwrap_or(u32::MAX);
            if let Some(tok) = token(id) {
                match kind {
                    DetokenizerKind::Spm { .. } => match spm_byte_token(&tok) {
                        Some(b) => out.data.push(b),
                        None => out.data.extend_from_slice(tok.as_bytes()),
                    },
                    DetokenizerKind::Bpe => {
                        if tok == "\u{120}" {
                            out.space_ids.push(id);
                        }
                        out.data.extend_from_slice(&bpe_bytes(&tok, false));
                        if tok.contains('\u{100}') {
                            out.finalize_bytes.push((id, bpe_bytes(&tok, true)));
                        }
                    }
                    DetokenizerKind::Naive => out.data.extend_from_slice(tok.as_bytes()),
                }
            }
            out.offsets.push(out.data.len());
        }
        out
    }

    fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (start, end) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        self.data.get(start..end)
    }

    /// The bytes of `id` as mlx-lm's BPE `finalize` maps them.
    fn get_for_finalize(&self, id: u32) -> Option<&[u8]> {
        match self.finalize_bytes.binary_search_by_key(&id, |(i, _)| *i) {
            Ok(i) => self.finalize_bytes.get(i).map(|(_, b)| b.as_slice()),
            Err(_) => self.get(id),
        }
    }
}

/// A byte-level BPE token's bytes, char by char as mlx-lm's BPE detokenizer maps
/// them: a char of the GPT-2 table gives its byte, any other char its own UTF-8.
/// `Ā` (byte 0) is the exception: `add_token` (`_decode_bytes`) tests the byte for
/// truth, so it keeps the UTF-8 of `Ā`, while `finalize` (`nul_byte`) gives byte 0.
pub(crate) fn bpe_bytes(tok: &str, nul_byte: bool) -> Vec<u8> {
    let table = byte_decoder();
    let mut out = Vec::with_capacity(tok.len());
    for c in tok.chars() {
        match table.get(c as usize).copied().flatten() {
            Some(b) if b != 0 || nul_byte => out.push(b),
            _ => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
        }
    }
    out
}

/// `<0xXX>` byte-fallback token value.
pub(crate) fn spm_byte_token(tok: &str) -> Option<u8> {
    let hex = tok.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2's unicode-to-byte table, indexed by char code (< 324).
fn byte_decoder() -> &'static [Option<u8>] {
    static TABLE: OnceLock<Vec<Option<u8>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u32| {
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
        };
        let mut table = vec![None; 256 + 68];
        let mut n = 0usize;
        for b in 0u32..256 {
            if printable(b) {
                table[b as usize] = Some(b as u8);
            } else {
                table[256 + n] = Some(b as u8);
                n += 1;
            }
        }
        table
    })
}

fn ends_incomplete(bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes).ends_with('\u{FFFD}')
}

/// mlx-lm's `NaiveStreamingDetokenizer`: re-decodes the tokens of the current
/// line on every read (quadratic in the line length, works for any tokenizer).
#[derive(Clone)]
pub struct NaiveDetokenizer {
    decode: Arc<DecodeFn>,
    clean_spaces: bool,
    tokens: Vec<u32>,
    offset: usize,
    done_text: String,
    current_tokens: Vec<u32>,
    current_text: String,
    full: String,
}

impl NaiveDetokenizer {
    /// `decode` decodes ids (keeping special tokens); `clean_spaces` is whether
    /// that decode removes the space in `"a ,b"` (then a trailing space is held back).
    pub(crate) fn new(decode: Arc<DecodeFn>, clean_spaces: bool) -> Self {
        Self {
            decode,
            clean_spaces,
            tokens: Vec::new(),
            offset: 0,
            done_text: String::new(),
            current_tokens: Vec::new(),
            current_text: String::new(),
            full: String::new(),
        }
    }
}

impl StreamingDetokenizer for NaiveDetokenizer {
    fn reset(&mut self) {
        self.offset = 0;
        self.tokens.clear();
        self.done_text.clear();
        self.current_tokens.clear();
        self.current_text.clear();
        self.full.clear();
    }

    fn add_token(&mut self, id: u32) {
        self.current_tokens.push(id);
        self.tokens.push(id);
    }

    fn finalize(&mut self) {
        let text = (self.decode)(&self.current_tokens);
        self.done_text.push_str(&text);
        self.current_tokens.clear();
        self.current_text.clear();
        self.full.clone_from(&self.done_text);
    }

    fn text(&mut self) -> &str {
        if !self.current_tokens.is_empty() {
            let mut text = (self.decode)(&self.current_tokens);
            if text.ends_with('\u{FFFD}') {
                let keep = text.trim_end_matches('\u{FFFD}').len();
                text.truncate(keep);
            } else if self.clean_spaces && text.ends_with(' ') {
                text.pop();
            }
            self.current_text = text;
        }
        if self.current_text.ends_with('\n') {
            self.done_text.push_str(&self.current_text);
            self.current_tokens.clear();
            self.current_text.clear();
        }
        self.full.clear();
        self.full.push_str(&self.done_text);
        self.full.push_str(&self.current_text);
        &self.full
    }

    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn last_segment(&mut self) -> String {
        self.text();
        take_segment(&self.full, &mut self.offset)
    }
}

/// mlx-lm's `SPMStreamingDetokenizer`: appends bytes per token, turns `▁` into
/// spaces and flushes once the pending bytes are complete UTF-8.
#[derive(Debug, Clone)]
pub struct SpmDetokenizer {
    map: Arc<TokenBytes>,
    trim_space: bool,
    tokens: Vec<u32>,
    offset: usize,
    unflushed: Vec<u8>,
    text: String,
}

impl SpmDetokenizer {
    pub(crate) fn new(map: Arc<TokenBytes>, trim_space: bool) -> Self {
        Self {
            map,
            trim_space,
            tokens: Vec::new(),
            offset: 0,
            unflushed: Vec::new(),
            text: String::new(),
        }
    }

    fn try_flush(&mut self, force: bool) {
        const SEP: &[u8] = "\u{2581}".as_bytes();
        let mut bytes = Vec::with_capacity(self.unflushed.len());
        let mut i = 0;
        while i < self.unflushed.len() {
            if self.unflushed[i..].starts_with(SEP) {
                bytes.push(b' ');
                i += SEP.len();
            } else {
                bytes.push(self.unflushed[i]);
                i += 1;
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        if !force && text.ends_with('\u{FFFD}') {
            return;
        }
        let text = match text.strip_prefix(' ') {
            Some(rest) if self.text.is_empty() && self.trim_space => rest,
            _ => &text,
        };
        self.text.push_str(text);
        self.unflushed.clear();
    }
}

impl StreamingDetokenizer for SpmDetokenizer {
    fn reset(&mut self) {
        self.offset = 0;
        self.unflushed.clear();
        self.text.clear();
        self.tokens.clear();
    }

    fn add_token(&mut self, id: u32) {
        self.tokens.push(id);
        if let Some(bytes) = self.map.get(id) {
            self.unflushed.extend_from_slice(bytes);
        }
        self.try_flush(false);
    }

    fn finalize(&mut self) {
        self.try_flush(true);
        self.unflushed.clear();
    }

    fn text(&mut self) -> &str {
        &self.text
    }

    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn last_segment(&mut self) -> String {
        take_segment(&self.text, &mut self.offset)
    }
}

/// mlx-lm's `BPEStreamingDetokenizer` for byte-level BPE: holds back
/// incomplete UTF-8 and a lone space token until the next token arrives.
#[derive(Debug, Clone)]
pub struct BpeDetokenizer {
    map: Arc<TokenBytes>,
    tokens: Vec<u32>,
    offset: usize,
    unflushed: Vec<u8>,
    /// The ids behind `unflushed` (`finalize` maps their chars its own way).
    unflushed_ids: Vec<u32>,
    text: String,
}

impl BpeDetokenizer {
    pub(crate) fn new(map: Arc<TokenBytes>) -> Self {
        Self {
            map,
            tokens: Vec::new(),
            offset: 0,
            unflushed: Vec::new(),
            unflushed_ids: Vec::new(),
            text: String::new(),
        }
    }

    fn push_trimmed(&mut self, current: &str) {
        match current.strip_prefix(' ') {
            Some(rest) if self.text.is_empty() => self.text.push_str(rest),
            _ => self.text.push_str(current),
        }
    }
}

impl StreamingDetokenizer for BpeDetokenizer {
    fn reset(&mut self) {
        self.offset = 0;
        self.unflushed.clear();
        self.unflushed_ids.clear();
        self.text.clear();
        self.tokens.clear();
    }

    fn add_token(&mut self, id: u32) {
        self.tokens.push(id);
        // mlx-lm's fallback for ids past the vocabulary (padded embeddings).
        let bytes = self.map.get(id).unwrap_or(b"!");
        self.unflushed.extend_from_slice(bytes);
        self.unflushed_ids.push(id);
        let is_space = self.map.space_ids.binary_search(&id).is_ok();
        if !is_space && !ends_incomplete(&self.unflushed) {
            let text = String::from_utf8_lossy(&self.unflushed).into_owned();
            self.push_trimmed(&text);
            self.unflushed.clear();
            self.unflushed_ids.clear();
        }
    }

    fn finalize(&mut self) {
        let mut bytes = Vec::with_capacity(self.unflushed.len());
        for &id in &self.unflushed_ids {
            bytes.extend_from_slice(self.map.get_for_finalize(id).unwrap_or(b"!"));
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        self.push_trimmed(&text);
        self.unflushed.clear();
        self.unflushed_ids.clear();
    }

    fn text(&mut self) -> &str {
        &self.text
    }

    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn last_segment(&mut self) -> String {
        take_segment(&self.text, &mut self.offset)
    }
}

/// The detokenizer a [`crate::Tokenizer`] hands out: one of the three kinds.
#[derive(Clone)]
pub enum Detokenizer {
    /// See [`NaiveDetokenizer`].
    Naive(NaiveDetokenizer),
    /// See [`SpmDetokenizer`].
    Spm(SpmDetokenizer),
    /// See [`BpeDetokenizer`].
    Bpe(BpeDetokenizer),
}

impl Detokenizer {
    fn inner(&mut self) -> &mut dyn StreamingDetokenizer {
        match self {
            Self::Naive(d) => d,
            Self::Spm(d) => d,
            Self::Bpe(d) => d,
        }
    }

    fn inner_ref(&self) -> &dyn StreamingDetokenizer {
        match self {
            Self::Naive(d) => d,
            Self::Spm(d) => d,
            Self::Bpe(d) => d,
        }
    }
}

impl StreamingDetokenizer for Detokenizer {
    fn reset(&mut self) {
        self.inner().reset()
    }
    fn add_token(&mut self, id: u32) {
        self.inner().add_token(id)
    }
    fn finalize(&mut self) {
        self.inner().finalize()
    }
    fn text(&mut self) -> &str {
        self.inner().text()
    }
    fn tokens(&self) -> &[u32] {
        self.inner_ref().tokens()
    }
    fn last_segment(&mut self) -> String {
        self.inner().last_segment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_section_selects_detokenizer_kind() {
        let spm = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        assert_eq!(
            DetokenizerKind::from_decoder(Some(&spm)),
            DetokenizerKind::Spm { trim_space: true }
        );
        let bpe = json!({"type": "ByteLevel", "add_prefix_space": true});
        assert_eq!(
            DetokenizerKind::from_decoder(Some(&bpe)),
            DetokenizerKind::Bpe
        );
        let other = json!({"type": "WordPiece", "prefix": "##"});
        assert_eq!(
            DetokenizerKind::from_decoder(Some(&other)),
            DetokenizerKind::Naive
        );
        assert_eq!(DetokenizerKind::from_decoder(None), DetokenizerKind::Naive);
    }

    #[test]
    fn byte_decoder_is_gpt2_table() {
        let t = byte_decoder();
        assert_eq!(t['!' as usize], Some(b'!'));
        assert_eq!(t[0x120], Some(b' '));
        assert_eq!(t[0x100], Some(0));
        assert_eq!(t.iter().filter(|b| b.is_some()).count(), 256);
    }

    #[test]
    fn spm_holds_back_split_byte_tokens() {
        let vocab = ["<0xE2>", "<0x82>", "<0xAC>", "\u{2581}a", "b"];
        let map = Arc::new(TokenBytes::build(
            vocab.len(),
            DetokenizerKind::Spm { trim_space: true },
            |i| vocab.get(i as usize).map(|s| s.to_string()),
        ));
        let mut d = SpmDetokenizer::new(map, true);
        let mut segments = Vec::new();
        for id in [3, 0, 1, 2, 4] {
            d.add_token(id);
            segments.push(d.last_segment());
        }
        d.finalize();
        segments.push(d.last_segment());
        assert_eq!(segments, ["a", "", "", "€", "b", ""]);
    }

    #[test]
    fn bpe_holds_back_lone_space_and_trims_first_space() {
        let vocab = ["\u{120}", "\u{120}hi", "x", "\u{c3}", "\u{a9}"];
        let map = Arc::new(TokenBytes::build(vocab.len(), DetokenizerKind::Bpe, |i| {
            vocab.get(i as usize).map(|s| s.to_string())
        }));
        let mut d = BpeDetokenizer::new(map);
        d.add_token(1);
        assert_eq!(d.last_segment(), "hi");
        d.add_token(0);
        assert_eq!(d.last_segment(), "");
        d.add_token(2);
        assert_eq!(d.last_segment(), " x");
        d.add_token(3);
        assert_eq!(d.last_segment(), "");
        d.add_token(4);
        assert_eq!(d.last_segment(), "é");
        d.add_token(99);
        d.finalize();
        assert_eq!(d.text(), "hi xé!");
    }

    /// Segments mlx-lm's `BPEStreamingDetokenizer` gives for these ids over the same
    /// vocabulary (recorded from mlx-lm 0.32.2).
    #[test]
    fn bpe_maps_chars_like_mlx_lm_byte_zero_included() {
        let vocab = [
            "\u{100}",
            "x",
            "\u{120}\u{4e2d}",
            "\u{e2}",
            "\u{100}\u{e2}",
            "\u{120}",
        ];
        let map = Arc::new(TokenBytes::build(vocab.len(), DetokenizerKind::Bpe, |i| {
            vocab.get(i as usize).map(|s| s.to_string())
        }));
        let cases: [(&[u32], &[&str]); 6] = [
            // Byte 0 streamed: `Ā` itself (mlx-lm tests the decoded byte for truth).
            (&[1, 0], &["x", "\u{100}", ""]),
            (&[3, 0], &["", "\u{fffd}\u{100}", ""]),
            // Byte 0 held back until finalize: a NUL byte there.
            (&[4], &["", "\0\u{fffd}"]),
            // A char outside the byte table keeps its own UTF-8, char by char.
            (&[5, 2, 1], &["", " \u{4e2d}", "x", ""]),
            (&[1, 4, 1], &["x", "", "\u{100}\u{fffd}x", ""]),
            (&[1, 99], &["x", "!", ""]),
        ];
        for (ids, expected) in cases {
            let mut d = BpeDetokenizer::new(map.clone());
            let mut segments = Vec::new();
            for &id in ids {
                d.add_token(id);
                segments.push(d.last_segment());
            }
            d.finalize();
            segments.push(d.last_segment());
            assert_eq!(segments, expected, "ids {ids:?}");
        }
    }
}
