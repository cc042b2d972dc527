//! CUDA without a GPU: the errors when CUDA is asked for and cannot run, placement rules, `kiln
//! env`; and the GPU runs themselves, which skip (are ignored) on machines without one.

use crate::common::{kiln, root, stderr, stdout, write, TINY};

/// Whether this machine has a GPU kiln can use (the driver says so; the feature alone does not).
fn gpu_here() -> bool {
    #[cfg(feature = "cuda")]
    return kiln::cuda::device_count().is_ok_and(|n| n > 0);
    #[cfg(not(feature = "cuda"))]
    false
}

#[test]
fn cuda_without_a_device_or_the_feature_is_bad_input() {
    if gpu_here() {
        eprintln!("skipped: this machine has a GPU (the `gpu` tests run there)");
        return;
    }
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    for cmd in ["check", "run", "bench"] {
        let o = kiln(d.path(), &[cmd, "t.toml", "--set", "backend.device=cuda"]);
        assert_eq!(o.status.code(), Some(2), "{cmd}");
        assert_eq!(stdout(&o), "", "{cmd}: nothing is printed before the error");
        let e = stderr(&o);
        if cfg!(feature = "cuda") {
            assert!(e.starts_with("error: no CUDA device found; "), "{e}");
            assert!(e.contains("check `nvidia-smi`"), "{e}");
        } else {
            assert_eq!(
                e,
                "error: kiln was built without CUDA support, but `backend.device` = \"cuda\"\n  = help: rebuild with `cargo build --release --features cuda`, or set `backend.device = \"cpu\"`\n"
            );
        }
    }
    assert!(!d.path().join("runs").exists());
}

#[test]
fn two_ranks_on_one_gpu_with_nccl_is_explained() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln(
        d.path(),
        &[
            "check",
            "t.toml",
            "--set",
            "backend.device=cuda",
            "--set",
            "strategy.kind=ddp",
            "--set",
            "strategy.devices=[0, 0]",
            "--set",
            "strategy.collective=nccl",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "error: `strategy.devices` = [0, 0] puts two ranks on one GPU, which NCCL refuses (before NCCL 2.30)\n  --> --set strategy.collective=nccl\n  = help: set `strategy.collective = \"host\"` (host-staged collectives work for several ranks on one GPU), or give each rank its own GPU\n"
    );
}

#[test]
fn cuda_only_settings_are_refused_on_the_cpu() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln(
        d.path(),
        &["check", "t.toml", "--set", "strategy.collective=nccl"],
    );
    assert_eq!(o.status.code(), Some(2));
    let want = "`strategy.collective` = \"nccl\" needs `backend.device` = \"cuda\"";
    assert!(stderr(&o).contains(want), "{}", stderr(&o));
}

#[test]
fn placement_uses_nccl_only_when_every_rank_has_its_own_gpu() {
    use kiln::backend::{place_on_gpus, BackendError, CommKind};
    use kiln::config::{CollectiveKind, Config, Devices};
    let mut c = Config::default();
    // issue 31: a process torchrun started for LOCAL_RANK 3 takes GPU 3 (its one device)
    c.strategy.devices = Devices::Count(1);
    c.launch.local_rank = Some(3);
    assert_eq!(place_on_gpus(&c, 1, 4).unwrap().ordinals, vec![3]);
    assert!(matches!(
        place_on_gpus(&c, 1, 2),
        Err(BackendError::NoSuchGpu {
            ordinal: 3,
            found: 2
        })
    ));
    c.launch.local_rank = None;
    c.strategy.devices = Devices::Count(2);
    let p = place_on_gpus(&c, 2, 2).unwrap();
    assert_eq!((p.ordinals, p.collective), (vec![0, 1], CommKind::Nccl));
    let p = place_on_gpus(&c, 2, 1).unwrap();
    assert_eq!(
        (p.ordinals.clone(), p.collective),
        (vec![0, 0], CommKind::Host)
    );
    assert!(p
        .note
        .unwrap()
        .contains("NCCL refuses two ranks on one GPU"));
    c.strategy.collective = CollectiveKind::Nccl;
    assert!(matches!(
        place_on_gpus(&c, 2, 1),
        Err(BackendError::SharedGpu { .. })
    ));
    c.strategy.devices = Devices::List(vec![0, 3]);
    assert!(matches!(
        place_on_gpus(&c, 2, 2),
        Err(BackendError::NoSuchGpu {
            ordinal: 3,
            found: 2
        })
    ));
}

