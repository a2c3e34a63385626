//! The speculative-decoding flags the generation commands share: mlx-lm's
//! `--draft-model` / `--num-draft-tokens`, and our draft-free prompt lookup.
use crate::load::{load, CpuWeights, LoadArgs, Loaded};
use anyhow::{bail, Result};
use mlx_engine::speculative::{check_min_acceptance, check_num_draft_tokens};
use mlx_engine::{DraftSource, PromptLookup, SpeculativeStats};
use mlx_tokenizer::Tokenizer;

/// The n-gram size of `--prompt-lookup-tokens` alone.
pub const DEFAULT_LOOKUP_NGRAM: usize = 3;
/// The draft length of `--prompt-lookup-ngram` alone.
pub const DEFAULT_LOOKUP_TOKENS: i32 = 10;

/// Speculative decoding flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpeculativeArgs {
    /// A model to be used for speculative decoding.
    #[arg(long)]
    pub draft_model: Option<String>,
    /// Number of tokens to draft when using speculative decoding.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    pub num_draft_tokens: i64,
    /// Draft-free speculative decoding (not in mlx-lm): draft the tokens that followed
    /// the latest earlier occurrence of the last N tokens (N down to 1) in the prompt
    /// and the text so far; verified by the model like a draft model's tokens [default
    /// with --prompt-lookup-tokens: 3]
    #[arg(long, value_name = "N")]
    pub prompt_lookup_ngram: Option<usize>,
    /// Tokens drafted per round by prompt lookup (not in mlx-lm) [default with
    /// --prompt-lookup-ngram: 10]
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    pub prompt_lookup_tokens: Option<i64>,
    /// Stop speculating (not in mlx-lm) once fewer than this share (0 to 1) of the
    /// drafts of the last 8 rounds were accepted: the rest of the generation decodes
    /// plainly. 0 never stops (mlx-lm's behaviour). Default: 0.3 for greedy decoding
    /// with a draft model (its tokens are the same either way), else 0
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub draft_min_acceptance: Option<f64>,
}

/// What the flags asked for, loaded.
pub enum Speculation {
    /// A draft model and how many tokens it drafts.
    Draft {
        /// The loaded draft model.
        loaded: Box<Loaded>,
        /// Tokens drafted per round.
        num_draft_tokens: i32,
    },
    /// Prompt lookup.
    Lookup {
        /// The lookup settings.
        lookup: PromptLookup,
        /// Tokens drafted per round.
        num_draft_tokens: i32,
    },
}

impl SpeculativeArgs {
    /// Whether any speculation was asked for.
    pub fn enabled(&self) -> bool {
        self.draft_model.is_some()
            || self.prompt_lookup_ngram.is_some()
            || self.prompt_lookup_tokens.is_some()
    }

    /// Checks the flags and loads the draft model (its tokenizer must have the
    /// target's vocabulary size, as mlx-lm checks); `None` when nothing was asked.
    pub fn load(&self, cpu_weights: CpuWeights, target: &Tokenizer) -> Result<Option<Speculation>> {
        let lookup = self.prompt_lookup_ngram.is_some() || self.prompt_lookup_tokens.is_some();
        self.min_acceptance()?;
        if let Some(path) = &self.draft_model {
            if lookup {
                bail!("--draft-model and --prompt-lookup-ngram/--prompt-lookup-tokens cannot be combined: choose one source of drafts");
            }
            let num_draft_tokens = check_num_draft_tokens(self.num_draft_tokens)
                .map_err(|e| anyhow::anyhow!("--num-draft-tokens: {e}"))?;
            let loaded = load(&LoadArgs {
                model: Some(path),
                cpu_weights,
                adapter_path: None,
            })
            .map_err(|e| anyhow::anyhow!("loading the draft model {path}: {e:#}"))?;
            check_vocab(&loaded.tokenizer, target)?;
            return Ok(Some(Speculation::Draft {
                loaded: Box::new(loaded),
                num_draft_tokens,
            }));
        }
        if !lookup {
            return Ok(None);
        }
        let ngram = self.prompt_lookup_ngram.unwrap_or(DEFAULT_LOOKUP_NGRAM);
        if ngram < 1 {
            bail!("--prompt-lookup-ngram must be at least 1, got {ngram}");
        }
        let k = self
            .prompt_lookup_tokens
            .unwrap_or(DEFAULT_LOOKUP_TOKENS as i64);
        let num_draft_tokens = check_num_draft_tokens(k)
            .map_err(|e| anyhow::anyhow!("--prompt-lookup-tokens: {e}"))?;
        Ok(Some(Speculation::Lookup {
            lookup: PromptLookup::new(ngram),
            num_draft_tokens,
        }))
    }
}

impl Speculation {
    /// Where drafts come from, and how many a round.
    pub fn source(&self) -> (DraftSource<'_>, i32) {
        match self {
            Speculation::Draft {
                loaded,
                num_draft_tokens,
            } => (DraftSource::Model(loaded.model.as_ref()), *num_draft_tokens),
            Speculation::Lookup {
                lookup,
                num_draft_tokens,
            } => (DraftSource::Lookup(lookup.clone()), *num_draft_tokens),
        }
    }

    /// The draft model, if drafts come from one.
    pub fn draft_model(&self) -> Option<&dyn mlx_models::LanguageModel> {
        match self {
            Speculation::Draft { loaded, .. } => Some(loaded.model.as_ref()),
            Speculation::Lookup { .. } => None,
        }
    }
}

impl SpeculativeArgs {
    /// `--draft-min-acceptance`, checked (0 to 1); `None` when not given (the
    /// generator's default, [`mlx_engine::speculative::GREEDY_MIN_ACCEPTANCE`]).
    pub fn min_acceptance(&self) -> Result<Option<f64>> {
        self.draft_min_acceptance
            .map(check_min_acceptance)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--draft-min-acceptance: {e}"))
    }
}

/// mlx-lm's check that a draft model shares the target's tokenizer, naming both sizes.
pub fn check_vocab(draft: &Tokenizer, target: &Tokenizer) -> Result<()> {
    let (d, t) = (draft.vocab_size(), target.vocab_size());
    if d != t {
        bail!(
            "the draft model's tokenizer has {d} tokens but the model's has {t}: a draft model must use the model's tokenizer"
        );
    }
    Ok(())
}

/// The verbose lines (ours) about a speculative generation.
pub fn report(stats: &SpeculativeStats) -> Vec<String> {
    let rate = if stats.drafted > 0 {
        100.0 * stats.accepted as f64 / stats.drafted as f64
    } else {
        0.0
    };
    let mut lines = vec![format!(
        "Speculative: {} of {} drafted tokens accepted ({rate:.1}%) in {} rounds",
        stats.accepted, stats.drafted, stats.rounds
    )];
    if stats.pipelined > 0 {
        lines.push(format!(
            "Speculative: {} rounds drafted behind the verification before them",
            stats.pipelined
        ));
    }
    if let Some(why) = &stats.fallback {
        lines.push(format!("Speculative: {why}"));
    }
    lines
}
