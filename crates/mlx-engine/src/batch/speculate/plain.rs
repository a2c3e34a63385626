//! A speculating batch's plain steps, queued before the last one's tokens are read as
//! the decode batch's are (a prediction batch's, and a draft-model batch's on a GPU or
//! under `MLX_MODEL_PLAIN_STEPS=1`).
use super::{Round, SpecBatch};
use crate::batch::decode::Queued;
use crate::batch::request::SeqId;
use crate::batch::stage::Outcome;
use crate::error::{EngineError, Result};
use crate::profile::SpecPhase;
use crate::step;
use mlx_array::{ops, Array};
use mlx_models::LanguageModel;

/// The queued output of a plain step of a prediction batch, read during the next step.
pub(super) struct Pending {
    /// The rows it covers (a prefix of the batch's: rows that join later come after).
    pub(super) rows: usize,
    /// Their tokens (and log-probabilities).
    pub(super) out: Queued,
}

impl SpecBatch {
    /// A plain step of every row, pipelined as the plain decode batch's: it feeds each
    /// row its next input (the tokens of `last`, the plain step before, still on the
    /// device; each row's `y` without it, and for rows that joined since), queues the
    /// sampling, and only then reads `last`'s tokens. Its own tokens stay pending until
    /// the next step, which reads them after queuing itself when it is plain too, first
    /// otherwise ([`SpecBatch::step`]).
    pub(super) fn step_plain(
        &mut self,
        model: &dyn LanguageModel,
        last: Option<Pending>,
    ) -> Result<(Vec<(SeqId, Outcome)>, Round)> {
        let b = self.rows.len();
        self.last_drafted = false;
        // Rows past `last`'s (all without it) feed their `y`: they joined since.
        let read = last.as_ref().map_or(0, |p| p.rows);
        let ys: Vec<u32> = self.rows[read..].iter().map(|r| r.y).collect();
        for row in &mut self.rows[read..] {
            if std::mem::take(&mut row.y_unfed) {
                row.seq.push_fed(row.y);
            }
        }
        // A draft model lags by every token the target takes alone (`last`'s when they
        // are read).
        for (l, &y) in self.lag.iter_mut().skip(read).zip(&ys) {
            l.push(y);
        }
        let input = match &last {
            Some(p) if read == b => p.out.tokens.reshape(&[b as i32, 1])?,
            Some(p) => {
                let tokens = p.out.tokens.reshape(&[read as i32, 1])?;
                let joined = Array::from_slice(&ys, &[ys.len() as i32, 1])?;
                ops::concatenate(&[&tokens, &joined], 0)?
            }
            None => Array::from_slice(&ys, &[b as i32, 1])?,
        };
        let logits = step::forward_tail(model, &input, self.cache.layers_mut(), None, 1)?;
        let mut samplers: Vec<&mut step::RowSampling> =
            self.rows.iter_mut().map(|r| r.seq.sampling_mut()).collect();
        let (tokens, logprobs) = step::sample_positions(&mut samplers, &logits)?;
        let chosen = if self.rows.iter().any(|r| r.seq.job().req.wants_logprobs()) {
            let idx = tokens.reshape(&[b as i32, 1, 1])?;
            Some(logprobs.take_along_axis(&idx, -1)?)
        } else {
            None
        };
        let queued = Queued {
            tokens,
            logprobs: logprobs.reshape(&[b as i32, -1])?,
            chosen,
        };
        queued.queue()?;
        let out = match last {
            Some(p) => self.read_pending(p, true)?,
            None => Vec::new(),
        };
        self.pending = Some(Pending {
            rows: b,
            out: queued,
        });
        self.last_rows = b;
        let round = Round {
            rows: b as u64,
            ..Round::default()
        };
        self.mark(SpecPhase::Plain);
        self.end_profile(1);
        Ok((out, round))
    }

    /// Reads a plain step's tokens and records them (`fed`: a step queued since feeds
    /// them; otherwise each becomes its row's next input `y`).
    pub(super) fn read_pending(&mut self, p: Pending, fed: bool) -> Result<Vec<(SeqId, Outcome)>> {
        let Some(rows) = self.rows.get_mut(..p.rows) else {
            return Err(EngineError::Internal(
                "a queued step covers rows that left".into(),
            ));
        };
        let read = p.out.read(rows.iter().map(|r| &*r.seq.job().req))?;
        let mut out = Vec::with_capacity(read.len());
        for (r, (row, (token, logprob, top))) in rows.iter_mut().zip(read).enumerate() {
            if !fed {
                row.y = token;
                row.y_unfed = true;
            } else if let Some(l) = self.lag.get_mut(r) {
                l.push(token);
            }
            match row.seq.record(token, logprob, top, fed) {
                Ok(t) => {
                    row.generated.push(token);
                    out.push((row.seq.id(), Outcome::Token(t)));
                }
                Err(e) => out.push((row.seq.id(), Outcome::Failed(e))),
            }
        }
        Ok(out)
    }

    /// Reads the tokens of a plain step still pending, before rows leave with their next
    /// inputs ([`SpecBatch::step_aside`]): their outcomes by id.
    pub fn flush(&mut self) -> Result<Vec<(SeqId, Outcome)>> {
        match self.pending.take() {
            Some(p) => self.read_pending(p, false),
            None => Ok(Vec::new()),
        }
    }
}
