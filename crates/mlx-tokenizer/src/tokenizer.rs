//! The [`Tokenizer`]: a Hugging Face `tokenizer.json` plus mlx-lm's wrapper logic.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use serde::Deserialize;
use serde_json::{Map, Value as Json};
use tokenizers::models::ModelWrapper;

use crate::config::{read_optional, TokenizerConfig};
use crate::detokenizer::{
    BpeDetokenizer, DecodeFn, Detokenizer, DetokenizerKind, NaiveDetokenizer, SpmDetokenizer,
    TokenBytes,
};
use crate::error::{TemplateError, TokenizerError};
use crate::template::{ChatOptions, ChatTemplate};

/// Start/end markers of a model's reasoning ("thinking") section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkMarkers {
    /// Opening text, e.g. `<think>`.
    pub start: String,
    /// Closing text, e.g. `</think>`.
    pub end: String,
    /// Ids of `start`.
    pub start_tokens: Vec<u32>,
    /// Ids of `end`.
    pub end_tokens: Vec<u32>,
}

/// A tokenizer with mlx-lm's `TokenizerWrapper` behaviour: encode/decode,
/// EOS ids, chat templates and streaming detokenizers.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    config: TokenizerConfig,
    eos_token_ids: HashSet<u32>,
    templates: BTreeMap<String, (String, OnceLock<Result<ChatTemplate, TemplateError>>)>,
    detokenizer_kind: DetokenizerKind,
    clean_up_on_decode: bool,
    token_bytes: OnceLock<Arc<TokenBytes>>,
    naive_clean_spaces: OnceLock<bool>,
    thinking: Option<ThinkMarkers>,
    tool_parser_type: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special_tokens", &self.config.special_tokens)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("chat_templates", &self.templates.keys().collect::<Vec<_>>())
            .field("detokenizer_kind", &self.detokenizer_kind)
            .finish()
    }
}

#[derive(Deserialize)]
struct DecoderProbe {
    #[serde(default)]
    decoder: Option<Json>,
}

