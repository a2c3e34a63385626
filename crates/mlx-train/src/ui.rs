//! The printed report of `mlx_lm.lora` (its `cli_ui`: the run header panel, the
//! training table, validation and save lines, the final progress bar), with the same
//! numbers and formats, as plain text (mlx-lm colours it with rich), and the JSON Lines
//! metrics file written in place of wandb / swanlab reports.
use crate::pyval::{py_exp, py_fixed, py_thousands};
use crate::trainer::{TrainCallback, TrainReport};
use std::io::Write;
use std::path::Path;

/// The terminal width rich uses: `$COLUMNS`, else 120.
fn width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|&w: &usize| w > 20)
        .unwrap_or(120)
}

/// mlx-lm's `print_lora_run_header` panel.
pub fn header(rows: &[(&str, String)]) -> String {
    let w = width();
    let label_w = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let title = " mlx_lm.lora ";
    let mut out = format!(
        "╭─{title}{}╮\n",
        "─".repeat(w.saturating_sub(3 + title.chars().count()))
    );
    for (k, v) in rows {
        let body = format!("  {k:<label_w$}   {v}");
        let inner = w.saturating_sub(2);
        let text = format!("  {body}");
        let pad = inner.saturating_sub(text.chars().count());
        out.push_str(&format!("│{text}{}│\n", " ".repeat(pad)));
    }
    out.push_str(&format!("╰{}╯\n", "─".repeat(w.saturating_sub(2))));
    out
}

/// The header's optimizer row value: `adam · lr 1.0e-05`, or `schedule`.
pub fn lr_label(lr: Option<f64>) -> String {
    lr.map_or_else(|| "schedule".to_string(), |v| py_exp(v, 1))
}

/// Python's `f"{x:>w,.0f}"`.
fn thousands_f(x: f64) -> String {
    py_thousands(x.round_ties_even() as i64)
}

/// Prints the training table as mlx-lm's `TrainUI` does; optionally appends every
/// report to a JSON Lines file.
pub struct TextUi<W: Write> {
    out: W,
    prev_train_loss: Option<f64>,
    total: usize,
    done: usize,
    metrics: Option<std::fs::File>,
}

impl<W: Write> TextUi<W> {
    /// A table for `total` iterations written to `out` (the column header is printed
    /// now), with reports appended to `metrics` when given.
    pub fn new(mut out: W, total: usize, metrics: Option<&Path>) -> std::io::Result<TextUi<W>> {
        writeln!(out, "  iter   train_loss     tok/s     tokens")?;
        let metrics = match metrics {
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(p)?,
            ),
            None => None,
        };
        Ok(TextUi {
            out,
            prev_train_loss: None,
            total,
            done: 0,
            metrics,
        })
    }

    fn line(&mut self, s: &str) {
        let _ = writeln!(self.out, "{s}");
        let _ = self.out.flush();
    }

    fn metric(&mut self, v: serde_json::Value) {
        if let Some(f) = &mut self.metrics {
            let _ = writeln!(f, "{v}");
        }
    }

    /// The progress bar's final line (`train ███… 100% ·     6/6`).
    pub fn finish(&mut self) {
        let bar_width = 30;
        let pct = if self.total == 0 {
            0.0
        } else {
            (self.done as f64 / self.total as f64).clamp(0.0, 1.0)
        };
        let eighths = (pct * bar_width as f64 * 8.0) as usize;
        let (full, rem) = (eighths / 8, eighths % 8);
        let mut bar = "█".repeat(full);
        let mut used = full;
        if rem > 0 && full < bar_width {
            bar.push(['▏', '▎', '▍', '▌', '▋', '▊', '▉'][rem - 1]);
            used += 1;
        }
        bar.push_str(&"░".repeat(bar_width - used));
        let line = format!(
            "train {bar} {:>3.0}% · {:>5}/{}",
            pct * 100.0,
            py_thousands(self.done as i64),
            py_thousands(self.total as i64)
        );
        self.line(&line);
    }
}

impl<W: Write> TrainCallback for TextUi<W> {
    fn val_loss(&mut self, it: usize, val_loss: f64, val_time: f64) {
        self.line(&format!(
            "  {it:>4}    val {:>5}    {val_time:.2}s",
            py_fixed(val_loss, 3)
        ));
        self.metric(serde_json::json!({
            "iteration": it - 1, "val_loss": val_loss, "val_time": val_time,
        }));
    }

    fn train_report(&mut self, r: &TrainReport) {
        let arrow = match self.prev_train_loss {
            Some(p) if r.train_loss > p => "▲",
            _ => "▼",
        };
        self.prev_train_loss = Some(r.train_loss);
        self.line(&format!(
            "  {:>4}    {:>5} {arrow}    {:>5}    {:>5.1}k",
            r.iteration,
            py_fixed(r.train_loss, 3),
            thousands_f(r.tokens_per_second),
            r.trained_tokens as f64 / 1000.0
        ));
        self.metric(serde_json::json!({
            "iteration": r.iteration,
            "train_loss": r.train_loss,
            "learning_rate": r.learning_rate,
            "iterations_per_second": r.iterations_per_second,
            "tokens_per_second": r.tokens_per_second,
            "trained_tokens": r.trained_tokens,
            "peak_memory": r.peak_memory,
        }));
    }

    fn saved(&mut self, checkpoint: &Path) {
        let name = checkpoint
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.line(&format!("  save  {name}"));
    }

    fn advance(&mut self) {
        self.done += 1;
    }

    fn warning(&mut self, message: &str) {
        self.line(message);
    }
}
