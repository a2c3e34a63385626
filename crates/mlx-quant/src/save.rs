//! Writing a model directory the way mlx-lm's `save` does: weights in safetensors shards of
//! at most ~5 GB (`model.safetensors`, or `model-0000i-of-0000n.safetensors`) with
//! `{"format": "mlx"}` metadata and `model.safetensors.index.json`, `config.json` (keys
//! sorted, `quantization_config` mirroring `quantization`), the tokenizer and generation
//! files, and a model card.
//!
//! Shards are written one at a time, each tensor evaluated on its own (with a progress bar),
//! so at most one shard of converted weights is in memory besides what its inputs need.
use crate::error::{io_err, QuantError, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mlx_array::Array;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// mlx-lm's `MAX_FILE_SIZE_GB` (5) in bytes.
pub const MAX_SHARD_BYTES: u64 = 5 << 30;

/// Files copied from the source besides the weights: the tokenizer files mlx-lm's
/// `tokenizer.save_pretrained` writes (we copy the originals), `generation_config.json`
/// and `*.py`.
const COPIED: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "tiktoken.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
];

/// mlx-lm's `make_shards`: consecutive tensors while they fit in `max_bytes` (a tensor
/// larger than that gets a shard of its own).
pub fn make_shards(weights: Vec<(String, Array)>, max_bytes: u64) -> Vec<Vec<(String, Array)>> {
    let mut shards: Vec<Vec<(String, Array)>> = Vec::new();
    let mut size = 0u64;
    for (k, v) in weights {
        let n = v.nbytes() as u64;
        if shards.is_empty() || size + n > max_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        if let Some(last) = shards.last_mut() {
            last.push((k, v));
        }
        size += n;
    }
    shards
}

/// What [`save_weights`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedWeights {
    /// Shard file names, in order.
    pub shards: Vec<String>,
    /// Number of tensors.
    pub tensors: usize,
    /// Sum of the tensors' sizes in bytes (`metadata.total_size` of the index).
    pub total_size: u64,
}

fn progress_bar(total: usize, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total as u64);
    if let Ok(style) =
        ProgressStyle::with_template("[{elapsed_precise}] {bar:40} {pos}/{len} tensors {msg}")
    {
        pb.set_style(style);
    }
    pb
}

/// mlx-lm's `save_model`: writes `weights` (consumed, so each shard's arrays are freed once
/// written) into `dir` and the index. `total_parameters` goes into the index metadata.
pub fn save_weights(
    dir: &Path,
    weights: Vec<(String, Array)>,
    total_parameters: u64,
    max_shard_bytes: u64,
    progress: bool,
) -> Result<SavedWeights> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let total_size: u64 = weights.iter().map(|(_, v)| v.nbytes() as u64).sum();
    let tensors = weights.len();
    let mut shards = make_shards(weights, max_shard_bytes);
    let count = shards.len();
    let pb = progress_bar(tensors, progress);
    let mut names = Vec::new();
    let mut weight_map = std::collections::BTreeMap::new();
    for (i, shard) in shards.drain(..).enumerate() {
        let name = if count > 1 {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, count)
        } else {
            "model.safetensors".to_string()
        };
        pb.set_message(name.clone());
        for (k, v) in &shard {
            v.eval().map_err(|e| match e {
                mlx_array::Error::Mlx { message, .. } => {
                    QuantError::Unsupported(format!("computing `{k}`: {message}"))
                }
                other => other.into(),
            })?;
            pb.inc(1);
        }
        let path = dir.join(&name);
        mlx_array::io::save_safetensors(
            &path,
            shard.iter().map(|(k, v)| (k.as_str(), v)),
            [("format", "mlx")],
        )?;
        for (k, _) in &shard {
            weight_map.insert(k.clone(), Value::String(name.clone()));
        }
        names.push(name);
        drop(shard);
    }
    pb.finish_and_clear();
    let mut metadata = Map::new();
    metadata.insert("total_size".into(), total_size.into());
    metadata.insert("total_parameters".into(), total_parameters.into());
    let mut index = Map::new();
    index.insert("metadata".into(), Value::Object(metadata));
    index.insert(
        "weight_map".into(),
        Value::Object(weight_map.into_iter().collect()),
    );
    write_json(
        &dir.join("model.safetensors.index.json"),
        &Value::Object(index),
    )?;
    Ok(SavedWeights {
        shards: names,
        tensors,
        total_size,
    })
}

