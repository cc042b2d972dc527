//! `kiln run`: parses the arguments and hands the resolved config to `launch::start` (which
//! checks everything first, so bad input exits 2 with nothing written).

use std::path::PathBuf;

use clap::Args;

use super::ConfigArgs;
use crate::config::Flag;
use crate::error::Result;
use crate::launch::{self, RunOptions};

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Write the run here instead of `<output_dir>/<experiment.name>` (must not hold a run).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// No progress bar and no status lines (the run directory is still printed).
    #[arg(long)]
    pub quiet: bool,
    /// Resume the newest unfinished run of this experiment from its newest verified checkpoint
    /// (a fresh run when there is none): what a preempted job's unchanged command line needs.
    #[arg(long)]
    pub resume: bool,
    #[command(flatten)]
    pub launch: LaunchArgs,
}

/// Where this process sits in a multi-node job (else from torchrun's or Slurm's variables).
#[derive(Debug, Args, Clone, Default)]
pub struct LaunchArgs {
    /// Node processes in the job (`launch.nnodes`).
    #[arg(long)]
    pub nnodes: Option<usize>,
    /// This process's node, 0..nnodes (`launch.node_rank`).
    #[arg(long)]
    pub node_rank: Option<usize>,
    /// Address of node 0's rendezvous store (`launch.master_addr`).
    #[arg(long)]
    pub master_addr: Option<String>,
    /// Port of node 0's rendezvous store (`launch.master_port`).
    #[arg(long)]
    pub master_port: Option<u16>,
}

impl LaunchArgs {
    /// The flags as typed config values (the top layer of the config).
    pub fn flags(&self) -> Vec<Flag> {
        let ints = [
            ("--nnodes", "launch.nnodes", self.nnodes.map(|v| v as u64)),
            (
                "--node-rank",
                "launch.node_rank",
                self.node_rank.map(|v| v as u64),
            ),
            (
                "--master-port",
                "launch.master_port",
                self.master_port.map(u64::from),
            ),
        ];
        let mut out: Vec<Flag> = ints
            .into_iter()
            .filter_map(|(flag, key, v)| v.map(|v| Flag::int(flag, key, v)))
            .collect();
        if let Some(a) = &self.master_addr {
            out.push(Flag::str("--master-addr", "launch.master_addr", a));
        }
        out
    }
}

impl RunArgs {
    /// The config arguments with the launch flags as the top layer.
    fn config_args(&self) -> ConfigArgs {
        let mut a = self.config.clone();
        a.flags.extend(self.launch.flags());
        a
    }
}

pub fn run(a: &RunArgs) -> Result<()> {
    let r = a.config_args().resolve()?;
    launch::start(
        &r,
        &RunOptions {
            run_dir: a.run_dir.clone(),
            quiet: a.quiet,
            resume: a.resume,
        },
    )
}
