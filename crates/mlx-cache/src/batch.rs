//! mlx-lm's `BatchKVCache`: several sequences in one left-padded buffer, so that one
//! forward pass decodes all of them.
//!
//! Row `i` holds its positions at `left_padding[i]..idx` of the buffer; its RoPE offset
//! (`offsets[i]`, the number of real positions) differs per row, which is why models
//! take [`KvCache::rope_offset`] instead of [`KvCache::offset`]. Rows are dropped with
//! [`BatchKVCache::filter`], added with [`BatchKVCache::extend`] (after
//! [`BatchKVCache::merge`] of single-sequence caches) and taken out again with
//! [`BatchKVCache::extract`]. The bookkeeping (`left_padding`, `offset`) lives on the
//! host; the arrays built from it equal the int32 arrays mlx-lm keeps.
use crate::kv::{KVCache, STEP};
use crate::util::{dims4, grown_buffers, held, kv_pair_methods, seq, seq_update};
use mlx_array::{ops::arange, ops::zeros, Array, Dtype, Result};
use mlx_nn::cache::{AttnMask, KvCache, KvFetch, RopePosition};

/// The per-row state both batch caches keep (their buffers, left padding and offsets),
/// borrowed for the steps of mlx-lm's `prepare`, `filter` and `extend` they share.
pub(crate) struct Rows<'a> {
    /// The cache's class, for errors.
    pub(crate) what: &'static str,
    pub(crate) keys: &'a mut Option<Array>,
    pub(crate) values: &'a mut Option<Array>,
    pub(crate) left_padding: &'a mut Vec<i32>,
    pub(crate) offsets: &'a mut Vec<i32>,
    pub(crate) offset_array: &'a mut Option<Array>,
}

impl Rows<'_> {
    /// Checks that every given list has one entry per row, then adds `left_padding`
    /// (only to an empty cache).
    pub(crate) fn prepare(
        self,
        left_padding: Option<&[i32]>,
        lengths: Option<&[i32]>,
        right_padding: Option<&[i32]>,
    ) -> Result<()> {
        *self.offset_array = None;
        let rows = self.offsets.len();
        check_rows("left_padding", left_padding, rows)?;
        check_rows("lengths", lengths, rows)?;
        check_rows("right_padding", right_padding, rows)?;
        if let Some(lp) = left_padding {
            if self.keys.is_some() {
                return Err(mlx_array::Error::InvalidArgument(format!(
                    "Left padding can only be added to an empty {}",
                    self.what
                )));
            }
            add_left_padding(self.left_padding, self.offsets, lp);
        }
        Ok(())
    }

    /// Keeps only the rows `batch_indices` of the buffers, offsets and left padding.
    pub(crate) fn filter(self, batch_indices: &[usize]) -> Result<()> {
        if let (Some(k), Some(v)) = (self.keys.as_ref(), self.values.as_ref()) {
            let (k, v) = (take_rows(k, batch_indices)?, take_rows(v, batch_indices)?);
            *self.keys = Some(k);
            *self.values = Some(v);
        }
        let what = self.what;
        let pick = |v: &[i32]| -> Result<Vec<i32>> {
            batch_indices
                .iter()
                .map(|&i| {
                    v.get(i).copied().ok_or_else(|| {
                        mlx_array::Error::InvalidArgument(format!(
                            "{what}::filter: row {i} of {}",
                            v.len()
                        ))
                    })
                })
                .collect()
        };
        *self.offsets = pick(self.offsets)?;
        *self.offset_array = None;
        *self.left_padding = pick(self.left_padding)?;
        Ok(())
    }
}

/// What both sides of mlx-lm's `extend` are padded to: `max_size` positions whose used
/// ones end at `max_idx`; a side without buffers starts from empty `[B, h, 0, d]` /
/// `[B, h, 0, m]` ones of `dtype`.
pub(crate) struct ExtendTo {
    h: i32,
    d: i32,
    m: i32,
    dtype: Dtype,
    max_idx: i32,
    max_size: i32,
}

