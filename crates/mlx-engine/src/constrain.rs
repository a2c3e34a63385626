//! Constrained decoding: a JSON schema, a regex, a list of choices or a grammar
//! (Lark, or llama.cpp's GBNF converted to Lark) enforced token by token with
//! `llguidance`, as a stateful [`LogitsProcessor`].
//!
//! A [`ConstraintVocab`] is built once per tokenizer (the token trie of every token's
//! bytes, special tokens matched only by name); [`ConstraintVocab::compile`] checks and
//! compiles a [`Constraint`] (an invalid schema or grammar is an error naming the
//! problem, before anything runs); the [`CompiledConstraint`] builds a fresh processor
//! per choice. Each step the processor computes the allowed tokens on the host and
//! sets every other logit to `-inf` (`where`): the row's other logits keep their bits,
//! and rows without a constraint are not touched. When the grammar is complete only
//! the EOS tokens stay allowed (the sequence then stops as on any EOS). A dead end (a
//! state that allows no token of the vocabulary, or a sampled token the grammar
//! rejects) allows only the EOS tokens too, and the processor reports it
//! ([`LogitsProcessor::dead_end`]): the sequence ends with its own finish reason
//! (`"error"`), never as a valid `"stop"`.
use crate::error::{EngineError, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use mlx_array::{ops, where_, Array, Dtype};
use mlx_sample::{BuildProcessor, LogitsProcessor, SampleError};
use mlx_tokenizer::Tokenizer;
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON value valid against this JSON schema (an object).
    JsonSchema(Json),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A regular expression (Rust `regex` syntax), matched in full.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect (`start` is the top rule).
    Lark(String),
    /// A llama.cpp GBNF grammar (`root` is the top rule), converted to Lark.
    Gbnf(String),
}

impl Constraint {
    /// The kind, as users name it (for error messages).
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "JSON schema",
            Constraint::JsonObject => "JSON object",
            Constraint::Regex(_) => "regex",
            Constraint::Choice(_) => "choice list",
            Constraint::Lark(_) => "Lark grammar",
            Constraint::Gbnf(_) => "GBNF grammar",
        }
    }

    /// What identifies the compiled form over one vocabulary: the kind and the text.
    fn cache_key(&self) -> String {
        let text = match self {
            Constraint::JsonSchema(s) => s.to_string(),
            Constraint::JsonObject => String::new(),
            Constraint::Regex(r) => r.clone(),
            Constraint::Choice(list) => Json::from(list.clone()).to_string(),
            Constraint::Lark(g) | Constraint::Gbnf(g) => g.clone(),
        };
        format!("{}\n{text}", self.kind())
    }

    /// The Lark grammar (or JSON schema) handed to llguidance.
    fn to_grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Constraint::JsonSchema(s) => TopLevelGrammar::from_json_schema(json_options(s)?),
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(json_options(&json!({"type": "object"}))?)
            }
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
            Constraint::Choice(list) => {
                if list.is_empty() {
                    return Err(EngineError::Invalid(
                        "the choice list is empty: give at least one string".into(),
                    ));
                }
                let alts: Vec<String> = list.iter().map(|c| lark_string(c)).collect();
                TopLevelGrammar::from_lark(format!("start: {}\n", alts.join(" | ")))
            }
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Constraint::Gbnf(g) => TopLevelGrammar::from_lark(
                crate::gbnf::gbnf_to_lark(g)
                    .map_err(|e| EngineError::Invalid(format!("invalid GBNF grammar: {e}")))?,
            ),
        })
    }
}

/// JSON output style unless the schema sets its own (`x-guidance`): no free
/// whitespace, `", "` and `": "` separators (Python's `json.dumps` layout, which models
/// produce most), so that every answer is one compact line and a model cannot pad
/// with endless whitespace.
pub fn json_options(schema: &Json) -> Result<Json> {
    let Json::Object(m) = schema else {
        return Err(EngineError::Invalid(format!(
            "a JSON schema must be an object, got {schema}"
        )));
    };
    let mut m = m.clone();
    m.entry("x-guidance").or_insert_with(
        || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
    );
    Ok(Json::Object(m))
}

