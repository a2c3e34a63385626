//! Reading and writing arrays: safetensors (with metadata), GGUF (with metadata), npy.
use crate::array::{out1, Array};
use crate::error::{check, Error, Result};
use mlx_sys as sys;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::path::Path;

fn path_cstr(path: &Path) -> Result<CString> {
    CString::new(path.to_string_lossy().as_bytes())
        .map_err(|_| Error::InvalidArgument(format!("path {} contains a NUL byte", path.display())))
}

fn file_err(path: &Path, e: Error) -> Error {
    match e {
        Error::Mlx { message, .. } => Error::File {
            path: path.to_path_buf(),
            message,
        },
        other => other,
    }
}

unsafe fn cs(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: `p` is a NUL-terminated string owned by a live shim container (or a static).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Loads every tensor and the string metadata of a `.safetensors` file.
#[track_caller]
pub fn load_safetensors(
    path: impl AsRef<Path>,
) -> Result<(BTreeMap<String, Array>, BTreeMap<String, String>)> {
    let path = path.as_ref();
    if !path.is_file() {
        return Err(Error::File {
            path: path.into(),
            message: "no such file".into(),
        });
    }
    let c = path_cstr(path)?;
    let (mut m, mut md) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `c` is a NUL-terminated path; on success the shim writes two new owned maps.
    check(unsafe { sys::mlxs_load_safetensors(c.as_ptr(), Array::s(), &mut m, &mut md) })
        .map_err(|e| file_err(path, e))?;
    let (m, md) = (OwnedMap(m), OwnedStrMap(md));
    let arrays = m.arrays()?;
    let mut meta = BTreeMap::new();
    // SAFETY: `md` is the live string map the shim wrote; indices stay below its length.
    unsafe {
        for i in 0..sys::mlxs_strmap_len(md.0) {
            meta.insert(
                cs(sys::mlxs_strmap_key(md.0, i)),
                cs(sys::mlxs_strmap_value(md.0, i)),
            );
        }
    }
    Ok((arrays, meta))
}

/// An owned name -> array map written by the shim.
struct OwnedMap(sys::mlxs_map);

impl OwnedMap {
    #[track_caller]
    fn new() -> Result<OwnedMap> {
        let mut p: sys::mlxs_map = std::ptr::null_mut();
        // SAFETY: the shim writes a new owned map on success.
        check(unsafe { sys::mlxs_map_new(&mut p) })?;
        Ok(OwnedMap(p))
    }

    /// Every entry, as new array handles.
    #[track_caller]
    fn arrays(&self) -> Result<BTreeMap<String, Array>> {
        let mut out = BTreeMap::new();
        // SAFETY: `self.0` is a live map; indices stay below its length.
        let n = unsafe { sys::mlxs_map_len(self.0) };
        for i in 0..n {
            // SAFETY: `i` is below the live map's length; the key stays valid while the map lives.
            let key = unsafe { cs(sys::mlxs_map_key(self.0, i)) };
            // SAFETY: `i` is below the live map's length; on success the shim writes a new owned handle.
            let value = crate::array::out1(|o| unsafe { sys::mlxs_map_value(self.0, i, o) })?;
            out.insert(key, value);
        }
        Ok(out)
    }
}

impl Drop for OwnedMap {
    fn drop(&mut self) {
        // SAFETY: we own the map (null-safe: `delete nullptr` is a no-op).
        unsafe { sys::mlxs_map_free(self.0) }
    }
}

/// An owned name -> string map written by the shim.
struct OwnedStrMap(sys::mlxs_strmap);

impl OwnedStrMap {
    #[track_caller]
    fn new() -> Result<OwnedStrMap> {
        let mut p: sys::mlxs_strmap = std::ptr::null_mut();
        // SAFETY: the shim writes a new owned map on success.
        check(unsafe { sys::mlxs_strmap_new(&mut p) })?;
        Ok(OwnedStrMap(p))
    }
}

impl Drop for OwnedStrMap {
    fn drop(&mut self) {
        // SAFETY: we own the map (null-safe).
        unsafe { sys::mlxs_strmap_free(self.0) }
    }
}

/// Owned GGUF metadata written by the shim.
struct OwnedGgufMeta(sys::mlxs_gguf_meta);

impl Drop for OwnedGgufMeta {
    fn drop(&mut self) {
        // SAFETY: we own the metadata (null-safe).
        unsafe { sys::mlxs_gguf_meta_free(self.0) }
    }
}

/// Writes tensors and string metadata to a `.safetensors` file.
#[track_caller]
pub fn save_safetensors<'a>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (&'a str, &'a Array)>,
    metadata: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<()> {
    let path = path.as_ref();
    let c = path_cstr(path)?;
    let (arrays_map, meta_map) = (OwnedMap::new()?, OwnedStrMap::new()?);
    for (k, a) in arrays {
        let k = crate::ops::cstr(k)?;
        // SAFETY: live map and array; the shim copies the key and the handle.
        check(unsafe { sys::mlxs_map_insert(arrays_map.0, k.as_ptr(), a.as_raw()) })?;
    }
    for (k, v) in metadata {
        let (k, v) = (crate::ops::cstr(k)?, crate::ops::cstr(v)?);
        // SAFETY: live map; the shim copies both strings.
        check(unsafe { sys::mlxs_strmap_insert(meta_map.0, k.as_ptr(), v.as_ptr()) })?;
    }
    // SAFETY: `c` is a NUL-terminated path; both maps are live and only read.
    check(unsafe { sys::mlxs_save_safetensors(c.as_ptr(), arrays_map.0, meta_map.0) })
        .map_err(|e| file_err(path, e))
}

/// One GGUF metadata value as MLX reads it.
#[derive(Debug, Clone)]
pub enum GgufValue {
    /// Absent / unsupported.
    None,
    /// Numbers (scalars are 0-d arrays; numeric lists are 1-d).
    Array(Array),
    /// A string.
    String(String),
    /// A list of strings.
    Strings(Vec<String>),
}

/// Loads the tensors (Q4_0/Q4_1/Q8_0 come back as affine-quantized triples
/// `name`, `name.scales`, `name.biases`) and the metadata of a `.gguf` file.
#[track_caller]
pub fn load_gguf(
    path: impl AsRef<Path>,
) -> Result<(BTreeMap<String, Array>, BTreeMap<String, GgufValue>)> {
    let path = path.as_ref();
    if !path.is_file() {
        return Err(Error::File {
            path: path.into(),
            message: "no such file".into(),
        });
    }
    let c = path_cstr(path)?;
    let (mut m, mut md) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `c` is a NUL-terminated path; on success the shim writes a new owned map and metadata.
    check(unsafe { sys::mlxs_load_gguf(c.as_ptr(), Array::s(), &mut m, &mut md) })
        .map_err(|e| file_err(path, e))?;
    let (m, md) = (OwnedMap(m), OwnedGgufMeta(md));
    let arrays = m.arrays()?;
    let mut meta = BTreeMap::new();
    // SAFETY: `md` is the live metadata the shim wrote; indices stay below its lengths.
    unsafe {
        for i in 0..sys::mlxs_gguf_meta_len(md.0) {
            let v = match sys::mlxs_gguf_meta_kind(md.0, i) {
                1 => GgufValue::Array(crate::array::out1(|o| {
                    sys::mlxs_gguf_meta_array(md.0, i, o)
                })?),
                2 => GgufValue::String(cs(sys::mlxs_gguf_meta_string(md.0, i))),
                3 => GgufValue::Strings(
                    (0..sys::mlxs_gguf_meta_strings_len(md.0, i))
                        .map(|j| cs(sys::mlxs_gguf_meta_strings_get(md.0, i, j)))
                        .collect(),
                ),
                _ => GgufValue::None,
            };
            meta.insert(cs(sys::mlxs_gguf_meta_key(md.0, i)), v);
        }
    }
    Ok((arrays, meta))
}

/// Owned GGUF metadata being built for [`save_gguf`].
impl OwnedGgufMeta {
    #[track_caller]
    fn new() -> Result<OwnedGgufMeta> {
        let mut p: sys::mlxs_gguf_meta = std::ptr::null_mut();
        // SAFETY: the shim writes new owned metadata on success.
        check(unsafe { sys::mlxs_gguf_meta_new(&mut p) })?;
        Ok(OwnedGgufMeta(p))
    }

    #[track_caller]
    fn push(&self, key: &str, value: &GgufValue) -> Result<()> {
        let k = crate::ops::cstr(key)?;
        match value {
            GgufValue::None => Err(Error::InvalidArgument(format!(
                "GGUF metadata `{key}` has no value"
            ))),
            GgufValue::Array(a) => {
                // SAFETY: live metadata and array; the shim copies the key and the handle.
                check(unsafe { sys::mlxs_gguf_meta_push_array(self.0, k.as_ptr(), a.as_raw()) })
            }
            // SAFETY: live metadata; `s` is read for `s.len()` bytes and copied.
            GgufValue::String(s) => check(unsafe {
                sys::mlxs_gguf_meta_push_string(self.0, k.as_ptr(), s.as_ptr().cast(), s.len())
            }),
            GgufValue::Strings(v) => {
                let ptrs: Vec<*const std::os::raw::c_char> =
                    v.iter().map(|s| s.as_ptr().cast()).collect();
                let lens: Vec<usize> = v.iter().map(String::len).collect();
                // SAFETY: live metadata; `ptrs[i]` is read for `lens[i]` bytes, all copied.
                check(unsafe {
                    sys::mlxs_gguf_meta_push_strings(
                        self.0,
                        k.as_ptr(),
                        ptrs.as_ptr(),
                        lens.as_ptr(),
                        v.len(),
                    )
                })
            }
        }
    }
}

/// Writes tensors and metadata to a `.gguf` file (`mx.save_gguf`; MLX appends `.gguf`
/// to a path without it). MLX receives both as hash maps built by inserting the entries
/// in the order given here, as `mx.save_gguf` builds them from Python dicts: the same
/// entries in the same order make the same file, byte for byte. Tensors must be float32,
/// float16, int8, int16 or int32; metadata arrays at most 1-d and not empty.
#[track_caller]
pub fn save_gguf<'a>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (&'a str, &'a Array)>,
    metadata: impl IntoIterator<Item = (&'a str, &'a GgufValue)>,
) -> Result<()> {
    let path = path.as_ref();
    let c = path_cstr(path)?;
    let (arrays_map, meta) = (OwnedMap::new()?, OwnedGgufMeta::new()?);
    for (k, a) in arrays {
        let k = crate::ops::cstr(k)?;
        // SAFETY: live map and array; the shim copies the key and the handle.
        check(unsafe { sys::mlxs_map_insert(arrays_map.0, k.as_ptr(), a.as_raw()) })?;
    }
    for (k, v) in metadata {
        meta.push(k, v)?;
    }
    // SAFETY: `c` is a NUL-terminated path; both containers are live and only read.
    check(unsafe { sys::mlxs_save_gguf(c.as_ptr(), arrays_map.0, meta.0) })
        .map_err(|e| file_err(path, e))
}

