//! The memory limit enforced while generating ([`super::EngineOptions::memory_limit`]).
//!
//! MLX's allocators do not fail at the memory limit: on the CPU (`no_gpu/allocator.cpp`)
//! the limit is only stored and reported, and `malloc` takes whatever the system gives;
//! on Metal it is the point where cached buffers are given back before allocating
//! anyway. Past the machine's memory the process is killed (or MLX's `malloc` returns a
//! null buffer on the CPU), so an allocation failure never reaches us as an error we
//! could recover from. The engine therefore enforces the limit itself: MLX's peak
//! memory is reset before each step of a stage (MLX allocates the step's outputs on the
//! engine thread while its graph is evaluated or queued) and read after it. A step whose
//! peak went over the limit is treated as the allocation failure of its largest
//! sequence: when the prompt cache held enough of that memory, the cache gives it back
//! and every sequence goes on; otherwise that sequence alone fails with
//! [`crate::EngineError::Unavailable`] (HTTP 503), its caches are freed and the prompt
//! cache shrinks. The step's results of the other sequences are kept: the computation
//! itself succeeded.
use super::request::SeqId;
use super::stage::Stage;

/// What a step over the limit calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Over {
    /// The step stayed within the limit.
    No,
    /// The prompt cache gives back this many bytes; no sequence fails.
    Reclaim(u64),
    /// The largest sequence of the step fails with this message.
    Fail(String),
}

fn gb(b: u64) -> String {
    format!("{:.3} GB", b as f64 / 1e9)
}

/// The verdict on a step whose MLX peak memory was `peak` bytes under a limit of
/// `limit` bytes, `reclaimable` of them held by the prompt cache.
pub(crate) fn judge(limit: u64, peak: u64, reclaimable: u64) -> Over {
    if peak <= limit {
        return Over::No;
    }
    let over = peak - limit;
    if over <= reclaimable {
        return Over::Reclaim(over);
    }
    Over::Fail(format!(
        "out of memory: generating this request took the server's memory to {} (model weights, KV caches and activations of every running request), over the memory limit of {}; the request was stopped so the others can go on; send a shorter prompt or fewer max_tokens, or retry later",
        gb(peak),
        gb(limit)
    ))
}

/// Starts watching a step: MLX's peak memory counts from here (a no-op when no limit
/// is enforced).
pub(crate) fn watch(limit: Option<u64>) {
    if limit.is_some() {
        mlx_array::memory::reset_peak_memory();
    }
}

/// MLX's peak memory since [`watch`].
pub(crate) fn peak() -> u64 {
    mlx_array::memory::peak_memory() as u64
}

/// The sequence of `stage` among `candidates` that holds (or will hold) the most
/// tokens: its prompt and what it generated.
pub(crate) fn largest(stage: &mut dyn Stage, candidates: &[SeqId]) -> Option<SeqId> {
    candidates
        .iter()
        .filter_map(|&id| stage.get_mut(id).map(|s| (s.footprint(), id)))
        .max_by_key(|&(tokens, id)| (tokens, std::cmp::Reverse(id)))
        .map(|(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_over_the_limit_reclaims_the_prompt_cache_before_failing() {
        assert_eq!(judge(1000, 1000, 0), Over::No);
        assert_eq!(judge(1000, 1200, 300), Over::Reclaim(200));
        let Over::Fail(msg) = judge(1_000_000_000, 1_500_000_000, 100) else {
            panic!("a step 0.5 GB over with 100 bytes of prompt cache must fail");
        };
        assert!(msg.contains("out of memory"), "{msg}");
        assert!(
            msg.contains("1.500 GB") && msg.contains("1.000 GB"),
            "{msg}"
        );
    }
}
