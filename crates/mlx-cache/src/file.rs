//! Prompt-cache files in mlx-lm's layout (`save_prompt_cache` / `load_prompt_cache`).
//!
//! The file is a `.safetensors` whose tensors are the flattened states of the caches
//! (`"{layer}.{field}"`, quantized triples as `"{layer}.{field}.{k}"`) and whose string
//! metadata is the flattened list `[user_metadata, class_names, scalars]`:
//! `"0.{key}"` user entries, `"1.{layer}"` class names, `"2.0" = ""` then
//! `"2.{n}.0" = tensor key`, `"2.{n}.1" = "scalar" | "string" | "none"` marking the
//! tensors that stand for Python ints, strings and `None`s. A `ChunkedKVCache`'s state is
//! `(keys, values, offset, chunk_size, start_position)`. An `ArraysCache`'s state is
//! `(slots, left_padding, lengths)`: `"{layer}.0.{slot}"`, `"{layer}.1"`, `"{layer}.2"`.
//! A `CacheList`'s state is `[(state, class name), ...]`: cache `j`'s state under
//! `"{layer}.{j}.0"` and its class name, a string, as `"{layer}.{j}.1"`.
use crate::error::{CacheError, Result};
use crate::{
    ArraysCache, CacheList, ChunkedKVCache, ConcatenateKVCache, KVCache, KvCache, PromptCache,
    QuantTriple, QuantizedKVCache, RotatingKVCache,
};
use mlx_array::{io, Array, Dtype};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One leaf of a cache's state tree.
enum Leaf {
    Array(Array),
    Int(i64),
    Str(String),
    None,
}

fn opt_leaf(a: Option<&Array>) -> Leaf {
    a.map_or(Leaf::None, |a| Leaf::Array(a.clone()))
}

/// Pushes a quantized triple (or `None`) under `prefix`.
fn push_triple(out: &mut Vec<(String, Leaf)>, prefix: String, t: Option<&QuantTriple>) {
    match t {
        Some(t) => {
            for (k, a) in t.iter().enumerate() {
                out.push((format!("{prefix}.{k}"), Leaf::Array(a.clone())));
            }
        }
        None => out.push((prefix, Leaf::None)),
    }
}

/// The flattened state of cache `i`, in mlx-lm's `state` order.
fn flatten_state(i: usize, c: &dyn KvCache) -> Result<Vec<(String, Leaf)>> {
    let mut out = Vec::new();
    flatten_into(&mut out, &i.to_string(), i, c)?;
    Ok(out)
}

/// Pushes the state of `c` (cache `index` of the file, or one of its list's) under
/// `i`, a key prefix.
fn flatten_into(
    out: &mut Vec<(String, Leaf)>,
    i: &str,
    index: usize,
    c: &dyn KvCache,
) -> Result<()> {
    let any = c.as_any();
    let key = |j: usize| format!("{i}.{j}");
    if let Some(c) = any.downcast_ref::<KVCache>() {
        out.push((key(0), opt_leaf(c.keys.as_ref())));
        out.push((key(1), opt_leaf(c.values.as_ref())));
        out.push((key(2), Leaf::Int(c.offset.into())));
    } else if let Some(c) = any.downcast_ref::<RotatingKVCache>() {
        out.push((key(0), opt_leaf(c.keys.as_ref())));
        out.push((key(1), opt_leaf(c.values.as_ref())));
        for (j, v) in [c.offset, c.keep, c.max_size, c.idx]
            .into_iter()
            .enumerate()
        {
            out.push((key(j + 2), Leaf::Int(v.into())));
        }
    } else if let Some(c) = any.downcast_ref::<QuantizedKVCache>() {
        push_triple(out, key(0), c.keys.as_ref());
        push_triple(out, key(1), c.values.as_ref());
        for (j, v) in [c.offset, c.group_size(), c.bits()].into_iter().enumerate() {
            out.push((key(j + 2), Leaf::Int(v.into())));
        }
    } else if let Some(c) = any.downcast_ref::<ChunkedKVCache>() {
        // state = (keys, values, offset, chunk_size, start_position), whole buffers
        out.push((key(0), opt_leaf(c.keys.as_ref())));
        out.push((key(1), opt_leaf(c.values.as_ref())));
        for (j, v) in [c.offset, c.chunk_size, c.start_position]
            .into_iter()
            .enumerate()
        {
            out.push((key(j + 2), Leaf::Int(v.into())));
        }
    } else if let Some(c) = any.downcast_ref::<ConcatenateKVCache>() {
        out.push((key(0), opt_leaf(c.keys.as_ref())));
        out.push((key(1), opt_leaf(c.values.as_ref())));
    } else if let Some(c) = any.downcast_ref::<ArraysCache>() {
        // state = (cache list, left_padding, lengths)
        for (j, a) in c.state.cache.iter().enumerate() {
            out.push((format!("{i}.0.{j}"), opt_leaf(a.as_ref())));
        }
        out.push((key(1), opt_leaf(c.state.left_padding.as_ref())));
        out.push((key(2), opt_leaf(c.state.lengths.as_ref())));
    } else if let Some(c) = any.downcast_ref::<CacheList>() {
        // state = [(cache.state, class name), ...]
        for (j, sub) in c.caches().iter().enumerate() {
            flatten_into(out, &format!("{i}.{j}.0"), index, sub.as_ref())?;
            out.push((
                format!("{i}.{j}.1"),
                Leaf::Str(sub.class_name().to_string()),
            ));
        }
    } else {
        return Err(CacheError::NotSerializable {
            index,
            class: c.class_name(),
        });
    }
    Ok(())
}

