//! Asynchronous checkpoints (`checkpoint.async`): the files of a synchronous save, a SIGKILL
//! during a background write resumes from a committed checkpoint, and a SIGTERM waits for the
//! write in flight before the preemption checkpoint.

use std::path::Path;

use crate::common::{kiln, stderr, summary};
use crate::preempt::preempt_and_resume;
use crate::resume::{full_run, sigkill_during_writes};

#[test]
fn async_checkpoints_hold_the_files_of_synchronous_ones() {
    for sets in [
        &["strategy.kind=single"][..],
        &["strategy.kind=ddp", "strategy.devices=2"],
        &["strategy.kind=fsdp", "strategy.devices=3"],
    ] {
        let d = kiln::testdir::tempdir().unwrap();
        let sync = full_run(d.path(), sets);
        let sync = {
            let to = d.path().join("sync");
            std::fs::rename(&sync, &to).unwrap();
            to
        };
        let mut with = sets.to_vec();
        with.push("checkpoint.async=true");
        let bg = full_run(d.path(), &with);
        let (a, b) = (summary(&sync), summary(&bg));
        assert_eq!(a["params_sha256"], b["params_sha256"], "{sets:?}");
        // every step's tensor files, byte for byte (the manifests hold their sha256), and the
        // same state but for the config's hash (`checkpoint.async` is in the config)
        for step in [3, 6, 9, 10] {
            let dir = |run: &Path| run.join(format!("checkpoints/step-{step:08}"));
            let read = |run: &Path, name: &str| -> serde_json::Value {
                serde_json::from_slice(&std::fs::read(dir(run).join(name)).unwrap()).unwrap()
            };
            let files = |run: &Path| {
                let m = read(run, "MANIFEST.json");
                let mut f = m["files"].as_array().unwrap().clone();
                f.retain(|e| e["name"] != "state.json");
                f
            };
            assert_eq!(files(&sync), files(&bg), "{sets:?} step {step}");
            assert_eq!(
                files(&sync).len(),
                if sets[0].ends_with("fsdp") { 6 } else { 2 }
            );
            let state = |run: &Path| {
                let mut s = read(run, "state.json");
                s.as_object_mut().unwrap().remove("config_hash");
                s
            };
            assert_eq!(state(&sync), state(&bg), "{sets:?} step {step}");
        }
        let v = kiln(d.path(), &["ckpt", "verify", bg.to_str().unwrap()]);
        assert_eq!(v.status.code(), Some(0), "{}", stderr(&v));
        assert_eq!(a["checkpoint"]["async"], false);
        assert_eq!(b["checkpoint"]["async"], true);
        assert_eq!(b["checkpoint"]["saves"], 4, "{b}");
        assert!(
            b["checkpoint"]["background_seconds"].as_f64().unwrap() > 0.0,
            "{b}"
        );
        assert_eq!(a["checkpoint"]["background_seconds"], 0.0, "{a}");
        let log = std::fs::read_to_string(bg.join("logs/rank-0.log")).unwrap();
        assert!(
            log.contains(
                "checkpoint step-00000003 copied to host memory; writing in the background"
            ) && log.contains("checkpoint step-00000003 saved"),
            "{log}"
        );
    }
}

#[test]
fn sigkill_during_background_checkpoint_writes_always_resumes_from_a_committed_one() {
    sigkill_during_writes(
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "checkpoint.async=true",
        ],
        12,
    );
}

#[test]
fn sigterm_waits_for_a_background_checkpoint_then_saves_and_resume_is_bit_exact() {
    // a save in flight when the signal comes is committed first, then the stop step's
    preempt_and_resume(&[
        "strategy.kind=fsdp",
        "strategy.devices=2",
        "train.batch_size=4",
        "checkpoint.every_steps=1",
        "checkpoint.keep_last=2",
        "checkpoint.async=true",
    ]);
}
