//! Stop sequences on token ids.
/// mlx-lm's `StopSequences` matcher: token sequences (EOS ids, encoded stop words), any
/// of which completing ends generation.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    sequences: Vec<Vec<u32>>,
    recent: Vec<u32>,
    longest: usize,
}

impl StopMatcher {
    /// A matcher over `sequences` (empty ones are ignored).
    pub fn new(sequences: Vec<Vec<u32>>) -> StopMatcher {
        let sequences: Vec<Vec<u32>> = sequences.into_iter().filter(|s| !s.is_empty()).collect();
        let longest = sequences.iter().map(Vec::len).max().unwrap_or(0);
        StopMatcher {
            sequences,
            recent: Vec::new(),
            longest,
        }
    }

    /// Consumes one token; the index of the sequence that just completed, if any.
    pub fn advance(&mut self, token: u32) -> Option<usize> {
        if self.longest == 0 {
            return None;
        }
        self.recent.push(token);
        if self.recent.len() > self.longest {
            let drop = self.recent.len() - self.longest;
            self.recent.drain(..drop);
        }
        self.sequences.iter().position(|s| self.recent.ends_with(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_matcher_finds_multi_token_sequences() {
        let mut m = StopMatcher::new(vec![vec![7], vec![1, 2, 3]]);
        assert_eq!(m.advance(1), None);
        assert_eq!(m.advance(2), None);
        assert_eq!(m.advance(3), Some(1));
        assert_eq!(m.advance(2), None);
        assert_eq!(m.advance(7), Some(0));
        let mut none = StopMatcher::new(vec![vec![]]);
        assert_eq!(none.advance(0), None);
    }
}
