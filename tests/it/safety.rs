//! Nothing lost, nothing escapes: run directory locks, paths that stay inside their parents,
//! resume from an older checkpoint as a branch, resume of a finished run, bad numbers in data,
//! and the smaller input errors.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{kiln, kiln_env, metric_lines, stderr, stdout, summary, write, KILN, TINY};

fn code(o: &std::process::Output) -> Option<i32> {
    o.status.code()
}

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

/// Step-by-step checkpoints of a 30-step run in `dir/r`.
fn run_30(dir: &Path) {
    write(dir, "t.toml", TINY);
    let o = kiln(
        dir,
        &[
            "run",
            "t.toml",
            "--run-dir",
            "r",
            "--set",
            "train.max_steps=30",
            "--set",
            "checkpoint.every_steps=10",
        ],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

#[test]
fn resuming_from_an_older_checkpoint_sets_the_newer_ones_aside() {
    let d = kiln::testdir::tempdir().unwrap();
    run_30(d.path());
    let run = d.path().join("r");
    let before = metric_lines(&run);
    // refused for a config mismatch: every file as it was
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let o = kiln(
        d.path(),
        &[
            "resume",
            "r",
            "--from",
            "step-00000010",
            "--set",
            "model.hidden_sizes=[4]",
        ],
    );
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics);
    assert!(run.join("checkpoints/step-00000030").is_dir());

    // a resume from the newest, with a crash's `.tmp` beside it, is no branch
    std::fs::create_dir(run.join("checkpoints/step-00000040.tmp")).unwrap();
    let o = kiln(d.path(), &["resume", "r", "--set", "train.max_steps=30"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("moved to"), "{}", stderr(&o));
    std::fs::create_dir_all(run.join("checkpoints/step-00000040.tmp")).unwrap();
    let o = kiln(d.path(), &["resume", "r", "--from", "step-00000010"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the newer step-00000030, step-00000020 moved to")
            || stderr(&o).contains("the newer step-00000020, step-00000030 moved to"),
        "{}",
        stderr(&o)
    );
    // the branch wrote its own step 20 and 30; the old ones are listed as abandoned
    let list = stdout(&kiln(d.path(), &["ckpt", "list", "r"]));
    assert!(list.contains("abandoned (abandoned-"), "{list}");
    assert_eq!(list.matches("step-00000030").count(), 2, "{list}");
    assert!(!list.contains(".tmp"), "{list}");
    // a second branch in the same second gets a directory of its own
    let o = kiln(d.path(), &["resume", "r", "--from", "step-00000010"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = kiln(d.path(), &["resume", "r", "--from", "step-00000010"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(metric_lines(&run), {
        // same seed and data: the branch retrains the same steps
        let mut b = before.clone();
        for (x, y) in b.iter_mut().zip(metric_lines(&run)) {
            x["ts"] = y["ts"].clone();
            x["samples_per_sec"] = y["samples_per_sec"].clone();
            x["time"] = y["time"].clone();
        }
        b
    });
}

#[test]
fn resuming_a_finished_run_says_so_and_touches_nothing_unless_the_limit_rises() {
    let d = kiln::testdir::tempdir().unwrap();
    run_30(d.path());
    let run = d.path().join("r");
    let summary_before = std::fs::read(run.join("summary.json")).unwrap();
    let metrics_before = std::fs::read(run.join("metrics.jsonl")).unwrap();
    for extra in [&[][..], &["--set", "train.max_steps=20"][..]] {
        let mut a = vec!["resume", "r"];
        a.extend(extra);
        let o = kiln(d.path(), &a);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        assert!(
            stdout(&o).contains("is already complete at step 30"),
            "{}",
            stdout(&o)
        );
        assert!(!stdout(&o).contains("NaN"), "{}", stdout(&o));
        assert_eq!(
            std::fs::read(run.join("summary.json")).unwrap(),
            summary_before
        );
        assert_eq!(
            std::fs::read(run.join("metrics.jsonl")).unwrap(),
            metrics_before
        );
    }
    // a complete checkpoint whose summary is not "finished" (cut short after the checkpoint):
    // the resume finishes it, with the loss it reached
    let s = std::fs::read_to_string(run.join("summary.json")).unwrap();
    std::fs::write(
        run.join("summary.json"),
        s.replace("\"finished\"", "\"failed\""),
    )
    .unwrap();
    let o = kiln(d.path(), &["resume", "r"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let s = summary(&run);
    assert_eq!(s["status"], "finished", "{s}");
    assert!(s["final_loss"].as_f64().is_some_and(f64::is_finite), "{s}");
    let o = kiln(d.path(), &["resume", "r", "--set", "train.max_steps=35"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let s = summary(&run);
    assert_eq!(
        (s["steps"].as_u64(), s["status"].as_str()),
        (Some(35), Some("finished"))
    );
    assert!(s["final_loss"].as_f64().is_some_and(f64::is_finite), "{s}");
}

#[test]
fn non_finite_csv_values_are_bad_input_at_file_line_column() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "d.csv", "a,b,label\n1.0,2.0,0\n3.0, NaN,1\n");
    write(
        d.path(),
        "e.toml",
        "[model]\ninput_size = 2\nclasses = 2\n[data]\nkind = \"csv\"\npath = \"d.csv\"\nclasses = 2\n",
    );
    let o = kiln(d.path(), &["run", "e.toml"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("d.csv:3:6: value `NaN` (field 2) is not finite"),
        "{e}"
    );
    std::fs::write(d.path().join("d.csv"), "a,b,label\n1.0,inf,0\n").unwrap();
    let o = kiln(d.path(), &["run", "e.toml"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("d.csv:2:5: value `inf`"),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("runs").exists());
}

#[test]
fn small_input_errors_name_the_right_key_and_the_integer_label_column_works() {
    let d = kiln::testdir::tempdir().unwrap();
    write(
        d.path(),
        "d.csv",
        "0,1.0,2.0\n1,3.0,4.0\n0,1.5,2.5\n1,3.5,4.5\n",
    );
    write(
        d.path(),
        "e.toml",
        "[model]\ninput_size = 2\nclasses = 2\n[data]\nkind = \"csv\"\npath = \"d.csv\"\nheader = false\nlabel_column = 0\nclasses = 2\n[train]\nbatch_size = 2\nmax_steps = 2\n",
    );
    let o = kiln(d.path(), &["run", "e.toml", "--quiet"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    // an eval file that cannot be read is reported as data.eval_path
    std::fs::write(d.path().join("bad.csv"), [0xffu8, 0xfe, b'\n']).unwrap();
    let o = kiln(
        d.path(),
        &["run", "e.toml", "--set", "data.eval_path=\"bad.csv\""],
    );
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("(data.eval_path)"), "{}", stderr(&o));
    // the value that was set is blamed, not the default beside it
    write(d.path(), "t.toml", TINY);
    let o = kiln(d.path(), &["check", "t.toml", "--set", "launch.nnodes=2"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--> --set launch.nnodes=2"),
        "{}",
        stderr(&o)
    );
    // sizes that would overflow or exhaust memory, before anything is allocated
    std::fs::remove_dir_all(d.path().join("runs")).unwrap();
    for (set, want) in [
        ("train.grad_accum_steps=1073741824", "the global batch"),
        (
            "model.hidden_sizes=[16000000, 16000000]",
            "the model does not fit",
        ),
        ("strategy.timeout_secs=99999999999", "at most 604800"),
    ] {
        let o = kiln(
            d.path(),
            &[
                "run",
                "t.toml",
                "--set",
                set,
                "--set",
                "train.batch_size=64",
            ],
        );
        assert_eq!(code(&o), Some(2), "{set}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{set}: {}", stderr(&o));
    }
    let o = kiln(d.path(), &["check", "/dev/zero"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    assert!(!d.path().join("runs").exists());
}

/// Threads of this process serving store connections (named `kiln-store-conn`).
fn store_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim() == "kiln-store-conn")
        })
        .count()
}

/// Node 0's store under hostile peers on 127.0.0.1: a flood of connections announcing large
/// frames costs at most a few threads and no large buffers, a trickling peer is dropped at
/// the hello deadline, and the job's own client is served throughout.
#[test]
fn the_rendezvous_store_survives_floods_and_trickling_peers() {
    use kiln::launch::store::{StoreClient, StoreServer, HELLO_SECS, MAX_PENDING};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let server = StoreServer::start("127.0.0.1:0", "tok".into(), 0, Duration::ZERO).unwrap();
    let addr = server.addr.to_string();
    // 200 strangers, each announcing a 1 MiB hello and sending nothing more
    let flood: Vec<TcpStream> = (0..200)
        .filter_map(|_| {
            let mut s = TcpStream::connect(&addr).ok()?;
            let _ = s.write_all(&(1u32 << 20).to_be_bytes());
            Some(s)
        })
        .collect();
    // during the flood: at most 2 x MAX_PENDING of the store's connection threads (the
    // newest MAX_PENDING in their hello, and closed ones ending)
    let mut peak = 0;
    for _ in 0..20 {
        peak = peak.max(store_threads());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        peak <= 2 * MAX_PENDING,
        "{peak} connection threads during the flood"
    );
    let start = Instant::now();
    // the job's own node still gets in (retrying while the flood holds the hello slots)
    let mut client = StoreClient::connect(&addr, "tok", 1, 0, Duration::from_secs(30)).unwrap();
    client.set("k", "v").unwrap();
    assert!(start.elapsed() < Duration::from_secs(HELLO_SECS * 3));
    drop(flood);
    // one byte every 300 ms (to a store of its own, whose log the flood did not fill): still
    // dropped when its whole hello is overdue
    let server = StoreServer::start("127.0.0.1:0", "tok".into(), 0, Duration::ZERO).unwrap();
    let addr = server.addr.to_string();
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let start = Instant::now();
    let hello = br#"{"hello":{"token":"tok","node":2}}"#;
    let mut frame = (hello.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(hello);
    let mut closed = false;
    for b in frame.iter().cycle().take(60) {
        if slow.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 64];
        match slow.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            _ => {}
        }
        if start.elapsed() > Duration::from_secs(HELLO_SECS + 4) {
            break;
        }
    }
    assert!(
        closed,
        "a trickling peer kept its connection for {:?}",
        start.elapsed()
    );
    assert!(start.elapsed() < Duration::from_secs(HELLO_SECS + 4));
    let local = slow.local_addr().unwrap().to_string();
    assert!(
        server
            .rejected()
            .iter()
            .any(|r| r.starts_with(&local) && r.contains("did not arrive in time")),
        "{:?}",
        server.rejected()
    );
}

#[test]
fn secrets_compare_equal_only_when_equal() {
    use kiln::launch::store::same_secret;
    assert!(same_secret("abc", "abc"));
    assert!(!same_secret("abc", "abd"));
    assert!(!same_secret("abc", "ab"));
    assert!(!same_secret("", "a"));
}

/// Unmounts a test's small file system when dropped.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
    }
}

/// A disk that fills up during a run: the error names the file whose write failed first (a
/// checkpoint file here), no `.tmp` is left behind, and what could not be written is said.
#[test]
fn a_full_disk_names_the_file_that_failed_and_leaves_no_tmp() {
    let d = kiln::testdir::tempdir().unwrap();
    let m = d.path().join("small");
    std::fs::create_dir(&m).unwrap();
    let o = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=300k", "tmpfs"])
        .arg(&m)
        .output()
        .expect("run mount");
    assert!(
        o.status.success(),
        "this test mounts a 300 KiB tmpfs and needs root for it: {}",
        stderr(&o)
    );
    let _mount = Mount(m.clone());
    write(&m, "t.toml", TINY);
    let o = kiln(
        &m,
        &[
            "run",
            "t.toml",
            "--quiet",
            "--set",
            "train.max_steps=100000",
            "--set",
            "train.log_every=1",
            "--set",
            "checkpoint.every_steps=50",
            "--set",
            "model.hidden_sizes=[64]",
        ],
    );
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("No space left on device")
            && (e.contains("checkpoints/step-") || e.contains("metrics.jsonl")),
        "{e}"
    );
    assert!(!e.contains(".json.tmp"), "{e}");
    let run = m.join("runs/tiny");
    let tmp: Vec<String> = walk(&run)
        .into_iter()
        .filter(|p| p.ends_with(".tmp"))
        .collect();
    assert!(tmp.is_empty(), "{tmp:?}");
    // either the failed summary or a word on why it could not be written
    assert!(
        run.join("summary.json").is_file() || e.contains("summary.json"),
        "{e}"
    );
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if p.is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

/// A model family for the divergence checks: logits `head(x) + gate_fn(gate)`, where `gate`
/// (one value per class) starts at 0. With `gate = "sqrt"` the loss is finite but d/d(gate) of
/// sqrt at 0 is infinite; with `gate = "scaled"` (`scale * gate`) the gradient is finite but
/// large enough that an SGD step with a large `optim.lr` overflows the parameters.
mod probe {
    use std::sync::Arc;

    use burn::module::{Module, Param};
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};
    use kiln::model::{init, Family, FamilyModel, Forward, Registry, Task};
    use kiln::params::ParamLayout;

    #[derive(Module, Debug)]
    pub struct ProbeModule<B: Backend> {
        head: Linear<B>,
        gate: Param<Tensor<B, 1>>,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Keys {
        gate: String,
        #[serde(default)]
        scale: f64,
    }

    struct Probe {
        features: usize,
        classes: usize,
        sqrt: bool,
        scale: f64,
    }

    impl Family for Probe {
        type Module<B: Backend> = ProbeModule<B>;
        fn kind(&self) -> &str {
            "probe"
        }
        fn task(&self) -> Task {
            Task::Classification {
                classes: self.classes,
            }
        }
        fn build<B: Backend>(&self, device: &B::Device) -> ProbeModule<B> {
            ProbeModule {
                head: LinearConfig::new(self.features, self.classes).init(device),
                gate: Param::from_tensor(Tensor::zeros([self.classes], device)),
            }
        }
        fn init(&self, layout: &ParamLayout, seed: u64) -> Vec<f32> {
            let mut flat = init::pytorch_default(layout, seed);
            for p in layout.params.iter().filter(|p| p.name == "gate") {
                flat[p.range()].fill(0.0);
            }
            flat
        }
        fn forward<B: Backend>(
            &self,
            m: &ProbeModule<B>,
            x: TensorData,
            device: &B::Device,
            _ctx: &mut Forward,
        ) -> Tensor<B, 2> {
            let rows = x.shape[0];
            let x = TensorData {
                shape: vec![rows, self.features].into(),
                ..x
            };
            let gate = m.gate.val();
            let gate = if self.sqrt {
                gate.sqrt()
            } else {
                gate * self.scale
            };
            m.head.forward(Tensor::<B, 2>::from_data(x, device)) + gate.unsqueeze::<2>()
        }
    }

    pub fn registry() -> Registry {
        let mut registry = Registry::builtin();
        registry.register("probe", |r, input| {
            let keys: Keys = r.model_keys()?;
            Ok(Arc::new(FamilyModel::new(Probe {
                features: input.iter().product(),
                classes: r.config.model.classes,
                sqrt: keys.gate == "sqrt",
                scale: keys.scale,
            })))
        });
        registry
    }
}

/// The arguments of a `kiln` run with the probe family, for the child process below.
const PROBE_ARGS: &str = "IT_KILN_PROBE_ARGS";

/// Not a test by itself: the child process of `probe_kiln`, running kiln's command line with
/// the probe family registered (a fresh process, so the registry is its own).
#[test]
#[ignore = "run by probe_kiln in a child process"]
fn probe_child() {
    let Ok(args) = std::env::var(PROBE_ARGS) else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args).unwrap();
    let argv = std::iter::once("kiln".to_string()).chain(args);
    std::process::exit(kiln::cli::main_with_args(probe::registry(), argv));
}

/// Runs kiln with the probe family in `dir`.
fn probe_kiln(dir: &Path, args: &[&str]) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    crate::common::clean_cmd(
        &exe,
        dir,
        &["--exact", "safety::probe_child", "--ignored", "--nocapture"],
    )
    .env(PROBE_ARGS, serde_json::to_string(args).unwrap())
    .output()
    .unwrap()
}

const PROBE: &str = r#"
[experiment]
name = "probe"
seed = 1

[model]
kind = "probe"
gate = "sqrt"
classes = 3

[data]
samples = 64
features = 8
classes = 3

[train]
max_steps = 4
batch_size = 8
log_every = 1

[strategy]
kind = "ddp"
devices = 2

[optim]
kind = "sgd"
lr = 0.1

[checkpoint]
every_steps = 1

[backend]
threads = 1
"#;

/// Runs the probe in `dir/run` with `sets`: it fails at step 1 saying `says`, its summary
/// says so, and no checkpoint was written.
fn diverges_at_step_1(d: &Path, run: &str, sets: &[&str], says: &str) {
    let mut args = vec!["run", "t.toml", "--quiet", "--run-dir", run];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = probe_kiln(d, &args);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("training diverged at step 1: {says}")),
        "{}",
        stderr(&o)
    );
    let s = summary(&d.join(run));
    assert_eq!(s["status"], "failed");
    assert_eq!(s["steps"], 1);
    let ckpts: Vec<_> = std::fs::read_dir(d.join(run).join("checkpoints"))
        .map(|r| r.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(ckpts.is_empty(), "{ckpts:?}");
}

/// Item 5: a gradient (or parameters) with NaN or inf stops the run as diverged at that step,
/// although the loss is finite, and no checkpoint of broken parameters is written.
#[test]
fn a_non_finite_gradient_or_parameter_with_a_finite_loss_stops_the_run_as_diverged() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", PROBE);
    diverges_at_step_1(
        d.path(),
        "g",
        &[],
        "the gradient has NaN or infinite values on 2 ranks, while the loss is ",
    );
    // finite gradients, but the SGD step overflows: the step-1 checkpoint is refused
    diverges_at_step_1(
        d.path(),
        "p",
        &["model.gate=\"scaled\"", "model.scale=1e30", "optim.lr=1e10"],
        "the parameters have NaN or infinite values",
    );
    // the same model with a sane gate trains and checkpoints as usual
    let o = probe_kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "ok",
            "--set",
            "model.gate=\"scaled\"",
            "--set",
            "model.scale=1.0",
        ],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(d.path().join("ok/checkpoints/step-00000004").is_dir());
}

/// Item 3, across nodes: node 0 sets newer checkpoints aside and trims the metrics of a resume
/// from an older step only after every node has passed its checks. Here node 1's model does not
/// match the checkpoint: both nodes fail, and every file of the run is as it was.
#[test]
fn a_multi_node_resume_that_one_node_refuses_changes_no_file() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let node = |rank: &str, port: &str, args: &[&str]| {
        crate::common::clean_cmd(Path::new(KILN), d.path(), args)
            .args(["--quiet", "--nnodes", "2", "--node-rank", rank])
            .args(["--master-addr", "127.0.0.1", "--master-port", port])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("KILN_JOB_TOKEN", "tok")
            .spawn()
            .unwrap()
    };
    let sets = [
        "--set",
        "train.max_steps=6",
        "--set",
        "checkpoint.every_steps=2",
        "--set",
        "train.batch_size=4",
        "--set",
        "strategy.kind=ddp",
    ];
    let port = crate::nodes::free_port().to_string();
    let a0 = [&["run", "t.toml", "--run-dir", "r"][..], &sets].concat();
    let a1 = [&["run", "t.toml"][..], &sets].concat();
    let (n0, n1) = (node("0", &port, &a0), node("1", &port, &a1));
    for o in [
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
    ] {
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let run = d.path().join("r");
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let listing = || {
        let mut v: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = listing();
    assert!(before.contains(&"step-00000006".to_string()), "{before:?}");

    let port = crate::nodes::free_port().to_string();
    let from = ["resume", "r", "--from", "step-00000002"];
    let n0 = node("0", &port, &from);
    let n1 = node(
        "1",
        &port,
        &[&from[..], &["--set", "model.hidden_sizes=[4]"]].concat(),
    );
    let (o0, o1) = (
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
    );
    assert_ne!(o1.status.code(), Some(0), "{}", stderr(&o1));
    assert!(
        stderr(&o1).contains("parameters but the model has"),
        "{}",
        stderr(&o1)
    );
    assert_ne!(o0.status.code(), Some(0), "{}", stderr(&o0));
    assert!(
        stderr(&o0).contains("node 1 refused the run")
            && stderr(&o0).contains("no file of the run was changed"),
        "{}",
        stderr(&o0)
    );
    assert_eq!(listing(), before);
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics);
}

/// Item 8: a job token that could not fit in a hello (or is not plain text) is exit 2 before
/// anything connects, naming where it came from.
#[test]
fn a_job_token_too_long_or_not_plain_text_is_refused_up_front() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let long = "a".repeat(5000);
    let from_file = "launch.token_file=\"/dev/zero\"";
    // (token in KILN_JOB_TOKEN, or a --set, and what the error says)
    for (token, set, says) in [
        (
            Some(long.as_str()),
            None,
            "the job token from KILN_JOB_TOKEN is longer than 1024 bytes",
        ),
        (
            Some("to ken"),
            None,
            "the job token from KILN_JOB_TOKEN contains ' '",
        ),
        // a token file is read only as far as a token may go
        (
            None,
            Some(from_file),
            "the job token from `/dev/zero` (launch.token_file) is longer",
        ),
    ] {
        let mut args = vec!["run", "t.toml", "--quiet", "--set", "strategy.kind=ddp"];
        args.extend(["--nnodes", "2", "--node-rank", "1"]);
        if let Some(set) = set {
            args.extend(["--set", set]);
        }
        let env: Vec<(&str, &str)> = token.map(|t| ("KILN_JOB_TOKEN", t)).into_iter().collect();
        let o = kiln_env(d.path(), &args, &env);
        assert_eq!(code(&o), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("openssl rand -hex 16"),
            "{}",
            stderr(&o)
        );
    }
}
