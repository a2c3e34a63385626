//! [`FusedLinears`]: linear layers that read the same input (an attention block's q/k/v
//! projections, an MLP's gate and up projections) stored as one concatenated weight, so
//! a single-position step (decoding) runs one matmul instead of one per layer.
//!
//! Each output element of a matmul is the same dot product of an input row with a
//! weight row whichever other rows the weight holds, so the fused step is meant to give
//! the separate layers' values bit for bit; `mlx-engine`'s `fused_check` example checks
//! that on a device (identical on the H200 for dense and 4-bit Qwen2.5 / Llama 3 shapes
//! at batch 1 and 4), and the models' parity tests on the CPU. `mlx-models` fuses dense
//! layers only: fused 4-bit layers measured slower there. Every other step
//! (prefill, several positions) runs the separate layers, whose weights are now views
//! into the fused buffer: same shapes, same data, no extra memory.
//!
//! The fused weights follow the layers' parameters: when any of them is replaced
//! (loading other weights, quantizing, LoRA) the layers no longer match
//! ([`FusedLinears::matches`]) and callers go back to the separate layers.
use crate::error::Result as NnResult;
use crate::linear::LinearLayer;
use crate::quantize::{QuantSpec, Quantizable};
use mlx_array::quant::quantized_matmul;
use mlx_array::{ops, transforms, Array, Result};

/// The concatenated weights of several [`LinearLayer`]s with the same input.
#[derive(Debug)]
pub struct FusedLinears {
    /// Output features of each layer, in order.
    sizes: Vec<i32>,
    kind: Kind,
    /// [`crate::Param::id`]s of every parameter of the layers, as fused.
    ids: Vec<u64>,
}

#[derive(Debug)]
enum Kind {
    Dense {
        /// `weight.T` of the concatenated `[N, K]` weight.
        weight_t: Array,
        bias: Option<Array>,
    },
    Quantized {
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        bias: Option<Array>,
        spec: QuantSpec,
    },
}

/// Calls `f` with the [`crate::Param::id`] of every parameter of `layers`, in order.
fn for_each_id(layers: &[&LinearLayer], mut f: impl FnMut(u64)) {
    for_each_id_dyn(layers, &mut f)
}

fn for_each_id_dyn(layers: &[&LinearLayer], f: &mut dyn FnMut(u64)) {
    for l in layers {
        match l {
            // The adapter's parameters count too, so a layer given an adapter after the
            // fusion no longer matches it (and runs on its own, adapter included).
            LinearLayer::Lora(a) => {
                for_each_id_dyn(&[&a.base], f);
                f(a.lora_a.id());
                f(a.lora_b.id());
            }
            // Resident adapters too: with any on the layer it runs on its own.
            LinearLayer::Resident(r) => {
                for_each_id_dyn(&[&r.base], f);
                for a in &r.adapters {
                    f(a.lora_a.id());
                    f(a.lora_b.id());
                }
            }
            LinearLayer::Dense(d) => {
                f(d.weight.id());
                d.bias.iter().for_each(|b| f(b.id()));
            }
            LinearLayer::Quantized(q) => {
                f(q.weight.id());
                f(q.scales.id());
                q.biases.iter().for_each(|b| f(b.id()));
                q.bias.iter().for_each(|b| f(b.id()));
            }
        }
    }
}

/// Concatenates `parts` along axis 0, evaluates the result and returns it with a view
/// of each part's rows (evaluated: they share the concatenated buffer).
fn concat_with_views(parts: &[&Array]) -> Result<(Array, Vec<Array>)> {
    let fused = ops::concatenate(parts, 0)?;
    transforms::eval(&[&fused])?;
    let mut views = Vec::with_capacity(parts.len());
    let mut start = 0;
    for p in parts {
        let shape = p.shape();
        let rows = shape[0];
        let mut begin = vec![0; shape.len()];
        begin[0] = start;
        let mut end = shape.clone();
        end[0] = start + rows;
        views.push(fused.slice(&begin, &end, None)?);
        start += rows;
    }
    let refs: Vec<&Array> = views.iter().collect();
    transforms::eval(&refs)?;
    Ok((fused, views))
}

