//! Flags of ours for structured output (`mlx-generate`, `mlx-chat`): mlx-lm has no
//! constrained decoding, so these names are new and collide with none of its flags.
use anyhow::{bail, Context, Result};
use mlx_engine::Constraint;
use std::path::PathBuf;

/// The answer must match a JSON schema, a grammar or a regex (at most one).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConstraintArgs {
    /// Constrain the answer to JSON valid against the JSON schema in this file.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the answer to the grammar in this file: llguidance's Lark dialect
    /// (`start: ...`), or llama.cpp's GBNF (`root ::= ...`, recognized by `::=`).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// Constrain the answer to match this regular expression (Rust regex syntax).
    #[arg(long, value_name = "REGEX", allow_hyphen_values = true)]
    pub regex: Option<String>,
}

impl ConstraintArgs {
    /// The constraint asked for, read from its file.
    pub fn constraint(&self) -> Result<Option<Constraint>> {
        let given = [
            self.json_schema.is_some(),
            self.grammar.is_some(),
            self.regex.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            bail!("give at most one of --json-schema, --grammar and --regex");
        }
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        if let Some(p) = &self.json_schema {
            let text = read(p)?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", p.display()))?;
            return Ok(Some(Constraint::JsonSchema(schema)));
        }
        if let Some(p) = &self.grammar {
            let text = read(p)?;
            return Ok(Some(if text.contains("::=") {
                Constraint::Gbnf(text)
            } else {
                Constraint::Lark(text)
            }));
        }
        Ok(self.regex.clone().map(Constraint::Regex))
    }

    /// The logits processor for a generation after `prompt`, when a constraint is asked.
    pub fn processor(
        &self,
        tokenizer: &mlx_tokenizer::Tokenizer,
        prompt: &[u32],
    ) -> Result<Option<Box<dyn mlx_engine::LogitsProcessor>>> {
        let Some(c) = self.constraint()? else {
            return Ok(None);
        };
        let p = mlx_engine::constrain::processor_for_prompt(tokenizer, &c, prompt)?;
        Ok(Some(Box::new(p)))
    }
}
