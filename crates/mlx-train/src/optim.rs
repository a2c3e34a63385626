//! Optimizers of `mlx.optimizers` (MLX 0.32.4) with their definitions, defaults and op
//! order: [`Adam`](OptimizerKind::Adam), [`AdamW`](OptimizerKind::AdamW),
//! [`SGD`](OptimizerKind::Sgd), [`Adafactor`](OptimizerKind::Adafactor) and
//! [`Muon`](OptimizerKind::Muon). The state is MLX's: a `uint64` step counter, the learning
//! rate as a float32 array (recomputed from the schedule before each update, from the
//! step before the increment), and per parameter the moments (`m`, `v`) or momentum
//! (`v`). Adafactor and Muon are refused by [`OptimizerKind::parse`].
use crate::error::{Result, TrainError};
use crate::schedule::Schedule;
use mlx_array::{ops, Array, Dtype, Scalar};
use serde_json::{Map, Value};

/// An optimizer's hyper-parameters (mlx-lm's `optimizer_config.<name>` over MLX's
/// defaults).
#[derive(Debug, Clone, PartialEq)]
pub enum OptimizerKind {
    /// `optim.Adam(learning_rate, betas=[0.9, 0.999], eps=1e-8, bias_correction=False)`.
    Adam {
        /// `betas`.
        betas: (f64, f64),
        /// `eps`.
        eps: f64,
        /// `bias_correction`.
        bias_correction: bool,
    },
    /// `optim.AdamW(..., weight_decay=0.01)`: Adam on `param * (1 - lr * weight_decay)`.
    AdamW {
        /// `betas`.
        betas: (f64, f64),
        /// `eps`.
        eps: f64,
        /// `weight_decay`.
        weight_decay: f64,
        /// `bias_correction`.
        bias_correction: bool,
    },
    /// `optim.SGD(learning_rate, momentum=0, weight_decay=0, dampening=0, nesterov=False)`.
    Sgd {
        /// `momentum`.
        momentum: f64,
        /// `weight_decay`.
        weight_decay: f64,
        /// `dampening`.
        dampening: f64,
        /// `nesterov`.
        nesterov: bool,
    },
    /// `optim.Adafactor(learning_rate, eps=(1e-30, 1e-3), clip_threshold=1.0,
    /// decay_rate=-0.8, beta_1=None, weight_decay=0.0, scale_parameter=True,
    /// relative_step=True, warmup_init=False)`.
    Adafactor {
        /// `eps`.
        eps: (f64, f64),
        /// `clip_threshold`.
        clip_threshold: f64,
        /// `decay_rate`.
        decay_rate: f64,
        /// `beta_1`.
        beta_1: Option<f64>,
        /// `weight_decay`.
        weight_decay: f64,
        /// `scale_parameter`.
        scale_parameter: bool,
        /// `relative_step`.
        relative_step: bool,
        /// `warmup_init`.
        warmup_init: bool,
    },
    /// `optim.Muon(learning_rate, momentum=0.95, weight_decay=0.01, nesterov=True,
    /// ns_steps=5)`.
    Muon {
        /// `momentum`.
        momentum: f64,
        /// `weight_decay`.
        weight_decay: f64,
        /// `nesterov`.
        nesterov: bool,
        /// `ns_steps`.
        ns_steps: i64,
    },
}

fn bad(message: String) -> TrainError {
    TrainError::Invalid(message)
}

fn num(cfg: &Map<String, Value>, opt: &str, key: &str, default: f64) -> Result<f64> {
    match cfg.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| bad(format!("optimizer_config.{opt}.{key} is {v}, not a number"))),
    }
}

fn flag(cfg: &Map<String, Value>, opt: &str, key: &str, default: bool) -> Result<bool> {
    match cfg.get(key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(format!(
            "optimizer_config.{opt}.{key} is {v}, not true or false"
        ))),
    }
}

fn betas(cfg: &Map<String, Value>, opt: &str) -> Result<(f64, f64)> {
    let (b1, b2) = match cfg.get("betas") {
        None => (0.9, 0.999),
        Some(Value::Array(a)) if a.len() == 2 && a.iter().all(Value::is_number) => (
            a[0].as_f64().unwrap_or_default(),
            a[1].as_f64().unwrap_or_default(),
        ),
        Some(v) => {
            return Err(bad(format!(
                "optimizer_config.{opt}.betas is {v}, not a list of two numbers"
            )))
        }
    };
    for (i, b) in [b1, b2].iter().enumerate() {
        if !(0.0..1.0).contains(b) {
            return Err(bad(format!(
                "Adam beta{} should be in [0, 1), {b} was provided instead",
                i + 1
            )));
        }
    }
    Ok((b1, b2))
}

