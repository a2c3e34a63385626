//! Gradient checkpointing of decoder layers, as mlx-lm's `tuner.trainer.grad_checkpoint`
//! does it: each layer call becomes `mx.checkpoint(inner)(layer.trainable_parameters(),
//! x, ...)`, where `inner` points the layer at the parameters it is given and runs it.
//! The forward keeps only the layer's inputs and output; the backward pass runs the
//! layer again (drawing its dropout keys again, as mlx-lm's does) to take the gradient.
//!
//! A model routes each layer call through [`layer`] (a `(x, mask, cache)` call) or
//! [`call`] (a layer taking or giving more arrays); while checkpointing is off (the
//! default, and always outside training), or with a cache, that is a plain call.
use crate::cache::{AttnMask, KvCache};
use crate::module::{Module, Param};
use mlx_array::transforms::Closure;
use mlx_array::{Array, Result};
use std::cell::Cell;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static CALLS: Cell<usize> = const { Cell::new(0) };
}

/// Turns checkpointing of this thread's layer calls on or off.
///
/// # Safety
/// While it is on, a checkpointed layer call keeps raw pointers to the layer and its
/// parameters inside the returned graph, used when a gradient of that graph is taken:
/// every model called while it is on must stay alive and in place (not moved, not
/// dropped) as long as a gradient of its outputs may still be taken.
pub unsafe fn set_enabled(on: bool) {
    ON.with(|c| c.set(on));
}

/// Whether checkpointing is on on this thread.
pub fn enabled() -> bool {
    ON.with(|c| c.get())
}

/// How many layer calls were checkpointed on this thread so far (a caller that turned
/// checkpointing on can tell a model whose layers do not route through [`layer`]).
pub fn calls() -> usize {
    CALLS.with(|c| c.get())
}

/// A layer's forward: `(layer, x, mask, cache)`.
pub type LayerFn<L> = fn(&L, &Array, &AttnMask, Option<&mut dyn KvCache>) -> Result<Array>;

/// `f(layer, x, mask, cache)`, checkpointed when checkpointing is on and there is no
/// cache (training runs without one): the inputs of the checkpointed function are the
/// layer's trainable parameters (in the model's order) then `x`; the mask, and whatever
/// `f` owns, are constants.
#[track_caller]
pub fn layer<L, F>(
    layer: &L,
    x: &Array,
    mask: &AttnMask,
    cache: Option<&mut dyn KvCache>,
    f: F,
) -> Result<Array>
where
    L: Module + 'static,
    F: Fn(&L, &Array, &AttnMask, Option<&mut dyn KvCache>) -> Result<Array> + 'static,
{
    if cache.is_some() || !enabled() {
        return f(layer, x, mask, cache);
    }
    let mask = mask.clone();
    let out = call(layer, &[x], None, move |l, a, c| {
        Ok(vec![f(l, &a[0], &mask, c)?])
    })?;
    first(out)
}

/// The first of a layer call's outputs.
pub fn first(out: Vec<Array>) -> Result<Array> {
    out.into_iter().next().ok_or_else(|| {
        mlx_array::Error::InvalidArgument("a checkpointed layer gave no output".into())
    })
}

/// `f(layer, inputs, cache)` for a layer whose call takes more than `(x, mask, cache)`
/// or gives more than one array: `inputs` are the arrays mlx-lm's layer `__call__`
/// takes, in its order (the hidden states, then position embeddings, per-layer inputs,
/// keys and values shared from another layer, ...), `f` gets them back as a slice and
/// gives the call's arrays (mlx-lm's return value, flattened). Everything else `f`
/// needs (masks, flags) it owns, as constants of the call.
///
/// Checkpointed as [`layer`] is (when checkpointing is on and there is no cache): the
/// checkpointed function's inputs are the layer's trainable parameters then `inputs`,
/// as `mx.checkpoint(inner)(layer.trainable_parameters(), *args)` flattens them, so a
/// gradient reaches every input (an input made by an earlier layer's trainable
/// parameters gets its share) and every output.
#[track_caller]
pub fn call<L, F>(
    layer: &L,
    inputs: &[&Array],
    cache: Option<&mut dyn KvCache>,
    f: F,
) -> Result<Vec<Array>>
where
    L: Module + 'static,
    F: Fn(&L, &[Array], Option<&mut dyn KvCache>) -> Result<Vec<Array>> + 'static,
{
    if cache.is_some() || !enabled() {
        let args: Vec<Array> = inputs.iter().map(|a| (*a).clone()).collect();
        return f(layer, &args, cache);
    }
    let mut params: Vec<*const Param> = Vec::new();
    let mut all: Vec<Array> = Vec::new();
    layer.visit_params("", &mut |_, p| {
        if !p.is_frozen() {
            params.push(p as *const Param);
            all.push(p.value().clone());
        }
    });
    all.extend(inputs.iter().map(|a| (*a).clone()));
    let n = params.len();
    let ptr = layer as *const L;
    let inner = Closure::new(move |args: &[Array]| -> Result<Vec<Array>> {
        // SAFETY: `set_enabled`'s contract: the layer and its parameters are alive and
        // in place while a gradient of this call's output can be taken. Each parameter
        // is retargeted through a shared borrow (`Param::retarget`), as mlx.nn's
        // `module.update(params)` inside the checkpointed function.
        let layer = unsafe { &*ptr };
        for (p, v) in params.iter().zip(args) {
            // SAFETY: each pointer is a parameter of that same layer (above), alive and
            // in place for as long as the layer is.
            unsafe { &**p }.retarget(v);
        }
        f(layer, &args[n..], None)
    })?;
    let checkpointed = inner.checkpoint()?;
    let refs: Vec<&Array> = all.iter().collect();
    let out = checkpointed.call(&refs)?;
    CALLS.with(|c| c.set(c.get() + 1));
    Ok(out)
}
