//! The per-layer caches of a decode batch (recurrent layers' [`ArraysCache`]s batch
//! as themselves, as in mlx-lm): mlx-lm's `_merge_caches`, `_extend_cache`
//! and the `filter` / `extract` loops of `GenerationBatch`, over every layer at once.
use crate::arrays::ArraysCache;
use crate::batch::{BatchKVCache, Roller};
use crate::batch_rotating::BatchRotatingKVCache;
use crate::error::{CacheError, Result};
use crate::kv::KVCache;
use crate::list::CacheList;
use crate::rotating::RotatingKVCache;
use crate::PromptCache;
use mlx_nn::cache::KvCache;

/// One batch cache per layer ([`BatchKVCache`] or [`BatchRotatingKVCache`]) holding the
/// same rows. Pass [`BatchPromptCache::layers_mut`] to a model's `forward` with inputs
/// `[rows, L]`.
#[derive(Default)]
pub struct BatchPromptCache {
    layers: Vec<Box<dyn KvCache>>,
    rows: usize,
}

impl std::fmt::Debug for BatchPromptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchPromptCache")
            .field("layers", &self.layers.len())
            .field("rows", &self.rows)
            .finish()
    }
}

/// Whether a single-sequence cache can join a batch: a [`KVCache`], an
/// [`ArraysCache`], or a [`RotatingKVCache`] that keeps no leading positions (mlx-lm:
/// the classes with a `merge`; quantized caches have none).
pub fn is_batchable(cache: &dyn KvCache) -> bool {
    let any = cache.as_any();
    any.is::<KVCache>()
        || any.is::<ArraysCache>()
        || any
            .downcast_ref::<RotatingKVCache>()
            .is_some_and(|r| r.keep == 0)
        || any
            .downcast_ref::<CacheList>()
            .is_some_and(|l| l.caches().iter().all(|c| is_batchable(c.as_ref())))
}

fn layer_mismatch(layer: usize, what: &str) -> CacheError {
    CacheError::InvalidArgument(format!(
        "layer {layer}: {what} (batch caches must be BatchKVCache, BatchRotatingKVCache or \
         ArraysCache (or a CacheList of them) and rows must share the layer layout)"
    ))
}

impl BatchPromptCache {
    /// An empty batch (no rows, no layers).
    pub fn new() -> BatchPromptCache {
        BatchPromptCache::default()
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The per-layer caches, as models take them.
    pub fn layers_mut(&mut self) -> &mut [Box<dyn KvCache>] {
        &mut self.layers
    }

    /// The per-layer caches.
    pub fn layers(&self) -> &[Box<dyn KvCache>] {
        &self.layers
    }

    /// Bytes held by all layers.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(|c| c.nbytes()).sum()
    }

    /// Merges the caches of `rows` sequences (each one cache per layer) into one batch,
    /// layer by layer (mlx-lm's `_merge_caches`).
    pub fn merge(rows: &[&[Box<dyn KvCache>]]) -> Result<BatchPromptCache> {
        let Some(first) = rows.first() else {
            return Ok(BatchPromptCache::new());
        };
        let n_layers = first.len();
        if let Some(bad) = rows.iter().position(|r| r.len() != n_layers) {
            return Err(CacheError::InvalidArgument(format!(
                "row {bad} has {} layer caches, row 0 has {n_layers}",
                rows[bad].len()
            )));
        }
        let mut layers: Vec<Box<dyn KvCache>> = Vec::with_capacity(n_layers);
        for l in 0..n_layers {
            let caches: Vec<&dyn KvCache> = rows.iter().map(|r| r[l].as_ref()).collect();
            layers.push(merge_layer(&caches)?);
        }
        Ok(BatchPromptCache {
            layers,
            rows: rows.len(),
        })
    }