impl FusedLinears {
    /// Fuses `layers` when they can be: all dense with one dtype and input size, or all
    /// quantized alike; biases on all or none. Their parameters become views into the
    /// fused buffers (the separate arrays are released). `None` when they differ.
    pub fn fuse(layers: &mut [&mut LinearLayer]) -> NnResult<Option<FusedLinears>> {
        if layers.len() < 2
            || layers
                .iter()
                .any(|l| matches!(**l, LinearLayer::Lora(_) | LinearLayer::Resident(_)))
        {
            return Ok(None);
        }
        let sizes: Vec<i32> = layers
            .iter()
            .map(|l| match &**l {
                LinearLayer::Dense(d) => d.weight.shape()[0],
                LinearLayer::Quantized(q) => q.weight.shape()[0],
                LinearLayer::Lora(a) => a.base.dense_weight_shape()[0],
                LinearLayer::Resident(a) => a.base.dense_weight_shape()[0],
            })
            .collect();
        let kind = if let Some(mut dense) = pick(layers, |l| match l {
            LinearLayer::Dense(d) => Some(d),
            LinearLayer::Quantized(_) | LinearLayer::Lora(_) | LinearLayer::Resident(_) => None,
        }) {
            fuse_dense(&mut dense)?
        } else if let Some(mut qs) = pick(layers, |l| match l {
            LinearLayer::Quantized(q) => Some(q),
            LinearLayer::Dense(_) | LinearLayer::Lora(_) | LinearLayer::Resident(_) => None,
        }) {
            fuse_quantized(&mut qs)?
        } else {
            None
        };
        let Some(kind) = kind else {
            return Ok(None);
        };
        let refs: Vec<&LinearLayer> = layers.iter().map(|l| &**l).collect();
        let mut ids = Vec::new();
        for_each_id(&refs, |id| ids.push(id));
        Ok(Some(FusedLinears { sizes, kind, ids }))
    }

    /// Whether `layers` still hold the parameters that were fused (checked on every
    /// decoding step, so without allocating).
    pub fn matches(&self, layers: &[&LinearLayer]) -> bool {
        let (mut n, mut same) = (0, true);
        for_each_id(layers, |id| {
            same &= self.ids.get(n) == Some(&id);
            n += 1;
        });
        same && n == self.ids.len()
    }

    /// mlx-lm's `swiglu(g, u)` of the two outputs of [`FusedLinears::forward`], as one
    /// launch of our kernel ([`mlx_array::fast::matmul_swiglu`]: the same bits) where it
    /// covers the call: two dense layers of one size without biases (an MLP's gate and up
    /// projections) and a one-row `x` on the CUDA backend. `None` elsewhere.
    pub fn forward_swiglu(&self, x: &Array) -> Result<Option<Array>> {
        match &self.kind {
            Kind::Dense {
                weight_t,
                bias: None,
            } if self.sizes.len() == 2 && self.sizes[0] == self.sizes[1] => {
                mlx_array::fast::matmul_swiglu(x, weight_t)
            }
            _ => Ok(None),
        }
    }

    /// Every layer's output for `x`, from one matmul (and one bias add), split along the
    /// last axis.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        let y = match &self.kind {
            Kind::Dense { weight_t, bias } => match bias {
                Some(b) => ops::addmm(b, x, weight_t, 1.0, 1.0)?,
                None => x.matmul(weight_t)?,
            },
            Kind::Quantized {
                weight,
                scales,
                biases,
                bias,
                spec,
            } => {
                let y = quantized_matmul(
                    x,
                    weight,
                    scales,
                    biases.as_ref(),
                    true,
                    Some(spec.group_size),
                    Some(spec.bits),
                    spec.mode,
                )?;
                match bias {
                    Some(b) => y.add(b)?,
                    None => y,
                }
            }
        };
        let mut cuts = Vec::with_capacity(self.sizes.len() - 1);
        let mut at = 0;
        for s in &self.sizes[..self.sizes.len() - 1] {
            at += s;
            cuts.push(at);
        }
        y.split_at(&cuts, -1)
    }
}

