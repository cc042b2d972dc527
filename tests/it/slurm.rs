//! `kiln submit`, `kiln status` and sweeps against a real one-host Slurm (scripts/slurm-up.sh
//! brings it up; a test that finds none runs the script, and fails saying so when it cannot).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::{kiln, kiln_env, metric_lines, root, stderr, stdout, summary, write, TINY};

/// Whether `sinfo` answers with an idle (or busy) node.
fn slurm_up() -> bool {
    Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .map(|o| {
            let s = String::from_utf8_lossy(&o.stdout);
            o.status.success() && ["idle", "mixed", "alloc"].iter().any(|w| s.contains(w))
        })
        .unwrap_or(false)
}

/// Slurm is up, or this test fails saying how to bring it up. Run as root, it runs
/// scripts/slurm-up.sh itself (on a fresh machine, or one whose daemons stopped with a reboot);
/// the script never touches a Slurm configuration it did not write.
fn need_slurm() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    let r = UP.get_or_init(|| {
        if slurm_up() {
            return Ok(());
        }
        // SAFETY: geteuid has no preconditions.
        let is_root = unsafe { libc::geteuid() } == 0;
        if !is_root {
            return Err(
                "sinfo finds no idle node, and only root may install or start Slurm".into(),
            );
        }
        let o = Command::new("bash")
            .arg(root().join("scripts/slurm-up.sh"))
            .output();
        match o {
            Ok(o) if o.status.success() && slurm_up() => Ok(()),
            Ok(o) => Err(format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => Err(e.to_string()),
        }
    });
    if let Err(why) = r {
        panic!(
            "this test needs a Slurm cluster and `sinfo` finds none; run `scripts/slurm-up.sh` (as root) first.\nIt said: {why}"
        );
    }
}

/// Waits (polling, up to `secs`) until `f` holds.
fn wait_until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out after {secs}s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Cancels a Slurm job when dropped (a failed test leaves nothing running).
struct Cancel(String);

impl Drop for Cancel {
    fn drop(&mut self) {
        let _ = Command::new("scancel").arg(&self.0).output();
    }
}

fn status_of(run: &Path) -> Option<String> {
    std::fs::read_to_string(run.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["status"].as_str().map(str::to_string))
}

fn job_id(run: &Path) -> String {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("slurm/job.json")).unwrap())
            .unwrap();
    v["job_id"].as_str().unwrap().to_string()
}

/// The run directory `kiln submit` printed.
fn submitted_dir(out: &str) -> PathBuf {
    PathBuf::from(
        out.lines()
            .find_map(|l| l.split("run dir: ").nth(1))
            .unwrap_or_else(|| panic!("no run dir in {out}"))
            .trim(),
    )
}

