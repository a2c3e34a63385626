#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! `random::KeyState`: a saved key sequence draws what the thread's own sequence would
//! have drawn from the same point, and leaves the thread's sequence alone.
use mlx_array::random::{self, KeyState};
use mlx_array::{Array, Dtype};

/// Two draws of 4 uniforms from the thread's global sequence.
fn draw() -> Vec<f32> {
    let (lo, hi) = (
        Array::from_slice(&[0f32], &[1]).unwrap(),
        Array::from_slice(&[1f32], &[1]).unwrap(),
    );
    let a = random::uniform(&lo, &hi, &[4], Dtype::Float32, None).unwrap();
    let b = random::uniform(&lo, &hi, &[4], Dtype::Float32, None).unwrap();
    [a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap()].concat()
}

#[test]
fn a_seeded_key_state_draws_what_seeding_the_thread_draws() {
    random::seed(7).unwrap();
    let seeded = draw();
    let then = draw();

    random::seed(1234).unwrap();
    let outside = draw();
    random::seed(1234).unwrap();
    let mut keys = KeyState::seeded(7).unwrap();
    // Creating it left the thread's sequence where it was.
    assert_eq!(draw(), outside);

    // Restored, it draws seed 7's first values; saved again and restored later, it
    // continues with the next ones, whatever the thread drew in between.
    let mine = KeyState::save().unwrap();
    keys.restore().unwrap();
    assert_eq!(draw(), seeded);
    keys = KeyState::save().unwrap();
    let copy = keys.try_clone().unwrap();
    mine.restore().unwrap();
    draw();
    keys.restore().unwrap();
    assert_eq!(draw(), then);
    copy.restore().unwrap();
    assert_eq!(draw(), then, "a copy does not advance with the original");
    assert_ne!(seeded, then);
}
