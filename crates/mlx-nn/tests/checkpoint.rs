//! Gradient checkpointing of a layer call with several array arguments and outputs
//! (`mlx_nn::checkpoint::call`): the gradients are those of the plain call, including
//! the share that reaches an argument made outside the layer.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::transforms::value_and_grad;
use mlx_array::{Array, Result};
use mlx_nn::{checkpoint, impl_module, Param};

struct Layer {
    w: Param,
}
impl_module!(Layer { w });

/// `(x * w + y, y * w)`: two arguments, two outputs.
fn forward(l: &Layer, a: &[Array]) -> Result<Vec<Array>> {
    Ok(vec![
        a[0].multiply(&*l.w)?.add(&a[1])?,
        a[1].multiply(&*l.w)?,
    ])
}

/// The loss and its gradient with respect to `w` and `y0`, where the layer's second
/// argument is `3 * y0` (made outside the layer), checkpointed or not.
fn grads(checkpointed: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>, usize) {
    let layer = Layer {
        w: Param::new(Array::from_slice(&[0.5f32, -1.25, 2.0], &[3]).unwrap()),
    };
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let y0 = Array::from_slice(&[0.25f32, -0.5, 1.5], &[3]).unwrap();
    let w0 = layer.w.value().clone();
    // SAFETY: `layer` outlives every gradient taken below (all within this function).
    unsafe { checkpoint::set_enabled(checkpointed) };
    let before = checkpoint::calls();
    let (v, g) = value_and_grad(
        |a: &[Array]| {
            layer.w.retarget(&a[0]);
            let y = a[1].multiply(&Array::from_slice(&[3.0f32], &[]).unwrap())?;
            let out = checkpoint::call(&layer, &[&x, &y], None, |l, a, _| forward(l, a))?;
            let loss = out[0]
                .sum(None, false)?
                .add(&out[1].square()?.sum(None, false)?)?;
            Ok(vec![loss])
        },
        &[&w0, &y0],
        &[0, 1],
    )
    .unwrap();
    let calls = checkpoint::calls() - before;
    // SAFETY: turning checkpointing off has no precondition.
    unsafe { checkpoint::set_enabled(false) };
    (
        v[0].to_vec::<f32>().unwrap(),
        g[0].to_vec::<f32>().unwrap(),
        g[1].to_vec::<f32>().unwrap(),
        calls,
    )
}

#[test]
fn checkpointed_call_gives_the_plain_gradients_to_parameters_and_arguments() {
    let (v, gw, gy, calls) = grads(false);
    assert_eq!(
        calls, 0,
        "nothing is checkpointed while checkpointing is off"
    );
    let (cv, cgw, cgy, ccalls) = grads(true);
    assert!(ccalls >= 1, "the call was not checkpointed");
    assert_eq!(cv, v);
    assert_eq!(cgw, gw);
    assert_eq!(cgy, gy);
    // d/dy0 of sum(x*w + 3*y0) + sum((3*y0*w)^2) = 3 + 18*y0*w^2: nonzero, so an
    // argument taken as a constant of the call would have shown.
    let expected: Vec<f32> = [0.25f32, -0.5, 1.5]
        .iter()
        .zip([0.5f32, -1.25, 2.0])
        .map(|(y, w)| 3.0 + 18.0 * y * w * w)
        .collect();
    for (g, e) in cgy.iter().zip(&expected) {
        assert!((g - e).abs() < 1e-5, "{cgy:?} vs {expected:?}");
    }
}