/// Loads a `.npy` file.
#[track_caller]
pub fn load_npy(path: impl AsRef<Path>) -> Result<Array> {
    let path = path.as_ref();
    let c = path_cstr(path)?;
    // SAFETY: `c` is a NUL-terminated path; on success the shim writes a new owned handle.
    out1(|o| unsafe { sys::mlxs_load_npy(c.as_ptr(), Array::s(), o) })
        .map_err(|e| file_err(path, e))
}

/// Writes the graph that evaluating `outputs` would run as a Graphviz dot file
/// (`mx.export_to_dot`): one rectangle per primitive, evaluated arrays as sources.
#[track_caller]
pub fn export_to_dot(path: impl AsRef<Path>, outputs: &[&Array]) -> Result<()> {
    let path = path.as_ref();
    let c = path_cstr(path)?;
    let v = crate::array::VecHandle::from_arrays(outputs.iter().copied())?;
    // SAFETY: `c` is a NUL-terminated path and `v` a live vector, only read.
    check(unsafe { sys::mlxs_export_to_dot(c.as_ptr(), v.0) }).map_err(|e| file_err(path, e))
}

/// Writes a `.npy` file.
#[track_caller]
pub fn save_npy(path: impl AsRef<Path>, a: &Array) -> Result<()> {
    let path = path.as_ref();
    let c = path_cstr(path)?;
    // SAFETY: `c` is a NUL-terminated path and `a` a live handle, only read.
    check(unsafe { sys::mlxs_save_npy(c.as_ptr(), a.as_raw()) }).map_err(|e| file_err(path, e))
}
