//! The typed experiment: one struct per TOML section, each in its own file beside this one
//! (`experiment.rs`, `model.rs`, `data.rs`, ...) with its defaults, the doc of every field and
//! the checks serde cannot express (`check`); unknown keys are rejected. Checks that span
//! sections live in `cross.rs`; [`crate::config::validate`] runs them all in one order.

use serde::{Deserialize, Serialize};

#[allow(unused_imports)]
use super::*;

pub use super::nccl::NcclConfig;

/// A whole experiment, as resolved from all layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub experiment: ExperimentConfig,
    pub model: ModelConfig,
    pub data: DataConfig,
    pub train: TrainConfig,
    pub optim: OptimConfig,
    pub schedule: ScheduleConfig,
    pub sampler: SamplerConfig,
    pub strategy: StrategyConfig,
    pub backend: BackendConfig,
    pub checkpoint: CheckpointConfig,
    pub sweep: SweepConfig,
    pub launch: LaunchConfig,
    pub profile: ProfileConfig,
    /// Left out of the stored config (and so of its hash) while it is all defaults.
    #[serde(skip_serializing_if = "LogConfig::is_default")]
    pub log: LogConfig,
    /// Left out of the stored config (and so of its hash) while it is all defaults.
    #[serde(skip_serializing_if = "SlurmConfig::is_default")]
    pub slurm: SlurmConfig,
}

/// A config choice as the user writes it (`ddp`, not `Ddp`): its serde name.
pub fn choice_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// Top-level section names, in the order they are printed.
pub const SECTIONS: &[&str] = &[
    "experiment",
    "model",
    "data",
    "train",
    "optim",
    "schedule",
    "sampler",
    "strategy",
    "backend",
    "checkpoint",
    "sweep",
    "launch",
    "profile",
    "log",
    "slurm",
];
