//! Shared helpers: run the `kiln` binary, write temporary experiment files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// The repository root (where `experiments/` lives).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs kiln in `cwd` with `args`, no inherited `KILN_` variables.
pub fn kiln(cwd: &Path, args: &[&str]) -> Output {
    kiln_env(cwd, args, &[])
}

/// `program args` in `cwd`, without this process's `KILN_` variables (config keys, tokens).
pub fn clean_cmd(program: &Path, cwd: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(cwd).args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("KILN_")) {
        cmd.env_remove(k);
    }
    cmd
}

pub fn kiln_env(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = clean_cmd(Path::new(KILN), cwd, args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run kiln")
}

/// Runs kiln in `cwd` with `args` (as `kiln`), `input` on its stdin.
pub fn kiln_stdin(cwd: &Path, args: &[&str], input: &[u8]) -> Output {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = clean_cmd(Path::new(KILN), cwd, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kiln");
    // (stdin is closed when this write's handle drops: kiln reads to its end)
    child
        .stdin
        .take()
        .expect("kiln's stdin")
        .write_all(input)
        .expect("write kiln's stdin");
    child.wait_with_output().expect("wait for kiln")
}

/// The exit code of a finished kiln (`None`: killed by a signal).
pub fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&p, text).unwrap();
    p
}

/// A tiny, fast experiment (8 -> 16 -> 3).
pub const TINY: &str = r#"
[experiment]
name = "tiny"
seed = 1

[model]
input_size = 8
hidden_sizes = [16]
classes = 3

[data]
samples = 64
eval_samples = 32
features = 8
classes = 3

[train]
epochs = 1
batch_size = 8
log_every = 1

[backend]
threads = 1
"#;

