//! Parameter trees: [`Param`], the [`Module`] trait and strict weight loading.
//!
//! A module exposes its arrays under dotted names that match checkpoint names
//! (`model.layers.3.self_attn.q_proj.weight`): a struct field's name is the path
//! component, a `Vec` adds the index, an absent `Option` adds nothing.
use crate::error::{Error, Result};
use crate::quantize::Quantizable;
use mlx_array::{Array, ArrayRef, Dtype, Operand};
use std::collections::BTreeMap;

/// One parameter array and whether it is frozen (excluded from training).
#[derive(Debug, Clone)]
pub struct Param {
    value: Array,
    frozen: bool,
    /// `value.T` and the thread that made it, made on first use and dropped whenever
    /// the value changes, so a linear layer adds no transpose node to every forward (see
    /// [`Param::transposed`]).
    transposed: std::cell::RefCell<Option<(std::thread::ThreadId, Array)>>,
    /// `value` cast to another dtype and the thread that made it (see [`Param::cast`]).
    cast: std::cell::RefCell<Option<(std::thread::ThreadId, Dtype, Array)>>,
    /// Unique to this value: a new one on every [`Param::set`] (see [`Param::id`]).
    id: u64,
}

fn next_param_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Param {
    /// A trainable parameter.
    pub fn new(value: Array) -> Param {
        Param {
            value,
            frozen: false,
            transposed: std::cell::RefCell::new(None),
            cast: std::cell::RefCell::new(None),
            id: next_param_id(),
        }
    }

    /// A frozen parameter (quantized weights are created frozen, like mlx.nn).
    pub fn frozen(value: Array) -> Param {
        Param {
            frozen: true,
            ..Param::new(value)
        }
    }

    /// The array.
    pub fn value(&self) -> &Array {
        &self.value
    }

    /// Replaces the array, keeping the frozen flag.
    pub fn set(&mut self, value: Array) {
        self.value = value;
        self.forget_derived();
        self.id = next_param_id();
    }

    /// An id of the current value, unique in the process: a parameter keeps it until
    /// [`Param::set`] replaces the value (clones share it). Lets a layer tell whether
    /// something it derived from the value (e.g. [`crate::FusedLinears`]) still holds.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// `value.transpose()` (all axes reversed), the same lazy view the op would make,
    /// built once and reused until [`Param::set`] replaces the value. Once evaluated it
    /// is a plain view of the weight's buffer, so later graphs skip a transpose node
    /// (construction and scheduling) per use at no memory cost, with bit-identical
    /// results. The view is remade on another thread than the one that made it: an
    /// unevaluated view belongs to that thread's stream.
    #[track_caller]
    pub fn transposed(&self) -> mlx_array::Result<Array> {
        let me = std::thread::current().id();
        if let Some((tid, t)) = self.transposed.borrow().as_ref() {
            if *tid == me {
                return Ok(t.clone());
            }
        }
        let t = self.value.transpose(None)?;
        *self.transposed.borrow_mut() = Some((me, t.clone()));
        Ok(t)
    }

    /// `value.astype(dtype)`, made once and reused (like [`Param::transposed`]) while
    /// the value is an evaluated array: an affine quantized product with float32
    /// activations casts its float16 / bfloat16 scales and biases to float32 on every
    /// call (MLX's `quantized_matmul` does), one cast node per operand per step; handing
    /// it this array instead gives the same bits without them. Costs the cast copy's
    /// memory for as long as the parameter keeps its value. An unevaluated value (a
    /// lazy load, a traced copy) is cast afresh each call.
    #[track_caller]
    pub fn cast(&self, dtype: Dtype) -> mlx_array::Result<Array> {
        if self.value.dtype() == dtype {
            return Ok(self.value.clone());
        }
        let me = std::thread::current().id();
        if let Some((tid, d, a)) = self.cast.borrow().as_ref() {
            if *tid == me && *d == dtype {
                return Ok(a.clone());
            }
        }
        let a = self.value.astype(dtype)?;
        if self.value.is_available() {
            *self.cast.borrow_mut() = Some((me, dtype, a.clone()));
        }
        Ok(a)
    }

    /// Points this parameter at `value` in place, through a shared borrow (see
    /// [`Array::assign`]): gradient checkpointing ([`crate::checkpoint`]) hands a layer's
    /// recomputation MLX's traced copies of its parameters this way while the model is
    /// borrowed by its own forward. The id stays (the values are the same numbers); the
    /// cached transpose is dropped.
    pub fn retarget(&self, value: &Array) {
        self.value.assign(value);
        self.forget_derived();
    }

    /// Drops what was made from the value (its transpose, its cast).
    fn forget_derived(&self) {
        *self.transposed.borrow_mut() = None;
        *self.cast.borrow_mut() = None;
    }

    /// Whether the parameter is frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Freezes or unfreezes the parameter.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }
}

