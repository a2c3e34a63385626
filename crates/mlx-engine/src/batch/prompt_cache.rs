//! mlx-lm's `LRUPromptCache`: KV caches keyed by the tokens they hold, bounded by
//! entries and bytes, searched for the nearest prefix of a new prompt.
//!
//! Entries are few (`--prompt-cache-size`, default 10), so a linear scan replaces
//! mlx-lm's trie; the answers are the same (exact, longest shorter prefix, shortest
//! longer entry sharing the longest common prefix).
//!
//! Entries are also keyed by the resident adapter that computed them (`0`: the base
//! model): a prompt only reuses caches made with its own adapter.
use mlx_cache::{can_trim_prompt_cache, trim_prompt_cache, KvCache};
use std::collections::VecDeque;

/// Where an entry came from; decides eviction order like mlx-lm's `CacheOrder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKind {
    /// A finished generation (prompt + answer).
    Assistant,
    /// A conversation up to the last user turn.
    User,
    /// A system prompt.
    System,
}

const ORDER: [CacheKind; 3] = [CacheKind::Assistant, CacheKind::User, CacheKind::System];

struct Entry {
    adapter: u32,
    tokens: Vec<u32>,
    caches: Vec<Box<dyn KvCache>>,
    nbytes: usize,
    kind: CacheKind,
}

/// A cache found for a prompt: the KV caches (a private copy) and how many prompt
/// tokens they already hold.
pub struct CacheHit {
    /// Per-layer caches to continue from.
    pub caches: Vec<Box<dyn KvCache>>,
    /// Prompt tokens covered by `caches`.
    pub cached_tokens: usize,
}

/// The LRU prompt cache.
pub struct PromptCache {
    max_entries: usize,
    max_bytes: u64,
    entries: Vec<Entry>,
    // Per kind, oldest first: `(adapter, tokens)` keys.
    lru: [VecDeque<(u32, Vec<u32>)>; 3],
    nbytes: u64,
}

