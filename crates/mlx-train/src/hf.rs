//! Hugging Face datasets in `mlx_lm.lora`: the `hf_dataset` config (one mapping or a
//! list, mlx-lm's `load_custom_hf_dataset`) and a dataset id as `--data`
//! (`load_hf_dataset`). The repo's files come from a downloaded snapshot (the caller
//! resolves the id); its splits are read as `datasets.load_dataset` finds them
//! (`mlx_eval::hub_data`; an entry's `config: {name: ...}` picks the dataset config),
//! then sliced and joined as `datasets`' split strings say (`train[:80%]`,
//! `train[-10%:]`, `test[10:20]`, `train[10:50%]`, `train[:50%]+test`,
//! `train[:33%](pct1_dropremainder)`).
use crate::error::{Result, TrainError};
use crate::pyval::PyVal;
use mlx_eval::datasets::Features;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// One `hf_dataset` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct HfDataset {
    /// `path`: the dataset repo id.
    pub path: String,
    /// `train_split` (`train[:80%]`).
    pub train_split: String,
    /// `valid_split` (`train[-10%:]`).
    pub valid_split: String,
    /// `test_split` (needed with `--test`).
    pub test_split: Option<String>,
    /// `config`'s `name`: the dataset config (`load_dataset(path, name=...)`); `None`:
    /// the default one.
    pub config_name: Option<String>,
    /// `prompt_feature`, `completion_feature`, `text_feature`, `chat_feature` of this
    /// entry (mlx-lm's defaults, not the top-level options).
    pub features: Features,
}

fn invalid(m: String) -> TrainError {
    TrainError::Invalid(m)
}

/// Reads `hf_dataset` (a mapping or a list of mappings); `None` when unset.
pub fn parse(v: &PyVal) -> Result<Option<Vec<HfDataset>>> {
    let entries: Vec<&PyVal> = match v {
        PyVal::None => return Ok(None),
        PyVal::Dict(_) => vec![v],
        PyVal::List(l) if !l.is_empty() => l.iter().collect(),
        other => {
            return Err(invalid(format!(
                "option hf_dataset: expected a mapping or a non-empty list of mappings, got {}",
                other.type_name()
            )))
        }
    };
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let at = if entries.len() > 1 {
            format!("hf_dataset[{i}]")
        } else {
            "hf_dataset".to_string()
        };
        let PyVal::Dict(items) = e else {
            return Err(invalid(format!(
                "option {at}: expected a mapping, got {}",
                e.type_name()
            )));
        };
        const KEYS: &[&str] = &[
            "path",
            "train_split",
            "valid_split",
            "test_split",
            "config",
            "prompt_feature",
            "completion_feature",
            "text_feature",
            "chat_feature",
            "mask_prompt",
        ];
        if let Some((k, _)) = items.iter().find(|(k, _)| !KEYS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "option {at}.{k}: not a key of mlx-lm's hf_dataset (one of {})",
                KEYS.join(", ")
            )));
        }
        let string = |k: &str| -> Result<Option<String>> {
            match e.get(k) {
                None | Some(PyVal::None) => Ok(None),
                Some(PyVal::Str(s)) => Ok(Some(s.clone())),
                Some(v) => Err(invalid(format!(
                    "option {at}.{k}: expected a string, got {}",
                    v.type_name()
                ))),
            }
        };
        let path = string("path")?.ok_or_else(|| invalid(format!("option {at}: no `path`")))?;
        // `config` holds `datasets.load_dataset` keyword arguments (mlx-lm passes
        // `**config`): the dataset config's `name` is read; the others need `datasets`.
        let config_name = match e.get("config") {
            None | Some(PyVal::None) => None,
            Some(PyVal::Dict(d)) => {
                if let Some((k, _)) = d.iter().find(|(k, _)| k != "name") {
                    return Err(TrainError::Unsupported(format!(
                        "option {at}.config.{k}: of `datasets.load_dataset`'s keyword \
                         arguments this build reads only `name` (the dataset config)"
                    )));
                }
                match d.iter().find(|(k, _)| k == "name").map(|(_, v)| v) {
                    None | Some(PyVal::None) => None,
                    Some(PyVal::Str(n)) => Some(n.clone()),
                    Some(v) => {
                        return Err(invalid(format!(
                            "option {at}.config.name: expected a string, got {}",
                            v.type_name()
                        )))
                    }
                }
            }
            Some(v) => {
                return Err(invalid(format!(
                    "option {at}.config: expected a mapping of `datasets.load_dataset` \
                     keyword arguments (e.g. {{name: CONFIG}}), got {}",
                    v.type_name()
                )))
            }
        };
        let feature = |k: &str, d: &str| -> Result<String> {
            Ok(string(k)?.unwrap_or_else(|| d.to_string()))
        };
        out.push(HfDataset {
            train_split: string("train_split")?.unwrap_or_else(|| "train[:80%]".into()),
            valid_split: string("valid_split")?.unwrap_or_else(|| "train[-10%:]".into()),
            test_split: string("test_split")?,
            config_name,
            features: Features {
                prompt: feature("prompt_feature", "prompt")?,
                completion: feature("completion_feature", "completion")?,
                text: feature("text_feature", "text")?,
                chat: feature("chat_feature", "messages")?,
            },
            path,
        });
    }
    Ok(Some(out))
}