/// Every layer as one kind (`get` picks it), or `None` when any layer is of another.
fn pick<'a, T>(
    layers: &'a mut [&mut LinearLayer],
    get: fn(&'a mut LinearLayer) -> Option<&'a mut T>,
) -> Option<Vec<&'a mut T>> {
    let n = layers.len();
    let picked: Vec<&'a mut T> = layers.iter_mut().filter_map(|l| get(l)).collect();
    (picked.len() == n).then_some(picked)
}

/// Dense layers of one dtype and input size, biases on all or none.
fn fuse_dense(dense: &mut [&mut crate::linear::Linear]) -> Result<Option<Kind>> {
    let first = &dense[0].weight;
    let alike = dense.iter().all(|d| {
        d.weight.ndim() == 2
            && d.weight.dtype() == first.dtype()
            && d.weight.shape()[1] == first.shape()[1]
            && d.bias.is_some() == dense[0].bias.is_some()
            && d.bias.as_ref().is_none_or(|b| b.dtype() == first.dtype())
    });
    if !alike {
        return Ok(None);
    }
    type D = crate::linear::Linear;
    let weight = fuse_param(dense, |d| Some(&d.weight), |d| Some(&mut d.weight))?;
    let bias = fuse_param(dense, |d: &D| d.bias.as_ref(), |d| d.bias.as_mut())?;
    let Some(weight) = weight else {
        return Ok(None);
    };
    let weight_t = weight.transpose(None)?;
    transforms::eval(&[&weight_t])?;
    Ok(Some(Kind::Dense { weight_t, bias }))
}

/// Quantized layers of one spec, input size and scale dtype, biases on all or none.
fn fuse_quantized(qs: &mut [&mut crate::linear::QuantizedLinear]) -> Result<Option<Kind>> {
    let (spec, k) = (qs[0].spec, qs[0].weight.shape().get(1).copied());
    let alike = qs.iter().all(|q| {
        q.spec == spec
            && q.weight.ndim() == 2
            && q.weight.shape().get(1).copied() == k
            && q.scales.dtype() == qs[0].scales.dtype()
            && q.biases.is_some() == qs[0].biases.is_some()
            && q.bias.is_some() == qs[0].bias.is_some()
    });
    if !alike {
        return Ok(None);
    }
    type Q = crate::linear::QuantizedLinear;
    let weight = fuse_param(qs, |q| Some(&q.weight), |q| Some(&mut q.weight))?;
    let scales = fuse_param(qs, |q| Some(&q.scales), |q| Some(&mut q.scales))?;
    let biases = fuse_param(qs, |q: &Q| q.biases.as_ref(), |q| q.biases.as_mut())?;
    let bias = fuse_param(qs, |q: &Q| q.bias.as_ref(), |q| q.bias.as_mut())?;
    let (Some(weight), Some(scales)) = (weight, scales) else {
        return Ok(None);
    };
    Ok(Some(Kind::Quantized {
        weight,
        scales,
        biases,
        bias,
        spec,
    }))
}

/// Concatenates one parameter of every layer (`None` when a layer lacks it) and points
/// each layer's parameter at its rows of the result.
fn fuse_param<T>(
    layers: &mut [&mut T],
    get: impl Fn(&T) -> Option<&crate::Param>,
    get_mut: impl Fn(&mut T) -> Option<&mut crate::Param>,
) -> Result<Option<Array>> {
    let parts: Vec<&Array> = layers
        .iter()
        .filter_map(|l| get(l).map(|p| p.value()))
        .collect();
    if parts.len() != layers.len() {
        return Ok(None);
    }
    let (fused, views) = concat_with_views(&parts)?;
    for (l, v) in layers.iter_mut().zip(views) {
        if let Some(p) = get_mut(l) {
            p.set(v);
        }
    }
    Ok(Some(fused))
}