impl std::ops::Deref for Param {
    type Target = Array;
    fn deref(&self) -> &Array {
        &self.value
    }
}

impl<'a> Operand<'a> for &'a Param {
    fn resolve(self, _other: Dtype) -> mlx_array::Result<ArrayRef<'a>> {
        Ok(ArrayRef::Borrowed(&self.value))
    }
}

/// Joins a dotted prefix and a name (an empty name adds nothing: a field declared
/// `as ""` in [`crate::impl_module!`] lends its parameters to its owner).
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else if name.is_empty() {
        prefix.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Callback type of [`Module::visit_quantizable_mut`].
pub type QuantVisitor<'f> = dyn FnMut(&str, &mut dyn Quantizable) -> Result<()> + 'f;

/// A layer or a tree of layers holding [`Param`]s.
///
/// Implement it with [`impl_module!`](crate::impl_module) for structs whose fields are
/// modules; the provided methods give mlx.nn's `parameters`, `trainable_parameters`,
/// `update`, `load_weights`, `freeze` and `unfreeze`.
pub trait Module {
    /// Calls `f` with the dotted name and the parameter, for every parameter.
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param));

    /// Calls `f` with the dotted name and the parameter, mutably.
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param));

    /// Calls `f` for every layer that can be quantized (Linear, Embedding, SwitchLinear),
    /// with its dotted module path. Containers forward to their children.
    fn visit_quantizable_mut(&mut self, prefix: &str, f: &mut QuantVisitor<'_>) -> Result<()> {
        let _ = (prefix, f);
        Ok(())
    }

    /// Every parameter with its dotted name (mlx.nn's flattened `parameters()`).
    fn parameters(&self) -> Vec<(String, Array)> {
        let mut out = Vec::new();
        self.visit_params("", &mut |n, p| out.push((n.to_string(), p.value().clone())));
        out
    }

    /// The parameters that are not frozen.
    fn trainable_parameters(&self) -> Vec<(String, Array)> {
        let mut out = Vec::new();
        self.visit_params("", &mut |n, p| {
            if !p.is_frozen() {
                out.push((n.to_string(), p.value().clone()))
            }
        });
        out
    }

    /// Dotted names and shapes of every parameter.
    fn parameter_shapes(&self) -> BTreeMap<String, Vec<i32>> {
        let mut out = BTreeMap::new();
        self.visit_params("", &mut |n, p| {
            out.insert(n.to_string(), p.shape());
        });
        out
    }

    /// Replaces the named parameters. A name the module does not have is an error
    /// (nothing is changed then); shapes may change.
    fn update(&mut self, mut weights: BTreeMap<String, Array>) -> Result<()> {
        let names = self.parameter_shapes();
        let unexpected: Vec<String> = weights
            .keys()
            .filter(|k| !names.contains_key(*k))
            .cloned()
            .collect();
        if !unexpected.is_empty() {
            return Err(Error::UnexpectedParameters(unexpected));
        }
        self.visit_params_mut("", &mut |n, p| {
            if let Some(a) = weights.remove(n) {
                p.set(a)
            }
        });
        Ok(())
    }

    /// Loads weights from a flat map like mlx.nn's `load_weights`. With `strict`,
    /// unexpected names, missing names and shape mismatches are errors naming the
    /// parameters (nothing is changed then); without it, only known names with
    /// matching shapes are taken and the rest is ignored.
    fn load_weights(&mut self, mut weights: BTreeMap<String, Array>, strict: bool) -> Result<()> {
        let shapes = self.parameter_shapes();
        if strict {
            let unexpected: Vec<String> = weights
                .keys()
                .filter(|k| !shapes.contains_key(*k))
                .cloned()
                .collect();
            if !unexpected.is_empty() {
                return Err(Error::UnexpectedParameters(unexpected));
            }
            let missing: Vec<String> = shapes
                .keys()
                .filter(|k| !weights.contains_key(*k))
                .cloned()
                .collect();
            if !missing.is_empty() {
                return Err(Error::MissingParameters(missing));
            }
            for (name, expected) in &shapes {
                if let Some(w) = weights.get(name) {
                    let got = w.shape();
                    if &got != expected {
                        return Err(Error::ShapeMismatch {
                            name: name.clone(),
                            expected: expected.clone(),
                            got,
                        });
                    }
                }
            }
        }
        self.visit_params_mut("", &mut |n, p| {
            if let Some(a) = weights.remove(n) {
                if strict || a.shape() == p.shape() {
                    p.set(a)
                }
            }
        });
        Ok(())
    }

    /// Freezes every parameter.
    fn freeze(&mut self) {
        self.visit_params_mut("", &mut |_, p| p.set_frozen(true));
    }

    /// Unfreezes every parameter.
    fn unfreeze(&mut self) {
        self.visit_params_mut("", &mut |_, p| p.set_frozen(false));
    }

    /// Freezes (`frozen = true`) or unfreezes the parameters whose dotted name satisfies
    /// `pred`; returns how many were changed.
    fn set_frozen_where(&mut self, frozen: bool, pred: &dyn Fn(&str) -> bool) -> usize {
        let mut n = 0;
        self.visit_params_mut("", &mut |name, p| {
            if pred(name) {
                p.set_frozen(frozen);
                n += 1;
            }
        });
        n
    }

    /// Casts every floating-point parameter to `dtype` (like mlx-lm's `--dtype`).
    fn cast_floating(&mut self, dtype: Dtype) -> Result<()> {
        let mut err = None;
        self.visit_params_mut("", &mut |_, p| {
            if err.is_none() && p.dtype().is_floating() && p.dtype() != dtype {
                match p.astype(dtype) {
                    Ok(a) => p.set(a),
                    Err(e) => err = Some(e),
                }
            }
        });
        err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Total number of elements over all parameters.
    fn num_parameters(&self) -> usize {
        let mut n = 0;
        self.visit_params("", &mut |_, p| n += p.size());
        n
    }

    /// Evaluates every parameter (loads lazily read weights into memory).
    fn eval_parameters(&self) -> Result<()> {
        let mut arrays: Vec<&Array> = Vec::new();
        self.visit_params("", &mut |_, p| arrays.push(p.value()));
        mlx_array::eval(&arrays)?;
        Ok(())
    }
}

