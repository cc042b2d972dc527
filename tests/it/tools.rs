//! Issue 31, the tools users already run: the environment on record (`env.json`, `kiln env
//! --json`), and kiln launched the way torchrun and srun launch a program.

use crate::common::{kiln, stderr, stdout, write, TINY};

/// The fields every record has, by JSON pointer.
const FIELDS: &[&str] = &[
    "/time",
    "/kiln/version",
    "/kiln/git_commit",
    "/kiln/features",
    "/kiln/burn",
    "/kiln/rustc",
    "/machine/os/name",
    "/machine/os/kernel",
    "/machine/cpu/model",
    "/machine/cpu/cores",
    "/machine/memory_bytes",
    "/machine/host",
    "/accelerators",
    "/pid",
    "/command_line",
    "/variables",
];

fn record_has_every_field(v: &serde_json::Value, what: &str) {
    for f in FIELDS {
        let x = v
            .pointer(f)
            .unwrap_or_else(|| panic!("{what}: no {f} in {v}"));
        if *f != "/accelerators" {
            assert!(!x.is_null(), "{what}: {f} is null in {v}");
        }
    }
    assert_eq!(v["kiln"]["burn"], "0.21.0", "{what}");
    assert!(
        v["kiln"]["rustc"].as_str().unwrap().starts_with("rustc "),
        "{what}"
    );
}

