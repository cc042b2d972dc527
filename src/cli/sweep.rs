//! `kiln sweep FILE [--parallel N] [--set K=V]...`, `kiln sweep --resume SWEEP_DIR`,
//! `kiln sweep status SWEEP_DIR`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::error::{Error, Result};
use crate::sweep::{self, SweepSpec};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SweepArgs {
    #[command(subcommand)]
    pub command: Option<SweepCommand>,
    /// The experiment file with a `[sweep]` section (or a file that extends one).
    pub file: Option<PathBuf>,
    /// Trials at once (overrides `sweep.parallel`); each gets its share of the CPU threads.
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Override a key for every trial.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Continue the sweep in this directory (as first started).
    #[arg(long, value_name = "SWEEP_DIR")]
    pub resume: Option<PathBuf>,
    /// No progress view.
    #[arg(long)]
    pub quiet: bool,
    /// Where the trials run: `local` child processes (the default), or one Slurm job array
    /// (`slurm`, shaped by `[slurm]`); a resumed sweep keeps the one it was started with.
    #[arg(long, value_enum)]
    pub executor: Option<sweep::ExecutorKind>,
}

#[derive(Debug, Subcommand)]
pub enum SweepCommand {
    /// Print the results table of a sweep, while it runs or afterwards.
    Status {
        /// The sweep directory.
        dir: PathBuf,
    },
    /// (Run by an asha sweep's Slurm jobs.) Record the end of a trial's segment and submit the
    /// sweep's next segments.
    #[command(hide = true)]
    Advance {
        /// The sweep directory.
        dir: PathBuf,
        /// The trial whose segment ended.
        #[arg(long)]
        trial: String,
        /// The segment's Slurm job (`SLURM_ARRAY_JOB_ID`).
        #[arg(long)]
        job: String,
        /// Its `kiln resume`'s exit status.
        #[arg(long, required_unless_present = "check")]
        exit: Option<i32>,
        /// Record the end only (the job was cancelled: submit nothing more).
        #[arg(long)]
        record_only: bool,
        /// Before the segment runs: print `run` when the ledger has this job for the trial,
        /// else `skip` (and submit what may run instead).
        #[arg(long, conflicts_with_all = ["exit", "record_only"])]
        check: bool,
    },
}

pub fn sweep(a: &SweepArgs) -> Result<()> {
    if let Some(SweepCommand::Status { dir }) = &a.command {
        crate::ui::out_raw(&sweep::status(dir)?);
        return Ok(());
    }
    if let Some(SweepCommand::Advance {
        dir,
        trial,
        job,
        exit,
        record_only,
        check,
    }) = &a.command
    {
        let segment = sweep::Segment { trial, job };
        return match exit {
            Some(rc) if !check => sweep::advance(dir, segment, *rc, !record_only),
            _ => {
                let verdict = sweep::check_segment(dir, segment)?;
                crate::ui::out(if verdict { "run" } else { "skip" });
                Ok(())
            }
        };
    }
    let spec = match (&a.file, &a.resume) {
        (Some(file), None) => SweepSpec {
            file: file.clone(),
            sets: a.sets.clone(),
            executor: a.executor.unwrap_or_default(),
            parallel: None,
            dir: None,
        },
        (None, Some(dir)) => {
            if !a.sets.is_empty() {
                return Err(Error::Usage(
                    "--set cannot change a sweep being resumed (it would make new trials); start a new sweep instead".into(),
                ));
            }
            let mut spec = sweep::read_spec(dir)?;
            if let Some(e) = a.executor {
                spec.executor = e;
            }
            spec
        }
        (Some(_), Some(_)) => {
            return Err(Error::Usage(
                "give either FILE or --resume SWEEP_DIR, not both".into(),
            ))
        }
        (None, None) => {
            return Err(Error::Usage(
                "kiln sweep needs FILE (or --resume SWEEP_DIR, or `status DIR`)".into(),
            ))
        }
    };
    if a.parallel == Some(0) {
        return Err(Error::Usage("--parallel must be at least 1".into()));
    }
    match spec.executor {
        sweep::ExecutorKind::Local => {
            crate::train::preempt::install();
            sweep::run_trials(&spec, a.parallel, a.quiet).map(|_| ())
        }
        sweep::ExecutorKind::Slurm => sweep::submit(&spec, a.parallel).map(|_| ()),
    }
}
