//! Checkpoints and resume: bit-exact continuation for every strategy, world-size changes,
//! SIGKILL during checkpoint writes, corrupted checkpoints, refused config changes, and the
//! acceptance scenario.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    copy_dir, kiln, kiln_env, loss_lines, losses, resume_copy, root, stderr, summary, write, KILN,
};

/// A small task with shuffling, dropout, accumulation and a schedule; checkpoints every 3 steps
/// (mid-epoch: an epoch is 16 micro-batches of 8 per rank at world 1).
pub(crate) const TASK: &str = r#"
[experiment]
name = "task"
seed = 5

[model]
input_size = 16
hidden_sizes = [32]
classes = 4
dropout = 0.2

[data]
samples = 128
eval_samples = 40
features = 16
classes = 4

[train]
max_steps = 10
batch_size = 8
grad_accum_steps = 2
log_every = 1
eval_every = 5

[optim]
kind = "adamw"
lr = 0.01
weight_decay = 0.01

[schedule]
kind = "cosine"
warmup_steps = 2

[checkpoint]
every_steps = 3
keep_last = 10

[backend]
threads = 1
"#;

/// Runs TASK uninterrupted in `dir/full` with `sets`, returns the run dir.
pub(crate) fn full_run(dir: &Path, sets: &[&str]) -> PathBuf {
    write(dir, "task.toml", TASK);
    let mut args = vec!["run", "task.toml", "--quiet", "--run-dir", "full"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = kiln(dir, &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    dir.join("full")
}

#[test]
fn resume_is_exact_for_every_strategy() {
    for sets in [
        &["strategy.kind=single"][..],
        &["strategy.kind=dp", "strategy.devices=2"],
        &["strategy.kind=ddp", "strategy.devices=2"],
        &["strategy.kind=fsdp", "strategy.devices=2"],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.unit=layer",
            "train.activation_checkpointing=units",
        ],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=3",
            "strategy.unit=layer",
            "strategy.sharding=grad_op",
        ],
        // checkpoints written in the background
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "checkpoint.async=true",
        ],
        // HSDP, written in the background by the first shard group
        &[
            "strategy.kind=fsdp",
            "strategy.devices=4",
            "strategy.shard_size=2",
            "checkpoint.async=true",
        ],
    ] {
        let d = kiln::testdir::tempdir().unwrap();
        let full = full_run(d.path(), sets);
        let resumed = resume_copy(d.path(), &full, "step-00000003", &[]);
        assert_eq!(loss_lines(&resumed), loss_lines(&full), "{sets:?}");
        let (a, b) = (summary(&full), summary(&resumed));
        assert_eq!(a["params_sha256"], b["params_sha256"], "{sets:?}");
        assert_eq!(a["eval_loss"], b["eval_loss"], "{sets:?}");
        assert_eq!(b["resumed_from_step"], 3);
    }
}

#[test]
fn resume_under_another_world_size_continues_within_tolerance() {
    // (before, after): the same global batch of 16 per micro-step
    for (before, after) in [
        (
            &[
                "strategy.kind=ddp",
                "strategy.devices=4",
                "train.batch_size=4",
            ][..],
            &["strategy.devices=2", "train.batch_size=8"][..],
        ),
        (
            &[
                "strategy.kind=fsdp",
                "strategy.devices=2",
                "train.batch_size=8",
            ],
            &["strategy.devices=4", "train.batch_size=4"],
        ),
        (
            &[
                "strategy.kind=ddp",
                "strategy.devices=2",
                "train.batch_size=8",
            ],
            &[
                "strategy.kind=fsdp",
                "strategy.devices=4",
                "train.batch_size=4",
            ],
        ),
        (
            &[
                "strategy.kind=fsdp",
                "strategy.devices=4",
                "train.batch_size=4",
            ],
            &[
                "strategy.kind=single",
                "strategy.devices=1",
                "train.batch_size=16",
            ],
        ),
        // HSDP to fsdp over its shard group's size, and fsdp to HSDP
        (
            &[
                "strategy.kind=fsdp",
                "strategy.devices=4",
                "strategy.shard_size=2",
                "train.batch_size=4",
            ],
            &[
                "strategy.devices=2",
                "strategy.shard_size=2",
                "train.batch_size=8",
            ],
        ),
        (
            &[
                "strategy.kind=fsdp",
                "strategy.devices=2",
                "train.batch_size=8",
            ],
            &[
                "strategy.devices=4",
                "strategy.shard_size=2",
                "train.batch_size=4",
            ],
        ),
    ] {
        let d = kiln::testdir::tempdir().unwrap();
        // no dropout: masks are drawn per rank, so they differ under another world size
        let mut b: Vec<&str> = before.to_vec();
        b.push("model.dropout=0");
        let full = full_run(d.path(), &b);
        let mut a: Vec<&str> = after.to_vec();
        a.push("model.dropout=0");
        let resumed = resume_copy(d.path(), &full, "step-00000003", &a);
        let (x, y) = (loss_lines(&full), loss_lines(&resumed));
        assert_eq!(x.len(), y.len());
        for ((s1, l1), (s2, l2)) in x.iter().zip(&y) {
            assert_eq!(s1, s2);
            assert!(
                (l1 - l2).abs() <= 1e-5 * l1.abs(),
                "{before:?} -> {after:?} step {s1}: {l1} vs {l2}"
            );
        }
    }
}

