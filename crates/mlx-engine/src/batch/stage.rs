//! What every stage of the scheduler (prefilling, decoding, decoding alone) offers, so
//! that cancellation, removal and the routing of results work by sequence id the same
//! way for all of them.
use super::request::{Finish, PromptLogprob, SeqId, TokenOut};
use super::sequence::Sequence;
use crate::error::{EngineError, Result};
use mlx_cache::PromptCache;

/// What a stage's step produced for one sequence.
pub(crate) enum Outcome {
    /// A prefill chunk finished: `processed` of `total` uncached prompt tokens.
    Progress {
        /// Prompt tokens processed so far.
        processed: usize,
        /// Prompt tokens to process.
        total: usize,
    },
    /// The prompt is processed (requests with prompt log-probabilities or
    /// `max_tokens` 0); `finish` set when the sequence ends here.
    Prompt {
        /// Log-probabilities of prompt tokens `1..`.
        logprobs: Vec<PromptLogprob>,
        /// `Some` when no token is to be generated.
        finish: Option<Finish>,
    },
    /// A token.
    Token(TokenOut),
    /// The sequence failed (the others go on).
    Failed(EngineError),
    /// A prefill chunk ended a prompt segment: the caches holding `tokens`, to store
    /// in the prompt cache as `kind`.
    Checkpoint {
        /// The prompt tokens the caches hold.
        tokens: Vec<u32>,
        /// A copy of the sequence's caches.
        caches: PromptCache,
        /// Their kind.
        kind: super::prompt_cache::CacheKind,
    },
}

/// How a sequence leaves a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leave {
    /// Finished: its caches go to the prompt cache.
    Finished,
    /// Dropped (cancelled, failed, or its receiver gone).
    Dropped,
}

/// A sequence that left a stage, with its caches when it finished.
pub(crate) struct Left {
    /// The sequence.
    pub seq: Sequence,
    /// Its caches (finished sequences only).
    pub caches: Option<PromptCache>,
}

/// A stage holding sequences by id.
pub(crate) trait Stage {
    /// Sequences in the stage.
    fn len(&self) -> usize;
    /// Bytes of KV cache the stage holds.
    fn nbytes(&self) -> usize;
    /// The sequence `id`, if it is here.
    fn get_mut(&mut self, id: SeqId) -> Option<&mut Sequence>;
    /// Ids of the sequences its next step runs (those waiting in it excluded).
    fn stepping(&self) -> Vec<SeqId>;
    /// Ids of the sequences no longer wanted.
    fn cancelled(&self) -> Vec<SeqId>;
    /// Takes sequences out by id (ids not here are ignored). An `Err` means the
    /// stage's shared state is broken: the caller drains it.
    fn remove(&mut self, leaving: &[(SeqId, Leave)]) -> Result<Vec<Left>>;
    /// Empties the stage, handing every sequence back (after a failure).
    fn drain(&mut self) -> Vec<Sequence>;
}

/// The rows of `leaving` that `position` finds, each once and in `leaving`'s order, with
/// how each leaves; and the indices of the batch's `n` rows that stay, in order.
pub(crate) fn leaving_rows(
    n: usize,
    leaving: &[(SeqId, Leave)],
    position: impl Fn(SeqId) -> Option<usize>,
) -> (Vec<(usize, Leave)>, Vec<usize>) {
    let mut gone: Vec<(usize, Leave)> = Vec::with_capacity(leaving.len());
    for &(id, how) in leaving {
        if let Some(i) = position(id).filter(|i| !gone.iter().any(|(j, _)| j == i)) {
            gone.push((i, how));
        }
    }
    let keep = (0..n)
        .filter(|i| !gone.iter().any(|(j, _)| j == i))
        .collect();
    (gone, keep)
}

/// Keeps the items of `rows` at `keep` (in that order) and hands back every item by its
/// former index, the kept ones taken out.
pub(crate) fn keep_in_place<T>(rows: &mut Vec<T>, keep: &[usize]) -> Vec<Option<T>> {
    let mut all: Vec<Option<T>> = std::mem::take(rows).into_iter().map(Some).collect();
    *rows = keep.iter().filter_map(|&i| all[i].take()).collect();
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaving_rows_take_each_found_row_once_and_keep_the_rest_in_order() {
        // Rows 0..5 hold ids 10..15; id 99 is not in the batch; row 3 is named twice.
        let position = |id: SeqId| (10..15).position(|x| x == id.0);
        let leaving = [
            (SeqId(13), Leave::Finished),
            (SeqId(99), Leave::Dropped),
            (SeqId(11), Leave::Dropped),
            (SeqId(13), Leave::Dropped),
        ];
        let (gone, keep) = leaving_rows(5, &leaving, position);
        assert_eq!(gone, vec![(3, Leave::Finished), (1, Leave::Dropped)]);
        assert_eq!(keep, vec![0, 2, 4]);
        let mut rows = vec!["a", "b", "c", "d", "e"];
        let all = keep_in_place(&mut rows, &keep);
        assert_eq!(rows, vec!["a", "c", "e"]);
        assert_eq!(all, vec![None, Some("b"), None, Some("d"), None]);
    }
}
