//! `kiln submit FILE [--nodes N] [--tasks-per-node T] [--gpus-per-node G] [--cpus-per-task C]
//! [--time HH:MM:SS] [--partition P] [--account A] [--dry-run] [-- sbatch options]` and
//! `kiln status RUN_DIR`.

use std::path::PathBuf;

use clap::Args;

use super::ConfigArgs;
use crate::config::{parse_slurm_time, Flag};
use crate::error::{Error, Result};
use crate::slurm::{self, SubmitOptions};

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Nodes (`slurm.nodes`).
    #[arg(long)]
    pub nodes: Option<usize>,
    /// kiln processes per node, each a kiln node of the job (`slurm.tasks_per_node`).
    #[arg(long)]
    pub tasks_per_node: Option<usize>,
    /// GPUs per node (`slurm.gpus_per_node`; default: strategy.devices on CUDA).
    #[arg(long)]
    pub gpus_per_node: Option<usize>,
    /// CPUs per task (`slurm.cpus_per_task`); kiln uses them as its math threads.
    #[arg(long)]
    pub cpus_per_task: Option<usize>,
    /// Time limit, HH:MM:SS or D-HH:MM:SS (`slurm.time`).
    #[arg(long, value_name = "HH:MM:SS")]
    pub time: Option<String>,
    /// `slurm.partition`.
    #[arg(long)]
    pub partition: Option<String>,
    /// `slurm.account`.
    #[arg(long)]
    pub account: Option<String>,
    /// Print the sbatch script and submit nothing (writes nothing either).
    #[arg(long)]
    pub dry_run: bool,
    /// More sbatch options, after `--`, passed to sbatch as they are.
    #[arg(last = true, value_name = "SBATCH_OPTIONS")]
    pub extra: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The run directory `kiln submit` (or `kiln run`) printed.
    pub run_dir: PathBuf,
}

/// The flags as typed config values (the top layer), each checked first so that its error
/// names the flag.
fn flags(a: &SubmitArgs) -> Result<Vec<Flag>> {
    let mut flags = Vec::new();
    for (flag, key, v) in [
        ("--nodes", "slurm.nodes", a.nodes),
        ("--tasks-per-node", "slurm.tasks_per_node", a.tasks_per_node),
        ("--cpus-per-task", "slurm.cpus_per_task", a.cpus_per_task),
    ] {
        if let Some(v) = v {
            if v == 0 {
                return Err(Error::Usage(format!("{flag} 0: give at least 1")));
            }
            flags.push(Flag::int(flag, key, v as u64));
        }
    }
    if let Some(g) = a.gpus_per_node {
        flags.push(Flag::int(
            "--gpus-per-node",
            "slurm.gpus_per_node",
            g as u64,
        ));
    }
    if let Some(t) = &a.time {
        parse_slurm_time(t).map_err(|why| Error::Usage(format!("--time: {why}")))?;
        flags.push(Flag::str("--time", "slurm.time", t));
    }
    for (flag, key, v) in [
        ("--partition", "slurm.partition", &a.partition),
        ("--account", "slurm.account", &a.account),
    ] {
        if let Some(v) = v {
            if !crate::config::slurm_name_ok(v) {
                return Err(Error::Usage(format!("{flag} {v:?} is not a Slurm name")));
            }
            flags.push(Flag::str(flag, key, v));
        }
    }
    Ok(flags)
}

pub fn submit(a: &SubmitArgs) -> Result<()> {
    let mut c = a.config.clone();
    c.flags.extend(flags(a)?);
    let r = c.resolve()?;
    slurm::submit(
        &r,
        &SubmitOptions {
            dry_run: a.dry_run,
            extra: a.extra.clone(),
        },
    )
}

pub fn status(a: &StatusArgs) -> Result<()> {
    crate::ui::out_raw(&slurm::status(&a.run_dir)?);
    Ok(())
}