#[test]
fn every_run_records_its_environment_and_a_resume_appends_a_session() {
    let d = kiln::testdir::tempdir().unwrap();
    write(
        d.path(),
        "t.toml",
        &format!("{TINY}\n[checkpoint]\nevery_steps = 4\n"),
    );
    let o = crate::common::kiln_env(
        d.path(),
        &["run", "t.toml", "--quiet", "--run-dir", "run"],
        &[("NCCL_DEBUG", "WARN"), ("KILN_JOB_TOKEN", "s3cret")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let read = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(d.path().join("run/env.json")).unwrap()).unwrap()
    };
    let v = read();
    let sessions = v["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1);
    let s = &sessions[0];
    record_has_every_field(s, "run");
    let sha = {
        use sha2::{Digest, Sha256};
        Sha256::digest(std::fs::read(d.path().join("t.toml")).unwrap())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert_eq!(s["experiment"]["sha256"], sha.as_str());
    assert_eq!(s["backend"]["device"], "cpu");
    assert_eq!(s["backend"]["strategy"], "single");
    assert!(s["backend"]["name"].as_str().is_some());
    assert_eq!(s["variables"]["NCCL_DEBUG"], "WARN");
    // a secret is recorded as set, never its value
    assert_eq!(s["variables"]["KILN_JOB_TOKEN"], "<set>");
    assert!(!std::fs::read_to_string(d.path().join("run/env.json"))
        .unwrap()
        .contains("s3cret"));
    let args: Vec<&str> = s["command_line"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert_eq!(&args[1..], ["run", "t.toml", "--quiet", "--run-dir", "run"]);
    // a resume appends its own session
    let o = kiln(
        d.path(),
        &["resume", "run", "--quiet", "--set", "train.epochs=2"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = read();
    assert_eq!(v["sessions"].as_array().unwrap().len(), 2);
    assert_eq!(v["sessions"][0], sessions[0]);
    assert_eq!(v["sessions"][1]["command_line"][1], "resume");
}

#[test]
fn kiln_env_json_prints_the_record_of_this_machine() {
    let d = kiln::testdir::tempdir().unwrap();
    let o = kiln(d.path(), &["env", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    record_has_every_field(&v, "env --json");
    assert!(v.get("experiment").is_none());
    write(d.path(), "t.toml", TINY);
    let o = kiln(d.path(), &["env", "t.toml", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["backend"]["device"], "cpu");
    assert!(v["experiment"]["sha256"]
        .as_str()
        .is_some_and(|s| s.len() == 64));
}

/// `t.toml` in `dir`: TINY as ddp for 6 steps; and its run on `devices` devices in one
/// process, `dir/ref`, the reference of a job of as many processes.
pub(crate) fn ddp_reference(dir: &std::path::Path, devices: usize) {
    write(
        dir,
        "t.toml",
        &format!("{TINY}\n[strategy]\nkind = \"ddp\"\n[launch]\nheartbeat_secs = 60\n")
            .replace("epochs = 1", "max_steps = 6"),
    );
    let devices = format!("strategy.devices={devices}");
    let o = kiln(
        dir,
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "ref",
            "--set",
            &devices,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// The environment torchrun gives the process of `rank` (of 2 hosts x 2 processes), with its
/// agent's store on `port`.
fn torchrun_env(cmd: &mut std::process::Command, rank: usize, port: u16, restart: usize) {
    let (group, local) = (rank / 2, rank % 2);
    for (k, v) in [
        ("WORLD_SIZE", "4".to_string()),
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", local.to_string()),
        ("LOCAL_WORLD_SIZE", "2".into()),
        ("GROUP_RANK", group.to_string()),
        ("GROUP_WORLD_SIZE", "2".into()),
        ("ROLE_RANK", rank.to_string()),
        ("ROLE_WORLD_SIZE", "4".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_RUN_ID", "kiln-test".into()),
        ("TORCHELASTIC_RESTART_COUNT", restart.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", "1".into()),
    ] {
        cmd.env(k, v);
    }
}

/// A torchrun group: 4 processes as torchrun starts them, `args` each.
fn torchrun_group(
    dir: &std::path::Path,
    args: &[&str],
    port: u16,
    restart: usize,
) -> Vec<std::process::Child> {
    (0..4)
        .map(|rank| {
            let mut c =
                crate::common::clean_cmd(std::path::Path::new(crate::common::KILN), dir, args);
            torchrun_env(&mut c, rank, port, restart);
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Issue 31: `torchrun --no-python --nnodes 2 --nproc-per-node 2 kiln run FILE`, reproduced on
/// this host: torchrun's agent holds MASTER_PORT, every process gets torchrun's variables and
/// nothing else, and the four processes are one kiln job of four ranks with the losses of a
/// four-device run; a restarted group (TORCHELASTIC_RESTART_COUNT = 1) continues the run in
/// its directory from its newest checkpoint.
#[test]
fn a_torchrun_group_is_one_job_and_a_restarted_group_resumes() {
    let d = kiln::testdir::tempdir().unwrap();
    ddp_reference(d.path(), 4);
    // torchrun's agent: its store listens on MASTER_PORT the whole time (`free_port` checked
    // the port after it, kiln's, free too)
    let port = crate::common::free_port();
    let agent = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let group = torchrun_group(d.path(), &["run", "t.toml", "--quiet"], port, 0);
    for (rank, c) in group.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "rank {rank}: {}", stderr(&o));
        // only the job's rank 0 prints the header and the closing line (issue 58, defect 22)
        let out = crate::common::stdout(&o);
        match rank {
            0 => assert!(
                out.contains("run dir:") && out.contains("finished "),
                "{out}"
            ),
            _ => assert!(out.is_empty(), "rank {rank} printed: {out}"),
        }
    }
    let run = d.path().join("runs/tiny");
    assert_eq!(
        crate::common::losses(&run),
        crate::common::losses(&d.path().join("ref"))
    );
    let s = crate::common::summary(&run);
    assert_eq!(s["world_size"], 4);
    // a longer run killed after its second checkpoint, then torchrun's restart of the group
    write(
        d.path(),
        "long.toml",
        &format!(
            "{TINY}\n[strategy]\nkind = \"ddp\"\n[checkpoint]\nevery_steps = 2\n[launch]\nheartbeat_secs = 60\n"
        )
        .replace("name = \"tiny\"", "name = \"long\"")
        .replace("epochs = 1", "max_steps = 400")
        .replace("log_every = 1", "log_every = 50"),
    );
    let group = torchrun_group(d.path(), &["run", "long.toml", "--quiet"], port, 0);
    let run = d.path().join("runs/long");
    let start = std::time::Instant::now();
    while !run.join("checkpoints/step-00000004").is_dir() {
        assert!(start.elapsed().as_secs() < 120, "no checkpoint at step 4");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for mut c in group {
        let _ = c.kill();
        let _ = c.wait();
    }
    // the same command line, as torchrun restarts it
    let group = torchrun_group(d.path(), &["run", "long.toml", "--quiet"], port, 1);
    for (rank, c) in group.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "rank {rank}: {err}");
    }
    let s = crate::common::summary(&run);
    assert_eq!(s["status"], "finished", "{s}");
    assert!(s["resumed_from_step"].as_u64().unwrap() >= 4, "{s}");
    assert_eq!(s["steps"], 400);
    assert!(
        !d.path().join("runs/long-2").exists(),
        "the restart started a new run"
    );
    drop(agent);
}

/// The python of scripts/tensorboard-up.sh (which installs TensorBoard when missing).
fn tensorboard_python() -> String {
    let o = std::process::Command::new("bash")
        .arg(crate::common::root().join("scripts/tensorboard-up.sh"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "scripts/tensorboard-up.sh could not make a Python with TensorBoard: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// TensorBoard's view of a run's event files: tag -> [(step, value)].
fn tensorboard_scalars(
    python: &str,
    run: &std::path::Path,
) -> std::collections::BTreeMap<String, Vec<(u64, f64)>> {
    let o = std::process::Command::new(python)
        .arg(crate::common::root().join("scripts/read-tensorboard.py"))
        .arg(run.join("tb"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Issue 31: `[log] tensorboard = true` event files, read by TensorBoard's own reader, hold
/// every number of `metrics.jsonl` at its step; a resume from an older checkpoint writes a new
/// file and TensorBoard shows each step once; a truncated event file (a killed run) stops
/// neither a resume nor `kiln report`.
#[test]
fn tensorboard_reads_every_metric_at_its_step() {
    let python = tensorboard_python();
    let d = kiln::testdir::tempdir().unwrap();
    write(
        d.path(),
        "t.toml",
        &format!("{TINY}\n[checkpoint]\nevery_steps = 4\n[log]\ntensorboard = true\n")
            .replace("log_every = 1", "log_every = 1\neval_every = 4"),
    );
    let o = kiln(d.path(), &["run", "t.toml", "--quiet", "--run-dir", "run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = d.path().join("run");
    // from step 4 again, for another epoch: steps 5.. are trained (and logged) twice
    let o = kiln(
        d.path(),
        &[
            "resume",
            "run",
            "--quiet",
            "--from",
            "step-00000004",
            "--set",
            "train.epochs=2",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let files: Vec<_> = std::fs::read_dir(run.join("tb")).unwrap().collect();
    assert_eq!(files.len(), 2, "one event file a session");
    let tb = tensorboard_scalars(&python, &run);
    let lines = crate::common::metric_lines(&run);
    assert_eq!(lines.len(), 16);
    let mut checked = 0;
    for line in &lines {
        let step = line["step"].as_u64().unwrap();
        let mut want = Vec::new();
        for (k, v) in line.as_object().unwrap() {
            match v {
                serde_json::Value::Number(n) if k != "step" && k != "ts" => {
                    want.push((k.clone(), n.as_f64().unwrap()))
                }
                serde_json::Value::Object(m) => {
                    for (p, x) in m {
                        want.push((format!("{k}/{p}"), x.as_f64().unwrap()));
                    }
                }
                _ => {}
            }
        }
        for (tag, value) in want {
            let points = tb
                .get(&tag)
                .unwrap_or_else(|| panic!("no tag {tag} in {tb:?}"));
            let at: Vec<f64> = points
                .iter()
                .filter(|(s, _)| *s == step)
                .map(|(_, v)| *v)
                .collect();
            assert_eq!(at.len(), 1, "{tag} at step {step}: {points:?}");
            let tol = 1e-6 * value.abs().max(1e-30);
            assert!(
                ((value as f32) as f64 - at[0]).abs() <= tol,
                "{tag} at {step}: {value} vs {}",
                at[0]
            );
            checked += 1;
        }
    }
    assert!(checked > 16 * 5, "{checked}");
    assert!(
        tb.contains_key("eval_loss") && tb.contains_key("lr"),
        "{tb:?}"
    );
    // a killed run's last record cut short: a resume and a report go on
    let newest = std::fs::read_dir(run.join("tb"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() - 7]).unwrap();
    let o = kiln(
        d.path(),
        &["resume", "run", "--quiet", "--set", "train.epochs=3"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = kiln(d.path(), &["report", "run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(run.join("tb")).unwrap().count(), 3);
    // and TensorBoard reads past the cut file: the third session's steps, each once
    let tb = tensorboard_scalars(&python, &run);
    let steps: Vec<u64> = tb["loss"].iter().map(|(s, _)| *s).collect();
    assert_eq!(steps.last(), Some(&24), "{steps:?}");
    let mut once = steps.clone();
    once.dedup();
    assert_eq!(once, steps, "a step twice");
}

/// Issue 58, defect 15: `kiln tokenize -o newdir/train.bin` makes `newdir` (it failed), and a
/// tokenize that fails leaves no directory it made.
#[test]
fn tokenize_makes_the_output_directory_and_takes_it_back_on_failure() {
    let d = kiln::testdir::tempdir().unwrap();
    std::fs::write(
        d.path().join("in.txt"),
        "some text to tokenize\n".repeat(20),
    )
    .unwrap();
    let o = crate::common::kiln(d.path(), &["tokenize", "in.txt", "-o", "new/sub/train.bin"]);
    assert_eq!(o.status.code(), Some(0), "{}", crate::common::stderr(&o));
    assert!(d.path().join("new/sub/train.bin").is_file());
    let o = crate::common::kiln(
        d.path(),
        &["tokenize", "missing.txt", "-o", "other/train.bin"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", crate::common::stderr(&o));
    assert!(!d.path().join("other").exists());
}

/// Issue 58, defect 18: a save torn by a kill (`step-N.tmp`, no process on the run) is named,
/// and `kiln ckpt verify` judges the newest finished checkpoint, which a resume takes (it
/// failed on the torn one, exit 1).
#[test]
fn ckpt_verify_names_a_torn_save_and_judges_the_newest_finished_one() {
    let d = kiln::testdir::tempdir().unwrap();
    crate::common::write(d.path(), "t.toml", crate::common::TINY);
    let o = crate::common::kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "run",
            "--set",
            "checkpoint.every_steps=4",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", crate::common::stderr(&o));
    let ckpts = d.path().join("run/checkpoints");
    std::fs::create_dir(ckpts.join("step-00000099.tmp")).unwrap();
    std::fs::write(ckpts.join("step-00000099.tmp/model.safetensors"), "torn").unwrap();
    let o = crate::common::kiln(d.path(), &["ckpt", "verify", "run"]);
    assert_eq!(o.status.code(), Some(0), "{}", crate::common::stderr(&o));
    assert!(
        crate::common::stdout(&o).contains(": valid"),
        "{}",
        crate::common::stdout(&o)
    );
    assert!(
        crate::common::stderr(&o).contains("step-00000099.tmp: an unfinished save"),
        "{}",
        crate::common::stderr(&o)
    );
}