impl ExtendTo {
    /// For extending a cache whose key buffer is `keys` by one whose is `other_keys`,
    /// their used positions ending at `max_idx`: the sizes from the `(keys, values)` of
    /// `template` (the other side's when it has any), the dtype from `keys`, else the
    /// template's.
    pub(crate) fn new(
        keys: Option<&Array>,
        other_keys: Option<&Array>,
        template: (&Array, &Array),
        max_idx: i32,
    ) -> Result<ExtendTo> {
        let [_, h, _, d] = dims4(template.0, "keys")?;
        let len = |k: Option<&Array>| -> Result<i32> {
            Ok(match k {
                Some(k) => k.dim(2)?,
                None => 0,
            })
        };
        Ok(ExtendTo {
            h,
            d,
            m: template.1.dim(3)?,
            dtype: keys.map_or(template.0.dtype(), Array::dtype),
            max_idx,
            max_size: len(keys)?.max(len(other_keys)?),
        })
    }

    /// One side: its keys, values and left padding, moved right by `max_idx - idx`.
    pub(crate) fn pad(
        &self,
        kv: (Option<&Array>, Option<&Array>),
        rows: usize,
        idx: i32,
        left_padding: &[i32],
    ) -> Result<(Array, Array, Vec<i32>)> {
        let left = self.max_idx - idx;
        let (mut k, mut v) = match kv {
            (Some(k), Some(v)) => (k.clone(), v.clone()),
            _ => {
                let (bc, h) = (rows as i32, self.h);
                let k = zeros(&[bc, h, 0, self.d], self.dtype)?;
                (k, zeros(&[bc, h, 0, self.m], self.dtype)?)
            }
        };
        let mut right = self.max_size - k.dim(2)? - left;
        if right < 0 {
            k = seq(&k, None, Some(right))?;
            v = seq(&v, None, Some(right))?;
            right = 0;
        }
        if left != 0 || right != 0 {
            k = pad_seq(&k, left, right)?;
            v = pad_seq(&v, left, right)?;
        }
        Ok((k, v, left_padding.iter().map(|l| l + left).collect()))
    }
}

/// The [`KvCache`] methods both batch caches answer alike: the per-row RoPE offsets, and
/// `update_and_fetch` through their own `update`.
macro_rules! batch_kv_methods {
    () => {
        fn rope_offset(&self) -> Result<RopePosition> {
            per_row_offsets(self.offset_array.as_ref(), &self.offsets)
        }

        fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvFetch> {
            let (keys, values) = self.update(keys, values)?;
            Ok(KvFetch::Plain { keys, values })
        }
    };
}
pub(crate) use batch_kv_methods;

/// The zero buffers mlx-lm's `merge` writes each cache's row into: `[B, H, len, Dk]`
/// and `[B, H, len, Dv]`, with the largest `H`, `Dk`, `Dv` of the caches that hold
/// anything, in the dtype of the first of them (float32 when none does).
pub(crate) struct MergeBuffers {
    pub(crate) keys: Array,
    pub(crate) values: Array,
    h: i32,
    dk: i32,
    dv: i32,
}

impl MergeBuffers {
    /// Buffers for the `(keys, values)` of each row's cache, `len` positions long.
    pub(crate) fn new<'a>(
        kv: impl ExactSizeIterator<Item = (Option<&'a Array>, Option<&'a Array>)>,
        len: i32,
    ) -> Result<MergeBuffers> {
        let b = kv.len() as i32;
        let present: Vec<(&Array, &Array)> = kv.filter_map(|(k, v)| k.zip(v)).collect();
        let max_dim = |i: i32, values: bool| -> Result<i32> {
            present
                .iter()
                .map(|p| if values { p.1 } else { p.0 }.dim(i))
                .try_fold(0, |m, d| Ok(m.max(d?)))
        };
        let (h, dk, dv) = (max_dim(1, false)?, max_dim(3, false)?, max_dim(3, true)?);
        let dt = present.first().map_or(Dtype::Float32, |p| p.0.dtype());
        Ok(MergeBuffers {
            keys: zeros(&[b, h, len, dk], dt)?,
            values: zeros(&[b, h, len, dv], dt)?,
            h,
            dk,
            dv,
        })
    }

    /// Writes row `i`'s `keys` and `values` at positions `start..end`.
    pub(crate) fn put(
        &mut self,
        i: i32,
        start: i32,
        end: i32,
        keys: &Array,
        values: &Array,
    ) -> Result<()> {
        let lo = [i, 0, start, 0];
        let hi_k = [i + 1, self.h, end, self.dk];
        self.keys = self.keys.slice_update(keys, &lo, &hi_k, None)?;
        let hi_v = [i + 1, self.h, end, self.dv];
        self.values = self.values.slice_update(values, &lo, &hi_v, None)?;
        Ok(())
    }
}

