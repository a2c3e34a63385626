//! `mlx-chat`: mlx-lm's `mlx_lm.chat` terminal REPL. History lives in the prompt cache:
//! each turn sends only the new message, like mlx-lm. Ours: the speculative-decoding
//! flags of `mlx-generate` (a draft model, whose caches follow the model's across turns,
//! or prompt lookup over the whole conversation).
use anyhow::Result;
use clap::Parser;
use mlx_bins::load::{load, LoadArgs};
use mlx_bins::speculative::Speculation;
use mlx_bins::{out, outln};
use mlx_engine::{
    stream_generate, stream_generate_with, GenerateOptions, PromptInput, SpeculativeGenerator,
};
use mlx_nn::cache::KvCache;
use mlx_tokenizer::ChatOptions;
use serde_json::json;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

/// Chat with an LLM
#[derive(Parser, Debug)]
#[command(
    name = "mlx-chat",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// The path to the local model directory or Hugging Face repo (default: the embedded
    /// SmolLM2-135M-Instruct).
    #[arg(long)]
    model: Option<String>,
    /// Enable trusting remote code for tokenizer (accepted; no remote code ever runs here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Optional path for the trained adapter weights and config.
    #[arg(long)]
    adapter_path: Option<String>,
    /// Sampling temperature
    #[arg(long, default_value_t = 0.0)]
    temp: f64,
    /// Sampling top-p
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Probability of XTC sampling to happen each next token
    #[arg(long, default_value_t = 0.0)]
    xtc_probability: f64,
    /// Thresold the probs of each next token candidate to be sampled by XTC
    #[arg(long, default_value_t = 0.1)]
    xtc_threshold: f64,
    /// PRNG seed
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Set the maximum key-value cache size
    #[arg(long)]
    max_kv_size: Option<i32>,
    /// Number of prompt tokens to process at a time.
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
    /// Maximum number of tokens to generate
    #[arg(
        long,
        short = 'm',
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    max_tokens: i64,
    /// System prompt to be used for the chat template
    #[arg(long)]
    system_prompt: Option<String>,
    /// Use pipelining instead of tensor parallelism
    #[arg(long)]
    pipeline: bool,
    #[command(flatten)]
    cpu_weights: mlx_bins::load::CpuWeights,
    #[command(flatten)]
    constraint: mlx_bins::constrain::ConstraintArgs,
    #[command(flatten)]
    spec: mlx_bins::speculative::SpeculativeArgs,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse();
    mlx_bins::run(|| chat(args))
}

