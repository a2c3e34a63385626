//! `mlx_lm.evaluate`'s bridge: Python's lm-evaluation-harness (the user's installed
//! `lm_eval`) runs the tasks, with a small adapter model class
//! (`lm_eval_adapter.py`, embedded here) whose requests this process answers over a
//! JSON-lines pipe with [`crate::scoring`] and mlx-engine's generation.
use crate::scoring::{loglikelihood, loglikelihood_rolling, DEFAULT_MAX_TOKENS, STEP_SIZE};
use crate::{EvalError, Result};
use mlx_engine::batch::{BatchGenerator, BatchOptions};
use mlx_engine::Sampling;
use mlx_models::LanguageModel;
use mlx_tokenizer::{ChatOptions, Tokenizer};
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// The adapter module the harness runs.
pub const ADAPTER: &str = include_str!("lm_eval_adapter.py");

/// What `mlx_lm.evaluate` passes to `lm_eval.simple_evaluate`, and how requests are
/// answered.
#[derive(Debug, Clone)]
pub struct HarnessOptions {
    /// The Python interpreter that has `lm_eval`.
    pub python: String,
    /// Task names.
    pub tasks: Vec<String>,
    /// Few-shot examples (`None`: each task's default).
    pub num_shots: Option<i64>,
    /// Examples per task.
    pub limit: Option<i64>,
    /// The seed of every random source of the harness.
    pub seed: u64,
    /// Few-shot examples as a multi-turn conversation.
    pub fewshot_as_multiturn: bool,
    /// Render prompts with the chat template (and tokenize without special tokens).
    pub use_chat_template: bool,
    /// Extra chat-template variables (`--chat-template-args`).
    pub chat_template_args: Map<String, Value>,
    /// Run tasks that execute untrusted code.
    pub confirm_run_unsafe_code: bool,
    /// The context budget of scoring and the generation cap (`--max-tokens`).
    pub max_tokens: Option<usize>,
    /// Sequences scored at once by `loglikelihood_rolling`.
    pub batch_size: usize,
    /// Sampling for `generate_until`: temperature, top-p, top-k.
    pub temp: f64,
    /// Top-p.
    pub top_p: f64,
    /// Top-k.
    pub top_k: i32,
    /// Directories of local task definitions (lm_eval's `include_path`).
    pub include_path: Option<String>,
    /// The name the harness caches under (mlx-lm: the tokenizer's path, `/` as `__`).
    pub tokenizer_name: String,
}

/// What the harness reported.
#[derive(Debug, Clone)]
pub struct HarnessResults {
    /// `json.dumps(results["results"], indent=4)`: the file mlx-lm writes.
    pub text: String,
    /// Each task's results as mlx-lm prints them.
    pub each: Vec<String>,
    /// The lm_eval version (part of mlx-lm's file name).
    pub lm_eval_version: String,
}

fn bridge_err(msg: impl std::fmt::Display) -> EvalError {
    EvalError::Harness(msg.to_string())
}

/// Runs the harness with `model` answering its requests (scoring on this thread,
/// generation on mlx-engine's batch thread, the model handed back and forth).
pub fn run_harness(
    model: Box<dyn LanguageModel>,
    tok: &Tokenizer,
    opts: &HarnessOptions,
) -> Result<HarnessResults> {
    let mut slot = Some(model);
    if opts.batch_size == 0 {
        return Err(EvalError::Invalid("--batch-size must be at least 1".into()));
    }
    let args = json!({
        "tasks": opts.tasks,
        "num_shots": opts.num_shots,
        "limit": opts.limit,
        "seed": opts.seed,
        "fewshot_as_multiturn": opts.fewshot_as_multiturn,
        "confirm_run_unsafe_code": opts.confirm_run_unsafe_code,
        "include_path": opts.include_path,
    });
    let mut child = Command::new(&opts.python)
        .arg("-c")
        .arg(ADAPTER)
        .arg(args.to_string())
        .env("TOKENIZERS_PARALLELISM", "false")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| bridge_err(format!("cannot run {}: {e}", opts.python)))?;
    let mut to_py = child
        .stdin
        .take()
        .ok_or_else(|| bridge_err("no stdin pipe"))?;
    let from_py = BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| bridge_err("no stdout pipe"))?,
    );
    let mut results = None;
    for line in from_py.lines() {
        let line = line.map_err(|e| bridge_err(format!("reading from lm_eval: {e}")))?;
        let req: Value = serde_json::from_str(&line)
            .map_err(|e| bridge_err(format!("a malformed request from the adapter: {e}")))?;
        let reply = match answer(&mut slot, tok, opts, &req) {
            Ok(Answer::Result(v)) => json!({ "result": v }),
            Ok(Answer::Done(r)) => {
                results = Some(r);
                json!({ "result": null })
            }
            Err(e) => json!({ "error": e.to_string() }),
        };
        let mut text = reply.to_string();
        text.push('\n');
        if to_py
            .write_all(text.as_bytes())
            .and_then(|_| to_py.flush())
            .is_err()
        {
            break;
        }
    }
    drop(to_py);
    let status = child
        .wait()
        .map_err(|e| bridge_err(format!("waiting for lm_eval: {e}")))?;
    match (status.success(), results) {
        (true, Some(r)) => Ok(r),
        (_, _) if status.code() == Some(3) => Err(bridge_err(format!(
            "the Python package lm_eval (lm-evaluation-harness) is not installed for {} \
             (`pip install lm-eval`, or set --python / MLX_EVAL_PYTHON)",
            opts.python
        ))),
        (_, _) => Err(bridge_err(format!(
            "lm_eval failed ({status}); see its output above"
        ))),
    }
}