impl OptimizerKind {
    /// mlx-lm's optimizer choice: `name` (adam, adamw, muon, sgd, adafactor) with the
    /// keyword arguments `cfg` (`optimizer_config[name]`); an unknown keyword is an
    /// error, as Python's would be.
    pub fn parse(name: &str, cfg: &Map<String, Value>) -> Result<OptimizerKind> {
        let allowed: &[&str] = match name {
            "adam" => &["betas", "eps", "bias_correction"],
            "adamw" => &["betas", "eps", "weight_decay", "bias_correction"],
            "sgd" => &["momentum", "weight_decay", "dampening", "nesterov"],
            "muon" => &["momentum", "weight_decay", "nesterov", "ns_steps"],
            "adafactor" => &[
                "eps",
                "clip_threshold",
                "decay_rate",
                "beta_1",
                "weight_decay",
                "scale_parameter",
                "relative_step",
                "warmup_init",
            ],
            other => return Err(bad(format!("Unsupported optimizer: {other}"))),
        };
        if let Some(k) = cfg.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(bad(format!(
                "optimizer_config.{name}.{k}: not an argument of {name} (it takes {})",
                allowed.join(", ")
            )));
        }
        let eps = |opt| {
            let e = num(cfg, opt, "eps", 1e-8)?;
            if e < 0.0 {
                return Err(bad(format!(
                    "Adam epsilon should be >=0, {e} was provided instead"
                )));
            }
            Ok(e)
        };
        Ok(match name {
            "adam" => OptimizerKind::Adam {
                betas: betas(cfg, name)?,
                eps: eps(name)?,
                bias_correction: flag(cfg, name, "bias_correction", false)?,
            },
            "adamw" => OptimizerKind::AdamW {
                betas: betas(cfg, name)?,
                eps: eps(name)?,
                weight_decay: num(cfg, name, "weight_decay", 0.01)?,
                bias_correction: flag(cfg, name, "bias_correction", false)?,
            },
            "muon" => OptimizerKind::Muon {
                momentum: num(cfg, name, "momentum", 0.95)?,
                weight_decay: num(cfg, name, "weight_decay", 0.01)?,
                nesterov: flag(cfg, name, "nesterov", true)?,
                ns_steps: match cfg.get("ns_steps") {
                    None => 5,
                    Some(v) => v.as_i64().filter(|n| *n >= 0).ok_or_else(|| {
                        bad(format!(
                            "optimizer_config.muon.ns_steps is {v}, not a non-negative integer"
                        ))
                    })?,
                },
            },
            "adafactor" => OptimizerKind::Adafactor {
                eps: match cfg.get("eps") {
                    None => (1e-30, 1e-3),
                    Some(Value::Array(a)) if a.len() == 2 && a.iter().all(Value::is_number) => (
                        a[0].as_f64().unwrap_or_default(),
                        a[1].as_f64().unwrap_or_default(),
                    ),
                    Some(v) => {
                        return Err(bad(format!(
                            "optimizer_config.adafactor.eps is {v}, not a list of two numbers"
                        )))
                    }
                },
                clip_threshold: num(cfg, name, "clip_threshold", 1.0)?,
                decay_rate: num(cfg, name, "decay_rate", -0.8)?,
                beta_1: match cfg.get("beta_1") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_f64().ok_or_else(|| {
                        bad(format!(
                            "optimizer_config.adafactor.beta_1 is {v}, not a number"
                        ))
                    })?),
                },
                weight_decay: num(cfg, name, "weight_decay", 0.0)?,
                scale_parameter: flag(cfg, name, "scale_parameter", true)?,
                relative_step: flag(cfg, name, "relative_step", true)?,
                warmup_init: flag(cfg, name, "warmup_init", false)?,
            },
            _ => {
                let momentum = num(cfg, name, "momentum", 0.0)?;
                let dampening = num(cfg, name, "dampening", 0.0)?;
                let nesterov = flag(cfg, name, "nesterov", false)?;
                if nesterov && (momentum <= 0.0 || dampening != 0.0) {
                    return Err(bad(
                        "Nesterov momentum requires a momentum and zero dampening.".into(),
                    ));
                }
                OptimizerKind::Sgd {
                    momentum,
                    weight_decay: num(cfg, name, "weight_decay", 0.0)?,
                    dampening,
                    nesterov,
                }
            }
        })
    }
}