/// A float as Python's `repr` writes it (`1e-05`, `10000.0`, `1e+16`), so configs read
/// the same as mlx-lm's.
pub fn py_float(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() {
            "NaN".into()
        } else if v > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sign = if v < 0.0 { "-" } else { "" };
    let sci = format!("{:e}", v.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            let padded = format!("{digits:0<int_len$}");
            let (int, frac) = padded.split_at(int_len);
            format!("{int}.{}", if frac.is_empty() { "0" } else { frac })
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// serde_json's pretty printer (4-space indent) with Python's float spelling.
struct PyFormatter(serde_json::ser::PrettyFormatter<'static>);

impl serde_json::ser::Formatter for PyFormatter {
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: f64) -> std::io::Result<()> {
        // A config's `Infinity`, as read (mlx_models::config::JSON_INFINITY), is written
        // back as Python writes it.
        let v = if v.abs() == mlx_models::config::JSON_INFINITY {
            v.signum() * f64::INFINITY
        } else {
            v
        };
        w.write_all(py_float(v).as_bytes())
    }
    fn write_f32<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: f32) -> std::io::Result<()> {
        w.write_all(py_float(v as f64).as_bytes())
    }
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(w)
    }
}

/// Writes `value` as JSON indented by 4 spaces with Python's float spelling, like
/// Python's `json.dump(indent=4)`.
pub fn write_json(path: &Path, value: &Value) -> Result<()> {
    use serde::Serialize;
    let mut buf = Vec::new();
    let fmt = PyFormatter(serde_json::ser::PrettyFormatter::with_indent(b"    "));
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    value.serialize(&mut ser).map_err(|e| QuantError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    std::fs::write(path, buf).map_err(io_err(path))
}

/// mlx-lm's `save_config`: drops `_name_or_path` and `vision_config`, mirrors
/// `quantization` into `quantization_config`, sorts the top-level keys.
pub fn save_config(config: &Map<String, Value>, path: &Path) -> Result<()> {
    let mut config = config.clone();
    config.remove("_name_or_path");
    config.remove("vision_config");
    if let Some(q) = config.get("quantization").cloned() {
        config.insert("quantization_config".into(), q);
    }
    let mut entries: Vec<(String, Value)> = config.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    write_json(path, &Value::Object(entries.into_iter().collect()))
}

/// Copies the tokenizer files, `generation_config.json` and `*.py` of `src` into `dst`;
/// returns the names copied.
pub fn copy_side_files(src: &Path, dst: &Path) -> Result<Vec<String>> {
    let mut copied = Vec::new();
    let entries = std::fs::read_dir(src).map_err(io_err(src))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| COPIED.contains(&n.as_str()) || n.ends_with(".py") || n.ends_with(".tiktoken"))
        .collect();
    names.sort();
    for name in names {
        let from = src.join(&name);
        std::fs::copy(&from, dst.join(&name)).map_err(io_err(&from))?;
        copied.push(name);
    }
    Ok(copied)
}

/// One top-level entry of a YAML front matter: its key and its lines.
type Block = (String, Vec<String>);

fn front_matter(readme: &str) -> Option<Vec<Block>> {
    let rest = readme.strip_prefix("---\n")?;
    let end = rest.find("\n---")?;
    let mut blocks: Vec<Block> = Vec::new();
    for line in rest[..end].lines() {
        let top = !line.starts_with([' ', '-', '#']) && line.contains(':');
        match (top, blocks.last_mut()) {
            (true, _) => {
                let key = line
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                blocks.push((key, vec![line.to_string()]));
            }
            (false, Some(b)) => b.1.push(line.to_string()),
            (false, None) => {}
        }
    }
    Some(blocks)
}

/// mlx-lm's `create_model_card`: a card with `library_name: mlx`, `pipeline_tag:
/// text-generation` and the `mlx` tag. For a Hugging Face repo id (`hf_repo`) the source's
/// own card (`src/README.md`, when present) is kept and `base_model` names the repo; for a
/// local directory the card is the blank template (`language: en`).
pub fn model_card(src: &Path, hf_repo: Option<&str>) -> String {
    let original = hf_repo
        .and_then(|_| std::fs::read_to_string(src.join("README.md")).ok())
        .and_then(|t| front_matter(&t));
    let mut blocks =
        original.unwrap_or_else(|| vec![("language".into(), vec!["language: en".into()])]);
    let mut set = |key: &str, lines: Vec<String>| match blocks.iter_mut().find(|b| b.0 == key) {
        Some(b) => b.1 = lines,
        None => blocks.push((key.to_string(), lines)),
    };
    if let Some(repo) = hf_repo {
        set("base_model", vec![format!("base_model: {repo}")]);
    }
    set("library_name", vec!["library_name: mlx".into()]);
    set("pipeline_tag", vec!["pipeline_tag: text-generation".into()]);
    let tags = blocks.iter().find(|b| b.0 == "tags").map(|b| b.1.clone());
    let tags = match tags {
        Some(mut lines) if lines.len() > 1 => {
            if !lines.iter().skip(1).any(|l| l.trim() == "- mlx") {
                lines.push("- mlx".into());
            }
            lines
        }
        Some(lines) => {
            // `tags: x` on one line: turn it into a list.
            let inline = lines
                .first()
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default();
            let mut out = vec!["tags:".to_string()];
            if !inline.is_empty() && inline != "[]" && inline != "mlx" {
                out.push(format!("- {inline}"));
            }
            out.push("- mlx".into());
            out
        }
        None => vec!["tags:".into(), "- mlx".into()],
    };
    let mut set = |key: &str, lines: Vec<String>| match blocks.iter_mut().find(|b| b.0 == key) {
        Some(b) => b.1 = lines,
        None => blocks.push((key.to_string(), lines)),
    };
    set("tags", tags);
    let body: Vec<String> = blocks.into_iter().flat_map(|b| b.1).collect();
    format!("---\n{}\n---\n", body.join("\n"))
}

