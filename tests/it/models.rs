//! Model families beyond the MLP: for one global batch, single == ddp == fsdp (one block at a
//! time) within 1e-5; the CNN trains on the shipped digits; every bad model or image key is bad
//! input (exit 2) naming the key, with nothing written.

use crate::common::{kiln, root, stderr, write};
use crate::parallel::{max_diff, train_task};

const CNN: &str = r#"
[experiment]
seed = 5

[model]
kind = "cnn"
channels = [3, 4]
hidden_sizes = [8]
classes = 3

[data]
image = [2, 8, 8]
samples = 96
eval_samples = 20
classes = 3

[train]
max_steps = 3

[optim]
kind = "adamw"
lr = 0.01

[backend]
threads = 1
"#;

/// max |a - b| relative to the largest |a|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    max_diff(a, b) / scale
}

#[test]
fn cnn_single_ddp_and_fsdp_by_layer_agree() {
    // (no dropout: masks are drawn per rank, so they differ between world sizes)
    let single = train_task(CNN, &["train.batch_size=16"]);
    for sets in [
        vec![
            "train.batch_size=8",
            "strategy.kind=ddp",
            "strategy.devices=2",
        ],
        vec![
            "train.batch_size=8",
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.unit=layer",
        ],
    ] {
        let other = train_task(CNN, &sets);
        let d = rel_diff(&single.params, &other.params);
        assert!(d < 1e-5, "{sets:?}: relative difference {d}");
        assert_eq!(single.eval.2, other.eval.2);
    }
}

#[test]
fn the_digits_cnn_learns_the_held_out_digits() {
    let d = tempfile::tempdir().unwrap();
    let file = root().join("experiments/digits-cnn.toml");
    let o = kiln(
        d.path(),
        &[
            "run",
            file.to_str().unwrap(),
            "--quiet",
            "--set",
            "train.epochs=3",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("runs/digits-cnn/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(s["eval_samples"], 300);
    let acc = s["eval_accuracy"].as_f64().unwrap();
    assert!(acc > 0.85, "eval accuracy {acc} after 3 epochs");
}

/// Runs `task` with `sets`; asserts exit 2, nothing written, and returns stderr.
fn refused(task: &str, sets: &[&str]) -> String {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "t.toml", task);
    let mut args = vec!["run", "t.toml", "--quiet"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = kiln(d.path(), &args);
    assert_eq!(o.status.code(), Some(2), "{sets:?}: {}", stderr(&o));
    assert!(
        !d.path().join("runs").exists(),
        "{sets:?}: nothing may be written"
    );
    stderr(&o)
}

#[test]
fn bad_cnn_and_image_keys_are_bad_input_naming_the_key() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["model.channels=[]"],
            "error: `model.channels` = []: a cnn needs at least one stage, each with at least one channel\n  --> --set model.channels=[]\n  = help: e.g. channels = [32, 64]\n",
        ),
        (
            &["model.kernel_size=4"],
            "error: `model.kernel_size` = 4 must be odd (padding keeps the image size)\n  --> --set model.kernel_size=4\n  = help: use 3 or 5\n",
        ),
        (
            &["model.channels=[2,2,2,2]"],
            "error: 4 stages halve a 8x8 image to nothing (each MaxPool2d(2) halves it)\n  --> --set model.channels=[2,2,2,2]\n  = help: use at most 3 stage(s) for 8x8 images\n",
        ),
        (
            &["data.image=[2,8]"],
            "error: `data.image` = [2, 8] is not an image shape\n  --> --set data.image=[2,8]\n  = help: give [channels, height, width], each at least 1\n",
        ),
        (
            &["data.normalize=[0.5]"],
            "error: `data.normalize` = [0.5] is not [mean, std] with std > 0\n  --> --set data.normalize=[0.5]\n  = help: e.g. normalize = [0.1307, 0.3081], or leave it out\n",
        ),
    ];
    for (sets, want) in cases {
        assert_eq!(refused(CNN, sets), *want, "{sets:?}");
    }
    // a cnn on flat samples, and an mlp on images of the wrong size
    let e = refused(&CNN.replace("image = [2, 8, 8]", "features = 12"), &[]);
    assert!(
        e.starts_with("error: `model.kind` = \"cnn\" needs image samples [C, H, W], but the data's samples have shape [12]"),
        "{e}"
    );
    let e = refused(CNN, &["model.kind=\"mlp\"", "model.input_size=100"]);
    assert!(
        e.starts_with("error: `model.input_size` = 100 but the data's samples have shape [2, 8, 8] (128 values)"),
        "{e}"
    );
}

#[test]
fn idx_files_that_are_missing_or_bad_are_named() {
    let d = tempfile::tempdir().unwrap();
    let task = r#"
[model]
kind = "cnn"
channels = [2]
hidden_sizes = []
classes = 10
[data]
kind = "idx"
path = "images.idx"
labels_path = "labels.idx"
classes = 10
"#;
    write(d.path(), "t.toml", task);
    let o = kiln(d.path(), &["run", "t.toml", "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("error: `data.path` = \"images.idx\": file `"),
        "{}",
        stderr(&o)
    );
    // labels of the wrong kind where the images should be
    let digits = root().join("experiments/data/digits");
    std::fs::copy(
        digits.join("train-labels-idx1-ubyte.gz"),
        d.path().join("images.idx.gz"),
    )
    .unwrap();
    std::fs::copy(
        digits.join("train-labels-idx1-ubyte.gz"),
        d.path().join("labels.idx.gz"),
    )
    .unwrap();
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--set",
            "data.path=\"images.idx.gz\"",
            "--set",
            "data.labels_path=\"labels.idx.gz\"",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("images.idx.gz: bad magic number 0x00000801"),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("runs").exists());
}