/// The learning rate: a constant or a schedule of the step.
#[derive(Debug, Clone)]
pub enum LearningRate {
    /// `mx.array(lr)` (float32).
    Constant(f64),
    /// A schedule called with the step counter before each update.
    Scheduled(Schedule),
}

/// An optimizer with its state.
pub struct Optimizer {
    kind: OptimizerKind,
    lr: LearningRate,
    step: Array,
    learning_rate: Array,
    /// Per parameter: Adam's `[m, v]`, SGD's `[v]` (none without momentum).
    state: Option<Vec<Vec<Array>>>,
}

impl Optimizer {
    /// A fresh optimizer (MLX's constructor: step 0, the learning rate evaluated at it).
    pub fn new(kind: OptimizerKind, lr: LearningRate) -> Result<Optimizer> {
        let step = Array::from_slice(&[0u64], &[])?;
        let learning_rate = match &lr {
            LearningRate::Constant(v) => Array::from_slice(&[*v as f32], &[])?,
            LearningRate::Scheduled(s) => s.at(&step)?,
        };
        Ok(Optimizer {
            kind,
            lr,
            step,
            learning_rate,
            state: None,
        })
    }

    /// The current learning rate (`optimizer.learning_rate`).
    pub fn learning_rate(&self) -> &Array {
        &self.learning_rate
    }

    /// Every state array (to evaluate with the parameters after an update).
    pub fn state_arrays(&self) -> Vec<&Array> {
        let mut out = vec![&self.step, &self.learning_rate];
        if let Some(s) = &self.state {
            out.extend(s.iter().flatten());
        }
        out
    }

    /// Creates the per-parameter state (zeros, as the first update does) if there is
    /// none yet, so [`Optimizer::state_arrays`] has its full length from here on.
    pub(crate) fn ensure_state(&mut self, params: &[Array]) -> Result<()> {
        if self.state.is_none() {
            self.init(params)?;
        }
        Ok(())
    }

    /// Replaces every state array, in [`Optimizer::state_arrays`]'s order (the outputs of
    /// a compiled step).
    pub(crate) fn set_state_arrays(&mut self, arrays: &[Array]) -> Result<()> {
        let want = self.state_arrays().len();
        if arrays.len() != want {
            return Err(bad(format!(
                "{} optimizer state arrays for {want}",
                arrays.len()
            )));
        }
        let mut it = arrays.iter().cloned();
        if let (Some(step), Some(lr)) = (it.next(), it.next()) {
            self.step = step;
            self.learning_rate = lr;
        }
        if let Some(state) = &mut self.state {
            for a in state.iter_mut().flatten() {
                if let Some(v) = it.next() {
                    *a = v;
                }
            }
        }
        Ok(())
    }

