//! A program may end with work `async_eval` queued still running (a generator dropped
//! with its next step in flight, as mlx-lm's `generate_step` leaves one). The process
//! must still exit cleanly: MLX's statics are not torn down under a stream's thread.
//! (This file holds one test: the harness's exit is the thing under test.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{random, transforms, with_stream, Array, Device, Dtype};

#[test]
fn work_in_flight_at_exit_is_waited_for() {
    let stream = Device::cpu().new_stream().unwrap();
    let pending: Vec<Array> = with_stream(stream, || {
        let key = random::key(3).unwrap();
        let w = random::normal(&[64, 64], Dtype::Float32, None, None, Some(&key))
            .unwrap()
            .multiply(0.05)
            .unwrap();
        let mut out = Vec::new();
        for _ in 0..64 {
            let mut x = w.clone();
            for _ in 0..64 {
                x = x.matmul(&w).unwrap().add(0.5).unwrap();
            }
            transforms::async_eval(&[&x]).unwrap();
            out.push(x);
        }
        out
    });
    // Dropped unread, on purpose: nothing waits for them before the process exits.
    drop(pending);
}
