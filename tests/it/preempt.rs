//! Preemption: SIGTERM/SIGUSR1/SIGINT stop every rank (on every node) at one step boundary with
//! a checkpoint, status "preempted" and exit 75; resuming gives the uninterrupted run's losses
//! bit for bit; a second SIGINT stops at once.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Output, Stdio};

use crate::common::{kiln, metric_lines, stderr, summary, write, KILN, TINY};

/// Long enough that the signal, sent as training starts, lands well before the end.
pub(crate) const STEPS: usize = 2000;

pub(crate) fn spawn(dir: &Path, args: &[&str]) -> Child {
    crate::common::clean_cmd(Path::new(KILN), dir, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("KILN_JOB_TOKEN", "tok")
        .spawn()
        .unwrap()
}

/// Waits for the child's "run dir:" line (printed as training starts), then sends `sigs`; the
/// rest of its stdout is read on a thread.
pub(crate) fn signal_at_start(child: &mut Child, pid: u32, sigs: &[i32]) -> Stdout {
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        let start = l.starts_with("run dir:");
        seen.push(l);
        if start {
            break;
        }
    }
    for s in sigs {
        // SAFETY: signalling a child process of this test.
        unsafe { libc::kill(pid as i32, *s) };
    }
    std::thread::spawn(move || {
        seen.extend(lines.map_while(|l| l.ok()));
        seen
    })
}

type Stdout = std::thread::JoinHandle<Vec<String>>;

pub(crate) fn finish(child: Child, stdout: Stdout) -> Output {
    let mut o = child.wait_with_output().unwrap();
    o.stdout = stdout.join().unwrap().join("\n").into_bytes();
    o
}

pub(crate) fn losses(run: &Path) -> Vec<(u64, f64)> {
    metric_lines(run)
        .iter()
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// The step a preempted run stopped at: checks its summary, exit code and checkpoint.
pub(crate) fn check_preempted(o: &Output, run: &Path, by: &str) -> usize {
    assert_eq!(o.status.code(), Some(75), "{}", stderr(o));
    let s = summary(run);
    assert_eq!(s["status"], "preempted", "{s}");
    assert_eq!(s["stopped_by"], by, "{s}");
    let step = s["steps"].as_u64().unwrap() as usize;
    assert!(step > 0 && step < STEPS, "the run was to stop early: {s}");
    let ck = run.join(format!("checkpoints/step-{step:08}"));
    assert!(ck.is_dir(), "no checkpoint at the stop step {step}");
    let e = stderr(o);
    assert!(
        e.contains(&format!(
            "stopped at step {step} ({by}): checkpoint step-{step:08} is saved"
        )) && e.contains("kiln resume"),
        "{e}"
    );
    let v = kiln(run, &["ckpt", "verify", "."]);
    assert_eq!(v.status.code(), Some(0), "{}", stderr(&v));
    let leftovers: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    step
}

/// Rank 0's log holds both sessions of a run stopped at `step` and resumed, each opened by a
/// header, every line timestamped, and the evaluation at `end`.
pub(crate) fn both_sessions_logged(run: &Path, step: usize, end: usize) {
    let log = std::fs::read_to_string(run.join("logs/rank-0.log")).unwrap();
    let headers: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" === session: kiln "))
        .collect();
    assert_eq!(headers.len(), 2, "{log}");
    assert!(headers[0].contains("from step 0 ===") && headers[0].contains(", pid "));
    assert!(
        headers[1].contains(&format!("from step {step} ===")),
        "{log}"
    );
    assert!(log.contains(&format!("resumed at step {step}")), "{log}");
    assert!(
        log.contains(&format!("eval at step {end} on 32 samples: loss ")),
        "{log}"
    );
    let stamped = |l: &str| {
        let b = l.as_bytes();
        b.len() > 24 && b[4] == b'-' && b[10] == b'T' && &l[23..25] == "Z "
    };
    assert!(
        log.lines().filter(|l| !l.starts_with("  ")).all(stamped),
        "{log}"
    );
}

/// SIGTERM to a run of `sets`, then `kiln resume`: the losses and final parameters equal an
/// uninterrupted run's bit for bit.
pub(crate) fn preempt_and_resume(sets: &[&str]) {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let steps = format!("train.max_steps={STEPS}");
    let mut args = vec!["run", "t.toml", "--quiet", "--set", &steps];
    for s in sets {
        args.extend(["--set", s]);
    }
    let reference = d.path().join("ref");
    let mut a = args.clone();
    a.extend(["--run-dir", "ref"]);
    let o = kiln(d.path(), &a);
    assert!(o.status.success(), "{}", stderr(&o));

    let run = d.path().join("p");
    let mut a = args.clone();
    a.extend(["--run-dir", "p"]);
    let mut child = spawn(d.path(), &a);
    let pid = child.id();
    let out = signal_at_start(&mut child, pid, &[libc::SIGTERM]);
    let o = finish(child, out);
    let step = check_preempted(&o, &run, "SIGTERM");
    // `kiln status` of a run that is not a Slurm job: the run's own state
    let st = kiln(d.path(), &["status", "p"]);
    assert!(
        crate::common::stdout(&st).contains(&format!("run: preempted at step {step}, loss"))
            && crate::common::stdout(&st).contains(&format!(
                "(stopped by SIGTERM); newest checkpoint step-{step:08}"
            )),
        "{}",
        crate::common::stdout(&st)
    );

    let r = kiln(d.path(), &["resume", "p", "--quiet"]);
    assert!(r.status.success(), "{}", stderr(&r));
    let s = summary(&run);
    assert_eq!(s["status"], "finished");
    assert_eq!(s["resumed_from_step"], step as u64);
    assert_eq!(losses(&run), losses(&reference));
    assert_eq!(s["params_sha256"], summary(&reference)["params_sha256"]);
    both_sessions_logged(&run, step, STEPS);
}