/// mlx-lm's `BatchKVCache(left_padding)`.
#[derive(Debug, Clone)]
pub struct BatchKVCache {
    pub(crate) keys: Option<Array>,
    pub(crate) values: Option<Array>,
    pub(crate) left_padding: Vec<i32>,
    pub(crate) offsets: Vec<i32>,
    /// `offsets` as an int32 array, advanced with `+ S` on every update like mlx-lm's
    /// `offset` (rebuilt from the host values after any other change).
    pub(crate) offset_array: Option<Array>,
    pub(crate) idx: i32,
    /// Right padding of the rows of a prefill chunk, rolled away by `finalize`.
    pub(crate) right_padding: Option<Vec<i32>>,
}

/// An int32 `[n]` array of `v` (`mx.array(list)`).
pub(crate) fn int_array(v: &[i32]) -> Result<Array> {
    Array::from_slice(v, &[v.len() as i32])
}

/// Every row advanced by `s` positions: the host offsets, and their array by `+ s`
/// (mlx-lm's op) when one is live, else built from the host values.
pub(crate) fn advance_offsets(
    offsets: &mut [i32],
    offset_array: &mut Option<Array>,
    s: i32,
) -> Result<()> {
    for o in offsets.iter_mut() {
        *o += s;
    }
    *offset_array = Some(match offset_array.take() {
        Some(a) => a.add(s)?,
        None => int_array(offsets)?,
    });
    Ok(())
}

/// The per-row RoPE offsets: the live array, or one built from the host values.
pub(crate) fn per_row_offsets(
    offset_array: Option<&Array>,
    offsets: &[i32],
) -> Result<RopePosition> {
    Ok(RopePosition::PerRow(match offset_array {
        Some(a) => a.clone(),
        None => int_array(offsets)?,
    }))
}

/// `extra` more left padding for every row, each offset moved back by as much.
pub(crate) fn add_left_padding(left_padding: &mut [i32], offsets: &mut [i32], extra: &[i32]) {
    for ((l, o), p) in left_padding.iter_mut().zip(offsets.iter_mut()).zip(extra) {
        *l += p;
        *o -= p;
    }
}

/// `x[indices]` along the batch axis (Python indexing with a list of ints).
pub(crate) fn take_rows(x: &Array, rows: &[usize]) -> Result<Array> {
    let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
    x.take(&int_array(&idx)?, Some(0))
}

/// `x[i : i + 1]`.
pub(crate) fn row(x: &Array, i: i32) -> Result<Array> {
    let mut lo = vec![0; x.ndim()];
    let mut hi = x.shape();
    lo[0] = i;
    hi[0] = i + 1;
    x.slice(&lo, &hi, None)
}

/// mlx-lm's `dynamic_roll(x, shifts[:, None], axis=2)` for the arrays of one finalize
/// (every layer's keys and values, rolled by the same shifts): row `b` of each `[B, H,
/// T, D]` array rolled by `shifts[b]` positions along the sequence axis.
/// On the CPU each rolled row is its two slices concatenated (copies at memory speed, the
/// same values; MLX's CPU gather over a `[B, H, T, D]` cache is ~10x slower: a
/// speculative step's rejected drafts roll every layer's cache); on a GPU one gather
/// (one kernel, where the slices would be ~3 nodes a row), mlx-lm's, whose indices are
/// made once for all the arrays (~6 graph nodes an array fewer, on host-bound steps).
#[derive(Default)]
pub(crate) struct Roller {
    /// The last indices made: for arrays of this length, rolled by these shifts.
    idx: Option<(i32, Vec<i32>, Array)>,
}