/// A Lark string literal of `s`.
pub fn lark_string(s: &str) -> String {
    // JSON string escapes are valid Lark string escapes.
    Json::String(s.to_string()).to_string()
}

/// The token trie of a tokenizer, shared by all the constraints of a model, and the
/// constraints compiled over it ([`ConstraintVocab::compile`] keeps the last
/// [`COMPILED_CACHE`] of them).
#[derive(Clone)]
pub struct ConstraintVocab {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
    eos: Arc<Vec<u32>>,
    special: Arc<std::collections::HashMap<Vec<u8>, u32>>,
    compiled: Arc<Mutex<CompiledCache>>,
}

/// How many compiled constraints a [`ConstraintVocab`] keeps (least recently used
/// out first).
pub const COMPILED_CACHE: usize = 64;

/// One constraint's compilation: started by the first request that needs it, waited
/// for by the others asking at the same time.
type Compiling = Arc<OnceLock<std::result::Result<CompiledConstraint, EngineError>>>;

/// Compiled constraints by [`Constraint::cache_key`], with their last use.
#[derive(Default)]
struct CompiledCache {
    entries: HashMap<String, (u64, Compiling)>,
    clock: u64,
}

impl CompiledCache {
    /// The entry of `key`, made (empty) when missing, the least recently used one
    /// dropped past [`COMPILED_CACHE`].
    fn entry(&mut self, key: String) -> Compiling {
        self.clock += 1;
        let now = self.clock;
        if let Some((used, c)) = self.entries.get_mut(&key) {
            *used = now;
            return Arc::clone(c);
        }
        if self.entries.len() >= COMPILED_CACHE {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        let c: Compiling = Arc::default();
        self.entries.insert(key, (now, Arc::clone(&c)));
        c
    }
}

impl std::fmt::Debug for ConstraintVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintVocab")
            .field("n_vocab", &self.n_vocab)
            .field("eos", &self.eos)
            .finish()
    }
}

