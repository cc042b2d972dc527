//! `[log]`: where a run's metrics go besides `metrics.jsonl`.

use serde::{Deserialize, Serialize};

#[allow(unused_imports)]
use super::*;

/// `[log]`: where a run's metrics go besides `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Also write TensorBoard event files (`tb/events.out.tfevents.<time>.<host>` in the run
    /// directory: every number of `metrics.jsonl` by step; `tensorboard --logdir runs`).
    /// Default: `false`.
    pub tensorboard: bool,
}

impl LogConfig {
    pub fn is_default(&self) -> bool {
        *self == LogConfig::default()
    }
}
