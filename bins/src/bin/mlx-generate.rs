//! `mlx-generate`: mlx-lm's `mlx_lm.generate`, with its flags and defaults.
use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_bins::load::{load, LoadArgs};
use mlx_bins::outln;
use mlx_bins::speculative::Speculation;
use mlx_engine::{
    stream_generate, stream_generate_with, GenerateOptions, PromptInput, SpeculativeGenerator,
};
use mlx_tokenizer::ChatOptions;
use serde_json::json;
use std::io::Write;
use std::process::ExitCode;

/// LLM inference script
#[derive(Parser, Debug)]
#[command(
    name = "mlx-generate",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// The path to a local model directory, a Hugging Face repo in the local HF cache, or
    /// a .gguf file. Default: the embedded SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<String>,
    /// Enable trusting remote code for tokenizer (accepted; no remote code ever runs here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Optional path for the trained adapter weights and config.
    #[arg(long)]
    adapter_path: Option<String>,
    /// Add tokens in the list of eos tokens that stop generation.
    #[arg(long, num_args = 1..)]
    extra_eos_token: Vec<String>,
    /// System prompt to be used for the chat template
    #[arg(long)]
    system_prompt: Option<String>,
    /// Message to be processed by the model ('-' reads from stdin)
    #[arg(long, short = 'p', default_value = "hello", allow_hyphen_values = true)]
    prompt: String,
    /// Image files for the image placeholders of the prompt, in order.
    #[arg(long, num_args = 1..)]
    image: Vec<String>,
    /// Prefill response to be used for the chat template
    #[arg(long, allow_hyphen_values = true)]
    prefill_response: Option<String>,
    /// Maximum number of tokens to generate
    #[arg(
        long,
        short = 'm',
        default_value_t = 100,
        allow_negative_numbers = true
    )]
    max_tokens: i64,
    /// Sampling temperature
    #[arg(long, default_value_t = 0.0)]
    temp: f64,
    /// Sampling top-p
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Sampling min-p
    #[arg(long, default_value_t = 0.0)]
    min_p: f64,
    /// Sampling top-k
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    /// Probability of XTC sampling to happen each next token
    #[arg(long, default_value_t = 0.0)]
    xtc_probability: f64,
    /// Threshold the probs of each next token candidate to be sampled by XTC
    #[arg(long, default_value_t = 0.1)]
    xtc_threshold: f64,
    /// Minimum tokens to keep for min-p sampling.
    #[arg(long, default_value_t = 1)]
    min_tokens_to_keep: i32,
    /// PRNG seed
    #[arg(long)]
    seed: Option<u64>,
    /// Use the raw prompt without the tokenizer's chat template.
    #[arg(long)]
    ignore_chat_template: bool,
    /// Use the default chat template
    #[arg(long)]
    use_default_chat_template: bool,
    /// Additional config for `apply_chat_template` (a JSON object).
    #[arg(long)]
    chat_template_config: Option<String>,
    /// Log verbose output when 'True' or 'T' or only print the response when 'False' or 'F'
    #[arg(long, default_value = "True", value_parser = mlx_bins::str2bool, action = clap::ArgAction::Set)]
    verbose: bool,
    /// Set the maximum key-value cache size
    #[arg(long)]
    max_kv_size: Option<i32>,
    /// Number of prompt tokens to process at a time.
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
    /// A file containing saved KV caches to avoid recomputing them
    #[arg(long)]
    prompt_cache_file: Option<String>,
    /// Quantize activations using the same quantization config as the corresponding layer (also -qa).
    #[arg(long)]
    quantize_activations: bool,
    /// Number of bits for KV cache quantization. Defaults to no quantization.
    #[arg(long)]
    kv_bits: Option<i32>,
    /// Group size for KV cache quantization.
    #[arg(long, default_value_t = 64)]
    kv_group_size: i32,
    /// When --kv-bits is set, start quantizing the KV cache from this step onwards.
    #[arg(long, default_value_t = 5000)]
    quantized_kv_start: i32,
    #[command(flatten)]
    spec: mlx_bins::speculative::SpeculativeArgs,
    #[command(flatten)]
    cpu_weights: mlx_bins::load::CpuWeights,
    #[command(flatten)]
    constraint: mlx_bins::constrain::ConstraintArgs,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse_from(mlx_bins::normalized_args(&[(
        "-qa",
        "--quantize-activations",
    )]));
    mlx_bins::run(|| generate(args))
}