/// llguidance's view of our tokenizer: the trie, and our tokenizer for the rare
/// tokenization llguidance asks for.
struct TokEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for TokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match self.tokenizer.encode(&String::from_utf8_lossy(s), false) {
            Ok(ids) => ids,
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

impl ConstraintVocab {
    /// The trie of `tokenizer`'s vocabulary ([`Tokenizer::vocab_bytes`]); special
    /// tokens are only reachable by name in a grammar (`<|im_end|>`), never as text.
    /// The tokenizer's EOS ids end a complete answer.
    pub fn new(tokenizer: &Tokenizer) -> Result<ConstraintVocab> {
        let vocab = tokenizer.vocab_bytes();
        let mut special = std::collections::HashMap::new();
        for (id, t) in vocab.iter().enumerate() {
            if t.special && !t.bytes.is_empty() {
                special.entry(t.bytes.clone()).or_insert(id as u32);
            }
        }
        let words: Vec<Vec<u8>> = vocab
            .iter()
            .map(|t| {
                if t.special {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(&t.bytes);
                    w
                } else {
                    t.bytes.clone()
                }
            })
            .collect();
        let mut eos: Vec<u32> = tokenizer
            .eos_token_ids()
            .iter()
            .copied()
            .filter(|&id| (id as usize) < words.len())
            .collect();
        eos.sort_unstable();
        let Some(&first) = eos.first() else {
            return Err(EngineError::Invalid(
                "the tokenizer has no EOS token: a constrained answer could not end".into(),
            ));
        };
        let info = TokRxInfo::new(words.len() as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        let env: llguidance::toktrie::TokEnv = Arc::new(TokEnv {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| EngineError::Internal(format!("building the token trie failed: {e}")))?;
        factory.quiet();
        Ok(ConstraintVocab {
            factory: Arc::new(factory),
            n_vocab: words.len(),
            eos: Arc::new(eos),
            special: Arc::new(special),
            compiled: Arc::default(),
        })
    }

    /// The id of the special token whose text is `text` (`[TOOL_CALLS]`,
    /// `<|tool_call_start|>`...), if the vocabulary has one: a grammar names it as
    /// `<[id]>`, since special tokens are never matched as text.
    pub fn special_token(&self, text: &str) -> Option<u32> {
        self.special.get(text.as_bytes()).copied()
    }

    /// A Lark expression for the literal `text`: the special token of that text when
    /// the vocabulary has one, else the string.
    pub fn lark_literal(&self, text: &str) -> String {
        match self.special_token(text) {
            Some(id) => format!("<[{id}]>"),
            None => lark_string(text),
        }
    }

    /// Checks and compiles `c`: an invalid schema, regex or grammar is
    /// [`EngineError::Invalid`] with llguidance's message. A constraint compiled before
    /// over this vocabulary (the same kind and text) is reused: see
    /// [`Self::compile_cached`].
    pub fn compile(&self, c: &Constraint) -> Result<CompiledConstraint> {
        self.compile_cached(c).map(|(compiled, _)| compiled)
    }

    /// [`Self::compile`], and whether `c` was compiled by this call (`false`: it came
    /// from the cache of the last [`COMPILED_CACHE`] constraints, or from a call
    /// compiling it at the same time, which this one waited for). Every processor built
    /// from a compiled constraint starts from its own copy of the parser.
    pub fn compile_cached(&self, c: &Constraint) -> Result<(CompiledConstraint, bool)> {
        let entry = self
            .compiled
            .lock()
            .map_err(|_| EngineError::Internal("the constraint cache's lock was poisoned".into()))?
            .entry(c.cache_key());
        let mut now = false;
        let done = entry.get_or_init(|| {
            now = true;
            self.compile_now(c)
        });
        done.clone().map(|compiled| (compiled, now))
    }

    fn compile_now(&self, c: &Constraint) -> Result<CompiledConstraint> {
        let grammar = c.to_grammar()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| EngineError::Invalid(format!("invalid {}: {e}", c.kind())))?;
        Ok(CompiledConstraint {
            parser: Arc::new(std::sync::Mutex::new(parser)),
            kind: c.kind(),
            start_after: None,
            eos: Arc::clone(&self.eos),
        })
    }
}

/// A checked constraint: builds a fresh processor for each choice.
#[derive(Clone)]
pub struct CompiledConstraint {
    parser: Arc<std::sync::Mutex<TokenParser>>,
    kind: &'static str,
    start_after: Option<Vec<u32>>,
    eos: Arc<Vec<u32>>,
}

impl std::fmt::Debug for CompiledConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledConstraint")
            .field("kind", &self.kind)
            .field("start_after", &self.start_after)
            .finish()
    }
}

impl CompiledConstraint {
    /// The constraint starts once the sequence has generated `tokens` (e.g. the end
    /// of a reasoning section: the thinking stays free).
    pub fn start_after(mut self, tokens: Vec<u32>) -> CompiledConstraint {
        self.start_after = (!tokens.is_empty()).then_some(tokens);
        self
    }

    /// A processor in the initial state.
    pub fn processor(&self) -> Result<ConstraintProcessor> {
        let parser = self
            .parser
            .lock()
            .map_err(|_| EngineError::Internal("a constraint's lock was poisoned".into()))?
            .deep_clone();
        Ok(ConstraintProcessor {
            matcher: Matcher::new(Ok(parser)),
            kind: self.kind,
            waiting_for: self.start_after.clone(),
            recent: Vec::new(),
            eos: Arc::clone(&self.eos),
            failed: None,
            ended: false,
        })
    }
}

impl BuildProcessor for CompiledConstraint {
    fn build(&self) -> mlx_sample::Result<Box<dyn LogitsProcessor>> {
        self.processor()
            .map(|p| Box::new(p) as Box<dyn LogitsProcessor>)
            .map_err(|e| SampleError::Constraint(e.to_string()))
    }
}

/// One sequence's constraint state.
#[derive(Clone)]
pub struct ConstraintProcessor {
    matcher: Matcher,
    kind: &'static str,
    /// While set, the constraint is inactive until these tokens are generated.
    waiting_for: Option<Vec<u32>>,
    recent: Vec<u32>,
    eos: Arc<Vec<u32>>,
    failed: Option<String>,
    ended: bool,
}