/// How percent bounds become rows (`datasets`' `rounding`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rounding {
    /// `closest` (the default): Python's `round(pct * n / 100)`.
    Closest,
    /// `pct1_dropremainder`: `pct * trunc(n / 100)`; refused under 100 rows.
    Pct1DropRemainder,
}

/// One `NAME[FROM:TO](ROUNDING)` term of a split string. When either bound is a
/// percent, both are (`datasets`' `unit`).
#[derive(Debug, Clone, PartialEq)]
pub struct SplitPart {
    /// The split's name.
    pub name: String,
    from: Option<i64>,
    to: Option<i64>,
    percent: bool,
    rounding: Rounding,
}

/// A `datasets` split string: terms joined by `+` (`train[:50%]+test`), read in order
/// and concatenated.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitSpec {
    /// The terms.
    pub parts: Vec<SplitPart>,
}

/// `datasets`' split names: `\w+(\.\w+)*`.
fn valid_split_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .split('.')
            .all(|w| !w.is_empty() && w.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

/// Parses one term (`_str_to_read_instruction`).
fn parse_part(s: &str, whole: &str) -> Result<SplitPart> {
    let bad = |why: &str| {
        invalid(format!(
            "split `{whole}`: {why} (expected NAME or NAME[FROM:TO], FROM and TO integers \
             or percents such as train[:80%], terms joined by `+`)"
        ))
    };
    let (head, rounding) = match s.strip_suffix(')') {
        Some(h) => {
            let open = h.rfind('(').ok_or_else(|| bad("unbalanced parenthesis"))?;
            let r = match &h[open + 1..] {
                "closest" => Rounding::Closest,
                "pct1_dropremainder" => Rounding::Pct1DropRemainder,
                other => {
                    return Err(bad(&format!(
                        "rounding `{other}` is not closest or pct1_dropremainder"
                    )))
                }
            };
            (&h[..open], Some(r))
        }
        None => (s, None),
    };
    let (name, slice) = match head.find('[') {
        Some(open) => {
            let inner = head[open + 1..]
                .strip_suffix(']')
                .ok_or_else(|| bad("unbalanced bracket"))?;
            (&head[..open], Some(inner))
        }
        None => (head, None),
    };
    if !valid_split_name(name) {
        return Err(bad(&format!("`{name}` is not a split name")));
    }
    let (mut from, mut to, mut percent) = (None, None, false);
    if let Some(inner) = slice {
        let (a, b) = inner
            .split_once(':')
            .ok_or_else(|| bad("a slice needs `:`"))?;
        let mut bound = |t: &str| -> Result<Option<i64>> {
            if t.is_empty() {
                return Ok(None);
            }
            let (num, pct) = match t.strip_suffix('%') {
                Some(n) => (n, true),
                None => (t, false),
            };
            percent |= pct;
            let digits = num.strip_prefix('-').unwrap_or(num);
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '_') {
                return Err(bad(&format!("`{t}` is not an integer")));
            }
            num.replace('_', "")
                .parse()
                .map(Some)
                .map_err(|_| bad(&format!("`{t}` is not an integer")))
        };
        from = bound(a)?;
        to = bound(b)?;
    }
    if !percent && rounding.is_some() {
        return Err(bad("a rounding needs percent bounds"));
    }
    if percent && [from, to].iter().flatten().any(|v| v.abs() > 100) {
        return Err(bad("percent bounds lie within -100 and 100"));
    }
    Ok(SplitPart {
        name: name.to_string(),
        from,
        to,
        percent,
        rounding: rounding.unwrap_or(Rounding::Closest),
    })
}

/// Parses a split string (`ReadInstruction.from_spec`).
pub fn parse_split(s: &str) -> Result<SplitSpec> {
    let parts = s
        .split('+')
        .map(|p| parse_part(p, s))
        .collect::<Result<Vec<_>>>()?;
    Ok(SplitSpec { parts })
}