    /// Keeps only the rows `keep`, in that order; with none left the batch is emptied.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if let Some(&bad) = keep.iter().find(|&&i| i >= self.rows) {
            return Err(CacheError::InvalidArgument(format!(
                "row {bad} is not in a batch of {}",
                self.rows
            )));
        }
        if keep.is_empty() {
            self.layers.clear();
            self.rows = 0;
            return Ok(());
        }
        for (l, c) in self.layers.iter_mut().enumerate() {
            filter_layer(l, c.as_mut(), keep)?;
        }
        self.rows = keep.len();
        Ok(())
    }

    /// Appends the rows of `other` after this batch's (mlx-lm's `_extend_cache`).
    pub fn extend(&mut self, mut other: BatchPromptCache) -> Result<()> {
        if self.rows == 0 {
            *self = other;
            return Ok(());
        }
        if other.rows == 0 {
            return Ok(());
        }
        if other.layers.len() != self.layers.len() {
            return Err(CacheError::InvalidArgument(format!(
                "cannot extend a batch of {} layers with one of {}",
                self.layers.len(),
                other.layers.len()
            )));
        }
        let same_kinds = self
            .layers
            .iter()
            .zip(&other.layers)
            .all(|(a, b)| same_kind(a.as_ref(), b.as_ref()));
        if !same_kinds {
            return Err(CacheError::InvalidArgument(
                "cannot extend a batch with one of other cache classes".into(),
            ));
        }
        for (l, (a, b)) in self
            .layers
            .iter_mut()
            .zip(other.layers.iter_mut())
            .enumerate()
        {
            extend_layer(l, a.as_mut(), b.as_mut())?;
        }
        self.rows += other.rows;
        Ok(())
    }

    /// mlx-lm's `prepare(lengths=, right_padding=)` on every layer before a right-padded
    /// prefill chunk: `lengths` are the rows' real chunk lengths, `right_padding` what
    /// was added to reach the longest.
    pub fn prepare_right_padding(&mut self, lengths: &[i32], right_padding: &[i32]) -> Result<()> {
        for (l, c) in self.layers.iter_mut().enumerate() {
            prepare_layer(l, c.as_mut(), lengths, right_padding)?;
        }
        Ok(())
    }

    /// mlx-lm's `finalize` on every layer after a right-padded prefill chunk (the
    /// layers' rolls share their gather indices where they roll alike).
    pub fn finalize(&mut self) -> Result<()> {
        let mut roller = Roller::default();
        for (l, c) in self.layers.iter_mut().enumerate() {
            finalize_layer(l, c.as_mut(), &mut roller)?;
        }
        Ok(())
    }

    /// Moves the rows `indices` (in that order) into a batch of their own and keeps the
    /// others here (mlx-lm's `PromptProcessingBatch.split`).
    pub fn split(&mut self, indices: &[usize]) -> Result<BatchPromptCache> {
        if indices.is_empty() {
            return Ok(BatchPromptCache::new());
        }
        let rest: Vec<usize> = (0..self.rows).filter(|i| !indices.contains(i)).collect();
        let mut layers: Vec<Box<dyn KvCache>> = Vec::with_capacity(self.layers.len());
        for (l, c) in self.layers.iter().enumerate() {
            layers.push(clone_layer(l, c.as_ref())?);
        }
        let mut taken = BatchPromptCache {
            layers,
            rows: self.rows,
        };
        taken.filter(indices)?;
        self.filter(&rest)?;
        Ok(taken)
    }

    /// Row `row` as single-sequence caches (one per layer) holding only its real
    /// positions, e.g. to store in a prompt cache (mlx-lm's `extract_cache`).
    pub fn extract(&self, row: usize) -> Result<PromptCache> {
        if row >= self.rows {
            return Err(CacheError::InvalidArgument(format!(
                "row {row} is not in a batch of {}",
                self.rows
            )));
        }
        self.layers
            .iter()
            .enumerate()
            .map(|(l, c)| extract_layer(l, c.as_ref(), row))
            .collect()
    }
}

