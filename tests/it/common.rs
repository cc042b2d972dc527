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
    let r = kiln::launch::run_config(run_dir).unwrap();
    let state = kiln::checkpoint::read_state(step_dir).unwrap();
    let model = kiln::model::build(&r, &state.input_shape).unwrap();
    kiln::checkpoint::load(step_dir, &model.layout().specs())
        .unwrap()
        .params
}
