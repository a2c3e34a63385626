//! The text each token id stands for, as bytes: what a grammar engine matches the
//! generated text against (a token trie needs every token's bytes, not its string in
//! the vocabulary's own encoding).
use crate::detokenizer::{bpe_bytes, spm_byte_token, DetokenizerKind};
use crate::tokenizer::Tokenizer;

/// One vocabulary entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VocabToken {
    /// The bytes the token adds to the text (empty for ids without a token).
    pub bytes: Vec<u8>,
    /// A special token (BOS, EOS, chat markers...): not part of any text a grammar
    /// describes, only matched by name.
    pub special: bool,
}

impl Tokenizer {
    /// Every token id's bytes, ids `0..n` with `n` the largest id plus one:
    /// byte-level BPE tokens through GPT-2's byte table, SentencePiece tokens with `▁`
    /// as a space and `<0xXX>` byte-fallback tokens as their byte, added tokens as
    /// their content (flagged when special). Other vocabularies (no byte-level or
    /// SentencePiece decoder) take the token string, with the same `▁` and byte-token
    /// rules.
    pub fn vocab_bytes(&self) -> Vec<VocabToken> {
        let inner = self.inner();
        let added = inner.get_added_tokens_decoder();
        let n = added
            .keys()
            .copied()
            .max()
            .map_or(0, |id| id as usize + 1)
            .max(self.vocab_size());
        let kind = self.detokenizer_kind();
        (0..n)
            .map(|i| {
                let id = u32::try_from(i).unwrap_or(u32::MAX);
                if let Some(t) = added.get(&id) {
                    return VocabToken {
                        bytes: t.content.as_bytes().to_vec(),
                        special: t.special,
                    };
                }
                let bytes = match inner.id_to_token(id) {
                    None => Vec::new(),
                    Some(tok) => match kind {
                        DetokenizerKind::Bpe => bpe_bytes(&tok, true),
                        DetokenizerKind::Spm { .. } | DetokenizerKind::Naive => {
                            match spm_byte_token(&tok) {
                                Some(b) => vec![b],
                                None => tok.replace('\u{2581}', " ").into_bytes(),
                            }
                        }
                    },
                };
                VocabToken {
                    bytes,
                    special: false,
                }
            })
            .collect()
    }
}
