//! The prompt cache's disk tier: every entry stored in the in-memory [`PromptCache`]
//! is also written (by a writer thread) to a directory as an mlx-lm prompt-cache file,
//! found again by token prefix after a restart, and evicted least-recently-used by
//! modification time under a byte budget.
//!
//! A file is named by a hash of the model key and its tokens
//! (`{hash:016x}-{n_tokens}.safetensors`) and records both in its metadata (`model`,
//! [`mlx_cache::TOKENS_KEY`], `cache_type`). The index is rebuilt at startup from the
//! files' headers only (no tensor is read). A file whose header is damaged or whose
//! length differs from what its header describes (truncated), whose name does not match
//! its tokens, whose caches do not fit the model's layers, or whose tensors fail to
//! load is logged, removed and ignored. Files are written under a temporary name
//! (`.tmp-*`, removed at startup) and renamed when complete.
//!
//! [`PromptCache`]: super::prompt_cache::PromptCache
use super::prompt_cache::CacheKind;
use mlx_cache::{CacheTensors, KvCache, PromptCache as LayerCaches};
use mlx_models::CacheSpec;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::SystemTime;

/// Where and how much the disk tier stores.
#[derive(Debug, Clone)]
pub struct DiskCacheOptions {
    /// The directory of the cache files (created if missing).
    pub dir: PathBuf,
    /// Bytes of files kept; the least recently used go beyond it.
    pub max_bytes: u64,
    /// Names the model (and adapter) the caches belong to; files of another key in the
    /// same directory are left alone.
    pub model_key: String,
}

/// Metadata keys of the files.
const MODEL_KEY: &str = "model";
const KIND_KEY: &str = "cache_type";
/// Writes waiting for the writer thread; more are dropped (the entry stays in memory).
const MAX_PENDING_WRITES: usize = 4;

struct DiskEntry {
    tokens: Vec<u32>,
    path: PathBuf,
    bytes: u64,
    used: SystemTime,
    trimmable: bool,
}

#[derive(Default)]
struct Index {
    entries: Vec<DiskEntry>,
    bytes: u64,
}

impl Index {
    fn remove_at(&mut self, i: usize) -> DiskEntry {
        let e = self.entries.swap_remove(i);
        self.bytes = self.bytes.saturating_sub(e.bytes);
        e
    }

    /// Removes the least recently used files until at most `max` bytes remain.
    fn evict_to(&mut self, max: u64) {
        while self.bytes > max && !self.entries.is_empty() {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].used)
                .unwrap_or(0);
            let e = self.remove_at(oldest);
            tracing::info!(
                "prompt cache (disk): evicted {} ({} tokens, {} bytes) to stay within {max} bytes",
                e.path.display(),
                e.tokens.len(),
                e.bytes
            );
            remove_file(&e.path);
        }
    }
}

struct Write {
    tokens: Vec<u32>,
    tensors: CacheTensors,
    trimmable: bool,
}

/// The disk tier (owned by the engine thread; its writer thread only writes files and
/// updates the index).
pub struct DiskCache {
    opts: DiskCacheOptions,
    specs: Vec<CacheSpec>,
    index: Arc<Mutex<Index>>,
    writes: Option<SyncSender<Write>>,
    writer: Option<JoinHandle<()>>,
}

/// A file loaded from the disk tier.
pub struct DiskHit {
    /// The tokens its caches hold.
    pub tokens: Vec<u32>,
    /// The caches.
    pub caches: LayerCaches,
    /// Its cache type.
    pub kind: CacheKind,
}

fn kind_name(k: CacheKind) -> &'static str {
    match k {
        CacheKind::Assistant => "assistant",
        CacheKind::User => "user",
        CacheKind::System => "system",
    }
}

fn kind_from_name(s: &str) -> CacheKind {
    match s {
        "user" => CacheKind::User,
        "system" => CacheKind::System,
        _ => CacheKind::Assistant,
    }
}

