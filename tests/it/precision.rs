//! Mixed precision with f32 masters (`backend.precision`) on flex, which computes in bf16 and
//! f16 on the CPU: every family trains within 2e-2 of f32 and keeps f32 parameters; f16's loss
//! scaling skips exactly the step whose gradient overflowed, backs the scale off and grows it
//! like torch's `GradScaler`, on single, ddp(2) and fsdp(2), and a resume continues with the
//! saved scale bit for bit; `strategy.reduce_dtype` rounds what is reduced; refusals name the
//! key. (Through the binary: Burn keeps one float dtype per device and process, and flex has one
//! device, which the in-process tests hold at f32.)

use std::path::{Path, PathBuf};

use crate::common::{kiln, metric_lines, resume_copy, root, stderr, summary, write, TINY};
use crate::models::{corpus, CNN, GPT};

/// Runs `file` (in `dir`) into `dir/<name>` with `sets`, asserting it succeeds.
pub(crate) fn run(dir: &Path, file: &str, name: &str, sets: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec!["run", file, "--quiet", "--run-dir", out.to_str().unwrap()];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = kiln(dir, &args);
    assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
    out
}

pub(crate) fn losses(run: &Path) -> Vec<f64> {
    metric_lines(run)
        .iter()
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

/// The final parameters of a run's last checkpoint.
fn final_params(run: &Path) -> Vec<f32> {
    let mut steps: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    steps.sort();
    crate::common::checkpoint_params(run, steps.last().unwrap())
}

#[test]
fn every_family_trains_in_bf16_and_f16_within_2e_2_of_f32_with_f32_masters() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path());
    write(d.path(), "mlp.toml", TINY);
    write(d.path(), "cnn.toml", CNN);
    write(d.path(), "gpt.toml", GPT);
    for (file, steps) in [("mlp.toml", "20"), ("cnn.toml", "20"), ("gpt.toml", "8")] {
        let max = format!("train.max_steps={steps}");
        let base = run(
            d.path(),
            file,
            &format!("{file}-f32"),
            &[&max, "train.log_every=1"],
        );
        let want = losses(&base);
        for p in ["bf16", "f16"] {
            let what = format!("{file} {p}");
            let r = run(
                d.path(),
                file,
                &format!("{file}-{p}"),
                &[
                    &max,
                    "train.log_every=1",
                    &format!("backend.precision=\"{p}\""),
                ],
            );
            let got = losses(&r);
            assert_eq!(got.len(), want.len(), "{what}");
            let (a, b) = (got.last().unwrap(), want.last().unwrap());
            let rel = (a - b).abs() / b.abs();
            assert!(rel <= 2e-2, "{what}: final loss {a} vs f32 {b} ({rel:.2e})");
            // the computation did change (bf16/f16 activations), and training still learns
            assert_ne!(got, want, "{what}: the same bits as f32");
            assert!(a < &got[0], "{what}: the loss did not fall: {got:?}");
            let s = summary(&r);
            assert_eq!(s["precision"], p, "{what}");
            assert_eq!(s["loss_scale"].is_object(), p == "f16", "{what}");
            // the masters stay f32: updates smaller than a bf16/f16 step accumulate, so the
            // saved parameters are not all values of the compute dtype
            let params = final_params(&r);
            let off_grid = params
                .iter()
                .filter(|v| match p {
                    "bf16" => half::bf16::from_f32(**v).to_f32() != **v,
                    _ => half::f16::from_f32(**v).to_f32() != **v,
                })
                .count();
            assert!(
                off_grid > params.len() / 2,
                "{what}: only {off_grid} of {} parameters are off the {p} grid",
                params.len()
            );
        }
    }
}