/// The losses of a `metrics.jsonl`.
pub fn losses(run_dir: &Path) -> Vec<f64> {
    metric_lines(run_dir)
        .iter()
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

pub fn metric_lines(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A run directory's `summary.json`.
pub fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

/// Copies a directory tree.
/// The python of scripts/torch-up.sh (which installs torch and transformers when missing).
pub fn torch_python() -> String {
    let o = Command::new("bash")
        .arg(root().join("scripts/torch-up.sh"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "scripts/torch-up.sh could not make a Python with torch and transformers: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// The safetensors file `from` written to `to` with each tensor renamed by `rename` (values,
/// shapes and metadata kept); the new names.
pub fn renamed_safetensors(from: &Path, to: &Path, rename: impl Fn(&str) -> String) -> Vec<String> {
    let f = kiln::checkpoint::tensors::decode(&std::fs::read(from).unwrap()).unwrap();
    let names: Vec<String> = f.tensors.iter().map(|t| rename(&t.name)).collect();
    let renamed: Vec<(&str, &[usize], &[f32])> = f
        .tensors
        .iter()
        .zip(&names)
        .map(|(t, n)| (n.as_str(), t.shape.as_slice(), t.data.as_slice()))
        .collect();
    let bytes = kiln::checkpoint::tensors::encode(&renamed, f.metadata.clone()).unwrap();
    std::fs::write(to, bytes).unwrap();
    names
}

/// Copies the run `full` into `dir`, resumes the copy from checkpoint `from` with `sets`
/// (asserting it succeeds), and returns the copy.
pub fn resume_copy(dir: &Path, full: &Path, from: &str, sets: &[&str]) -> PathBuf {
    let copy = dir.join(format!("resumed-{from}"));
    copy_dir(full, &copy);
    let mut args = vec!["resume", copy.to_str().unwrap(), "--quiet", "--from", from];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = kiln(dir, &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    copy
}

/// `(step, loss)` of every line of a run's `metrics.jsonl`.
pub fn loss_lines(run: &Path) -> Vec<(u64, f64)> {
    metric_lines(run)
        .iter()
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// The whole flat parameters of checkpoint `step_dir` of the run in `run_dir` (shards gathered).
pub fn checkpoint_params(run_dir: &Path, step_dir: &Path) -> Vec<f32> {
    let r = kiln::rundir::run_config(run_dir).unwrap();
    let state = kiln::checkpoint::read_state(step_dir).unwrap();
    let model = kiln::model::build(&r, &state.input_shape).unwrap();
    kiln::checkpoint::load(step_dir, &model.layout().specs())
        .unwrap()
        .params
}

/// A port the OS chose for node 0 of a test job (a bind to port 0), whose listener stays open
/// in this process until node 0 takes it over (`hand_store`, kiln's `KILN_STORE_FD`): no other
/// process, not even another test's outgoing connection, can take the port in between.
pub fn store_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    STORES.lock().unwrap().insert(port, l);
    port
}

/// The listeners `store_port` keeps, by port.
static STORES: std::sync::Mutex<std::collections::BTreeMap<u16, std::net::TcpListener>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// kiln `args` in `dir` as node `rank` of a job of `nnodes` nodes on 127.0.0.1:`port` with the
/// job token `token`, quiet, stdout and stderr piped, without this process's `KILN_` variables;
/// node 0 gets the listener `store_port` keeps for `port`.
pub fn node_cmd(
    dir: &Path,
    args: &[&str],
    rank: usize,
    nnodes: usize,
    port: u16,
    token: &str,
) -> Command {
    let mut cmd = clean_cmd(Path::new(KILN), dir, args);
    cmd.args(["--quiet", "--nnodes", &nnodes.to_string()])
        .args([
            "--node-rank",
            &rank.to_string(),
            "--master-addr",
            "127.0.0.1",
        ])
        .args(["--master-port", &port.to_string()])
        .env("KILN_JOB_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if rank == 0 {
        hand_store(&mut cmd, port);
    }
    cmd
}

/// Hands the listener `store_port` keeps for `port` to node 0's `cmd` as its descriptor 3
/// (`KILN_STORE_FD=3`); nothing for a port `store_port` did not give.
pub fn hand_store(cmd: &mut Command, port: u16) {
    use std::os::fd::AsRawFd;
    let Some(fd) = STORES.lock().unwrap().get(&port).map(|l| l.as_raw_fd()) else {
        return;
    };
    hand_fd(cmd, fd);
}

/// Hands this process's descriptor `fd` to `cmd` as its descriptor 3 (`KILN_STORE_FD=3`).
pub fn hand_fd(cmd: &mut Command, fd: i32) {
    use std::os::unix::process::CommandExt;
    cmd.env("KILN_STORE_FD", "3");
    // SAFETY: dup2 and fcntl are async-signal-safe; they touch only the child's descriptors
    // (dup2's copy, unlike the listener, is not closed on exec).
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A port for a kiln node 0 of a test (`kiln::testdir::free_port`: no other test of this
/// run gets it, and no connection's own end takes it).
pub fn free_port() -> u16 {
    kiln::testdir::free_port()
}

// In-process training of a small task, shared by the strategy, model and unit tests.

pub const TASK: &str = r#"
[experiment]
seed = 3

[model]
input_size = 32
hidden_sizes = [64, 32]
classes = 5

[data]
samples = 640
eval_samples = 203
features = 32
classes = 5

[train]
max_steps = 5

[optim]
kind = "sgd"
lr = 0.05
momentum = 0.9

[backend]
threads = 1
"#;

pub struct Trained {
    pub params: Vec<f32>,
    pub eval: (f64, f64, u64),
    pub memory: Vec<kiln::strategy::Memory>,
}

pub fn train(sets: &[&str]) -> Trained {
    train_task(TASK, sets)
}

/// Trains the experiment `task` with `sets` in process; its final parameters, eval and memory.
/// Everything a run of `task` with `sets` needs in process (its config, data, model and plan).
pub struct Prepared {
    _dir: kiln::testdir::TempDir,
    pub r: kiln::config::Resolved,
    pub data: kiln::data::Data,
    pub model: kiln::model::SharedModel,
    pub plan: kiln::plan::Plan,
}

pub fn prepare(task: &str, sets: &[&str]) -> Prepared {
    let dir = kiln::testdir::tempdir().unwrap();
    let f = write(dir.path(), "task.toml", task);
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let r = kiln::config::load(&f, &[], &sets).unwrap();
    let data = kiln::data::load(&r).unwrap();
    let model = kiln::model::build(&r, &data.input_shape()).unwrap();
    let plan = kiln::plan::Plan::new(&r.config, data.train.len(), model.num_params());
    Prepared {
        _dir: dir,
        r,
        data,
        model,
        plan,
    }
}

impl Prepared {
    pub fn input(&self) -> kiln::train::TrainInput<'_> {
        kiln::train::TrainInput {
            config: &self.r.config,
            plan: &self.plan,
            data: &self.data,
            model: self.model.as_ref(),
            store: None,
            resume: None,
            init: None,
            shared_init: Default::default(),
            keep_params: true,
        }
    }

    /// The job's NCCL variables exported (nothing to do on the CPU), as `launch::train` needs.
    pub fn nccl(&self) -> kiln::rendezvous::nccl_env::NcclEnv {
        kiln::rendezvous::nccl_env::export(&self.r.config, None, std::time::Duration::ZERO).unwrap()
    }
}

pub fn train_task(task: &str, sets: &[&str]) -> Trained {
    let p = prepare(task, sets);
    let placement = kiln::backend::resolve(&p.r.config).unwrap();
    let res =
        kiln::launch::train(&placement, &p.input(), None, None, &p.nccl(), &mut |_| {}).unwrap();
    let e = res.outcome.eval.unwrap();
    Trained {
        params: res.outcome.params,
        eval: (e.loss(), e.accuracy(), e.count),
        memory: res.memory,
    }
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Limits `cmd`'s `resource` (`libc::RLIMIT_FSIZE`, `RLIMIT_DATA`, ...) to `bytes` once it
/// starts; a file-size limit's writes then fail with EFBIG instead of a SIGXFSZ.
pub fn limit(cmd: &mut Command, resource: libc::__rlimit_resource_t, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit and signal only touch the child before it execs.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(resource, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Each trial's furthest rung in an asha sweep's ledger (the steps of its paused and done
/// segments).
pub fn furthest_rungs(sweep_dir: &Path) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let text = std::fs::read_to_string(sweep_dir.join("sweep.jsonl")).unwrap_or_default();
    for r in text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
    {
        if matches!(r["state"].as_str(), Some("paused" | "done")) {
            let e = out
                .entry(r["trial"].as_str().unwrap().to_string())
                .or_insert(0);
            *e = (*e).max(r["rung"].as_u64().unwrap());
        }
    }
    out
}

/// Issue 48's acceptance of the 9-trial grid (rf 3, rungs 6, 18, 54): 9, 3 and 1 trials reach
/// the rungs, at most 0.4x the grid's steps in all.
pub fn assert_asha_grid(sweep_dir: &Path) {
    let furthest = furthest_rungs(sweep_dir);
    let at_least = |s: u64| furthest.values().filter(|&&g| g >= s).count();
    assert_eq!(
        (at_least(6), at_least(18), at_least(54)),
        (9, 3, 1),
        "{furthest:?}"
    );
    let steps: u64 = furthest.values().sum();
    assert!(steps as f64 <= 0.4 * 9.0 * 54.0, "{steps} steps");
}
