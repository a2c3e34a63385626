//! A reader for the GGUF header: metadata key/values and tensor descriptions.
//!
//! MLX loads the tensor data; this reader exists to validate the file first (so a
//! truncated file or an unsupported tensor type is reported by name) and to give typed
//! access to the metadata.
use crate::error::{io_err, GgufError, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A GGML tensor type id, as stored in a GGUF tensor description.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// The type's llama.cpp name (`F32`, `Q4_1`, ...), or `type <id>` when unknown.
    pub fn name(self) -> String {
        let n = match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            other => return format!("type {other}"),
        };
        n.to_string()
    }

    /// `(elements per block, bytes per block)`, or `None` for an unknown type.
    pub fn block(self) -> Option<(u64, u64)> {
        Some(match self.0 {
            0 => (1, 4),
            1 => (1, 2),
            2 => (32, 18),
            3 => (32, 20),
            6 => (32, 22),
            7 => (32, 24),
            8 => (32, 34),
            9 => (32, 36),
            10 => (256, 84),
            11 => (256, 110),
            12 => (256, 144),
            13 => (256, 176),
            14 => (256, 210),
            15 => (256, 292),
            16 => (256, 66),
            17 => (256, 74),
            18 => (256, 98),
            19 => (256, 50),
            20 => (32, 18),
            21 => (256, 110),
            22 => (256, 82),
            23 => (256, 136),
            24 => (1, 1),
            25 => (1, 2),
            26 => (1, 4),
            27 => (1, 8),
            28 => (1, 8),
            29 => (256, 56),
            30 => (1, 2),
            34 => (256, 54),
            35 => (256, 66),
            39 => (32, 17),
            _ => return None,
        })
    }

    /// Whether MLX 0.32's own GGUF loader reads this type exactly: F32, F16, I8/I16/I32,
    /// and Q4_0, Q4_1, Q8_0 (as affine triples). It dequantizes Q2_K, Q6_K and BF16 to
    /// float16 (BF16 losing range), dequantizes Q4_K wrongly (sub-blocks after the first use
    /// the wrong scales), and cannot load the rest.
    pub fn mlx_loads_exactly(self) -> bool {
        matches!(self.0, 0 | 1 | 2 | 3 | 8 | 24 | 25 | 26)
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Any unsigned integer (u8, u16, u32, u64).
    UInt(u64),
    /// Any signed integer (i8, i16, i32, i64).
    Int(i64),
    /// f32 (kept as f32 so its shortest decimal form survives) .
    F32(f32),
    /// f64.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of values.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::UInt(v) => Some(v),
            MetaValue::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float (integers convert; f32 goes through its shortest decimal form).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => format!("{v}").parse().ok(),
            MetaValue::F64(v) => Some(v),
            MetaValue::UInt(v) => Some(v as f64),
            MetaValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            MetaValue::UInt(v) => Some(v != 0),
            MetaValue::Int(v) => Some(v != 0),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// The dimensions in GGML order (`dims[0]` is the contiguous one).
    pub dims: Vec<u64>,
    /// The stored type.
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// The row-major shape MLX gives this tensor (the GGML dims reversed).
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of elements (saturating: a header whose dims overflow u64 reports
    /// `u64::MAX`, which no file can hold, so the extent check refuses it).
    pub fn elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// The parsed header of a GGUF file.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// The file.
    pub path: PathBuf,
    /// The GGUF version (2 or 3).
    pub version: u32,
    /// Metadata by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensor descriptions, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    /// The file's length in bytes.
    pub file_len: u64,
}

struct Reader {
    inner: BufReader<File>,
    path: PathBuf,
    pos: u64,
    len: u64,
}

impl Reader {
    fn truncated(&self, what: impl Into<String>) -> GgufError {
        GgufError::Truncated {
            path: self.path.clone(),
            what: what.into(),
            len: self.len,
        }
    }

    fn malformed(&self, what: impl Into<String>) -> GgufError {
        GgufError::Malformed {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        if self.pos + N as u64 > self.len {
            return Err(self.truncated(format!("{what} at byte {} runs past the end", self.pos)));
        }
        self.inner.read_exact(&mut b).map_err(io_err(&self.path))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes::<4>(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes::<8>(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if self.pos.saturating_add(n) > self.len {
            return Err(self.truncated(format!(
                "{what} ({n} bytes) at byte {} runs past the end",
                self.pos
            )));
        }
        let mut buf = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(io_err(&self.path))?;
        self.pos += n;
        String::from_utf8(buf).map_err(|_| self.malformed(format!("{what} is not UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::UInt(self.bytes::<1>(key)?[0] as u64),
            1 => MetaValue::Int(self.bytes::<1>(key)?[0] as i8 as i64),
            2 => MetaValue::UInt(u16::from_le_bytes(self.bytes::<2>(key)?) as u64),
            3 => MetaValue::Int(i16::from_le_bytes(self.bytes::<2>(key)?) as i64),
            4 => MetaValue::UInt(self.u32(key)? as u64),
            5 => MetaValue::Int(i32::from_le_bytes(self.bytes::<4>(key)?) as i64),
            6 => MetaValue::F32(f32::from_le_bytes(self.bytes::<4>(key)?)),
            7 => MetaValue::Bool(self.bytes::<1>(key)?[0] != 0),
            8 => MetaValue::String(self.string(key)?),
            9 => {
                let elem = self.u32(key)?;
                let n = self.u64(key)?;
                // Every element takes at least one byte: a count past the file is corruption.
                if n > self.len.saturating_sub(self.pos) {
                    return Err(self.truncated(format!("metadata array `{key}` of {n} elements")));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, key)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::UInt(self.u64(key)?),
            11 => MetaValue::Int(i64::from_le_bytes(self.bytes::<8>(key)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.bytes::<8>(key)?)),
            other => {
                return Err(
                    self.malformed(format!("metadata `{key}` has unknown value type {other}"))
                )
            }
        })
    }
}

impl GgufHeader {
    /// Reads and validates the header of `path`: every tensor's data must lie inside the file.
    pub fn read(path: &Path) -> Result<GgufHeader> {
        let file = File::open(path).map_err(io_err(path))?;
        let len = file.metadata().map_err(io_err(path))?.len();
        let mut r = Reader {
            inner: BufReader::with_capacity(1 << 16, file),
            path: path.to_path_buf(),
            pos: 0,
            len,
        };
        if len < 4 {
            return Err(r.truncated("the 4-byte magic is missing"));
        }
        let magic = r.bytes::<4>("magic")?;
        if &magic != b"GGUF" {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                magic: magic.to_vec(),
            });
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion {
                path: path.to_path_buf(),
                version,
            });
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        if n_kv > len || n_tensors > len {
            return Err(r.malformed(format!(
                "{n_tensors} tensors and {n_kv} metadata entries cannot fit"
            )));
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let ty = r.u32(&key)?;
            let v = r.value(ty, &key)?;
            metadata.insert(key, v);
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&format!("tensor name #{i}"))?;
            let n_dims = r.u32(&name)?;
            if n_dims > 8 {
                return Err(r.malformed(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let dims = (0..n_dims)
                .map(|_| r.u64(&name))
                .collect::<Result<Vec<_>>>()?;
            let ggml_type = GgmlType(r.u32(&name)?);
            let offset = r.u64(&name)?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(
                        r.malformed(format!("general.alignment {v:?} is not a power of two"))
                    )
                }
            },
        };
        let data_offset = r.pos.div_ceil(alignment) * alignment;
        // Seek only to surface I/O errors early; the data itself is read by MLX.
        r.inner.seek(SeekFrom::Start(r.pos)).map_err(io_err(path))?;
        let header = GgufHeader {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            data_offset,
            file_len: len,
        };
        header.check_extents()?;
        Ok(header)
    }

    fn check_extents(&self) -> Result<()> {
        for t in &self.tensors {
            let Some((per_block, block_bytes)) = t.ggml_type.block() else {
                return Err(GgufError::UnsupportedTensorType {
                    tensor: t.name.clone(),
                    type_name: t.ggml_type.name(),
                });
            };
            let n = t.elements();
            if t.dims.first().is_some_and(|d| d % per_block != 0) {
                return Err(GgufError::Malformed {
                    path: self.path.clone(),
                    what: format!(
                        "tensor `{}` ({}) has a row of {} elements, not a multiple of the block size {per_block}",
                        t.name,
                        t.ggml_type.name(),
                        t.dims[0]
                    ),
                });
            }
            let bytes = (n / per_block).saturating_mul(block_bytes);
            let end = self
                .data_offset
                .saturating_add(t.offset)
                .saturating_add(bytes);
            if end > self.file_len {
                return Err(GgufError::Truncated {
                    path: self.path.clone(),
                    what: format!("tensor `{}` needs bytes up to {end}", t.name),
                    len: self.file_len,
                });
            }
        }
        Ok(())
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.str("general.architecture")
    }

    /// A required string value.
    pub fn str(&self, key: &str) -> Result<&str> {
        let v = self
            .get(key)
            .ok_or_else(|| GgufError::MissingMetadata { key: key.into() })?;
        v.as_str()
            .ok_or_else(|| bad(key, format!("expected a string, found {}", describe(v))))
    }

    /// A required unsigned integer.
    pub fn u64(&self, key: &str) -> Result<u64> {
        let v = self
            .get(key)
            .ok_or_else(|| GgufError::MissingMetadata { key: key.into() })?;
        v.as_u64().ok_or_else(|| {
            bad(
                key,
                format!("expected an unsigned integer, found {}", describe(v)),
            )
        })
    }

    /// An optional unsigned integer (present but mistyped is an error).
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.u64(key).map(Some),
        }
    }

    /// An optional float (present but mistyped is an error).
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(key, format!("expected a number, found {}", describe(v)))),
        }
    }

    /// An optional boolean (present but mistyped is an error).
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| bad(key, format!("expected a boolean, found {}", describe(v)))),
        }
    }

    /// An optional string (present but mistyped is an error).
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.str(key).map(Some),
        }
    }

    /// A required array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        let v = self
            .get(key)
            .ok_or_else(|| GgufError::MissingMetadata { key: key.into() })?;
        let items = v
            .as_array()
            .ok_or_else(|| bad(key, format!("expected an array, found {}", describe(v))))?;
        items
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str().ok_or_else(|| {
                    bad(key, format!("element {i} is {}, not a string", describe(s)))
                })
            })
            .collect()
    }

    /// An optional array of integers.
    pub fn opt_ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_array()
            .ok_or_else(|| bad(key, format!("expected an array, found {}", describe(v))))?;
        items
            .iter()
            .enumerate()
            .map(|(i, x)| match *x {
                MetaValue::Int(n) => Ok(n),
                MetaValue::UInt(n) => {
                    i64::try_from(n).map_err(|_| bad(key, format!("element {i} is too large")))
                }
                _ => Err(bad(
                    key,
                    format!("element {i} is {}, not an integer", describe(x)),
                )),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

fn bad(key: &str, problem: String) -> GgufError {
    GgufError::BadMetadata {
        key: key.into(),
        problem,
    }
}

fn describe(v: &MetaValue) -> String {
    match v {
        MetaValue::UInt(n) => format!("the unsigned integer {n}"),
        MetaValue::Int(n) => format!("the integer {n}"),
        MetaValue::F32(x) => format!("the float {x}"),
        MetaValue::F64(x) => format!("the float {x}"),
        MetaValue::Bool(b) => format!("the boolean {b}"),
        MetaValue::String(s) => format!("the string {s:?}"),
        MetaValue::Array(a) => format!("an array of {} values", a.len()),
    }
}