impl Roller {
    #[track_caller]
    pub fn roll(&mut self, x: &Array, shifts: &[i32]) -> Result<Array> {
        if mlx_array::current_device()?.kind == mlx_array::DeviceType::Cpu {
            return roll_rows(x, shifts);
        }
        self.gather(x, shifts)
    }

    /// The roll as one gather, its indices made again only for another length or shifts.
    fn gather(&mut self, x: &Array, shifts: &[i32]) -> Result<Array> {
        let n = x.dim(2)?;
        let idx = match &self.idx {
            Some((m, s, idx)) if *m == n && s == shifts => idx.clone(),
            _ => {
                let idx = roll_index(n, shifts)?;
                self.idx = Some((n, shifts.to_vec(), idx.clone()));
                idx
            }
        };
        x.take_along_axis(&idx, 2)
    }
}

/// The gather indices of mlx-lm's `dynamic_roll` along an axis of length `n`: `[B, 1,
/// n, 1]`, row `b` at position `t` taking `(t - shifts[b]) mod n`.
fn roll_index(n: i32, shifts: &[i32]) -> Result<Array> {
    let positions = arange(0.0, n as f64, 1.0, Dtype::Int32)?.expand_dims(&[1])?;
    let shifts = int_array(shifts)?.reshape(&[-1, 1, 1, 1])?;
    positions.subtract(&shifts)?.remainder(n)
}

/// [`Roller::roll`] as mlx-lm computes it on any device: one gather.
#[cfg(test)]
fn roll_gather(x: &Array, shifts: &[i32]) -> Result<Array> {
    x.take_along_axis(&roll_index(x.dim(2)?, shifts)?, 2)
}

/// [`Roller::roll`] by slices: row `b` becomes `x[b, :, T - s:]` then `x[b, :, :T - s]`
/// for its shift `s` (mod `T`).
fn roll_rows(x: &Array, shifts: &[i32]) -> Result<Array> {
    let n = x.dim(2)?;
    if shifts.len() != x.dim(0)? as usize {
        return Err(mlx_array::Error::InvalidArgument(format!(
            "dynamic_roll: {} shifts for {} rows",
            shifts.len(),
            x.dim(0)?
        )));
    }
    if n == 0 || shifts.iter().all(|s| s.rem_euclid(n) == 0) {
        return Ok(x.clone());
    }
    let shape = x.shape();
    let (h, d) = (shape[1], shape[3]);
    let mut rows = Vec::with_capacity(shifts.len());
    for (b, s) in (0i32..).zip(shifts) {
        let s = s.rem_euclid(n);
        let part = |from: i32, to: i32| x.slice(&[b, 0, from, 0], &[b + 1, h, to, d], None);
        rows.push(if s == 0 {
            part(0, n)?
        } else {
            mlx_array::concatenate(&[&part(n - s, n)?, &part(0, n - s)?], 2)?
        });
    }
    let refs: Vec<&Array> = rows.iter().collect();
    mlx_array::concatenate(&refs, 0)
}

/// Checks mlx-lm's `prepare` arguments against the batch size.
pub(crate) fn check_rows(what: &str, v: Option<&[i32]>, rows: usize) -> Result<()> {
    match v {
        Some(v) if v.len() != rows => Err(mlx_array::Error::InvalidArgument(format!(
            "prepare: {what} has {} entries for {rows} rows",
            v.len()
        ))),
        _ => Ok(()),
    }
}

/// `mx.pad(x, [(0, 0), (0, 0), (left, right), (0, 0)])`.
pub(crate) fn pad_seq(x: &Array, left: i32, right: i32) -> Result<Array> {
    x.pad(
        &[0, 1, 2, 3],
        &[0, 0, left, 0],
        &[0, 0, right, 0],
        None,
        "constant",
    )
}