/// Waits for a submitted run to finish, showing its Slurm log when it does not.
fn wait_finished(run: &Path, secs: u64) {
    let start = Instant::now();
    while status_of(run).as_deref() != Some("finished") {
        if start.elapsed() > Duration::from_secs(secs) {
            let id = job_id(run);
            let log = std::fs::read_to_string(run.join(format!("logs/slurm-{id}.out")))
                .unwrap_or_default();
            let st = stdout(&kiln(run, &["status", "."]));
            panic!("job {id} did not finish in {secs}s\nstatus: {st}\nlog:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn submit_dry_run_prints_a_script_that_bash_and_shellcheck_accept_and_writes_nothing() {
    let d = kiln::testdir::tempdir().unwrap();
    write(
        d.path(),
        "t.toml",
        &format!(
            "{TINY}\n[strategy]\nkind = \"ddp\"\n\n[slurm]\nnodes = 2\ntime = \"01:30:00\"\nsignal_secs = 300\nsbatch_args = [\"--mail-type=END\"]\n"
        ),
    );
    let o = kiln(
        d.path(),
        &[
            "submit",
            "t.toml",
            "--dry-run",
            "--partition",
            "gpu",
            "--cpus-per-task",
            "4",
            "--",
            "--qos",
            "high prio",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let script = stdout(&o);
    for line in [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --time=01:30:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --mail-type=END",
        "# more sbatch options, given on its command line: --qos 'high prio'",
        "scontrol show hostnames \"$SLURM_JOB_NODELIST\"",
        "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        "scontrol requeue \"$SLURM_JOB_ID\"",
        "threads=$(( SLURM_CPUS_PER_TASK / 1 ))",
        "srun --ntasks-per-node=1 --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" --kill-on-bad-exit=0 \"$KILN\" resume \"$RUN_DIR\" --quiet --set \"backend.threads=$threads\"",
    ] {
        assert!(script.contains(line), "no `{line}` in\n{script}");
    }
    assert!(stderr(&o).contains("--qos 'high prio'"), "{}", stderr(&o));
    assert!(!d.path().join("runs").exists(), "a dry run wrote files");
    let f = write(d.path(), "job.sbatch", &script);
    let n = Command::new("bash").arg("-n").arg(&f).output().unwrap();
    assert!(n.status.success(), "bash -n: {}", stderr(&n));
    if let Ok(sc) = Command::new("shellcheck").arg(&f).output() {
        assert!(sc.status.success(), "shellcheck:\n{}", stdout(&sc));
    }
}

#[test]
fn submit_refuses_bad_input_with_exit_2_and_submits_nothing() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let bad = |args: &[&str], env: &[(&str, &str)], want: &str| {
        let mut a = vec!["submit", "t.toml"];
        a.extend(args);
        let o = kiln_env(d.path(), &a, env);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        assert!(
            !d.path().join("runs").exists(),
            "{args:?} left a run directory"
        );
    };
    bad(&[], &[("PATH", "/nonexistent")], "`sbatch` is not on PATH");
    bad(
        &["--time", "25:99"],
        &[],
        "--time: `25:99` is not a time limit",
    );
    bad(&["--time", "1-2-3"], &[], "--time");
    bad(&["--nodes", "0"], &[], "--nodes 0: give at least 1");
    bad(&["--time", "99999999999999999999:00:00"], &[], "--time");
    bad(
        &["--nodes", "2"],
        &[],
        "but strategy.kind = \"single\" runs in one process",
    );
    // a line break in a name or path would end up in the script
    bad(
        &["--set", "experiment.name=\"a\\nb\""],
        &[],
        "experiment.name",
    );
    bad(
        &["--set", "experiment.output_dir=\"r\\necho x\""],
        &[],
        "experiment.output_dir",
    );
    bad(
        &["--set", "slurm.signal_secs=99999999"],
        &[],
        "at most 65535",
    );
    bad(
        &["--set", "slurm.account=\"x'y\""],
        &[],
        "`slurm.account` = \"x'y\" is not a Slurm name",
    );
    bad(
        &["--partition", "a b"],
        &[],
        "--partition \"a b\" is not a Slurm name",
    );
    bad(
        &["--set", "slurm.time=\"00:01:00\""],
        &[],
        "`slurm.time` = \"00:01:00\" is not longer than `slurm.signal_secs` = 120",
    );
    bad(
        &["--set", "slurm.sbatch_args=[\"x\"]"],
        &[],
        "`slurm.sbatch_args` has \"x\"",
    );
    bad(
        &["--set", "model.hidden_sizes=[0]"],
        &[],
        "model.hidden_sizes",
    );
    // sbatch's own refusal is shown, and the run directory it would have used is gone
    need_slurm();
    bad(
        &["--partition", "nosuch"],
        &[],
        "sbatch refused the job: sbatch: error:",
    );
}

#[test]
fn submit_of_quickstart_ddp_finishes_with_the_local_final_loss() {
    need_slurm();
    let d = kiln::testdir::tempdir().unwrap();
    let file = root().join("experiments/quickstart-ddp.toml");
    let file = file.to_str().unwrap();
    let local = kiln(d.path(), &["run", file, "--quiet", "--run-dir", "local"]);
    assert!(local.status.success(), "{}", stderr(&local));
    let o = kiln(d.path(), &["submit", file]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = submitted_dir(&stdout(&o));
    let _cancel = Cancel(job_id(&run));
    assert!(run.is_absolute() && run.join("slurm/job.sbatch").is_file());
    let token = run.join("slurm/token");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&token).unwrap().permissions().mode() & 0o777,
        0o600
    );
    wait_finished(&run, 180);
    let (a, b) = (summary(&run), summary(&d.path().join("local")));
    assert_eq!(a["final_loss"], b["final_loss"]);
    assert_eq!(a["params_sha256"], b["params_sha256"]);
    // the summary is written before the job's script ends: Slurm says done a moment later
    let done = format!("job {} (kiln-quickstart-ddp): done", job_id(&run));
    let mut st = String::new();
    wait_until(60, "the job to end", || {
        st = stdout(&kiln(d.path(), &["status", run.to_str().unwrap()]));
        st.contains(&done) || st.contains("failed")
    });
    assert!(
        st.contains(&done) && st.contains("run: finished at step"),
        "{st}"
    );
}

/// A two-task job (two kiln nodes over srun on this host) gets SIGUSR1 in its batch script
/// (`scancel --signal=USR1 --batch`, as before a time limit): kiln checkpoints, the script
/// requeues the job, the job continues in the same run directory and finishes with the
/// metrics of an uninterrupted two-node run, bit for bit.
#[test]
fn a_stop_signal_checkpoints_requeues_and_the_job_finishes_bit_exactly() {
    need_slurm();
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let sets = [
        "train.max_steps=10000",
        "strategy.kind=ddp",
        "train.batch_size=4",
        "train.log_every=10",
        // a loaded test machine can starve a node for seconds
        "launch.heartbeat_secs=60",
    ];
    // the uninterrupted reference: two node processes here
    let port = crate::common::store_port();
    let node = |rank: usize, dir: Option<&str>| {
        let mut a = vec!["run", "t.toml"];
        if let Some(dir) = dir {
            a.extend(["--run-dir", dir]);
        }
        for s in sets {
            a.extend(["--set", s]);
        }
        crate::common::node_cmd(d.path(), &a, rank, 2, port, "t")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (node(0, Some("ref")), node(1, None));
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    let reference = d.path().join("ref");

    let mut args = vec!["submit", "t.toml", "--tasks-per-node", "2"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = kiln(d.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = submitted_dir(&stdout(&o));
    let id = job_id(&run);
    let _cancel = Cancel(id.clone());
    wait_until(120, "the job's first metrics", || {
        run.join("metrics.jsonl").is_file() && !metric_lines(&run).is_empty()
    });
    let sc = Command::new("scancel")
        .args(["--signal=USR1", "--batch", &id])
        .output()
        .unwrap();
    assert!(sc.status.success(), "{}", stderr(&sc));
    // the script requeues the job; Slurm holds a requeued job back for two minutes: release it
    // sooner (not in the second of the requeue: slurmd refuses that job's credential then)
    wait_until(60, "the requeue", || {
        stdout(&kiln(d.path(), &["status", run.to_str().unwrap()])).contains(": requeued")
    });
    let preempted = summary(&run);
    assert_eq!(preempted["status"], "preempted", "{preempted}");
    assert_eq!(preempted["stopped_by"], "SIGUSR1", "{preempted}");
    let Some(step) = preempted["steps"].as_u64() else {
        panic!("{preempted}")
    };
    assert!(
        step < 10000,
        "the job finished before the signal: {preempted}"
    );
    Command::new("scontrol")
        .args(["update", &format!("JobId={id}"), "StartTime=now+3"])
        .output()
        .unwrap();
    wait_finished(&run, 180);
    let s = summary(&run);
    assert_eq!(s["resumed_from_step"], step, "{s}");
    let log = std::fs::read_to_string(run.join(format!("logs/slurm-{id}.out"))).unwrap();
    assert!(log.contains(&format!("requeueing job {id}")), "{log}");
    assert!(log.contains("(restart 1)"), "{log}");
    let losses = |r: &Path| -> Vec<(u64, f64)> {
        metric_lines(r)
            .iter()
            .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
            .collect()
    };
    assert_eq!(losses(&run), losses(&reference));
    assert_eq!(s["params_sha256"], summary(&reference)["params_sha256"]);
}

/// A sweep as one job array: cancelled while its first trial runs, submitted again (only the
/// trials not done), completed, and a third submission submits nothing.
#[test]
fn a_sweep_runs_as_a_job_array_survives_a_cancel_and_never_duplicates_a_trial() {
    need_slurm();
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    write(
        d.path(),
        "sw.toml",
        "extends = [\"t.toml\"]\n[experiment]\nname = \"sw\"\n[train]\nmax_steps = 50000\nlog_every = 100\n[sweep]\nparallel = 1\n[sweep.grid]\n\"optim.lr\" = [0.01, 0.02, 0.05, 0.1]\n",
    );
    let sweep = |extra: &[&str]| {
        let mut a = vec!["sweep", "sw.toml", "--executor", "slurm"];
        a.extend(extra);
        let o = kiln(d.path(), &a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let dir = d.path().join("runs/sw");
    let status = || {
        let o = kiln(d.path(), &["sweep", "status", dir.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let out = sweep(&[]);
    assert!(
        out.contains("trial(s) 0,1,2,3 of 4, at most 1 at once"),
        "{out}"
    );
    let job = out
        .split("job array ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap()
        .to_string();
    let _cancel = Cancel(job.clone());
    // the ledger knows each trial's job and index
    let ledger = std::fs::read_to_string(dir.join("sweep.jsonl")).unwrap();
    for i in 0..4 {
        assert!(
            ledger.contains(&format!(
                "\"state\":\"queued\",\"job\":\"{job}\",\"array_index\":{i}"
            )),
            "{ledger}"
        );
    }
    // cancel the array while its first trial runs
    wait_until(120, "a trial's first metrics", || {
        std::fs::read_dir(&dir).unwrap().any(|e| {
            let p = e.unwrap().path();
            p.join("metrics.jsonl").is_file()
        })
    });
    let c = Command::new("scancel").arg(&job).output().unwrap();
    assert!(c.status.success(), "{}", stderr(&c));
    wait_until(60, "the cancelled array to leave the queue", || {
        settled(&status())
    });
    let after_cancel = status();
    assert!(!after_cancel.contains("4 done"), "{after_cancel}");
    // the running trial stopped with a checkpoint (and was not requeued: a cancel stays one)
    assert!(after_cancel.contains("preempted"), "{after_cancel}");
    // submitted again: only what is not done; a trial stopped mid-run continues from its
    // checkpoint
    let out = sweep(&["--parallel", "2"]);
    assert!(out.contains("submitted Slurm job array"), "{out}");
    let again = sweep(&[]);
    assert!(
        again.contains("nothing to submit"),
        "a live trial was submitted twice: {again}"
    );
    wait_until(240, "every trial done", || {
        status().contains("4 trials: 4 done")
    });
    let out = sweep(&[]);
    assert!(out.contains("nothing to submit"), "{out}");
    let resumed = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("summary.json").is_file())
        .any(|e| summary(&e.path())["resumed_from_step"].as_u64() > Some(0));
    assert!(resumed, "the preempted trial started over: {after_cancel}");
}

/// Issue 31: `srun -n 2 kiln run FILE` with no MASTER_ADDR, MASTER_PORT or token: node 0 is
/// the first host of the step's node list, the port comes from the job and step ids, and the
/// two tasks are one job with the losses of a two-device run.
#[test]
fn srun_alone_starts_a_two_node_job() {
    need_slurm();
    let d = kiln::testdir::tempdir().unwrap();
    crate::tools::ddp_reference(d.path(), 2);
    let mut cmd = crate::common::clean_cmd(
        Path::new("srun"),
        d.path(),
        &[
            "-n",
            "2",
            "--overcommit",
            "--time=5",
            crate::common::KILN,
            "run",
            "t.toml",
            "--quiet",
        ],
    );
    for v in ["MASTER_ADDR", "MASTER_PORT", "KILN_JOB_TOKEN"] {
        cmd.env_remove(v);
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let run = d.path().join("runs/tiny");
    assert_eq!(
        crate::common::losses(&run),
        crate::common::losses(&d.path().join("ref"))
    );
    assert_eq!(summary(&run)["world_size"], 2);
}

/// Whether `kiln sweep status` counts no trial queued or running.
fn settled(status: &str) -> bool {
    let counts = status.lines().last().unwrap_or("");
    !counts.contains("queued") && !counts.contains("running")
}

/// Cancels every job of a name when dropped.
struct CancelNamed(&'static str);

impl Drop for CancelNamed {
    fn drop(&mut self) {
        let _ = Command::new("scancel").args(["--name", self.0]).output();
    }
}

/// Issue 48: an asha sweep on Slurm, promotion as resubmission. Each segment (a trial to its
/// next rung) is a job whose end submits the next ones, at most `parallel` queued or running;
/// cancelled mid-way and submitted again, the sweep ends as an uninterrupted one would (9
/// trials, rf 3, rungs 6, 18, 54: 9, 3 and 1 trials reach them) and the winner's parameters
/// are the bits of its config trained straight through.
#[test]
fn an_asha_sweep_promotes_by_resubmission_survives_a_cancel_and_the_winner_has_a_straight_runs_bits(
) {
    need_slurm();
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    write(
        d.path(),
        "sw.toml",
        "extends = [\"t.toml\"]\n[experiment]\nname = \"asha-sl\"\n[train]\nmax_steps = 54\neval_every = 6\n[sweep]\nparallel = 2\nscheduler = \"asha\"\nreduction_factor = 3\ngrace_steps = 6\n[sweep.grid]\n\"optim.lr\" = [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8]\n",
    );
    let _cancel = CancelNamed("kiln-sweep-asha-sl");
    let dir = d.path().join("runs/asha-sl");
    let sweep = || {
        let o = kiln(d.path(), &["sweep", "sw.toml", "--executor", "slurm"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let status = || {
        let o = kiln(d.path(), &["sweep", "status", dir.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let ledger = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.join("sweep.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let out = sweep();
    assert!(
        out.contains("trial 0 to step 6") && out.contains("trial 1 to step 6"),
        "{out}"
    );
    assert!(out.contains("at most 2 queued or running"), "{out}");
    // three segments paused (their jobs submitted the next ones): cancel every job of the sweep
    wait_until(120, "three paused segments", || {
        ledger().iter().filter(|r| r["state"] == "paused").count() >= 3
    });
    // (a job deciding as the cancel comes may have submitted one more: cancel until Slurm
    // lists no job of the sweep, as a user would; it lists a cancelled job until its script
    // has ended, and only a listed job's script can submit more)
    wait_until(90, "the cancelled jobs to leave the queue", || {
        let c = Command::new("scancel")
            .args(["--name", "kiln-sweep-asha-sl"])
            .output()
            .unwrap();
        assert!(c.status.success(), "{}", stderr(&c));
        let q = Command::new("squeue")
            .args(["-h", "--name", "kiln-sweep-asha-sl", "-o", "%i %T"])
            .output()
            .unwrap();
        assert!(q.status.success(), "{}", stderr(&q));
        stdout(&q).trim().is_empty() && settled(&status())
    });
    let after_cancel = status();
    assert!(!after_cancel.contains("1 done"), "{after_cancel}");
    // submitted again: the ledger says where every trial is, and the jobs go on from there
    let out = sweep();
    assert!(
        out.contains("submitted asha segment(s)"),
        "{out}\nledger:\n{}",
        std::fs::read_to_string(dir.join("sweep.jsonl")).unwrap_or_default()
    );
    wait_until(240, "the winner done", || {
        status().contains("9 trials: 1 done, 8 paused")
    });
    crate::common::assert_asha_grid(&dir);
    // the winner, trained straight through here
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let first: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!((first[2], first[5]), ("done", "54"), "{csv}");
    let lr = first[1].to_string();
    let o = kiln(
        d.path(),
        &[
            "run",
            "sw.toml",
            "--quiet",
            "--run-dir",
            "straight",
            "--set",
            &lr,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        summary(&dir.join(first[0]))["params_sha256"],
        summary(&d.path().join("straight"))["params_sha256"]
    );
    let out = sweep();
    assert!(out.contains("nothing to submit"), "{out}");
    // a job Slurm starts again after its segment was recorded (a requeue) does not train: the
    // ledger's latest record of the trial does not name it
    let o = kiln(
        d.path(),
        &[
            "sweep",
            "advance",
            dir.to_str().unwrap(),
            "--trial",
            first[0],
            "--job",
            "1",
            "--check",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "skip");
    // a job Slurm runs again after a lost node, whose segment a refresh had called failed,
    // goes on, and counts as running again
    let mut rec = ledger()
        .into_iter()
        .rev()
        .find(|r| r["state"] == "paused")
        .unwrap();
    rec["state"] = "failed".into();
    rec["job"] = "77".into();
    let mut text = std::fs::read_to_string(dir.join("sweep.jsonl")).unwrap();
    text.push_str(&format!("{rec}\n"));
    std::fs::write(dir.join("sweep.jsonl"), text).unwrap();
    let trial = rec["trial"].as_str().unwrap();
    let args = ["sweep", "advance", dir.to_str().unwrap(), "--trial", trial];
    let o = kiln(d.path(), &[&args[..], &["--job", "77", "--check"]].concat());
    assert_eq!(stdout(&o).trim(), "run", "{}", stderr(&o));
    let last = ledger().pop().unwrap();
    assert_eq!(
        (&last["state"], &last["job"]),
        (&"running".into(), &"77".into())
    );
}
