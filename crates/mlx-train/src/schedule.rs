//! Learning-rate schedules of `mlx.optimizers.schedulers` (MLX 0.32.4), computed with
//! its ops on the optimizer's `uint64` step (so the same float32 values), and mlx-lm's
//! `build_schedule` (`lr_schedule: {name, arguments, warmup, warmup_init}`).
use crate::error::{Result, TrainError};
use mlx_array::{ops, Array, Scalar};
use serde_json::Value;

/// A schedule of the step.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// `init * decay_rate ** step`.
    ExponentialDecay {
        /// `init`.
        init: f64,
        /// `decay_rate`.
        decay_rate: f64,
    },
    /// `init * decay_rate ** (step // step_size)`.
    StepDecay {
        /// `init`.
        init: f64,
        /// `decay_rate`.
        decay_rate: f64,
        /// `step_size`.
        step_size: i64,
    },
    /// `end + 0.5 * (1 + cos(pi / decay_steps * min(step, decay_steps))) * (init - end)`.
    CosineDecay {
        /// `init`.
        init: f64,
        /// `decay_steps`.
        decay_steps: i64,
        /// `end`.
        end: f64,
    },
    /// `min(step, steps) * ((end - init) / steps) + init`.
    Linear {
        /// `init`.
        init: f64,
        /// `end`.
        end: f64,
        /// `steps`.
        steps: i64,
    },
    /// `join_schedules`: schedule `i + 1` takes over at `boundaries[i]`, counting from it.
    Join {
        /// The schedules.
        schedules: Vec<Schedule>,
        /// `len(schedules) - 1` boundaries.
        boundaries: Vec<i64>,
    },
}

fn weak_f(v: f64, like: &Array) -> Result<Array> {
    Ok(Array::weak_scalar(Scalar::Float(v), like.dtype())?)
}

impl Schedule {
    /// The value at `step` (a `uint64` scalar array).
    pub fn at(&self, step: &Array) -> Result<Array> {
        Ok(match self {
            Schedule::ExponentialDecay { init, decay_rate } => {
                weak_f(*decay_rate, step)?.power(step)?.multiply(*init)?
            }
            Schedule::StepDecay {
                init,
                decay_rate,
                step_size,
            } => {
                let k = step.floor_divide(*step_size)?;
                weak_f(*decay_rate, &k)?.power(&k)?.multiply(*init)?
            }
            Schedule::CosineDecay {
                init,
                decay_steps,
                end,
            } => {
                let s = step.minimum(*decay_steps)?;
                let angle = s.multiply(std::f64::consts::PI / *decay_steps as f64)?;
                let decay = angle.cos()?.add(1.0)?.multiply(0.5)?;
                decay.multiply(init - end)?.add(*end)?
            }
            Schedule::Linear { init, end, steps } => {
                let s = step.minimum(*steps)?;
                s.multiply((end - init) / *steps as f64)?.add(*init)?
            }
            Schedule::Join {
                schedules,
                boundaries,
            } => {
                let mut output = schedules[0].at(step)?;
                for (b, s) in boundaries.iter().zip(&schedules[1..]) {
                    let later = s.at(&step.subtract(*b)?)?;
                    output = ops::where_(&step.less(*b)?, &output, &later)?;
                }
                output
            }
        })
    }

    /// mlx-lm's `build_schedule` of a config's `lr_schedule` mapping.
    pub fn from_config(cfg: &Value) -> Result<Schedule> {
        let bad = |m: String| TrainError::Invalid(format!("lr_schedule: {m}"));
        let obj = cfg
            .as_object()
            .ok_or_else(|| bad(format!("{cfg} is not a mapping")))?;
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("needs a `name` (a string)".into()))?;
        let args = obj
            .get("arguments")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("needs `arguments` (a list)".into()))?;
        let f = |i: usize, what: &str| -> Result<f64> {
            args.get(i).and_then(Value::as_f64).ok_or_else(|| {
                bad(format!(
                    "{name}: argument {} ({what}) is missing or not a number",
                    i + 1
                ))
            })
        };
        let n = |i: usize, what: &str| -> Result<i64> {
            args.get(i).and_then(Value::as_i64).ok_or_else(|| {
                bad(format!(
                    "{name}: argument {} ({what}) is missing or not an integer",
                    i + 1
                ))
            })
        };
        let (max_args, main) = match name {
            "cosine_decay" => {
                let decay_steps = n(1, "decay_steps")?;
                if decay_steps < 1 {
                    return Err(bad(format!(
                        "decay_steps must be greater than 0, but got {decay_steps}."
                    )));
                }
                let end = if args.len() > 2 { f(2, "end")? } else { 0.0 };
                (
                    3,
                    Schedule::CosineDecay {
                        init: f(0, "init")?,
                        decay_steps,
                        end,
                    },
                )
            }
            "linear_schedule" => {
                let steps = n(2, "steps")?;
                if steps < 1 {
                    return Err(bad(format!(
                        "steps must be greater than 0, but got {steps}."
                    )));
                }
                (
                    3,
                    Schedule::Linear {
                        init: f(0, "init")?,
                        end: f(1, "end")?,
                        steps,
                    },
                )
            }
            "step_decay" => {
                let step_size = n(2, "step_size")?;
                if step_size < 1 {
                    return Err(bad(format!(
                        "step_size must be greater than 0, but got {step_size}."
                    )));
                }
                (
                    3,
                    Schedule::StepDecay {
                        init: f(0, "init")?,
                        decay_rate: f(1, "decay_rate")?,
                        step_size,
                    },
                )
            }
            "exponential_decay" => (
                2,
                Schedule::ExponentialDecay {
                    init: f(0, "init")?,
                    decay_rate: f(1, "decay_rate")?,
                },
            ),
            other => {
                return Err(bad(format!(
                    "unknown schedule {other:?} (cosine_decay, linear_schedule, step_decay, \
                     exponential_decay)"
                )))
            }
        };
        if args.len() > max_args {
            return Err(bad(format!(
                "{name} takes at most {max_args} arguments, got {}",
                args.len()
            )));
        }
        let warmup = match obj.get("warmup") {
            None | Some(Value::Null) => 0,
            Some(v) => v
                .as_i64()
                .ok_or_else(|| bad(format!("warmup {v} is not an integer")))?,
        };
        if warmup == 0 {
            return Ok(main);
        }
        let warmup_init = match obj.get("warmup_init") {
            None | Some(Value::Null) => 0.0,
            Some(v) => v
                .as_f64()
                .ok_or_else(|| bad(format!("warmup_init {v} is not a number")))?,
        };
        if warmup < 1 {
            return Err(bad(format!(
                "steps must be greater than 0, but got {warmup}."
            )));
        }
        Ok(Schedule::Join {
            schedules: vec![
                Schedule::Linear {
                    init: warmup_init,
                    end: f(0, "init")?,
                    steps: warmup,
                },
                main,
            ],
            boundaries: vec![warmup + 1],
        })
    }
}