/// Writes the model card into `dst/README.md`.
pub fn write_model_card(dst: &Path, src: &Path, hf_repo: Option<&str>) -> Result<PathBuf> {
    let path = dst.join("README.md");
    std::fs::write(&path, model_card(src, hf_repo)).map_err(io_err(&path))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_card_is_the_blank_template_with_mlx_fields() {
        let card = model_card(Path::new("/nonexistent"), None);
        assert_eq!(
            card,
            "---\nlanguage: en\nlibrary_name: mlx\npipeline_tag: text-generation\ntags:\n- mlx\n---\n"
        );
    }

    #[test]
    fn repo_card_keeps_the_source_fields_and_adds_base_model() {
        let dir = std::env::temp_dir().join(format!("mlxq-card-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("README.md"),
            "---\nlicense: apache-2.0\nlanguage:\n- en\ntags:\n- foo\nzeta: 1\n---\n# hi\n",
        )
        .unwrap();
        let card = model_card(&dir, Some("org/x"));
        std::fs::remove_dir_all(&dir).unwrap();
        // What huggingface_hub's ModelCard writes for the same edits (checked by hand).
        assert_eq!(
            card,
            "---\nlicense: apache-2.0\nlanguage:\n- en\ntags:\n- foo\n- mlx\nzeta: 1\n\
             base_model: org/x\nlibrary_name: mlx\npipeline_tag: text-generation\n---\n"
        );
    }

    #[test]
    fn floats_are_spelled_like_python_repr() {
        let cases = [
            (1e-5, "1e-05"),
            (1e-6, "1e-06"),
            (10000.0, "10000.0"),
            (1000000.0, "1000000.0"),
            (0.5, "0.5"),
            (0.0001, "0.0001"),
            (0.02, "0.02"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123.456, "123.456"),
            (-2.0, "-2.0"),
            (0.0, "0.0"),
            (50.0, "50.0"),
            (1e22, "1e+22"),
            (3.0517578125e-05, "3.0517578125e-05"),
        ];
        for (v, want) in cases {
            assert_eq!(py_float(v), want, "{v}");
        }
    }

    #[test]
    fn shards_split_when_the_next_tensor_does_not_fit() {
        let a = |n: i32| Array::from_slice(&vec![0f32; n as usize], &[n]).unwrap();
        // 40, 40, 80, 8 bytes with a 100-byte limit: [40, 40], [80], [8]... 80 + 8 fits.
        let w = vec![
            ("a".to_string(), a(10)),
            ("b".to_string(), a(10)),
            ("c".to_string(), a(20)),
            ("d".to_string(), a(2)),
        ];
        let shards = make_shards(w, 100);
        let names: Vec<Vec<&str>> = shards
            .iter()
            .map(|s| s.iter().map(|(k, _)| k.as_str()).collect())
            .collect();
        assert_eq!(names, vec![vec!["a", "b"], vec!["c", "d"]]);
    }

    #[test]
    fn a_config_infinity_is_written_back_as_python_writes_it() {
        let dir = std::env::temp_dir().join(format!("mlx-quant-inf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        let read = mlx_models::config::parse_python_json(
            r#"{"time_step_limit": [0.0, Infinity], "lo": -Infinity, "x": 0.5}"#,
        )
        .unwrap();
        write_json(&path, &read).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert!(text.contains("        0.0,\n        Infinity\n"), "{text}");
        assert!(text.contains("\"lo\": -Infinity,"), "{text}");
        assert!(text.contains("\"x\": 0.5"), "{text}");
    }
}
