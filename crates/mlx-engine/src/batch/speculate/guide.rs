//! Rows with logits processors speculate on forks of them ([`Guide`]): drafts are
//! made and verified under what the row's processors would do at each drafted token.
use super::Row;
use crate::error::Result;
use mlx_array::{ops, Array};
use mlx_sample::LogitsProcessors;

/// A fork of a row's processors that runs ahead of the row over drafted tokens, with
/// the history they make (the prompt, the generated tokens, then the drafts taken):
/// what the row's own processors would see if the drafts were emitted. The row's own
/// processors are not touched.
pub(super) struct Guide {
    procs: LogitsProcessors,
    history: Vec<u32>,
}

impl Guide {
    pub(super) fn new(row: &mut Row) -> Guide {
        let mut history = row.seq.job().req.prompt.clone();
        history.extend_from_slice(&row.generated);
        Guide {
            procs: row.seq.sampling_mut().fork_processors(),
            history,
        }
    }

    /// The processors on the logits `[1, vocab]` of the next position.
    pub(super) fn process(&mut self, logits: &Array) -> Result<Array> {
        let h = Array::from_slice(&self.history, &[self.history.len() as i32])?;
        Ok(self.procs.process_with_history(&h, logits)?)
    }

    /// Takes `token` as the next token: `false` when the processors cannot go on with
    /// it (a constraint rejected it: a dead end).
    pub(super) fn take(&mut self, token: u32) -> Result<bool> {
        self.procs.accept(token)?;
        if self.procs.dead_end() {
            return Ok(false);
        }
        self.history.push(token);
        Ok(true)
    }

    /// The verification logits `[L, vocab]` of the row processed position by position:
    /// position `i` after the guide took `drafts[..i]`. Stops at the first draft the
    /// processors reject, or before the first position they fail on (the positions
    /// after keep their logits: they are never emitted; a failure at the first
    /// position is the row's). Returns the processed logits and how many drafts may
    /// be accepted.
    pub(super) fn verify(mut self, logits: &Array, drafts: &[u32]) -> Result<(Array, usize)> {
        let (l, v) = (logits.dim(0)?, logits.dim(1)?);
        let mut n = drafts.len();
        let mut parts = Vec::with_capacity(l as usize);
        for i in 0..l {
            let row = logits.slice(&[i, 0], &[i + 1, v], None)?;
            let iu = i as usize;
            if iu > n {
                parts.push(row);
                continue;
            }
            match self.process(&row) {
                Ok(p) => parts.push(p),
                // The round emits up to the position before; the next round fails
                // the row where the plain batch would.
                Err(_) if iu > 0 => {
                    n = iu - 1;
                    parts.push(row);
                    continue;
                }
                Err(e) => return Err(e),
            }
            if iu < n && !self.take(drafts[iu])? {
                n = iu;
            }
        }
        let refs: Vec<&Array> = parts.iter().collect();
        Ok((ops::concatenate(&refs, 0)?, n))
    }
}

/// The draft model's logits `[B, vocab]` with each guided row (where `active`) under
/// its guide; a guide that fails is dropped (the row then drafts greedily; its
/// verification reports the failure).
pub(super) fn guide_rows(
    guides: &mut [Option<Guide>],
    logits: &Array,
    active: impl Fn(usize) -> bool,
) -> Result<Array> {
    let v = logits.dim(1)?;
    let mut parts = Vec::with_capacity(guides.len());
    for (r, g) in guides.iter_mut().enumerate() {
        let r32 = r as i32;
        let row = logits.slice(&[r32, 0], &[r32 + 1, v], None)?;
        let processed = match g.as_mut() {
            Some(gd) if active(r) => gd.process(&row).ok(),
            _ => None,
        };
        if processed.is_none() && active(r) {
            *g = None;
        }
        parts.push(processed.unwrap_or(row));
    }
    let refs: Vec<&Array> = parts.iter().collect();
    Ok(ops::concatenate(&refs, 0)?)
}