/// Writes `caches` and `metadata` to `path` exactly like mlx-lm's
/// `save_prompt_cache(file_name, cache, metadata)`.
pub fn save_prompt_cache(
    path: impl AsRef<Path>,
    caches: &[Box<dyn KvCache>],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    CacheTensors::new(caches, metadata)?.write(path)
}

/// The tensors and metadata of a prompt-cache file before they are written: made (and
/// [evaluated](CacheTensors::evaluate)) on the thread that owns MLX, so that another
/// thread can [write](CacheTensors::write) them without running an MLX operation.
pub struct CacheTensors {
    arrays: Vec<(String, Array)>,
    meta: Vec<(String, String)>,
}

impl CacheTensors {
    /// The flattened state of `caches` with `metadata`, in mlx-lm's layout.
    pub fn new(caches: &[Box<dyn KvCache>], metadata: &BTreeMap<String, String>) -> Result<Self> {
        let mut arrays: Vec<(String, Array)> = Vec::new();
        let mut meta: Vec<(String, String)> = Vec::new();
        for (k, v) in metadata {
            meta.push((format!("0.{k}"), v.clone()));
        }
        meta.push(("2.0".into(), String::new()));
        let mut n_scalars = 0;
        for (i, c) in caches.iter().enumerate() {
            meta.push((format!("1.{i}"), c.class_name().to_string()));
            for (key, leaf) in flatten_state(i, c.as_ref())? {
                let (array, kind) = match leaf {
                    Leaf::Array(a) => (a, None),
                    Leaf::Int(v) => (Array::scalar_i64(v, Dtype::Int32)?, Some("scalar")),
                    Leaf::Str(s) => {
                        let codes: Vec<i32> = s.chars().map(|ch| ch as i32).collect();
                        (Array::from_vec(codes)?, Some("string"))
                    }
                    Leaf::None => (Array::from_slice::<f32>(&[], &[0])?, Some("none")),
                };
                if let Some(kind) = kind {
                    n_scalars += 1;
                    meta.push((format!("2.{n_scalars}.0"), key.clone()));
                    meta.push((format!("2.{n_scalars}.1"), kind.to_string()));
                }
                arrays.push((key, array));
            }
        }
        Ok(CacheTensors { arrays, meta })
    }

    /// Makes every tensor row-contiguous and evaluates it, so that writing runs no MLX
    /// operation.
    pub fn evaluate(&mut self) -> Result<()> {
        for (_, a) in &mut self.arrays {
            *a = a.contiguous()?;
        }
        let refs: Vec<&Array> = self.arrays.iter().map(|(_, a)| a).collect();
        mlx_array::transforms::eval(&refs)?;
        Ok(())
    }

