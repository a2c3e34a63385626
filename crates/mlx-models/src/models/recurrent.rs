//! Plumbing the recurrent-layer files share (gated delta-net, short convolution and
//! Mamba-2 families): a layer that is one of several modules, the masked input and the
//! convolution window their `ArraysCache` keeps, and the error for a wrong cache.
use mlx_array::{ops, Array, Dtype, Error, Result, Scalar};
use mlx_nn::cache::ArraysState;
use mlx_nn::KvCache;

/// `impl Module` for an enum whose variants each box one module, under the given
/// name (`""` lends the variant's parameters to the owner).
macro_rules! enum_module {
    ($ty:ident { $($var:ident => $name:literal),* $(,)? }) => {
        impl mlx_nn::Module for $ty {
            fn visit_params<'a>(
                &'a self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &'a mlx_nn::Param),
            ) {
                match self {$(
                    $ty::$var(m) => m.visit_params(&mlx_nn::module::join(prefix, $name), f),
                )*}
            }
            fn visit_params_mut(
                &mut self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &mut mlx_nn::Param),
            ) {
                match self {$(
                    $ty::$var(m) => m.visit_params_mut(&mlx_nn::module::join(prefix, $name), f),
                )*}
            }
            fn visit_quantizable_mut(
                &mut self,
                prefix: &str,
                f: &mut mlx_nn::module::QuantVisitor<'_>,
            ) -> mlx_nn::Result<()> {
                match self {$(
                    $ty::$var(m) => {
                        m.visit_quantizable_mut(&mlx_nn::module::join(prefix, $name), f)
                    }
                )*}
            }
        }
    };
}

/// A depthwise `nn.Conv1d` (weight `[channels, kernel, 1]`), with an optional bias: the
/// short convolution of the Mamba, short-convolution and RG-LRU mixers.
#[derive(Debug)]
pub(crate) struct DepthwiseConv {
    pub(crate) weight: mlx_nn::Param,
    pub(crate) bias: Option<mlx_nn::Param>,
}
mlx_nn::impl_module!(DepthwiseConv { weight, bias });

impl DepthwiseConv {
    /// Float32 zeros (placeholders until the weights load): `[channels, kernel, 1]`, and
    /// a `[channels]` bias when `bias`.
    pub(crate) fn zeros(channels: i32, kernel: i32, bias: bool) -> Result<DepthwiseConv> {
        Ok(DepthwiseConv {
            weight: mlx_nn::Param::new(ops::zeros(&[channels, kernel, 1], Dtype::Float32)?),
            bias: if bias {
                Some(mlx_nn::Param::new(ops::zeros(&[channels], Dtype::Float32)?))
            } else {
                None
            },
        })
    }

    /// `conv1d(x, weight, groups=channels)` of an input already padded on the left, plus
    /// the bias.
    pub(crate) fn apply(&self, padded: &Array) -> Result<Array> {
        let channels = self.weight.dim(0)?;
        let out = ops::conv1d(padded, &self.weight, 1, 0, 1, channels)?;
        match &self.bias {
            Some(b) => out.add(b),
            None => Ok(out),
        }
    }

    /// mlx-lm's unmasked causal form (Mamba, Jamba, RecurrentGemma): `x` `[B, L, C]`
    /// after the cached `window` (its last `kernel - 1` inputs), or after `kernel - 1`
    /// zeros without one, through [`DepthwiseConv::apply`]; with the new window.
    pub(crate) fn causal(&self, x: &Array, window: Option<&Array>) -> Result<(Array, Array)> {
        let k = self.weight.dim(1)?;
        let padded = match window {
            Some(w) => ops::concatenate(&[w, x], 1)?,
            None => x.pad(&[1], &[k - 1], &[0], None, "constant")?,
        };
        let out = self.apply(&padded)?;
        let n = padded.dim(1)?;
        Ok((out, padded.slice_axis(1, n - (k - 1), n)?))
    }

