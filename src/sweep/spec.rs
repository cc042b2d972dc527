//! What `kiln sweep` was given (`sweep.json`), read back for `--resume DIR` and by the jobs
//! of a Slurm sweep.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config;
use crate::error::{Error, Result};
/// What `kiln sweep` was given; kept as `sweep.json` so `--resume DIR` can run it again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepSpec {
    pub file: PathBuf,
    pub sets: Vec<String>,
    /// Where the trials run: child processes here, or a Slurm job array.
    #[serde(default)]
    pub executor: ExecutorKind,
    /// An asha sweep on Slurm: segments queued or running at once, as last submitted (its
    /// jobs submit the next segments with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<usize>,
    /// The sweep directory, when the sweep is resumed (`--resume DIR`): DIR, wherever it is
    /// and whatever the working directory (issue 58, defect 2: the directory was made again
    /// from the experiment file's `output_dir`, relative to the working directory, so a resume
    /// from elsewhere started every trial again in a new directory, and a copied sweep
    /// directory continued the original). Not stored: a sweep directory is where it is.
    #[serde(skip)]
    pub dir: Option<PathBuf>,
}

impl SweepSpec {
    /// Writes the spec as `dir/sweep.json` for `executor`, with the experiment file's absolute
    /// path (so `--resume DIR` works from anywhere) and no password; returns it with this
    /// session's sets (its trials are this session's).
    pub(super) fn store(&self, dir: &Path, executor: ExecutorKind) -> Result<SweepSpec> {
        let stored = SweepSpec {
            file: self
                .file
                .canonicalize()
                .unwrap_or_else(|_| self.file.clone()),
            // (no secret in a file: a tracking server's password is the session's)
            sets: self
                .sets
                .iter()
                .map(|s| config::without_password(s))
                .collect(),
            executor,
            parallel: self.parallel,
            dir: None,
        };
        crate::rundir::write_json(&dir.join("sweep.json"), &stored)?;
        // (this session's trials keep what it was given, a password too)
        Ok(SweepSpec {
            sets: self.sets.clone(),
            ..stored
        })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// Child `kiln` processes on this machine, `parallel` at once.
    #[default]
    Local,
    /// One Slurm job array (`sbatch --array=...%parallel`).
    Slurm,
}

/// The spec a sweep directory was started with, for that directory (wherever it is now).
pub fn read_spec(dir: &Path) -> Result<SweepSpec> {
    let p = dir.join("sweep.json");
    let text = fs::read_to_string(&p).map_err(|_| {
        Error::Usage(format!(
            "`{}` is not a sweep directory (no sweep.json)",
            dir.display()
        ))
    })?;
    let mut spec: SweepSpec = serde_json::from_str(&text)
        .map_err(|e| Error::Usage(format!("{} does not parse: {e}", p.display())))?;
    spec.dir = Some(dir.to_path_buf());
    Ok(spec)
}