impl Module for Param {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        f(prefix, self)
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        f(prefix, self)
    }
}

impl<M: Module> Module for Option<M> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        if let Some(m) = self {
            m.visit_params(prefix, f)
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        if let Some(m) = self {
            m.visit_params_mut(prefix, f)
        }
    }
    fn visit_quantizable_mut(&mut self, prefix: &str, f: &mut QuantVisitor<'_>) -> Result<()> {
        match self {
            Some(m) => m.visit_quantizable_mut(prefix, f),
            None => Ok(()),
        }
    }
}

impl<M: Module> Module for Vec<M> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        for (i, m) in self.iter().enumerate() {
            m.visit_params(&join(prefix, &i.to_string()), f)
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_params_mut(&join(prefix, &i.to_string()), f)
        }
    }
    fn visit_quantizable_mut(&mut self, prefix: &str, f: &mut QuantVisitor<'_>) -> Result<()> {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_quantizable_mut(&join(prefix, &i.to_string()), f)?
        }
        Ok(())
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        (**self).visit_params(prefix, f)
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        (**self).visit_params_mut(prefix, f)
    }
    fn visit_quantizable_mut(&mut self, prefix: &str, f: &mut QuantVisitor<'_>) -> Result<()> {
        (**self).visit_quantizable_mut(prefix, f)
    }
}

/// Implements [`Module`] for a struct by listing its module fields; the field name is
/// the path component (`field as "name"` renames it).
///
/// ```
/// use mlx_nn::{impl_module, Linear, Module};
/// struct Mlp { up_proj: Linear, down_proj: Linear }
/// impl_module!(Mlp { up_proj, down_proj });
/// let m = Mlp { up_proj: Linear::new(4, 8, false)?, down_proj: Linear::new(8, 4, true)? };
/// let names: Vec<String> = m.parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["up_proj.weight", "down_proj.weight", "down_proj.bias"]);
/// # Ok::<(), mlx_nn::Error>(())
/// ```
///
/// Other methods of [`Module`] (a `cast_floating` that keeps some parameters' dtype, ...)
/// follow the field list and go into the same `impl`.
#[macro_export]
macro_rules! impl_module {
    ($ty:ty { $($field:ident $(as $name:literal)?),* $(,)? } $($extra:item)*) => {
        impl $crate::Module for $ty {
            $($extra)*
            fn visit_params<'a>(
                &'a self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &'a $crate::Param),
            ) {
                $( $crate::Module::visit_params(
                    &self.$field,
                    &$crate::module::join(prefix, $crate::impl_module!(@name $field $($name)?)),
                    f,
                ); )*
            }
            fn visit_params_mut(
                &mut self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &mut $crate::Param),
            ) {
                $( $crate::Module::visit_params_mut(
                    &mut self.$field,
                    &$crate::module::join(prefix, $crate::impl_module!(@name $field $($name)?)),
                    f,
                ); )*
            }
            fn visit_quantizable_mut(
                &mut self,
                prefix: &str,
                f: &mut $crate::module::QuantVisitor<'_>,
            ) -> $crate::Result<()> {
                $( $crate::Module::visit_quantizable_mut(
                    &mut self.$field,
                    &$crate::module::join(prefix, $crate::impl_module!(@name $field $($name)?)),
                    f,
                )?; )*
                Ok(())
            }
        }
    };
    (@name $field:ident) => { stringify!($field) };
    (@name $field:ident $name:literal) => { $name };
}
