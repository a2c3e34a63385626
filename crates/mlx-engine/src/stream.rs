//! `stream_generate`: text segments with statistics, stopping on EOS.
use crate::error::{EngineError, Result};
use crate::generate::{GenerateOptions, TokenGenerator, TokenIterator};
use mlx_array::{memory, Array};
use mlx_models::LanguageModel;
use mlx_nn::KvCache;
use mlx_tokenizer::{StreamingDetokenizer, Tokenizer};
use std::time::Instant;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// An output constraint reached a dead end (no token could continue it validly):
    /// the output is incomplete.
    Constraint,
}

impl FinishReason {
    /// mlx-lm's string (`"stop"`, `"length"`; a constraint's dead end is `"error"`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Constraint => "error",
        }
    }
}

/// One streamed piece of output (mlx-lm's `GenerationResponse`).
#[derive(Debug, Clone)]
pub struct GenerationResponse {
    /// New text since the previous response (may be empty).
    pub text: String,
    /// The token of this step.
    pub token: u32,
    /// Log-probabilities over the vocabulary for this step.
    pub logprobs: Array,
    /// Whether the token was drafted and accepted in speculative decoding.
    pub from_draft: bool,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens per second.
    pub prompt_tps: f64,
    /// Tokens generated so far.
    pub generation_tokens: usize,
    /// Generated tokens per second.
    pub generation_tps: f64,
    /// Peak memory so far, in GB (1e9 bytes).
    pub peak_memory: f64,
    /// Set on the last response.
    pub finish_reason: Option<FinishReason>,
}

/// A prompt as text (tokenized like mlx-lm: BOS added unless the text starts with it)
/// or as token ids.
pub enum PromptInput<'a> {
    /// Text.
    Text(&'a str),
    /// Token ids.
    Tokens(&'a [u32]),
}

/// Generates from `prompt`, calling `on_response` for every segment (the last one has
/// `finish_reason` set). Returning `false` from the callback stops early.
pub fn stream_generate(
    model: &dyn LanguageModel,
    tokenizer: &Tokenizer,
    prompt: PromptInput<'_>,
    caches: &mut Vec<Box<dyn KvCache>>,
    opts: GenerateOptions,
    on_response: impl FnMut(&GenerationResponse) -> bool,
) -> Result<Option<GenerationResponse>> {
    if opts.max_tokens == 0 {
        return Err(EngineError::Invalid(
            "maximum number of tokens must be non-zero (use -1 for no limit)".into(),
        ));
    }
    let ids = match prompt {
        PromptInput::Tokens(t) => t.to_vec(),
        PromptInput::Text(text) => {
            let add_special = tokenizer.bos_token().is_none_or(|b| !text.starts_with(b));
            tokenizer.encode(text, add_special)?
        }
    };
    let max_tokens = opts.max_tokens;
    let mut gen = TokenGenerator::new(model, &ids, caches, opts)?;
    stream_generate_with(&mut gen, tokenizer, max_tokens, on_response)
}

/// [`stream_generate`] over any [`TokenIterator`]: detokenized segments with statistics,
/// stopping on EOS or after `max_tokens` (`-1`: no limit).
pub fn stream_generate_with(
    gen: &mut dyn TokenIterator,
    tokenizer: &Tokenizer,
    max_tokens: i64,
    mut on_response: impl FnMut(&GenerationResponse) -> bool,
) -> Result<Option<GenerationResponse>> {
    if max_tokens == 0 {
        return Err(EngineError::Invalid(
            "maximum number of tokens must be non-zero (use -1 for no limit)".into(),
        ));
    }
    let prompt_tokens = gen.prompt_tokens();
    let mut detok = tokenizer.detokenizer();
    let eos = tokenizer.eos_token_ids().clone();

    let mut tic = Instant::now();
    let mut prompt_tps = 0.0;
    let mut n = 0usize;
    let mut last: Option<(u32, Array, bool)> = None;
    let mut stopped_early = false;
    while let Some((token, logprobs)) = gen.next_token()? {
        if n == 0 {
            let prompt_time = tic.elapsed().as_secs_f64();
            prompt_tps = prompt_tokens as f64 / prompt_time.max(1e-9);
            tic = Instant::now();
        }
        last = Some((token, logprobs.clone(), gen.last_from_draft()));
        if eos.contains(&token) {
            break;
        }
        detok.add_token(token);
        if (n as i64 + 1) == max_tokens {
            break;
        }
        let resp = GenerationResponse {
            text: detok.last_segment(),
            token,
            logprobs,
            from_draft: gen.last_from_draft(),
            prompt_tokens,
            prompt_tps,
            generation_tokens: n + 1,
            generation_tps: (n + 1) as f64 / tic.elapsed().as_secs_f64().max(1e-9),
            peak_memory: memory::peak_memory() as f64 / 1e9,
            finish_reason: None,
        };
        if !on_response(&resp) {
            stopped_early = true;
            break;
        }
        n += 1;
    }
    let Some((token, logprobs, from_draft)) = last else {
        return Ok(None);
    };
    detok.finalize();
    let reason = if eos.contains(&token) && gen.dead_end() {
        FinishReason::Constraint
    } else if eos.contains(&token) {
        FinishReason::Stop
    } else {
        FinishReason::Length
    };
    let resp = GenerationResponse {
        text: detok.last_segment(),
        token,
        logprobs,
        from_draft,
        prompt_tokens,
        prompt_tps,
        generation_tokens: n + 1,
        generation_tps: (n + 1) as f64 / tic.elapsed().as_secs_f64().max(1e-9),
        peak_memory: memory::peak_memory() as f64 / 1e9,
        finish_reason: Some(reason),
    };
    if !stopped_early {
        on_response(&resp);
    }
    Ok(Some(resp))
}
