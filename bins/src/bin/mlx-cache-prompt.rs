//! `mlx-cache-prompt`: mlx-lm's `mlx_lm.cache_prompt`. Processes a prompt once and saves
//! the KV cache in mlx-lm's file format; `mlx-generate --prompt-cache-file` continues it.
use anyhow::{Context, Result};
use clap::Parser;
use mlx_bins::load::{load, LoadArgs};
use mlx_bins::{out, outln};
use mlx_engine::{GenerateOptions, TokenGenerator, TokenIterator};
use mlx_tokenizer::ChatOptions;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

/// Cache the state of a prompt to be reused with mlx_lm.generate
#[derive(Parser, Debug)]
#[command(
    name = "mlx-cache-prompt",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// The path to the local model directory or Hugging Face repo.
    #[arg(long, default_value = "mlx_model")]
    model: String,
    /// Optional path for the trained adapter weights and config.
    #[arg(long)]
    adapter_path: Option<String>,
    /// Enable trusting remote code for tokenizer (accepted; no remote code ever runs here).
    #[arg(long)]
    trust_remote_code: bool,
    /// End of sequence token for tokenizer
    #[arg(long)]
    eos_token: Option<String>,
    /// Set the maximum key-value cache size
    #[arg(long)]
    max_kv_size: Option<i32>,
    /// The file to save the prompt cache in
    #[arg(long, required = true)]
    prompt_cache_file: String,
    /// Message to be processed by the model ('-' reads from stdin)
    #[arg(long, required = true, allow_hyphen_values = true)]
    prompt: String,
    /// Number of bits for KV cache quantization. Defaults to no quantization.
    #[arg(long)]
    kv_bits: Option<i32>,
    /// Group size for KV cache quantization.
    #[arg(long, default_value_t = 64)]
    kv_group_size: i32,
    /// When --kv-bits is set, start quantizing the KV cache from this step onwards.
    #[arg(long, default_value_t = 5000)]
    quantized_kv_start: i32,
    /// Also record the prompt's token ids in the file's metadata (`tokens`), so that
    /// `mlx-server --prompt-cache-file` can serve it. Ours: without it the file is
    /// byte-for-byte mlx_lm.cache_prompt's.
    #[arg(long)]
    record_tokens: bool,
    #[command(flatten)]
    cpu_weights: mlx_bins::load::CpuWeights,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse();
    mlx_bins::run(|| cache_prompt(args))
}

fn cache_prompt(args: Args) -> Result<()> {
    // `mlx_model` (mlx-lm's default) only means something if it exists; "default"
    // resolves to our embedded model.
    let spec = (args.model != "default").then_some(args.model.as_str());
    let mut loaded = load(&LoadArgs {
        model: spec,
        cpu_weights: args.cpu_weights,
        adapter_path: args.adapter_path.as_deref(),
    })?;
    let mut tokenizer_config = serde_json::Map::new();
    tokenizer_config.insert("trust_remote_code".into(), json!(args.trust_remote_code));
    if let Some(eos) = &args.eos_token {
        loaded.tokenizer.add_eos_token(eos)?;
        tokenizer_config.insert("eos_token".into(), json!(eos));
    }
    let tok = &loaded.tokenizer;
    let text = mlx_bins::read_prompt(&args.prompt, false)?;
    let ids = if tok.has_chat_template() {
        let messages = vec![json!({"role": "user", "content": text})];
        let opts = ChatOptions {
            add_generation_prompt: false,
            continue_final_message: true,
            ..Default::default()
        };
        tok.apply_chat_template_ids(&messages, &opts)?
    } else {
        tok.encode(&text, true)?
    };
    let model = loaded.model.as_ref();
    let window = mlx_bins::load::rotating_window(model, args.max_kv_size);
    if let Some(max) = window {
        mlx_bins::load::check_prompt_fits(ids.len(), max)?;
    }
    let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), window)?;
    let start = Instant::now();
    let mut max_len = 0usize;
    let progress = move |processed: usize, _total: usize| {
        let speed = processed as f64 / start.elapsed().as_secs_f64().max(1e-9);
        let msg = format!("\rProcessed {processed:6} tokens ({speed:6.2} tok/s)");
        max_len = max_len.max(msg.len());
        // Progress only: a closed pipe shows up at the next line written.
        let _ = out!("{msg}{}", " ".repeat(max_len - msg.len()));
        let _ = std::io::stdout().flush();
    };
    let opts = GenerateOptions {
        max_tokens: 0,
        kv_quantization: mlx_bins::load::kv_quantization(
            args.kv_bits,
            args.kv_group_size,
            args.quantized_kv_start,
        ),
        prompt_progress: Some(Box::new(progress)),
        ..Default::default()
    };
    {
        let mut gen = TokenGenerator::new(model, &ids, &mut caches, opts)?;
        while gen.next_token()?.is_some() {}
    }
    outln!()?;
    outln!(
        "Peak memory: {:.3} GB",
        mlx_array::memory::peak_memory() as f64 / 1e9
    )?;
    outln!("Saving...")?;
    let mut metadata = BTreeMap::new();
    metadata.insert("model".to_string(), args.model.clone());
    if args.record_tokens {
        // mlx-lm's loader ignores the extra key; mlx-server's --prompt-cache-file needs it
        // to know which prompts the cache serves.
        metadata.insert(
            mlx_cache::TOKENS_KEY.to_string(),
            mlx_cache::encode_tokens(&ids),
        );
    }
    metadata.insert(
        "tokenizer_config".to_string(),
        mlx_tokenizer::py_json_dumps(&serde_json::Value::Object(tokenizer_config), true),
    );
    mlx_cache::save_prompt_cache(&args.prompt_cache_file, &caches, &metadata)
        .with_context(|| format!("saving {}", args.prompt_cache_file))?;
    Ok(())
}