    /// Bytes of the tensors.
    pub fn nbytes(&self) -> usize {
        self.arrays.iter().map(|(_, a)| a.nbytes()).sum()
    }

    /// Writes the file (MLX appends `.safetensors` to a path without that suffix).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        io::save_safetensors(
            path,
            self.arrays.iter().map(|(k, a)| (k.as_str(), a)),
            self.meta.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )?;
        Ok(())
    }
}

/// The parsed `__metadata__` of a prompt-cache file.
struct Meta {
    user: BTreeMap<String, String>,
    classes: Vec<String>,
    /// `(tensor key, kind)` in file order.
    scalars: Vec<(String, String)>,
}

fn parse_meta(path: &Path, raw: BTreeMap<String, String>) -> Result<Meta> {
    let bad = |message: String| CacheError::BadFile {
        path: path.to_path_buf(),
        message,
    };
    let stale = || {
        bad(
            "it was written by an older mlx-lm (meta_state layout); re-create it with \
             mlx-lm 0.32 or this runtime"
                .into(),
        )
    };
    let mut user = BTreeMap::new();
    let mut classes = BTreeMap::new();
    let mut scalars: BTreeMap<usize, (Option<String>, Option<String>)> = BTreeMap::new();
    let mut have_placeholder = false;
    for (k, v) in raw {
        let Some((head, rest)) = k.split_once('.') else {
            return Err(bad(format!("unexpected metadata key `{k}`")));
        };
        match head {
            "0" => {
                user.insert(rest.to_string(), v);
            }
            "1" => {
                let i: usize = rest.parse().map_err(|_| {
                    if rest.contains('.') {
                        stale()
                    } else {
                        bad(format!("metadata key `{k}` is not `1.<layer>`"))
                    }
                })?;
                classes.insert(i, v);
            }
            "2" => match rest.split_once('.') {
                None if rest == "0" && v.is_empty() => have_placeholder = true,
                None => return Err(stale()),
                Some((n, field)) => {
                    let n: usize = n
                        .parse()
                        .map_err(|_| bad(format!("metadata key `{k}` is not `2.<n>.<0|1>`")))?;
                    let e = scalars.entry(n).or_default();
                    match field {
                        "0" => e.0 = Some(v),
                        "1" => e.1 = Some(v),
                        _ => return Err(bad(format!("metadata key `{k}` is not `2.<n>.<0|1>`"))),
                    }
                }
            },
            _ => return Err(bad(format!("unexpected metadata key `{k}`"))),
        }
    }
    if !have_placeholder {
        return Err(bad(
            "metadata key `2.0` (the scalar list marker) is missing".into(),
        ));
    }
    let n = classes.len();
    if classes.keys().copied().ne(0..n) {
        return Err(bad(format!(
            "class names are not numbered 0..{n}: {:?}",
            classes.keys()
        )));
    }
    let mut sc = Vec::new();
    for (n, entry) in scalars {
        match entry {
            (Some(pos), Some(kind)) => sc.push((pos, kind)),
            _ => return Err(bad(format!("scalar entry 2.{n} lacks its key or its kind"))),
        }
    }
    Ok(Meta {
        user,
        classes: classes.into_values().collect(),
        scalars: sc,
    })
}

/// Reads the value of an integer scalar tensor.
fn to_int(a: &Array) -> mlx_array::Result<i64> {
    if a.dtype().is_floating() {
        let f = a.astype(Dtype::Float64)?.item::<f64>()?;
        if f.fract() != 0.0 {
            return Err(mlx_array::Error::InvalidArgument(format!(
                "{f} is not an integer"
            )));
        }
        return Ok(f as i64);
    }
    a.astype(Dtype::Int64)?.item::<i64>()
}

