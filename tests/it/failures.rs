//! Failures injected through a probe model family (run in a child process): a full disk names
//! the file and leaves no `.tmp`, and a non-finite gradient or parameter with a finite loss
//! stops the run as diverged.

#![allow(unused_imports)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{
    code, kiln, kiln_env, metric_lines, stderr, stdout, summary, write, KILN, TINY,
};

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
        &[
            "--exact",
            "failures::probe_child",
            "--ignored",
            "--nocapture",
        ],
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