/// The blobs CSV with one far outlier (sample 50): with `shuffle = false` and a global batch of
/// 16 it is in step 4, whose f16 gradient overflows at a loss scale of 2^16 while its forward
/// stays finite.
pub(crate) fn outlier_experiment(dir: &Path) -> &'static str {
    let csv = std::fs::read_to_string(root().join("experiments/data/blobs.csv")).unwrap();
    let mut rows: Vec<&str> = csv.lines().collect();
    rows[1 + 50] = "3000,-3000,3000,-3000,1";
    write(dir, "data.csv", &(rows.join("\n") + "\n"));
    let template = root().join("templates/csv.toml");
    write(
        dir,
        "f16.toml",
        &format!(
            r#"extends = ["{}"]

[data]
path = "data.csv"

[sampler]
shuffle = false

[train]
max_steps = 7
log_every = 1
batch_size = 16

[backend]
precision = "f16"
threads = 1

[backend.loss_scale]
growth_interval = 3

[checkpoint]
every_steps = 3
keep_last = 5
"#,
            template.display()
        ),
    );
    "f16.toml"
}

/// The loss scale and skip of each step of `outlier_experiment`: 3 good steps grow the scale to
/// 2^17 for step 4, whose gradient overflows: skipped, backed off to 2^16; 3 good steps again,
/// and it grows after step 7.
pub(crate) const OUTLIER_SCALES: [(f64, bool); 7] = [
    (65536.0, false),
    (65536.0, false),
    (65536.0, false),
    (131072.0, true),
    (65536.0, false),
    (65536.0, false),
    (65536.0, false),
];