/// Reads a prompt-cache file written by mlx-lm's `save_prompt_cache` (or by
/// [`save_prompt_cache`]); returns the caches and the user metadata.
///
/// A file with another layout, an unknown cache class, or inconsistent state is refused
/// with an error naming the offending key.
pub fn load_prompt_cache(
    path: impl AsRef<Path>,
) -> Result<(PromptCache, BTreeMap<String, String>)> {
    let path = path.as_ref();
    let (arrays, raw) = io::load_safetensors(path)?;
    let meta = parse_meta(path, raw)?;
    let bad = |message: String| CacheError::BadFile {
        path: path.to_path_buf(),
        message,
    };

    let mut leaves: BTreeMap<String, Leaf> = arrays
        .into_iter()
        .map(|(k, a)| (k, Leaf::Array(a)))
        .collect();
    for (pos, kind) in &meta.scalars {
        let Some(Leaf::Array(a)) = leaves.remove(pos) else {
            return Err(bad(format!(
                "scalar entry names tensor `{pos}`, which is absent"
            )));
        };
        let leaf = match kind.as_str() {
            "scalar" => Leaf::Int(to_int(&a).map_err(|e| bad(format!("scalar `{pos}`: {e}")))?),
            "string" => {
                let codes = a.astype(Dtype::Int64)?.to_vec::<i64>()?;
                Leaf::Str(
                    codes
                        .into_iter()
                        .map(|c| {
                            u32::try_from(c)
                                .ok()
                                .and_then(char::from_u32)
                                .unwrap_or('\u{fffd}')
                        })
                        .collect(),
                )
            }
            "none" => Leaf::None,
            other => return Err(bad(format!("unknown scalar kind `{other}` for `{pos}`"))),
        };
        leaves.insert(pos.clone(), leaf);
    }

    let n = meta.classes.len();
    let mut per_cache: Vec<BTreeMap<String, Leaf>> = (0..n).map(|_| BTreeMap::new()).collect();
    for (k, leaf) in leaves {
        let (i, rest) = k.split_once('.').unwrap_or((k.as_str(), ""));
        let slot = i.parse::<usize>().ok().and_then(|i| per_cache.get_mut(i));
        match slot {
            Some(m) if !rest.is_empty() => {
                m.insert(rest.to_string(), leaf);
            }
            _ => return Err(bad(format!("tensor `{k}` belongs to no cache of the file"))),
        }
    }

    let mut caches: Vec<Box<dyn KvCache>> = Vec::with_capacity(n);
    for (i, (class, state)) in meta.classes.iter().zip(per_cache).enumerate() {
        caches.push(build_cache(path, i, class, state)?);
    }
    Ok((caches, meta.user))
}

