//! Run directories: a directory in use is refused naming its process, concurrent runs of one
//! experiment take different directories, and run names and checkpoint directories stay inside
//! their parents.

#![allow(unused_imports)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{
    code, kiln, kiln_env, metric_lines, stderr, stdout, summary, write, KILN, TINY,
};

/// A child process killed when dropped (a failed assertion leaves nothing running).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A long run in `dir/<run_dir>`, returned once it trains (its lock is held).
fn long_run(dir: &Path, run_dir: &str) -> KillOnDrop {
    let mut child = Command::new(KILN)
        .current_dir(dir)
        .args(["run", "t.toml", "--quiet", "--run-dir", run_dir])
        .args([
            "--set",
            "train.max_steps=100000000",
            "--set",
            "train.log_every=100000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let child = KillOnDrop(child);
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.starts_with("run dir:"))),
        "the run never started"
    );
    child
}

#[test]
fn a_run_directory_in_use_is_refused_naming_the_pid_and_freed_when_its_process_dies() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let mut first = long_run(d.path(), "r");
    let pid = first.0.id();
    let o = kiln(d.path(), &["run", "t.toml", "--run-dir", "r"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "run directory `r` is in use by another kiln process (pid {pid})"
        )),
        "{}",
        stderr(&o)
    );
    let o = kiln(d.path(), &["resume", "r"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("(pid {pid})")),
        "{}",
        stderr(&o)
    );
    // SIGKILL: the lock goes with the process
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let o = kiln(d.path(), &["resume", "r", "--set", "train.max_steps=3"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

#[test]
fn concurrent_runs_of_one_experiment_take_different_directories() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let spawn = || {
        Command::new(KILN)
            .current_dir(d.path())
            .args(["run", "t.toml", "--quiet"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let runs: Vec<_> = (0..8).map(|_| spawn()).collect();
    let mut dirs: Vec<String> = runs
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            assert_eq!(code(&o), Some(0), "{}", stderr(&o));
            stdout(&o)
                .lines()
                .find_map(|l| l.strip_prefix("run dir: ").map(str::to_string))
                .unwrap()
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    assert_eq!(dirs.len(), 8, "{dirs:?}");
    for dir in &dirs {
        assert_eq!(summary(&d.path().join(dir))["status"], "finished", "{dir}");
    }
}

#[test]
fn run_names_and_checkpoint_dirs_stay_inside_their_parents() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let long = "x".repeat(300);
    for (set, key) in [
        ("experiment.name=\"..\"", "experiment.name"),
        ("experiment.name=\".\"", "experiment.name"),
        ("experiment.name=\"a/b\"", "experiment.name"),
        (&*format!("experiment.name=\"{long}\""), "experiment.name"),
        ("checkpoint.dir=\"/tmp/elsewhere\"", "checkpoint.dir"),
        ("checkpoint.dir=\"../up\"", "checkpoint.dir"),
        ("checkpoint.dir=\"a/../../b\"", "checkpoint.dir"),
    ] {
        let o = kiln(d.path(), &["run", "t.toml", "--set", set]);
        assert_eq!(code(&o), Some(2), "{set}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("`{key}`")),
            "{set}: {}",
            stderr(&o)
        );
    }
    assert!(!d.path().join("runs").exists() && !d.path().join("config.toml").exists());
    // retention deletes only checkpoints whose manifests verify
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--run-dir",
            "r",
            "--set",
            "train.max_steps=3",
        ],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let foreign = d.path().join("r/checkpoints/step-00000000");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("mine.txt"), "not kiln's").unwrap();
    let o = kiln(
        d.path(),
        &[
            "resume",
            "r",
            "--set",
            "train.max_steps=6",
            "--set",
            "checkpoint.every_steps=1",
            "--set",
            "checkpoint.keep_last=1",
        ],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(foreign.join("mine.txt").is_file());
}
