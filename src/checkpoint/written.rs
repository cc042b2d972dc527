//! How rank 0's background writer (`checkpoint.async`) learns that the other ranks wrote their
//! files of a checkpoint before it commits it: each rank leaves a marker in `step-N.tmp/` once
//! its files are fsynced; rank 0 waits for the markers, removes them and commits. The checkpoint
//! directory is shared by the ranks already (rank 0 commits what they wrote), so it is the
//! channel: the training ranks' collectives stay theirs alone.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::dir::{io, CheckpointDir, CheckpointError};

fn marker(rank: usize) -> String {
    format!(".written-rank-{rank:05}")
}

fn failure(rank: usize) -> String {
    format!(".failed-rank-{rank:05}")
}

impl CheckpointDir {
    /// Says that rank `rank` wrote (and fsynced) its files of checkpoint `step`.
    pub fn mark_written(&self, step: u64, rank: usize) -> Result<(), CheckpointError> {
        let path = self.tmp_dir(step).join(marker(rank));
        fs::write(&path, b"").map_err(io(&path))
    }

    /// Says that rank `rank` could not write its files of checkpoint `step`, and why, so that
    /// rank 0 stops waiting for them (best effort: the rank fails the run either way).
    pub fn mark_failed(&self, step: u64, rank: usize, why: &str) {
        let _ = fs::write(self.tmp_dir(step).join(failure(rank)), why.as_bytes());
    }

    /// Waits until ranks `1..ranks` marked checkpoint `step` written, then removes their
    /// markers (rank 0, before `commit`). Fails at once when a rank marked it failed or
    /// `cancel` is set (the run failed), and after `timeout` naming the ranks that did not write.
    pub fn wait_written(
        &self,
        step: u64,
        ranks: usize,
        timeout: Duration,
        cancel: &AtomicBool,
    ) -> Result<(), CheckpointError> {
        let tmp = self.tmp_dir(step);
        let paths: Vec<(usize, PathBuf)> = (1..ranks).map(|r| (r, tmp.join(marker(r)))).collect();
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let missing: Vec<usize> = paths
                .iter()
                .filter(|(_, p)| !p.exists())
                .map(|(r, _)| *r)
                .collect();
            if missing.is_empty() {
                break;
            }
            let failed = missing.iter().find_map(|&r| {
                let text = fs::read_to_string(tmp.join(failure(r))).ok()?;
                Some(format!("rank {r} could not write its files: {text}"))
            });
            let why = if failed.is_some() {
                failed
            } else if cancel.load(Ordering::Relaxed) {
                Some("the run stopped before every rank wrote its files".to_string())
            } else if start.elapsed() >= timeout {
                Some(format!(
                    "rank(s) {missing:?} did not write their files within {} s (`strategy.timeout_secs`); see logs/rank-<r>.log",
                    timeout.as_secs()
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(CheckpointError::Unsaved { path: tmp, why });
            }
            // (a poll of the shared directory: the other ranks are other threads or processes)
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        for (_, p) in &paths {
            fs::remove_file(p).map_err(io(p))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_0_waits_for_every_marker_and_gives_up_on_a_timeout_or_a_cancel() {
        let d = crate::testdir::tempdir().unwrap();
        let store = CheckpointDir::new(d.path().to_path_buf());
        store.begin(4).unwrap();
        let no = AtomicBool::new(false);
        store.mark_written(4, 1).unwrap();
        let e = store
            .wait_written(4, 3, Duration::ZERO, &no)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank(s) [2] did not write their files within 0 s"),
            "{e}"
        );
        assert!(e.contains("step-00000004.tmp"), "{e}");
        let e = store
            .wait_written(4, 3, Duration::from_secs(60), &AtomicBool::new(true))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the run stopped before every rank wrote its files"),
            "{e}"
        );
        store.mark_written(4, 2).unwrap();
        store.wait_written(4, 3, Duration::ZERO, &no).unwrap();
        // the markers are gone: the commit lists only the checkpoint's files
        let left = std::fs::read_dir(store.step_dir(4).with_extension("tmp"))
            .unwrap()
            .count();
        assert_eq!(left, 0);
        // one rank: nothing to wait for
        store.wait_written(4, 1, Duration::ZERO, &no).unwrap();
        // a rank that failed is named at once, with why
        store.begin(5).unwrap();
        store.mark_failed(5, 2, "checkpoint I/O on `x`: No space left on device");
        let e = store
            .wait_written(5, 3, Duration::from_secs(60), &no)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 2 could not write its files: checkpoint I/O on `x`: No space left"),
            "{e}"
        );
    }
}
