//! Evaluation and function transforms: `eval`, `async_eval`, `compile`, `vjp`, `jvp`,
//! `value_and_grad`, `checkpoint`.
use crate::array::{Array, VecHandle};
use crate::error::{check, Result};
use mlx_sys as sys;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Evaluates arrays together (one graph, shared work).
#[track_caller]
pub fn eval(arrays: &[&Array]) -> Result<()> {
    let v = VecHandle::from_arrays(arrays.iter().copied())?;
    // SAFETY: `v` is a live vector of live handles.
    check(unsafe { sys::mlxs_eval(v.0) })
}

/// Queues evaluation and returns at once; a later `eval`/read waits for it.
#[track_caller]
pub fn async_eval(arrays: &[&Array]) -> Result<()> {
    let v = VecHandle::from_arrays(arrays.iter().copied())?;
    // SAFETY: `v` is a live vector of live handles.
    check(unsafe { sys::mlxs_async_eval(v.0) })
}

type DynFn<'a> = dyn Fn(&[Array]) -> Result<Vec<Array>> + 'a;

/// A boxed function from arrays to arrays that may borrow for `'a` (what
/// [`with_compiled`] compiles).
pub type BorrowingFn<'a> = Box<dyn Fn(&[Array]) -> Result<Vec<Array>> + 'a>;