/// FNV-1a over the model key and the token ids: the content address of a file.
fn content_hash(model_key: &str, tokens: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |b: u8| h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    for b in model_key.bytes() {
        eat(b);
    }
    eat(0);
    for t in tokens {
        for b in t.to_le_bytes() {
            eat(b);
        }
    }
    h
}

/// The file name of `tokens` for `model_key`.
pub fn file_name(model_key: &str, tokens: &[u32]) -> String {
    format!(
        "{:016x}-{}.safetensors",
        content_hash(model_key, tokens),
        tokens.len()
    )
}

fn remove_file(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("prompt cache (disk): cannot remove {}: {e}", path.display());
        }
    }
}

/// Logs why `path` is ignored and removes it.
fn reject(path: &Path, why: &str) {
    tracing::warn!(
        "prompt cache (disk): ignoring and removing {}: {why}",
        path.display()
    );
    remove_file(path);
}

fn class_fits(class: &str, spec: &CacheSpec) -> bool {
    match spec {
        CacheSpec::Standard => matches!(class, "KVCache" | "QuantizedKVCache"),
        CacheSpec::Rotating { .. } => class == "RotatingKVCache",
        CacheSpec::Arrays { .. } => class == "ArraysCache",
        CacheSpec::Chunked { .. } => class == "ChunkedKVCache",
        CacheSpec::List(_) => class == "CacheList",
    }
}

fn classes_trimmable(classes: &[String]) -> bool {
    // Not ChunkedKVCache: one that dropped its front cannot be trimmed back safely (see
    // the prompt cache's `fetch_nearest`).
    classes
        .iter()
        .all(|c| matches!(c.as_str(), "KVCache" | "QuantizedKVCache"))
}

