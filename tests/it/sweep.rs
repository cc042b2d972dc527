//! Sweeps: trials checked before any runs, parallel trials with a results table, re-runs that
//! start nothing, SIGKILL of the sweep and continuation from checkpoints, failed trials.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{kiln, stderr, stdout, write, KILN, TINY};

fn sweep_file(dir: &Path, sweep: &str, extra: &str) -> String {
    write(
        dir,
        "sweep.toml",
        &format!("{TINY}\n{extra}\n[sweep]\n{sweep}\n"),
    );
    "sweep.toml".into()
}

fn ledger(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("sweep.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn trial_dirs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.toml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Starts `kiln sweep FILE --quiet SETS` in `dir` (a sweep named tiny, parallel 2) and
/// returns once two trials are training: the child and the sweep directory.
fn start_two_trials(dir: &Path, file: &str, sets: &[&str]) -> (std::process::Child, PathBuf) {
    let child = Command::new(KILN)
        .current_dir(dir)
        .args(["sweep", file, "--quiet"])
        .args(sets)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sweep = dir.join("runs/tiny");
    let start = Instant::now();
    while !sweep.is_dir()
        || trial_dirs(&sweep)
            .iter()
            .filter(|t| sweep.join(t).join("metrics.jsonl").is_file())
            .count()
            < 2
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "trials never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    (child, sweep)
}

#[test]
fn invalid_keys_or_values_are_rejected_before_any_trial_runs() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(d.path(), r#"grid = { "optim.lr" = [0.1, -1.0] }"#, "");
    let o = kiln(d.path(), &["sweep", &f]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(
            "sweep trial 1 (optim.lr=-1.0): `optim.lr` = -1 is out of range: must be at least 0"
        ),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("runs").exists());
    let f = sweep_file(d.path(), r#"grid = { "optim.lrr" = [0.1] }"#, "");
    let o = kiln(d.path(), &["sweep", &f]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("sweep trial 0 (optim.lrr=0.1): unknown key `optim.lrr`"),
        "{e}"
    );
    assert!(e.contains("did you mean `optim.lr`?"), "{e}");
    assert!(!d.path().join("runs").exists());
    let f = sweep_file(d.path(), r#"metric = "eval_loss""#, "");
    let o = kiln(d.path(), &["sweep", &f]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("the sweep has no trials"));
}

#[test]
fn a_parallel_grid_completes_and_a_rerun_starts_nothing() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(
        d.path(),
        r#"grid = { "optim.lr" = [0.05, 0.2], "optim.momentum" = [0.0, 0.9] }"#,
        "",
    );
    let o = kiln(d.path(), &["sweep", &f, "--parallel", "2", "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let dir = d.path().join("runs/tiny");
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert!(csv.lines().skip(1).all(|l| l.contains(",done,")), "{csv}");
    // best first
    let metric: Vec<f64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(3).unwrap().parse().unwrap())
        .collect();
    assert!(metric.windows(2).all(|w| w[0] <= w[1]), "{metric:?}");
    assert!(stdout(&o).contains("optim.lr=0.2"));
    assert_eq!(trial_dirs(&dir).len(), 4);
    let before = ledger(&dir).len();
    let o = kiln(d.path(), &["sweep", &f]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("all 4 trials"), "{}", stderr(&o));
    assert_eq!(ledger(&dir).len(), before);
    let o = kiln(d.path(), &["sweep", "status", dir.to_str().unwrap()]);
    assert!(stdout(&o).contains("4 trials: 4 done"), "{}", stdout(&o));
}

#[test]
fn a_failing_trial_does_not_stop_the_others() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(d.path(), r#"grid = { "optim.lr" = [0.05, 1e38, 0.1] }"#, "");
    let o = kiln(d.path(), &["sweep", &f, "--parallel", "2", "--quiet"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("1 of 3 trials failed"),
        "{}",
        stderr(&o)
    );
    let csv = std::fs::read_to_string(d.path().join("runs/tiny/results.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 3);
    assert!(
        rows[0].contains(",done,") && rows[1].contains(",done,"),
        "{csv}"
    );
    assert!(
        rows[2].contains(",failed,") && rows[2].contains("training diverged"),
        "{csv}"
    );
}

#[test]
fn a_killed_sweep_continues_every_trial_exactly_once() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(
        d.path(),
        r#"grid = { "optim.lr" = [0.01, 0.02, 0.03, 0.04] }"#,
        "",
    );
    // longer trials with frequent checkpoints
    let sets = [
        "--set",
        "train.max_steps=600",
        "--set",
        "checkpoint.every_steps=25",
        "--set",
        "train.log_every=50",
    ];
    let dir = d.path().join("runs/tiny");
    let mut child = Command::new(KILN)
        .current_dir(d.path())
        .args(["sweep", &f, "--parallel", "2", "--quiet"])
        .args(sets)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let has_checkpoint = |dir: &Path| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .any(|e| {
                std::fs::read_dir(e.path().join("checkpoints"))
                    .map(|c| {
                        c.filter_map(|x| x.ok())
                            .any(|x| !x.file_name().to_string_lossy().ends_with(".tmp"))
                    })
                    .unwrap_or(false)
            })
    };
    while !has_checkpoint(&dir) && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL: its trials die with it
    child.wait().unwrap();
    let o = kiln(
        d.path(),
        &["sweep", "--resume", dir.to_str().unwrap(), "--quiet"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let records = ledger(&dir);
    let trials = trial_dirs(&dir);
    assert_eq!(trials.len(), 4, "{trials:?}");
    for t in &trials {
        let done = records
            .iter()
            .filter(|r| r["trial"] == t.as_str() && r["state"] == "done")
            .count();
        assert_eq!(done, 1, "trial {t}");
    }
    let resumed = trials
        .iter()
        .filter(|t| {
            let s: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join(t).join("summary.json")).unwrap(),
            )
            .unwrap();
            s["resumed_from_step"].as_u64().unwrap_or(0) > 0
        })
        .count();
    assert!(resumed >= 1, "no trial continued from a checkpoint");
}

/// SIGTERM to a local sweep: no new trials, the running ones checkpoint and stop (ledger state
/// `preempted`), exit 75; `--resume` continues them from their checkpoints.
#[test]
fn a_signal_stops_a_local_sweep_with_checkpoints_and_resume_continues_them() {
    let d = kiln::testdir::tempdir().unwrap();
    let file = sweep_file(
        d.path(),
        "grid = { \"optim.lr\" = [0.01, 0.02, 0.05] }\nparallel = 2",
        "",
    );
    let (child, dir) = start_two_trials(
        d.path(),
        &file,
        &[
            "--set",
            "train.max_steps=50000",
            "--set",
            "train.log_every=100",
        ],
    );
    // SAFETY: signalling a child process of this test.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the sweep stopped: 2 trial(s) preempted with a checkpoint"),
        "{}",
        stderr(&o)
    );
    let latest: std::collections::BTreeMap<String, serde_json::Value> = ledger(&dir)
        .into_iter()
        .map(|r| (r["trial"].as_str().unwrap().to_string(), r))
        .collect();
    let states: Vec<&str> = latest
        .values()
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states.iter().filter(|s| **s == "preempted").count(),
        2,
        "{states:?}"
    );
    assert!(
        states.contains(&"pending"),
        "the third trial was started: {states:?}"
    );
    let o = kiln(
        d.path(),
        &["sweep", "--resume", dir.to_str().unwrap(), "--quiet"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let resumed = trial_dirs(&dir)
        .iter()
        .map(|t| crate::common::summary(&dir.join(t)))
        .filter(|s| s["status"] == "finished" && s["resumed_from_step"].as_u64() > Some(0))
        .count();
    assert_eq!(resumed, 2, "{}", stdout(&o));
}

#[test]
fn asha_pauses_trials_at_rungs_promotes_a_third_and_the_winner_has_a_straight_runs_bits() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(
        d.path(),
        r#"grid = { "optim.lr" = [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8] }
scheduler = "asha"
reduction_factor = 3
grace_steps = 6"#,
        "",
    );
    let sets = ["--set", "train.max_steps=54", "--set", "train.eval_every=6"];
    let mut args = vec!["sweep", &f[..], "--quiet"];
    args.extend(sets);
    let o = kiln(d.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let dir = d.path().join("runs/tiny");
    crate::common::assert_asha_grid(&dir);
    // the table: one done at 54, two paused at 18, six at 6
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let states: Vec<(&str, &str)> = rows.iter().map(|r| (r[2], r[5])).collect();
    assert_eq!(states[0], ("done", "54"), "{csv}");
    assert_eq!(&states[1..3], &[("paused", "18"); 2], "{csv}");
    assert!(states[3..].iter().all(|s| *s == ("paused", "6")), "{csv}");
    // the winner's parameters are the bits of its config trained straight through
    let winner = rows[0][0];
    let lr = rows[0][1].trim_start_matches("optim.lr=");
    let lr = format!("optim.lr={lr}");
    let mut args = vec![
        "run",
        &f[..],
        "--quiet",
        "--run-dir",
        "straight",
        "--set",
        &lr,
    ];
    args.extend(sets);
    let o = kiln(d.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let sha = |run: &Path| crate::common::summary(run)["params_sha256"].clone();
    assert_eq!(sha(&dir.join(winner)), sha(&d.path().join("straight")));
    // a re-run decides nothing new: every quota is met
    let n = ledger(&dir).len();
    let mut args = vec!["sweep", &f[..], "--quiet"];
    args.extend(sets);
    let o = kiln(d.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(ledger(&dir).len(), n);
    let st = kiln(d.path(), &["sweep", "status", dir.to_str().unwrap()]);
    assert!(stdout(&st).contains("paused"), "{}", stdout(&st));
}

/// SIGTERM to a local asha sweep while two trials train to their first rung: they checkpoint
/// and stop (preempted, sent to rung 25000 in the ledger); `--resume` continues them there,
/// runs the third, and promotes one (rf 2) to the end.
#[test]
fn a_signal_stops_an_asha_sweep_mid_rung_and_resume_goes_on_to_every_rung() {
    let d = kiln::testdir::tempdir().unwrap();
    let file = sweep_file(
        d.path(),
        "grid = { \"optim.lr\" = [0.01, 0.02, 0.05] }\nparallel = 2\nscheduler = \"asha\"\nreduction_factor = 2\ngrace_steps = 25000",
        "",
    );
    let sets = [
        "--set",
        "train.max_steps=50000",
        "--set",
        "train.eval_every=25000",
        "--set",
        "train.log_every=100",
    ];
    let (child, dir) = start_two_trials(d.path(), &file, &sets);
    // SAFETY: signalling a child process of this test.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    let latest: std::collections::BTreeMap<String, serde_json::Value> = ledger(&dir)
        .into_iter()
        .map(|r| (r["trial"].as_str().unwrap().to_string(), r))
        .collect();
    let stopped: Vec<(&str, u64)> = latest
        .values()
        .filter(|r| r["state"] != "pending")
        .map(|r| (r["state"].as_str().unwrap(), r["rung"].as_u64().unwrap()))
        .collect();
    assert_eq!(stopped, [("preempted", 25000); 2], "{latest:?}");
    let o = kiln(
        d.path(),
        &["sweep", "--resume", dir.to_str().unwrap(), "--quiet"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let furthest = crate::common::furthest_rungs(&dir);
    let mut reached: Vec<u64> = furthest.values().copied().collect();
    reached.sort_unstable();
    assert_eq!(reached, [25000, 25000, 50000], "{furthest:?}");
    // a preempted trial left paused at its rung continued from its mid-rung checkpoint
    let mid_rung = trial_dirs(&dir)
        .iter()
        .map(|t| crate::common::summary(&dir.join(t))["resumed_from_step"].as_u64())
        .filter(|s| s.is_some_and(|s| s > 0 && s < 25000))
        .count();
    assert!(mid_rung >= 1, "{furthest:?}");
}

#[test]
fn asha_needs_max_steps_a_first_rung_before_it_and_evaluations_at_every_rung() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(
        d.path(),
        "grid = { \"optim.lr\" = [0.1, 0.2] }\nscheduler = \"asha\"\ngrace_steps = 4",
        "",
    );
    for (sets, want) in [
        (&[][..], "`sweep.scheduler` = \"asha\" pauses trials at steps, but `train.max_steps` is unset"),
        (
            &["--set", "train.max_steps=4"][..],
            "`sweep.grace_steps` = 4 must be a step before `train.max_steps` = 4",
        ),
        (
            &["--set", "train.max_steps=36", "--set", "train.eval_every=8"][..],
            "asha ranks trials by `eval_loss` at each rung, but rung 4 is not an evaluation step (`train.eval_every` = 8)",
        ),
    ] {
        let mut args = vec!["sweep", &f[..]];
        args.extend(sets);
        let o = kiln(d.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{sets:?}");
        assert!(stderr(&o).contains(want), "{sets:?}: {}", stderr(&o));
    }
    assert!(!d.path().join("runs").exists());
}

#[test]
fn a_run_resumed_at_its_pause_step_pauses_there_again() {
    // (a trial stopped by a signal exactly at its rung resumes from that step's checkpoint:
    // it must not train past the rung unpromoted)
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let sets = [
        "--set",
        "train.max_steps=20",
        "--set",
        "train.pause_at_step=6",
    ];
    let mut args = vec!["run", "t.toml", "--quiet", "--run-dir", "p"];
    args.extend(sets);
    let o = kiln(d.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("paused at step 6 (train.pause_at_step)"),
        "{}",
        stdout(&o)
    );
    let run = d.path().join("p");
    assert_eq!(crate::common::summary(&run)["status"], "paused");
    let o = kiln(d.path(), &["resume", "p", "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = crate::common::summary(&run);
    assert_eq!(
        (s["status"].as_str(), s["steps"].as_u64()),
        (Some("paused"), Some(6)),
        "{s}"
    );
    // a later pause, then the end
    let o = kiln(
        d.path(),
        &["resume", "p", "--quiet", "--set", "train.pause_at_step=0"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = crate::common::summary(&run);
    assert_eq!(
        (s["status"].as_str(), s["steps"].as_u64()),
        (Some("finished"), Some(20)),
        "{s}"
    );
}

/// Issue 58, defects 2 and 5: `kiln sweep --resume DIR` resumes DIR wherever it is run from
/// (it rebuilt the directory from `output_dir`, relative to the working directory, and ran
/// every trial again), a copied sweep directory is resumed as the copy, and a line of the
/// ledger that cannot be read (a non-UTF-8 byte) is named and skipped (the ledger read as
/// empty, and a re-run looped for ever).
#[test]
fn a_sweep_resumes_in_its_directory_from_anywhere_and_a_bad_ledger_line_is_skipped() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(d.path(), r#"grid = { "optim.lr" = [0.01, 0.02] }"#, "");
    let o = kiln(d.path(), &["sweep", &f, "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let dir = d.path().join("runs/tiny");
    let lines = ledger(&dir).len();
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let o = kiln(
        &elsewhere,
        &["sweep", "--resume", dir.to_str().unwrap(), "--quiet"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(ledger(&dir).len(), lines, "a trial ran again");
    assert!(
        !elsewhere.join("runs").exists(),
        "a new sweep directory was made"
    );
    // a copy resumes as itself: its own ledger, the original's untouched
    let copy = d.path().join("copy");
    crate::common::copy_dir(&dir, &copy);
    let mut bytes = std::fs::read(copy.join("sweep.jsonl")).unwrap();
    bytes.extend_from_slice(b"{\"trial\": \"\xff\"}\n");
    std::fs::write(copy.join("sweep.jsonl"), &bytes).unwrap();
    let o = kiln(
        &elsewhere,
        &["sweep", "--resume", copy.to_str().unwrap(), "--quiet"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "sweep.jsonl:{}: skipped a line that cannot be read",
            lines + 1
        )),
        "{}",
        stderr(&o)
    );
    assert_eq!(trial_dirs(&copy).len(), 2);
    assert_eq!(ledger(&dir).len(), lines, "the original's ledger changed");
    assert!(
        stdout(&o).contains(&format!("sweep dir: {}", copy.display())),
        "{}",
        stdout(&o)
    );
}

/// Issue 58, defect 3: 6 trials with rf 3 promote floor(2 / 3) = 0 trials at the middle rung,
/// and the sweep ended with every trial paused; the best of the highest rung now goes on to
/// `train.max_steps`, and the closing line says how many got there.
#[test]
fn asha_always_trains_one_trial_to_max_steps() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(
        d.path(),
        r#"grid = { "optim.lr" = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2] }
scheduler = "asha"
reduction_factor = 3
grace_steps = 2"#,
        "",
    );
    let o = kiln(
        d.path(),
        &[
            "sweep",
            &f,
            "--quiet",
            "--set",
            "train.max_steps=18",
            "--set",
            "train.eval_every=2",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let furthest = crate::common::furthest_rungs(&d.path().join("runs/tiny"));
    let at_least = |s: u64| furthest.values().filter(|&&g| g >= s).count();
    assert_eq!(
        (at_least(2), at_least(6), at_least(18)),
        (6, 2, 1),
        "{furthest:?}"
    );
    assert!(
        stdout(&o).contains("1 of 6 trials reached train.max_steps = 18"),
        "{}",
        stdout(&o)
    );
}

/// Issue 58, defect 4: asha ranking by a metric no trial reports (perplexity of a classifier,
/// an evaluation metric without evaluation data) is refused before anything runs.
#[test]
fn asha_refuses_a_metric_no_trial_reports() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = sweep_file(
        d.path(),
        "grid = { \"optim.lr\" = [0.1, 0.2] }\nscheduler = \"asha\"\ngrace_steps = 2",
        "",
    );
    for (sets, want) in [
        (
            &["--set", "sweep.metric=eval_perplexity"][..],
            "asha ranks trials by `sweep.metric` = \"eval_perplexity\", but no trial reports it: a classifier reports eval_loss and eval_accuracy",
        ),
        (
            &["--set", "data.eval_samples=0"][..],
            "no trial reports it: this experiment has no evaluation data",
        ),
    ] {
        let mut args = vec!["sweep", &f[..], "--set", "train.max_steps=8", "--set", "train.eval_every=2"];
        args.extend(sets);
        let o = kiln(d.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{sets:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{sets:?}: {}", stderr(&o));
        assert!(!d.path().join("runs").exists());
        // kiln check says the same
        let mut args = vec!["check", &f[..], "--set", "train.max_steps=8", "--set", "train.eval_every=2"];
        args.extend(sets);
        let o = kiln(d.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{sets:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("sweep.metric"), "{}", stderr(&o));
    }
}