impl Tokenizer {
    /// Loads a model directory: `tokenizer.json` (required), and when present
    /// `tokenizer_config.json`, `special_tokens_map.json`, `chat_template.jinja`,
    /// `additional_chat_templates/*.jinja`, `chat_template.json`,
    /// `generation_config.json` and `config.json` (for EOS ids).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let dir = dir.as_ref();
        let path = dir.join("tokenizer.json");
        let json = read_optional(&path)?
            .ok_or_else(|| TokenizerError::MissingTokenizerJson(dir.to_path_buf()))?;
        let config = TokenizerConfig::from_dir(dir)?;
        Self::from_json_str(&json, config)
    }

    /// Builds a tokenizer from the text of a `tokenizer.json` (e.g. one made
    /// from GGUF metadata) and a config. BOS/EOS added by `encode` come from the
    /// tokenizer.json post-processor, as in transformers.
    pub fn from_json_str(
        tokenizer_json: &str,
        config: TokenizerConfig,
    ) -> Result<Self, TokenizerError> {
        let probe: DecoderProbe =
            serde_json::from_str(tokenizer_json).map_err(|source| TokenizerError::Json {
                what: "tokenizer.json".into(),
                source,
            })?;
        let mut inner = tokenizers::Tokenizer::from_str(tokenizer_json)
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;
        // transformers encodes without the truncation/padding stored in the file.
        inner
            .with_truncation(None)
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;
        inner.with_padding(None);
        let detokenizer_kind = DetokenizerKind::from_decoder(probe.decoder.as_ref());
        let clean_up_on_decode = config.clean_up_tokenization_spaces
            && !matches!(inner.get_model(), ModelWrapper::BPE(_));
        let templates = config
            .chat_templates
            .iter()
            .map(|(name, src)| (name.clone(), (src.clone(), OnceLock::new())))
            .collect();
        let mut tok = Tokenizer {
            inner: Arc::new(inner),
            eos_token_ids: config.eos_token_ids.iter().copied().collect(),
            config,
            templates,
            detokenizer_kind,
            clean_up_on_decode,
            token_bytes: OnceLock::new(),
            naive_clean_spaces: OnceLock::new(),
            thinking: None,
            tool_parser_type: None,
        };
        if let Some(id) = tok.eos_token_id() {
            tok.eos_token_ids.insert(id);
        }
        tok.thinking = tok.infer_thinking();
        tok.tool_parser_type = tok
            .config
            .tool_parser_type
            .clone()
            .or_else(|| tok.infer_tool_parser());
        Ok(tok)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The parsed configuration.
    pub fn config(&self) -> &TokenizerConfig {
        &self.config
    }

    /// Token ids of `text`; `add_special_tokens` applies the post-processor (BOS...).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encodes a prompt with mlx-lm `generate`'s rule: special tokens are added
    /// unless the text already starts with the BOS token (e.g. a rendered chat template).
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>, TokenizerError> {
        let add = match self.bos_token() {
            Some(bos) => !prompt.starts_with(bos),
            None => true,
        };
        self.encode(prompt, add)
    }

    /// Text of `ids`, like transformers' `decode` (including its space clean-up
    /// for non-BPE models that ask for it).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        decode_with(
            &self.inner,
            ids,
            skip_special_tokens,
            self.clean_up_on_decode,
        )
    }

    /// Size of the vocabulary including added tokens (Python's `len(tokenizer)`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Id of a token string (added tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    fn special(&self, name: &str) -> Option<&str> {
        self.config.special_tokens.get(name).map(String::as_str)
    }

    /// The BOS token text, if the model has one.
    pub fn bos_token(&self) -> Option<&str> {
        self.special("bos_token")
    }

    /// Id of the BOS token.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token().and_then(|t| self.token_to_id(t))
    }

    /// The EOS token text, if the model has one.
    pub fn eos_token(&self) -> Option<&str> {
        self.special("eos_token")
    }

    /// Id of the EOS token.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token().and_then(|t| self.token_to_id(t))
    }

    /// Ids that end generation: the EOS token plus `generation_config.json` /
    /// `config.json` ids and any added with [`Self::add_eos_token`].
    pub fn eos_token_ids(&self) -> &HashSet<u32> {
        &self.eos_token_ids
    }

    /// Replaces the set of EOS ids.
    pub fn set_eos_token_ids(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.eos_token_ids = ids.into_iter().collect();
    }

    /// Adds an EOS id given as a number or a token string (`--extra-eos-token`).
    pub fn add_eos_token(&mut self, token: &str) -> Result<u32, TokenizerError> {
        let id = match token.trim().parse::<i64>() {
            Ok(n) => {
                u32::try_from(n).map_err(|_| TokenizerError::UnknownToken(token.to_string()))?
            }
            Err(_) => self
                .token_to_id(token)
                .ok_or_else(|| TokenizerError::UnknownToken(token.to_string()))?,
        };
        self.eos_token_ids.insert(id);
        Ok(id)
    }

    /// Variables the chat template sees for the named special tokens.
    pub fn special_tokens_map(&self) -> Map<String, Json> {
        self.config
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Json::String(v.clone())))
            .collect()
    }

    /// Whether a Jinja chat template is available.
    pub fn has_chat_template(&self) -> bool {
        !self.templates.is_empty()
    }

    /// The default chat template's source (the only one, or the one named `default`).
    pub fn chat_template(&self) -> Option<&str> {
        self.templates.get("default").map(|(src, _)| src.as_str())
    }

    /// Names of the available chat templates (`default` for a single one).
    pub fn chat_template_names(&self) -> Vec<&str> {
        self.templates.keys().map(String::as_str).collect()
    }

    /// Sets or replaces the default chat template (e.g. `--chat-template`).
    pub fn set_chat_template(&mut self, source: impl Into<String>) {
        self.templates.clear();
        self.templates
            .insert("default".into(), (source.into(), OnceLock::new()));
    }

    /// transformers' template choice: the named one, else `tool_use` when tools
    /// are given, else `default`.
    fn select_template(
        &self,
        name: Option<&str>,
        has_tools: bool,
    ) -> Result<&ChatTemplate, TokenizerError> {
        if self.templates.is_empty() {
            return Err(TokenizerError::NoChatTemplate);
        }
        let key = match name {
            Some(n) => Some(n),
            None if has_tools && self.templates.contains_key("tool_use") => Some("tool_use"),
            None => self.templates.contains_key("default").then_some("default"),
        };
        let entry = key.and_then(|k| self.templates.get(k)).ok_or_else(|| {
            TokenizerError::NoSuchTemplate {
                requested: name.map(str::to_string),
                available: self.templates.keys().cloned().collect(),
            }
        })?;
        let compiled = entry.1.get_or_init(|| ChatTemplate::new(entry.0.as_str()));
        compiled
            .as_ref()
            .map_err(|e| TokenizerError::Template(e.clone()))
    }

    /// Renders a conversation to text like mlx-lm's `apply_chat_template(...,
    /// tokenize=False)`: `enable_thinking` defaults to [`Self::has_thinking`].
    pub fn apply_chat_template(
        &self,
        messages: &[Json],
        opts: &ChatOptions,
    ) -> Result<String, TokenizerError> {
        let template = self.select_template(opts.template_name.as_deref(), opts.tools.is_some())?;
        // The default sits below `opts.kwargs`, which override it.
        let mut base = self.special_tokens_map();
        base.insert("enable_thinking".into(), Json::Bool(self.has_thinking()));
        Ok(template.render(messages, opts, &base)?)
    }

    /// [`Self::apply_chat_template`] then encode without adding special tokens.
    pub fn apply_chat_template_ids(
        &self,
        messages: &[Json],
        opts: &ChatOptions,
    ) -> Result<Vec<u32>, TokenizerError> {
        let text = self.apply_chat_template(messages, opts)?;
        self.encode(&text, false)
    }

    /// The detokenizer kind mlx-lm would pick for this tokenizer.
    pub fn detokenizer_kind(&self) -> DetokenizerKind {
        self.detokenizer_kind
    }

    /// A fresh streaming detokenizer of [`Self::detokenizer_kind`] (tables are
    /// built on first use, then shared by all detokenizers of this tokenizer).
    pub fn detokenizer(&self) -> Detokenizer {
        self.detokenizer_of_kind(self.detokenizer_kind)
    }

    /// A fresh streaming detokenizer of the given kind (e.g. `Naive` for any tokenizer).
    pub fn detokenizer_of_kind(&self, kind: DetokenizerKind) -> Detokenizer {
        match kind {
            DetokenizerKind::Naive => {
                let clean = *self
                    .naive_clean_spaces
                    .get_or_init(|| self.probe_clean_spaces());
                let inner = Arc::clone(&self.inner);
                let clean_up = self.clean_up_on_decode;
                let decode: Arc<DecodeFn> = Arc::new(move |ids: &[u32]| {
                    decode_with(&inner, ids, false, clean_up).unwrap_or_else(|e| {
                        tracing::warn!("detokenizer decode failed: {e}");
                        String::new()
                    })
                });
                Detokenizer::Naive(NaiveDetokenizer::new(decode, clean))
            }
            DetokenizerKind::Spm { trim_space } => {
                Detokenizer::Spm(SpmDetokenizer::new(self.token_bytes(kind), trim_space))
            }
            DetokenizerKind::Bpe => Detokenizer::Bpe(BpeDetokenizer::new(self.token_bytes(kind))),
        }
    }

    fn token_bytes(&self, kind: DetokenizerKind) -> Arc<TokenBytes> {
        let build = || {
            let max_added = self.inner.get_added_tokens_decoder().keys().copied().max();
            let n = max_added
                .map_or(0, |id| id as usize + 1)
                .max(self.vocab_size());
            Arc::new(TokenBytes::build(n, kind, |id| self.inner.id_to_token(id)))
        };
        let same_family = |a: DetokenizerKind, b: DetokenizerKind| {
            matches!(
                (a, b),
                (DetokenizerKind::Bpe, DetokenizerKind::Bpe)
                    | (DetokenizerKind::Spm { .. }, DetokenizerKind::Spm { .. })
            )
        };
        if same_family(kind, self.detokenizer_kind) {
            Arc::clone(self.token_bytes.get_or_init(build))
        } else {
            build()
        }
    }

    /// mlx-lm's probe: does decode drop the space in "a ,b"?
    fn probe_clean_spaces(&self) -> bool {
        let ids = self.encode("a ,b", false).unwrap_or_default();
        let text = self.decode(&ids, false).unwrap_or_default();
        !text.contains(" ,")
    }

    /// Whether the vocabulary has reasoning markers (`<think>`...).
    pub fn has_thinking(&self) -> bool {
        self.thinking.is_some()
    }

    /// Reasoning markers found in the vocabulary.
    pub fn think_markers(&self) -> Option<&ThinkMarkers> {
        self.thinking.as_ref()
    }

    /// The tool-call parser name: `tool_parser_type` from the config, else
    /// inferred from the chat template or vocabulary like mlx-lm.
    pub fn tool_parser_type(&self) -> Option<&str> {
        self.tool_parser_type.as_deref()
    }

    fn in_vocab(&self, token: &str) -> bool {
        self.inner.token_to_id(token).is_some()
    }

    fn is_xtml_vocab(&self) -> bool {
        ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]
            .iter()
            .all(|t| self.in_vocab(t))
    }

    /// Port of mlx-lm's `_infer_thinking`.
    fn infer_thinking(&self) -> Option<ThinkMarkers> {
        const SINGLE: [(&str, &str); 3] = [
            ("<think>", "</think>"),
            ("<longcat_think>", "</longcat_think>"),
            ("<|think:start|>", "<|think:end|>"),
        ];
        for (start, end) in SINGLE {
            if let (Some(s), Some(e)) = (self.token_to_id(start), self.token_to_id(end)) {
                return Some(ThinkMarkers {
                    start: start.into(),
                    end: end.into(),
                    start_tokens: vec![s],
                    end_tokens: vec![e],
                });
            }
        }
        let multi = if self.in_vocab("<|channel>") && self.in_vocab("<channel|>") {
            Some(("<|channel>thought", "<channel|>"))
        } else if self.is_xtml_vocab() {
            Some(("<|open|>think<|sep|>", "<|close|>think<|sep|>"))
        } else {
            None
        };
        let (start, end) = multi?;
        Some(ThinkMarkers {
            start: start.into(),
            end: end.into(),
            start_tokens: self.encode(start, false).ok()?,
            end_tokens: self.encode(end, false).ok()?,
        })
    }

    /// Port of mlx-lm's `_infer_tool_parser`.
    fn infer_tool_parser(&self) -> Option<String> {
        let single = match (self.templates.len(), self.templates.get("default")) {
            (1, Some((src, _))) => Some(src.as_str()),
            _ => None,
        };
        if let Some(t) = single {
            let has = |s: &str| t.contains(s);
            let name = if has("<minimax:tool_call>") {
                Some("minimax_m2")
            } else if has("<|tool_call>") && has("<tool_call|>") {
                Some("gemma4")
            } else if has("<start_function_call>") {
                Some("function_gemma")
            } else if has("<longcat_tool_call>") {
                Some("longcat")
            } else if has("<arg_key>") {
                Some("glm47")
            } else if has("<|tool_list_start|>") || has("<|tool_call_start|>") {
                Some("pythonic")
            } else if has("<tool_call>\\n<function=") || has("<tool_call>\n<function=") {
                Some("qwen3_coder")
            } else if has("<|tool_calls_section_begin|>") {
                Some("kimi_k2")
            } else if has("<function name=\"") && has("<param name=\"") {
                Some("minicpm5")
            } else if has("[TOOL_CALLS]") {
                Some("mistral")
            } else if has("<atem:function_calls>") {
                Some("muse_spark")
            } else if has("<tool_call>") && has("tool_call.name") {
                Some("json_tools")
            } else {
                None
            };
            if let Some(name) = name {
                return Some(name.to_string());
            }
        }
        if self.is_xtml_vocab() {
            Some("kimi_k3".into())
        } else if self.in_vocab("<|tool_call_start|>") && self.in_vocab("<|tool_call_end|>") {
            Some("pythonic".into())
        } else {
            None
        }
    }
}

fn decode_with(
    inner: &tokenizers::Tokenizer,
    ids: &[u32],
    skip_special_tokens: bool,
    clean_up: bool,
) -> Result<String, TokenizerError> {
    let text = inner
        .decode(ids, skip_special_tokens)
        .map_err(|e| TokenizerError::Backend(e.to_string()))?;
    Ok(if clean_up {
        clean_up_tokenization(&text)
    } else {
        text
    })
}

/// transformers' `clean_up_tokenization` (WordPiece-era space removal).
fn clean_up_tokenization(text: &str) -> String {
    let mut out = text.to_string();
    for (from, to) in [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ] {
        out = out.replace(from, to);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_and_detokenizer_can_cross_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<Detokenizer>();
    }

    #[test]
    fn clean_up_tokenization_removes_spaces_before_punctuation() {
        assert_eq!(
            clean_up_tokenization("a , b . c 's d n't"),
            "a, b. c's dn't"
        );
    }
}