fn lock(index: &Mutex<Index>) -> MutexGuard<'_, Index> {
    index.lock().unwrap_or_else(|e| e.into_inner())
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl DiskCache {
    /// Opens (creating it if needed) the directory and indexes the files of this model
    /// whose layers fit `specs`; damaged ones and leftovers of interrupted writes are
    /// removed. Then evicts down to the budget and starts the writer thread.
    pub fn open(opts: DiskCacheOptions, specs: Vec<CacheSpec>) -> std::io::Result<DiskCache> {
        std::fs::create_dir_all(&opts.dir)?;
        let mut index = Index::default();
        let (mut others, mut rejected) = (0usize, 0usize);
        for item in std::fs::read_dir(&opts.dir)? {
            let path = item?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            if name.starts_with(".tmp-") {
                reject(&path, "an interrupted write");
                continue;
            }
            if !name.ends_with(".safetensors") || !path.is_file() {
                continue;
            }
            match Self::index_file(&opts, &specs, &path, &name) {
                Ok(Some(e)) => {
                    index.bytes += e.bytes;
                    index.entries.push(e);
                }
                Ok(None) => others += 1,
                Err(why) => {
                    rejected += 1;
                    reject(&path, &why);
                }
            }
        }
        tracing::info!(
            "prompt cache (disk): {} cached prompt(s), {} bytes in {} ({others} file(s) of \
             other models left alone, {rejected} damaged file(s) removed)",
            index.entries.len(),
            index.bytes,
            opts.dir.display()
        );
        index.evict_to(opts.max_bytes);
        let index = Arc::new(Mutex::new(index));
        let (tx, rx) = sync_channel::<Write>(MAX_PENDING_WRITES);
        let (dir, key, max) = (opts.dir.clone(), opts.model_key.clone(), opts.max_bytes);
        let idx = Arc::clone(&index);
        let writer = std::thread::Builder::new()
            .name("mlx-prompt-cache-writer".into())
            .spawn(move || write_loop(rx, &dir, &key, max, &idx))?;
        Ok(DiskCache {
            opts,
            specs,
            index,
            writes: Some(tx),
            writer: Some(writer),
        })
    }

    /// The entry of one file: `Ok(None)` for a file of another model, `Err(why)` for a
    /// file to remove.
    fn index_file(
        opts: &DiskCacheOptions,
        specs: &[CacheSpec],
        path: &Path,
        name: &str,
    ) -> Result<Option<DiskEntry>, String> {
        let header = mlx_cache::read_prompt_cache_header(path).map_err(|e| e.to_string())?;
        match header.metadata.get(MODEL_KEY) {
            Some(m) if *m == opts.model_key => {}
            Some(_) => return Ok(None),
            None => return Err("no `model` metadata".into()),
        }
        let tokens = header
            .metadata
            .get(mlx_cache::TOKENS_KEY)
            .and_then(|t| mlx_cache::decode_tokens(t))
            .ok_or("no readable `tokens` metadata")?;
        if tokens.is_empty() {
            return Err("it holds no tokens".into());
        }
        if file_name(&opts.model_key, &tokens) != name {
            return Err("its name is not the hash of its tokens".into());
        }
        Self::check_classes(specs, &header.classes)?;
        let used = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(Some(DiskEntry {
            trimmable: classes_trimmable(&header.classes),
            tokens,
            path: path.to_path_buf(),
            bytes: header.file_bytes,
            used,
        }))
    }

    fn check_classes(specs: &[CacheSpec], classes: &[String]) -> Result<(), String> {
        if classes.len() != specs.len() {
            return Err(format!(
                "it has {} cache layers, the model {}",
                classes.len(),
                specs.len()
            ));
        }
        match classes
            .iter()
            .zip(specs)
            .position(|(c, s)| !class_fits(c, s))
        {
            Some(i) => Err(format!(
                "layer {i} is a {} cache, the model's is {:?}",
                classes[i], specs[i]
            )),
            None => Ok(()),
        }
    }

    /// Files indexed.
    pub fn len(&self) -> usize {
        lock(&self.index).entries.len()
    }

    /// Whether no file is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the indexed files.
    pub fn nbytes(&self) -> u64 {
        lock(&self.index).bytes
    }

    /// The prompt tokens the best file would give `prompt` (mlx-lm's rules: a shorter
    /// prefix as is, a longer or diverging entry trimmed to the common prefix when its
    /// caches can be trimmed, always leaving one token to process), and its path, when
    /// that beats `have` tokens.
    fn best(&self, prompt: &[u32], have: usize) -> Option<PathBuf> {
        let index = lock(&self.index);
        let mut best: Option<(usize, &DiskEntry)> = None;
        for e in &index.entries {
            let lcp = common_prefix(&e.tokens, prompt);
            let usable = if lcp == e.tokens.len() && lcp < prompt.len() {
                lcp
            } else if e.trimmable {
                lcp.min(prompt.len().saturating_sub(1))
            } else {
                0
            };
            if usable > have && best.is_none_or(|(b, _)| usable > b) {
                best = Some((usable, e));
            }
        }
        best.map(|(_, e)| e.path.clone())
    }

    /// Loads the file that gives `prompt` more cached tokens than `have` (see
    /// `DiskCache::best`); a file that fails to load or to match is removed.
    pub fn fetch(&mut self, prompt: &[u32], have: usize) -> Option<DiskHit> {
        let path = self.best(prompt, have)?;
        match self.load(&path) {
            Ok(hit) => {
                let now = SystemTime::now();
                let mut index = lock(&self.index);
                if let Some(e) = index.entries.iter_mut().find(|e| e.path == path) {
                    e.used = now;
                }
                drop(index);
                if let Err(e) = std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(now))
                {
                    tracing::debug!("prompt cache (disk): cannot touch {}: {e}", path.display());
                }
                tracing::info!(
                    "prompt cache (disk): loaded {} tokens from {}",
                    hit.tokens.len(),
                    path.display()
                );
                Some(hit)
            }
            Err(why) => {
                self.forget(&path);
                if path.exists() {
                    reject(&path, &why);
                }
                None
            }
        }
    }

    fn forget(&self, path: &Path) {
        let mut index = lock(&self.index);
        if let Some(i) = index.entries.iter().position(|e| e.path == path) {
            index.remove_at(i);
        }
    }

    /// Reads `path` and checks it against its index entry and the model.
    fn load(&self, path: &Path) -> Result<DiskHit, String> {
        let want = {
            let index = lock(&self.index);
            let e = index
                .entries
                .iter()
                .find(|e| e.path == path)
                .ok_or("it left the index")?;
            e.tokens.clone()
        };
        // The header again: the file may have been replaced since the scan.
        let header = mlx_cache::read_prompt_cache_header(path).map_err(|e| e.to_string())?;
        let (caches, meta) = mlx_cache::load_prompt_cache(path).map_err(|e| e.to_string())?;
        let tokens = meta
            .get(mlx_cache::TOKENS_KEY)
            .and_then(|t| mlx_cache::decode_tokens(t))
            .ok_or("no readable `tokens` metadata")?;
        if tokens != want || meta.get(MODEL_KEY) != Some(&self.opts.model_key) {
            return Err("its tokens or model differ from the index".into());
        }
        Self::check_classes(&self.specs, &header.classes)?;
        check_caches(&caches, tokens.len())?;
        // Read every tensor now, so a damaged file fails here and not mid-generation.
        let state: Vec<_> = caches.iter().flat_map(|c| c.state()).collect();
        mlx_array::transforms::eval(&state.iter().collect::<Vec<_>>())
            .map_err(|e| format!("its tensors cannot be read: {e}"))?;
        Ok(DiskHit {
            tokens,
            caches,
            kind: kind_from_name(meta.get(KIND_KEY).map_or("", String::as_str)),
        })
    }

    /// Queues `caches` (holding `tokens`) to be written, unless a file for these tokens
    /// exists (it is marked used) or the writer is behind. The caches are evaluated
    /// here (the engine thread); the writer runs no MLX operation.
    pub fn store(&mut self, tokens: &[u32], caches: &[Box<dyn KvCache>], kind: CacheKind) {
        if tokens.is_empty() {
            return;
        }
        let path = self.opts.dir.join(file_name(&self.opts.model_key, tokens));
        {
            let mut index = lock(&self.index);
            if let Some(e) = index.entries.iter_mut().find(|e| e.path == path) {
                e.used = SystemTime::now();
                return;
            }
        }
        let mut meta = BTreeMap::new();
        meta.insert(MODEL_KEY.to_string(), self.opts.model_key.clone());
        meta.insert(
            mlx_cache::TOKENS_KEY.to_string(),
            mlx_cache::encode_tokens(tokens),
        );
        meta.insert(KIND_KEY.to_string(), kind_name(kind).to_string());
        let tic = std::time::Instant::now();
        let tensors = CacheTensors::new(caches, &meta).and_then(|mut t| {
            t.evaluate()?;
            Ok(t)
        });
        tracing::debug!(
            "prompt cache (disk): {} tokens made ready to write in {:.1} ms on the engine thread",
            tokens.len(),
            tic.elapsed().as_secs_f64() * 1e3
        );
        let tensors = match tensors {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(
                    "prompt cache (disk): cannot store {} tokens: {e}",
                    tokens.len()
                );
                return;
            }
        };
        if tensors.nbytes() as u64 > self.opts.max_bytes {
            tracing::debug!(
                "prompt cache (disk): {} tokens ({} bytes) exceed the budget; not stored",
                tokens.len(),
                tensors.nbytes()
            );
            return;
        }
        let write = Write {
            tokens: tokens.to_vec(),
            tensors,
            trimmable: mlx_cache::can_trim_prompt_cache(caches),
        };
        let Some(tx) = &self.writes else { return };
        match tx.try_send(write) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => tracing::debug!(
                "prompt cache (disk): {MAX_PENDING_WRITES} writes pending; {} tokens not stored",
                tokens.len()
            ),
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!("prompt cache (disk): the writer thread is gone");
                self.writes = None;
            }
        }
    }

    /// Waits until every queued write is on disk (at shutdown, and in tests).
    pub fn flush(&mut self) {
        self.writes = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Every layer must hold exactly `n` positions (a recurrent state has no offset).
fn check_caches(caches: &[Box<dyn KvCache>], n: usize) -> Result<(), String> {
    for (i, c) in caches.iter().enumerate() {
        if c.class_name() == "ArraysCache" {
            continue;
        }
        if c.offset() as usize != n {
            return Err(format!(
                "layer {i} holds {} positions for {n} tokens",
                c.offset()
            ));
        }
    }
    Ok(())
}

fn write_loop(rx: Receiver<Write>, dir: &Path, key: &str, max: u64, index: &Mutex<Index>) {
    for w in rx {
        let name = file_name(key, &w.tokens);
        let path = dir.join(&name);
        let tmp = dir.join(format!(".tmp-{}-{name}", std::process::id()));
        let written = w
            .tensors
            .write(&tmp)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                let f = std::fs::File::open(&tmp).map_err(|e| e.to_string())?;
                f.sync_all().map_err(|e| e.to_string())?;
                let bytes = f.metadata().map_err(|e| e.to_string())?.len();
                std::fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
                Ok(bytes)
            });
        let bytes = match written {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("prompt cache (disk): cannot write {}: {e}", path.display());
                remove_file(&tmp);
                continue;
            }
        };
        let mut index = lock(index);
        // A trimmable entry serves its prefixes: those files only take room (mlx-lm's
        // `insert_cache` drops them from memory the same way).
        if w.trimmable {
            let mut i = 0;
            while i < index.entries.len() {
                let e = &index.entries[i];
                if e.tokens.len() < w.tokens.len() && w.tokens.starts_with(&e.tokens) {
                    let e = index.remove_at(i);
                    remove_file(&e.path);
                } else {
                    i += 1;
                }
            }
        }
        if let Some(i) = index.entries.iter().position(|e| e.path == path) {
            index.remove_at(i);
        }
        index.bytes += bytes;
        index.entries.push(DiskEntry {
            tokens: w.tokens,
            path,
            bytes,
            used: SystemTime::now(),
            trimmable: w.trimmable,
        });
        tracing::debug!("prompt cache (disk): wrote {name} ({bytes} bytes)");
        index.evict_to(max);
    }
}

