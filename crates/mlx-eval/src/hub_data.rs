//! A Hugging Face dataset repo's splits as `datasets.load_dataset(repo, split=...)` finds
//! them, from a downloaded snapshot: the `configs` of the README's YAML block when it
//! declares data files (the config named by `load_dataset(repo, name)`, else the `default`
//! config, else the first), else the Hub's naming
//! conventions in `datasets`' order: sharded `data/{split}-NNNNN-of-NNNNN*.*` files, then
//! split keywords in directory names, then in file names, else every file is `train`.
//! Files are read in sorted path order and rows in file order, as `datasets` does; only
//! files of the most common format (JSON Lines / JSON, or Parquet) count. Parquet rows
//! are read with the `parquet` crate's record API (snappy or uncompressed pages), each
//! row as the JSON object `datasets` would hand mlx-lm (lists as arrays, structs as
//! objects).
use crate::{EvalError, Result};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// `datasets`' split keywords (`SPLIT_KEYWORDS`).
fn keywords(split: &str) -> Vec<&str> {
    match split {
        "train" => vec!["train", "training"],
        "validation" => vec!["validation", "valid", "dev", "val"],
        "test" => vec!["test", "testing", "eval", "evaluation"],
        other => vec![other],
    }
}

/// `NON_WORDS_CHARS` as a character class body.
const SEP: &str = "-._ 0-9";

/// fsspec-style glob: `**` crosses `/` (also matching no directory), `*` and `?` do not,
/// `[...]` classes (with ranges).
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = path.chars().collect();
    m(&p, &s)
}

fn m(p: &[char], s: &[char]) -> bool {
    if p.is_empty() {
        return s.is_empty();
    }
    if p.starts_with(&['*', '*']) {
        let rest = &p[2..];
        // `**/` may match zero directories.
        if rest.first() == Some(&'/') && m(&rest[1..], s) {
            return true;
        }
        return (0..=s.len()).any(|i| m(rest, &s[i..]));
    }
    match p[0] {
        '*' => (0..=s.len())
            .take_while(|&i| i == 0 || s[i - 1] != '/')
            .any(|i| m(&p[1..], &s[i..])),
        '?' => !s.is_empty() && s[0] != '/' && m(&p[1..], &s[1..]),
        '[' => {
            let Some(end) = p.iter().skip(2).position(|&c| c == ']').map(|i| i + 2) else {
                return s.first() == Some(&'[') && m(&p[1..], &s[1..]);
            };
            let Some(&c) = s.first() else { return false };
            let set = &p[1..end];
            let mut hit = false;
            let mut i = 0;
            while i < set.len() {
                if i + 2 < set.len() && set[i + 1] == '-' {
                    hit |= set[i] <= c && c <= set[i + 2];
                    i += 3;
                } else {
                    hit |= set[i] == c;
                    i += 1;
                }
            }
            hit && c != '/' && m(&p[end + 1..], &s[1..])
        }
        c => s.first() == Some(&c) && m(&p[1..], &s[1..]),
    }
}

fn files_under(root: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
        for e in std::fs::read_dir(d)? {
            let p = e?.path();
            let rel = p
                .strip_prefix(root)
                .unwrap_or(&p)
                .to_string_lossy()
                .replace('\\', "/");
            // Hidden and `__`-prefixed entries are never data files.
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with('.') || name.starts_with("__") {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out)?;
            } else {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, root, &mut out).map_err(|source| EvalError::Io {
        path: root.display().to_string(),
        source,
    })?;
    out.sort();
    Ok(out)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Json,
    Parquet,
}

fn kind(path: &str) -> Option<Kind> {
    let lower = path.to_ascii_lowercase();
    if lower.ends_with(".jsonl") || lower.ends_with(".json") {
        Some(Kind::Json)
    } else if lower.ends_with(".parquet") {
        Some(Kind::Parquet)
    } else {
        None
    }
}

/// A config's name and its `(split, path patterns)` entries.
type Config = (String, Vec<(String, Vec<String>)>);

