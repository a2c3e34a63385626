//! `mlx_lm.lora`'s arguments: the command-line flags, then `-c/--config` YAML keys for
//! the flags left unset, then `CONFIG_DEFAULTS` (mlx-lm's `main`), kept as the Python
//! namespace (written as `adapter_config.json`) and read into typed fields with errors
//! naming a key of the wrong type.
use crate::error::{Result, TrainError};
use crate::pyval::PyVal;
use std::path::Path;

/// The argparse destinations of `mlx_lm.lora` and their parser defaults (`None` except
/// `--clear-cache-threshold` (0) and `--trust-remote-code` (False): so a config file
/// cannot set those two, as in mlx-lm).
pub fn parser_defaults() -> Vec<(String, PyVal)> {
    let keys = [
        "model",
        "train",
        "data",
        "fine_tune_type",
        "optimizer",
        "mask_prompt",
        "num_layers",
        "batch_size",
        "iters",
        "val_batches",
        "learning_rate",
        "steps_per_report",
        "steps_per_eval",
        "grad_accumulation_steps",
        "resume_adapter_file",
        "adapter_path",
        "save_every",
        "test",
        "test_batches",
        "max_seq_length",
        "config",
        "grad_checkpoint",
        "clear_cache_threshold",
        "report_to",
        "project_name",
        "seed",
        "trust_remote_code",
    ];
    keys.iter()
        .map(|k| {
            let v = match *k {
                "clear_cache_threshold" => PyVal::Int(0),
                "trust_remote_code" => PyVal::Bool(false),
                _ => PyVal::None,
            };
            (k.to_string(), v)
        })
        .collect()
}