#[test]
fn sigterm_stops_a_ddp_run_at_a_step_with_a_checkpoint_and_resume_is_bit_exact() {
    preempt_and_resume(&[
        "strategy.kind=ddp",
        "strategy.devices=2",
        "train.batch_size=4",
    ]);
}

#[test]
fn sigterm_stops_an_fsdp_run_that_checkpoints_every_step_and_resume_is_bit_exact() {
    // a checkpoint every step: the signal most likely lands in a write, which finishes; the stop
    // step already has its checkpoint (writing it again would fail: the step exists)
    preempt_and_resume(&[
        "strategy.kind=fsdp",
        "strategy.devices=2",
        "train.batch_size=4",
        "checkpoint.every_steps=1",
        "checkpoint.keep_last=2",
    ]);
}

#[test]
fn a_second_sigint_stops_at_once() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    // slow steps (~0.3 s), so that the second Ctrl-C comes while the first is still pending
    let mut child = spawn(
        d.path(),
        &[
            "run",
            "t.toml",
            "--set",
            "train.max_steps=1000",
            "--set",
            "model.hidden_sizes=[2048, 2048]",
            "--set",
            "train.batch_size=1024",
            "--set",
            "data.samples=4096",
        ],
    );
    let pid = child.id();
    let out = signal_at_start(&mut child, pid, &[libc::SIGINT]);
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for l in err.by_ref() {
        let l = l.unwrap();
        let first = l.contains("kiln: interrupted: stopping at the next step boundary");
        seen.push(l);
        if first {
            // SAFETY: signalling a child process of this test.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
            break;
        }
    }
    seen.extend(err.map_while(|l| l.ok()));
    let o = finish(child, out);
    let e = seen.join("\n");
    assert_eq!(o.status.code(), Some(130), "{e}");
    assert!(e.contains("interrupted again: stopping now"), "{e}");
    // nothing claims the run finished; `kiln run --resume` finds it
    assert!(!d.path().join("runs/tiny/summary.json").exists());
}

#[test]
fn sigusr1_to_one_node_stops_both_nodes_at_one_step_and_the_job_resumes_bit_exactly() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let steps = format!("train.max_steps={}", STEPS / 2);
    let node = |rank: usize, port: u16, cmd: &[&str], extra: &[&str]| {
        let mut a = cmd.to_vec();
        for s in extra {
            a.extend(["--set", s]);
        }
        crate::common::node_cmd(d.path(), &a, rank, 2, port, "tok")
            .spawn()
            .unwrap()
    };
    let sets = [steps.as_str(), "strategy.kind=ddp", "train.batch_size=4"];
    // the uninterrupted two-node job
    let port = crate::common::store_port();
    let r0 = node(0, port, &["run", "t.toml", "--run-dir", "ref"], &sets);
    let r1 = node(1, port, &["run", "t.toml"], &sets);
    for o in [
        r0.wait_with_output().unwrap(),
        r1.wait_with_output().unwrap(),
    ] {
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // the same job with restart agents; SIGUSR1 to node 1's agent only
    let port = crate::common::store_port();
    let mut with_agents = sets.to_vec();
    with_agents.push("launch.max_restarts=1");
    let p0 = node(0, port, &["run", "t.toml", "--run-dir", "p"], &with_agents);
    let mut p1 = node(1, port, &["run", "t.toml"], &with_agents);
    let pid = p1.id();
    let out1 = signal_at_start(&mut p1, pid, &[libc::SIGUSR1]);
    let o1 = finish(p1, out1);
    let o0 = p0.wait_with_output().unwrap();
    assert_eq!(o1.status.code(), Some(75), "{}", stderr(&o1));
    assert!(
        stderr(&o1)
            .contains("node 1: the worker stopped with a checkpoint (preempted); not restarting"),
        "{}",
        stderr(&o1)
    );
    let run = d.path().join("p");
    // node 0 was not signalled: it stopped at the same step through the all-reduce
    let s = summary(&run);
    assert_eq!(s["stopped_by"], "a stop request on another rank", "{s}");
    assert_eq!(o0.status.code(), Some(75), "{}", stderr(&o0));
    let step = s["steps"].as_u64().unwrap() as usize;
    assert!(step > 0 && step < STEPS / 2, "{s}");
    assert!(run.join(format!("checkpoints/step-{step:08}")).is_dir());

    // every node resumes the run directory
    let port = crate::common::store_port();
    let q0 = node(0, port, &["resume", "p"], &[]);
    let q1 = node(1, port, &["resume", "p"], &[]);
    for o in [
        q0.wait_with_output().unwrap(),
        q1.wait_with_output().unwrap(),
    ] {
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let s = summary(&run);
    assert_eq!(s["status"], "finished", "{s}");
    assert_eq!(s["resumed_from_step"], step as u64);
    let reference = d.path().join("ref");
    assert_eq!(losses(&run), losses(&reference));
    assert_eq!(s["params_sha256"], summary(&reference)["params_sha256"]);
    both_sessions_logged(&run, step, STEPS / 2);
}
