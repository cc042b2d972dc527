//! `kiln ckpt list RUN_DIR` and `kiln ckpt verify RUN_DIR`.

use std::path::PathBuf;

use clap::Subcommand;

use crate::checkpoint::Entry;
use crate::error::{Error, Result};
use crate::{launch, rundir};

#[derive(Debug, Subcommand)]
pub enum CkptCommand {
    /// List the checkpoints of a run: step, size, valid or why not.
    List {
        /// The run directory.
        run_dir: PathBuf,
    },
    /// Verify the newest checkpoint of a run (exit 1 when it is invalid or there is none).
    Verify {
        /// The run directory.
        run_dir: PathBuf,
    },
}

fn name(e: &Entry) -> String {
    e.path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub fn ckpt(cmd: &CkptCommand) -> Result<()> {
    match cmd {
        CkptCommand::List { run_dir } => {
            let store = rundir::checkpoint_store(run_dir)?;
            let entries = store.list().map_err(Error::Checkpoint)?;
            for p in store.strays() {
                crate::ui::note(&format!(
                    "warning: skipping `{}`: not a checkpoint kiln wrote (checkpoints are directories named step- and 8 digits)",
                    p.display()
                ));
            }
            // checkpoints a resume from an older step set aside (`abandoned-<time>/`)
            let mut aside: Vec<(String, crate::checkpoint::Entry)> = Vec::new();
            if let Ok(d) = std::fs::read_dir(&store.dir) {
                let mut dirs: Vec<_> = d
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with("abandoned-"))
                    // a file under that name is not a store kiln set aside
                    .filter(|e| {
                        let dir = std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir());
                        if !dir {
                            crate::ui::note(&format!(
                                "warning: skipping `{}`: not a directory of checkpoints a resume set aside",
                                e.path().display()
                            ));
                        }
                        dir
                    })
                    .map(|e| e.path())
                    .collect();
                dirs.sort();
                for dir in dirs {
                    let label = dir
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let sub = crate::checkpoint::CheckpointDir::new(dir);
                    for e in sub.list().map_err(Error::Checkpoint)? {
                        aside.push((label.clone(), e));
                    }
                }
            }
            if entries.is_empty() && aside.is_empty() {
                crate::outln!("no checkpoints in {}", run_dir.display());
                return Ok(());
            }
            // the best checkpoint (`checkpoint.keep_best`), as the newest one records it
            let best = launch::best_mark(&store).ok().flatten();
            crate::outln!("{:<20} {:>12}  status", "checkpoint", "bytes");
            for e in &entries {
                let mut status = match &e.status {
                    Ok(()) => "valid".to_string(),
                    Err(why) => format!("invalid: {why}"),
                };
                if let Some(b) = best.as_ref().filter(|b| b.best_step as u64 == e.step) {
                    status.push_str(&format!(", best ({} {})", b.metric, b.best));
                }
                crate::outln!("{:<20} {:>12}  {status}", name(e), e.bytes);
            }
            for (label, e) in &aside {
                crate::outln!(
                    "{:<20} {:>12}  abandoned ({label}/): set aside by a resume from an older step",
                    name(e),
                    e.bytes
                );
            }
            Ok(())
        }
        CkptCommand::Verify { run_dir } => verify(run_dir),
    }
}

/// `kiln ckpt verify RUN_DIR`: the newest finished checkpoint, verified.
fn verify(run_dir: &std::path::Path) -> Result<()> {
    let store = rundir::checkpoint_store(run_dir)?;
    // while a kiln process holds the run, the `.tmp` checkpoint is the save under way,
    // and retention may delete the newest one as it is read: take the newest finished
    // one, and look again when the one read is gone
    let live = rundir::holder(run_dir).is_some();
    let is_tmp = |e: &crate::checkpoint::Entry| e.path.to_string_lossy().ends_with(".tmp");
    let mut tries = 0;
    loop {
        tries += 1;
        let entries = store.list().map_err(Error::Checkpoint)?;
        // a `.tmp` with no kiln process on the run: a save a crash or a kill tore. It is
        // said, and the newest finished checkpoint is judged: that is what a resume
        // takes (issue 58, defect 18: verify failed on the torn one, exit 1)
        if !live {
            for e in entries.iter().filter(|e| is_tmp(e)) {
                crate::ui::note(&format!(
                    "note: {}: an unfinished save (interrupted by a crash or a kill); never resumed from, and removed by the next resume",
                    name(e)
                ));
            }
        }
        let Some(newest) = entries.iter().find(|e| !is_tmp(e)) else {
            // a listing made while a save and a deletion renamed their directories (the
            // renames may be over by the time `is_changing` looks: a live run is listed
            // again, for up to a second, whatever it says)
            if live && tries < 100 {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            return Err(Error::Invalid(format!(
                "no checkpoints in {}",
                run_dir.display()
            )));
        };
        return match &newest.status {
            Ok(()) => {
                crate::outln!("{}: valid", name(newest));
                Ok(())
            }
            // deleted by retention, or renamed into place, while it was read
            Err(_) if live && tries < 100 && (!newest.path.exists() || store.is_changing()) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            Err(why) => Err(Error::Invalid(format!("{}: {why}", name(newest)))),
        };
    }
}
