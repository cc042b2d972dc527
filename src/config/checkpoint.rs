//! `[checkpoint]`: when checkpoints are saved and which are kept.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// `[checkpoint] keep_best = { metric = "eval_loss", mode = "min" }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepBestConfig {
    /// eval_loss, eval_accuracy (classification) or eval_perplexity (language model).
    /// Default: none (required).
    pub metric: EvalMetric,
    /// min or max. Default: `"max"` for eval_accuracy, else `"min"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MetricMode>,
}

impl KeepBestConfig {
    pub fn mode(&self) -> MetricMode {
        self.mode.unwrap_or(self.metric.default_mode())
    }
}

/// `[checkpoint]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Save every N optimizer steps; 0 never. Default: `0`.
    pub every_steps: usize,
    /// Save at the end of every N epochs; 0 never. Default: `0`.
    pub every_epochs: usize,
    /// Save when training ends. Default: `true`.
    pub at_end: bool,
    /// Keep the newest N checkpoints (at least 1). Default: `3`.
    pub keep_last: usize,
    /// Also keep every checkpoint whose step is a multiple of N, forever; 0 off. Default: `0`.
    pub keep_every: usize,
    /// Where checkpoints go, relative to the run directory. Default: `"checkpoints"`.
    pub dir: String,
    /// `kiln run` resumes the newest unfinished run of the experiment, as with `--resume`.
    /// Default: `false`.
    pub auto_resume: bool,
    /// Save a checkpoint at each evaluation that improves this metric; retention never deletes
    /// the best one, and `--from best` names it. Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_best: Option<KeepBestConfig>,
    /// Write checkpoints in the background (torch DCP's `async_save`, torchtitan's
    /// `async_mode`): training waits only while each rank copies its state to host memory; a
    /// writer thread writes, fsyncs and commits it. One save in flight: the next waits for the
    /// previous. The same files and bits as a synchronous save. Default: `false`.
    #[serde(rename = "async", skip_serializing_if = "is_false")]
    pub async_save: bool,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            every_steps: 0,
            every_epochs: 0,
            at_end: true,
            keep_last: 3,
            keep_every: 0,
            dir: "checkpoints".into(),
            auto_resume: false,
            keep_best: None,
            async_save: false,
        }
    }
}

impl CheckpointConfig {
    /// A checkpoint directory inside the run, and checkpoints to keep.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        {
            if !checkpoint_dir_inside(&self.dir) {
                return Err(r.key_error(
                    "checkpoint.dir",
                    format!(
                        "`checkpoint.dir` = {:?} is not a directory inside the run directory",
                        self.dir
                    ),
                    Some("give a relative path without `..`, other than the run's trace/, logs/ and slurm/, e.g. \"checkpoints\"".into()),
                ));
            }
        }
        at_least(r, "checkpoint.keep_last", self.keep_last, 1)?;
        if self.dir.trim().is_empty() {
            return Err(r.key_error(
                "checkpoint.dir",
                "`checkpoint.dir` is empty".into(),
                Some("use a directory name such as \"checkpoints\"".into()),
            ));
        }

        Ok(())
    }
}

/// Whether `checkpoint.dir` = `dir` names a directory inside the run directory: relative,
/// without `..`, not the run's own `trace/`, `logs/` or `slurm/` (`trace/` is replaced on
/// resume).
pub fn checkpoint_dir_inside(dir: &str) -> bool {
    use std::path::Component;
    let d = std::path::Path::new(dir);
    let first = d.components().find(|p| matches!(p, Component::Normal(_)));
    !dir.trim().is_empty()
        && d.components()
            .all(|p| matches!(p, Component::Normal(_) | Component::CurDir))
        && first.is_some()
        && !first.is_some_and(|f| {
            ["trace", "logs", "slurm"].contains(&f.as_os_str().to_string_lossy().as_ref())
        })
        && !dir.chars().any(char::is_control)
}