/// `(loss_scale, skipped)` of each metrics line.
pub(crate) fn scales(run: &Path) -> Vec<(f64, bool)> {
    metric_lines(run)
        .iter()
        .map(|v| {
            (
                v["loss_scale"].as_f64().unwrap(),
                v["skipped"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

#[test]
fn f16_loss_scaling_skips_the_overflowing_step_and_resumes_with_the_saved_scale() {
    let d = kiln::testdir::tempdir().unwrap();
    let file = outlier_experiment(d.path());
    let want = OUTLIER_SCALES;
    let single = run(d.path(), file, "single", &[]);
    assert_eq!(scales(&single), want);
    let s = summary(&single);
    assert_eq!(
        s["loss_scale"],
        serde_json::json!({"scale": 131072.0, "growth_tracker": 0, "skipped_steps": 1})
    );
    let log = std::fs::read_to_string(single.join("logs/rank-0.log")).unwrap();
    assert!(
        log.contains(
            "step 4 skipped: the gradient overflowed at loss scale 131072; the scale is now 65536"
        ),
        "{log}"
    );
    // the skipped step took no update: the optimizer stepped 6 times in 7 steps
    let step6 = single.join("checkpoints/step-00000006");
    let state = kiln::checkpoint::read_state(&step6).unwrap();
    assert_eq!(
        state
            .loss_scale
            .as_ref()
            .map(|l| (l.scale, l.growth_tracker)),
        Some((65536.0, 2))
    );
    let model = kiln::model::build(
        &kiln::rundir::run_config(&single).unwrap(),
        &state.input_shape,
    )
    .unwrap();
    let opt = kiln::checkpoint::load(&step6, &model.layout().specs())
        .unwrap()
        .opt;
    assert_eq!(opt.steps, 5);
    // every rank skips the same step (the overflow is on one rank of the two)
    let mut runs = vec![("single", single.clone())];
    for (name, sets) in [
        ("ddp", &["strategy.kind=ddp"][..]),
        ("fsdp", &["strategy.kind=fsdp", "strategy.unit=layer"][..]),
    ] {
        let mut sets = sets.to_vec();
        sets.extend(["strategy.devices=2", "train.batch_size=8"]);
        let r = run(d.path(), file, name, &sets);
        assert_eq!(scales(&r), want, "{name}");
        let (a, b) = (losses(&r), losses(&single));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-2 * y.abs(), "{name}: {a:?} vs {b:?}");
        }
        runs.push((name, r));
    }
    // resumed before the skip and after it: the same bits, the same scales
    for (name, full) in [&runs[0], &runs[2]] {
        for from in ["step-00000003", "step-00000006"] {
            let dir = d.path().join(format!("{name}-resumes"));
            std::fs::create_dir_all(&dir).unwrap();
            let r = resume_copy(&dir, full, from, &[]);
            assert_eq!(
                summary(&r)["params_sha256"],
                summary(full)["params_sha256"],
                "{name} from {from}"
            );
            assert_eq!(summary(&r)["loss_scale"], summary(full)["loss_scale"]);
            let last = |run: &Path| {
                let mut by_step = std::collections::BTreeMap::new();
                for v in metric_lines(run) {
                    by_step.insert(
                        v["step"].as_u64().unwrap(),
                        (
                            v["loss"].clone(),
                            v["loss_scale"].clone(),
                            v["skipped"].clone(),
                        ),
                    );
                }
                by_step
            };
            assert_eq!(last(&r), last(full), "{name} from {from}");
        }
    }
}

#[test]
fn reduce_dtype_rounds_what_ddp_reduces() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let base = [
        "strategy.kind=ddp",
        "strategy.devices=2",
        "train.batch_size=4",
    ];
    let f32 = losses(&run(d.path(), "t.toml", "f32", &base));
    let mut sets = base.to_vec();
    sets.push("strategy.reduce_dtype=\"bf16\"");
    let bf16 = losses(&run(d.path(), "t.toml", "bf16", &sets));
    assert_ne!(f32, bf16, "reduce_dtype changed nothing");
    for (a, b) in bf16.iter().zip(&f32) {
        assert!((a - b).abs() <= 1e-2 * b.abs(), "{bf16:?} vs {f32:?}");
    }
}

#[test]
fn precision_refusals_name_the_key() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    for (sets, want) in [
        (
            &["backend.cpu=ndarray", "backend.precision=bf16"][..],
            "error: `backend.precision` = \"bf16\" needs a backend that computes in it; ndarray computes in f32 only\n  --> --set backend.precision=bf16\n  = help: set `backend.cpu = \"flex\"` (or \"auto\"), or remove `backend.precision`\n",
        ),
        (
            &["backend.precision=bf16", "backend.loss_scale.init_scale=1024"][..],
            "error: `[backend.loss_scale]` applies to `backend.precision` = \"f16\" only, not \"bf16\"\n  --> --set backend.loss_scale.init_scale=1024\n  = help: remove `[backend.loss_scale]`, or set `backend.precision = \"f16\"` (bf16 and f32 need no loss scaling)\n",
        ),
        (
            &["backend.precision=f16", "backend.loss_scale.growth_factor=1"][..],
            "error: `backend.loss_scale.growth_factor` = 1 is out of range: must be greater than 1 (and at most 1e6)\n  --> --set backend.loss_scale.growth_factor=1\n",
        ),
        (
            &["backend.precision=f16", "backend.loss_scale.backoff_factor=1.5"][..],
            "error: `backend.loss_scale.backoff_factor` = 1.5 is out of range: must be between 0 and 1\n  --> --set backend.loss_scale.backoff_factor=1.5\n",
        ),
        (
            &["backend.precision=f16", "backend.loss_scale.growth_interval=0"][..],
            "error: `backend.loss_scale.growth_interval` = 0 is out of range: must be at least 1\n  --> --set backend.loss_scale.growth_interval=0\n",
        ),
        (
            &["strategy.reduce_dtype=bf16"][..],
            "error: `strategy.reduce_dtype` = \"bf16\" sets the dtype of the gradient reduction, which `strategy.kind` = \"single\" does not have\n  --> --set strategy.reduce_dtype=bf16\n  = help: remove it, or use dp, ddp or fsdp\n",
        ),
    ] {
        let mut args = vec!["run", "t.toml"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let o = kiln(d.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{sets:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), want, "{sets:?}");
    }
    assert!(!d.path().join("runs").exists());
}
