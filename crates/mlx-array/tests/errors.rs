//! Failures come back as `Err` with a message that says what went wrong, and the process
//! keeps working afterwards (every test runs an op after the failure).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::transforms::value_and_grad;
use mlx_array::{io, ops, Array, Closure, Dtype, Error};
use std::path::PathBuf;

fn arr(data: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).expect("valid array")
}

/// Proves MLX still works: a small op evaluates to the known value.
fn still_works() {
    let a = arr(&[1.0, 2.0, 3.0], &[3]);
    let s = a
        .multiply(2.0)
        .and_then(|m| m.sum(None, false))
        .and_then(|s| s.item::<f32>());
    assert_eq!(s.expect("op after an error"), 12.0);
}

fn message(e: &Error) -> String {
    e.to_string()
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("mlx-array-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn add_with_unbroadcastable_shapes_is_an_error_naming_the_shapes() {
    let a = arr(&[0.0; 6], &[2, 3]);
    let b = arr(&[0.0; 4], &[4]);
    let e = a.add(&b).expect_err("(2,3) + (4,) must fail");
    let m = message(&e);
    assert!(matches!(e, Error::Mlx { .. }), "{m}");
    assert!(
        m.contains("broadcast") && m.contains("(2,3)") && m.contains("(4)"),
        "{m}"
    );
    assert!(
        m.contains("errors.rs"),
        "the Rust call site is reported: {m}"
    );
    still_works();
}

#[test]
fn matmul_with_mismatched_inner_dimensions_is_an_error() {
    let a = arr(&[0.0; 6], &[2, 3]);
    let b = arr(&[0.0; 8], &[4, 2]);
    let m = message(&a.matmul(&b).expect_err("(2,3) @ (4,2) must fail"));
    assert!(
        m.contains("[matmul]") && m.contains("(2,3)") && m.contains("(4,2)"),
        "{m}"
    );
    still_works();
}

#[test]
fn reshape_to_a_different_size_is_an_error() {
    let a = arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let m = message(&a.reshape(&[3, 3]).expect_err("4 elements cannot be 3x3"));
    assert!(
        m.contains("[reshape]") && m.contains("size 4") && m.contains("(3,3)"),
        "{m}"
    );
    still_works();
}

#[test]
fn out_of_range_axis_is_an_error() {
    let a = arr(&[0.0; 6], &[2, 3]);
    let m = message(&a.sum(Some(&[5]), false).expect_err("axis 5 of a 2-d array"));
    assert!(m.contains("axis") && m.contains('5'), "{m}");
    let m = message(
        &a.softmax(Some(&[-3]), true)
            .expect_err("axis -3 of a 2-d array"),
    );
    assert!(m.contains("axis"), "{m}");
    let m = message(&a.dim(2).expect_err("dim(2) of a 2-d array"));
    assert!(
        m.contains("axis 2 is out of range") && m.contains('2'),
        "{m}"
    );
    let m = message(&a.slice_axis(-3, 0, 1).expect_err("slice_axis(-3)"));
    assert!(m.contains("axis -3 out of range"), "{m}");
    still_works();
}

#[test]
fn to_vec_with_the_wrong_host_type_is_an_error() {
    let a = arr(&[1.5, 2.5], &[2]);
    let e = a.to_vec::<i32>().expect_err("float32 read as i32");
    assert!(
        matches!(
            e,
            Error::DtypeMismatch {
                actual: Dtype::Float32,
                requested: Dtype::Int32
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        message(&e),
        "array has dtype float32 but int32 was requested"
    );
    assert!(a.item::<f32>().is_err(), "item() on two elements");
    assert_eq!(
        a.astype(Dtype::Int32).unwrap().to_vec::<i32>().unwrap(),
        vec![1, 2]
    );
    still_works();
}

#[test]
fn host_data_of_the_wrong_length_is_an_error() {
    let e = Array::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2]).expect_err("3 values, 4 slots");
    assert_eq!(message(&e), "data has 3 elements but shape [2, 2] needs 4");
    let e = Array::from_bytes(&[0u8; 5], &[2], Dtype::Float16).expect_err("5 bytes for 2 f16");
    assert!(message(&e).contains("5 bytes"), "{e}");
    still_works();
}

#[test]
fn out_of_range_python_int_scalar_is_an_error_like_in_python() {
    let u = Array::from_slice(&[1u8, 2], &[2]).unwrap();
    let m = message(&u.add(300).expect_err("300 does not fit uint8"));
    assert_eq!(m, "converting 300 to uint8 would result in overflow");
    let m = message(&u.add(-1).expect_err("-1 does not fit uint8"));
    assert!(m.contains("-1") && m.contains("uint8"), "{m}");
    assert_eq!(u.add(250).unwrap().to_vec::<u8>().unwrap(), vec![251, 252]);
    still_works();
}

#[test]
fn loading_a_missing_file_is_an_error_naming_the_file() {
    let e = io::load_safetensors("/nonexistent/dir/model.safetensors").expect_err("missing");
    match &e {
        Error::File { path, message } => {
            assert_eq!(path, &PathBuf::from("/nonexistent/dir/model.safetensors"));
            assert!(message.contains("no such file"), "{message}");
        }
        other => panic!("expected Error::File, got {other:?}"),
    }
    assert!(message(&e).contains("/nonexistent/dir/model.safetensors"));
    assert!(io::load_gguf("/nonexistent/x.gguf").is_err());
    assert!(io::load_npy("/nonexistent/x.npy").is_err());
    still_works();
}

#[test]
fn corrupt_safetensors_header_is_an_error_not_a_crash() {
    let dir = TempDir::new("corrupt");
    // A header length of 16 followed by 16 bytes that are not JSON.
    let path = dir.0.join("bad_header.safetensors");
    let mut bytes = 16u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{this is not json");
    std::fs::write(&path, &bytes).unwrap();
    let e = io::load_safetensors(&path).expect_err("bad JSON header");
    let m = message(&e);
    assert!(matches!(e, Error::File { .. }), "{e:?}");
    assert!(
        m.contains("bad_header.safetensors") && m.contains("parse error"),
        "{m}"
    );
    // A header length far larger than the file.
    let path = dir.0.join("huge_len.safetensors");
    let mut bytes = (1u64 << 40).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&path, &bytes).unwrap();
    let m = message(&io::load_safetensors(&path).expect_err("header length past the end"));
    assert!(m.contains("Invalid json header length"), "{m}");
    // Fewer than the 8 bytes of the header length.
    let path = dir.0.join("tiny.safetensors");
    std::fs::write(&path, b"abc").unwrap();
    assert!(io::load_safetensors(&path).is_err());
    still_works();
}

#[test]
fn truncated_safetensors_is_an_error_not_a_crash() {
    let dir = TempDir::new("truncated");
    let path = dir.0.join("t.safetensors");
    let a = arr(&(0..64).map(|i| i as f32).collect::<Vec<_>>(), &[8, 8]);
    io::save_safetensors(&path, [("a", &a)], [("format", "mlx")]).unwrap();
    let (back, meta) = io::load_safetensors(&path).unwrap();
    assert_eq!(
        back["a"].to_vec::<f32>().unwrap(),
        a.to_vec::<f32>().unwrap()
    );
    assert_eq!(meta["format"], "mlx");
    // Cut the data in half: the header still promises 256 bytes.
    let full = std::fs::read(&path).unwrap();
    std::fs::write(&path, &full[..full.len() - 128]).unwrap();
    let res = io::load_safetensors(&path).and_then(|(m, _)| m["a"].to_vec::<f32>());
    let e = res.expect_err("truncated data");
    let m = message(&e);
    assert!(matches!(e, Error::File { .. }), "{e:?}");
    assert!(
        m.contains("t.safetensors") && m.contains("exceeding the size of the file"),
        "{m}"
    );
    still_works();
}

#[test]
fn a_panic_inside_a_compiled_closure_is_an_error_not_an_abort() {
    let c = Closure::new(|a: &[Array]| {
        if a[0].size() > 2 {
            panic!("boom from inside the closure");
        }
        Ok(vec![a[0].exp()?])
    })
    .unwrap();
    let compiled = c.compile(false).unwrap();
    let x = arr(&[1.0, 2.0, 3.0], &[3]);
    let m = message(&compiled.call(&[&x]).expect_err("the closure panics"));
    assert!(
        m.contains("panic") && m.contains("boom from inside the closure"),
        "{m}"
    );
    // The same compiled closure still works on inputs that do not panic.
    let y = arr(&[0.0, 0.0], &[2]);
    assert_eq!(
        compiled.call(&[&y]).unwrap()[0].to_vec::<f32>().unwrap(),
        vec![1.0, 1.0]
    );
    still_works();
}

#[test]
fn a_panic_or_error_inside_value_and_grad_is_an_error() {
    let x = arr(&[3.0], &[]);
    let e = value_and_grad(
        |_: &[Array]| -> mlx_array::Result<Vec<Array>> { panic!("grad boom") },
        &[&x],
        &[0],
    )
    .expect_err("the function panics");
    assert!(message(&e).contains("grad boom"), "{e}");
    let e = value_and_grad(|a: &[Array]| Ok(vec![a[0].reshape(&[7])?]), &[&x], &[0])
        .expect_err("the function returns an error");
    assert!(message(&e).contains("[reshape]"), "{e}");
    // A non-scalar output cannot be differentiated.
    let v = arr(&[1.0, 2.0], &[2]);
    let e = value_and_grad(|a: &[Array]| Ok(vec![a[0].square()?]), &[&v], &[0])
        .expect_err("vector loss");
    assert!(!message(&e).is_empty());
    let (val, g) = value_and_grad(|a: &[Array]| Ok(vec![a[0].square()?]), &[&x], &[0]).unwrap();
    assert_eq!(
        (val[0].item::<f32>().unwrap(), g[0].item::<f32>().unwrap()),
        (9.0, 6.0)
    );
    still_works();
}

#[test]
fn bad_arguments_are_errors_before_reaching_mlx() {
    let a = arr(&[0.0; 6], &[2, 3]);
    assert!(matches!(
        a.pad(&[0], &[1, 1], &[1], None, "constant"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        a.slice(&[0], &[1, 1], None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(mlx_array::quant::QuantMode::parse("int3").is_err());
    let m = message(
        &a.pad(&[0], &[1], &[1], None, "wrap")
            .expect_err("unknown pad mode"),
    );
    assert!(m.contains("Invalid padding mode (wrap)"), "{m}");
    assert!(ops::concatenate(&[], 0).is_err());
    still_works();
}

#[test]
fn export_to_dot_writes_the_unevaluated_graph_and_names_an_unwritable_path() {
    let dir = TempDir::new("dot");
    let a = arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    a.eval().expect("eval");
    let y = a.add(1.0).and_then(|s| s.multiply(&a)).expect("graph");
    let path = dir.0.join("g.dot");
    io::export_to_dot(&path, &[&y]).expect("export");
    let dot = std::fs::read_to_string(&path).expect("read dot");
    assert!(dot.starts_with("digraph {"), "{dot}");
    let labels: Vec<&str> = dot
        .lines()
        .filter_map(|l| l.split("[label =\"").nth(1))
        .filter_map(|l| l.split('"').next())
        .collect();
    // The evaluated input is a source; the add, its broadcast scalar and the multiply
    // are primitives (nothing was evaluated by exporting).
    assert!(
        labels.contains(&"Add") && labels.contains(&"Multiply"),
        "{labels:?}"
    );
    assert_eq!(
        y.add(0.0).and_then(|z| z.to_vec::<f32>()).expect("y"),
        [2.0, 6.0, 12.0, 20.0]
    );

    let bad = dir.0.join("missing-dir").join("g.dot");
    let e = io::export_to_dot(&bad, &[&y]).expect_err("unwritable path");
    assert!(message(&e).contains("missing-dir"), "{}", message(&e));
    still_works();
}