#[test]
fn env_reports_and_exits_0() {
    let d = kiln::testdir::tempdir().unwrap();
    let o = kiln(d.path(), &["env"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.starts_with("kiln "), "{out}");
    assert!(out.contains("cpu threads: "), "{out}");
    if cfg!(feature = "cuda") {
        for part in [
            "cuda driver: ",
            "cuda toolkit: ",
            "nvrtc: ",
            "kernel cache: ",
            "nccl: ",
        ] {
            assert!(out.contains(part), "{part}: {out}");
        }
    } else {
        assert!(
            out.contains("rebuild with `cargo build --release --features cuda`"),
            "{out}"
        );
    }
}

/// `scripts/gpu-check.sh --dry-run` needs no GPU and no binary: it lists every step with its
/// timeout, and the timeouts fit the device machine's 10-minute command limit with room to
/// spare.
#[test]
fn the_gpu_check_lists_its_steps_within_540_seconds() {
    let o = std::process::Command::new("bash")
        .arg(root().join("scripts/gpu-check.sh"))
        .arg("--dry-run")
        .env("KILN", "/nonexistent/kiln")
        .env_remove("OUT")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let steps: Vec<(u64, &str)> = out
        .lines()
        .filter_map(|l| l.strip_prefix("step "))
        .map(|l| {
            let mut parts = l.split_whitespace();
            parts.next();
            let secs = parts.next().unwrap().trim_end_matches('s').parse().unwrap();
            (secs, l)
        })
        .collect();
    assert!(steps.len() >= 15, "{out}");
    let total: u64 = steps.iter().map(|(s, _)| s).sum();
    assert!(total < 540, "{total}s:\n{out}");
    assert!(
        out.contains(&format!("timeouts add up to {total}s")),
        "{out}"
    );
    assert!(steps[0].1.contains("preflight"), "{out}");
    assert!(steps.last().unwrap().1.contains("throughput"), "{out}");
    assert!(steps.iter().all(|(s, _)| *s > 0));
}

/// The GPU runs: ignored (counted as skipped) unless asked for with `--ignored` on a GPU machine.
#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use crate::common::root;

    #[test]
    #[ignore = "needs a CUDA GPU (run `cargo test --release --features cuda -- --ignored` on one)"]
    fn quickstart_on_cuda_matches_the_cpu() {
        let d = kiln::testdir::tempdir().unwrap();
        let q = root().join("experiments/quickstart.toml");
        let q = q.to_str().unwrap();
        let sets = ["--set", "train.max_steps=10", "--set", "train.log_every=1"];
        let mut gpu = vec![
            "run",
            q,
            "--quiet",
            "--run-dir",
            "gpu",
            "--set",
            "backend.device=cuda",
        ];
        gpu.extend(sets);
        let mut cpu = vec!["run", q, "--quiet", "--run-dir", "cpu"];
        cpu.extend(sets);
        assert_eq!(kiln(d.path(), &gpu).status.code(), Some(0));
        assert_eq!(kiln(d.path(), &cpu).status.code(), Some(0));
        let (a, b) = (
            crate::common::losses(&d.path().join("gpu")),
            crate::common::losses(&d.path().join("cpu")),
        );
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-3 * x.abs(), "{a:?} vs {b:?}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU (run `cargo test --release --features cuda -- --ignored` on one)"]
    fn ddp_and_fsdp_world_one_over_nccl_use_device_buffers() {
        let d = kiln::testdir::tempdir().unwrap();
        write(d.path(), "t.toml", TINY);
        for kind in ["ddp", "fsdp"] {
            let o = kiln(
                d.path(),
                &[
                    "run",
                    "t.toml",
                    "--quiet",
                    "--run-dir",
                    kind,
                    "--set",
                    "backend.device=cuda",
                    "--set",
                    &format!("strategy.kind={kind}"),
                    "--set",
                    "strategy.unit=layer",
                    "--set",
                    "strategy.collective=nccl",
                ],
            );
            assert_eq!(o.status.code(), Some(0), "{kind}: {}", stderr(&o));
            // NCCL reduced the backward pass's own buffers, not host copies
            let log = std::fs::read_to_string(d.path().join(kind).join("logs/rank-0.log")).unwrap();
            assert!(
                log.contains("gradients: on the device, reduced there by NCCL"),
                "{log}"
            );
        }
    }
}