enum Answer {
    Result(Value),
    Done(HarnessResults),
}

fn str_field<'a>(v: &'a Value, what: &str) -> Result<&'a str> {
    v.as_str()
        .ok_or_else(|| bridge_err(format!("{what}: expected a string, got {v}")))
}

fn answer(
    slot: &mut ModelSlot,
    tok: &Tokenizer,
    opts: &HarnessOptions,
    req: &Value,
) -> Result<Answer> {
    let model = || slot.as_deref().ok_or_else(lent_out);
    let add_special = !opts.use_chat_template;
    let list = |k: &str| -> Result<&Vec<Value>> {
        req[k]
            .as_array()
            .ok_or_else(|| bridge_err(format!("request without a `{k}` list")))
    };
    match req["method"].as_str().unwrap_or_default() {
        "hello" => Ok(Answer::Result(json!({
            "tokenizer_name": opts.tokenizer_name,
            "use_chat_template": opts.use_chat_template,
        }))),
        "apply_chat_template" => {
            let messages = list("messages")?;
            let gen = req["add_generation_prompt"].as_bool().unwrap_or(true);
            let text = tok
                .apply_chat_template(
                    messages,
                    &ChatOptions {
                        add_generation_prompt: gen,
                        continue_final_message: !gen,
                        kwargs: opts.chat_template_args.clone(),
                        ..Default::default()
                    },
                )
                .map_err(|source| EvalError::Tokenizer {
                    context: "applying the chat template".into(),
                    source,
                })?;
            Ok(Answer::Result(json!(text)))
        }
        "loglikelihood" => {
            let pairs = list("requests")?
                .iter()
                .map(|p| {
                    Ok((
                        str_field(&p[0], "context")?.to_string(),
                        str_field(&p[1], "continuation")?.to_string(),
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let out = loglikelihood(model()?, tok, &pairs, opts.max_tokens, add_special)?;
            // JSON has no -inf: the adapter turns the string back into a float.
            let v: Vec<Value> = out
                .iter()
                .map(|&(s, g)| {
                    if s.is_finite() {
                        json!([s, g])
                    } else {
                        json!([format!("{s}"), g])
                    }
                })
                .collect();
            Ok(Answer::Result(Value::Array(v)))
        }
        "loglikelihood_rolling" => {
            let texts = list("requests")?
                .iter()
                .map(|t| Ok(str_field(t, "text")?.to_string()))
                .collect::<Result<Vec<_>>>()?;
            let out = loglikelihood_rolling(model()?, tok, &texts, opts.batch_size, add_special)?;
            Ok(Answer::Result(json!(out)))
        }
        "generate_until" => {
            let reqs: Vec<(Value, Value)> = list("requests")?
                .iter()
                .map(|r| (r[0].clone(), r[1].clone()))
                .collect();
            Ok(Answer::Result(json!(generate_until(
                slot, tok, opts, &reqs
            )?)))
        }
        "results" => {
            let each = list("each")?
                .iter()
                .map(|t| Ok(str_field(t, "results")?.to_string()))
                .collect::<Result<Vec<_>>>()?;
            Ok(Answer::Done(HarnessResults {
                text: str_field(&req["text"], "results")?.to_string(),
                each,
                lm_eval_version: str_field(&req["lm_eval_version"], "version")?.to_string(),
            }))
        }
        other => Err(bridge_err(format!("unknown request {other:?}"))),
    }
}

/// mlx-lm's `_rstrip_until`: cut at the first occurrence of any stop string.
pub fn rstrip_until<'a>(s: &'a str, untils: &[String]) -> &'a str {
    // Python's str.find("") is 0: an empty stop string empties the text, here too.
    let cut = untils
        .iter()
        .filter_map(|u| s.find(u.as_str()))
        .min()
        .unwrap_or(s.len());
    &s[..cut]
}

/// The model, lent to the generation engine while `generate_until` runs.
pub type ModelSlot = Option<Box<dyn LanguageModel>>;

fn lent_out() -> EvalError {
    bridge_err("the model was not handed back after a failed generation")
}

/// One `generate_until` request read: prompt ids, token budget, stop strings.
fn read_request(
    tok: &Tokenizer,
    opts: &HarnessOptions,
    context: &Value,
    gen_kwargs: &Value,
) -> Result<(Vec<u32>, usize, Vec<String>)> {
    let context = str_field(context, "context")?;
    let until: Vec<String> = match &gen_kwargs["until"] {
        Value::Null => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|u| Ok(str_field(u, "until")?.to_string()))
            .collect::<Result<_>>()?,
        v => return Err(bridge_err(format!("until: expected strings, got {v}"))),
    };
    let max_tokens = opts
        .max_tokens
        .filter(|&m| m > 0)
        .or_else(|| gen_kwargs["max_gen_toks"].as_u64().map(|m| m as usize))
        .unwrap_or(DEFAULT_MAX_TOKENS);
    let ids = tok
        .encode(context, !opts.use_chat_template)
        .map_err(|source| EvalError::Tokenizer {
            context: "tokenizing a generation prompt".into(),
            source,
        })?;
    if ids.is_empty() {
        return Err(EvalError::Data(format!(
            "the generation context {context:?} has no tokens"
        )));
    }
    Ok((ids, max_tokens.max(1), until))
}

/// mlx-lm's `MLXLM.generate_until` for `(context, gen_kwargs)` requests: each context
/// tokenized (special tokens unless a chat template is in use), then all of them
/// generated at once as mlx-lm's `batch_generate` does (mlx-engine's `BatchGenerator`:
/// `--batch-size` prompts prefilled together and decoding together, the EOS tokens
/// ending a sequence, the `--temp/--top-p/--top-k` sampler), each up to `--max-tokens`,
/// else the request's `max_gen_toks`, else [`DEFAULT_MAX_TOKENS`]; each answer is the
/// decoded tokens (the EOS left out), cut at the first stop string (and after the
/// reasoning end marker where the vocabulary has one). The model in `slot` runs on the
/// engine's thread meanwhile and comes back to it.
pub fn generate_until(
    slot: &mut ModelSlot,
    tok: &Tokenizer,
    opts: &HarnessOptions,
    requests: &[(Value, Value)],
) -> Result<Vec<String>> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let read = requests
        .iter()
        .map(|(c, k)| read_request(tok, opts, c, k))
        .collect::<Result<Vec<_>>>()?;
    let model = slot.take().ok_or_else(lent_out)?;
    let mut eos: Vec<u32> = tok.eos_token_ids().iter().copied().collect();
    eos.sort_unstable();
    let batch = opts.batch_size.max(1);
    let gen = BatchGenerator::start(
        model,
        BatchOptions {
            completion_batch_size: batch,
            prefill_batch_size: batch,
            prefill_step_size: STEP_SIZE,
            sampling: Sampling {
                params: mlx_sample::SamplerParams {
                    temp: opts.temp,
                    top_p: opts.top_p,
                    top_k: opts.top_k,
                    ..Default::default()
                },
                seed: None,
            },
            stop_sequences: eos.iter().map(|&t| vec![t]).collect(),
        },
    )
    .map_err(|e| EvalError::Invalid(format!("cannot start generation: {e}")))?;
    let prompts: Vec<Vec<u32>> = read.iter().map(|r| r.0.clone()).collect();
    let budgets: Vec<usize> = read.iter().map(|r| r.1).collect();
    let out = gen.generate_each(&prompts, &budgets);
    *slot = gen.into_model();
    let out = out.map_err(|e| EvalError::Invalid(format!("generation failed: {e}")))?;
    if slot.is_none() {
        return Err(lent_out());
    }
    out.tokens
        .iter()
        .zip(&read)
        .map(|(tokens, (_, _, until))| {
            // mlx-lm keeps every token but the one that stopped the sequence.
            let kept = match tokens.split_last() {
                Some((last, rest)) if eos.binary_search(last).is_ok() => rest,
                _ => tokens.as_slice(),
            };
            let text = tok
                .decode(kept, false)
                .map_err(|source| EvalError::Tokenizer {
                    context: "decoding a generation".into(),
                    source,
                })?;
            let mut out = rstrip_until(&text, until).to_string();
            if let Some(m) = tok.think_markers() {
                if let Some(i) = out.find(m.end.as_str()) {
                    out = out[i + m.end.len()..].to_string();
                }
            }
            Ok(out)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::rstrip_until;

    #[test]
    fn rstrip_until_cuts_at_the_first_stop_like_mlx_lm() {
        let u = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(rstrip_until("a\n\nb\nc", &u(&["\n\n", "b"])), "a");
        assert_eq!(rstrip_until("xb\n\n", &u(&["\n\n", "b"])), "x");
        assert_eq!(rstrip_until("abc", &u(&["z"])), "abc");
        // Python's "abc".find("") is 0.
        assert_eq!(rstrip_until("abc", &u(&[""])), "");
    }
}
