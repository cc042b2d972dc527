//! Issue 30, a careless or hostile user's inputs, part two: symbolic links in a run directory,
//! resumes that fail before they change anything, bounded sweeps, archives and reads, stdout
//! that fails, `state.json` fields checked, live runs read consistently, outputs kept out of
//! run directories, and stray names in `checkpoints/`. Memory bounds run in a child under an
//! address-space limit, so a regression fails instead of exhausting the machine.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::{clean_cmd, kiln, stderr, stdout, summary, write, KILN, TINY};

/// TINY with a checkpoint every 2 steps (8 steps an epoch).
fn tiny(dir: &Path) {
    write(
        dir,
        "t.toml",
        &format!("{TINY}\n[checkpoint]\nevery_steps = 2\n"),
    );
}

/// A finished run of `tiny` in `dir/run`.
fn finished(dir: &Path) -> PathBuf {
    tiny(dir);
    let o = kiln(dir, &["run", "t.toml", "--quiet", "--run-dir", "run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    dir.join("run")
}

/// kiln with `args`, under an address-space limit of `bytes` (set in the child before exec).
fn limited(dir: &Path, args: &[&str], bytes: u64) -> Output {
    let mut cmd = clean_cmd(Path::new(KILN), dir, args);
    // the address space a process reserves grows with the machine's cores (thread stacks,
    // glibc's arenas): bounded here, so that the limit means the same on any runner
    cmd.env("MALLOC_ARENA_MAX", "2")
        .env("RAYON_NUM_THREADS", "1");
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec
    unsafe {
        cmd.pre_exec(move || {
            let l = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

const GIB: u64 = 1 << 30;

/// `o` is bad input: exit 2, its error saying `says` (`what` names the case).
fn refused(o: &Output, says: &str, what: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{what}: {err}");
    assert!(err.contains(says), "{what}: {err}");
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Item 1: a lock file, rank log, config or metrics file replaced by a link to a file
/// elsewhere is refused with exit 2 naming it, and the file it points at is left as it was.
#[test]
fn symlinks_in_a_run_directory_are_refused_and_never_written_through() {
    let d = kiln::testdir::tempdir().unwrap();
    let run = finished(d.path());
    let victim = d.path().join("victim");
    for name in [
        ".kiln.lock",
        "logs/rank-0.log",
        "config.toml",
        "metrics.jsonl",
    ] {
        std::fs::write(&victim, "keep me\n").unwrap();
        let p = run.join(name);
        let saved = p.with_extension("saved");
        std::fs::rename(&p, &saved).unwrap();
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        let o = kiln(d.path(), &["resume", "run", "--set", "train.epochs=2"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(&format!("{name}` is a symbolic link")),
            "{name}: {err}"
        );
        assert_eq!(read(&victim), b"keep me\n", "{name}");
        std::fs::remove_file(&p).unwrap();
        std::fs::rename(&saved, &p).unwrap();
    }
    // a linked logs/ directory too
    let logs = run.join("logs");
    std::fs::rename(&logs, d.path().join("logs-elsewhere")).unwrap();
    std::os::unix::fs::symlink(d.path().join("logs-elsewhere"), &logs).unwrap();
    let o = kiln(d.path(), &["resume", "run", "--set", "train.epochs=2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("logs` is a symbolic link"),
        "{}",
        stderr(&o)
    );
}

/// Item 2: a resume whose checks fail changes no file of the finished run; an unfinished
/// `.tmp` left as a file (not a directory) is cleaned like any other, and the resume trains.
#[test]
fn a_resume_that_fails_its_checks_changes_no_file() {
    let d = kiln::testdir::tempdir().unwrap();
    let run = finished(d.path());
    let files = ["summary.json", "config.toml", "metrics.jsonl"];
    let before: Vec<Vec<u8>> = files.iter().map(|f| read(&run.join(f))).collect();
    // a file under the name step 10 would be saved to: the save would fail after training
    std::fs::write(run.join("checkpoints/step-00000010"), "not mine").unwrap();
    let o = kiln(d.path(), &["resume", "run", "--set", "train.epochs=2"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("step-00000010` has a checkpoint's name but is not a checkpoint directory"),
        "{err}"
    );
    let after: Vec<Vec<u8>> = files.iter().map(|f| read(&run.join(f))).collect();
    assert_eq!(before, after, "a refused resume changed the run's files");
    std::fs::remove_file(run.join("checkpoints/step-00000010")).unwrap();
    // a `.tmp` that is a file: removed as the remains of a save, and the resume goes on
    std::fs::write(run.join("checkpoints/step-00000009.tmp"), "x").unwrap();
    let o = kiln(
        d.path(),
        &["resume", "run", "--quiet", "--set", "train.epochs=2"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!run.join("checkpoints/step-00000009.tmp").exists());
    assert_eq!(summary(&run)["steps"], 16);
}

/// Item 3: a sweep of a trillion random samples, or a grid of 6 keys x 10 values, is refused
/// by `kiln check` and `kiln sweep` before anything is expanded, within 1 GiB of address space.
#[test]
fn sweeps_past_the_trial_cap_are_refused_before_they_expand() {
    let d = kiln::testdir::tempdir().unwrap();
    tiny(d.path());
    let o = limited(d.path(), &["check", "t.toml"], GIB);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let values: Vec<String> = (0..10).map(|i| format!("{}", i + 1)).collect();
    let grid: Vec<String> = [
        "train.batch_size",
        "train.log_every",
        "data.samples",
        "data.eval_samples",
        "train.grad_accum_steps",
        "experiment.seed",
    ]
    .iter()
    .map(|k| format!("\"{k}\" = [{}]", values.join(", ")))
    .collect();
    let random = "[sweep]\nrandom = { samples = 1000000000000, space = { \"optim.lr\" = { log_uniform = [1e-4, 1e-1] } } }\n";
    let gridded = format!("[sweep]\ngrid = {{ {} }}\n", grid.join(", "));
    for (name, sweep, says) in [
        (
            "random",
            random.to_string(),
            "the sweep has 1000000000000 trials",
        ),
        ("grid", gridded, "the sweep has 1000000 trials"),
    ] {
        write(
            d.path(),
            &format!("{name}.toml"),
            &format!("{TINY}\n{sweep}"),
        );
        for cmd in ["check", "sweep"] {
            let o = limited(d.path(), &[cmd, &format!("{name}.toml")], GIB);
            refused(&o, says, &format!("{cmd} {name}"));
        }
    }
}

/// Item 4: a small gzip file whose IDX header promises 16 images of 8x8 but that inflates to
/// 64 MiB is refused as too long after the header's bytes, under a 2 GiB limit.
#[test]
fn an_idx_gzip_is_inflated_no_further_than_its_header_says() {
    let d = kiln::testdir::tempdir().unwrap();
    let mut images = Vec::new();
    for v in [0x0803u32, 16, 8, 8] {
        images.extend(v.to_be_bytes());
    }
    images.extend(vec![0u8; 64 << 20]);
    let gz = |b: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, b).unwrap();
        e.finish().unwrap()
    };
    std::fs::write(d.path().join("images.gz"), gz(&images)).unwrap();
    let mut labels = Vec::new();
    for v in [0x0801u32, 16] {
        labels.extend(v.to_be_bytes());
    }
    labels.extend([0u8; 16]);
    // the labels gzipped twice over (two members, as `cat a.gz b.gz` makes), named .GZ
    let mut two = gz(&labels[..10]);
    two.extend(gz(&labels[10..]));
    std::fs::write(d.path().join("labels.GZ"), two).unwrap();
    write(
        d.path(),
        "t.toml",
        "[model]\nkind = \"mlp\"\ninput_size = 64\nhidden_sizes = [8]\nclasses = 3\n[data]\nkind = \"idx\"\npath = \"images.gz\"\nlabels_path = \"labels.GZ\"\nclasses = 3\n[train]\nmax_steps = 1\nbatch_size = 4\n[backend]\nthreads = 1\n",
    );
    let o = limited(d.path(), &["run", "t.toml", "--quiet"], 2 * GIB);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("images.gz: too long: the header says [16, 8, 8] (1024 bytes of data) but the file has more"),
        "{err}"
    );
    // the same images, the right length: the two-member labels read as one stream
    images.truncate(16 + 1024);
    std::fs::write(d.path().join("images.gz"), gz(&images)).unwrap();
    let o = limited(d.path(), &["run", "t.toml", "--quiet"], 2 * GIB);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// Item 5: stdout on a full device is exit 1 naming stdout, never a panic; `kiln run` still
/// finishes its run. With the pipe closed, a read-only command succeeds and `kiln run` fails
/// after training.
#[test]
fn stdout_failures_are_errors_and_never_panics() {
    let d = kiln::testdir::tempdir().unwrap();
    let run = finished(d.path());
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    for args in [
        &["ckpt", "list", "run"][..],
        &["ckpt", "verify", "run"][..],
        &["check", "t.toml"][..],
        &["env"][..],
        &["init", "--list"][..],
        &["run", "t.toml", "--run-dir", "full"][..],
    ] {
        let o = clean_cmd(Path::new(KILN), d.path(), args)
            .stdout(full())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("writing to stdout failed"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert_eq!(summary(&d.path().join("full"))["status"], "finished");
    for (args, want) in [
        (&["ckpt", "list", "run"][..], 0),
        (&["run", "t.toml", "--run-dir", "closed"][..], 1),
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = clean_cmd(Path::new(KILN), d.path(), args)
            .stdout(writer)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert_eq!(summary(&d.path().join("closed"))["status"], "finished");
    assert!(run.join("summary.json").is_file());
}

/// A copy of the finished run's newest checkpoint with `state.json`'s `field` set to `value`
/// (a dotted path), resealed; returns the run copy.
fn with_state(d: &Path, run: &Path, name: &str, field: &str, value: serde_json::Value) -> PathBuf {
    let to = d.join(name);
    let _ = std::fs::remove_dir_all(&to);
    crate::common::copy_dir(run, &to);
    let ck = to.join("checkpoints/step-00000008");
    let p = ck.join("state.json");
    let mut s: serde_json::Value = serde_json::from_slice(&read(&p)).unwrap();
    let mut at = &mut s;
    let parts: Vec<&str> = field.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        at = &mut at[*part];
    }
    at[parts[parts.len() - 1]] = value;
    std::fs::write(&p, serde_json::to_vec(&s).unwrap()).unwrap();
    crate::fuzz::reseal(&ck);
    to
}

/// kiln `args`, killed when it runs past `secs` (its output read as it comes, so that a
/// talkative child never blocks on a full pipe).
fn within(dir: &Path, args: &[&str], secs: u64) -> Output {
    use std::io::Read as _;
    let mut child = clean_cmd(Path::new(KILN), dir, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed().as_secs() >= secs {
            let _ = child.kill();
            let _ = child.wait();
            let e = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
            panic!("{args:?} ran past {secs} s: {e}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Item 6, a bounded fuzz: every numeric field of `state.json` set to 0, -1, 2^31, 2^63 and a
/// float, resealed, then resumed, evaluated and verified: never a panic, never past a few
/// seconds, and each either an invalid-checkpoint report (exit 2) or a resume that continues
/// from the directory's step.
#[test]
fn state_json_fields_are_checked_before_anything_acts_on_them() {
    let d = kiln::testdir::tempdir().unwrap();
    let run = finished(d.path());
    let state: serde_json::Value =
        serde_json::from_slice(&read(&run.join("checkpoints/step-00000008/state.json"))).unwrap();
    let mut fields = Vec::new();
    fn numeric(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Number(_) => out.push(at),
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    let key = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    numeric(x, key, out);
                }
            }
            _ => {}
        }
    }
    numeric(&state, String::new(), &mut fields);
    assert!(fields.len() >= 12, "{fields:?}");
    let values = [
        serde_json::json!(0),
        serde_json::json!(-1),
        serde_json::json!(1u64 << 31),
        serde_json::json!(1u64 << 63),
        serde_json::json!(1.5),
    ];
    let mut invalid = 0;
    for field in &fields {
        for v in &values {
            let copy = with_state(d.path(), &run, "fuzzed", field, v.clone());
            // from this checkpoint (without `--from`, a resume falls back to the newest one
            // that verifies, step 6, as it does for any damaged checkpoint)
            let o = within(
                d.path(),
                &[
                    "resume",
                    "fuzzed",
                    "--quiet",
                    "--from",
                    "step-00000008",
                    "--set",
                    "train.epochs=2",
                ],
                20,
            );
            let err = stderr(&o);
            assert!(!err.contains("panicked"), "{field} = {v}: {err}");
            match o.status.code() {
                Some(0) => {
                    // continued from step 8 (a position that the checks cannot tell from a real
                    // one, such as another epoch, trains a different number of steps): every
                    // step once, none lost or repeated
                    let steps: Vec<u64> = crate::common::metric_lines(&copy)
                        .iter()
                        .filter_map(|l| l["step"].as_u64())
                        .collect();
                    let want: Vec<u64> = (1..=steps.len() as u64).collect();
                    assert_eq!(steps, want, "{field} = {v}: {err}");
                    // an epoch past train.epochs (which no check can tell from one that many
                    // tiny micro-batches reached) is a complete run: nothing trains
                    let complete = crate::common::stdout(&o).contains("is already complete");
                    assert!(steps.len() > 8 || complete, "{field} = {v}: {err}");
                }
                Some(2) => {
                    assert!(
                        err.contains("is invalid")
                            || err.contains("cannot be resumed from: state.json")
                            || err.contains("the checkpoint has"),
                        "{field} = {v}: {err}"
                    );
                    invalid += 1;
                }
                other => panic!("{field} = {v}: exit {other:?}: {err}"),
            }
            let copy = with_state(d.path(), &run, "fuzzed", field, v.clone());
            for args in [&["eval", "fuzzed"][..], &["ckpt", "verify", "fuzzed"][..]] {
                let o = within(d.path(), args, 20);
                assert!(!stderr(&o).contains("panicked"), "{field} = {v}: {args:?}");
                assert!(o.status.code().is_some(), "{field} = {v}: {args:?}");
            }
            let _ = copy;
        }
    }
    assert!(invalid > fields.len(), "only {invalid} refusals");
    // the cases of the issue, named
    for (field, v, says) in [
        (
            "world_size",
            serde_json::json!(1_000_000_000u64),
            "`world_size` = 1000000000",
        ),
        (
            "step",
            serde_json::json!(6),
            "`step` = 6 but the directory is step-00000008",
        ),
        ("step", serde_json::json!(0), "`step` = 0"),
        (
            "strategy",
            serde_json::json!("bogus"),
            "`strategy` = \"bogus\"",
        ),
        (
            "position.epoch",
            serde_json::json!(1u64 << 62),
            "`position.epoch`",
        ),
        (
            "position.segment_micro",
            serde_json::json!(1_000_000_000u64),
            "segment_micro",
        ),
    ] {
        with_state(d.path(), &run, "named", field, v.clone());
        for args in [
            &[
                "resume",
                "named",
                "--from",
                "step-00000008",
                "--set",
                "train.epochs=2",
            ][..],
            &["eval", "named", "--from", "step-00000008"][..],
        ] {
            let o = within(d.path(), args, 20);
            if field == "position.segment_micro" && args[0] == "eval" {
                continue; // a data position is a resume's to check
            }
            refused(&o, says, &format!("{field} {args:?}"));
        }
        // the checkpoint resumed from is never set aside, and `ckpt verify` says it is invalid
        assert!(d.path().join("named/checkpoints/step-00000008").is_dir());
        if field != "position.segment_micro" {
            let o = within(d.path(), &["ckpt", "verify", "named"], 20);
            assert_eq!(o.status.code(), Some(1), "{field}: {}", stderr(&o));
            assert!(stderr(&o).contains(says), "{field}: {}", stderr(&o));
            // issue 45, defect 29: `ckpt list` runs verify's checks, state.json's included
            let o = within(d.path(), &["ckpt", "list", "named"], 20);
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            let line = out
                .lines()
                .find(|l| l.starts_with("step-00000008"))
                .unwrap_or_default();
            assert!(
                line.contains("invalid") && line.contains(says),
                "{field}: {out}"
            );
        }
    }
}

/// Item 7: CPU ranks and threads past their caps are refused by `kiln check` and `kiln run`
/// before any thread starts, within 1 GiB of address space.
#[test]
fn cpu_ranks_and_threads_are_bounded() {
    let d = kiln::testdir::tempdir().unwrap();
    tiny(d.path());
    for (set, says) in [
        (
            "strategy.devices=1000",
            "`strategy.devices` = 1000 is out of range",
        ),
        (
            "backend.threads=100000",
            "`backend.threads` = 100000 is out of range",
        ),
    ] {
        for cmd in ["check", "run"] {
            let o = limited(
                d.path(),
                &[
                    cmd,
                    "t.toml",
                    "--set",
                    "strategy.kind=\"ddp\"",
                    "--set",
                    set,
                ],
                GIB,
            );
            refused(&o, says, &format!("{cmd} {set}"));
        }
    }
}

/// Item 8: eval, export and ckpt verify of a run that saves (and deletes, `keep_last = 1`)
/// a checkpoint every step read a whole checkpoint every time, and never say to move
/// checkpoints away.
#[test]
fn a_live_run_is_read_consistently() {
    let d = kiln::testdir::tempdir().unwrap();
    write(
        d.path(),
        "t.toml",
        &format!("{TINY}\n[checkpoint]\nevery_steps = 1\nkeep_last = 1\n"),
    );
    let mut child = Command::new(KILN)
        .current_dir(d.path())
        .args(["run", "t.toml", "--quiet", "--run-dir", "live"])
        .args([
            "--set",
            "train.max_steps=100000000",
            "--set",
            "train.log_every=100000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut child);
    let ck = d.path().join("live/checkpoints");
    let start = std::time::Instant::now();
    while !std::fs::read_dir(&ck)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .any(|e| !e.file_name().to_string_lossy().ends_with(".tmp"))
        })
        .unwrap_or(false)
    {
        assert!(start.elapsed().as_secs() < 60, "the run never saved");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for i in 0..15 {
        let out = format!("w{i}.safetensors");
        for args in [
            &["eval", "live"][..],
            &["export", "live", "-o", &out][..],
            &["ckpt", "verify", "live"][..],
        ] {
            let o = kiln(d.path(), args);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(0), "{i} {args:?}: {err}");
            assert!(!err.contains("move them away"), "{i} {args:?}: {err}");
        }
    }
}

/// Item 9: a sweep named like a run directory, and `-o` paths inside a run directory, are
/// refused leaving the run's files as they were; a text run's evaluation takes no other
/// `data.eval_path`; a resume that fails reports where it got to.
#[test]
fn a_runs_files_are_never_written_over_and_a_failed_resume_says_where_it_stopped() {
    let d = kiln::testdir::tempdir().unwrap();
    let run = finished(d.path());
    let files = ["summary.json", "config.toml", "metrics.jsonl"];
    let before: Vec<Vec<u8>> = files.iter().map(|f| read(&run.join(f))).collect();
    write(
        d.path(),
        "s.toml",
        &format!("{TINY}\n[experiment]\nname = \"run\"\noutput_dir = \".\"\n[sweep]\ngrid = {{ \"optim.lr\" = [0.1, 0.2] }}\n")
            .replacen("[experiment]\nname = \"tiny\"\nseed = 1\n", "", 1),
    );
    let o = kiln(d.path(), &["sweep", "s.toml", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("holds a run, not a sweep"),
        "{}",
        stderr(&o)
    );
    for args in [
        &["report", "run", "-o", "run/metrics.jsonl"][..],
        &["export", "run", "-o", "run/config.toml"][..],
        &["export", "run", "-o", "run/logs/w.safetensors"][..],
    ] {
        let o = kiln(d.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("is inside the run directory"),
            "{}",
            stderr(&o)
        );
    }
    let after: Vec<Vec<u8>> = files.iter().map(|f| read(&run.join(f))).collect();
    assert_eq!(before, after);
    // the report's own file is its default, in the run
    let o = kiln(d.path(), &["report", "run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // a text run: --set data.eval_path of a file that is not there is refused, and nothing is
    // written to evals/; a text file that is there is evaluated (text takes `data.eval_path`)
    write(d.path(), "corpus.txt", &"hello world, ".repeat(200));
    write(
        d.path(),
        "text.toml",
        &crate::models::GPT.replace("max_steps = 3", "max_steps = 2"),
    );
    let o = kiln(
        d.path(),
        &["run", "text.toml", "--quiet", "--run-dir", "text"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = kiln(
        d.path(),
        &["eval", "text", "--set", "data.eval_path=\"missing.txt\""],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    assert!(!d.path().join("text/evals").exists());
    write(d.path(), "other.txt", &"world, hello. ".repeat(40));
    write(
        d.path(),
        "text2.toml",
        &crate::models::GPT.replace("eval_fraction = 0.2", "eval_path = \"other.txt\""),
    );
    let o = kiln(
        d.path(),
        &["data", "preview", "text2.toml", "--eval", "--rows", "1"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("world, hello."), "{}", stdout(&o));
    // a resume that diverges after training past its checkpoint (step 8) says where it got to
    let o = kiln(
        d.path(),
        &[
            "resume",
            "run",
            "--quiet",
            "--set",
            "train.epochs=3",
            "--set",
            "optim.lr=100.0",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let s = summary(&run);
    assert_eq!(s["status"], "failed");
    assert!(s["steps"].as_u64().unwrap() > 8, "{s}");
    assert!(s["epochs"].as_f64().unwrap() > 1.0, "{s}");
}

/// Item 10: what was accepted silently is refused naming what is wrong.
#[test]
fn bad_metrics_names_weights_and_headers_are_refused() {
    let d = kiln::testdir::tempdir().unwrap();
    let run = finished(d.path());
    let check = |sets: &[&str], says: &str| {
        let mut a = vec!["check", "t.toml"];
        for s in sets {
            a.extend(["--set", s]);
        }
        let o = kiln(d.path(), &a);
        refused(&o, says, &format!("{sets:?}"));
    };
    check(&["sweep.metric=\"eval_los\""], "did you mean `eval_loss`?");
    check(&["data.normalize=[nan, 1.0]"], "`data.normalize`");
    check(&["data.normalize=[0.5, inf]"], "`data.normalize`");
    // a checkpoint whose weights hold a NaN (resealed) is invalid for export and eval
    let copy = d.path().join("nan");
    crate::common::copy_dir(&run, &copy);
    let ck = copy.join("checkpoints/step-00000008");
    let file = ck.join("model.safetensors");
    let bytes = read(&file);
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut bytes = bytes;
    let at = 8 + n; // the first f32 of the data
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    crate::fuzz::reseal(&ck);
    for args in [
        &["export", "nan", "-o", "w.safetensors"][..],
        &["eval", "nan"][..],
    ] {
        let o = kiln(d.path(), args);
        refused(&o, "holds NaN", &format!("{args:?}"));
    }
    // a safetensors header naming one tensor twice, as model.init_from
    let header = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend(header.as_bytes());
    st.extend(1f32.to_le_bytes());
    std::fs::write(d.path().join("dup.safetensors"), st).unwrap();
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--set",
            "model.init_from=\"dup.safetensors\"",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("names tensor `w` twice"),
        "{}",
        stderr(&o)
    );
    // a CSV header naming a column twice; a label too large for any integer
    for (csv, says) in [
        (
            "a,b,a,label\n1,2,3,0\n",
            "column name `a` appears twice (columns 1 and 3)",
        ),
        ("a,b,label\n1,2,99999999999999999999\n", "is too large"),
    ] {
        write(d.path(), "d.csv", csv);
        let o = kiln(
            d.path(),
            &[
                "run",
                "t.toml",
                "--set",
                "data.kind=\"csv\"",
                "--set",
                "data.path=\"d.csv\"",
                "--set",
                "model.input_size=2",
            ],
        );
        refused(&o, says, "csv");
    }
}

/// Item 12: a directory, FIFO or device as a data file is "not a regular file"; text from a
/// file whose size the file system does not know is read no further than kiln's bound.
#[test]
fn data_paths_that_are_not_regular_files_are_named_so() {
    let d = kiln::testdir::tempdir().unwrap();
    tiny(d.path());
    std::fs::create_dir(d.path().join("dir.csv")).unwrap();
    let fifo = d.path().join("fifo.csv");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (path, what) in [
        ("dir.csv", "it is a directory"),
        ("fifo.csv", "FIFO"),
        ("/dev/zero", "device"),
    ] {
        let o = kiln(
            d.path(),
            &[
                "check",
                "t.toml",
                "--set",
                "data.kind=\"csv\"",
                "--set",
                &format!("data.path=\"{path}\""),
            ],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{path}: {err}");
        assert!(
            err.contains("is not a regular file") && err.contains(what),
            "{path}: {err}"
        );
    }
    write(d.path(), "g.toml", crate::models::GPT);
    let o = limited(
        d.path(),
        &[
            "run",
            "g.toml",
            "--quiet",
            "--set",
            "data.path=\"/proc/self/pagemap\"",
        ],
        2 * GIB,
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("holds more than 64 MiB"), "{err}");
}

/// Items 13 and 14: stray names in `checkpoints/` are skipped with a warning and never parsed
/// loosely; a `checkpoint.dir` edited to point outside the run is refused; `kiln init` on a
/// dangling link is bad input.
#[test]
fn stray_checkpoint_names_and_small_errors() {
    let d = kiln::testdir::tempdir().unwrap();
    let run = finished(d.path());
    std::fs::write(run.join("checkpoints/abandoned-123"), "x").unwrap();
    std::fs::create_dir(run.join("checkpoints/step-+3")).unwrap();
    std::fs::create_dir(run.join("checkpoints/step-1")).unwrap();
    let o = kiln(d.path(), &["ckpt", "list", "run"]);
    let (out, err) = (crate::common::stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("skipping `run/checkpoints/step-+3`"), "{err}");
    assert!(
        !out.contains("step-+3") && !out.contains("abandoned"),
        "{out}"
    );
    // retention (keep_last = 2) keeps to the checkpoints kiln wrote
    let o = kiln(
        d.path(),
        &[
            "resume",
            "run",
            "--quiet",
            "--set",
            "train.epochs=2",
            "--set",
            "checkpoint.keep_last=2",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut names: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "abandoned-123",
            "step-+3",
            "step-00000014",
            "step-00000016",
            "step-1"
        ]
    );
    // checkpoint.dir pointing outside the run, by hand
    let cfg = run.join("config.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let mut t: toml::Table = toml::from_str(&text).unwrap();
    t.entry("checkpoint")
        .or_insert_with(|| toml::Value::Table(Default::default()))
        .as_table_mut()
        .unwrap()
        .insert("dir".into(), toml::Value::String("../elsewhere".into()));
    std::fs::write(&cfg, toml::to_string(&t).unwrap()).unwrap();
    for args in [
        &["ckpt", "list", "run"][..],
        &["export", "run", "-o", "w.safetensors"][..],
    ] {
        let o = kiln(d.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("is not a directory inside the run directory"),
            "{}",
            stderr(&o)
        );
    }
    std::fs::write(&cfg, text).unwrap();
    // kiln init over a dangling link
    std::os::unix::fs::symlink(d.path().join("nowhere"), d.path().join("new.toml")).unwrap();
    let o = kiln(d.path(), &["init", "new.toml"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is a symbolic link to nothing"),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("nowhere").exists());
}
