//! Training end to end: the loss falls on the learnable task, the run directory has every file
//! and field, a rerun with the same seed is bit-identical, and run directories never collide.

use crate::common::{kiln, losses, metric_lines, root, stderr, write, TINY};

fn quickstart_30(out: &std::path::Path) -> std::process::Output {
    let file = root().join("experiments/quickstart.toml");
    kiln(
        out,
        &[
            "run",
            file.to_str().unwrap(),
            "--quiet",
            "--set",
            "train.max_steps=30",
            "--set",
            "train.log_every=1",
            "--set",
            "backend.threads=1",
        ],
    )
}

#[test]
fn quickstart_learns_writes_every_file_and_is_reproducible() {
    let d = tempfile::tempdir().unwrap();
    let o = quickstart_30(d.path());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = d.path().join("runs/quickstart");
    let l = losses(&run);
    assert_eq!(l.len(), 30);
    let first: f64 = l[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = l[25..].iter().sum::<f64>() / 5.0;
    assert!(last < first - 0.05, "loss did not fall: {first} -> {last}");
    for line in metric_lines(&run) {
        for key in ["step", "epoch", "loss", "lr", "samples_per_sec"] {
            assert!(line.get(key).is_some(), "{key} missing in {line}");
        }
    }
    let last_line = metric_lines(&run).pop().unwrap();
    assert!(last_line["eval_loss"].is_f64() && last_line["eval_accuracy"].is_f64());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    for key in [
        "status",
        "steps",
        "epochs",
        "final_loss",
        "eval_loss",
        "eval_accuracy",
        "wall_seconds",
        "samples_per_sec",
    ] {
        assert!(summary.get(key).is_some(), "{key} missing in summary");
    }
    assert_eq!(summary["status"], "finished");
    assert_eq!(summary["steps"], 30);
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("max_steps = 30"), "{config}");

    // same seed, second run: next free directory, identical losses
    let o = quickstart_30(d.path());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(losses(&d.path().join("runs/quickstart-2")), l);
}

#[test]
fn run_dir_flag_and_seed_change() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln(d.path(), &["run", "t.toml", "--quiet", "--run-dir", "mine"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(d.path().join("mine/summary.json").exists());
    // never overwrites a run
    let o = kiln(d.path(), &["run", "t.toml", "--quiet", "--run-dir", "mine"]);
    assert_eq!(o.status.code(), Some(2));
    let o = kiln(
        d.path(),
        &["run", "t.toml", "--quiet", "--set", "experiment.seed=2"],
    );
    assert_eq!(o.status.code(), Some(0));
    assert_ne!(
        losses(&d.path().join("mine")),
        losses(&d.path().join("runs/tiny"))
    );
}

#[test]
fn accumulation_equals_a_larger_batch() {
    // 2 micro-batches of 8 == one batch of 16 (same samples, mean of means)
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let big = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "big",
            "--set",
            "train.batch_size=16",
        ],
    );
    let acc = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "acc",
            "--set",
            "train.grad_accum_steps=2",
        ],
    );
    assert_eq!((big.status.code(), acc.status.code()), (Some(0), Some(0)));
    let (a, b) = (losses(&d.path().join("acc")), losses(&d.path().join("big")));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}