impl SplitPart {
    /// The rows `datasets` keeps of `n` (`_rel_to_abs_instr`): percents rounded as the
    /// term says, negative ends from the end, clamped.
    pub fn range(&self, n: usize) -> Result<std::ops::Range<usize>> {
        let n = n as i64;
        if self.percent && self.rounding == Rounding::Pct1DropRemainder && n < 100 {
            return Err(invalid(format!(
                "split `{}`: pct1_dropremainder rounding on a split of fewer than 100 rows \
                 always gives an empty dataset (datasets refuses it)",
                self.name
            )));
        }
        let abs = |b: i64| -> i64 {
            if !self.percent {
                b
            } else if self.rounding == Rounding::Closest {
                round_half_even(b as f64 * n as f64 / 100.0)
            } else {
                b * (n / 100)
            }
        };
        let mut from = self.from.map(abs).unwrap_or(0);
        let mut to = self.to.map(abs).unwrap_or(n);
        if from < 0 {
            from = (n + from).max(0);
        }
        if to < 0 {
            to = (n + to).max(0);
        }
        let (from, to) = (from.min(n), to.min(n));
        Ok((from as usize)..(to.max(from) as usize))
    }
}

/// Python's `round` of a float (ties to even).
fn round_half_even(x: f64) -> i64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r as i64 % 2 != 0 {
        (r - x.signum()) as i64
    } else {
        r as i64
    }
}

/// Every row with every column: `datasets` gives a JSON dataset the union of its rows'
/// keys, a missing one as `None` (so `len(row)`, mlx-lm's sort key, is the column count).
fn fill_columns(rows: &mut [Json]) {
    let mut columns: Vec<String> = Vec::new();
    for r in rows.iter() {
        if let Json::Object(m) = r {
            for k in m.keys() {
                if !columns.contains(k) {
                    columns.push(k.clone());
                }
            }
        }
    }
    for r in rows.iter_mut() {
        if let Json::Object(m) = r {
            for c in &columns {
                m.entry(c.clone()).or_insert(Json::Null);
            }
        }
    }
}

/// The rows of `split` (a split string; `+` terms concatenated) of the config `config`
/// (`None`: the default one) of the snapshot at `root`, with a name for messages.
pub fn read(
    root: &Path,
    repo: &str,
    config: Option<&str>,
    split: &str,
) -> Result<(Vec<Json>, String)> {
    let spec = parse_split(split)?;
    let mut rows = Vec::new();
    for part in &spec.parts {
        let (mut all, _) =
            mlx_eval::hub_data::read_split_of(root, config, &part.name).map_err(|e| {
                TrainError::Data(format!("Hugging Face dataset {repo}, split `{split}`: {e}"))
            })?;
        let range = part.range(all.len())?;
        rows.extend(all.drain(range));
    }
    fill_columns(&mut rows);
    Ok((rows, format!("{repo} [{split}]")))
}