#[test]
fn the_global_cursor_covers_an_epoch_exactly_once_across_world_sizes() {
    use kiln::config::Config;
    use kiln::plan::Plan;
    for (w1, b1, j1, w2, b2) in [
        (4usize, 3usize, 2usize, 2usize, 5usize),
        (2, 4, 3, 3, 2),
        (3, 2, 1, 1, 7),
    ] {
        let mut c = Config::default();
        c.train.batch_size = b1;
        c.strategy.kind = kiln::config::StrategyKind::Ddp;
        c.strategy.devices = kiln::config::Devices::Count(w1);
        c.sampler.drop_last = true;
        let n = 120;
        let p1 = Plan::new(&c, n, 1);
        let mut seen: Vec<usize> = Vec::new();
        for r in 0..w1 {
            let idx = p1.sampler.indices_from(7, r, 0);
            seen.extend(&idx[..j1 * b1]);
        }
        let cursor = p1.cursor(0, j1);
        c.strategy.devices = kiln::config::Devices::Count(w2);
        c.train.batch_size = b2;
        let p2 = Plan::new(&c, n, 1);
        for r in 0..w2 {
            seen.extend(p2.sampler.indices_from(7, r, cursor));
        }
        seen.sort_unstable();
        let whole: Vec<usize> = (0..n).collect();
        assert_eq!(seen, whole, "world {w1} -> {w2}");
    }
}

