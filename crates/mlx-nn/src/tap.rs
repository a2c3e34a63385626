//! Recording the inputs of dense linear layers during a forward pass: what GPTQ's
//! Hessians are made of (mlx-lm's `Catcher`, which wraps each `nn.Linear` and
//! `SwitchLinear` and sees the `x` it is called with).
//!
//! [`record_inputs`] runs a closure (a model's forward) and returns, in call order, the
//! [`crate::Param::id`] of each dense [`crate::Linear`] / [`crate::SwitchLinear`] weight
//! applied on this thread meanwhile, with its input array (lazy, as the layer got it).
//! Quantized layers and the fused decoding-step path (one position) record nothing.
use mlx_array::Array;
use std::cell::{Cell, RefCell};

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static SEEN: RefCell<Vec<(u64, Array)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f`, returning its result and the `(weight id, input)` of every dense linear
/// layer applied on this thread while it ran. Not reentrant: an inner call takes the
/// inputs recorded so far.
pub fn record_inputs<R>(f: impl FnOnce() -> R) -> (R, Vec<(u64, Array)>) {
    struct Off(bool);
    impl Drop for Off {
        fn drop(&mut self) {
            ON.with(|on| on.set(self.0));
        }
    }
    let was = ON.with(|on| on.replace(true));
    let r = {
        let _off = Off(was);
        f()
    };
    let seen = SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()));
    (r, seen)
}

/// Records `x` as the input of the dense layer whose weight is `weight` (a no-op unless
/// [`record_inputs`] is running on this thread).
#[inline]
pub(crate) fn observe(weight: &crate::Param, x: &Array) {
    if ON.with(Cell::get) {
        SEEN.with(|s| s.borrow_mut().push((weight.id(), x.clone())));
    }
}
