//! Host cost of a batched constrained sampling step, the way the server's decode batch
//! builds it (`step::host_masks` + `step::sample_masked`) against the way it did before
//! (each row: its grammar's mask as one `bool` per token, `Array::from_slice`, `where` on
//! its slice of the logits, then one `concatenate`), on random logits over a real
//! vocabulary, with the rows' grammars moved on by the same greedy tokens. Both ways
//! must pick the same tokens (checked every step). Times are per step: host work only
//! (graph building and the grammar), the evaluation is outside them.
//!
//! ```sh
//! cargo run --release -p mlx-engine --example constraint_host -- TOKENIZER_DIR [ROWS] [STEPS]
//! ```
//! The constraint is benchmarks/structured_bench.py's: a JSON array of single digits.
use mlx_array::{ops, random, transforms, where_, Array, Dtype};
use mlx_engine::step::{self, LogSoftmax, RowSampling, Sampling};
use mlx_engine::{Constraint, ConstraintVocab};
use mlx_sample::{BuildProcessor, LogitsParams, LogitsProcessor};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .ok_or("usage: constraint_host TOKENIZER_DIR [ROWS] [STEPS]")?;
    let rows: usize = args.get(2).map_or(Ok(32), |s| s.parse())?;
    let steps: usize = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let tok = mlx_tokenizer::Tokenizer::from_dir(std::path::Path::new(dir))?;
    let v = tok.vocab_size();
    let vocab = ConstraintVocab::new(&tok)?;
    let items = steps;
    let schema = serde_json::json!({"type": "array", "items": {"type": "integer", "minimum": 0,
        "maximum": 9}, "minItems": items, "maxItems": items});
    let tic = Instant::now();
    let compiled = vocab.compile(&Constraint::JsonSchema(schema))?;
    println!(
        "vocabulary {v}, {rows} rows, {steps} steps; compile {:.1} ms",
        tic.elapsed().as_secs_f64() * 1e3
    );
    let build: Arc<dyn BuildProcessor> = Arc::new(compiled.clone());
    let mut new_rows: Vec<RowSampling> = (0..rows)
        .map(|_| {
            RowSampling::from_request(
                &Sampling::default(),
                &LogitsParams::default(),
                &[Arc::clone(&build)],
            )
        })
        .collect::<Result<_, _>>()?;
    let mut old_rows: Vec<_> = (0..rows)
        .map(|_| compiled.processor())
        .collect::<Result<_, _>>()?;
    let (mut t_old, mut t_masks, mut t_new) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    // The same over the second half of the steps (each row's lazily built grammar state
    // is warm by then).
    let (mut w_old, mut w_masks, mut w_new) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut key = random::key(7)?;
    let inputs = Array::from_slice(&vec![0u32; rows], &[rows as i32])?;
    for s in 0..steps {
        key = random::split(&key, 1)?.squeeze(Some(&[0]))?;
        let logits = random::normal(
            &[rows as i32, v as i32],
            Dtype::Bfloat16,
            None,
            None,
            Some(&key),
        )?;
        transforms::eval(&[&logits])?;

        // Before: one bool per token and a where per row, then a concatenate.
        let tic = Instant::now();
        let mut parts = Vec::with_capacity(rows);
        for (e, p) in old_rows.iter_mut().enumerate() {
            let e = e as i32;
            let row = logits.slice(&[e, 0], &[e + 1, v as i32], None)?;
            // The grammar's bitset as the old code turned it into flags: a zeroed
            // vector with the set entries raised.
            let words = p.allowed_words(v);
            let mut allow = vec![false; v];
            for (w, &x) in words.iter().enumerate() {
                let mut x = x;
                while x != 0 {
                    let b = x.trailing_zeros() as usize;
                    allow[w * 32 + b] = true;
                    x &= x - 1;
                }
            }
            let cond = Array::from_slice(&allow, &[1, v as i32])?;
            let neg = Array::scalar_f64(f64::NEG_INFINITY, Dtype::Bfloat16)?;
            parts.push(where_(&cond, &row, &neg)?);
        }
        let refs: Vec<&Array> = parts.iter().collect();
        let masked = ops::concatenate(&refs, 0)?;
        let lp = masked.subtract(&masked.logsumexp(Some(&[-1]), true)?)?;
        let old_tokens = lp.argmax(Some(-1), false)?;
        let d_old = tic.elapsed();

        // Now: the masks on the host as bitsets, one where for the batch.
        let tic = Instant::now();
        let mut refs: Vec<&mut RowSampling> = new_rows.iter_mut().collect();
        let masks = step::host_masks(&mut refs, v);
        let d_masks = tic.elapsed();
        let sampled = step::sample_masked(&mut refs, &inputs, &logits, masks, LogSoftmax::PerRow)?;
        let d_new = tic.elapsed();
        t_old += d_old;
        t_masks += d_masks;
        t_new += d_new;
        if s >= steps / 2 {
            w_old += d_old;
            w_masks += d_masks;
            w_new += d_new;
        }

        let a = old_tokens.astype(Dtype::Uint32)?.to_vec::<u32>()?;
        let b = sampled.tokens.astype(Dtype::Uint32)?.to_vec::<u32>()?;
        if a != b {
            return Err(format!("step {s}: tokens differ: {a:?} vs {b:?}").into());
        }
        for (t, (p, r)) in a.iter().zip(old_rows.iter_mut().zip(new_rows.iter_mut())) {
            p.accept(*t)?;
            r.accept(*t)?;
        }
    }
    let ms = |d: Duration, n: usize| d.as_secs_f64() * 1e3 / n as f64;
    let late = steps - steps / 2;
    println!(
        "host ms per step: before {:.3}; now {:.3} (of which grammar masks {:.3}); \
         second half of the steps: before {:.3}; now {:.3} (masks {:.3})",
        ms(t_old, steps),
        ms(t_new, steps),
        ms(t_masks, steps),
        ms(w_old, late),
        ms(w_new, late),
        ms(w_masks, late),
    );
    Ok(())
}
