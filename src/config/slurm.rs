//! `[slurm]`: defaults for `kiln submit` and `kiln sweep --executor slurm`.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// `[slurm]`: defaults for `kiln submit` and `kiln sweep --executor slurm` (each also a flag).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// Nodes (`sbatch --nodes`). Default: `1`.
    pub nodes: usize,
    /// kiln processes per node, each one kiln node of the job. Default: `1` (one process
    /// drives all of a node's devices); more is for CPU jobs. Default: `1`.
    pub tasks_per_node: usize,
    /// GPUs per node (`--gpus-per-node`). Default: unset (`strategy.devices` on CUDA, none on
    /// the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<usize>,
    /// CPUs per task (`--cpus-per-task`; also kiln's `backend.threads` budget). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<usize>,
    /// Time limit, `HH:MM:SS` or `D-HH:MM:SS` (`--time`). Default: unset (the partition's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// Default: unset (the cluster's default partition).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Seconds before the time limit at which Slurm sends SIGUSR1 (`--signal=USR1@N`): kiln
    /// checkpoints, stops and the job requeues itself. Default: `120`.
    pub signal_secs: u64,
    /// Requeue the job after a preemption or a stop before the time limit, and continue it in
    /// the same run directory (`--requeue`). Default: `true`.
    pub requeue: bool,
    /// More `sbatch` options, each written as an `#SBATCH` line. Default: `[]`.
    pub sbatch_args: Vec<String>,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            nodes: 1,
            tasks_per_node: 1,
            gpus_per_node: None,
            cpus_per_task: None,
            time: None,
            partition: None,
            account: None,
            signal_secs: 120,
            requeue: true,
            sbatch_args: Vec::new(),
        }
    }
}

impl SlurmConfig {
    pub fn is_default(&self) -> bool {
        *self == SlurmConfig::default()
    }
}

impl SlurmConfig {
    /// What `kiln submit` would otherwise hand to `sbatch` to refuse.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        let s = self;
        at_least(r, "slurm.nodes", s.nodes, 1)?;
        at_least(r, "slurm.tasks_per_node", s.tasks_per_node, 1)?;
        if s.cpus_per_task == Some(0) {
            return Err(r.range_error(
                "slurm.cpus_per_task",
                "`slurm.cpus_per_task` = 0 is out of range: must be at least 1".into(),
                Some("leave it unset for Slurm's default".into()),
            ));
        }
        if s.signal_secs > 65535 {
            return Err(r.range_error(
                "slurm.signal_secs",
                format!(
                    "`slurm.signal_secs` = {} is out of range: Slurm's --signal takes at most 65535 seconds",
                    s.signal_secs
                ),
                None,
            ));
        }
        if s.signal_secs == 0 {
            return Err(r.key_error(
                "slurm.signal_secs",
                "`slurm.signal_secs` = 0 leaves no time to checkpoint before the time limit".into(),
                Some("give the seconds a checkpoint needs, with a margin (default 120)".into()),
            ));
        }
        if let Some(t) = &s.time {
            let secs = super::parse_slurm_time(t)
                .map_err(|why| r.key_error("slurm.time", format!("`slurm.time`: {why}"), None))?;
            if secs <= s.signal_secs {
                return Err(r.key_error(
                    "slurm.time",
                    format!(
                        "`slurm.time` = \"{t}\" is not longer than `slurm.signal_secs` = {}: the stop signal would come before the job starts",
                        s.signal_secs
                    ),
                    Some("give a longer time limit or a smaller slurm.signal_secs".into()),
                ));
            }
        }
        for (key, v) in [
            ("slurm.partition", &s.partition),
            ("slurm.account", &s.account),
        ] {
            if let Some(v) = v {
                if !super::slurm_name_ok(v) {
                    return Err(r.key_error(
                        key,
                        format!("`{key}` = {v:?} is not a Slurm name"),
                        Some("use letters, digits, `_`, `-`, `.` (and `,` between partitions); leave it unset for the cluster's default".into()),
                    ));
                }
            }
        }
        if let Some(bad) = s.sbatch_args.iter().find(|a| !super::sbatch_option_ok(a)) {
            return Err(r.key_error(
                "slurm.sbatch_args",
                format!("`slurm.sbatch_args` has {bad:?}, which is not one sbatch option"),
                Some("give options such as \"--mail-type=END\", one per element, `=` before a value, no spaces or quotes".into()),
            ));
        }
        Ok(())
    }
}
