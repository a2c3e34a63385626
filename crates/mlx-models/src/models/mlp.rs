//! The SwiGLU feed-forward block most mlx-lm files write out again:
//! `down_proj(swiglu(gate_proj(x), up_proj(x)))`.
use super::{fuse, project, project_out, swiglu_mlp};
use mlx_array::{Array, Result};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{FusedLinears, LinearLayer, Module, Param};

/// The SwiGLU feed-forward block.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: LinearLayer,
    down_proj: LinearLayer,
    up_proj: LinearLayer,
    /// gate/up as one matmul for decoding steps (set by the loader).
    gate_up: Option<Box<FusedLinears>>,
    /// The checkpoint names of gate, up and down (default `gate_proj`, `up_proj`,
    /// `down_proj`).
    names: [&'static str; 3],
    /// Visits gate, up, down (the files that declare them in that order) instead of
    /// gate, down, up (llama.py's order): mlx.nn walks a module's children in their
    /// declaration order (reversed), which orders LoRA's key draws and the saved
    /// adapters.
    up_before_down: bool,
    /// `down(act(gate(x)) * up(x))` with this activation instead of the compiled
    /// `swiglu` (Nemotron-NAS's `_ACT2FN`).
    act: Option<fn(&Array) -> Result<Array>>,
}

impl Module for Mlp {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        let [g, u, d] = self.names;
        self.gate_proj.visit_params(&join(prefix, g), f);
        if self.up_before_down {
            self.up_proj.visit_params(&join(prefix, u), f);
            self.down_proj.visit_params(&join(prefix, d), f);
        } else {
            self.down_proj.visit_params(&join(prefix, d), f);
            self.up_proj.visit_params(&join(prefix, u), f);
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        let [g, u, d] = self.names;
        self.gate_proj.visit_params_mut(&join(prefix, g), f);
        if self.up_before_down {
            self.up_proj.visit_params_mut(&join(prefix, u), f);
            self.down_proj.visit_params_mut(&join(prefix, d), f);
        } else {
            self.down_proj.visit_params_mut(&join(prefix, d), f);
            self.up_proj.visit_params_mut(&join(prefix, u), f);
        }
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        let [g, u, d] = self.names;
        self.gate_proj.visit_quantizable_mut(&join(prefix, g), f)?;
        if self.up_before_down {
            self.up_proj.visit_quantizable_mut(&join(prefix, u), f)?;
            self.down_proj.visit_quantizable_mut(&join(prefix, d), f)
        } else {
            self.down_proj.visit_quantizable_mut(&join(prefix, d), f)?;
            self.up_proj.visit_quantizable_mut(&join(prefix, u), f)
        }
    }
}

impl Mlp {
    /// Zero placeholders: `dim -> hidden -> dim`, all three biased or none.
    pub(crate) fn new(dim: i32, hidden: i32, bias: bool) -> crate::Result<Mlp> {
        Ok(Mlp {
            gate_proj: LinearLayer::new(dim, hidden, bias)?,
            down_proj: LinearLayer::new(hidden, dim, bias)?,
            up_proj: LinearLayer::new(dim, hidden, bias)?,
            gate_up: None,
            names: ["gate_proj", "up_proj", "down_proj"],
            up_before_down: false,
            act: None,
        })
    }

    /// The block of a file that declares gate, up, then down (see `up_before_down`).
    pub(crate) fn up_before_down(mut self) -> Mlp {
        self.up_before_down = true;
        self
    }

    /// Names gate, up and down as the checkpoint does (InternLM2's `w1`, `w3`, `w2`).
    pub(crate) fn with_names(
        mut self,
        gate: &'static str,
        up: &'static str,
        down: &'static str,
    ) -> Mlp {
        self.names = [gate, up, down];
        self
    }

    /// `down(act(gate(x)) * up(x))`: the activation applied alone, then the product.
    pub(crate) fn with_activation(mut self, act: fn(&Array) -> Result<Array>) -> Mlp {
        self.act = Some(act);
        self
    }

    /// The block's output (plus `residual`, added as `residual + down_proj(..)` would).
    /// gate/up/down with the default SwiGLU and unfused (AWQ).
    pub(crate) fn projections_mut(&mut self) -> Option<[&mut LinearLayer; 3]> {
        if self.act.is_some() || self.gate_up.is_some() {
            return None;
        }
        Some([&mut self.gate_proj, &mut self.up_proj, &mut self.down_proj])
    }

    pub(crate) fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let h = match self.act {
            Some(act) => {
                let gate_up = [&self.gate_proj, &self.up_proj];
                let [g, u] = project(self.gate_up.as_deref(), gate_up, x)?;
                act(&g)?.multiply(&u)?
            }
            None => swiglu_mlp(self.gate_up.as_deref(), &self.gate_proj, &self.up_proj, x)?,
        };
        project_out(&self.down_proj, &h, residual)
    }

    /// Fuses dense gate/up into one matmul for decoding steps.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        self.gate_up = fuse([&mut self.gate_proj, &mut self.up_proj])?;
        Ok(())
    }
}

/// The SwiGLU block whose gate and up projections are one matmul in the checkpoint:
/// `down(swiglu(gate, x))` with `gate, x = split(gate_up(x), 2)` (GLM's `gate_up_proj` /
/// `down_proj`, OpenELM's `proj_1` / `proj_2`).
#[derive(Debug)]
pub struct GateUpMlp {
    gate_up: LinearLayer,
    down: LinearLayer,
    /// The checkpoint names of the two projections.
    names: [&'static str; 2],
}

impl Module for GateUpMlp {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        let [gate_up, down] = self.names;
        self.gate_up.visit_params(&join(prefix, gate_up), f);
        self.down.visit_params(&join(prefix, down), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        let [gate_up, down] = self.names;
        self.gate_up.visit_params_mut(&join(prefix, gate_up), f);
        self.down.visit_params_mut(&join(prefix, down), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        let [gate_up, down] = self.names;
        self.gate_up
            .visit_quantizable_mut(&join(prefix, gate_up), f)?;
        self.down.visit_quantizable_mut(&join(prefix, down), f)
    }
}

impl GateUpMlp {
    /// Zero placeholders without biases: `dim -> 2 * hidden`, `hidden -> dim`, named
    /// `names`.
    pub(crate) fn new(dim: i32, hidden: i32, names: [&'static str; 2]) -> crate::Result<GateUpMlp> {
        Ok(GateUpMlp {
            gate_up: LinearLayer::new(dim, 2 * hidden, false)?,
            down: LinearLayer::new(hidden, dim, false)?,
            names,
        })
    }
}

impl super::decoder::FeedForward for GateUpMlp {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let parts = self.gate_up.forward(x)?.split_sections(2, -1)?;
        let [gate, x] = <[Array; 2]>::try_from(parts).map_err(|_| {
            mlx_array::Error::InvalidArgument("gate/up projection: expected two halves".into())
        })?;
        project_out(
            &self.down,
            &mlx_nn::activations::swiglu(&gate, &x)?,
            residual,
        )
    }
}