#[test]
fn a_corrupt_newest_checkpoint_falls_back_to_the_previous_one() {
    let d = kiln::testdir::tempdir().unwrap();
    let full = full_run(d.path(), &["strategy.kind=ddp", "strategy.devices=2"]);
    let copy = d.path().join("copy");
    copy_dir(&full, &copy);
    // the run saved steps 3, 6, 9, 10; flip one byte of step 10's model
    let model = copy.join("checkpoints/step-00000010/model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&model, bytes).unwrap();
    let o = kiln(d.path(), &["ckpt", "verify", copy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("step-00000010: model.safetensors: checksum mismatch"),
        "{}",
        stderr(&o)
    );
    let o = kiln(d.path(), &["ckpt", "list", copy.to_str().unwrap()]);
    assert!(crate::common::stdout(&o).contains("invalid: model.safetensors: checksum mismatch"));
    let o = kiln(d.path(), &["resume", copy.to_str().unwrap(), "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("skipping step-00000010: model.safetensors: checksum mismatch"),
        "{e}"
    );
    assert_eq!(loss_lines(&copy), loss_lines(&full));
    // a half-written save (.tmp) is skipped too, and --from refuses an invalid one
    std::fs::create_dir_all(copy.join("checkpoints/step-00000011.tmp")).unwrap();
    let o = kiln(d.path(), &["ckpt", "list", copy.to_str().unwrap()]);
    assert!(crate::common::stdout(&o).contains("unfinished (.tmp)"));
    std::fs::write(&model, b"garbage").unwrap();
    let o = kiln(
        d.path(),
        &["resume", copy.to_str().unwrap(), "--from", "step-00000010"],
    );
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn changing_model_or_data_on_resume_is_refused_naming_the_key() {
    let d = kiln::testdir::tempdir().unwrap();
    let full = full_run(d.path(), &[]);
    let o = kiln(
        d.path(),
        &[
            "resume",
            full.to_str().unwrap(),
            "--set",
            "model.hidden_sizes=[8]",
            "--set",
            "data.seed=9",
            "--set",
            "optim.lr=0.5",
            "--set",
            "checkpoint.dir=\"ck2\"",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("`model.hidden_sizes`: [32] -> [8]"), "{e}");
    assert!(e.contains("`data.seed`: 0 -> 9"), "{e}");
    assert!(
        e.contains("`checkpoint.dir`: \"checkpoints\" -> \"ck2\""),
        "{e}"
    );
    assert!(e.contains("cannot resume"), "{e}");
    // allowed changes are listed as warnings
    let o = kiln(
        d.path(),
        &[
            "resume",
            full.to_str().unwrap(),
            "--quiet",
            "--set",
            "train.max_steps=12",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning: resuming with `train.max_steps` changed: 10 -> 12"));
    assert_eq!(losses(&full).len(), 12);
}

#[test]
fn run_resume_continues_the_newest_unfinished_run() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "task.toml", TASK);
    let o = kiln(
        d.path(),
        &["run", "task.toml", "--quiet", "--set", "train.max_steps=6"],
    );
    assert_eq!(o.status.code(), Some(0));
    // a preempted run leaves no summary
    std::fs::remove_file(d.path().join("runs/task/summary.json")).unwrap();
    let o = kiln(d.path(), &["run", "task.toml", "--quiet", "--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!d.path().join("runs/task-2").exists());
    assert_eq!(summary(&d.path().join("runs/task"))["resumed_from_step"], 6);
    assert_eq!(losses(&d.path().join("runs/task")).len(), 10);
    // nothing unfinished: --resume starts a new run
    let o = kiln_env(
        d.path(),
        &["run", "task.toml", "--quiet"],
        &[("KILN_CHECKPOINT__AUTO_RESUME", "true")],
    );
    assert_eq!(o.status.code(), Some(0));
    assert!(d.path().join("runs/task-2/summary.json").exists());
}

pub(crate) fn wait_for(path: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn sigkill_during_checkpoint_writes_always_leaves_a_verified_checkpoint() {
    sigkill_during_writes(&[], 20);
}

/// Kills (SIGKILL) runs of a ~1M-parameter model that checkpoints every step, at random
/// moments of their first checkpoints' writes, `tries` times; each resumes from the newest
/// checkpoint that verifies. Some kill must land while a checkpoint is half-written (a
/// `step-N.tmp` left behind), or the test proved nothing about writes.
pub(crate) fn sigkill_during_writes(sets: &[&str], tries: usize) {
    let d = kiln::testdir::tempdir().unwrap();
    // ~1M parameters: each checkpoint writes ~12 MB, every step
    write(
        d.path(),
        "big.toml",
        &TASK
            .replace("input_size = 16", "input_size = 512")
            .replace("features = 16", "features = 512")
            .replace("hidden_sizes = [32]", "hidden_sizes = [1024, 512]")
            .replace("every_steps = 3", "every_steps = 1")
            .replace("max_steps = 10", "max_steps = 100000")
            .replace("keep_last = 10", "keep_last = 2"),
    );
    let mut rng = kiln::rng::Rng::new(42);
    let mut mid_write = 0;
    for t in 0..tries {
        let run = d.path().join(format!("r{t}"));
        let mut child = Command::new(KILN)
            .current_dir(d.path())
            .args([
                "run",
                "big.toml",
                "--quiet",
                "--run-dir",
                run.to_str().unwrap(),
            ])
            .args(sets.iter().flat_map(|s| ["--set", s]))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // kill somewhere in the first checkpoints' writes
        assert!(wait_for(&run.join("checkpoints"), Duration::from_secs(30)));
        std::thread::sleep(Duration::from_micros(rng.below(150_000)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // (a `.tmp` that holds a file: `begin` makes the directory before any write)
        let half_written = std::fs::read_dir(run.join("checkpoints"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .any(|e| std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some()));
        mid_write += usize::from(half_written);
        let store = kiln::checkpoint::CheckpointDir::new(run.join("checkpoints"));
        let expected = store
            .list()
            .unwrap()
            .into_iter()
            .find(|e| e.status.is_ok())
            .map(|e| e.step);
        let until = expected.unwrap_or(0) + 1;
        let max = format!("train.max_steps={until}");
        let o = kiln(d.path(), &["resume", run.to_str().unwrap(), "--set", &max]);
        assert_eq!(o.status.code(), Some(0), "try {t}: {}", stderr(&o));
        let e = stderr(&o);
        match expected {
            Some(step) => assert!(e.contains(&format!("(step {step})")), "try {t}: {e}"),
            None => assert!(e.contains("starts over from step 0"), "try {t}: {e}"),
        }
        assert_eq!(
            summary(&run)["resumed_from_step"].as_u64(),
            Some(expected.unwrap_or(0)),
            "try {t}"
        );
        assert_eq!(summary(&run)["status"], "finished");
        if sets.contains(&"checkpoint.async=true") {
            let log = std::fs::read_to_string(run.join("logs/rank-0.log")).unwrap();
            assert!(log.contains("writing in the background"), "try {t}: {log}");
        }
    }
    assert!(
        mid_write > 0,
        "none of {tries} kills landed while a checkpoint was being written"
    );
}

#[test]
fn acceptance_kill_after_step_20_then_resume_matches_uninterrupted() {
    let d = kiln::testdir::tempdir().unwrap();
    let file = root().join("experiments/quickstart-ddp.toml");
    let f = file.to_str().unwrap();
    let sets = [
        "--set",
        "train.max_steps=40",
        "--set",
        "checkpoint.every_steps=10",
        "--set",
        "train.log_every=1",
    ];
    let mut args = vec!["run", f, "--quiet", "--run-dir", "full"];
    args.extend(sets);
    assert_eq!(kiln(d.path(), &args).status.code(), Some(0));
    let killed = d.path().join("killed");
    let mut child = Command::new(KILN)
        .current_dir(d.path())
        .args(["run", f, "--quiet", "--run-dir", "killed"])
        .args(sets)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(
        &killed.join("checkpoints/step-00000020"),
        Duration::from_secs(60)
    ));
    child.kill().unwrap();
    child.wait().unwrap();
    let o = kiln(d.path(), &["resume", killed.to_str().unwrap(), "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let tail = |run: &Path| {
        loss_lines(run)
            .into_iter()
            .filter(|(s, _)| *s > 20)
            .collect::<Vec<_>>()
    };
    assert_eq!(tail(&killed).len(), 20);
    assert_eq!(tail(&killed), tail(&d.path().join("full")));
}

/// Issue 31: the checkpoint's random streams (`state.json`'s `rng`) are restored on resume:
/// a resume given other seeds (dropout and shuffle) still continues the run bit for bit, and
/// says the checkpoint's seeds apply.
#[test]
fn a_resume_restores_the_checkpoints_random_streams() {
    let d = kiln::testdir::tempdir().unwrap();
    let full = full_run(d.path(), &[]);
    let copy = d.path().join("reseeded");
    copy_dir(&full, &copy);
    let o = kiln(
        d.path(),
        &[
            "resume",
            copy.to_str().unwrap(),
            "--quiet",
            "--from",
            "step-00000003",
            "--set",
            "experiment.seed=99",
            "--set",
            "sampler.seed=7",
        ],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("the checkpoint's random streams are restored: experiment.seed = 5 (the config says 99), sampler.seed = 0 (the config says 7)"),
        "{err}"
    );
    assert_eq!(loss_lines(&copy), loss_lines(&full));
    // the run's record keeps the seeds it ran with
    let cfg = std::fs::read_to_string(copy.join("config.toml")).unwrap();
    assert!(cfg.contains("seed = 5"), "{cfg}");
}
