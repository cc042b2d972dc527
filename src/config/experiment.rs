//! `[experiment]`: the run's name, seed and output directory.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
#[allow(unused_imports)]
use super::*;

/// `[experiment]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExperimentConfig {
    /// Name of the run directory under `output_dir`. Default: `"experiment"`.
    pub name: String,
    /// Seed for model initialisation and dropout. Default: `0`.
    pub seed: u64,
    /// Where run directories are created. Default: `"runs"`.
    pub output_dir: String,
}

impl Default for ExperimentConfig {
    fn default() -> Self {
        ExperimentConfig {
            name: "experiment".into(),
            seed: 0,
            output_dir: "runs".into(),
        }
    }
}

impl ExperimentConfig {
    /// The run directory's name, and an output directory without control characters.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        let name = &self.name;
        if name.trim().is_empty()
            || name.contains(['/', '\\'])
            || name == "."
            || name == ".."
            || name.chars().any(char::is_control)
            || name.len() > 200
        {
            return Err(r.key_error(
                "experiment.name",
                format!(
                    "`experiment.name` = \"{}\" is not a usable directory name",
                    self.name
                ),
                Some("use one directory name: not empty, `.` or `..`, without `/`, `\\` or control characters, at most 200 bytes".into()),
            ));
        }
        if self.output_dir.chars().any(char::is_control) {
            return Err(r.key_error(
                "experiment.output_dir",
                format!(
                    "`experiment.output_dir` = {:?} holds a control character",
                    self.output_dir
                ),
                Some("give a plain path".into()),
            ));
        }
        Ok(())
    }
}