impl ConstraintProcessor {
    /// Whether the constraint applies to the next token.
    pub fn is_active(&self) -> bool {
        self.waiting_for.is_none()
    }

    /// Why the constraint cannot go on, once it reached a dead end.
    pub fn dead_end_reason(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The allowed tokens among `0..vocab`, as a bitset (bit `i % 32` of word `i / 32`,
    /// `vocab.div_ceil(32)` words: llguidance's own layout, copied as it is). A dead end
    /// (the grammar allows no token of the vocabulary, or it rejected a token) allows
    /// only the EOS tokens, so that the sequence ends; [`Self::dead_end_reason`] says
    /// why.
    pub fn allowed_words(&mut self, vocab: usize) -> Vec<u32> {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        self.allowed_words_into(vocab, &mut words);
        words
    }

    /// [`Self::allowed_words`] written into `dst` (`vocab.div_ceil(32)` words, every one
    /// written, which callers check): a batch's upload buffer, with no bitset of its own
    /// in between.
    fn allowed_words_into(&mut self, vocab: usize, dst: &mut [u32]) {
        let tic = crate::profile::enabled().then(std::time::Instant::now);
        if self.failed.is_none() {
            if let Err(why) = self.grammar_mask_into(vocab, dst) {
                tracing::debug!("constraint dead end: {why}");
                self.failed = Some(why);
            }
        }
        if self.failed.is_some() {
            dst.fill(0);
            for &e in self.eos.iter() {
                if let Some(w) = dst
                    .get_mut(e as usize / 32)
                    .filter(|_| (e as usize) < vocab)
                {
                    *w |= 1 << (e % 32);
                }
            }
        }
        if let Some(t) = tic {
            crate::profile::constraint_mask(t.elapsed());
        }
    }

    /// The allowed tokens among `0..vocab` (a `vocab`-long mask): [`Self::allowed_words`]
    /// one flag per token.
    pub fn allowed(&mut self, vocab: usize) -> Vec<bool> {
        let words = self.allowed_words(vocab);
        (0..vocab)
            .map(|i| words[i / 32] & (1 << (i % 32)) != 0)
            .collect()
    }

    /// The grammar's mask for this step into `dst` (`vocab.div_ceil(32)` words): one
    /// pass over llguidance's bitset, which also tells whether any token is allowed.
    fn grammar_mask_into(
        &mut self,
        vocab: usize,
        dst: &mut [u32],
    ) -> std::result::Result<(), String> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| {
            format!(
                "the {} allows no further token: {}",
                self.kind,
                first_line(&e.to_string())
            )
        })?;
        // The trie's vocabulary may be shorter than the model's (padded embeddings:
        // those ids stay forbidden) or longer (ids past the logits are dropped). Bits
        // past the trie's own size are never set by llguidance, but stay exact.
        let n = dst.len();
        let size = mask.len().min(vocab);
        let full = size / 32;
        let src = mask.as_slice();
        let mut any = 0u32;
        for (d, &w) in dst[..full].iter_mut().zip(src) {
            *d = w;
            any |= w;
        }
        let mut rest = full;
        if size % 32 != 0 {
            let w = src.get(full).copied().unwrap_or(0) & ((1u32 << (size % 32)) - 1);
            dst[full] = w;
            any |= w;
            rest += 1;
        }
        dst[rest.min(n)..].fill(0);
        if any == 0 {
            return Err(format!(
                "the {} allows no token of the model's vocabulary here",
                self.kind
            ));
        }
        Ok(())
    }
}

/// The `[rows, vocab]` boolean mask of `rows` bitsets of `vocab.div_ceil(32)` words
/// each (bit `i % 32` of word `i / 32` allows token `i`), expanded on the device: the
/// host hands over 1 bit per token instead of a byte.
pub fn mask_from_words(words: &[u32], rows: usize, vocab: usize) -> Result<Array> {
    let n = vocab.div_ceil(32);
    if words.len() != rows * n {
        return Err(EngineError::Internal(format!(
            "a token mask of {} words for {rows} rows of {vocab} tokens",
            words.len()
        )));
    }
    expand_mask_words(
        &Array::from_slice(words, &[rows as i32, n as i32, 1])?,
        vocab,
    )
}

