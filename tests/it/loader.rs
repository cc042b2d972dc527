//! The data loader (`data.workers`, `data.prefetch`) and augmentation (`[data.augment]`): the
//! same bits for any number of loader threads, on one rank and on two, over images and text,
//! across a stop and resume; augmentation that does change the batches.

use std::path::{Path, PathBuf};

use crate::common::{copy_dir, kiln, metric_lines, root, stderr, stdout, summary};

/// Digits through a small CNN, with augmentation; a checkpoint every 2 steps.
fn images() -> Vec<String> {
    let file = root().join("experiments/digits-cnn.toml");
    [
        file.to_str().unwrap(),
        "--set",
        "model.channels=[4, 8]",
        "--set",
        "model.hidden_sizes=[16]",
        "--set",
        "data.augment.random_crop=2",
        "--set",
        "data.augment.hflip=true",
        "--set",
        "train.batch_size=16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A one-block GPT on the book's bytes with 16-token windows.
fn text() -> Vec<String> {
    let file = root().join("experiments/tiny-gpt.toml");
    [
        file.to_str().unwrap(),
        "--set",
        "model.layers=1",
        "--set",
        "model.dim=32",
        "--set",
        "model.heads=2",
        "--set",
        "model.block_size=16",
        "--set",
        "data.eval_fraction=0.01",
        "--set",
        "train.batch_size=8",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

const COMMON: &[&str] = &[
    "train.max_steps=6",
    "train.log_every=1",
    "train.eval_every=3",
    "checkpoint.every_steps=2",
    "checkpoint.keep_last=5",
    "schedule.warmup_steps=2",
    "backend.threads=1",
];

fn run(dir: &Path, name: &str, base: &[String], sets: &[&str]) -> PathBuf {
    let mut args: Vec<&str> = vec!["run"];
    args.extend(base.iter().map(|s| s.as_str()));
    for s in COMMON.iter().chain(sets) {
        args.extend(["--set", s]);
    }
    args.extend(["--quiet", "--run-dir", name]);
    let o = kiln(dir, &args);
    assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
    dir.join(name)
}

/// Every metric line without its timing fields: the bits that must not move.
fn bits(run: &Path) -> Vec<String> {
    metric_lines(run)
        .into_iter()
        .map(|mut v| {
            let m = v.as_object_mut().unwrap();
            for k in ["ts", "time", "samples_per_sec", "tokens_per_sec", "step_ms"] {
                m.remove(k);
            }
            serde_json::to_string(m).unwrap()
        })
        .collect()
}

#[test]
fn any_number_of_loader_threads_gives_the_same_bits() {
    let d = kiln::testdir::tempdir().unwrap();
    for (data, base) in [("images", images()), ("text", text())] {
        for strategy in [
            &["strategy.kind=single"][..],
            &["strategy.kind=ddp", "strategy.devices=2"],
        ] {
            let name = |w: usize| format!("{data}-{}-w{w}", strategy.len());
            let want = bits(&run(d.path(), &name(0), &base, strategy));
            assert_eq!(want.len(), 6, "{data} {strategy:?}");
            for workers in [1, 3] {
                let w = format!("data.workers={workers}");
                let mut sets = strategy.to_vec();
                sets.extend([w.as_str(), "data.prefetch=2"]);
                let got = bits(&run(d.path(), &name(workers), &base, &sets));
                assert_eq!(got, want, "{data} {strategy:?} workers {workers}");
            }
        }
    }
    // augmentation changes the batches (so the image runs above compared augmented batches)
    let mut plain = images();
    plain.truncate(plain.len() - 6);
    plain.extend(["--set".into(), "train.batch_size=16".into()]);
    let unaugmented = bits(&run(d.path(), "plain", &plain, &[]));
    assert_ne!(
        unaugmented,
        bits(&d.path().join("images-1-w0")),
        "augmentation changed nothing"
    );
}

#[test]
fn a_resume_continues_the_loader_at_the_checkpoint() {
    let d = kiln::testdir::tempdir().unwrap();
    let ddp = ["strategy.kind=ddp", "strategy.devices=2"];
    let want = run(d.path(), "inline", &images(), &ddp);
    let mut threaded = ddp.to_vec();
    threaded.extend(["data.workers=3", "data.prefetch=2"]);
    let full = run(d.path(), "threaded", &images(), &threaded);
    // resumed from step 2 with 1 loader thread: a loader setting may change on resume
    let copy = d.path().join("resumed");
    copy_dir(&full, &copy);
    let o = kiln(
        d.path(),
        &[
            "resume",
            copy.to_str().unwrap(),
            "--quiet",
            "--from",
            "step-00000002",
            "--set",
            "data.workers=1",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("data.workers"),
        "a loader change is not worth a warning: {}",
        stderr(&o)
    );
    assert_eq!(bits(&copy), bits(&want));
    assert_eq!(
        summary(&copy)["params_sha256"],
        summary(&want)["params_sha256"]
    );
    assert_eq!(summary(&copy)["resumed_from_step"], 2);
}

#[test]
fn check_prints_the_cpu_split_and_bad_loader_settings_name_their_key() {
    let d = kiln::testdir::tempdir().unwrap();
    let mut args: Vec<String> = vec!["check".into()];
    args.extend(images());
    for s in ["data.workers=1", "strategy.devices=1"] {
        args.extend(["--set".into(), s.into()]);
    }
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let o = kiln(d.path(), &argv);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("math thread") && out.contains("+ 1 data loader thread per rank"),
        "{out}"
    );
    for (set, want) in [
        (
            "data.workers=65",
            "`data.workers` = 65 is out of range: at most 64",
        ),
        (
            "data.prefetch=0",
            "`data.prefetch` = 0 is out of range: must be at least 1",
        ),
    ] {
        let mut a = argv.clone();
        a.extend(["--set", set]);
        let o = kiln(d.path(), &a);
        assert_eq!(o.status.code(), Some(2), "{set}");
        assert!(stderr(&o).contains(want), "{set}: {}", stderr(&o));
    }
    // augmentation needs images
    let mut a: Vec<String> = vec!["check".into()];
    a.extend(text());
    a.extend(["--set".into(), "data.augment.hflip=true".into()]);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let o = kiln(d.path(), &a);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(
            "`data.augment` transforms images, but `data.kind` = \"text\" gives token windows"
        ),
        "{}",
        stderr(&o)
    );
}