/// `MLX_BATCH_DECODE_MASK=array` (read once): decoding steps hand attention mlx-lm's
/// array mask alone (`AttnMask::Array`, neither none nor `LeftPadded`).
pub(crate) fn keep_decode_mask() -> bool {
    static KEEP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KEEP.get_or_init(|| std::env::var("MLX_BATCH_DECODE_MASK").as_deref() == Ok("array"))
}

/// `MLX_BATCH_VERIFY_MASK=array` (read once): a few positions a row hand attention
/// mlx-lm's array mask even while it splits them one query at a time.
fn keep_verify_mask() -> bool {
    static KEEP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KEEP.get_or_init(|| std::env::var("MLX_BATCH_VERIFY_MASK").as_deref() == Ok("array"))
}

/// mlx-lm's `create_causal_mask(N, offset, window_size, left_padding=lp)`: a boolean
/// `[B, 1, N, offset + N]` mask that also hides each row's padding.
#[track_caller]
pub fn batch_causal_mask(
    n: i32,
    offset: i32,
    window_size: Option<i32>,
    left_padding: &[i32],
) -> Result<Array> {
    let rinds = arange(0.0, (offset + n) as f64, 1.0, Dtype::Int32)?;
    let linds = if offset != 0 {
        arange(offset as f64, (offset + n) as f64, 1.0, Dtype::Int32)?
    } else {
        rinds.clone()
    };
    let linds = linds.expand_dims(&[1])?;
    let rinds = rinds.expand_dims(&[0])?;
    let mut mask = linds.greater_equal(&rinds)?;
    if let Some(w) = window_size {
        mask = mask.logical_and(&linds.less(&rinds.add(w)?)?)?;
    }
    let lp = int_array(left_padding)?.expand_dims(&[1, 2, 3])?;
    mask.logical_and(&lp.less_equal(&rinds)?)
}

impl BatchKVCache {
    /// An empty cache for rows left-padded by `left_padding` positions.
    pub fn new(left_padding: &[i32]) -> BatchKVCache {
        BatchKVCache {
            keys: None,
            values: None,
            left_padding: left_padding.to_vec(),
            offsets: left_padding.iter().map(|l| -l).collect(),
            offset_array: None,
            idx: 0,
            right_padding: None,
        }
    }

