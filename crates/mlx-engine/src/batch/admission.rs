//! Memory admission: before a waiting sequence gets a slot, the memory its KV cache
//! and prefill will take is estimated and compared with what the memory limit leaves
//! free. A sequence that can never fit (more than the limit leaves beside the weights)
//! fails with [`crate::EngineError::Unavailable`] (HTTP 503) instead of running the
//! process out of memory; one that fits once running sequences finish waits.

/// What a sequence costs in memory, per architecture, and the bound to stay under.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryAdmission {
    /// The memory limit (MLX's, or the server's `--memory-limit-mb`), in bytes.
    pub limit_bytes: u64,
    /// KV-cache bytes per token of a sequence (keys and values of every layer).
    pub kv_bytes_per_token: u64,
    /// Transient bytes per token of a prefill chunk (hidden states, MLP activations).
    pub activation_bytes_per_token: u64,
    /// Bytes per (query, key) pair of attention scores in a prefill chunk (all heads).
    pub score_bytes_per_pair: u64,
    /// Bytes of one row of logits (and its log-probabilities).
    pub logits_bytes_per_row: u64,
}

/// What to do with a waiting sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// It fits now.
    Now,
    /// It fits once running sequences free their memory.
    Later,
    /// It can never fit: the message says why.
    Never(String),
}

fn gb(b: u64) -> String {
    format!("{:.3} GB", b as f64 / 1e9)
}

impl MemoryAdmission {
    /// Bytes a sequence of `prompt` tokens generating up to `max_tokens` takes: its
    /// whole KV cache, one prefill chunk of `step` tokens, a row of logits.
    pub fn estimate(&self, prompt: usize, max_tokens: usize, step: usize) -> u64 {
        let chunk = prompt.min(step.max(1)) as u64;
        let total = prompt.saturating_add(max_tokens) as u64;
        self.kv_bytes_per_token.saturating_mul(total)
            + self.activation_bytes_per_token.saturating_mul(chunk)
            + self
                .score_bytes_per_pair
                .saturating_mul(chunk)
                .saturating_mul(prompt as u64)
            + self.logits_bytes_per_row * 2
    }

    /// Whether `need` bytes fit: `active` bytes are in use now, of which `running`
    /// belong to running sequences' caches and `reclaimable` to the prompt cache;
    /// `pending` bytes are promised to sequences admitted but not yet allocated.
    pub fn decide(
        &self,
        need: u64,
        active: u64,
        running: u64,
        reclaimable: u64,
        pending: u64,
    ) -> Admit {
        let fixed = active.saturating_sub(running + reclaimable);
        let room = self.limit_bytes.saturating_sub(fixed);
        if need > room {
            return Admit::Never(format!(
                "not enough memory for this request: its prompt and max_tokens need about {} (KV cache and activations) but the memory limit of {} leaves {} beside the model weights; send a shorter prompt or fewer max_tokens",
                gb(need),
                gb(self.limit_bytes),
                gb(room)
            ));
        }
        let free = self.limit_bytes.saturating_sub(active + pending);
        if need <= free {
            Admit::Now
        } else {
            Admit::Later
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_grow_with_the_prompt_and_decide_against_the_limit() {
        let m = MemoryAdmission {
            limit_bytes: 1000,
            kv_bytes_per_token: 2,
            activation_bytes_per_token: 1,
            score_bytes_per_pair: 0,
            logits_bytes_per_row: 10,
        };
        assert_eq!(m.estimate(10, 5, 4), 2 * 15 + 4 + 20);
        // Weights take 600: 400 is the most a request can ever have.
        assert!(matches!(m.decide(500, 600, 0, 0, 0), Admit::Never(_)));
        // Running sequences (300 of the active 900) leave 100 now: wait.
        assert_eq!(m.decide(200, 900, 300, 0, 0), Admit::Later);
        assert_eq!(m.decide(100, 900, 300, 0, 0), Admit::Now);
        assert_eq!(m.decide(100, 900, 300, 0, 50), Admit::Later);
        // The prompt cache can be given back.
        assert_eq!(m.decide(350, 950, 0, 350, 0), Admit::Later);
    }
}
