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
    check(unsafe { sys::mlxs_load_safetensors(c.as_ptr(), Array::s(), &mut m, &mut md) })
        .map_err(|e| file_err(path, e))?;
    let mut arrays = BTreeMap::new();
    let mut meta = BTreeMap::new();
    unsafe {
        for i in 0..sys::mlxs_map_len(m) {
            arrays.insert(
                cs(sys::mlxs_map_key(m, i)),
                Array::from_raw(sys::mlxs_map_value(m, i)),
            );
        }
        for i in 0..sys::mlxs_strmap_len(md) {
            meta.insert(
                cs(sys::mlxs_strmap_key(md, i)),
                cs(sys::mlxs_strmap_value(md, i)),
            );
        }
        sys::mlxs_map_free(m);
        sys::mlxs_strmap_free(md);
    }
    Ok((arrays, meta))
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
    // Keep the CStrings alive while the shim copies them.
    struct Maps(sys::mlxs_map, sys::mlxs_strmap);
    impl Drop for Maps {
        fn drop(&mut self) {
            unsafe {
                sys::mlxs_map_free(self.0);
                sys::mlxs_strmap_free(self.1);
            }
        }
    }
    let maps = Maps(unsafe { sys::mlxs_map_new() }, unsafe {
        sys::mlxs_strmap_new()
    });
    for (k, a) in arrays {
        let k = crate::ops::cstr(k)?;
        unsafe { sys::mlxs_map_insert(maps.0, k.as_ptr(), a.as_raw()) };
    }
    for (k, v) in metadata {
        let (k, v) = (crate::ops::cstr(k)?, crate::ops::cstr(v)?);
        unsafe { sys::mlxs_strmap_insert(maps.1, k.as_ptr(), v.as_ptr()) };
    }
    check(unsafe { sys::mlxs_save_safetensors(c.as_ptr(), maps.0, maps.1) })
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
    check(unsafe { sys::mlxs_load_gguf(c.as_ptr(), Array::s(), &mut m, &mut md) })
        .map_err(|e| file_err(path, e))?;
    let mut arrays = BTreeMap::new();
    let mut meta = BTreeMap::new();
    unsafe {
        for i in 0..sys::mlxs_map_len(m) {
            arrays.insert(
                cs(sys::mlxs_map_key(m, i)),
                Array::from_raw(sys::mlxs_map_value(m, i)),
            );
        }
        for i in 0..sys::mlxs_gguf_meta_len(md) {
            let v = match sys::mlxs_gguf_meta_kind(md, i) {
                1 => GgufValue::Array(Array::from_raw(sys::mlxs_gguf_meta_array(md, i))),
                2 => GgufValue::String(cs(sys::mlxs_gguf_meta_string(md, i))),
                3 => GgufValue::Strings(
                    (0..sys::mlxs_gguf_meta_strings_len(md, i))
                        .map(|j| cs(sys::mlxs_gguf_meta_strings_get(md, i, j)))
                        .collect(),
                ),
                _ => GgufValue::None,
            };
            meta.insert(cs(sys::mlxs_gguf_meta_key(md, i)), v);
        }
        sys::mlxs_map_free(m);
        sys::mlxs_gguf_meta_free(md);
    }
    Ok((arrays, meta))
}

/// Loads a `.npy` file.
#[track_caller]
pub fn load_npy(path: impl AsRef<Path>) -> Result<Array> {
    let path = path.as_ref();
    let c = path_cstr(path)?;
    out1(|o| unsafe { sys::mlxs_load_npy(c.as_ptr(), Array::s(), o) })
        .map_err(|e| file_err(path, e))
}

/// Writes the graph that evaluating `outputs` would run as a Graphviz dot file
/// (`mx.export_to_dot`): one rectangle per primitive, evaluated arrays as sources.
#[track_caller]
pub fn export_to_dot(path: impl AsRef<Path>, outputs: &[&Array]) -> Result<()> {
    let path = path.as_ref();
    let c = path_cstr(path)?;
    let v = crate::array::VecHandle::from_arrays(outputs.iter().copied());
    check(unsafe { sys::mlxs_export_to_dot(c.as_ptr(), v.0) }).map_err(|e| file_err(path, e))
}

/// Writes a `.npy` file.
#[track_caller]
pub fn save_npy(path: impl AsRef<Path>, a: &Array) -> Result<()> {
    let path = path.as_ref();
    let c = path_cstr(path)?;
    check(unsafe { sys::mlxs_save_npy(c.as_ptr(), a.as_raw()) }).map_err(|e| file_err(path, e))
}