    fn rows(&mut self) -> Rows<'_> {
        Rows {
            what: "BatchKVCache",
            keys: &mut self.keys,
            values: &mut self.values,
            left_padding: &mut self.left_padding,
            offsets: &mut self.offsets,
            offset_array: &mut self.offset_array,
        }
    }

    /// mlx-lm's `prepare`: more left padding (only while empty), or the right padding of
    /// the next (right-padded) prefill chunk, which [`BatchKVCache::finalize`] turns into
    /// left padding. `lengths` (the chunk's real lengths) is not needed here.
    #[track_caller]
    pub fn prepare(
        &mut self,
        left_padding: Option<&[i32]>,
        lengths: Option<&[i32]>,
        right_padding: Option<&[i32]>,
    ) -> Result<()> {
        self.rows().prepare(left_padding, lengths, right_padding)?;
        if let Some(rp) = right_padding.filter(|rp| rp.iter().any(|&p| p > 0)) {
            self.right_padding = Some(rp.to_vec());
        }
        Ok(())
    }

    /// mlx-lm's `finalize`: rolls each row right by its chunk padding, so the padding
    /// positions end up before the row (masked) and the real ones end at `idx`.
    #[track_caller]
    pub fn finalize(&mut self) -> Result<()> {
        self.finalize_with(&mut Roller::default())
    }

    /// [`BatchKVCache::finalize`] rolling through `roller` (shared by a finalize's layers).
    #[track_caller]
    pub(crate) fn finalize_with(&mut self, roller: &mut Roller) -> Result<()> {
        let Some(padding) = self.right_padding.take() else {
            return Ok(());
        };
        self.offset_array = None;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            self.keys = Some(roller.roll(k, &padding)?);
            self.values = Some(roller.roll(v, &padding)?);
        }
        for ((o, l), p) in self
            .offsets
            .iter_mut()
            .zip(&mut self.left_padding)
            .zip(&padding)
        {
            *o -= p;
            *l += p;
        }
        Ok(())
    }

    /// Rows in the batch.
    pub fn batch_size(&self) -> usize {
        self.offsets.len()
    }

    /// Padding positions before each row's first real one.
    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    /// Real positions of each row (its RoPE offset).
    pub fn offsets(&self) -> &[i32] {
        &self.offsets
    }

    /// Positions used in the buffer (padding included).
    pub fn idx(&self) -> i32 {
        self.idx
    }

    /// The whole key buffer (including unused capacity), if any.
    pub fn keys(&self) -> Option<&Array> {
        self.keys.as_ref()
    }

    /// The whole value buffer (including unused capacity), if any.
    pub fn values(&self) -> Option<&Array> {
        self.values.as_ref()
    }

    /// Appends `keys`/`values` (`[B, H, S, D]`) for every row and returns the first
    /// `idx` positions, as mlx-lm's `update_and_fetch`.
    #[track_caller]
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let s = dims4(keys, "keys")?[2];
        let prev = self.idx;
        let old = (&self.keys, &self.values);
        let (mut kbuf, mut vbuf) = grown_buffers(old, keys, values, prev, STEP)?;
        advance_offsets(&mut self.offsets, &mut self.offset_array, s)?;
        self.idx += s;
        kbuf = seq_update(&kbuf, keys, prev, self.idx)?;
        vbuf = seq_update(&vbuf, values, prev, self.idx)?;
        self.keys = Some(kbuf);
        self.values = Some(vbuf);
        self.keys_and_values()
    }

    /// `keys[..., :idx, :]`, `values[..., :idx, :]`.
    #[track_caller]
    pub fn keys_and_values(&self) -> Result<(Array, Array)> {
        let (k, v) = held(&self.keys, &self.values, "BatchKVCache")?;
        Ok((seq(k, None, Some(self.idx))?, seq(v, None, Some(self.idx))?))
    }

    /// Keeps only the rows `batch_indices` (in that order), then drops the padding
    /// columns every remaining row has (mlx-lm's `filter`).
    #[track_caller]
    pub fn filter(&mut self, batch_indices: &[usize]) -> Result<()> {
        self.rows().filter(batch_indices)?;
        let min_left = self.left_padding.iter().copied().min().unwrap_or(0);
        if min_left > 0 {
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                self.keys = Some(seq(k, Some(min_left), None)?);
                self.values = Some(seq(v, Some(min_left), None)?);
            }
            self.idx -= min_left;
            for l in &mut self.left_padding {
                *l -= min_left;
            }
        }
        Ok(())
    }

    /// Appends the rows of `other` (mlx-lm's `extend`): both buffers are padded so their
    /// used positions end at the same column.
    #[track_caller]
    pub fn extend(&mut self, other: &BatchKVCache) -> Result<()> {
        if self.keys.is_none() && other.keys.is_none() {
            self.left_padding.extend_from_slice(&other.left_padding);
            self.offsets.extend_from_slice(&other.offsets);
            self.offset_array = None;
            return Ok(());
        }
        let max_idx = self.idx.max(other.idx);
        let template = match (&self.keys, &self.values, &other.keys, &other.values) {
            (_, _, Some(k), Some(v)) | (Some(k), Some(v), _, _) => (k, v),
            _ => {
                return Err(mlx_array::Error::InvalidArgument(
                    "BatchKVCache::extend: keys without values".into(),
                ))
            }
        };
        let to = ExtendTo::new(self.keys.as_ref(), other.keys.as_ref(), template, max_idx)?;
        let pad = |c: &BatchKVCache| {
            let kv = (c.keys.as_ref(), c.values.as_ref());
            to.pad(kv, c.offsets.len(), c.idx, &c.left_padding)
        };
        let (k1, v1, lp1) = pad(self)?;
        let (k2, v2, lp2) = pad(other)?;
        self.keys = Some(mlx_array::concatenate(&[&k1, &k2], 0)?);
        self.values = Some(mlx_array::concatenate(&[&v1, &v2], 0)?);
        self.offsets.extend_from_slice(&other.offsets);
        self.offset_array = None;
        self.left_padding = lp1.into_iter().chain(lp2).collect();
        self.idx = max_idx;
        Ok(())
    }

    /// Row `i` as a single-sequence [`KVCache`] holding only its real positions
    /// (mlx-lm's `extract`).
    #[track_caller]
    pub fn extract(&self, i: usize) -> Result<KVCache> {
        let padding = *self.left_padding.get(i).ok_or_else(|| {
            mlx_array::Error::InvalidArgument(format!(
                "BatchKVCache::extract: row {i} of {}",
                self.left_padding.len()
            ))
        })?;
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(KVCache::new());
        };
        let cut = |x: &Array| -> Result<Array> {
            seq(&row(x, i as i32)?, Some(padding), Some(self.idx))?.contiguous()
        };
        let (keys, values) = (cut(k)?, cut(v)?);
        let offset = keys.dim(2)?;
        Ok(KVCache::from_parts(Some(keys), Some(values), offset))
    }

    /// One batch from single-sequence caches, right-aligned with left padding (mlx-lm's
    /// `BatchKVCache.merge`).
    #[track_caller]
    pub fn merge(caches: &[&KVCache]) -> Result<BatchKVCache> {
        let lengths: Vec<i32> = caches.iter().map(|c| c.offset).collect();
        let max_length = lengths.iter().copied().max().unwrap_or(0);
        if max_length == 0 {
            return Ok(BatchKVCache::new(&vec![0; caches.len()]));
        }
        let padding: Vec<i32> = lengths.iter().map(|l| max_length - l).collect();
        let kv = caches.iter().map(|c| (c.keys.as_ref(), c.values.as_ref()));
        let mut buf = MergeBuffers::new(kv, max_length)?;
        for (i, (p, c)) in padding.iter().zip(caches).enumerate() {
            let (Some(ck), Some(cv)) = (&c.keys, &c.values) else {
                continue;
            };
            let (ck, cv) = (
                seq(ck, None, Some(c.offset))?,
                seq(cv, None, Some(c.offset))?,
            );
            buf.put(i as i32, *p, p + c.offset, &ck, &cv)?;
        }
        let mut cache = BatchKVCache::new(&padding);
        cache.keys = Some(buf.keys);
        cache.values = Some(buf.values);
        for o in &mut cache.offsets {
            *o += max_length;
        }
        cache.idx = max_length;
        Ok(cache)
    }
}