/// mlx-lm 0.32.2's `CONFIG_DEFAULTS`.
pub fn config_defaults() -> Vec<(String, PyVal)> {
    let d = |items: Vec<(&str, PyVal)>| {
        PyVal::Dict(items.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    };
    let s = |v: &str| PyVal::Str(v.into());
    let empty = || PyVal::Dict(vec![]);
    vec![
        ("model", s("Qwen/Qwen3-0.6b")),
        ("train", PyVal::Bool(false)),
        ("fine_tune_type", s("lora")),
        ("optimizer", s("adam")),
        (
            "optimizer_config",
            d(vec![
                ("adam", empty()),
                ("adamw", empty()),
                ("muon", empty()),
                ("sgd", empty()),
                ("adafactor", empty()),
            ]),
        ),
        ("data", s("mlx-community/WikiSQL")),
        ("seed", PyVal::Int(0)),
        ("num_layers", PyVal::Int(16)),
        ("batch_size", PyVal::Int(4)),
        ("iters", PyVal::Int(1000)),
        ("val_batches", PyVal::Int(25)),
        ("learning_rate", PyVal::Float(1e-5)),
        ("steps_per_report", PyVal::Int(10)),
        ("steps_per_eval", PyVal::Int(200)),
        ("resume_adapter_file", PyVal::None),
        ("adapter_path", s("adapters")),
        ("save_every", PyVal::Int(100)),
        ("test", PyVal::Bool(false)),
        ("test_batches", PyVal::Int(500)),
        ("max_seq_length", PyVal::Int(2048)),
        ("config", PyVal::None),
        ("grad_checkpoint", PyVal::Bool(false)),
        ("grad_accumulation_steps", PyVal::Int(1)),
        ("clear_cache_threshold", PyVal::Int(0)),
        ("lr_schedule", PyVal::None),
        (
            "lora_parameters",
            d(vec![
                ("rank", PyVal::Int(8)),
                ("dropout", PyVal::Float(0.0)),
                ("scale", PyVal::Float(20.0)),
            ]),
        ),
        ("mask_prompt", PyVal::Bool(false)),
        ("report_to", PyVal::None),
        ("project_name", PyVal::None),
        ("trust_remote_code", PyVal::Bool(false)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// mlx-lm's `_parse_size`: digits then an optional `M`, `G`, `MB` or `GB`.
pub fn parse_size(x: &str) -> Result<u64> {
    let split = x
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(x.len());
    let bad = || TrainError::Invalid(format!("{x:?} is not a size (e.g. 500M, 2GB, 1000000)"));
    let digits: f64 = x[..split].parse().map_err(|_| bad())?;
    let unit = match x[split..].trim().to_ascii_uppercase().as_str() {
        "" => 1.0,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        _ => return Err(bad()),
    };
    Ok((digits * unit) as u64)
}

/// The merged arguments.
#[derive(Debug, Clone)]
pub struct LoraArgs {
    /// The namespace, in order (`vars(args)`).
    pub ns: Vec<(String, PyVal)>,
}

fn set(ns: &mut Vec<(String, PyVal)>, key: &str, v: PyVal) {
    match ns.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = v,
        None => ns.push((key.to_string(), v)),
    }
}

impl LoraArgs {
    /// mlx-lm's `main`: `cli` holds the flags given (key, value), `config` the YAML text
    /// of `-c` (its path is `cli`'s `config`).
    pub fn merge(cli: Vec<(String, PyVal)>, config: Option<(&Path, &str)>) -> Result<LoraArgs> {
        let mut ns = parser_defaults();
        for (k, v) in cli {
            set(&mut ns, &k, v);
        }
        if let Some((path, text)) = config {
            let bad = |m: String| TrainError::Config {
                path: path.to_path_buf(),
                message: m,
            };
            let docs = yaml_rust2::YamlLoader::load_from_str(text)
                .map_err(|e| bad(format!("not valid YAML: {e}")))?;
            let doc = docs.into_iter().next().unwrap_or(yaml_rust2::Yaml::Null);
            let items = match PyVal::from_yaml(&doc).map_err(bad)? {
                PyVal::Dict(items) => items,
                PyVal::None => Vec::new(),
                other => {
                    return Err(bad(format!(
                        "the config must be a mapping of option names, not a {}",
                        other.type_name()
                    )))
                }
            };
            for (k, v) in items {
                let unset = ns
                    .iter()
                    .find(|(n, _)| *n == k)
                    .is_none_or(|(_, x)| x.is_none());
                if unset {
                    set(&mut ns, &k, v);
                }
            }
        }
        for (k, v) in config_defaults() {
            let unset = ns
                .iter()
                .find(|(n, _)| *n == k)
                .is_none_or(|(_, x)| x.is_none());
            if unset {
                set(&mut ns, &k, v);
            }
        }
        Ok(LoraArgs { ns })
    }

    /// The value of `key` (`None` when absent).
    pub fn get(&self, key: &str) -> &PyVal {
        static NONE: PyVal = PyVal::None;
        self.ns
            .iter()
            .find(|(k, _)| k == key)
            .map_or(&NONE, |(_, v)| v)
    }

    /// Sets `key`.
    pub fn set(&mut self, key: &str, v: PyVal) {
        set(&mut self.ns, key, v)
    }

    fn wrong(&self, key: &str, want: &str) -> TrainError {
        let v = self.get(key);
        TrainError::Invalid(format!(
            "option {key}: expected {want}, got {} {}",
            v.type_name(),
            v.to_json()
        ))
    }

    /// A string option.
    pub fn str(&self, key: &str) -> Result<String> {
        match self.get(key) {
            PyVal::Str(s) => Ok(s.clone()),
            _ => Err(self.wrong(key, "a string")),
        }
    }

    /// A string option that may be `None`.
    pub fn opt_str(&self, key: &str) -> Result<Option<String>> {
        match self.get(key) {
            PyVal::None => Ok(None),
            PyVal::Str(s) => Ok(Some(s.clone())),
            _ => Err(self.wrong(key, "a string or null")),
        }
    }

    /// An integer option.
    pub fn int(&self, key: &str) -> Result<i64> {
        match self.get(key) {
            PyVal::Int(i) => Ok(*i),
            _ => Err(self.wrong(key, "an integer")),
        }
    }

    /// A non-negative integer option.
    pub fn count(&self, key: &str) -> Result<usize> {
        let v = self.int(key)?;
        usize::try_from(v).map_err(|_| self.wrong(key, "a non-negative integer"))
    }

    /// A positive integer option.
    pub fn positive(&self, key: &str) -> Result<usize> {
        match self.count(key)? {
            0 => Err(self.wrong(key, "a positive integer")),
            n => Ok(n),
        }
    }

    /// A number option.
    pub fn float(&self, key: &str) -> Result<f64> {
        match self.get(key) {
            PyVal::Int(i) => Ok(*i as f64),
            PyVal::Float(f) => Ok(*f),
            _ => Err(self.wrong(key, "a number")),
        }
    }

    /// A bool option (Python truthiness of a bool; anything else is an error).
    pub fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key) {
            PyVal::Bool(b) => Ok(*b),
            _ => Err(self.wrong(key, "true or false")),
        }
    }

    /// `adapter_config.json` as mlx-lm's `save_config(vars(args))` writes it: the
    /// namespace sorted by key, `json.dump(indent=4)`.
    pub fn adapter_config_json(&self) -> String {
        let mut items = self.ns.clone();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        PyVal::Dict(items).to_python_json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_config_and_the_config_over_defaults() {
        let cli = vec![("iters".to_string(), PyVal::Int(7))];
        let yaml = "iters: 100\nbatch_size: 2\nlearning_rate: 1e-4\nclear_cache_threshold: 5\n\
                    lora_parameters:\n  scale: 10.0\n  rank: 4\n  dropout: 0.0\n";
        let a = LoraArgs::merge(cli, Some((Path::new("c.yaml"), yaml))).unwrap();
        assert_eq!(a.int("iters").unwrap(), 7);
        assert_eq!(a.int("batch_size").unwrap(), 2);
        assert_eq!(a.float("learning_rate").unwrap(), 1e-4);
        // The parser's default 0 is not None: the config cannot set it (as in mlx-lm).
        assert_eq!(a.int("clear_cache_threshold").unwrap(), 0);
        assert_eq!(a.int("num_layers").unwrap(), 16);
        let json = a.adapter_config_json();
        assert!(
            json.contains("\"lora_parameters\": {\n        \"scale\": 10.0,\n        \"rank\": 4,")
        );
        assert!(json.contains("\"learning_rate\": 0.0001,"));
    }

    #[test]
    fn a_key_of_the_wrong_type_is_named() {
        let yaml = "batch_size: four\n";
        let a = LoraArgs::merge(vec![], Some((Path::new("c.yaml"), yaml))).unwrap();
        let e = a.positive("batch_size").unwrap_err().to_string();
        assert_eq!(
            e,
            "option batch_size: expected an integer, got str \"four\""
        );
    }

    #[test]
    fn sizes_parse_like_mlx_lm() {
        assert_eq!(parse_size("500M").unwrap(), 500_000_000);
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert!(parse_size("12XB").is_err());
    }
}
