//! `kiln resume RUN_DIR`: continues a run in place from its newest verified checkpoint (or
//! `--from step-N`); a multi-node run is resumed by running it on every node (node 0 picks the
//! checkpoint). Changes to `model.*` or `data.*` are refused; other changes are allowed and
//! listed. Newer checkpoints that do not verify are skipped with the reason.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::launch;

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run directory (it holds config.toml and checkpoints/).
    pub run_dir: PathBuf,
    /// Override a key for the rest of the run (model.* and data.* cannot change).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Resume from this checkpoint (e.g. `step-00000020`, or `best` with `checkpoint.keep_best`)
    /// instead of the newest verified one.
    #[arg(long, value_name = "step-N")]
    pub from: Option<String>,
    /// No progress bar and no status lines.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub launch: super::run::LaunchArgs,
}

pub fn resume(a: &ResumeArgs) -> Result<()> {
    launch::resume(
        &a.run_dir,
        &a.sets,
        &a.launch.flags(),
        a.from.as_deref(),
        a.quiet,
    )
}
