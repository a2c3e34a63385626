//! Hugging Face datasets in `mlx_lm.lora`: the `hf_dataset` config (one mapping or a
//! list, mlx-lm's `load_custom_hf_dataset`) and a dataset id as `--data`
//! (`load_hf_dataset`). The repo's files come from a downloaded snapshot (the caller
//! resolves the id); its splits are read as `datasets.load_dataset` finds them
//! (`mlx_eval::hub_data`), then sliced as `datasets`' split strings say
//! (`train[:80%]`, `train[-10%:]`, `test[10:20]`).
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
        match e.get("config") {
            None | Some(PyVal::None) => {}
            Some(PyVal::Dict(d)) if d.is_empty() => {}
            Some(_) => {
                return Err(TrainError::Unsupported(format!(
                    "option {at}.config: the keyword arguments of `datasets.load_dataset` \
                     (a named config, data_files, ...) are not supported by this build; \
                     mlx-lora reads the repo's default config"
                )))
            }
        }
        let feature = |k: &str, d: &str| -> Result<String> {
            Ok(string(k)?.unwrap_or_else(|| d.to_string()))
        };
        out.push(HfDataset {
            train_split: string("train_split")?.unwrap_or_else(|| "train[:80%]".into()),
            valid_split: string("valid_split")?.unwrap_or_else(|| "train[-10%:]".into()),
            test_split: string("test_split")?,
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

/// One end of a split slice: rows or percent.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bound {
    Rows(i64),
    Percent(i64),
}

/// A `datasets` split string: `name` or `name[from:to]` (`from`/`to` integers, each
/// optionally `%`, either optional, negative counting from the end).
#[derive(Debug, Clone, PartialEq)]
pub struct SplitSpec {
    /// The split's name.
    pub name: String,
    from: Option<Bound>,
    to: Option<Bound>,
}

/// Parses a split string.
pub fn parse_split(s: &str) -> Result<SplitSpec> {
    let bad = || {
        invalid(format!(
            "split `{s}`: expected NAME or NAME[FROM:TO] (FROM and TO integers, each \
             optionally a percent, e.g. train[:80%]); unions (`+`) and rounding options \
             are not supported"
        ))
    };
    let s = s.trim();
    let Some(open) = s.find('[') else {
        if s.is_empty() || s.contains(['+', ']', ':']) {
            return Err(bad());
        }
        return Ok(SplitSpec {
            name: s.to_string(),
            from: None,
            to: None,
        });
    };
    let name = s[..open].trim();
    let rest = s[open + 1..].strip_suffix(']').ok_or_else(bad)?;
    if name.is_empty() || name.contains('+') {
        return Err(bad());
    }
    let (a, b) = rest.split_once(':').ok_or_else(bad)?;
    let bound = |t: &str| -> Result<Option<Bound>> {
        let t = t.trim();
        if t.is_empty() {
            return Ok(None);
        }
        match t.strip_suffix('%') {
            Some(p) => {
                let v: i64 = p.trim().parse().map_err(|_| bad())?;
                if !(-100..=100).contains(&v) {
                    return Err(bad());
                }
                Ok(Some(Bound::Percent(v)))
            }
            None => Ok(Some(Bound::Rows(t.parse().map_err(|_| bad())?))),
        }
    };
    Ok(SplitSpec {
        name: name.to_string(),
        from: bound(a)?,
        to: bound(b)?,
    })
}

impl SplitSpec {
    /// The rows `datasets` keeps of `n`: percents rounded to the closest row
    /// (`rounding="closest"`, Python's `round`), negative ends from the end, clamped.
    pub fn range(&self, n: usize) -> std::ops::Range<usize> {
        let n = n as i64;
        let abs = |b: Bound| -> i64 {
            let v = match b {
                Bound::Rows(r) => r,
                Bound::Percent(p) => round_half_even(p as f64 * n as f64 / 100.0),
            };
            if v < 0 {
                (n + v).max(0)
            } else {
                v.min(n)
            }
        };
        let from = self.from.map(abs).unwrap_or(0);
        let to = self.to.map(abs).unwrap_or(n);
        (from as usize)..(to.max(from) as usize)
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

/// The rows of `split` (a split string) of the snapshot at `root`, with a name for
/// messages.
pub fn read(root: &Path, repo: &str, split: &str) -> Result<(Vec<Json>, String)> {
    let spec = parse_split(split)?;
    let (mut rows, _) = mlx_eval::hub_data::read_split(root, &spec.name).map_err(|e| {
        TrainError::Data(format!("Hugging Face dataset {repo}, split `{split}`: {e}"))
    })?;
    fill_columns(&mut rows);
    let range = spec.range(rows.len());
    let rows = rows.drain(range).collect();
    Ok((rows, format!("{repo} [{split}]")))
}

/// Resolves a dataset repo id to a local snapshot directory (downloading it).
pub type Resolver<'a> = dyn Fn(&str) -> std::result::Result<PathBuf, String> + 'a;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_strings_slice_like_datasets() {
        let r = |s: &str, n| parse_split(s).unwrap().range(n);
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
        for bad in [
            "train+test",
            "train[1]",
            "train[a:]",
            "train[:200%]",
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
}
