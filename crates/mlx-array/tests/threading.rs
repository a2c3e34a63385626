//! `Array` is `Send`: an evaluated array can be moved to another thread, used and
//! evaluated there, and the result moved back. (`Sync` is ruled out by a `compile_fail`
//! doctest on [`mlx_array::Array`].) MLX 0.32 gives each thread its own streams, so a
//! graph must be evaluated on the thread that built it before it crosses; an unevaluated
//! one is an error on the other side, not a crash.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops, Array, Dtype};
use std::sync::mpsc;

fn assert_send<T: Send>() {}

#[test]
fn array_is_send() {
    assert_send::<Array>();
    assert_send::<Vec<Array>>();
}

#[test]
fn array_moved_to_another_thread_evaluates_there() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b = a.matmul(&a).unwrap();
    b.eval().unwrap();
    let handle = std::thread::spawn(move || {
        let c = b.add(1.0).unwrap();
        let v = c.to_vec::<f32>().unwrap();
        (v, c)
    });
    let (v, c) = handle.join().expect("worker thread panicked");
    assert_eq!(v, vec![8.0, 11.0, 16.0, 23.0]);
    // The result made on the worker is usable back on this thread.
    assert_eq!(c.sum(None, false).unwrap().item::<f32>().unwrap(), 58.0);
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn a_worker_thread_can_own_all_evaluation_behind_a_channel() {
    let (tx, rx) = mpsc::channel::<(Array, mpsc::Sender<f32>)>();
    let worker = std::thread::spawn(move || {
        let w = ops::arange(0.0, 4.0, 1.0, Dtype::Float32).unwrap();
        for (x, reply) in rx {
            let y = x.multiply(&w).unwrap().sum(None, false).unwrap();
            reply.send(y.item::<f32>().unwrap()).unwrap();
        }
    });
    for k in 1..=5 {
        let (rtx, rrx) = mpsc::channel();
        let x = ops::ones(&[4], Dtype::Float32)
            .unwrap()
            .multiply(k as f32)
            .unwrap();
        x.eval().unwrap();
        tx.send((x, rtx)).unwrap();
        assert_eq!(rrx.recv().unwrap(), 6.0 * k as f32);
    }
    drop(tx);
    worker.join().expect("worker thread panicked");
}

#[test]
fn an_unevaluated_graph_moved_to_another_thread_is_an_error_there() {
    let lazy = ops::ones(&[3], Dtype::Float32).unwrap().add(1.0).unwrap();
    let err = std::thread::spawn(move || lazy.to_vec::<f32>().map_err(|e| e.to_string()))
        .join()
        .expect("worker thread panicked")
        .expect_err("the graph belongs to the main thread's stream");
    assert!(err.contains("no Stream(cpu, 0) in current thread"), "{err}");
    // Both threads keep working.
    let v = std::thread::spawn(|| ops::ones(&[2], Dtype::Float32)?.add(1.0)?.to_vec::<f32>())
        .join()
        .expect("worker thread panicked")
        .unwrap();
    assert_eq!(v, vec![2.0, 2.0]);
    assert_eq!(
        ops::ones(&[2], Dtype::Int32)
            .unwrap()
            .to_vec::<i32>()
            .unwrap(),
        vec![1, 1]
    );
}
