//! The SwiGLU feed-forward block most mlx-lm files write out again:
//! `down_proj(swiglu(gate_proj(x), up_proj(x)))`.
use super::{fuse, project_out, swiglu_mlp};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, FusedLinears, LinearLayer};

/// The SwiGLU feed-forward block.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: LinearLayer,
    down_proj: LinearLayer,
    up_proj: LinearLayer,
    /// gate/up as one matmul for decoding steps (set by the loader).
    gate_up: Option<Box<FusedLinears>>,
}
impl_module!(Mlp {
    gate_proj,
    down_proj,
    up_proj
});

impl Mlp {
    /// Zero placeholders: `dim -> hidden -> dim`, all three biased or none.
    pub(crate) fn new(dim: i32, hidden: i32, bias: bool) -> crate::Result<Mlp> {
        Ok(Mlp {
            gate_proj: LinearLayer::new(dim, hidden, bias)?,
            down_proj: LinearLayer::new(hidden, dim, bias)?,
            up_proj: LinearLayer::new(dim, hidden, bias)?,
            gate_up: None,
        })
    }

    /// The block's output (plus `residual`, added as `residual + down_proj(..)` would).
    pub(crate) fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let h = swiglu_mlp(self.gate_up.as_deref(), &self.gate_proj, &self.up_proj, x)?;
        project_out(&self.down_proj, &h, residual)
    }

    /// Fuses dense gate/up into one matmul for decoding steps.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        self.gate_up = fuse([&mut self.gate_proj, &mut self.up_proj])?;
        Ok(())
    }
}