unsafe extern "C" fn trampoline(
    payload: *mut c_void,
    inputs: sys::mlxs_vec,
    outputs: sys::mlxs_vec,
) -> i32 {
    // SAFETY: payload is the `Box<DynFn>` made in `Closure::make`.
    let f = unsafe { &*(payload as *const Box<DynFn<'static>>) };
    let ins = {
        // SAFETY: `inputs` is the live vector MLX passed to the trampoline.
        let n = unsafe { sys::mlxs_vec_len(inputs) };
        let mut ins = Vec::with_capacity(n);
        for i in 0..n {
            let mut p: sys::mlxs_array = std::ptr::null_mut();
            // SAFETY: `i < n` indexes the live input vector; status 0 means a new owned handle.
            if unsafe { sys::mlxs_vec_get(inputs, i, &mut p) } != 0 {
                return 1; // the shim's message is already set
            }
            // SAFETY: status 0 above means the shim wrote a new owned handle to `p`.
            ins.push(unsafe { Array::from_raw(p) });
        }
        ins
    };
    let res = catch_unwind(AssertUnwindSafe(|| f(&ins)));
    let msg = match res {
        Ok(Ok(outs)) => {
            for a in &outs {
                // SAFETY: `outputs` is the live vector the shim passed in.
                if unsafe { sys::mlxs_vec_push(outputs, a.as_raw()) } != 0 {
                    return 1; // the shim's message is already set
                }
            }
            return 0;
        }
        Ok(Err(e)) => e.to_string(),
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            format!("panic inside a closure traced by MLX: {what}")
        }
    };
    let c = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: `c` is a NUL-terminated string; the shim copies it.
    unsafe { sys::mlxs_set_last_error(c.as_ptr()) };
    1
}

unsafe extern "C" fn drop_payload(payload: *mut c_void) {
    // SAFETY: payload was leaked from a `Box<Box<DynFn>>` in `Closure::make`.
    drop(unsafe { Box::from_raw(payload as *mut Box<DynFn<'static>>) });
}

/// A function from arrays to arrays that MLX can call, trace and compile.
pub struct Closure {
    raw: sys::mlxs_closure,
}

impl Drop for Closure {
    fn drop(&mut self) {
        // SAFETY: we own the closure handle and free it exactly once.
        unsafe { sys::mlxs_closure_free(self.raw) }
    }
}

impl Closure {
    /// Wraps a Rust function. It may capture arrays (they become constants when compiled).
    #[track_caller]
    pub fn new(f: impl Fn(&[Array]) -> Result<Vec<Array>> + 'static) -> Result<Closure> {
        // SAFETY: 'static closure; the payload lives until MLX drops its last copy.
        unsafe { Closure::make(Box::new(f)) }
    }

    /// # Safety
    /// The closure must outlive every use of the returned handle by MLX.
    #[track_caller]
    unsafe fn make<'a>(f: Box<DynFn<'a>>) -> Result<Closure> {
        let f: Box<DynFn<'static>> =
            // SAFETY: the boxed closure only lives as long as `with_temp_closure`'s call, which frees the MLX closure (and so this payload) before returning; `'static` is never observed.
            unsafe { std::mem::transmute::<Box<DynFn<'a>>, Box<DynFn<'static>>>(f) };
        let payload = Box::into_raw(Box::new(f)) as *mut c_void;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `payload` is the boxed closure above, `trampoline` matches `mlxs_closure_fn`, and `drop_payload` frees it exactly once (here on failure, by MLX otherwise).
        let rc = unsafe {
            sys::mlxs_closure_new(&mut raw, Some(trampoline), payload, Some(drop_payload))
        };
        if rc != 0 {
            // SAFETY: on failure MLX did not take the payload, so it is freed here, once.
            unsafe { drop_payload(payload) };
        }
        check(rc)?;
        Ok(Closure { raw })
    }

    /// Calls the function.
    #[track_caller]
    pub fn call(&self, inputs: &[&Array]) -> Result<Vec<Array>> {
        let v = VecHandle::from_arrays(inputs.iter().copied())?;
        let mut out = std::ptr::null_mut();
        // SAFETY: `self.raw` is a live closure and `v` a live vector; on success the shim writes a new owned vector.
        check(unsafe { sys::mlxs_closure_apply(&mut out, self.raw, v.0) })?;
        // SAFETY: on success the shim wrote a new owned vector to `out`.
        unsafe { VecHandle::from_raw(out) }.to_arrays()
    }

    /// A compiled version (MLX traces once per input shape, or once when `shapeless`).
    /// Dropping the compiled closure frees its cache entry.
    #[track_caller]
    pub fn compile(&self, shapeless: bool) -> Result<Closure> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `self.raw` is a live closure; on success the shim writes a new owned closure.
        check(unsafe { sys::mlxs_compile(&mut raw, self.raw, shapeless) })?;
        Ok(Closure { raw })
    }

    /// A version that recomputes its intermediates in the backward pass.
    #[track_caller]
    pub fn checkpoint(&self) -> Result<Closure> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `self.raw` is a live closure; on success the shim writes a new owned closure.
        check(unsafe { sys::mlxs_checkpoint(&mut raw, self.raw) })?;
        Ok(Closure { raw })
    }
}

/// Compile modes (`mx.set_compile_mode`-like; `disable_compile` is `Disabled`).
#[derive(Debug, Clone, Copy)]
pub enum CompileMode {
    /// Compiled functions run uncompiled.
    Disabled,
    /// No graph simplification.
    NoSimplify,
    /// No kernel fusion.
    NoFuse,
    /// Everything on.
    Enabled,
}

/// Sets the global compile mode.
#[track_caller]
pub fn set_compile_mode(mode: CompileMode) -> Result<()> {
    // SAFETY: plain setter of MLX's global compile mode.
    check(unsafe { sys::mlxs_set_compile_mode(mode as i32) })
}

fn with_temp_closure<R>(
    f: &(dyn Fn(&[Array]) -> Result<Vec<Array>> + '_),
    body: impl FnOnce(&Closure) -> Result<R>,
) -> Result<R> {
    let boxed: Box<DynFn<'_>> = Box::new(move |a: &[Array]| f(a));
    // SAFETY: the closure handle is dropped at the end of this function, before `f`;
    // vjp/jvp/value_and_grad do not keep the function after they return.
    let c = unsafe { Closure::make(boxed)? };
    body(&c)
}

/// Compiles each of `fs` (MLX traces once per input shape, or once when `shapeless`) and
/// runs `body` with the compiled versions, in the same order. Unlike [`Closure::new`], the
/// functions may borrow (a model behind a `RefCell`, say): they and their compiled cache
/// entries are freed before this returns. A compiled call that hits the cache runs the
/// traced graph without calling the function, so its side effects happen only when it
/// traces.
#[track_caller]
pub fn with_compiled<'a, R>(
    fs: Vec<BorrowingFn<'a>>,
    shapeless: bool,
    body: impl FnOnce(&[Closure]) -> Result<R>,
) -> Result<R> {
    let mut plain = Vec::with_capacity(fs.len());
    let mut compiled = Vec::with_capacity(fs.len());
    for f in fs {
        // SAFETY: the closure handles (plain and compiled, the only holders of `f`'s
        // payload) are dropped at the end of this function, before anything `f` borrows;
        // `body` only gets them by reference, so none escapes.
        let c = unsafe { Closure::make(f)? };
        compiled.push(c.compile(shapeless)?);
        plain.push(c);
    }
    let out = body(&compiled);
    drop(compiled);
    drop(plain);
    out
}

/// Vector-Jacobian product: `(outputs, vjps)` of `f` at `primals` for `cotangents`.
#[track_caller]
pub fn vjp(
    f: impl Fn(&[Array]) -> Result<Vec<Array>>,
    primals: &[&Array],
    cotangents: &[&Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    let p = VecHandle::from_arrays(primals.iter().copied())?;
    let c = VecHandle::from_arrays(cotangents.iter().copied())?;
    with_temp_closure(&f, |cl| {
        let (mut o, mut g) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: `cl.raw` is a live closure and `p`, `c` live vectors; on success the shim writes two new owned vectors.
        check(unsafe { sys::mlxs_vjp(&mut o, &mut g, cl.raw, p.0, c.0) })?;
        // SAFETY: on success the shim wrote two new owned vectors.
        let (o, g) = unsafe { (VecHandle::from_raw(o), VecHandle::from_raw(g)) };
        Ok((o.to_arrays()?, g.to_arrays()?))
    })
}

/// Jacobian-vector product: `(outputs, jvps)` of `f` at `primals` for `tangents`.
#[track_caller]
pub fn jvp(
    f: impl Fn(&[Array]) -> Result<Vec<Array>>,
    primals: &[&Array],
    tangents: &[&Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    let p = VecHandle::from_arrays(primals.iter().copied())?;
    let t = VecHandle::from_arrays(tangents.iter().copied())?;
    with_temp_closure(&f, |cl| {
        let (mut o, mut g) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: `cl.raw` is a live closure and `p`, `t` live vectors; on success the shim writes two new owned vectors.
        check(unsafe { sys::mlxs_jvp(&mut o, &mut g, cl.raw, p.0, t.0) })?;
        // SAFETY: on success the shim wrote two new owned vectors.
        let (o, g) = unsafe { (VecHandle::from_raw(o), VecHandle::from_raw(g)) };
        Ok((o.to_arrays()?, g.to_arrays()?))
    })
}

/// Values of `f` and gradients of its first (scalar) output with respect to the inputs
/// at `argnums`.
///
/// ```
/// use mlx_array::{transforms::value_and_grad, Array};
/// let x = Array::from_slice(&[3.0f32], &[])?;
/// let (v, g) = value_and_grad(|a: &[Array]| Ok(vec![a[0].square()?]), &[&x], &[0])?;
/// assert_eq!(v[0].item::<f32>()?, 9.0);
/// assert_eq!(g[0].item::<f32>()?, 6.0);
/// # Ok::<(), mlx_array::Error>(())
/// ```
#[track_caller]
pub fn value_and_grad(
    f: impl Fn(&[Array]) -> Result<Vec<Array>>,
    inputs: &[&Array],
    argnums: &[i32],
) -> Result<(Vec<Array>, Vec<Array>)> {
    let i = VecHandle::from_arrays(inputs.iter().copied())?;
    with_temp_closure(&f, |cl| {
        let (mut v, mut g) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: `cl.raw` is a live closure, `i` a live vector and `argnums` a live slice; on success the shim writes two new owned vectors.
        check(unsafe {
            sys::mlxs_value_and_grad(&mut v, &mut g, cl.raw, i.0, argnums.as_ptr(), argnums.len())
        })?;
        // SAFETY: on success the shim wrote two new owned vectors.
        let (v, g) = unsafe { (VecHandle::from_raw(v), VecHandle::from_raw(g)) };
        Ok((v.to_arrays()?, g.to_arrays()?))
    })
}