/// The README's YAML `configs`: `- config_name: X` items, each with `data_files:` of
/// `- split: S` / `path: P` (a string or a `- item` list) entries. Empty: none declared.
fn readme_configs(root: &Path) -> Vec<Config> {
    let Ok(text) = std::fs::read_to_string(root.join("README.md")) else {
        return Vec::new();
    };
    let Some(yaml) = text.strip_prefix("---\n") else {
        return Vec::new();
    };
    let Some(end) = yaml.find("\n---") else {
        return Vec::new();
    };
    let yaml = &yaml[..end];
    let Some(start) = yaml.lines().position(|l| l.trim_end() == "configs:") else {
        return Vec::new();
    };
    let mut configs: Vec<Config> = Vec::new();
    let mut cur_split: Option<String> = None;
    let mut in_path_list = false;
    for line in yaml.lines().skip(start + 1) {
        if !line.starts_with(' ') && !line.starts_with('-') && !line.trim().is_empty() {
            break;
        }
        let t = line.trim();
        let unq = |v: &str| v.trim().trim_matches(['"', '\'']).to_string();
        if let Some(name) = t.strip_prefix("- config_name:") {
            configs.push((unq(name), Vec::new()));
            in_path_list = false;
        } else if let Some(s) = t.strip_prefix("- split:") {
            cur_split = Some(unq(s));
            in_path_list = false;
        } else if let Some(p) = t.strip_prefix("path:") {
            let Some((_, files)) = configs.last_mut() else {
                continue;
            };
            let s = cur_split.clone().unwrap_or_else(|| "train".into());
            if p.trim().is_empty() {
                files.push((s, Vec::new()));
                in_path_list = true;
            } else {
                files.push((s, vec![unq(p)]));
            }
        } else if let (true, Some(item)) = (in_path_list, t.strip_prefix("- ")) {
            if let Some((_, files)) = configs.last_mut() {
                if let Some(last) = files.last_mut() {
                    last.1.push(unq(item));
                }
            }
        }
    }
    configs
}

/// The data-file patterns the README's YAML `configs` give `split` (None: no configs):
/// of the config named `name` (`load_dataset(repo, name=...)`), else the `default`
/// config, else the first. A name the README does not declare is an error, as in
/// `datasets` (a repo without declared configs has only `default`).
fn readme_patterns(root: &Path, name: Option<&str>, split: &str) -> Result<Option<Vec<String>>> {
    let configs = readme_configs(root);
    let chosen = match name {
        Some(n) => match configs.iter().find(|c| c.0 == n) {
            Some(c) => Some(c),
            None if configs.is_empty() && n == "default" => None,
            None => {
                let mut available: Vec<&str> = configs.iter().map(|c| c.0.as_str()).collect();
                if available.is_empty() {
                    available.push("default");
                }
                return Err(EvalError::Data(format!(
                    "the dataset in {} has no config `{n}` (available: {})",
                    root.display(),
                    available.join(", ")
                )));
            }
        },
        None => configs
            .iter()
            .find(|c| c.0 == "default")
            .or_else(|| configs.first()),
    };
    let Some(chosen) = chosen.filter(|c| !c.1.is_empty()) else {
        return Ok(None);
    };
    Ok(Some(
        chosen
            .1
            .iter()
            .filter(|(s, _)| s == split)
            .flat_map(|(_, p)| p.clone())
            .collect(),
    ))
}

/// The files (relative to `root`, sorted) `datasets` reads for `split` of the repo.
pub fn split_files(root: &Path, split: &str) -> Result<Vec<PathBuf>> {
    split_files_of(root, None, split)
}