fn chat(args: Args) -> Result<()> {
    mlx_bins::unsupported("--pipeline (distributed inference)", args.pipeline)?;
    if args.max_tokens == 0 || args.max_tokens < -1 {
        anyhow::bail!(
            "--max-tokens must be positive or -1 (no limit), got {}",
            args.max_tokens
        );
    }
    mlx_array::random::seed(args.seed)?;
    let loaded = load(&LoadArgs {
        model: args.model.as_deref(),
        cpu_weights: args.cpu_weights,
        adapter_path: args.adapter_path.as_deref(),
    })?;
    let tok = &loaded.tokenizer;
    let model = loaded.model.as_ref();
    let tty = std::io::stdin().is_terminal();

    outln!("mlx-chat  model {}", loaded.path.display())?;
    outln!("          max tokens {}", args.max_tokens)?;
    if let Some(sp) = &args.system_prompt {
        let short: String = if sp.chars().count() > 60 {
            sp.chars().take(57).collect::<String>() + "..."
        } else {
            sp.clone()
        };
        outln!("          system {short}")?;
    }
    print_help()?;

    let spec = args.spec.load(args.cpu_weights, tok)?;
    let draft = spec.as_ref().and_then(Speculation::draft_model);
    let window = match draft {
        Some(_) => {
            // As mlx-generate (and mlx-lm's generate): no window with a draft model.
            if let Some(m) = args.max_kv_size {
                tracing::warn!("--max-kv-size {m} is ignored with --draft-model (as in mlx-lm)");
            }
            None
        }
        None => mlx_bins::load::rotating_window(model, args.max_kv_size),
    };
    let new_caches = || -> Result<Vec<Box<dyn KvCache>>> {
        let mut c = mlx_cache::make_prompt_cache(&model.cache_specs(), window)?;
        if let Some(d) = draft {
            c.extend(mlx_cache::make_prompt_cache(&d.cache_specs(), None)?);
        }
        Ok(c)
    };
    let mut caches = new_caches()?;
    // With speculation: every token a plain chat would have fed the caches so far (each
    // turn's prompt and answer), and those of them the caches do not hold yet (a
    // speculative round ends with its last tokens unfed, or with drafts past the end of
    // the answer, which are trimmed): they go ahead of the next turn's prompt.
    let mut conversation: Vec<u32> = Vec::new();
    let mut unfed: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if tty {
            out!("› ")?;
            std::io::stdout().flush()?;
        }
        let Some(line) = lines.next() else { break };
        let query = line?;
        match query.as_str() {
            "q" => {
                outln!("bye")?;
                break;
            }
            "r" => {
                caches = new_caches()?;
                conversation.clear();
                unfed.clear();
                outln!("  reset context cleared")?;
                continue;
            }
            "h" => {
                print_help()?;
                continue;
            }
            _ => {}
        }
        let mut messages = Vec::new();
        if let Some(sp) = &args.system_prompt {
            messages.push(json!({"role": "system", "content": sp}));
        }
        messages.push(json!({"role": "user", "content": query}));
        let opts = ChatOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        let ids = tok.apply_chat_template_ids(&messages, &opts)?;
        if let Some(max) = window {
            // The conversation so far plus this turn's prompt.
            let context =
                caches.first().map_or(0, |c| c.offset()) as usize + unfed.len() + ids.len();
            mlx_bins::load::check_prompt_fits(context, max)?;
        }

        let mut xtc_special = tok.encode("\n", false)?;
        xtc_special.extend(tok.eos_token_ids().iter().copied());
        let sampler = mlx_sample::make_sampler(&mlx_sample::SamplerParams {
            temp: args.temp,
            top_p: args.top_p,
            xtc_probability: args.xtc_probability,
            xtc_threshold: args.xtc_threshold,
            xtc_special_tokens: xtc_special.iter().map(|&t| t as i32).collect(),
            ..Default::default()
        })?;
        let gen_opts = GenerateOptions {
            max_tokens: args.max_tokens,
            prefill_step_size: args.prefill_step_size,
            sampler: Some(sampler),
            logits_processors: args.constraint.processor(tok, &ids)?.into_iter().collect(),
            ..Default::default()
        };
        let mut write_error = None;
        let mut answer = Vec::new();
        let on_response = |r: &mlx_engine::GenerationResponse| {
            answer.push(r.token);
            let mut out = std::io::stdout().lock();
            match write!(out, "{}", r.text).and_then(|()| out.flush()) {
                Ok(()) => true,
                Err(e) => {
                    write_error = Some(e);
                    false
                }
            }
        };
        let mut spec_stats = None;
        let last = match &spec {
            None => stream_generate(
                model,
                tok,
                PromptInput::Tokens(&ids),
                &mut caches,
                gen_opts,
                on_response,
            )?,
            Some(s) => {
                let (source, k) = s.source();
                let mut prompt = std::mem::take(&mut unfed);
                prompt.extend_from_slice(&ids);
                let earlier = conversation.len() - (prompt.len() - ids.len());
                let mut gen =
                    SpeculativeGenerator::new(model, source, &prompt, &mut caches, k, gen_opts)?
                        .with_min_acceptance_if(args.spec.min_acceptance()?)?
                        .with_lookup_context(&conversation[..earlier]);
                let last = stream_generate_with(&mut gen, tok, args.max_tokens, on_response)?;
                spec_stats = Some(gen.stats().clone());
                last
            }
        };
        if spec.is_some() {
            conversation.extend_from_slice(&ids);
            conversation.extend_from_slice(&answer);
            let synced = sync_to_conversation(
                &mut caches,
                model.cache_specs().len(),
                draft,
                &conversation,
                args.prefill_step_size,
            )?;
            match synced {
                Some(rest) => unfed = rest,
                None => {
                    caches = new_caches()?;
                    conversation.clear();
                    unfed.clear();
                    outln!()?;
                    outln!("  reset a cache could not be rewound to the end of the answer: context cleared")?;
                }
            }
        }
        if let Some(e) = write_error {
            return Err(e.into());
        }
        outln!()?;
        if let Some(r) = last {
            outln!(
                "  {} tokens · {:.1} tok/s · prompt {:.1} tok/s · peak {:.2} GB",
                r.generation_tokens,
                r.generation_tps,
                r.prompt_tps,
                r.peak_memory
            )?;
        }
        if let Some(stats) = &spec_stats {
            for line in mlx_bins::speculative::report(stats) {
                outln!("  {line}")?;
            }
        }
    }
    Ok(())
}

/// After a speculative turn: rewinds the model's caches (the first `n_target`) to the
/// longest start of `conversation` they all hold (drafts fed past the answer's end go)
/// and brings the draft model's caches to the same point (rewound, or fed the tokens
/// they missed after speculation fell back to plain decoding); returns the tokens after
/// that point, which the next turn feeds ahead of its prompt. `None` where a cache
/// cannot be rewound that far (a sliding-window cache that has wrapped).
fn sync_to_conversation(
    caches: &mut [Box<dyn KvCache>],
    n_target: usize,
    draft: Option<&dyn mlx_models::LanguageModel>,
    conversation: &[u32],
    step: usize,
) -> Result<Option<Vec<u32>>> {
    let held = |cs: &[Box<dyn KvCache>], cap: usize| {
        cs.iter()
            .map(|c| c.offset().max(0) as usize)
            .min()
            .unwrap_or(cap)
            .min(cap)
    };
    let rewind = |cs: &mut [Box<dyn KvCache>], to: usize| {
        cs.iter_mut().all(|c| {
            let extra = c.offset() - to as i32;
            extra <= 0 || (c.is_trimmable() && c.trim(extra) == extra)
        })
    };
    let (target, draft_caches) = caches.split_at_mut(n_target.min(caches.len()));
    let t = held(target, conversation.len());
    if !rewind(target, t) {
        return Ok(None);
    }
    if let Some(d) = draft {
        let at = held(draft_caches, t);
        if !rewind(draft_caches, at) {
            return Ok(None);
        }
        for chunk in conversation[at..t].chunks(step.max(1)) {
            let tokens = mlx_array::Array::from_slice(chunk, &[1, chunk.len() as i32])?;
            mlx_engine::step::prefill(d, &tokens, draft_caches, None)?;
        }
    }
    Ok(Some(conversation[t..].to_vec()))
}

fn print_help() -> std::io::Result<()> {
    outln!("  commands    q exit   r reset   h help")
}