/// Resolves a dataset repo id to a local snapshot directory (downloading it).
pub type Resolver<'a> = dyn Fn(&str) -> std::result::Result<PathBuf, String> + 'a;

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of each term of `s` over splits of `n` rows.
    fn ranges(s: &str, n: usize) -> Vec<std::ops::Range<usize>> {
        let spec = parse_split(s).unwrap();
        spec.parts.iter().map(|p| p.range(n).unwrap()).collect()
    }

    #[test]
    fn split_strings_slice_like_datasets() {
        let r = |s: &str, n| ranges(s, n).remove(0);
        assert_eq!(r("train", 10), 0..10);
        assert_eq!(r("train[:80%]", 10), 0..8);
        assert_eq!(r("train[-10%:]", 10), 9..10);
        // 13 rows: 80% is 10.4 -> 10, 10% is 1.3 -> 1.
        assert_eq!(r("train[:80%]", 13), 0..10);
        assert_eq!(r("train[-10%:]", 13), 12..13);
        // Ties round to even: 5% of 10 is 0.5 -> 0, 15% of 10 is 1.5 -> 2.
        assert_eq!(r("train[:5%]", 10), 0..0);
        assert_eq!(r("train[:15%]", 10), 0..2);
        assert_eq!(r("test[2:5]", 10), 2..5);
        assert_eq!(r("test[-3:]", 10), 7..10);
        assert_eq!(r("test[5:2]", 10), 5..5);
        assert_eq!(r("test[:100]", 10), 0..10);
        assert_eq!(r("train[:1_0]", 13), 0..10);
        // One percent bound makes both percents (datasets' `unit`): 10% and 50% of 13.
        assert_eq!(r("train[10:50%]", 13), 1..6);
        // pct1_dropremainder: multiples of 1% of the rows (250 rows: 2 per percent).
        assert_eq!(r("train[:33%](pct1_dropremainder)", 250), 0..66);
        assert_eq!(r("train[:33%](closest)", 250), 0..82);
        let small = parse_split("train[:30%](pct1_dropremainder)").unwrap();
        assert!(small.parts[0].range(13).is_err());
        // `+` concatenates terms, in order.
        assert_eq!(ranges("train[:50%]+test[-2:]", 13), vec![0..6, 11..13]);
        let names: Vec<String> = parse_split("train+validation.x+test")
            .unwrap()
            .parts
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["train", "validation.x", "test"]);
        for bad in [
            "train + test",
            "train+",
            "train[1]",
            "train[a:]",
            "train[:200%]",
            "train[:5](closest)",
            "train[:5%](nearest)",
            "[1:2]",
            "",
        ] {
            assert!(parse_split(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hf_dataset_takes_a_mapping_or_a_list() {
        let one = PyVal::Dict(vec![("path".into(), PyVal::Str("org/ds".into()))]);
        let got = parse(&one).unwrap().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].train_split, "train[:80%]");
        assert_eq!(got[0].valid_split, "train[-10%:]");
        assert_eq!(got[0].test_split, None);
        assert_eq!(got[0].features.text, "text");
        let two = PyVal::List(vec![one.clone(), one]);
        assert_eq!(parse(&two).unwrap().unwrap().len(), 2);
        let typo = PyVal::Dict(vec![
            ("path".into(), PyVal::Str("org/ds".into())),
            ("split".into(), PyVal::Str("train".into())),
        ]);
        let e = parse(&typo).unwrap_err().to_string();
        assert!(e.contains("hf_dataset.split: not a key"), "{e}");
        assert!(parse(&PyVal::Str("org/ds".into())).is_err());
    }

    #[test]
    fn hf_dataset_config_name_is_read_and_other_load_dataset_arguments_refused() {
        let entry = |config: PyVal| {
            PyVal::Dict(vec![
                ("path".into(), PyVal::Str("org/ds".into())),
                ("config".into(), config),
            ])
        };
        let named = entry(PyVal::Dict(vec![(
            "name".into(),
            PyVal::Str("second".into()),
        )]));
        assert_eq!(
            parse(&named).unwrap().unwrap()[0].config_name.as_deref(),
            Some("second")
        );
        let empty = entry(PyVal::Dict(Vec::new()));
        assert_eq!(parse(&empty).unwrap().unwrap()[0].config_name, None);
        let files = entry(PyVal::Dict(vec![(
            "data_files".into(),
            PyVal::Str("x.jsonl".into()),
        )]));
        let e = parse(&files).unwrap_err().to_string();
        assert!(e.contains("hf_dataset.config.data_files"), "{e}");
        let e = parse(&entry(PyVal::Str("second".into())))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected a mapping"), "{e}");
    }

    fn repo(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let p = d.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    fn texts(rows: &[Json]) -> Vec<&str> {
        rows.iter().map(|r| r["text"].as_str().unwrap()).collect()
    }

    /// What `datasets.load_dataset(dir, name=..., split=...)` 5.2 returns for these
    /// repos (checked by hand with the .venv's `datasets`).
    #[test]
    fn reading_follows_datasets_for_configs_and_unions() {
        let lines = |p: &str, n: usize| -> String {
            (0..n)
                .map(|i| format!("{{\"text\": \"{p}{i}\"}}\n"))
                .collect()
        };
        let plain = repo(&[
            ("data/train.jsonl", &lines("train ", 13)),
            ("data/test.jsonl", &lines("test ", 5)),
        ]);
        let (rows, _) = read(plain.path(), "r1", None, "train[:50%]+test[-2:]").unwrap();
        assert_eq!(
            texts(&rows),
            [
                "train 0", "train 1", "train 2", "train 3", "train 4", "train 5", "test 3",
                "test 4"
            ]
        );
        let (rows, _) = read(plain.path(), "r1", None, "train[10:50%]").unwrap();
        assert_eq!(
            texts(&rows),
            ["train 1", "train 2", "train 3", "train 4", "train 5"]
        );
        let (rows, _) = read(plain.path(), "r1", Some("default"), "train").unwrap();
        assert_eq!(rows.len(), 13);
        let e = read(plain.path(), "r1", Some("foo"), "train")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no config `foo` (available: default)"), "{e}");

        let readme = "---\nconfigs:\n- config_name: first\n  data_files:\n  - split: train\n    path: a/train.jsonl\n- config_name: second\n  data_files:\n  - split: train\n    path: b/train.jsonl\n---\n";
        let two = repo(&[
            ("README.md", readme),
            ("a/train.jsonl", &lines("a", 4)),
            ("b/train.jsonl", &lines("b", 4)),
        ]);
        let (rows, _) = read(two.path(), "r2", Some("second"), "train").unwrap();
        assert_eq!(texts(&rows), ["b0", "b1", "b2", "b3"]);
        let e = read(two.path(), "r2", Some("third"), "train")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no config `third` (available: first, second)"),
            "{e}"
        );
    }
}
