//! mlx-lm's `CacheList`: one layer's several caches, which the layer reads as
//! `cache[0]`, `cache[1]`, ... (a sparse-attention layer's latent keys and values plus
//! its indexer's keys; a hybrid layer's recurrent state plus keys and values).
//!
//! The list only forwards: it is trimmable when every cache is, `trim` trims each (and
//! reports what the last one removed, as mlx-lm does), its size is the largest one's,
//! and it is empty when its first cache is. Its prompt-cache state is mlx-lm's
//! `[(state, class name), ...]`; batches merge, filter, extend and extract it cache by
//! cache (see [`crate::BatchPromptCache`]).
use mlx_array::Array;
use mlx_nn::cache::{AttnMask, KvCache, KvFetch, RopePosition};
use std::any::Any;

/// mlx-lm's `CacheList(*caches)`.
pub struct CacheList {
    pub(crate) caches: Vec<Box<dyn KvCache>>,
}

impl std::fmt::Debug for CacheList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let classes: Vec<&str> = self.caches.iter().map(|c| c.class_name()).collect();
        f.debug_struct("CacheList")
            .field("caches", &classes)
            .finish()
    }
}

impl CacheList {
    /// The list of `caches`, in the order the layer indexes them.
    pub fn new(caches: Vec<Box<dyn KvCache>>) -> CacheList {
        CacheList { caches }
    }

    /// The caches.
    pub fn caches(&self) -> &[Box<dyn KvCache>] {
        &self.caches
    }

    /// The caches, mutably.
    pub fn caches_mut(&mut self) -> &mut [Box<dyn KvCache>] {
        &mut self.caches
    }

    /// The caches, by value.
    pub fn into_caches(self) -> Vec<Box<dyn KvCache>> {
        self.caches
    }

    fn first(&self) -> mlx_array::Result<&dyn KvCache> {
        self.caches
            .first()
            .map(|c| c.as_ref())
            .ok_or_else(|| mlx_array::Error::InvalidArgument("an empty CacheList".into()))
    }
}

impl KvCache for CacheList {
    /// The largest offset of the caches (a recurrent state reports 0).
    fn offset(&self) -> i32 {
        self.caches.iter().map(|c| c.offset()).max().unwrap_or(0)
    }

    /// The first cache's RoPE offset (layers ask the cache they rotate for).
    fn rope_offset(&self) -> mlx_array::Result<RopePosition> {
        self.first()?.rope_offset()
    }

    /// Refused: a layer updates one of the list's caches (`cache[i]`), never the list.
    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> mlx_array::Result<KvFetch> {
        Err(mlx_array::Error::InvalidArgument(
            "a CacheList holds several caches: update one of them (cache[i])".into(),
        ))
    }

    /// The first cache's mask (models make theirs from the cache they attend over).
    fn make_mask(
        &self,
        n: i32,
        return_array: bool,
        window_size: Option<i32>,
    ) -> mlx_array::Result<AttnMask> {
        self.first()?.make_mask(n, return_array, window_size)
    }

    fn is_trimmable(&self) -> bool {
        self.caches.iter().all(|c| c.is_trimmable())
    }

    /// mlx-lm: trims every cache and returns what the last one removed.
    fn trim(&mut self, n: i32) -> i32 {
        let mut m = 0;
        for c in &mut self.caches {
            m = c.trim(n);
        }
        m
    }

    fn size(&self) -> i32 {
        self.caches.iter().map(|c| c.size()).max().unwrap_or(0)
    }

    fn nbytes(&self) -> usize {
        self.caches.iter().map(|c| c.nbytes()).sum()
    }

    fn is_empty(&self) -> bool {
        self.caches.first().is_none_or(|c| c.is_empty())
    }

    fn state(&self) -> Vec<Array> {
        self.caches.iter().flat_map(|c| c.state()).collect()
    }

    fn class_name(&self) -> &'static str {
        "CacheList"
    }

    fn sub_caches(&self) -> Option<&[Box<dyn KvCache>]> {
        Some(&self.caches)
    }

    fn sub_caches_mut(&mut self) -> Option<&mut [Box<dyn KvCache>]> {
        Some(&mut self.caches)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
