//! mlx-lm's `ChunkedKVCache`: a [`KVCache`](crate::KVCache)-like buffer for chunked
//! attention (Llama 4's local layers) that drops everything before the last
//! `chunk_size` positions when the model asks (`maybe_trim_front`).
use crate::kv::STEP;
use crate::util::{dims4, grown_buffers, held, kv_pair_methods, seq, seq_update};
use mlx_array::{Array, Error, Result};
use mlx_nn::cache::{AttnMask, KvCache, KvFetch};

/// mlx-lm's `ChunkedKVCache(chunk_size)`. The buffer holds the positions
/// `start_position..offset`; `offset` stays the absolute position (RoPE's offset).
#[derive(Debug, Clone)]
pub struct ChunkedKVCache {
    pub(crate) keys: Option<Array>,
    pub(crate) values: Option<Array>,
    pub(crate) offset: i32,
    pub(crate) chunk_size: i32,
    pub(crate) start_position: i32,
}

impl ChunkedKVCache {
    /// An empty cache for attention chunks of `chunk_size` positions.
    pub fn new(chunk_size: i32) -> ChunkedKVCache {
        ChunkedKVCache {
            keys: None,
            values: None,
            offset: 0,
            chunk_size,
            start_position: 0,
        }
    }

    /// Rebuilds a cache from its saved state (mlx-lm's `from_state` of
    /// `(keys, values, offset, chunk_size, start_position)`).
    pub fn from_parts(
        keys: Option<Array>,
        values: Option<Array>,
        offset: i32,
        chunk_size: i32,
        start_position: i32,
    ) -> ChunkedKVCache {
        ChunkedKVCache {
            keys,
            values,
            offset,
            chunk_size,
            start_position,
        }
    }

    /// The attention chunk size.
    pub fn chunk_size(&self) -> i32 {
        self.chunk_size
    }

    /// The whole key buffer (including unused capacity), if any.
    pub fn keys(&self) -> Option<&Array> {
        self.keys.as_ref()
    }

    /// The whole value buffer (including unused capacity), if any.
    pub fn values(&self) -> Option<&Array> {
        self.values.as_ref()
    }

    /// mlx-lm's `maybe_trim_front`: when more than `chunk_size` positions are held, the
    /// oldest are dropped (`keys[..., trim:valid, :]`) and `start_position` moves on.
    #[track_caller]
    pub fn trim_front(&mut self) -> Result<()> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(());
        };
        let valid = self.offset - self.start_position;
        if valid > self.chunk_size {
            let trim = valid - self.chunk_size;
            self.start_position += trim;
            let (k, v) = (
                seq(k, Some(trim), Some(valid))?,
                seq(v, Some(trim), Some(valid))?,
            );
            self.keys = Some(k);
            self.values = Some(v);
        }
        Ok(())
    }

    /// Appends `keys`/`values` and returns the positions held, exactly like mlx-lm's
    /// `update_and_fetch` (the buffer grows by [`STEP`] positions).
    #[track_caller]
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let s = dims4(keys, "keys")?[2];
        let prev = self.offset - self.start_position;
        let old = (&self.keys, &self.values);
        let (mut kbuf, mut vbuf) = grown_buffers(old, keys, values, prev, STEP)?;
        self.offset += s;
        let end = self.offset - self.start_position;
        kbuf = seq_update(&kbuf, keys, prev, end)?;
        vbuf = seq_update(&vbuf, values, prev, end)?;
        self.keys = Some(kbuf);
        self.values = Some(vbuf);
        self.keys_and_values()
    }

    /// The held positions of the buffers (mlx-lm's `keys_and_values`:
    /// `keys[..., :offset - start_position, :]`).
    #[track_caller]
    pub fn keys_and_values(&self) -> Result<(Array, Array)> {
        let (k, v) = held(&self.keys, &self.values, "ChunkedKVCache")?;
        let end = self.offset - self.start_position;
        Ok((seq(k, None, Some(end))?, seq(v, None, Some(end))?))
    }
}

impl KvCache for ChunkedKVCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn start_position(&self) -> i32 {
        self.start_position
    }

    fn maybe_trim_front(&mut self) -> Result<()> {
        self.trim_front()
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvFetch> {
        let (keys, values) = self.update(keys, values)?;
        Ok(KvFetch::Plain { keys, values })
    }

    /// mlx-lm's `ChunkedKVCache` has no `make_mask`: the model builds the chunk mask
    /// from `start_position` and `offset` itself.
    fn make_mask(&self, _n: i32, _r: bool, _w: Option<i32>) -> Result<AttnMask> {
        Err(Error::InvalidArgument(
            "ChunkedKVCache has no make_mask (as in mlx-lm): chunked-attention models \
             build their chunk mask from start_position and offset"
                .into(),
        ))
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    /// Like mlx-lm, at most the held positions are removed, and only the offset moves.
    fn trim(&mut self, n: i32) -> i32 {
        let n = (self.offset - self.start_position).min(n);
        self.offset -= n;
        n
    }

    /// mlx-lm's `ChunkedKVCache` has no `size()`, so the base class's 0 applies.
    fn size(&self) -> i32 {
        0
    }

    kv_pair_methods!("ChunkedKVCache");
}
