//! Writing the model directory under a temporary name, then renaming it into place.
use crate::error::{io_err, mlx_err, GgufError, Result};
use crate::tokenizer::TokenizerFiles;
use crate::ImportOptions;
use mlx_array::Array;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A sibling path of `dir` that no other process uses (`.name.tag-pid-nanos`).
pub(crate) fn sibling_temp(dir: &Path, tag: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    dir.with_file_name(format!(".{name}.{tag}-{}-{nanos}", std::process::id()))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(v).map_err(|e| GgufError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    text.push('\n');
    std::fs::write(path, text).map_err(io_err(path))
}

/// Groups tensor names into shards of at most `max_bytes` (a tensor larger than that gets
/// a shard of its own).
fn shards(arrays: &BTreeMap<String, Array>, max_bytes: u64) -> Vec<Vec<&str>> {
    let mut out: Vec<Vec<&str>> = vec![Vec::new()];
    let mut size = 0u64;
    for (name, a) in arrays {
        let n = a.nbytes() as u64;
        if size + n > max_bytes && out.last().is_some_and(|s| !s.is_empty()) {
            out.push(Vec::new());
            size = 0;
        }
        size += n;
        if let Some(s) = out.last_mut() {
            s.push(name);
        }
    }
    out
}

fn write_contents(
    dir: &Path,
    arrays: &BTreeMap<String, Array>,
    config: &Value,
    tok: &TokenizerFiles,
    opts: &ImportOptions,
) -> Result<Vec<String>> {
    let mut files = Vec::new();
    let groups = shards(arrays, opts.max_shard_bytes.max(1));
    let count = groups.len();
    let mut weight_map = Map::new();
    let mut total_size = 0u64;
    for (i, names) in groups.iter().enumerate() {
        let file = if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, count)
        };
        let items: Vec<(&str, &Array)> = names
            .iter()
            .filter_map(|n| arrays.get(*n).map(|a| (*n, a)))
            .collect();
        for (n, a) in &items {
            total_size += a.nbytes() as u64;
            weight_map.insert((*n).to_string(), json!(file));
        }
        let path = dir.join(&file);
        mlx_array::io::save_safetensors(&path, items, [("format", "mlx")])
            .map_err(mlx_err(format!("writing {}", path.display())))?;
        files.push(file);
    }
    let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
    write_json(&dir.join("model.safetensors.index.json"), &index)?;
    files.push("model.safetensors.index.json".into());

    write_json(&dir.join("config.json"), config)?;
    write_json(&dir.join("tokenizer.json"), &tok.tokenizer_json)?;
    write_json(&dir.join("tokenizer_config.json"), &tok.tokenizer_config)?;
    let mut special = Map::new();
    for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
        if let Some(v) = tok.tokenizer_config.get(key) {
            special.insert(key.into(), v.clone());
        }
    }
    write_json(
        &dir.join("special_tokens_map.json"),
        &Value::Object(special),
    )?;
    let mut gen = Map::new();
    for (key, id) in [
        ("bos_token_id", tok.bos_token_id),
        ("eos_token_id", tok.eos_token_id),
        ("pad_token_id", tok.pad_token_id),
    ] {
        if let Some(i) = id {
            gen.insert(key.into(), json!(i));
        }
    }
    write_json(&dir.join("generation_config.json"), &Value::Object(gen))?;
    files.extend(
        [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "generation_config.json",
        ]
        .map(String::from),
    );
    Ok(files)
}

/// Writes the whole directory into a temporary sibling and renames it to `out_dir`
/// (replacing an existing one only when `opts.overwrite`).
pub(crate) fn write_model_dir(
    out_dir: &Path,
    arrays: &BTreeMap<String, Array>,
    config: &Value,
    tok: &TokenizerFiles,
    opts: &ImportOptions,
) -> Result<Vec<String>> {
    if let Some(parent) = out_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let tmp = sibling_temp(out_dir, "partial");
    std::fs::create_dir(&tmp).map_err(io_err(&tmp))?;
    let files = match write_contents(&tmp, arrays, config, tok, opts) {
        Ok(f) => f,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    if out_dir.exists() {
        if !opts.overwrite {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(GgufError::OutputExists {
                path: out_dir.to_path_buf(),
            });
        }
        let old = sibling_temp(out_dir, "old");
        std::fs::rename(out_dir, &old).map_err(io_err(out_dir))?;
        std::fs::rename(&tmp, out_dir).map_err(io_err(out_dir))?;
        let _ = std::fs::remove_dir_all(&old);
    } else {
        std::fs::rename(&tmp, out_dir).map_err(io_err(out_dir))?;
    }
    Ok(files)
}