impl KvCache for BatchKVCache {
    /// The buffer length (`idx`); the per-row offsets are [`KvCache::rope_offset`].
    fn offset(&self) -> i32 {
        self.idx
    }

    batch_kv_methods!();

    /// mlx-lm's array `create_causal_mask(n, idx, window_size, left_padding)`, except in a
    /// decoding step (one position a row, no window; `keep_decode_mask` keeps the array):
    /// - no row padded: none. Every element of mlx-lm's mask is true; attention without it
    ///   is the same arithmetic on the CPU (MLX's unfused attention, whose `where` then
    ///   changes nothing) and on a GPU runs MLX's fused one-query kernel (`sdpa_vector`,
    ///   what a single sequence's decoding runs) instead of five kernels a layer
    ///   (Llama-3.1-8B 4-bit at batch 8 on the H200: ~36 us a layer against ~7 under ncu,
    ///   GPU.md session 33);
    /// - rows padded: the mask with the padding alongside (`AttnMask::LeftPadded`:
    ///   attention over each row's keys from its padding on, our kernel on a GPU).
    ///
    /// On a GPU both are another order of sums, where mlx-lm's batched decoding is not
    /// reproducible either (docs/parity.md).
    ///
    /// A few positions a row (a speculative verification) while attention splits them
    /// one query at a time (`MLX_SDPA_SPLIT_QUERIES`, [`mlx_nn::attention::splits_queries`]):
    /// causal where no row is padded (each query then runs what a single sequence's
    /// verification runs), else the mask with the padding alongside (each query our
    /// padded-rows kernel; `MLX_BATCH_VERIFY_MASK=array` keeps the array) where every
    /// query sees a key of its row: a query before its row's first key (a short prompt's
    /// left-padded prefill) gets mlx-lm's array, under which MLX attends to all keys
    /// evenly, where the kernel, seeing none, would write NaN that later attention
    /// under a mask would carry into the rows (0 x NaN). Otherwise mlx-lm's array.
    fn make_mask(&self, n: i32, _return_array: bool, window_size: Option<i32>) -> Result<AttnMask> {
        let plain = window_size.is_none() && !keep_decode_mask();
        let decoding = n == 1 && plain;
        let unpadded = self.left_padding.iter().all(|&l| l == 0);
        // Query `i` sees its row's keys `left_padding ..= idx + i`: none for some query
        // of a row padded beyond `idx`.
        let every_query_sees = self.left_padding.iter().all(|&l| l <= self.idx);
        let split = n > 1
            && plain
            && every_query_sees
            && !keep_verify_mask()
            && mlx_nn::attention::splits_queries(n);
        if decoding && unpadded {
            return Ok(AttnMask::None);
        }
        if split && unpadded {
            return Ok(AttnMask::Causal);
        }
        let mask = batch_causal_mask(n, self.idx, window_size, &self.left_padding)?;
        if decoding || split {
            return Ok(AttnMask::LeftPadded {
                mask,
                left_padding: int_array(&self.left_padding)?,
            });
        }
        Ok(AttnMask::Array(mask))
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: i32) -> i32 {
        let n = self.idx.min(n);
        self.idx -= n;
        for o in &mut self.offsets {
            *o -= n;
        }
        self.offset_array = None;
        n
    }