/// Rebuilds cache `i` of the file (or one of its list's caches) of class `class` from
/// its state leaves (keys relative to the cache).
fn build_cache(
    path: &Path,
    i: usize,
    class: &str,
    leaves: BTreeMap<String, Leaf>,
) -> Result<Box<dyn KvCache>> {
    let mut st = State {
        path,
        index: i,
        class,
        leaves,
    };
    let cache: Box<dyn KvCache> = match class {
        "KVCache" => {
            let (k, v) = (st.array("0")?, st.array("1")?);
            let offset = st.int("2")?;
            st.finish()?;
            st.check_kv(k.as_ref(), v.as_ref(), offset)?;
            Box::new(KVCache::from_parts(k, v, offset))
        }
        "RotatingKVCache" => {
            let (k, v) = (st.array("0")?, st.array("1")?);
            let (offset, keep, max_size, idx) =
                (st.int("2")?, st.int("3")?, st.int("4")?, st.int("5")?);
            st.finish()?;
            st.check_kv(k.as_ref(), v.as_ref(), 0)?;
            let len = k.as_ref().map_or(Ok(0), |k| k.dim(2))?;
            if max_size <= 0 || keep < 0 || offset < 0 || idx < 0 || idx > len.max(max_size) {
                return Err(st.err(format!(
                    "inconsistent state: offset {offset}, keep {keep}, max_size {max_size}, \
                     _idx {idx}, buffer length {len}"
                )));
            }
            Box::new(RotatingKVCache::from_parts(
                k, v, offset, keep, max_size, idx,
            ))
        }
        "QuantizedKVCache" => {
            let (k, v) = (st.triple("0")?, st.triple("1")?);
            let (offset, group_size, bits) = (st.int("2")?, st.int("3")?, st.int("4")?);
            st.finish()?;
            st.check_kv(k.as_ref().map(|t| &t[0]), v.as_ref().map(|t| &t[0]), offset)?;
            if group_size <= 0 || !(1..=8).contains(&bits) {
                return Err(st.err(format!("bad group_size {group_size} or bits {bits}")));
            }
            Box::new(QuantizedKVCache::from_parts(k, v, offset, group_size, bits))
        }
        "ChunkedKVCache" => {
            let (k, v) = (st.array("0")?, st.array("1")?);
            let (offset, chunk_size, start) = (st.int("2")?, st.int("3")?, st.int("4")?);
            st.finish()?;
            if chunk_size <= 0 || start < 0 || start > offset {
                return Err(st.err(format!(
                    "inconsistent state: offset {offset}, chunk_size {chunk_size}, \
                     start_position {start}"
                )));
            }
            st.check_kv(k.as_ref(), v.as_ref(), offset - start)?;
            Box::new(ChunkedKVCache::from_parts(k, v, offset, chunk_size, start))
        }
        "ConcatenateKVCache" => {
            let (k, v) = (st.array("0")?, st.array("1")?);
            st.finish()?;
            st.check_kv(k.as_ref(), v.as_ref(), 0)?;
            Box::new(ConcatenateKVCache::from_parts(k, v)?)
        }
        "ArraysCache" => {
            let mut slots = Vec::new();
            while st.leaves.contains_key(&format!("0.{}", slots.len())) {
                slots.push(st.array(&format!("0.{}", slots.len()))?);
            }
            if slots.is_empty() {
                return Err(st.err(format!("state `{i}.0` holds no slots")));
            }
            let (left_padding, lengths) = (st.array("1")?, st.array("2")?);
            st.finish()?;
            let rows = slots
                .iter()
                .flatten()
                .map(|a| a.dim(0))
                .collect::<Result<Vec<_>, _>>()?;
            if rows.windows(2).any(|w| w[0] != w[1]) {
                return Err(st.err(format!("state slots disagree on the batch size: {rows:?}")));
            }
            Box::new(ArraysCache::from_parts(slots, left_padding, lengths))
        }
        "CacheList" => {
            // [(state, class name), ...]: "{j}.0.*" and "{j}.1".
            let mut subs = Vec::new();
            loop {
                let j = subs.len();
                let Some(leaf) = st.leaves.remove(&format!("{j}.1")) else {
                    break;
                };
                let Leaf::Str(sub_class) = leaf else {
                    return Err(st.err(format!("state `{i}.{j}.1` should be a class name")));
                };
                let head = format!("{j}.0");
                let keys: Vec<String> = st
                    .leaves
                    .keys()
                    .filter(|k| *k == &head || k.starts_with(&format!("{head}.")))
                    .cloned()
                    .collect();
                let mut sub_leaves = BTreeMap::new();
                for k in keys {
                    if let Some(leaf) = st.leaves.remove(&k) {
                        let rest = k[head.len()..].trim_start_matches('.').to_string();
                        sub_leaves.insert(rest, leaf);
                    }
                }
                subs.push(build_cache(path, i, &sub_class, sub_leaves)?);
            }
            st.finish()?;
            if subs.is_empty() {
                return Err(st.err(format!("state `{i}` holds no caches")));
            }
            Box::new(CacheList::new(subs))
        }
        other => {
            return Err(CacheError::UnknownClass {
                path: path.to_path_buf(),
                index: i,
                class: other.to_string(),
            })
        }
    };
    Ok(cache)
}

/// The state leaves of one cache while it is rebuilt.
struct State<'a> {
    path: &'a Path,
    index: usize,
    class: &'a str,
    leaves: BTreeMap<String, Leaf>,
}