    /// mlx-lm's masked form (the Mamba-2 family's and PLaMo 2's `_conv`): `input`'s padded
    /// positions zeroed (`mask`), then after the cached window (zeros for a fresh cache;
    /// the last `kernel - 1` positions kept in its slot 0), or after `kernel - 1` zeros
    /// without a cache, through [`DepthwiseConv::apply`].
    pub(crate) fn masked_causal(
        &self,
        input: &Array,
        cache: Option<&mut ArraysState>,
        mask: Option<&Array>,
    ) -> Result<Array> {
        let input = mask_positions(input.clone(), mask)?;
        let n_keep = self.weight.dim(1)? - 1;
        let padded = match cache {
            Some(cache) => {
                let (b, dtype) = (input.dim(0)?, input.dtype());
                let channels = self.weight.dim(0)?;
                let state = conv_window_or_zeros(Some(cache), b, n_keep, channels, dtype)?;
                let padded = ops::concatenate(&[&state, &input], 1)?;
                keep_conv_window(cache, &padded, n_keep, padded.dim(1)? - n_keep, false)?;
                padded
            }
            None => input.pad(&[1], &[n_keep], &[0], None, "constant")?,
        };
        self.apply(&padded)
    }
}

/// `mx.where(mask[..., None], x, 0)`: padded positions zeroed (`x` unchanged without a
/// mask).
pub(crate) fn mask_positions(x: Array, mask: Option<&Array>) -> Result<Array> {
    match mask {
        Some(m) => {
            let zero = Array::weak_scalar(Scalar::Int(0), x.dtype())?;
            ops::where_(&m.expand_dims(&[-1])?, &x, &zero)
        }
        None => Ok(x),
    }
}

/// The convolution window an `ArraysCache` keeps in slot 0 after `new` tokens were
/// appended to `padded` (`[B, n_keep + new, C]`): each row's last `n_keep` real
/// positions, with a batch's remaining lengths (`ends = clip(lengths, 0, new)`), else
/// the last `n_keep` (made contiguous where the mlx-lm file does).
pub(crate) fn keep_conv_window(
    cache: &mut ArraysState,
    padded: &Array,
    n_keep: i32,
    new: i32,
    contiguous: bool,
) -> Result<()> {
    let kept = match &cache.lengths {
        Some(lengths) => {
            let lo = Array::weak_scalar(Scalar::Int(0), lengths.dtype())?;
            let hi = Array::weak_scalar(Scalar::Int(new.into()), lengths.dtype())?;
            let ends = lengths.clip(Some(&lo), Some(&hi))?;
            let steps = ops::arange(0.0, n_keep as f64, 1.0, Dtype::Int32)?;
            let pos = ends.expand_dims(&[1])?.add(&steps)?.expand_dims(&[-1])?;
            padded.take_along_axis(&pos, 1)?
        }
        None => {
            let t = padded.dim(1)?;
            let last = padded.slice_axis(1, t - n_keep, t)?;
            if contiguous {
                last.contiguous()?
            } else {
                last
            }
        }
    };
    cache.set(0, kept)
}

/// Slot 0 of a cache (the convolution window), or zeros `[B, n_keep, C]` of `dtype`.
pub(crate) fn conv_window_or_zeros(
    cache: Option<&ArraysState>,
    b: i32,
    n_keep: i32,
    channels: i32,
    dtype: Dtype,
) -> Result<Array> {
    match cache.and_then(|c| c.get(0)) {
        Some(c) => Ok(c.clone()),
        None => ops::zeros(&[b, n_keep, channels], dtype),
    }
}

/// The recurrent state of layer `layer`: its cache's slots, or an error naming the
/// layer when it was given a key/value cache.
pub(crate) fn recurrent_state<'a>(
    cache: Option<&'a mut dyn KvCache>,
    layer: usize,
    kind: &str,
) -> Result<Option<&'a mut ArraysState>> {
    match cache {
        None => Ok(None),
        Some(c) => c.arrays_mut().map(Some).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "layer {layer} is a {kind} layer and needs an ArraysCache (its recurrent \
                 state), not a key/value cache"
            ))
        }),
    }
}