    fn size(&self) -> i32 {
        self.idx
    }

    kv_pair_methods!("BatchKVCache");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test fails by panicking
    use super::*;

    #[test]
    fn rolling_by_slices_equals_mlx_lm_s_gather() {
        let x = arange(0.0, 3.0 * 2.0 * 7.0 * 4.0, 1.0, Dtype::Float32)
            .unwrap()
            .reshape(&[3, 2, 7, 4])
            .unwrap();
        for shifts in [[0, 0, 0], [1, 0, 3], [7, 2, 6], [0, 9, 1]] {
            let a = roll_rows(&x, &shifts).unwrap();
            let b = roll_gather(&x, &shifts).unwrap();
            assert_eq!(a.shape(), b.shape());
            assert_eq!(
                a.to_vec::<f32>().unwrap(),
                b.to_vec::<f32>().unwrap(),
                "{shifts:?}"
            );
        }
        assert!(roll_rows(&x, &[1, 2]).is_err());
    }

    #[test]
    fn a_roller_s_shared_indices_roll_each_array_as_its_own_would() {
        let seq = |n: i32, from: f64| {
            let len = 3 * 2 * n * 4;
            arange(from, from + len as f64, 1.0, Dtype::Float32)
                .unwrap()
                .reshape(&[3, 2, n, 4])
                .unwrap()
        };
        let (x, y, z) = (seq(7, 0.0), seq(7, 1000.0), seq(5, 0.0));
        let mut roller = Roller::default();
        // Keys and values alike, then other shifts, then another length.
        for (a, shifts) in [
            (&x, [1, 0, 3]),
            (&y, [1, 0, 3]),
            (&x, [2, 6, 0]),
            (&z, [2, 6, 0]),
            (&y, [2, 6, 0]),
        ] {
            let got = roller.gather(a, &shifts).unwrap();
            let want = roll_rows(a, &shifts).unwrap();
            assert_eq!(got.shape(), want.shape());
            assert_eq!(
                got.to_vec::<f32>().unwrap(),
                want.to_vec::<f32>().unwrap(),
                "{shifts:?} over {:?}",
                a.shape()
            );
        }
    }
}