fn generate(args: Args) -> Result<()> {
    mlx_bins::unsupported("--quantize-activations (-qa)", args.quantize_activations)?;
    mlx_bins::unsupported("--image", !args.image.is_empty())?;
    if args.max_tokens == 0 {
        bail!("--max-tokens must be non-zero (use -1 for no limit)");
    }
    if args.max_tokens < -1 {
        bail!(
            "--max-tokens must be positive or -1 (no limit), got {}",
            args.max_tokens
        );
    }
    if let Some(s) = args.seed {
        mlx_array::random::seed(s)?;
    }

    let mut caches_from_file = None;
    let mut model_spec = args.model.clone();
    if let Some(path) = &args.prompt_cache_file {
        let (caches, meta) = mlx_cache::load_prompt_cache(path)
            .with_context(|| format!("loading the prompt cache {path}"))?;
        mlx_bins::load::check_cache_kv_bits(&caches, args.kv_bits, args.kv_group_size)?;
        if let Some(m) = meta.get("model") {
            match &model_spec {
                None => model_spec = Some(m.clone()),
                Some(given) if given != m => bail!(
                    "providing a different model ({given}) than that used to create the prompt cache ({m}) is an error"
                ),
                _ => {}
            }
        }
        caches_from_file = Some(caches);
    }

    let mut loaded = load(&LoadArgs {
        model: model_spec.as_deref(),
        cpu_weights: args.cpu_weights,
        adapter_path: args.adapter_path.as_deref(),
    })?;
    for t in &args.extra_eos_token {
        loaded.tokenizer.add_eos_token(t)?;
    }
    if args.use_default_chat_template {
        mlx_bins::load::use_default_chat_template(&mut loaded.tokenizer)?;
    }
    let template_kwargs = match &args.chat_template_config {
        Some(s) => serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(s)
            .context("--chat-template-config must be a JSON object")?,
        None => Default::default(),
    };
    let tok = &loaded.tokenizer;
    let raw = mlx_bins::read_prompt(&args.prompt, true)?;
    let use_chat = !args.ignore_chat_template && tok.has_chat_template();
    let prompt_text = if use_chat {
        let mut messages = Vec::new();
        if let Some(sys) = &args.system_prompt {
            messages.push(json!({"role": "system", "content": sys}));
        }
        messages.push(json!({"role": "user", "content": raw}));
        let has_prefill = args.prefill_response.is_some();
        if let Some(p) = &args.prefill_response {
            messages.push(json!({"role": "assistant", "content": p}));
        }
        let opts = ChatOptions {
            add_generation_prompt: !has_prefill,
            continue_final_message: has_prefill,
            kwargs: template_kwargs.clone(),
            ..Default::default()
        };
        let mut text = tok.apply_chat_template(&messages, &opts)?;
        if caches_from_file.is_some() {
            // The cached prefix holds the template's head: keep only the suffix.
            if let Some(last) = messages.last_mut() {
                last["content"] = json!("<query>");
            }
            let probe_opts = ChatOptions {
                kwargs: Default::default(),
                ..opts
            };
            let probe = tok.apply_chat_template(&messages, &probe_opts)?;
            if let Some(i) = probe.find("<query>") {
                text = text.get(i..).unwrap_or_default().to_string();
            }
        }
        text
    } else {
        raw
    };
    let ids = tok.encode(&prompt_text, !use_chat)?;

    let mut xtc_special = tok.encode("\n", false)?;
    xtc_special.extend(tok.eos_token_ids().iter().copied());
    let sampler = mlx_sample::make_sampler(&mlx_sample::SamplerParams {
        temp: args.temp,
        top_p: args.top_p,
        min_p: args.min_p,
        min_tokens_to_keep: args.min_tokens_to_keep,
        top_k: args.top_k,
        xtc_probability: args.xtc_probability,
        xtc_threshold: args.xtc_threshold,
        xtc_special_tokens: xtc_special.iter().map(|&t| t as i32).collect(),
    })?;

    let spec = args.spec.load(args.cpu_weights, tok)?;
    let model = loaded.model.as_ref();
    let draft = spec.as_ref().and_then(Speculation::draft_model);
    let mut caches = match caches_from_file {
        Some(c) => c,
        None => match draft {
            Some(d) => {
                // mlx-lm drops max_kv_size with a draft model: both get their own caches.
                if let Some(m) = args.max_kv_size {
                    tracing::warn!(
                        "--max-kv-size {m} is ignored with --draft-model (as in mlx-lm)"
                    );
                }
                let mut c = mlx_cache::make_prompt_cache(&model.cache_specs(), None)?;
                c.extend(mlx_cache::make_prompt_cache(&d.cache_specs(), None)?);
                c
            }
            None => {
                let window = mlx_bins::load::rotating_window(model, args.max_kv_size);
                if let Some(max) = window {
                    mlx_bins::load::check_prompt_fits(ids.len(), max)?;
                }
                mlx_cache::make_prompt_cache(&model.cache_specs(), window)?
            }
        },
    };
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        prefill_step_size: args.prefill_step_size,
        sampler: Some(sampler),
        logits_processors: args.constraint.processor(tok, &ids)?.into_iter().collect(),
        kv_quantization: mlx_bins::load::kv_quantization(
            args.kv_bits,
            args.kv_group_size,
            args.quantized_kv_start,
        ),
        prompt_progress: None,
    };

    let verbose = args.verbose;
    let mut text = String::new();
    if verbose {
        outln!("==========")?;
    }
    // A failed write (a closed pipe) stops generation and is returned below.
    let mut write_error = None;
    let on_response = |r: &mlx_engine::GenerationResponse| {
        if verbose {
            let mut out = std::io::stdout().lock();
            if let Err(e) = write!(out, "{}", r.text).and_then(|()| out.flush()) {
                write_error = Some(e);
                return false;
            }
        }
        text.push_str(&r.text);
        true
    };
    let mut spec_stats = None;
    let last = match spec {
        None => stream_generate(
            model,
            tok,
            PromptInput::Tokens(&ids),
            &mut caches,
            opts,
            on_response,
        )?,
        Some(s) => {
            let (source, k) = s.source();
            let mut gen = SpeculativeGenerator::new(model, source, &ids, &mut caches, k, opts)?
                .with_min_acceptance_if(args.spec.min_acceptance()?)?;
            let last = stream_generate_with(&mut gen, tok, args.max_tokens, on_response)?;
            spec_stats = Some(gen.stats().clone());
            last
        }
    };
    if let Some(e) = write_error {
        return Err(e).context("writing the generated text");
    }
    if last.as_ref().and_then(|r| r.finish_reason) == Some(mlx_engine::FinishReason::Constraint) {
        // Ours, on stderr: the text is incomplete, not an answer that matches.
        eprintln!(
            "warning: the output constraint reached a dead end (no token could continue it \
             validly): the output is incomplete (finish reason `error`)"
        );
    }
    if verbose {
        outln!()?;
        outln!("==========")?;
        match last {
            Some(r) if !text.is_empty() => {
                outln!(
                    "Prompt: {} tokens, {:.3} tokens-per-sec",
                    r.prompt_tokens,
                    r.prompt_tps
                )?;
                outln!(
                    "Generation: {} tokens, {:.3} tokens-per-sec",
                    r.generation_tokens,
                    r.generation_tps
                )?;
                outln!("Peak memory: {:.3} GB", r.peak_memory)?;
                // Ours, on stderr: standard output stays mlx-lm's.
                if let Some(stats) = &spec_stats {
                    for line in mlx_bins::speculative::report(stats) {
                        eprintln!("{line}");
                    }
                }
            }
            _ => outln!("No text generated for this prompt")?,
        }
    } else {
        outln!("{text}")?;
    }
    std::io::stdout().flush()?;
    Ok(())
}