impl State<'_> {
    fn err(&self, what: String) -> CacheError {
        CacheError::BadFile {
            path: PathBuf::from(self.path),
            message: format!("cache {} ({}): {what}", self.index, self.class),
        }
    }

    fn array(&mut self, key: &str) -> Result<Option<Array>> {
        match self.leaves.remove(key) {
            Some(Leaf::Array(a)) => Ok(Some(a)),
            Some(Leaf::None) => Ok(None),
            Some(_) => Err(self.err(format!("state `{}.{key}` should be an array", self.index))),
            None => Err(self.err(format!("state `{}.{key}` is missing", self.index))),
        }
    }

    fn int(&mut self, key: &str) -> Result<i32> {
        match self.leaves.remove(key) {
            Some(Leaf::Int(v)) => i32::try_from(v).map_err(|_| {
                self.err(format!(
                    "state `{}.{key}` = {v} is out of range",
                    self.index
                ))
            }),
            Some(_) => Err(self.err(format!("state `{}.{key}` should be an integer", self.index))),
            None => Err(self.err(format!("state `{}.{key}` is missing", self.index))),
        }
    }

    fn triple(&mut self, key: &str) -> Result<Option<QuantTriple>> {
        if let Some(Leaf::None) = self.leaves.get(key) {
            self.leaves.remove(key);
            return Ok(None);
        }
        let mut parts = Vec::with_capacity(3);
        for j in 0..3 {
            match self.array(&format!("{key}.{j}"))? {
                Some(a) => parts.push(a),
                None => return Err(self.err(format!("state `{}.{key}.{j}` is None", self.index))),
            }
        }
        let [a, b, c]: [Array; 3] = parts
            .try_into()
            .map_err(|_| self.err(format!("state `{}.{key}` is not a triple", self.index)))?;
        Ok(Some([a, b, c]))
    }

    /// Refuses leftover state entries (a class with a different state layout).
    fn finish(&self) -> Result<()> {
        match self.leaves.keys().next() {
            Some(k) => Err(self.err(format!("unexpected state entry `{}.{k}`", self.index))),
            None => Ok(()),
        }
    }

    /// Keys and values must both be present (or both absent), 4-D, of one batch/heads
    /// layout and length, and hold at least `offset` positions.
    fn check_kv(&self, k: Option<&Array>, v: Option<&Array>, offset: i32) -> Result<()> {
        match (k, v) {
            (None, None) if offset == 0 => Ok(()),
            (None, None) => Err(self.err(format!("no keys but offset {offset}"))),
            (Some(k), Some(v)) => {
                let (ks, vs) = (k.shape(), v.shape());
                if ks.len() != 4 || vs.len() != 4 || ks[..3] != vs[..3] {
                    return Err(self.err(format!(
                        "keys {ks:?} and values {vs:?} are not [B, heads, S, dim] alike"
                    )));
                }
                if offset < 0 || offset > ks[2] {
                    return Err(self.err(format!("offset {offset} outside the {} stored", ks[2])));
                }
                Ok(())
            }
            _ => Err(self.err("keys and values must both be present or both None".into())),
        }
    }
}

/// The user-metadata key under which a prompt-cache file records the token ids its
/// caches hold (written by `mlx-cache-prompt` and the server's disk tier; mlx-lm's
/// loader ignores it). Files from `mlx_lm.cache_prompt` do not have it.
pub const TOKENS_KEY: &str = "tokens";

/// Token ids as the [`TOKENS_KEY`] metadata value: a JSON list (`[1,2,3]`).
pub fn encode_tokens(tokens: &[u32]) -> String {
    let mut s = String::with_capacity(tokens.len() * 6 + 2);
    s.push('[');
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&t.to_string());
    }
    s.push(']');
    s
}

/// Parses a [`TOKENS_KEY`] value written by [`encode_tokens`]; `None` when it is not a
/// JSON list of token ids.
pub fn decode_tokens(text: &str) -> Option<Vec<u32>> {
    let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
    if inner.is_empty() {
        return Some(Vec::new());
    }
    inner.split(',').map(|t| t.trim().parse().ok()).collect()
}

/// What the header of a prompt-cache file says, read without loading any tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHeader {
    /// The user metadata (`"0.{key}"` entries, without the prefix).
    pub metadata: BTreeMap<String, String>,
    /// The class name of each cache, in layer order.
    pub classes: Vec<String>,
    /// The file's length in bytes.
    pub file_bytes: u64,
}