/// [`mask_from_words`] of bitsets already on an array (`[rows, vocab.div_ceil(32), 1]`
/// `uint32`).
pub fn expand_mask_words(words: &Array, vocab: usize) -> Result<Array> {
    let n = vocab.div_ceil(32);
    let shape = words.shape();
    if shape.len() != 3 || shape[1] as usize != n || shape[2] != 1 {
        return Err(EngineError::Internal(format!(
            "token-mask words of shape {shape:?} for {vocab} tokens"
        )));
    }
    let (r, n32, v) = (shape[0], n as i32, vocab as i32);
    // Made on the device: a host upload at every step, however small, may be handed a
    // cached device buffer by MLX's CUDA allocator, which then swaps it for new managed
    // memory with a synchronous copy (~1 ms a step at 32 rows on an H200, GPU.md session 20).
    let shifts = ops::arange(0.0, 32.0, 1.0, Dtype::Uint32)?;
    let one = Array::scalar(1u32)?;
    let bits = words
        .right_shift(&shifts)?
        .bitwise_and(&one)?
        .reshape(&[r, n32 * 32])?
        .slice(&[0, 0], &[r, v], None)?;
    Ok(bits.astype(Dtype::Bool)?)
}

/// `logits` (`[rows, vocab]`) with every token the rows' bitsets `words` (`[rows,
/// vocab.div_ceil(32), 1]` `uint32`, as [`expand_mask_words`] takes them) forbid set to
/// `-inf`, allowed logits keeping their bits: [`expand_mask_words`] then [`apply_mask`],
/// or the same in one launch of our CUDA kernel on a GPU (`MLX_FAST_MASK=0` turns it off;
/// [`mlx_array::fast::masked_logits`]: five graph nodes fewer a step).
pub fn apply_mask_words(words: &Array, logits: &Array, vocab: usize) -> Result<Array> {
    if logits.ndim() == 2 && logits.dim(1)? as usize == vocab {
        if let Some(out) = mlx_array::fast::masked_logits(words, logits)? {
            return Ok(out);
        }
    }
    apply_mask(&expand_mask_words(words, vocab)?, logits)
}

