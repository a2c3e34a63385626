//! Bounding the memory that a training step's queued GPU work holds.
//!
//! MLX's GPU backends keep every buffer that a queued command graph uses until that
//! graph has run, and MLX's `eval` lets the host queue up to 10 such graphs (of up to 100
//! ops or 1,000 MB each on the H100/H200) before it waits. When the host encodes faster
//! than the device runs, a step therefore holds many temporaries at once beyond the ones
//! it still needs: on the H200 our compiled 1B LoRA step (1.46x mlx-lm's speed) peaked at
//! 13.7 GB against mlx-lm's 9.5 GB, though both run the same graph, and on the CPU, whose
//! queue is shallow and slow, both tools peak at the same byte.
//!
//! MLX's `eval` also waits for queued work while active memory is over the memory limit.
//! So, with the bound on (the default on a CUDA GPU; `MLX_TRAIN_MEMORY_BOUND=0` turns it
//! off, `force` puts it on any device), the first training step runs under a limit of 0
//! (the host waits
//! for each graph it commits: the step's own live set plus one graph), and every later
//! step under the peak that the first one reached. The ops and their inputs are the same,
//! so the losses and the weights are the same bits; only when the host waits changes. On
//! the H200 (benchmarks/GPU.md, session 17) the 1B LoRA step peaked at 8.47 GB with it
//! against 13.05 without and mlx-lm's 9.75, at 27,653 against 27,927 tokens/s.
use crate::error::{Result, TrainError};
use mlx_array::{memory, DeviceType};

/// `MLX_TRAIN_MEMORY_BOUND`: whether training bounds its queued GPU work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBound {
    /// `0`: never (MLX's own limit applies, as for mlx-lm).
    Off,
    /// The default (unset, or `1`): where the current device is a GPU other than Metal
    /// (MLX's CUDA backend, where the bound was needed; Metal is left as mlx-lm runs it).
    Cuda,
    /// `force`: on any device (the CPU tests use it: same bits, lower or equal peak).
    Always,
}

impl MemoryBound {
    /// The setting in `MLX_TRAIN_MEMORY_BOUND` (`0`, unset or `1`, `force`); another
    /// value is an error naming the variable.
    pub fn from_env() -> Result<MemoryBound> {
        let Ok(v) = std::env::var("MLX_TRAIN_MEMORY_BOUND") else {
            return Ok(MemoryBound::Cuda);
        };
        match v.trim() {
            "0" => Ok(MemoryBound::Off),
            "" | "1" => Ok(MemoryBound::Cuda),
            "force" => Ok(MemoryBound::Always),
            _ => Err(TrainError::Invalid(format!(
                "MLX_TRAIN_MEMORY_BOUND={v:?}: expected 0 (off), 1 (on a CUDA GPU, the \
                 default) or force (on any device)"
            ))),
        }
    }

    /// Whether it applies on the device this thread runs on.
    fn applies(self) -> Result<bool> {
        Ok(match self {
            MemoryBound::Off => false,
            MemoryBound::Always => true,
            MemoryBound::Cuda => {
                !cfg!(target_os = "macos") && mlx_array::current_device()?.kind == DeviceType::Gpu
            }
        })
    }
}

/// `MLX_TRAIN_MEMORY_HEADROOM`: the factor (at least 1, default 1) on the first step's
/// peak that later steps may reach before the host waits for queued work. Room above 1
/// lets the host queue more ahead near the peak (speed) at the cost of memory.
fn headroom_from_env() -> Result<f64> {
    let Ok(v) = std::env::var("MLX_TRAIN_MEMORY_HEADROOM") else {
        return Ok(1.0);
    };
    match v.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 1.0 => Ok(f),
        _ => Err(TrainError::Invalid(format!(
            "MLX_TRAIN_MEMORY_HEADROOM={v:?}: expected a number of at least 1 (a factor on \
             the first training step's peak memory)"
        ))),
    }
}

/// The bound in force for one training run; puts MLX's previous memory limit back when
/// dropped.
pub(crate) struct StepBound {
    previous: usize,
    headroom: f64,
    measured: bool,
}

impl StepBound {
    /// Starts the bound when `setting` applies here: the limit is 0 until
    /// [`StepBound::step_done`] is first called.
    pub(crate) fn start(setting: MemoryBound) -> Result<Option<StepBound>> {
        // Read first, so a bad value is reported where the bound does not apply too.
        let headroom = headroom_from_env()?;
        if !setting.applies()? {
            return Ok(None);
        }
        let previous = memory::set_memory_limit(0)?;
        Ok(Some(StepBound {
            previous,
            headroom,
            measured: false,
        }))
    }

    /// After a training step is evaluated: the first time, the limit becomes the peak so
    /// far times the headroom (never above the previous limit).
    pub(crate) fn step_done(&mut self) -> Result<()> {
        if !self.measured {
            self.measured = true;
            let limit = (memory::peak_memory() as f64 * self.headroom) as usize;
            memory::set_memory_limit(limit.min(self.previous))?;
        }
        Ok(())
    }
}

impl Drop for StepBound {
    fn drop(&mut self) {
        // Nothing to report from a destructor: the limit only paces evaluation.
        let _ = memory::set_memory_limit(self.previous);
    }
}