/// The largest safetensors header read (the safetensors format's own limit).
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// Reads the header of a prompt-cache file (cheap: the tensors are not read) and checks
/// that the file is complete: its length must be exactly what the header's tensor
/// offsets describe, so a truncated (or extended) file is refused.
pub fn read_prompt_cache_header(path: impl AsRef<Path>) -> Result<FileHeader> {
    use std::io::Read;
    let path = path.as_ref();
    let bad = |message: String| CacheError::BadFile {
        path: path.to_path_buf(),
        message,
    };
    let io_err = |e: std::io::Error| bad(format!("cannot read it: {e}"));
    let mut f = std::fs::File::open(path).map_err(io_err)?;
    let file_bytes = f.metadata().map_err(io_err)?.len();
    let mut len8 = [0u8; 8];
    f.read_exact(&mut len8)
        .map_err(|_| bad(format!("truncated: {file_bytes} bytes, no header length")))?;
    let header_len = u64::from_le_bytes(len8);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > file_bytes {
        return Err(bad(format!(
            "truncated or not a safetensors file: header of {header_len} bytes in a file \
             of {file_bytes}"
        )));
    }
    let mut raw = vec![0u8; header_len as usize];
    f.read_exact(&mut raw).map_err(io_err)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&raw)
        .map_err(|e| bad(format!("the safetensors header is not a JSON object: {e}")))?;
    let mut data_end = 0u64;
    let mut meta_raw = BTreeMap::new();
    for (k, v) in &header {
        if k == "__metadata__" {
            let obj = v
                .as_object()
                .ok_or_else(|| bad("`__metadata__` is not an object".into()))?;
            for (mk, mv) in obj {
                let s = mv
                    .as_str()
                    .ok_or_else(|| bad(format!("metadata `{mk}` is not a string")))?;
                meta_raw.insert(mk.clone(), s.to_string());
            }
            continue;
        }
        let end = v
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .and_then(|o| o.get(1))
            .and_then(|e| e.as_u64())
            .ok_or_else(|| bad(format!("tensor `{k}` has no data_offsets")))?;
        data_end = data_end.max(end);
    }
    let want = 8 + header_len + data_end;
    if want != file_bytes {
        return Err(bad(format!(
            "truncated or damaged: the header describes {want} bytes, the file has {file_bytes}"
        )));
    }
    let meta = parse_meta(path, meta_raw)?;
    Ok(FileHeader {
        metadata: meta.user,
        classes: meta.classes,
        file_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_array::ops::ones;

    fn one_layer(n: i32) -> Vec<Box<dyn KvCache>> {
        let mut c = KVCache::new();
        let k = ones(&[1, 1, n, 2], Dtype::Float32).unwrap();
        c.update(&k, &k).unwrap();
        vec![Box::new(c)]
    }

    #[test]
    fn tokens_round_trip_through_metadata_text() {
        assert_eq!(encode_tokens(&[1, 22, 333]), "[1,22,333]");
        assert_eq!(decode_tokens("[1, 22,333]"), Some(vec![1, 22, 333]));
        assert_eq!(decode_tokens("[]"), Some(vec![]));
        assert_eq!(decode_tokens("[1,x]"), None);
        assert_eq!(decode_tokens("1,2"), None);
    }

    #[test]
    fn header_is_read_without_the_tensors_and_truncation_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        let mut meta = BTreeMap::new();
        meta.insert(TOKENS_KEY.to_string(), encode_tokens(&[5, 6, 7]));
        save_prompt_cache(&path, &one_layer(3), &meta).unwrap();
        let h = read_prompt_cache_header(&path).unwrap();
        assert_eq!(h.classes, vec!["KVCache".to_string()]);
        assert_eq!(h.metadata[TOKENS_KEY], "[5,6,7]");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let err = read_prompt_cache_header(&path).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        std::fs::write(&path, &bytes[..5]).unwrap();
        let err = read_prompt_cache_header(&path).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        std::fs::write(&path, b"garbage that is not a safetensors file at all").unwrap();
        assert!(read_prompt_cache_header(&path).is_err());
    }
}