    fn init(&mut self, params: &[Array]) -> Result<()> {
        let mut state = Vec::with_capacity(params.len());
        for p in params {
            state.push(match self.kind {
                OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. } => {
                    vec![ops::zeros_like(p)?, ops::zeros_like(p)?]
                }
                OptimizerKind::Sgd { .. } | OptimizerKind::Muon { .. } => {
                    vec![ops::zeros_like(p)?]
                }
                OptimizerKind::Adafactor { beta_1, .. } => {
                    let shape = p.shape();
                    let mut st = if shape.len() >= 2 {
                        let n = shape.len();
                        let mut col = shape[..n - 2].to_vec();
                        col.push(shape[n - 1]);
                        vec![
                            ops::zeros(&shape[..n - 1], p.dtype())?,
                            ops::zeros(&col, p.dtype())?,
                        ]
                    } else {
                        vec![ops::zeros_like(p)?]
                    };
                    if beta_1.is_some() {
                        st.push(ops::zeros_like(p)?);
                    }
                    st
                }
            });
        }
        self.state = Some(state);
        Ok(())
    }

    /// MLX's `apply_gradients`: the schedule's learning rate at the current step, the
    /// step incremented, then each parameter's update. Returns the new parameters.
    pub fn apply_gradients(&mut self, grads: &[Array], params: &[Array]) -> Result<Vec<Array>> {
        if grads.len() != params.len() {
            return Err(bad(format!(
                "{} gradients for {} parameters",
                grads.len(),
                params.len()
            )));
        }
        if self.state.is_none() {
            self.init(grads)?;
        }
        if let LearningRate::Scheduled(s) = &self.lr {
            self.learning_rate = s.at(&self.step)?;
        }
        self.step = self.step.add(1i32)?;
        let mut state = self.state.take().unwrap_or_default();
        let mut out = Vec::with_capacity(params.len());
        for ((g, p), st) in grads.iter().zip(params).zip(state.iter_mut()) {
            out.push(self.apply_single(g, p, st)?);
        }
        self.state = Some(state);
        Ok(out)
    }

    fn apply_single(&self, g: &Array, p: &Array, st: &mut [Array]) -> Result<Array> {
        // Lazy: Adafactor's arm leaves it unused, and MLX never computes it.
        let lr = self.learning_rate.astype(g.dtype())?;
        match self.kind {
            OptimizerKind::Adafactor { .. } => self.adafactor(g, p, st),
            OptimizerKind::Muon {
                momentum,
                weight_decay,
                nesterov,
                ns_steps,
            } => {
                let g = if weight_decay != 0.0 {
                    g.add(&p.multiply(weight_decay)?)?
                } else {
                    g.clone()
                };
                let v = st[0].multiply(momentum)?;
                let v = v.add(&g.multiply(1.0 - momentum)?)?;
                st[0] = v.clone();
                let mut update = if nesterov {
                    g.multiply(1.0 - momentum)?.add(&v.multiply(momentum)?)?
                } else {
                    v
                };
                let mut lr = lr;
                if update.ndim() >= 2 {
                    let shape = update.shape();
                    let reshape = update.ndim() > 2;
                    if reshape {
                        update = update.reshape(&[shape[0], -1])?;
                    }
                    update = newton_schulz5(&update, ns_steps)?;
                    if reshape {
                        update = update.reshape(&shape)?;
                    }
                    let s = update.shape();
                    let (rows, cols) = (s[s.len() - 2] as f64, s[s.len() - 1] as f64);
                    lr = lr.multiply((rows / cols).max(1.0).powf(0.5))?;
                }
                Ok(p.subtract(&lr.multiply(&update)?)?)
            }
            OptimizerKind::Adam {
                betas,
                eps,
                bias_correction,
            } => self.adam(g, p, st, &lr, betas, eps, bias_correction),
            OptimizerKind::AdamW {
                betas,
                eps,
                weight_decay,
                bias_correction,
            } => {
                // `parameter * (1 - lr * weight_decay)`: Python's scalar minus array.
                let one_minus = rsub_scalar(1.0, &lr.multiply(weight_decay)?)?;
                let decayed = p.multiply(&one_minus)?;
                self.adam(g, &decayed, st, &lr, betas, eps, bias_correction)
            }
            OptimizerKind::Sgd {
                momentum,
                weight_decay,
                dampening,
                nesterov,
            } => {
                let g = if weight_decay != 0.0 {
                    g.add(&p.multiply(weight_decay)?)?
                } else {
                    g.clone()
                };
                if momentum <= 0.0 {
                    return Ok(p.subtract(&lr.multiply(&g)?)?);
                }
                let mut v = st[0].multiply(momentum)?;
                if dampening > 0.0 {
                    v = v.add(&g.multiply(1.0 - dampening)?)?;
                } else {
                    v = v.add(&g)?;
                }
                let update = if nesterov {
                    g.add(&v.multiply(momentum)?)?
                } else {
                    v.clone()
                };
                st[0] = v;
                Ok(p.subtract(&lr.multiply(&update)?)?)
            }
        }
    }

    /// MLX's `Adafactor.apply_single`.
    fn adafactor(&self, g: &Array, p: &Array, st: &mut [Array]) -> Result<Array> {
        let OptimizerKind::Adafactor {
            eps,
            clip_threshold,
            decay_rate,
            beta_1,
            weight_decay,
            scale_parameter,
            relative_step,
            warmup_init,
        } = self.kind
        else {
            return Err(bad("not Adafactor".into()));
        };
        let rms = |x: &Array| -> Result<Array> { Ok(x.square()?.mean(None, false)?.sqrt()?) };
        let factored = g.ndim() >= 2;
        let step = &self.step;
        let parameter_rms = rms(p)?;
        // `_compute_learning_rate`.
        let relative = if relative_step {
            let min_step = if warmup_init {
                step.multiply(1e-6)?
            } else {
                Array::weak_scalar(Scalar::Float(1e-2), Dtype::Float32)?
            };
            min_step.minimum(&step.rsqrt()?)?
        } else {
            self.learning_rate.clone()
        };
        let relative = relative.astype(parameter_rms.dtype())?;
        let learning_rate = if scale_parameter {
            let scale = parameter_rms.maximum(eps.1)?;
            scale.multiply(&relative)?
        } else {
            relative.multiply(1.0)?
        };
        let beta_2 = rsub_scalar(1.0, &step.power(decay_rate)?.astype(parameter_rms.dtype())?)?;
        let one_minus_beta_2 = rsub_scalar(1.0, &beta_2)?;
        let mut update = g.square()?.add(eps.0)?;
        if factored {
            let row = beta_2
                .multiply(&st[0])?
                .add(&one_minus_beta_2.multiply(&update.mean(Some(&[-1]), false)?)?)?;
            let col = beta_2
                .multiply(&st[1])?
                .add(&one_minus_beta_2.multiply(&update.mean(Some(&[-2]), false)?)?)?;
            st[0] = row.clone();
            st[1] = col.clone();
            let r = row.divide(&row.mean(Some(&[-1]), true)?)?.rsqrt()?;
            let c = col.rsqrt()?;
            update = r.expand_dims(&[-1])?.multiply(&c.expand_dims(&[-2])?)?;
            update = update.multiply(g)?;
        } else {
            let sq = beta_2
                .multiply(&st[0])?
                .add(&one_minus_beta_2.multiply(&update)?)?;
            st[0] = sq.clone();
            update = sq.rsqrt()?.multiply(g)?;
        }
        let denom = Array::weak_scalar(Scalar::Float(1.0), update.dtype())?
            .maximum(&rms(&update)?.divide(clip_threshold)?)?;
        update = update.divide(&denom)?;
        update = learning_rate.multiply(&update)?;
        if let Some(b1) = beta_1 {
            let i = if factored { 2 } else { 1 };
            let avg = st[i].multiply(b1)?.add(&update.multiply(1.0 - b1)?)?;
            st[i] = avg.clone();
            update = avg;
        }
        let p = if weight_decay != 0.0 {
            p.add(&p.multiply(&learning_rate.multiply(-weight_decay)?)?)?
        } else {
            p.clone()
        };
        Ok(p.subtract(&update)?)
    }

    #[allow(clippy::too_many_arguments)]
    fn adam(
        &self,
        g: &Array,
        p: &Array,
        st: &mut [Array],
        lr: &Array,
        (b1, b2): (f64, f64),
        eps: f64,
        bias_correction: bool,
    ) -> Result<Array> {
        let m = st[0].multiply(b1)?.add(&g.multiply(1.0 - b1)?)?;
        let v = st[1].multiply(b2)?.add(&g.square()?.multiply(1.0 - b2)?)?;
        st[0] = m.clone();
        st[1] = v.clone();
        if bias_correction {
            // `b ** step` with a Python float base: a weak float32 scalar to the uint64
            // step's power.
            let pow = |b: f64| -> Result<Array> {
                let base = Array::from_slice(&[b as f32], &[])?;
                Ok(base.power(&self.step)?)
            };
            let c1 = lr
                .divide(&rsub_scalar(1.0, &pow(b1)?)?)?
                .astype(g.dtype())?;
            let c2 = rsub_scalar(1.0, &pow(b2)?)?.rsqrt()?.astype(g.dtype())?;
            let numerator = c1.multiply(&m)?;
            let denominator = v.sqrt()?.multiply(&c2)?.add(eps)?;
            Ok(p.subtract(&numerator.divide(&denominator)?)?)
        } else {
            let update = lr.multiply(&m)?.divide(&v.sqrt()?.add(eps)?)?;
            Ok(p.subtract(&update)?)
        }
    }
}