/// One layer's batch cache made of the rows' caches of that layer (a [`CacheList`]
/// merges cache by cache, as mlx-lm's `CacheList.merge`).
fn merge_layer(caches: &[&dyn KvCache]) -> Result<Box<dyn KvCache>> {
    let Some(first) = caches.first() else {
        return Err(CacheError::InvalidArgument("merging no caches".into()));
    };
    let plain: Option<Vec<&KVCache>> = caches.iter().map(|c| c.as_any().downcast_ref()).collect();
    if let Some(plain) = plain {
        return Ok(Box::new(BatchKVCache::merge(&plain)?));
    }
    let arrays: Option<Vec<&ArraysCache>> =
        caches.iter().map(|c| c.as_any().downcast_ref()).collect();
    if let Some(arrays) = arrays {
        return Ok(Box::new(ArraysCache::merge(&arrays)?));
    }
    let rotating: Option<Vec<&RotatingKVCache>> =
        caches.iter().map(|c| c.as_any().downcast_ref()).collect();
    if let Some(rot) = rotating {
        return Ok(Box::new(BatchRotatingKVCache::merge(&rot)?));
    }
    let lists: Option<Vec<&CacheList>> = caches.iter().map(|c| c.as_any().downcast_ref()).collect();
    if let Some(lists) = lists {
        let n = lists[0].caches().len();
        if lists.iter().any(|l| l.caches().len() != n) {
            return Err(CacheError::InvalidArgument(
                "CacheList.merge: the rows' lists hold different numbers of caches".into(),
            ));
        }
        let subs = (0..n)
            .map(|j| {
                let column: Vec<&dyn KvCache> =
                    lists.iter().map(|l| l.caches()[j].as_ref()).collect();
                merge_layer(&column)
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(Box::new(CacheList::new(subs)));
    }
    Err(CacheError::Unsupported {
        class: first.class_name(),
        op: "batching",
    })
}

/// The sub-caches of a batched [`CacheList`] layer.
fn list_mut(c: &mut dyn KvCache) -> Option<&mut CacheList> {
    c.as_any_mut().downcast_mut::<CacheList>()
}

fn filter_layer(l: usize, c: &mut dyn KvCache, keep: &[usize]) -> Result<()> {
    if let Some(list) = list_mut(c) {
        for sub in list.caches_mut() {
            filter_layer(l, sub.as_mut(), keep)?;
        }
        return Ok(());
    }
    let any = c.as_any_mut();
    if let Some(b) = any.downcast_mut::<BatchKVCache>() {
        b.filter(keep).map_err(Into::into)
    } else if let Some(b) = any.downcast_mut::<BatchRotatingKVCache>() {
        b.filter(keep).map_err(Into::into)
    } else if let Some(b) = any.downcast_mut::<ArraysCache>() {
        let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
        b.filter(&mlx_array::Array::from_slice(&idx, &[idx.len() as i32])?)
    } else {
        Err(layer_mismatch(l, "not a batch cache"))
    }
}

/// Whether two batch caches are of one kind (lists: cache by cache).
fn same_kind(a: &dyn KvCache, b: &dyn KvCache) -> bool {
    match (a.sub_caches(), b.sub_caches()) {
        (Some(x), Some(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(x, y)| same_kind(x.as_ref(), y.as_ref()))
        }
        (None, None) => {
            let (a, b) = (a.as_any(), b.as_any());
            (a.is::<BatchKVCache>() && b.is::<BatchKVCache>())
                || (a.is::<BatchRotatingKVCache>() && b.is::<BatchRotatingKVCache>())
                || (a.is::<ArraysCache>() && b.is::<ArraysCache>())
        }
        _ => false,
    }
}

fn extend_layer(l: usize, a: &mut dyn KvCache, b: &mut dyn KvCache) -> Result<()> {
    if let (Some(x), Some(y)) = (a.sub_caches_mut(), b.sub_caches_mut()) {
        for (x, y) in x.iter_mut().zip(y.iter_mut()) {
            extend_layer(l, x.as_mut(), y.as_mut())?;
        }
        return Ok(());
    }
    let (a, b) = (a.as_any_mut(), b.as_any_mut());
    if let Some(a) = a.downcast_mut::<BatchKVCache>() {
        return match b.downcast_ref::<BatchKVCache>() {
            Some(b) => a.extend(b).map_err(Into::into),
            None => Err(layer_mismatch(l, "different cache classes")),
        };
    }
    if let Some(a) = a.downcast_mut::<ArraysCache>() {
        return match b.downcast_ref::<ArraysCache>() {
            Some(b) => a.extend(b),
            None => Err(layer_mismatch(l, "different cache classes")),
        };
    }
    match (
        a.downcast_mut::<BatchRotatingKVCache>(),
        b.downcast_mut::<BatchRotatingKVCache>(),
    ) {
        (Some(a), Some(b)) => a.extend(b).map_err(Into::into),
        _ => Err(layer_mismatch(l, "different cache classes")),
    }
}

fn prepare_layer(
    l: usize,
    c: &mut dyn KvCache,
    lengths: &[i32],
    right_padding: &[i32],
) -> Result<()> {
    if let Some(list) = list_mut(c) {
        for sub in list.caches_mut() {
            prepare_layer(l, sub.as_mut(), lengths, right_padding)?;
        }
        return Ok(());
    }
    let any = c.as_any_mut();
    if let Some(b) = any.downcast_mut::<BatchKVCache>() {
        b.prepare(None, Some(lengths), Some(right_padding))
            .map_err(Into::into)
    } else if let Some(b) = any.downcast_mut::<BatchRotatingKVCache>() {
        b.prepare(None, Some(lengths), Some(right_padding))
            .map_err(Into::into)
    } else if let Some(b) = any.downcast_mut::<ArraysCache>() {
        b.prepare(lengths)
    } else {
        Err(layer_mismatch(l, "not a batch cache"))
    }
}

fn finalize_layer(l: usize, c: &mut dyn KvCache, roller: &mut Roller) -> Result<()> {
    if let Some(list) = list_mut(c) {
        for sub in list.caches_mut() {
            finalize_layer(l, sub.as_mut(), roller)?;
        }
        return Ok(());
    }
    let any = c.as_any_mut();
    if let Some(b) = any.downcast_mut::<BatchKVCache>() {
        b.finalize_with(roller).map_err(Into::into)
    } else if let Some(b) = any.downcast_mut::<BatchRotatingKVCache>() {
        b.finalize_with(roller).map_err(Into::into)
    } else if let Some(b) = any.downcast_mut::<ArraysCache>() {
        b.finalize();
        Ok(())
    } else {
        Err(layer_mismatch(l, "not a batch cache"))
    }
}

fn clone_layer(l: usize, c: &dyn KvCache) -> Result<Box<dyn KvCache>> {
    let any = c.as_any();
    if let Some(list) = any.downcast_ref::<CacheList>() {
        let subs = list
            .caches()
            .iter()
            .map(|s| clone_layer(l, s.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(CacheList::new(subs)))
    } else if let Some(b) = any.downcast_ref::<BatchKVCache>() {
        Ok(Box::new(b.clone()))
    } else if let Some(b) = any.downcast_ref::<BatchRotatingKVCache>() {
        Ok(Box::new(b.clone()))
    } else if let Some(b) = any.downcast_ref::<ArraysCache>() {
        Ok(Box::new(b.clone()))
    } else {
        Err(layer_mismatch(l, "not a batch cache"))
    }
}

fn extract_layer(l: usize, c: &dyn KvCache, row: usize) -> Result<Box<dyn KvCache>> {
    let any = c.as_any();
    if let Some(list) = any.downcast_ref::<CacheList>() {
        let subs = list
            .caches()
            .iter()
            .map(|s| extract_layer(l, s.as_ref(), row))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(CacheList::new(subs)))
    } else if let Some(b) = any.downcast_ref::<BatchKVCache>() {
        Ok(Box::new(b.extract(row)?))
    } else if let Some(b) = any.downcast_ref::<BatchRotatingKVCache>() {
        Ok(Box::new(b.extract(row)?))
    } else if let Some(b) = any.downcast_ref::<ArraysCache>() {
        Ok(Box::new(b.extract(row as i32)?))
    } else {
        Err(layer_mismatch(l, "not a batch cache"))
    }
}