/// [`split_files`] of the config `name` (`load_dataset(repo, name=...)`; `None`: the
/// default one).
pub fn split_files_of(root: &Path, name: Option<&str>, split: &str) -> Result<Vec<PathBuf>> {
    let all = files_under(root)?;
    let pick = |patterns: &[String]| -> Vec<String> {
        all.iter()
            .filter(|f| patterns.iter().any(|p| glob_match(p, f)))
            .cloned()
            .collect()
    };
    let chosen: Vec<String> = if let Some(patterns) = readme_patterns(root, name, split)? {
        pick(&patterns)
    } else {
        let sharded =
            |s: &str| format!("data/{s}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*");
        let dir_pats = |s: &str| -> Vec<String> {
            keywords(s)
                .into_iter()
                .flat_map(|k| {
                    [
                        format!("**/{k}/**"),
                        format!("**/{k}[{SEP}]*/**"),
                        format!("**/*[{SEP}]{k}/**"),
                        format!("**/*[{SEP}]{k}[{SEP}]*/**"),
                    ]
                })
                .collect()
        };
        let file_pats = |s: &str| -> Vec<String> {
            keywords(s)
                .into_iter()
                .flat_map(|k| [format!("**/{k}[{SEP}]*"), format!("**/*[{SEP}]{k}[{SEP}]*")])
                .collect()
        };
        let any_split = |pats: &dyn Fn(&str) -> Vec<String>| {
            ["train", "validation", "test"]
                .iter()
                .any(|s| !pick(&pats(s)).is_empty())
        };
        if any_split(&|s| vec![sharded(s)]) || !pick(&[sharded("*")]).is_empty() {
            pick(&[sharded(split)])
        } else if any_split(&dir_pats) {
            pick(&dir_pats(split))
        } else if any_split(&file_pats) {
            pick(&file_pats(split))
        } else if split == "train" {
            all.clone()
        } else {
            Vec::new()
        }
    };
    // Only the most common data format's files count (`infer_module_for_data_files`).
    let mut counts = [(Kind::Json, 0usize), (Kind::Parquet, 0usize)];
    for f in &chosen {
        if let Some(k) = kind(f) {
            if let Some(c) = counts.iter_mut().find(|c| c.0 == k) {
                c.1 += 1;
            }
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    let top = counts[0];
    if top.1 == 0 {
        return Err(EvalError::Data(format!(
            "the dataset in {} has no JSON, JSON Lines or Parquet files for the `{split}` split",
            root.display()
        )));
    }
    Ok(chosen
        .into_iter()
        .filter(|f| kind(f) == Some(top.0))
        .map(|f| root.join(f))
        .collect())
}

/// The rows of one data file: JSON Lines, or a JSON file holding an array of objects
/// (or JSON Lines under a `.json` name, as `datasets`' json builder accepts).
pub fn read_rows(path: &Path) -> Result<Vec<Json>> {
    match kind(&path.to_string_lossy()) {
        Some(Kind::Parquet) => read_parquet(path),
        _ => {
            let text = std::fs::read_to_string(path).map_err(|source| EvalError::Io {
                path: path.display().to_string(),
                source,
            })?;
            if text.trim_start().starts_with('[') {
                let v: Json = serde_json::from_str(&text)
                    .map_err(|e| EvalError::Data(format!("{}: not JSON: {e}", path.display())))?;
                let rows = v.as_array().cloned().unwrap_or_default();
                if let Some(i) = rows.iter().position(|r| !r.is_object()) {
                    return Err(EvalError::Data(format!(
                        "{}: item {i} is not a JSON object",
                        path.display()
                    )));
                }
                return Ok(rows);
            }
            crate::datasets::read_jsonl(path)
        }
    }
}

/// The rows of a Parquet file, row groups in order.
pub fn read_parquet(path: &Path) -> Result<Vec<Json>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let bad =
        |e: parquet::errors::ParquetError| EvalError::Data(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|source| EvalError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let reader = SerializedFileReader::new(file).map_err(bad)?;
    let mut rows = Vec::new();
    for row in reader.get_row_iter(None).map_err(bad)? {
        rows.push(row.map_err(bad)?.to_json_value());
    }
    Ok(rows)
}

/// Every row of `split`, files in order.
pub fn read_split(root: &Path, split: &str) -> Result<(Vec<Json>, String)> {
    read_split_of(root, None, split)
}

/// [`read_split`] of the config `name` (`None`: the default one).
pub fn read_split_of(root: &Path, name: Option<&str>, split: &str) -> Result<(Vec<Json>, String)> {
    let files = split_files_of(root, name, split)?;
    if files.is_empty() {
        return Err(EvalError::Data(format!(
            "the dataset in {} has no `{split}` split",
            root.display()
        )));
    }
    let mut rows = Vec::new();
    for f in &files {
        rows.extend(read_rows(f)?);
    }
    let source = if files.len() == 1 {
        files[0].display().to_string()
    } else {
        format!("{} files of {}", files.len(), root.display())
    };
    Ok((rows, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_like_fsspec() {
        assert!(glob_match(
            "data/train-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*",
            "data/train-00000-of-00002.parquet"
        ));
        assert!(glob_match("**/train[-._ 0-9]*", "train.jsonl"));
        assert!(glob_match("**/train[-._ 0-9]*", "sub/train-1.jsonl"));
        assert!(!glob_match("**/train[-._ 0-9]*", "trainer.jsonl"));
        assert!(glob_match("**/*[-._ 0-9]train[-._ 0-9]*", "my_train.json"));
        assert!(glob_match("**/train/**", "train/a.jsonl"));
        assert!(glob_match("**/train/**", "x/train/y/a.jsonl"));
        assert!(!glob_match("*.jsonl", "a/b.jsonl"));
    }

    fn repo(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, text) in files {
            let f = d.path().join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, text).unwrap();
        }
        d
    }

    fn names(root: &Path, split: &str) -> Vec<String> {
        split_files(root, split)
            .unwrap()
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn splits_follow_the_hub_conventions() {
        let r = repo(&[
            ("data/train-00001-of-00002.jsonl", "{}"),
            ("data/train-00000-of-00002.jsonl", "{}"),
            ("data/test-00000-of-00001.jsonl", "{}"),
            ("README.md", "# no yaml"),
        ]);
        assert_eq!(
            names(r.path(), "train"),
            [
                "data/train-00000-of-00002.jsonl",
                "data/train-00001-of-00002.jsonl"
            ]
        );
        assert_eq!(names(r.path(), "test"), ["data/test-00000-of-00001.jsonl"]);
        let r = repo(&[
            ("train.jsonl", "{}"),
            ("valid.jsonl", "{}"),
            ("notes.txt", "x"),
        ]);
        assert_eq!(names(r.path(), "train"), ["train.jsonl"]);
        assert_eq!(names(r.path(), "validation"), ["valid.jsonl"]);
        let r = repo(&[("b.jsonl", "{}"), ("a.json", "[]"), (".hidden.jsonl", "{}")]);
        assert_eq!(names(r.path(), "train"), ["a.json", "b.jsonl"]);
        let r = repo(&[(
            "README.md",
            "---\nlicense: mit\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: stuff/*.jsonl\n  - split: test\n    path:\n    - t1.jsonl\n    - t2.jsonl\n---\n",
        ), ("stuff/x.jsonl", "{}"), ("train.jsonl", "{}"), ("t1.jsonl", "{}"), ("t2.jsonl", "{}")]);
        assert_eq!(names(r.path(), "train"), ["stuff/x.jsonl"]);
        assert_eq!(names(r.path(), "test"), ["t1.jsonl", "t2.jsonl"]);
    }

    fn texts(rows: &[Json]) -> Vec<&str> {
        rows.iter().map(|r| r["text"].as_str().unwrap()).collect()
    }

    #[test]
    fn json_arrays_and_lines_read_in_order() {
        let r = repo(&[
            ("a.json", "[{\"text\": \"1\"}, {\"text\": \"2\"}]"),
            ("b.jsonl", "{\"text\": \"3\"}\n"),
        ]);
        let (rows, _) = read_split(r.path(), "train").unwrap();
        assert_eq!(texts(&rows), ["1", "2", "3"]);
    }

    /// A snappy Parquet file of `text` rows, one row group per slice.
    fn write_parquet(path: &Path, groups: &[&[&str]]) {
        use parquet::basic::Compression;
        use parquet::data_type::{ByteArray, ByteArrayType};
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;
        let schema = std::sync::Arc::new(
            parquet::schema::parser::parse_message_type(
                "message schema { REQUIRED BYTE_ARRAY text (UTF8); }",
            )
            .unwrap(),
        );
        let props = std::sync::Arc::new(
            WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .build(),
        );
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut w =
            SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
        for g in groups {
            let mut rg = w.next_row_group().unwrap();
            let mut col = rg.next_column().unwrap().unwrap();
            let vals: Vec<ByteArray> = g.iter().map(|s| ByteArray::from(*s)).collect();
            col.typed::<ByteArrayType>()
                .write_batch(&vals, None, None)
                .unwrap();
            col.close().unwrap();
            rg.close().unwrap();
        }
        w.close().unwrap();
    }

    #[test]
    fn parquet_shards_read_in_order() {
        let r = repo(&[("README.md", "no yaml")]);
        write_parquet(
            &r.path().join("data/train-00001-of-00002.parquet"),
            &[&["c"]],
        );
        write_parquet(
            &r.path().join("data/train-00000-of-00002.parquet"),
            &[&["a"], &["b"]],
        );
        let (rows, _) = read_split(r.path(), "train").unwrap();
        assert_eq!(texts(&rows), ["a", "b", "c"]);
        std::fs::write(
            r.path().join("data/train-00002-of-00002.parquet"),
            "PAR1 not really",
        )
        .unwrap();
        let e = read_split(r.path(), "train").unwrap_err().to_string();
        assert!(e.contains("train-00002-of-00002.parquet"), "{e}");
    }
}