/// Muon's `_zeropower_via_newtonschulz5` of a 2-D update.
fn newton_schulz5(x: &Array, steps: i64) -> Result<Array> {
    let (a, b, c) = (3.4445, -4.7750, 2.0315);
    let s = x.shape();
    let transpose = s[0] > s[1];
    let mut x = if transpose {
        x.transpose(None)?
    } else {
        x.clone()
    };
    let norm = mlx_array::linalg::norm(&x, mlx_array::linalg::NormOrd::Default, None, true)?;
    x = x.divide(&norm.add(1e-7)?)?;
    for _ in 0..steps {
        let a_ = x.matmul(&x.transpose(None)?)?;
        let b_ = ops::addmm(&a_.multiply(b)?, &a_, &a_, c as f32, 1.0)?;
        x = ops::addmm(&x.multiply(a)?, &b_, &x, 1.0, 1.0)?;
    }
    if transpose {
        x = x.transpose(None)?;
    }
    Ok(x)
}

/// `s - a` for a Python scalar `s` (a weak scalar of `a`'s dtype on the left).
pub(crate) fn rsub_scalar(s: f64, a: &Array) -> Result<Array> {
    let s = Array::weak_scalar(Scalar::Float(s), a.dtype())?;
    Ok(s.subtract(a)?)
}
