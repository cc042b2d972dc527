//! `[schedule]`: the learning-rate schedule.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// Learning-rate schedule shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Constant,
    Step,
    Cosine,
    /// transformers' `get_linear_schedule_with_warmup`: after the warm-up, a straight line
    /// from `optim.lr` to `min_lr` (0) at `decay_steps` (the run's last step).
    Linear,
}

/// `[schedule]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    /// constant, step, cosine or linear. Default: `"constant"`.
    pub kind: ScheduleKind,
    /// Linear warm-up to `optim.lr` over this many steps, nanoGPT's and torch's way: step `i`
    /// trains with `lr * (i + 1) / (warmup_steps + 1)` (the first step already learns).
    /// Default: `0`.
    pub warmup_steps: usize,
    /// step: multiply the lr by `gamma` every `step_size` steps. Default: `100`.
    pub step_size: usize,
    /// step: decay factor. Default: `0.1`.
    pub gamma: f64,
    /// cosine, linear: the lr reached at the end of the decay. Default: `0.0`.
    pub min_lr: f64,
    /// cosine, linear: the step where the decay reaches `min_lr`, which it keeps after
    /// (nanoGPT's `lr_decay_iters`; transformers' `num_training_steps`), independent of how long
    /// the run trains. Default: the run's last step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_steps: Option<usize>,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            kind: ScheduleKind::Constant,
            warmup_steps: 0,
            step_size: 100,
            gamma: 0.1,
            min_lr: 0.0,
            decay_steps: None,
        }
    }
}

impl ScheduleConfig {
    /// Step size and decay (its floor is checked against `optim.lr` in `cross.rs`).
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        let s = self;
        at_least(r, "schedule.step_size", s.step_size, 1)?;
        in_range(
            r,
            "schedule.gamma",
            s.gamma,
            s.gamma > 0.0,
            "greater than 0",
        )?;
        if let Some(d) = s.decay_steps.filter(|d| *d <= s.warmup_steps) {
            return Err(r.range_error(
                "schedule.decay_steps",
                format!(
                    "`schedule.decay_steps` = {d} is out of range: the decay ends after the warm-up (`schedule.warmup_steps` = {})",
                    s.warmup_steps
                ),
                None,
            ));
        }
        Ok(())
    }
}
