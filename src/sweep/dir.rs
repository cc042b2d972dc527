//! A sweep's directory: where it is, a run directory refused as one, and `sweep.lock`.

use std::fs;
use std::path::{Path, PathBuf};

use super::SweepSpec;
use crate::config::Config;
use crate::error::{Error, Result};
/// The directory of sweep `spec` with base config `base`: the one it was resumed in, else the
/// base config's.
pub fn dir_of(spec: &SweepSpec, base: &Config) -> PathBuf {
    spec.dir.clone().unwrap_or_else(|| sweep_dir(base))
}

/// The sweep directory of a base config.
pub fn sweep_dir(base: &Config) -> PathBuf {
    let name = base
        .sweep
        .name
        .clone()
        .unwrap_or_else(|| base.experiment.name.clone());
    Path::new(&base.experiment.output_dir).join(name)
}

/// Refuses a sweep directory that holds a run (`config.toml`, no `sweep.json`): the sweep's
/// files and its trials would be written into the run, over its report.
pub(super) fn refuse_run_dir(dir: &Path) -> Result<()> {
    if dir.join("config.toml").exists() && !dir.join("sweep.json").exists() {
        return Err(Error::Usage(format!(
            "`{}` holds a run, not a sweep; the sweep would write over its files\n  = help: name the sweep with `--set sweep.name=\"...\"` (or `[sweep] name`), or move the run away",
            dir.display()
        )));
    }
    Ok(())
}

/// Holds `sweep.lock` while a sweep runs in a directory.
pub(super) struct Lock(PathBuf);

impl Lock {
    pub(super) fn take(dir: &Path) -> Result<Lock> {
        let path = dir.join("sweep.lock");
        if let Ok(pid) = fs::read_to_string(&path) {
            let pid = pid.trim();
            if pid != std::process::id().to_string() && Path::new("/proc").join(pid).exists() {
                return Err(Error::Usage(format!(
                    "the sweep in {} is already running (pid {pid}); wait for it or stop it first",
                    dir.display()
                )));
            }
        }
        fs::write(&path, std::process::id().to_string())
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        Ok(Lock(path))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // A stale lock names a dead process and is taken over next time.
        let _ = fs::remove_file(&self.0);
    }
}
