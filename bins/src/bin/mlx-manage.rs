//! `mlx-manage`: mlx-lm's `mlx_lm.manage`: `--scan` lists the Hugging Face cache's repos
//! whose id contains `--pattern` (default `mlx`), `--delete` lists them and, once
//! confirmed on standard input, deletes them. Same flags and output.
use anyhow::Result;
use clap::Parser;
use mlx_bins::{out, outln};
use mlx_hub::cache_scan::{self, format_size, format_timesince, tabulate, CachedRepo, Cell};
use std::io::BufRead;
use std::process::ExitCode;

/// MLX Model Cache.
#[derive(Parser, Debug)]
#[command(
    name = "mlx-manage",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// Scan Hugging Face cache for mlx models.
    #[arg(long)]
    scan: bool,
    /// Delete models matching the given pattern.
    #[arg(long)]
    delete: bool,
    /// Model repos contain the pattern.
    #[arg(long, default_value = "mlx")]
    pattern: String,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse_from(mlx_bins::normalized_args(&[]));
    mlx_bins::run(|| manage(args))
}

fn matching(pattern: &str) -> Result<Vec<CachedRepo>> {
    let dir = mlx_hub::Locations::from_env()?.hf_hub_cache;
    let scan = cache_scan::scan_cache_dir(&dir)?;
    for w in &scan.warnings {
        tracing::warn!("skipped: {w}");
    }
    Ok(scan
        .repos
        .into_iter()
        .filter(|r| r.repo_id.contains(pattern))
        .collect())
}

fn manage(args: Args) -> Result<()> {
    if args.scan {
        outln!(
            "Scanning Hugging Face cache for models with pattern \"{}\".",
            args.pattern
        )?;
        let now = cache_scan::now();
        let rows: Vec<Vec<Cell>> = matching(&args.pattern)?
            .iter()
            .map(|r| {
                vec![
                    Cell::Text(r.repo_id.clone()),
                    Cell::Text(r.repo_type.to_string()),
                    Cell::Text(format!("{:>12}", format_size(r.size_on_disk))),
                    Cell::Int(r.nb_files as u64),
                    Cell::Text(format_timesince(r.last_accessed, now)),
                    Cell::Text(format_timesince(r.last_modified, now)),
                    Cell::Text(r.repo_path.display().to_string()),
                ]
            })
            .collect();
        let headers = [
            "REPO ID",
            "REPO TYPE",
            "SIZE ON DISK",
            "NB FILES",
            "LAST_ACCESSED",
            "LAST_MODIFIED",
            "LOCAL PATH",
        ];
        outln!("{}", tabulate(&rows, &headers))?;
    }
    if args.delete {
        outln!("Deleting models matching pattern \"{}\"", args.pattern)?;
        let repos = matching(&args.pattern)?;
        if repos.is_empty() {
            outln!("No models found matching pattern \"{}\"", args.pattern)?;
            return Ok(());
        }
        outln!("\nFound the following models:")?;
        let rows: Vec<Vec<Cell>> = repos
            .iter()
            .map(|r| {
                vec![
                    Cell::Text(r.repo_id.clone()),
                    Cell::Text(format_size(r.size_on_disk)),
                    Cell::Text(r.repo_path.display().to_string()),
                ]
            })
            .collect();
        outln!("{}", tabulate(&rows, &["REPO ID", "SIZE", "LOCAL PATH"]))?;
        if confirm("\nAre you sure you want to delete these models?")? {
            for r in &repos {
                outln!("\nDeleting {}...", r.repo_id)?;
                cache_scan::delete_repo(r)?;
            }
            outln!("\nModel(s) deleted successfully.")?;
        } else {
            outln!("\nDeletion cancelled - no changes made.")?;
        }
    }
    Ok(())
}

/// mlx-lm's `ask_for_confirmation`: y/yes/1 or n/no/0/empty, asked again otherwise. The
/// end of standard input counts as no.
fn confirm(message: &str) -> Result<bool> {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        out!("{message} (y/n) ")?;
        std::io::Write::flush(&mut std::io::stdout())?;
        let Some(line) = lines.next().transpose()? else {
            outln!()?;
            return Ok(false);
        };
        match line.trim_end_matches('\r').to_lowercase().as_str() {
            "y" | "yes" | "1" => return Ok(true),
            "n" | "no" | "0" | "" => return Ok(false),
            _ => outln!("Invalid input. Must be one of: yes/no/y/n or empty for no")?,
        }
    }
}
