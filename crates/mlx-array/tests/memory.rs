//! No leaks: MLX's active memory returns to its baseline after arrays, compiled closures
//! and gradient transforms are created, used and dropped.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::transforms::{jvp, value_and_grad, vjp};
use mlx_array::{memory, ops, random, synchronize, Array, Closure, Dtype};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Active memory is process-wide: under `cargo test` (threads, one process) the tests of
/// this file take turns; under nextest each runs in its own process anyway.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Active bytes once queued work is done and the buffer cache is emptied.
fn settled() -> usize {
    synchronize().expect("synchronize");
    memory::clear_cache();
    memory::active_memory()
}

/// Runs some ops once so lazily made global state (random key, ...) exists before the
/// baseline is taken.
fn warm_up() -> usize {
    let k = random::normal(&[4], Dtype::Float32, None, None, None).unwrap();
    k.eval().unwrap();
    drop(k);
    settled()
}

/// A float32 array of `n` elements (4n bytes), evaluated.
fn big(n: i32) -> Array {
    let a = ops::arange(0.0, f64::from(n), 1.0, Dtype::Float32).unwrap();
    a.eval().unwrap();
    a
}

/// Counts drops of the value it is attached to.
struct DropCounter(Arc<AtomicUsize>);
impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn active_memory_returns_to_baseline_after_array_loop() {
    let _serial = serial();
    let base = warm_up();
    for i in 0..200 {
        let a = big(16 * 1024);
        let b = a
            .multiply(2.0)
            .unwrap()
            .add(&a)
            .unwrap()
            .reshape(&[128, 128])
            .unwrap();
        let c = b
            .matmul(&b.transpose(None).unwrap())
            .unwrap()
            .sum(Some(&[0]), false)
            .unwrap();
        c.eval().unwrap();
        if i == 0 {
            assert!(
                memory::active_memory() > base + 64 * 1024,
                "arrays are counted while alive"
            );
        }
    }
    assert_eq!(settled(), base, "active memory after dropping every array");
}

#[test]
fn dropping_a_compiled_closure_frees_its_cache_entry_and_captures() {
    let _serial = serial();
    let base = warm_up();
    let drops = Arc::new(AtomicUsize::new(0));
    for cycle in 0..20 {
        // A 1 MiB constant captured by the closure becomes part of the compiled graph.
        let constant = big(256 * 1024);
        let counter = DropCounter(drops.clone());
        let f = Closure::new(move |a: &[Array]| {
            let _keep = &counter;
            let n = a[0].size() as i32;
            let c = constant.slice(&[0], &[n], None)?.reshape(&a[0].shape())?;
            Ok(vec![a[0].exp()?.multiply(&c)?.add(1.0)?])
        })
        .unwrap();
        let compiled = f.compile(false).unwrap();
        // Two shapes: two traces in the compile cache.
        for n in [8, 16] {
            let x = big(n);
            let y = compiled.call(&[&x]).unwrap();
            let plain = f.call(&[&x]).unwrap();
            assert_eq!(
                y[0].to_vec::<f32>().unwrap(),
                plain[0].to_vec::<f32>().unwrap()
            );
        }
        assert!(
            memory::active_memory() >= base + 1024 * 1024,
            "constant alive while compiled"
        );
        drop(f);
        drop(compiled);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            cycle + 1,
            "closure payload freed on drop"
        );
        assert_eq!(
            settled(),
            base,
            "cycle {cycle}: compiled closure left memory behind"
        );
    }
}

#[test]
fn shapeless_compile_cycles_do_not_grow_memory() {
    let _serial = serial();
    let base = warm_up();
    let mut after_first = None;
    for _ in 0..30 {
        let w = big(64 * 1024);
        let f = Closure::new(move |a: &[Array]| Ok(vec![a[0].multiply(&w.sum(None, false)?)?]))
            .unwrap()
            .compile(true)
            .unwrap();
        for n in [3, 5, 9] {
            f.call(&[&big(n)]).unwrap()[0].eval().unwrap();
        }
        drop(f);
        let now = settled();
        let first = *after_first.get_or_insert(now);
        assert_eq!(now, first, "memory grows across compile/drop cycles");
    }
    assert_eq!(after_first, Some(base));
}

#[test]
fn gradient_transforms_leave_no_memory_behind() {
    let _serial = serial();
    let base = warm_up();
    for _ in 0..50 {
        let x = big(4096);
        let w = big(4096).multiply(1e-3).unwrap();
        let (v, g) = value_and_grad(
            |a: &[Array]| Ok(vec![a[0].multiply(&a[1])?.sin()?.sum(None, false)?]),
            &[&x, &w],
            &[0, 1],
        )
        .unwrap();
        mlx_array::eval(&[&v[0], &g[0], &g[1]]).unwrap();
        let (o, ct) = vjp(|a: &[Array]| Ok(vec![a[0].square()?]), &[&x], &[&w]).unwrap();
        let (o2, t) = jvp(|a: &[Array]| Ok(vec![a[0].tanh()?]), &[&x], &[&w]).unwrap();
        mlx_array::eval(&[&o[0], &ct[0], &o2[0], &t[0]]).unwrap();
        let ck = Closure::new(|a: &[Array]| Ok(vec![a[0].exp()?.sum(None, false)?]))
            .unwrap()
            .checkpoint()
            .unwrap();
        ck.call(&[&x]).unwrap()[0].eval().unwrap();
    }
    assert_eq!(
        settled(),
        base,
        "value_and_grad / vjp / jvp / checkpoint leaked"
    );
}