/// A private copy of per-layer caches ([`mlx_cache::copy_cache`] of each); `None` when
/// a layer's cache kind has no copy.
pub fn copy_caches(caches: &[Box<dyn KvCache>]) -> Option<Vec<Box<dyn KvCache>>> {
    caches
        .iter()
        .map(|c| mlx_cache::copy_cache(c.as_ref()))
        .collect()
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn kind_index(k: CacheKind) -> usize {
    ORDER.iter().position(|o| *o == k).unwrap_or(0)
}

impl PromptCache {
    /// A cache of at most `max_entries` entries and `max_bytes` bytes.
    pub fn new(max_entries: usize, max_bytes: Option<u64>) -> PromptCache {
        PromptCache {
            max_entries,
            max_bytes: max_bytes.unwrap_or(u64::MAX),
            entries: Vec::new(),
            lru: [VecDeque::new(), VecDeque::new(), VecDeque::new()],
            nbytes: 0,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    fn position(&self, adapter: u32, tokens: &[u32]) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.adapter == adapter && e.tokens == tokens)
    }

    /// [`PromptCache::fetch_nearest_for`] of the base model (no adapter).
    pub fn fetch_nearest(&self, tokens: &[u32]) -> Option<CacheHit> {
        self.fetch_nearest_for(0, tokens)
    }

    /// [`PromptCache::insert_for`] of the base model (no adapter).
    pub fn insert(&mut self, tokens: Vec<u32>, caches: Vec<Box<dyn KvCache>>, kind: CacheKind) {
        self.insert_for(0, tokens, caches, kind)
    }

    /// Drops every entry made with resident adapter `adapter`.
    pub fn remove_adapter(&mut self, adapter: u32) {
        while let Some(i) = self.entries.iter().position(|e| e.adapter == adapter) {
            self.remove_at(i);
        }
    }

    /// mlx-lm's `fetch_nearest_cache`: a copy of the best entry for `tokens`, trimmed
    /// to a common prefix when the entry runs past the prompt. At least one prompt
    /// token is always left to process. Only entries of `adapter` count.
    pub fn fetch_nearest_for(&self, adapter: u32, tokens: &[u32]) -> Option<CacheHit> {
        if tokens.is_empty() || self.entries.is_empty() {
            return None;
        }
        let mut shorter: Option<&Entry> = None;
        let mut common = 0usize;
        for e in self.entries.iter().filter(|e| e.adapter == adapter) {
            let lcp = common_prefix(&e.tokens, tokens);
            common = common.max(lcp);
            let is_prefix = lcp == e.tokens.len() && e.tokens.len() < tokens.len();
            if is_prefix
                && e.tokens.len() > 1
                && shorter.is_none_or(|s| s.tokens.len() < e.tokens.len())
            {
                shorter = Some(e);
            }
        }
        let short_len = shorter.map_or(0, |s| s.tokens.len());
        // Exact matches and longer entries: trim back so one token remains to process.
        let longer = self
            .entries
            .iter()
            .filter(|e| e.adapter == adapter)
            .filter(|e| {
                common > 0 && common_prefix(&e.tokens, tokens) == common && e.tokens.len() >= common
            })
            .filter(|e| e.tokens.len() > short_len)
            .min_by_key(|e| e.tokens.len());
        if let Some(e) = longer {
            // A chunked-attention cache that dropped its front (start_position > 0)
            // may no longer hold the start of the chunk a trimmed prefix ends in, so
            // it only serves as a shorter prefix. (mlx-lm's server trims it anyway and
            // then attends without those keys; we never answer from such a cache.)
            let front_kept = e.caches.iter().all(|c| c.start_position() == 0);
            if common > short_len && front_kept && can_trim_prompt_cache(&e.caches) {
                let prefix = (tokens.len() - 1).min(common);
                if prefix > short_len {
                    let mut caches = copy_caches(&e.caches)?;
                    let n = (e.tokens.len() - prefix) as i32;
                    if n > 0 {
                        trim_prompt_cache(&mut caches, n);
                    }
                    return Some(CacheHit {
                        caches,
                        cached_tokens: prefix,
                    });
                }
            }
        }
        let s = shorter?;
        Some(CacheHit {
            caches: copy_caches(&s.caches)?,
            cached_tokens: s.tokens.len(),
        })
    }

    /// mlx-lm's `insert_cache`: stores `caches` under `tokens` (replacing an entry with
    /// the same tokens), drops entries that are prefixes of it when the caches can be
    /// trimmed, then evicts down to the bounds. The entry belongs to `adapter`.
    pub fn insert_for(
        &mut self,
        adapter: u32,
        tokens: Vec<u32>,
        caches: Vec<Box<dyn KvCache>>,
        kind: CacheKind,
    ) {
        if self.max_entries == 0 || tokens.is_empty() {
            return;
        }
        let nbytes: usize = caches.iter().map(|c| c.nbytes()).sum();
        if let Some(i) = self.position(adapter, &tokens) {
            self.remove_at(i);
        }
        if can_trim_prompt_cache(&caches) {
            let prefixes: Vec<Vec<u32>> = self
                .entries
                .iter()
                .filter(|e| {
                    e.adapter == adapter
                        && e.tokens.len() < tokens.len()
                        && tokens.starts_with(&e.tokens)
                })
                .map(|e| e.tokens.clone())
                .collect();
            for p in prefixes {
                if let Some(i) = self.position(adapter, &p) {
                    self.remove_at(i);
                }
            }
        }
        self.nbytes += nbytes as u64;
        self.lru[kind_index(kind)].push_back((adapter, tokens.clone()));
        self.entries.push(Entry {
            adapter,
            tokens,
            caches,
            nbytes,
            kind,
        });
        self.trim_to(self.max_entries, self.max_bytes);
    }

    /// Evicts (mlx-lm's order) until at most `n_entries` entries and `n_bytes` bytes remain.
    pub fn trim_to(&mut self, n_entries: usize, n_bytes: u64) {
        while self.entries.len() > n_entries || (self.nbytes > n_bytes && !self.entries.is_empty())
        {
            let Some((adapter, tokens)) = self.pop_lru() else {
                break;
            };
            if let Some(i) = self.position(adapter, &tokens) {
                let e = self.entries.swap_remove(i);
                self.nbytes = self.nbytes.saturating_sub(e.nbytes as u64);
            }
        }
    }

    fn pop_lru(&mut self) -> Option<(u32, Vec<u32>)> {
        for i in 0..ORDER.len() - 1 {
            let (a, b) = (self.lru[i].len(), self.lru[i + 1].len());
            if a > 0 && a >= b {
                return self.lru[i].pop_front();
            }
        }
        self.lru
            .iter_mut()
            .rev()
            .find(|l| !l.is_empty())
            .and_then(|l| l.pop_front())
    }

    fn remove_at(&mut self, i: usize) {
        let e = self.entries.swap_remove(i);
        self.nbytes = self.nbytes.saturating_sub(e.nbytes as u64);
        let lru = &mut self.lru[kind_index(e.kind)];
        if let Some(p) = lru
            .iter()
            .position(|(a, t)| *a == e.adapter && *t == e.tokens)
        {
            lru.remove(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_array::{ops::ones, Dtype};
    use mlx_cache::KVCache;

    fn filled(n: i32) -> Vec<Box<dyn KvCache>> {
        let mut c = KVCache::new();
        let k = ones(&[1, 1, n, 2], Dtype::Float32).unwrap();
        c.update(&k, &k).unwrap();
        vec![Box::new(c)]
    }

    #[test]
    fn longer_entry_is_trimmed_to_the_common_prefix() {
        let mut pc = PromptCache::new(10, None);
        pc.insert(vec![1, 2, 3, 4, 5], filled(5), CacheKind::Assistant);
        let hit = pc.fetch_nearest(&[1, 2, 3, 9]).unwrap();
        assert_eq!(hit.cached_tokens, 3);
        assert_eq!(hit.caches[0].offset(), 3);
        // The stored entry is untouched by the trim of the copy.
        assert_eq!(pc.entries[0].caches[0].offset(), 5);
    }

    #[test]
    fn identical_prompt_leaves_one_token_to_process() {
        let mut pc = PromptCache::new(10, None);
        pc.insert(vec![1, 2, 3], filled(3), CacheKind::Assistant);
        let hit = pc.fetch_nearest(&[1, 2, 3]).unwrap();
        assert_eq!(hit.cached_tokens, 2);
        assert_eq!(hit.caches[0].offset(), 2);
    }

    #[test]
    fn shorter_prefix_is_reused_and_prefixes_are_dropped_on_insert() {
        let mut pc = PromptCache::new(10, None);
        pc.insert(vec![1, 2], filled(2), CacheKind::Assistant);
        let hit = pc.fetch_nearest(&[1, 2, 3, 4]).unwrap();
        assert_eq!(hit.cached_tokens, 2);
        pc.insert(vec![1, 2, 3, 4, 5], filled(5), CacheKind::Assistant);
        assert_eq!(pc.len(), 1);
        assert!(pc.fetch_nearest(&[7, 8]).is_none());
    }

    #[test]
    fn entries_of_another_adapter_are_not_reused() {
        let mut pc = PromptCache::new(10, None);
        pc.insert_for(3, vec![1, 2, 3], filled(3), CacheKind::Assistant);
        assert!(pc.fetch_nearest(&[1, 2, 3, 4]).is_none());
        assert!(pc.fetch_nearest_for(4, &[1, 2, 3, 4]).is_none());
        assert_eq!(
            pc.fetch_nearest_for(3, &[1, 2, 3, 4])
                .unwrap()
                .cached_tokens,
            3
        );
        // The same tokens under the base model are a separate entry.
        pc.insert(vec![1, 2, 3], filled(3), CacheKind::Assistant);
        assert_eq!(pc.len(), 2);
        pc.remove_adapter(3);
        assert_eq!(pc.len(), 1);
        assert!(pc.fetch_nearest_for(3, &[1, 2, 3, 4]).is_none());
        assert!(pc.fetch_nearest(&[1, 2, 3, 4]).is_some());
    }

    #[test]
    fn entries_are_evicted_oldest_first_beyond_the_bounds() {
        let mut pc = PromptCache::new(2, None);
        pc.insert(vec![1, 1], filled(2), CacheKind::Assistant);
        pc.insert(vec![2, 2], filled(2), CacheKind::Assistant);
        pc.insert(vec![3, 3], filled(2), CacheKind::Assistant);
        assert_eq!(pc.len(), 2);
        assert!(pc.fetch_nearest(&[1, 1, 5]).is_none());
        assert!(pc.fetch_nearest(&[3, 3, 5]).is_some());
        let per_entry = pc.nbytes() / 2;
        pc.trim_to(10, per_entry);
        assert_eq!(pc.len(), 1);
        assert!(pc.fetch_nearest(&[3, 3, 5]).is_some());
    }
}
