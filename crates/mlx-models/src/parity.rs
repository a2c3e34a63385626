//! Comparing a model's logits with mlx-lm's (the files `xtask/py/oracle_logits.py`
//! writes): used by `cargo xtask parity` and by the committed-golden tests.
use crate::loader::load_model;
use crate::model::LanguageModel;
use mlx_array::{ops, Array, Dtype};
use mlx_nn::KvCache;
use std::collections::BTreeMap;
use std::path::Path;

/// Makes the per-layer caches mlx-lm's `make_prompt_cache(model)` would.
pub type CacheFactory<'a> = &'a dyn Fn(&dyn LanguageModel) -> Result<Vec<Box<dyn KvCache>>, String>;

/// Quantizes caches in place like mlx-lm's
/// `maybe_quantize_kv_cache(caches, 0, kv_group_size=32, kv_bits=8)`.
pub type CacheQuantizer<'a> = &'a dyn Fn(&mut [Box<dyn KvCache>]) -> Result<(), String>;

/// What decode cases need: the caches, and for `qdecode` cases a quantizer.
#[derive(Clone, Copy)]
pub struct Decoding<'a> {
    /// Builds the caches.
    pub make_caches: CacheFactory<'a>,
    /// Quantizes them after every model call (`qdecode` cases are skipped without it).
    pub quantize_caches: Option<CacheQuantizer<'a>>,
}

/// How one case compares.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Same dtype, shape and bytes.
    Identical,
    /// Same shape but different values; the largest absolute difference.
    Differs(f64),
    /// Shapes or dtypes differ, or running the case failed.
    Failed(String),
}

/// One compared case (`full.2`, `decode.1`, `batch`).
#[derive(Debug, Clone)]
pub struct Case {
    /// Case name.
    pub name: String,
    /// Result.
    pub outcome: Outcome,
}

/// Compares two arrays bit for bit, else by their largest absolute difference.
pub fn compare(ours: &Array, theirs: &Array) -> Outcome {
    if ours.shape() != theirs.shape() || ours.dtype() != theirs.dtype() {
        return Outcome::Failed(format!(
            "got {:?} {}, expected {:?} {}",
            ours.shape(),
            ours.dtype(),
            theirs.shape(),
            theirs.dtype()
        ));
    }
    let same = match (ours.to_bytes(), theirs.to_bytes()) {
        (Ok(a), Ok(b)) => a == b,
        (Err(e), _) | (_, Err(e)) => return Outcome::Failed(e.to_string()),
    };
    if same {
        return Outcome::Identical;
    }
    let diff = || -> mlx_array::Result<f64> {
        let d = ours
            .astype(Dtype::Float32)?
            .subtract(&theirs.astype(Dtype::Float32)?)?
            .abs()?;
        Ok(d.max(None, false)?.item::<f32>()? as f64)
    };
    match diff() {
        Ok(d) => Outcome::Differs(d),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

fn get<'a>(o: &'a BTreeMap<String, Array>, k: &str) -> Result<&'a Array, String> {
    o.get(k).ok_or_else(|| format!("oracle has no `{k}`"))
}

fn run_decode(
    model: &dyn LanguageModel,
    tokens: &Array,
    prefill: i32,
    make: CacheFactory<'_>,
    quantize: Option<CacheQuantizer<'_>>,
) -> Result<Array, String> {
    let e = |e: mlx_array::Error| e.to_string();
    let q = |c: &mut [Box<dyn KvCache>]| quantize.map_or(Ok(()), |f| f(c));
    let mut caches = make(model)?;
    let len = tokens.dim(1).map_err(e)?;
    let mut steps = vec![model
        .forward(&tokens.slice_axis(1, 0, prefill).map_err(e)?, &mut caches)
        .map_err(e)?];
    q(&mut caches)?;
    for t in prefill..len {
        let step = model
            .forward(&tokens.slice_axis(1, t, t + 1).map_err(e)?, &mut caches)
            .map_err(e)?;
        q(&mut caches)?;
        step.eval().map_err(e)?;
        steps.push(step);
    }
    let refs: Vec<&Array> = steps.iter().collect();
    ops::concatenate(&refs, 1).map_err(e)
}

/// Loads the model in `model_dir` and runs every case of its `oracle.safetensors`;
/// decode cases need `decoding` (they are skipped without it).
pub fn check_model_dir(
    model_dir: &Path,
    decoding: Option<Decoding<'_>>,
) -> Result<Vec<Case>, String> {
    let oracle_path = model_dir.join("oracle.safetensors");
    let (oracle, _) = mlx_array::io::load_safetensors(&oracle_path).map_err(|e| e.to_string())?;
    let (model, _) = load_model(model_dir).map_err(|e| e.to_string())?;
    let model = model.as_ref();
    let mut cases = Vec::new();
    let mut push = |name: String, r: Result<Outcome, String>| {
        cases.push(Case {
            name,
            outcome: r.unwrap_or_else(Outcome::Failed),
        })
    };
    let full = |tok: &Array, want: &Array| -> Result<Outcome, String> {
        let got = model.forward(tok, &mut []).map_err(|e| e.to_string())?;
        Ok(compare(&got, want))
    };
    for i in 0.. {
        let Some(tok) = oracle.get(&format!("full.{i}.tokens")) else {
            break;
        };
        push(
            format!("full.{i}"),
            get(&oracle, &format!("full.{i}.logits")).and_then(|w| full(tok, w)),
        );
    }
    if let Some(tok) = oracle.get("batch.tokens") {
        push(
            "batch".into(),
            get(&oracle, "batch.logits").and_then(|w| full(tok, w)),
        );
    }
    let Some(d) = decoding else {
        return Ok(cases);
    };
    for (kind, quantize) in [("decode", None), ("qdecode", d.quantize_caches)] {
        if kind == "qdecode" && quantize.is_none() {
            continue;
        }
        for j in 0.. {
            let Some(tok) = oracle.get(&format!("{kind}.{j}.tokens")) else {
                break;
            };
            let r = (|| {
                let prefill = get(&oracle, &format!("{kind}.{j}.prefill"))?
                    .item::<i32>()
                    .map_err(|e| e.to_string())?;
                let want = get(&oracle, &format!("{kind}.{j}.logits"))?;
                let got = run_decode(model, tok, prefill, d.make_caches, quantize)?;
                Ok(compare(&got, want))
            })();
            push(format!("{kind}.{j}"), r);
        }
    }
    Ok(cases)
}

/// One line of the parity table: `identical`, `max abs diff X (case)` or the failure.
pub fn summarize(cases: &[Case]) -> (bool, String) {
    if let Some(c) = cases
        .iter()
        .find(|c| matches!(c.outcome, Outcome::Failed(_)))
    {
        if let Outcome::Failed(m) = &c.outcome {
            return (false, format!("FAILED {}: {m}", c.name));
        }
    }
    let worst = cases
        .iter()
        .filter_map(|c| match c.outcome {
            Outcome::Differs(d) => Some((d, c.name.as_str())),
            _ => None,
        })
        .fold(None, |acc: Option<(f64, &str)>, (d, n)| match acc {
            Some((m, _)) if m >= d => acc,
            _ => Some((d, n)),
        });
    match worst {
        None => (true, format!("identical ({} cases)", cases.len())),
        Some((d, n)) => {
            let k = cases
                .iter()
                .filter(|c| matches!(c.outcome, Outcome::Differs(_)))
                .count();
            (
                false,
                format!(
                    "max abs diff {d:e} ({k}/{} cases differ, worst {n})",
                    cases.len()
                ),
            )
        }
    }
}