#[test]
fn peak_memory_tracks_the_largest_live_set() {
    let _serial = serial();
    warm_up();
    memory::reset_peak_memory();
    let a = big(1 << 20);
    let peak = memory::peak_memory();
    assert!(peak >= 4 << 20, "peak {peak} below the 4 MiB array");
    drop(a);
    assert!(
        memory::peak_memory() >= peak,
        "peak does not drop with the array"
    );
}

/// The host-upload pool (on here, though this is the CPU) hands a freed upload's buffer
/// to the next upload of its size, and never the buffer of an array a queued computation
/// still reads: that computation sees the values it was given. Its kept buffers go back
/// with `clear_cache`.
#[test]
fn the_host_upload_pool_reuses_only_buffers_no_computation_reads() {
    let _g = serial();
    memory::set_host_buffer_pool(true);
    let base = warm_up();
    let n = 25_000usize; // 100 kB of float32: a size class of whole pages
    let first: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let a = Array::from_slice(&first, &[n as i32]).unwrap();
    // A computation queued on `a`, then `a`'s handle dropped: the graph still reads it.
    let doubled = a.multiply(&Array::scalar(2.0f32).unwrap()).unwrap();
    drop(a);
    let before = memory::host_buffer_pool_reuses();
    let second: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    let b = Array::from_slice(&second, &[n as i32]).unwrap();
    assert_eq!(
        memory::host_buffer_pool_reuses(),
        before,
        "a buffer still read by a queued computation was handed out again"
    );
    let want: Vec<f32> = first.iter().map(|x| 2.0 * x).collect();
    assert_eq!(doubled.to_vec::<f32>().unwrap(), want);
    assert_eq!(b.to_vec::<f32>().unwrap(), second);
    // Now nothing reads the first buffer: the next upload of its size takes it.
    drop(doubled);
    synchronize().unwrap();
    let third: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let c = Array::from_slice(&third, &[n as i32]).unwrap();
    assert_eq!(memory::host_buffer_pool_reuses(), before + 1);
    assert_eq!(c.to_vec::<f32>().unwrap(), third);
    // A small upload (400 bytes: a power-of-two class) is pooled the same way; a scalar
    // stays MLX's.
    for i in 0..2 {
        let small = Array::from_slice(&[i as f32; 100], &[100]).unwrap();
        assert_eq!(small.to_vec::<f32>().unwrap(), vec![i as f32; 100]);
    }
    assert_eq!(memory::host_buffer_pool_reuses(), before + 2);
    for _ in 0..2 {
        Array::scalar(1.0f32).unwrap().eval().unwrap();
    }
    assert_eq!(memory::host_buffer_pool_reuses(), before + 2);
    drop((b, c));
    assert_eq!(
        settled(),
        base,
        "the pool's kept buffers outlived clear_cache"
    );
}

/// `Array::from_fill` writes in place into the same buffers: a pooled buffer that held
/// an earlier upload comes back zeroed before the fill sees it, the array holds what the
/// fill wrote, and a shape whose byte count overflows is an error, not a panic.
#[test]
fn arrays_filled_in_place_start_zeroed_and_hold_what_was_written() {
    let _g = serial();
    memory::set_host_buffer_pool(true);
    let base = warm_up();
    let n = 4096usize;
    let first = Array::from_fill::<u32>(&[4, 1024], |d| d.fill(7)).unwrap();
    assert_eq!(first.to_vec::<u32>().unwrap(), vec![7; n]);
    drop(first);
    synchronize().unwrap();
    let before = memory::host_buffer_pool_reuses();
    let mut seen = Vec::new();
    let second = Array::from_fill::<u32>(&[4, 1024], |d| {
        seen.extend_from_slice(d);
        for (i, x) in d.iter_mut().enumerate().step_by(3) {
            *x = i as u32;
        }
    })
    .unwrap();
    assert_eq!(
        memory::host_buffer_pool_reuses(),
        before + 1,
        "the freed buffer of its size was not reused"
    );
    assert!(seen.iter().all(|&x| x == 0), "the fill saw old contents");
    let want: Vec<u32> = (0..n as u32)
        .map(|i| if i % 3 == 0 { i } else { 0 })
        .collect();
    assert_eq!(second.to_vec::<u32>().unwrap(), want);
    assert_eq!(second.shape(), vec![4, 1024]);
    let empty = Array::from_fill::<f32>(&[0, 3], |d| assert!(d.is_empty())).unwrap();
    assert_eq!(empty.size(), 0);
    assert!(Array::from_fill::<u32>(&[-1, 2], |_| {}).is_err());
    assert!(Array::from_fill::<f32>(&[i32::MAX, i32::MAX, i32::MAX], |_| {}).is_err());
    drop(second);
    drop(empty);
    assert_eq!(settled(), base, "filled arrays outlived clear_cache");
}
