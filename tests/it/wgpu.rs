//! The wgpu backend. Without the `wgpu` feature: the errors. With it, on the adapter
//! `backend.adapter = "cpu"` finds (Mesa's lavapipe in CI, `scripts/vulkan-up.sh` installs it):
//! mlp, cnn and gpt train like flex, ddp(2) and fsdp(2) like wgpu single, resume is exact, and
//! bad input is refused naming the key.

use crate::common::{kiln, stderr, stdout, write, TINY};

#[test]
fn wgpu_refusals_name_the_key() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let check = |sets: &[&str]| {
        let mut args = vec!["check", "t.toml"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let o = kiln(d.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{sets:?}: {}", stderr(&o));
        assert_eq!(
            stdout(&o),
            "",
            "{sets:?}: nothing is printed before the error"
        );
        stderr(&o)
    };
    let e = check(&["backend.adapter=cpu"]);
    assert!(
        e.contains("`backend.adapter`") && e.contains("backend.device = \"wgpu\""),
        "{e}"
    );
    let e = check(&[
        "backend.device=wgpu",
        "strategy.kind=ddp",
        "strategy.devices=2",
        "strategy.collective=nccl",
    ]);
    assert!(
        e.contains("`strategy.collective` = \"nccl\" needs CUDA; wgpu has no NCCL"),
        "{e}"
    );
    if !cfg!(feature = "wgpu") {
        let e = check(&["backend.device=wgpu"]);
        assert_eq!(
            e,
            "error: kiln was built without wgpu support, but `backend.device` = \"wgpu\"\n  = help: rebuild with `cargo build --release --features wgpu`, or set `backend.device = \"cpu\"`\n"
        );
    }
    assert!(!d.path().join("runs").exists());
}

#[cfg(feature = "wgpu")]
mod on_wgpu {
    use crate::common::{kiln, loss_lines, resume_copy, stderr, summary, write};
    use crate::common::{prepare, TASK};
    use crate::models::{corpus, CNN, GPT};

    const ON: [&str; 2] = ["backend.device=wgpu", "backend.adapter=cpu"];

    /// The final training loss and the eval loss of `task` with `sets`, in process.
    fn losses(task: &str, sets: &[String]) -> (f64, f64) {
        let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
        let p = prepare(task, &refs);
        let placement = kiln::backend::resolve(&p.r.config).unwrap();
        let res = kiln::launch::train(&placement, &p.input(), None, None, &p.nccl(), &mut |_| {})
            .unwrap();
        let eval = res.outcome.eval.expect("an eval set").loss();
        (res.outcome.final_loss, eval)
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs().max(1e-12)
    }

    #[test]
    fn every_family_trains_like_flex_and_ddp_and_fsdp_like_wgpu_single() {
        let d = kiln::testdir::tempdir().unwrap();
        corpus(d.path());
        let gpt = GPT.replace("corpus.txt", d.path().join("corpus.txt").to_str().unwrap());
        let families = [
            ("mlp", TASK, 4, Some("model.dropout=0.0")),
            ("cnn", CNN, 4, None),
            ("gpt", gpt.as_str(), 2, None),
        ];
        for (name, task, quarter, own) in families {
            let sets = |world: usize, extra: &[&str]| -> Vec<String> {
                let mut v = vec![
                    "train.max_steps=5".to_string(),
                    format!("train.batch_size={}", quarter * 4 / world),
                ];
                v.extend(own.map(String::from));
                v.extend(extra.iter().map(|s| s.to_string()));
                v
            };
            let flex = losses(task, &sets(1, &[]));
            let single = losses(task, &sets(1, &ON));
            assert!(
                rel(single.0, flex.0) < 1e-3 && rel(single.1, flex.1) < 1e-3,
                "{name}: wgpu {single:?} vs flex {flex:?}"
            );
            for kind in ["ddp", "fsdp"] {
                let k = format!("strategy.kind={kind}");
                let mut extra = vec![k.as_str(), "strategy.devices=2", "strategy.unit=layer"];
                extra.extend(ON);
                let got = losses(task, &sets(2, &extra));
                assert!(
                    rel(got.0, single.0) < 1e-4 && rel(got.1, single.1) < 1e-4,
                    "{name} {kind}(2): {got:?} vs wgpu single {single:?}"
                );
            }
        }
    }

    #[test]
    fn device_reductions_see_every_value_of_a_large_gradient() {
        // Burn's wgpu reductions covered only the first 131,072 of bench-cnn's 421,642
        // gradient values on lavapipe: its finite gradient read as non-finite, a NaN past them
        // went unseen, the clipping norm came out short. kiln reduces in slices now.
        use burn::backend::wgpu::{Wgpu, WgpuDevice};
        use burn::tensor::{Tensor, TensorData};
        use kiln::params::{no_address, DeviceFlat, DeviceTensor};
        let n = 421_642;
        let v: Vec<f32> = (0..n)
            .map(|i| ((i % 97) as f32 - 48.0) * if i % 5 == 0 { 1e-30 } else { 1e-3 })
            .collect();
        let flat = |v: &[f32]| {
            let t =
                Tensor::<Wgpu, 1>::from_data(TensorData::new(v.to_vec(), [n]), &WgpuDevice::Cpu);
            DeviceFlat::new(t, no_address::<Wgpu>)
        };
        let d = flat(&v);
        assert!(!d.non_finite().unwrap());
        let host: f64 = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
        let dev = d.sum_squares().unwrap();
        assert!(
            rel(dev, host) < 1e-5,
            "sum of squares {dev} on the device, {host} on the host"
        );
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 131_072, n / 2, n - 1] {
                let mut w = v.clone();
                w[at] = bad;
                assert!(flat(&w).non_finite().unwrap(), "{bad} at {at}");
            }
        }
    }

    /// Each rank's host transfers and the run's final and eval losses.
    fn transfers(sets: &[&str]) -> (Vec<kiln::params::Transfers>, f64, f64, usize) {
        let p = prepare(TASK, sets);
        let placement = kiln::backend::resolve(&p.r.config).unwrap();
        let res = kiln::launch::train(&placement, &p.input(), None, None, &p.nccl(), &mut |_| {})
            .unwrap();
        let t = res
            .memory
            .iter()
            .map(|m| m.host_transfers.expect("counted on a device backend"))
            .collect();
        let eval = res.outcome.eval.expect("an eval set").loss();
        (t, res.outcome.final_loss, eval, p.model.num_params())
    }

    #[test]
    fn parameters_and_optimizer_state_stay_on_the_device_and_offload_is_the_same_run() {
        // 5 steps of sgd with momentum, an evaluation at the end
        let n4 = |t: &(Vec<kiln::params::Transfers>, f64, f64, usize)| (t.3 * 4) as u64;
        let mut on = ON.to_vec();
        on.push("train.batch_size=16");
        let single = transfers(&on);
        let b = n4(&single);
        let t = single.0[0];
        // one copy to the device at the first forward, one back at the end (the evaluation
        // reads them on the device); no gradient or optimizer state crosses, so no step moved
        // anything
        assert_eq!((t.params_to_device, t.params_to_host), (b, b), "{t:?}");
        assert_eq!(
            (
                t.state_to_device,
                t.state_to_host,
                t.grads_to_host,
                t.grads_to_device
            ),
            (0, 0, 0, 0),
            "{t:?}"
        );
        // ddp(2): the gradients are host-staged (read, all-reduced on the host, written back)
        // once a step; the parameters stay
        let ddp = transfers(&[
            ON[0],
            ON[1],
            "strategy.kind=ddp",
            "strategy.devices=2",
            "train.batch_size=8",
        ]);
        for t in &ddp.0 {
            assert_eq!((t.params_to_device, t.params_to_host), (b, b), "{t:?}");
            assert_eq!(
                (t.grads_to_host, t.grads_to_device),
                (5 * b, 5 * b),
                "{t:?}"
            );
        }
        // fsdp: each rank's shards and their optimizer state on the device; one rank's shard
        // is its unit (nothing moves a step), two ranks gather and reduce-scatter host-staged
        let fsdp1 = transfers(&[
            ON[0],
            ON[1],
            "train.batch_size=16",
            "strategy.kind=fsdp",
            "strategy.unit=layer",
        ]);
        assert_eq!(fsdp1.0, single.0, "fsdp(1) moves what single moves");
        assert!(
            rel(fsdp1.1, single.1) < 1e-6,
            "fsdp(1) {} vs single {}",
            fsdp1.1,
            single.1
        );
        let fsdp2 = transfers(&[
            ON[0],
            ON[1],
            "train.batch_size=8",
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.unit=layer",
        ]);
        for t in &fsdp2.0 {
            assert_eq!((t.state_to_device, t.state_to_host), (0, 0), "{t:?}");
            assert_eq!(t.grads_to_host, 5 * b, "{t:?}");
        }
        assert!(
            rel(fsdp2.1, single.1) < 1e-4,
            "fsdp(2) {} vs single {}",
            fsdp2.1,
            single.1
        );
        // torch's CPU offload: parameters uploaded for each forward, gradients read back for
        // the host optimizer; the same run
        on.push("strategy.offload=cpu");
        let off = transfers(&on);
        let t = off.0[0];
        assert_eq!(
            (t.params_to_device, t.grads_to_host),
            (6 * b, 5 * b),
            "{t:?}"
        );
        assert_eq!(t.params_to_host, 0, "{t:?}");
        for (a, b, what) in [(off.1, single.1, "loss"), (off.2, single.2, "eval loss")] {
            assert!(rel(a, b) < 1e-5, "offload {what} {a} vs on the device {b}");
        }
        assert!(
            rel(ddp.1, single.1) < 1e-4,
            "ddp {} vs single {}",
            ddp.1,
            single.1
        );
    }

    #[test]
    fn resume_on_wgpu_is_bit_identical_to_the_uninterrupted_run() {
        let d = kiln::testdir::tempdir().unwrap();
        write(d.path(), "task.toml", TASK);
        let mut args = vec!["run", "task.toml", "--quiet", "--run-dir", "full"];
        let sets = [
            "backend.device=wgpu",
            "backend.adapter=cpu",
            "train.max_steps=6",
            "train.log_every=1",
            "checkpoint.every_steps=3",
        ];
        for s in &sets {
            args.extend(["--set", s]);
        }
        let o = kiln(d.path(), &args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let full = d.path().join("full");
        // the log says where things are, as the first step left them
        let log = std::fs::read_to_string(full.join("logs/rank-0.log")).unwrap();
        assert!(
            log.contains("parameters and optimizer state: on the device, where the update runs")
                && log.contains("gradients: on the device\n")
                && log.contains("host transfers: parameters "),
            "{log}"
        );
        let copy = resume_copy(d.path(), &full, "step-00000003", &[]);
        assert_eq!(loss_lines(&copy), loss_lines(&full));
        let (a, b) = (summary(&full), summary(&copy));
        assert_eq!(a["params_sha256"], b["params_sha256"]);
        assert_eq!(a["backend"], "wgpu", "{a}");
    }

    /// f16 on lavapipe (which has no bf16: `backend.precision = "bf16"` is refused naming the
    /// key), through the binary (the in-process tests hold the adapter's dtype at f32): a run
    /// ends within 2e-2 of f32 with its f32 masters and optimizer state on the device (the
    /// parameters cross once); an f16 gradient overflow skips exactly its step and backs the
    /// scale off, and a resume from before it is bit-identical.
    #[test]
    fn f16_trains_with_f32_masters_on_the_device_and_skips_an_overflowing_step() {
        use crate::precision::{losses, outlier_experiment, run, scales, OUTLIER_SCALES};
        let d = kiln::testdir::tempdir().unwrap();
        write(d.path(), "t.toml", crate::common::TINY);
        let steps = ["train.max_steps=20", "train.epochs=3"];
        // the f32 reference on flex (wgpu's f32 equals it within 1e-6: the test above)
        let want = losses(&run(d.path(), "t.toml", "f32", &steps));
        let mut sets = steps.to_vec();
        sets.extend(ON);
        sets.push("backend.precision=f16");
        let r = run(d.path(), "t.toml", "f16", &sets);
        let got = losses(&r);
        let (a, b) = (got.last().unwrap(), want.last().unwrap());
        assert!((a - b).abs() <= 2e-2 * b.abs(), "f16 {a} vs f32 {b}");
        assert_ne!(got, want);
        let s = summary(&r);
        assert_eq!(s["precision"], "f16");
        let n = s["num_params"].as_u64().unwrap();
        let t = &s["memory"][0]["host_transfers"];
        // f32 masters: the parameters went to the device once (4 bytes each) and came back for
        // the end; no gradient and no optimizer state crossed
        assert_eq!(t["params_to_device"].as_u64(), Some(4 * n), "{t}");
        assert_eq!(t["grads_to_host"].as_u64(), Some(0), "{t}");
        assert_eq!(t["state_to_device"].as_u64(), Some(0), "{t}");
        let o = kiln(
            d.path(),
            &[
                "check",
                "t.toml",
                "--set",
                ON[0],
                "--set",
                "backend.precision=bf16",
            ],
        );
        assert_eq!(o.status.code(), Some(2));
        assert!(
            stderr(&o)
                .contains("`backend.precision` = \"bf16\": this wgpu adapter cannot compute in it"),
            "{}",
            stderr(&o)
        );
        let file = outlier_experiment(d.path());
        let full = run(d.path(), file, "overflow", &ON);
        assert_eq!(scales(&full), OUTLIER_SCALES);
        let copy = resume_copy(d.path(), &full, "step-00000003", &[]);
        assert_eq!(scales(&copy), OUTLIER_SCALES);
        assert_eq!(loss_lines(&copy), loss_lines(&full));
        assert_eq!(
            summary(&copy)["params_sha256"],
            summary(&full)["params_sha256"]
        );
    }
}

/// Issue 45, defect 27: a run off wgpu does not probe wgpu's adapters for `env.json` (in a
/// wgpu build the probe made Vulkan's loader print "XDG_RUNTIME_DIR is invalid or not set"
/// twice on every CPU run); `kiln env` still lists them. (A build without wgpu never probes.)
#[cfg(feature = "wgpu")]
#[test]
fn a_cpu_run_does_not_probe_wgpu() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = crate::common::clean_cmd(
        std::path::Path::new(crate::common::KILN),
        d.path(),
        &["run", "t.toml", "--quiet", "--run-dir", "cpu"],
    )
    .env_remove("XDG_RUNTIME_DIR")
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("XDG_RUNTIME_DIR"), "{}", stderr(&o));
    let env: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("cpu/env.json")).unwrap()).unwrap();
    let session = &env["sessions"][0];
    assert!(session["accelerators"].is_object(), "{env}");
    assert!(session["accelerators"]["wgpu"].is_null(), "{env}");
}
