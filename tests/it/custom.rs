//! A user's own model family (`examples/custom_model.rs`, a residual MLP registered as
//! `res-mlp` in the user's binary): it trains under every strategy with the same results,
//! resumes exactly, runs sweeps, and its own `[model]` keys are validated with key and source.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::{stderr, write};

/// The example binary, built by `cargo test` beside the test binary.
fn custom_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/it-<hash> -> target/<profile>/examples/custom_model
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples/custom_model");
    assert!(bin.is_file(), "{} was not built", bin.display());
    bin
}

fn custom(cwd: &Path, args: &[&str]) -> Output {
    crate::common::clean_cmd(&custom_binary(), cwd, args)
        .output()
        .unwrap()
}

const NET: &str = r#"
[experiment]
name = "net"
seed = 3

[model]
kind = "res-mlp"
width = 16
depth = 2
classes = 3

[data]
samples = 96
eval_samples = 20
features = 8
classes = 3

[train]
max_steps = 4
log_every = 1

[optim]
kind = "adamw"
lr = 0.01

[checkpoint]
every_steps = 2

[backend]
threads = 1
"#;

fn run(d: &Path, dir: &str, sets: &[&str]) -> serde_json::Value {
    let mut args = vec!["run", "t.toml", "--quiet", "--run-dir", dir];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = custom(d, &args);
    assert_eq!(o.status.code(), Some(0), "{sets:?}: {}", stderr(&o));
    serde_json::from_str(&std::fs::read_to_string(d.join(dir).join("summary.json")).unwrap())
        .unwrap()
}

#[test]
fn a_users_model_trains_alike_under_every_strategy_and_resumes_exactly() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", NET);
    let single = run(d.path(), "single", &["train.batch_size=16"]);
    let eval = single["eval_loss"].as_f64().unwrap();
    for (dir, sets) in [
        (
            "ddp",
            &[
                "train.batch_size=8",
                "strategy.kind=ddp",
                "strategy.devices=2",
            ][..],
        ),
        (
            "fsdp",
            &[
                "train.batch_size=8",
                "strategy.kind=fsdp",
                "strategy.devices=2",
                "strategy.unit=layer",
            ],
        ),
    ] {
        let s = run(d.path(), dir, sets);
        let other = s["eval_loss"].as_f64().unwrap();
        assert!(
            (eval - other).abs() < 1e-5 * eval,
            "{dir}: {eval} vs {other}"
        );
        assert_eq!(s["num_params"], single["num_params"]);
    }
    // resume the ddp run from its first checkpoint: the same bits
    let o = custom(
        d.path(),
        &["resume", "ddp", "--quiet", "--from", "step-00000002"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let resumed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("ddp/summary.json")).unwrap())
            .unwrap();
    let ddp_sha = run(
        d.path(),
        "ddp-again",
        &[
            "train.batch_size=8",
            "strategy.kind=ddp",
            "strategy.devices=2",
        ],
    )["params_sha256"]
        .clone();
    assert_eq!(resumed["params_sha256"], ddp_sha);
    assert_eq!(resumed["resumed_from_step"], 2);
}

#[test]
fn a_users_model_runs_a_sweep_and_its_keys_are_checked() {
    let d = kiln::testdir::tempdir().unwrap();
    write(
        d.path(),
        "t.toml",
        &format!("{NET}\n[sweep]\ngrid = {{ \"model.width\" = [8, 12] }}\n"),
    );
    let o = custom(d.path(), &["sweep", "t.toml", "--parallel", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(table.matches("done").count(), 2, "{table}");
    // the family's own keys: unknown, and of the wrong type (nothing written)
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", NET);
    write(
        d.path(),
        "bad.toml",
        &NET.replace("width = 16", "widht = 16"),
    );
    let o = custom(d.path(), &["run", "bad.toml", "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "error: unknown key `model.widht`\n  --> bad.toml:8\n  = help: did you mean `model.width`?\n"
    );
    let o = custom(
        d.path(),
        &["run", "t.toml", "--quiet", "--set", "model.width=\"x\""],
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "error: `model.width` has the wrong type: found string \"x\", expected a non-negative integer\n  --> --set model.width=\"x\"\n"
    );
    assert!(
        !d.path().join("runs").exists(),
        "{:?}",
        std::fs::read_dir(d.path().join("runs"))
            .map(|r| r.map(|e| e.unwrap().path()).collect::<Vec<_>>())
    );
    // kiln's own binary does not know the family
    let o = crate::common::kiln(d.path(), &["check", "t.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("\"res-mlp\" is not a registered model family"));
}

#[test]
fn a_family_with_declared_stages_and_one_without_train_alike_under_fsdp() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "net.toml", NET);
    let mut hashes = Vec::new();
    for stages in ["true", "false"] {
        let run = format!("run-{stages}");
        let o = custom(
            d.path(),
            &[
                "run",
                "net.toml",
                "--quiet",
                "--run-dir",
                &run,
                "--set",
                &format!("model.stages={stages}"),
                "--set",
                "strategy.kind=\"fsdp\"",
                "--set",
                "strategy.devices=2",
                "--set",
                "strategy.unit=\"layer\"",
                "--set",
                "train.activation_checkpointing=\"units\"",
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "stages = {stages}: {}",
            stderr(&o)
        );
        let s: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(d.path().join(&run).join("summary.json")).unwrap(),
        )
        .unwrap();
        assert!(s["final_loss"].as_f64().unwrap().is_finite());
        hashes.push(s["params_sha256"].clone());
    }
    // one stage or one per layer: the same math in the same order
    assert_eq!(hashes[0], hashes[1]);
}