/// The user metadata of a prompt-cache file, from its header (no tensor is read); an
/// error names what is wrong with the file.
pub fn file_metadata(path: &Path) -> Result<BTreeMap<String, String>, String> {
    mlx_cache::read_prompt_cache_header(path)
        .map(|h| h.metadata)
        .map_err(|e| e.to_string())
}

/// Reads a prompt-cache file that records its tokens ([`mlx_cache::TOKENS_KEY`], written
/// by `mlx-cache-prompt --record-tokens` and the disk tier) for a model with layers `specs`: its tokens
/// and evaluated caches, or what is wrong with it.
pub fn load_tokens_file(
    path: &Path,
    specs: &[CacheSpec],
) -> Result<(Vec<u32>, LayerCaches), String> {
    let header = mlx_cache::read_prompt_cache_header(path).map_err(|e| e.to_string())?;
    let tokens = match header.metadata.get(mlx_cache::TOKENS_KEY) {
        Some(t) => mlx_cache::decode_tokens(t).ok_or_else(|| {
            format!(
                "its `{}` metadata is not a list of token ids",
                mlx_cache::TOKENS_KEY
            )
        })?,
        None => {
            return Err(format!(
                "it does not record the tokens it holds (no `{}` metadata; files from \
                 mlx_lm.cache_prompt lack it): re-create it with mlx-cache-prompt --record-tokens",
                mlx_cache::TOKENS_KEY
            ))
        }
    };
    if tokens.is_empty() {
        return Err("it holds no tokens".into());
    }
    DiskCache::check_classes(specs, &header.classes)
        .map_err(|e| format!("it does not fit the model: {e}"))?;
    let (caches, _) = mlx_cache::load_prompt_cache(path).map_err(|e| e.to_string())?;
    check_caches(&caches, tokens.len())?;
    let state: Vec<_> = caches.iter().flat_map(|c| c.state()).collect();
    mlx_array::transforms::eval(&state.iter().collect::<Vec<_>>())
        .map_err(|e| format!("its tensors cannot be read: {e}"))?;
    Ok((tokens, caches))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_array::{ops::arange, Dtype};
    use mlx_cache::KVCache;

    const KEY: &str = "test-model";

    /// One layer holding `n` positions of distinct values.
    fn filled(n: i32) -> LayerCaches {
        let mut c = KVCache::new();
        let k = arange(0.0, f64::from(n * 2), 1.0, Dtype::Float32)
            .unwrap()
            .reshape(&[1, 1, n, 2])
            .unwrap();
        c.update(&k, &k).unwrap();
        vec![Box::new(c)]
    }

    fn open(dir: &Path, max_bytes: u64) -> DiskCache {
        let opts = DiskCacheOptions {
            dir: dir.to_path_buf(),
            max_bytes,
            model_key: KEY.into(),
        };
        DiskCache::open(opts, vec![CacheSpec::Standard]).unwrap()
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn stored_caches_are_found_by_prefix_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = open(dir.path(), 1 << 30);
        d.store(&[1, 2, 3, 4], &filled(4), CacheKind::Assistant);
        d.flush();
        drop(d);
        let mut d = open(dir.path(), 1 << 30);
        assert_eq!(d.len(), 1);
        // A longer prompt: the whole entry; a diverging one: trimmed later, found now.
        let hit = d.fetch(&[1, 2, 3, 4, 5], 0).unwrap();
        assert_eq!(hit.tokens, vec![1, 2, 3, 4]);
        assert_eq!(hit.caches[0].offset(), 4);
        let want = filled(4)[0].state()[0].to_vec::<f32>().unwrap();
        assert_eq!(hit.caches[0].state()[0].to_vec::<f32>().unwrap(), want);
        assert!(d.fetch(&[1, 2, 9], 0).is_some());
        // Nothing better than what memory already has, and nothing for another prompt.
        assert!(d.fetch(&[1, 2, 3, 4, 5], 4).is_none());
        assert!(d.fetch(&[7, 8, 9], 0).is_none());
    }

    #[test]
    fn truncated_damaged_and_misnamed_files_are_removed_at_startup() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = open(dir.path(), 1 << 30);
        d.store(&[1, 2, 3], &filled(3), CacheKind::Assistant);
        d.store(&[5, 6, 7, 8], &filled(4), CacheKind::Assistant);
        d.store(&[9, 9], &filled(2), CacheKind::Assistant);
        d.flush();
        drop(d);
        let a = dir.path().join(file_name(KEY, &[1, 2, 3]));
        let b = dir.path().join(file_name(KEY, &[5, 6, 7, 8]));
        let c = dir.path().join(file_name(KEY, &[9, 9]));
        let bytes = std::fs::read(&a).unwrap();
        std::fs::write(&a, &bytes[..bytes.len() - 3]).unwrap();
        let mut junk = std::fs::read(&b).unwrap();
        junk[8] = b'X'; // the JSON header's opening brace
        std::fs::write(&b, &junk).unwrap();
        std::fs::rename(&c, dir.path().join(file_name(KEY, &[9, 8]))).unwrap();
        std::fs::write(dir.path().join(".tmp-1-x.safetensors"), b"half").unwrap();
        let mut d = open(dir.path(), 1 << 30);
        assert!(d.is_empty());
        assert!(files(dir.path()).is_empty(), "{:?}", files(dir.path()));
        assert!(d.fetch(&[1, 2, 3, 4], 0).is_none());
    }

    #[test]
    fn a_file_whose_caches_do_not_hold_its_tokens_is_removed_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = [1u32, 2, 3];
        let mut meta = BTreeMap::new();
        meta.insert(MODEL_KEY.to_string(), KEY.to_string());
        meta.insert(
            mlx_cache::TOKENS_KEY.to_string(),
            mlx_cache::encode_tokens(&tokens),
        );
        let path = dir.path().join(file_name(KEY, &tokens));
        mlx_cache::save_prompt_cache(&path, &filled(2), &meta).unwrap();
        let mut d = open(dir.path(), 1 << 30);
        assert_eq!(d.len(), 1);
        assert!(d.fetch(&[1, 2, 3, 4], 0).is_none());
        assert!(d.is_empty());
        assert!(!path.exists());
    }

    #[test]
    fn a_preloaded_file_must_record_its_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.safetensors");
        let mut meta = BTreeMap::new();
        meta.insert("model".to_string(), "m".to_string());
        mlx_cache::save_prompt_cache(&path, &filled(3), &meta).unwrap();
        let err = load_tokens_file(&path, &[CacheSpec::Standard])
            .err()
            .unwrap();
        assert!(err.contains("mlx-cache-prompt"), "{err}");
        meta.insert(mlx_cache::TOKENS_KEY.into(), "[4,5,6]".into());
        mlx_cache::save_prompt_cache(&path, &filled(3), &meta).unwrap();
        let (tokens, caches) = load_tokens_file(&path, &[CacheSpec::Standard]).unwrap();
        assert_eq!((tokens, caches[0].offset()), (vec![4, 5, 6], 3));
        let err = load_tokens_file(&path, &[CacheSpec::Standard; 2])
            .err()
            .unwrap();
        assert!(err.contains("cache layers"), "{err}");
    }

    #[test]
    fn least_recently_used_files_go_beyond_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = open(dir.path(), 1 << 30);
        d.store(&[1, 1], &filled(2), CacheKind::Assistant);
        d.flush();
        drop(d);
        let one = std::fs::metadata(dir.path().join(file_name(KEY, &[1, 1])))
            .unwrap()
            .len();
        // Room for two files of this size.
        let mut d = open(dir.path(), one * 2 + one / 2);
        d.store(&[2, 2], &filled(2), CacheKind::Assistant);
        d.flush();
        let mut d = open(dir.path(), one * 2 + one / 2);
        // Using [1, 1] makes [2, 2] the least recently used.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(d.fetch(&[1, 1, 5], 0).is_some());
        d.store(&[3, 3], &filled(2), CacheKind::Assistant);
        d.flush();
        let d = open(dir.path(), one * 2 + one / 2);
        assert_eq!(d.len(), 2);
        assert!(d.nbytes() <= one * 2 + one / 2);
        let left = files(dir.path());
        assert!(left.contains(&file_name(KEY, &[1, 1])), "{left:?}");
        assert!(left.contains(&file_name(KEY, &[3, 3])), "{left:?}");
    }

    #[test]
    fn a_longer_entry_replaces_its_prefixes_and_other_models_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut other = DiskCache::open(
            DiskCacheOptions {
                dir: dir.path().to_path_buf(),
                max_bytes: 1 << 30,
                model_key: "other".into(),
            },
            vec![CacheSpec::Standard],
        )
        .unwrap();
        other.store(&[1, 2], &filled(2), CacheKind::Assistant);
        other.flush();
        let mut d = open(dir.path(), 1 << 30);
        assert!(d.is_empty());
        d.store(&[1, 2], &filled(2), CacheKind::User);
        d.flush();
        let mut d = open(dir.path(), 1 << 30);
        d.store(&[1, 2, 3, 4], &filled(4), CacheKind::Assistant);
        d.flush();
        let d = open(dir.path(), 1 << 30);
        assert_eq!(d.len(), 1);
        assert_eq!(files(dir.path()).len(), 2, "the other model's file stays");
    }
}