/// `logits` (`[rows, vocab]`) with every token `cond` forbids set to `-inf`; allowed
/// logits keep their bits.
pub fn apply_mask(cond: &Array, logits: &Array) -> Result<Array> {
    let neg_inf = Array::scalar_f64(f64::NEG_INFINITY, float_like(logits.dtype()))?;
    Ok(where_(cond, logits, &neg_inf)?)
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

impl LogitsProcessor for ConstraintProcessor {
    fn process(&mut self, _history: &Array, logits: &Array) -> mlx_sample::Result<Array> {
        if !self.is_active() {
            return Ok(logits.clone());
        }
        let shape = logits.shape();
        let vocab = *shape.last().unwrap_or(&0) as usize;
        let words = self.allowed_words(vocab);
        let n = words.len() as i32;
        let words = Array::from_slice(&words, &[1, n, 1]).map_err(SampleError::Mlx)?;
        apply_mask_words(&words, logits, vocab).map_err(to_sample_err)
    }

    fn uses_history(&self) -> bool {
        false
    }

    fn allowed_bits(&mut self, vocab: usize) -> Option<mlx_sample::Result<Vec<u32>>> {
        self.is_active().then(|| Ok(self.allowed_words(vocab)))
    }

    fn allowed_bits_into(
        &mut self,
        vocab: usize,
        dst: &mut [u32],
    ) -> Option<mlx_sample::Result<()>> {
        if !self.is_active() {
            return None;
        }
        if dst.len() != vocab.div_ceil(32) {
            return Some(Err(mlx_sample::SampleError::Constraint(format!(
                "a token mask of {} words for {vocab} tokens",
                dst.len()
            ))));
        }
        self.allowed_words_into(vocab, dst);
        Some(Ok(()))
    }

    fn accept(&mut self, token: u32) -> mlx_sample::Result<()> {
        // The sequence ended on an EOS: later tokens (e.g. accepted drafts of a
        // speculative round past it) are not part of the answer.
        if self.ended {
            return Ok(());
        }
        if self.eos.contains(&token) {
            self.ended = true;
        }
        if let Some(wanted) = &self.waiting_for {
            if self.eos.contains(&token) {
                // The answer ended inside the thinking section: nothing was constrained.
                self.failed = Some(format!(
                    "the answer ended before the {} started (inside the thinking section)",
                    self.kind
                ));
                return Ok(());
            }
            self.recent.push(token);
            if self.recent.ends_with(wanted) {
                self.waiting_for = None;
                self.recent.clear();
            } else if self.recent.len() > wanted.len() {
                self.recent.remove(0);
            }
            return Ok(());
        }
        if self.failed.is_some() || self.matcher.is_stopped() {
            return Ok(());
        }
        // An EOS ends the sequence: the grammar allowed it (as the end of a complete
        // answer), unless the grammar names the EOS token itself mid-way.
        if self.eos.contains(&token) {
            if !self.matcher.is_accepting().unwrap_or(false) {
                self.failed = Some(format!(
                    "the answer ended before the {} was complete",
                    self.kind
                ));
            }
            return Ok(());
        }
        let tic = crate::profile::enabled().then(std::time::Instant::now);
        let consumed = self.matcher.consume_token(token);
        if let Some(t) = tic {
            crate::profile::constraint_accept(t.elapsed());
        }
        if let Err(e) = consumed {
            // A dead end: this token was already sampled (the constraint's mask was
            // overridden, e.g. every allowed logit was -inf); the sequence ends here.
            self.failed = Some(format!(
                "the {} rejected token {token}: {}",
                self.kind,
                first_line(&e.to_string())
            ));
        }
        Ok(())
    }

    fn needs_accepted_token(&self) -> bool {
        true
    }

    fn dead_end(&self) -> bool {
        self.failed.is_some()
    }

    fn fork(&self) -> Box<dyn LogitsProcessor> {
        let mut copy = self.clone();
        copy.matcher = self.matcher.deep_clone();
        Box::new(copy)
    }
}

fn to_sample_err(e: EngineError) -> SampleError {
    match e {
        EngineError::Mlx(m) => SampleError::Mlx(m),
        other => SampleError::Constraint(other.to_string()),
    }
}

/// The dtype of `-inf` next to logits of `dtype` (a float dtype stays itself).
fn float_like(dtype: Dtype) -> Dtype {
    if dtype.is_floating() {
        dtype
    } else {
        Dtype::Float32
    }
}

/// Whether `prompt` ends inside a thinking section of `tokenizer`'s markers (the last
/// start marker comes after the last end marker).
pub fn prompt_opens_thinking(tokenizer: &Tokenizer, prompt: &[u32]) -> bool {
    let Some(m) = tokenizer.think_markers() else {
        return false;
    };
    let rfind = |pat: &[u32]| -> Option<usize> {
        if pat.is_empty() || pat.len() > prompt.len() {
            return None;
        }
        (0..=prompt.len() - pat.len())
            .rev()
            .find(|&i| prompt[i..].starts_with(pat))
    };
    match (rfind(&m.start_tokens), rfind(&m.end_tokens)) {
        (Some(s), Some(e)) => s > e,
        (Some(_), None) => true,
        _ => false,
    }
}

/// A processor for one generation after `prompt` (e.g. for `mlx-generate`): the trie
/// of `tokenizer`, `c` compiled, waiting for the end of the thinking section the prompt
/// opened, if any.
pub fn processor_for_prompt(
    tokenizer: &Tokenizer,
    c: &Constraint,
    prompt: &[u32],
) -> Result<ConstraintProcessor> {
    let compiled = ConstraintVocab::new(tokenizer)?.compile(c)?;
    let compiled = match tokenizer.think_markers() {
        Some(m) if prompt_opens_thinking(tokenizer, prompt) => {
            compiled.start_after(m.end_tokens.clone())
        }
        _ => compiled,
    };
    compiled.processor()
}
