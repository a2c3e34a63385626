//! `Param::transposed`: the cached `weight.T` that linear layers multiply by.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{Array, Dtype};
use mlx_nn::{Linear, Module, Param};
use std::collections::BTreeMap;

fn arange(n: i32, shape: &[i32]) -> Array {
    let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    Array::from_slice(&v, shape).unwrap()
}

#[test]
fn transposed_equals_the_transpose_of_the_current_value() {
    let mut p = Param::new(arange(6, &[2, 3]));
    let t = p.transposed().unwrap();
    assert_eq!(t.shape(), vec![3, 2]);
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    // A second call gives the same view again.
    assert_eq!(
        p.transposed().unwrap().to_vec::<f32>().unwrap(),
        t.to_vec::<f32>().unwrap()
    );

    // A new value drops the cached view.
    p.set(arange(6, &[3, 2]).multiply(10.0).unwrap());
    let t = p.transposed().unwrap();
    assert_eq!(t.shape(), vec![2, 3]);
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        vec![0.0, 20.0, 40.0, 10.0, 30.0, 50.0]
    );
}

#[test]
fn linear_forward_uses_weights_loaded_after_a_first_call() {
    let mut lin = Linear::new(3, 2, false).unwrap();
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]).unwrap();
    // Zero placeholders first: the cached transpose is of the zeros.
    assert_eq!(
        lin.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 0.0]
    );
    let w = Array::from_slice(&[1.0f32, 0.0, 0.0, 0.0, 1.0, 1.0], &[2, 3]).unwrap();
    lin.load_weights(BTreeMap::from([("weight".to_string(), w)]), true)
        .unwrap();
    assert_eq!(
        lin.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 5.0]
    );
}

#[test]
fn an_unevaluated_cached_view_is_remade_on_another_thread() {
    let p = Param::new(arange(4, &[2, 2]).astype(Dtype::Float32).unwrap());
    // Made (not evaluated) on this thread's stream.
    let _ = p.transposed().unwrap();
    let got = std::thread::spawn(move || p.transposed().unwrap().to_vec::<f32>())
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(got, vec![0.0, 2.0, 1.0, 3.0]);
}
